"""The policy's JSON Schema, and its validation in trtbuild's words.

Why one dict: `trtbuild schema` exports exactly what the loader enforces, so an
editor's completion and the CLI's verdict never disagree. `jsonschema` validates;
its first error is then said as users need it: "did you mean 'op'?" and the YAML
line number, not a schema path.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from trtbuild.graph.patterns import PATTERNS
from trtbuild.policy.specs import (
    DEFAULT_BUDGET_SHARE,
    DEFAULT_MAX_IMAGE_PIXELS,
    DERIVATIONS,
    EMULATIONS,
    GUARDS,
    IMAGE_FITS,
    AccuracySpec,
    BuildSpec,
    DataSpec,
    ImageSpec,
    Passes,
    Precision,
)

PRECISIONS = ("fp16", "bf16", "fp32")
BACKENDS = ("auto", "tensorrt", "tensorrt-rtx", "none")
ERROR_STATS = ("elemwise", "max", "mean", "median", "quantile")

# Every field has a bound, so loading and acting on a policy takes bounded time
# and memory whatever the YAML holds. Numbers are finite (NaN and inf rejected).
MAX_SAMPLES = 10_000
OPSET_RANGE = (7, 99)  # passes.opset and `prepare --opset`
_BIG = 1e30
_NUMBER = {"type": "number", "minimum": -_BIG, "maximum": _BIG}
_NONNEG = {"type": "number", "minimum": 0, "maximum": _BIG}
_NAME = {"type": "string", "minLength": 1, "maxLength": 4096}
_DIMS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
    "minItems": 0,
    "maxItems": 16,
}

# A size in bytes: a number, or a string with a unit (4GiB, 512MiB).
_SIZE: dict = {
    "oneOf": [
        {"type": "integer", "minimum": 1, "maximum": 2**50},
        {"type": "string", "pattern": r"^\d+(\.\d+)?\s*([KMG]i?B|B)?$", "maxLength": 32},
    ]
}

_TOLERANCE = {
    "type": "object",
    "description": "How one output is judged, by Polygraphy's compare functions and names; "
    "every key given must hold.",
    "additionalProperties": False,
    "properties": {
        "atol": _NONNEG,
        "rtol": _NONNEG,
        "check_error_stat": {
            "enum": list(ERROR_STATS),
            "description": "elemwise (default, as Polygraphy): every element within atol + "
            "rtol x |ref|; max, mean, median or quantile (with error_quantile) of the errors",
        },
        "error_quantile": {"type": "number", "minimum": 0, "maximum": 1},
        "psnr_threshold": {**_NUMBER, "description": "minimum PSNR in dB (PsnrCompareFunc)"},
        "cosine_similarity_threshold": {"type": "number", "minimum": -1, "maximum": 1},
        "snr_threshold": {**_NUMBER, "description": "minimum SNR in dB (SnrCompareFunc)"},
        "compare": {
            "enum": ["values", "indices"],
            "description": "indices: the output holds indices (a TopK's), or with top_k the "
            "indices of its top_k largest values; IndicesCompareFunc",
        },
        "index_tolerance": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
    },
}

_NUMBERS = {"oneOf": [_NUMBER, {"type": "array", "items": _NUMBER, "minItems": 1, "maxItems": 16}]}

_DATA = {
    "type": "object",
    "description": (
        "How reference inputs are made: a seeded distribution, an .npz file keyed by input "
        "name, or a folder of images (resized, scaled, normalised per channel)."
    ),
    "additionalProperties": False,
    "properties": {
        "distribution": {"enum": ["uniform", "normal"]},
        "low": _NUMBER,
        "high": _NUMBER,
        "mean": {**_NUMBERS, "description": "normal: a number; images: one per channel"},
        "std": {**_NUMBERS, "description": "normal: a number; images: one per channel"},
        "file": _NAME,
        "images": {**_NAME, "description": "a folder, relative to the policy"},
        "resize": {
            "type": "array",
            "description": "[H, W] every image is resized to first; `fit` then brings it to each "
            "judged point's H, W (useful with fit: crop; default: straight to each point)",
            "items": {"type": "integer", "minimum": 1, "maximum": 65536},
            "minItems": 2,
            "maxItems": 2,
        },
        "fit": {
            "enum": list(IMAGE_FITS),
            "description": "how images meet each point's H, W: resize (default) or crop (centre "
            "crop, mirrored padding where the image is smaller; keeps the pixel scale)",
        },
        "derive": {
            "enum": list(DERIVATIONS),
            "description": "a file's data at a point whose shape its arrays do not have: tile "
            "(default; crop or repeat along the axes that differ), synthetic (random values "
            "with the data's per-channel mean, std and range) or none (exit 2: give the point "
            "data in accuracy.shapes or skip it)",
        },
        "layout": {"enum": ["NCHW", "NHWC"]},
        "channels": {"enum": ["RGB", "BGR", "GRAY"]},
        "scale": {
            **_NUMBER,
            "description": "pixels are multiplied by this before mean/std (default 1/255)",
        },
    },
}

# A point of `accuracy.shapes`: input dims, plus `data` (a mapping) and `skip` (a reason).
# Told apart by the value's type, so an input named `data` or `skip` can still get dims.
_POINT_DATA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["file"],
    "properties": {
        "file": {**_NAME, "description": ".npz keyed by input name, this point's shapes"}
    },
}
_POINTS = {
    "type": "object",
    "description": "points judged beside a profile's min, opt and max: {NAME: {INPUT: [dims]}} "
    "(inputs not named keep their opt shape); any point, min/opt/max included, may add "
    "data: {file: X.npz} (its own real data) or skip: REASON (not judged; the verdict says so)",
    "maxProperties": 64,
    "propertyNames": {"pattern": "^[A-Za-z0-9_.-]{1,64}$"},
    "additionalProperties": {
        "type": "object",
        "minProperties": 1,
        "properties": {
            "data": {"oneOf": [_DIMS, _POINT_DATA]},
            "skip": {"oneOf": [_DIMS, {"type": "string", "minLength": 1, "maxLength": 1000}]},
        },
        "additionalProperties": _DIMS,
    },
}

_MATCH = {
    "type": "object",
    "description": "All keys must hold for a node to match.",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "name": {**_NAME, "description": "regex, re.search on node names"},
        "op": {
            "oneOf": [
                _NAME,
                {"type": "array", "items": _NAME, "minItems": 1, "maxItems": 1000},
            ]
        },
        "pattern": {
            "enum": list(PATTERNS),
            "description": "; ".join(f"{k}: {p.description}" for k, p in PATTERNS.items()),
        },
        "last": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "max_abs_above": _NONNEG,
        "initializer_abs_above": _NONNEG,
        "reduction_depth_above": {"type": "integer", "minimum": 1, "maximum": 2**62},
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://trtbuild.invalid/policy-v1.json",
    "title": "trtbuild precision policy",
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "model"],
    "properties": {
        "version": {"const": 1},
        "model": {**_NAME, "description": "relative to the policy file"},
        "inputs": {
            "type": "object",
            "maxProperties": 1000,
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "shape": _DIMS,
                    "min": _DIMS,
                    "opt": _DIMS,
                    "max": _DIMS,
                    "data": _DATA,
                },
            },
        },
        "passes": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "opset": {"type": "integer", "minimum": OPSET_RANGE[0], "maximum": OPSET_RANGE[1]},
                "fuse_layernorm": {"type": "boolean"},
                "fold_constants": {"type": "boolean"},
                "fold_batchnorm": {"type": "boolean"},
                "freeze_inputs": {
                    "type": "object",
                    "description": "inputs that become constants of the given value, as an engine "
                    "built for one of them serves it (Silero VAD's sample rate): {INPUT: value}; "
                    "control flow that branches on it folds away",
                    "maxProperties": 1000,
                    "additionalProperties": {
                        "oneOf": [
                            _NUMBER,
                            {"type": "boolean"},
                            {"type": "array", "maxItems": 4096, "items": _NUMBER},
                        ]
                    },
                },
                "override_input_shapes": {
                    "type": "object",
                    "description": "new declared input shapes, as Polygraphy's surgeon sanitize "
                    "--override-input-shapes: {INPUT: [dims]}, a dim a number or a name (dynamic)",
                    "maxProperties": 1000,
                    "additionalProperties": {
                        "type": "array",
                        "maxItems": 16,
                        "items": {
                            "oneOf": [
                                {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                                {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
                            ]
                        },
                    },
                },
            },
        },
        "precision": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "default": {"enum": list(PRECISIONS)},
                "io": {"enum": ["keep"], "description": "graph inputs/outputs keep their dtypes"},
                "guards": {
                    "description": "built-in safety rules applied after the user's: true (all, "
                    "the default), false (none), or a list of guard names to keep",
                    "oneOf": [
                        {"type": "boolean"},
                        {
                            "type": "array",
                            "items": {"enum": list(GUARDS)},
                            "maxItems": len(GUARDS),
                        },
                    ],
                },
                "rules": {
                    "type": "array",
                    "maxItems": 10_000,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["id", "match", "precision"],
                        "properties": {
                            "id": {**_NAME, "pattern": "^(?!guard:)"},
                            "match": _MATCH,
                            "precision": {"enum": list(PRECISIONS)},
                            "why": {"type": "string", "maxLength": 4096},
                        },
                    },
                },
            },
        },
        "build": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "backend": {"enum": list(BACKENDS)},
                "compute_capabilities": {
                    "type": "array",
                    "items": {"type": "string", "pattern": r"^\d+\.\d+$", "maxLength": 8},
                    "minItems": 1,
                    "maxItems": 16,
                },
                "workspace": _SIZE,
                "timing_cache": {"type": ["string", "null"], "maxLength": 4096},
                "variants": {
                    "type": "boolean",
                    "description": "also build all-FP16 and all-FP32 engines to show what the policy costs",
                },
            },
        },
        "accuracy": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "samples": {"type": "integer", "minimum": 1, "maximum": MAX_SAMPLES},
                "seed": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
                "emulation": {
                    "enum": list(EMULATIONS),
                    "description": "what the CPU verdict assumes inside an FP16 kernel: storage "
                    "(default; FP32 arithmetic, every stored tensor rounded) or strict (also the "
                    "sums behind FP16 means and a fused normalization's intermediates in FP16)",
                },
                "memory_budget": {
                    **_SIZE,
                    "description": "bytes of tensors a judgement holds at once (e.g. 2GiB); runs "
                    "larger than this stream through it. Default: "
                    f"1/{DEFAULT_BUDGET_SHARE} of this machine's memory, within 256 MiB to 4 GiB",
                },
                "shapes": _POINTS,
                "max_image_pixels": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 2 * DEFAULT_MAX_IMAGE_PIXELS,
                    "description": "an image with more pixels is refused before it is decoded "
                    f"(default {DEFAULT_MAX_IMAGE_PIXELS:,}, Pillow's; at most twice that, "
                    "where Pillow itself refuses)",
                },
                "fp32_check": {
                    "type": "boolean",
                    "description": "also judge the all-FP32 graph (engine on a GPU): what the "
                    "backend itself changes, apart from FP16",
                },
                "divergence_threshold": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 1,
                    "description": "relative error (to the tensor's range) at which an "
                    "intermediate tensor counts as diverged",
                },
                "tolerances": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "default": _TOLERANCE,
                        "outputs": {
                            "type": "object",
                            "additionalProperties": _TOLERANCE,
                            "maxProperties": 10_000,
                        },
                    },
                },
            },
        },
    },
}


# Where each section's defaults come from: the dataclasses of `specs` are the one place a
# default is written; the schema shows it (editors complete it) and the loader leaves an
# absent key to the dataclass. (section path in SCHEMA, its dataclasses, keys not shown)
_DEFAULTS_FROM = (
    (("inputs", "*", "data"), (DataSpec, ImageSpec), ("mean", "std")),  # per kind of data
    (("passes",), (Passes,), ()),
    (("precision",), (Precision,), ("rules", "guards")),
    (("build",), (BuildSpec,), ()),
    (("accuracy",), (AccuracySpec,), ("memory_budget",)),
)


def _section(schema: dict, path: tuple[str, ...]) -> dict:
    for key in path:
        schema = schema["additionalProperties"] if key == "*" else schema["properties"][key]
    return schema["properties"]


def _show_defaults(schema: dict) -> dict:
    """`default` on every property whose dataclass field has a plain default."""
    from dataclasses import MISSING, fields

    for path, classes, hidden in _DEFAULTS_FROM:
        props = _section(schema, path)
        for cls in classes:
            for f in fields(cls):
                value = f.default
                if f.name in props and f.name not in hidden and value is not MISSING:
                    value = list(value) if isinstance(value, tuple) else value
                    kinds = (list,) if props[f.name].get("type") == "array" else ()
                    if isinstance(value, (bool, int, float, str, *kinds)):
                        props[f.name] = {**props[f.name], "default": value}
    return schema


SCHEMA = _show_defaults(SCHEMA)


class SchemaViolation(Exception):
    """A value breaks the schema; `path` locates it for the loader's line lookup."""

    def __init__(self, path: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def validate(value: Any, schema: Mapping[str, Any] = SCHEMA) -> Any:
    """Check `value` against `schema` with `jsonschema`; return it unchanged.

    Why not jsonschema's own message: it says what the schema says ("'opp' was
    unexpected"); a user needs the field, the value and the fix, so the most
    relevant error is put in trtbuild's words.

    Raises:
        SchemaViolation: for the most relevant problem, with the path of the bad field.
    """
    _check_keys(value, ())
    errors = list(_validator(schema).iter_errors(value))
    if errors:
        raise _violation(_most_relevant(errors))
    return value


def _validator(schema: Mapping[str, Any]) -> Any:
    """Draft 2020-12, where a number is finite and a bool is neither number nor integer."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many(
        {
            "number": lambda _, v: _is_number(v) and math.isfinite(v),
            "integer": lambda _, v: isinstance(v, int) and not isinstance(v, bool),
        }
    )
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_keys(value: Any, path: tuple) -> None:
    """YAML allows `1:` or `true:` as keys; JSON Schema has no word for them."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaViolation(path, f"keys must be strings, got {_describe(key)}")
            _check_keys(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_keys(item, (*path, i))


def _most_relevant(errors: list) -> Any:
    """A misspelt key explains a "missing" one, so it comes first; then the deepest error.

    Within a `oneOf`, the alternative that got furthest into the value speaks, and one
    whose type fits the value before one that wants another type.
    """
    rank = {"additionalProperties": 0, "required": 2}

    def key(e: Any) -> tuple:
        return (rank.get(e.validator, 1), -len(e.absolute_path))

    best = min(errors, key=key)
    while best.validator == "oneOf" and best.context:
        best = min(
            best.context, key=lambda e: (-len(e.absolute_path), e.validator == "type", key(e))
        )
    return best


def _violation(e: Any) -> SchemaViolation:
    path, value, want = tuple(e.absolute_path), e.instance, e.validator_value
    kind = e.validator
    if kind == "additionalProperties":
        props = list(e.schema.get("properties", {}))
        extra = next(k for k in value if k not in props)
        close = difflib.get_close_matches(extra, props, n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'?" if close else "allowed: " + ", ".join(props)
        return SchemaViolation((*path, extra), f"unknown key '{extra}'; {hint}")
    return SchemaViolation(path, _MESSAGES.get(kind, _generic)(value, want, e))


def _generic(value: Any, want: Any, e: Any) -> str:
    return e.message


def _type_message(value: Any, want: Any, e: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    types = [want] if isinstance(want, str) else want
    return (
        "must be "
        + " or ".join(("an " if t[0] in "aeiou" else "a ") + t for t in types)
        + (f", got {_describe(value)}")
    )


def _enum_message(value: Any, want: Any, e: Any) -> str:
    choices = ", ".join(repr(c) for c in want)
    close = difflib.get_close_matches(str(value), [str(c) for c in want], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{_describe(value)} is not one of {choices}{hint}"


def _min_properties(value: Any, want: Any, e: Any) -> str:
    return f"must not be empty (use one of: {', '.join(e.schema.get('properties', {}))})"


def _min_length(value: Any, want: Any, e: Any) -> str:
    return "must not be empty" if want == 1 else f"must be at least {want} characters"


_MESSAGES: dict[str, Callable[[Any, Any, Any], str]] = {
    "type": _type_message,
    "enum": _enum_message,
    "const": lambda v, w, e: f"must be {w!r}, got {_describe(v)}",
    "minimum": lambda v, w, e: f"must be at least {w}, got {v}",
    "exclusiveMinimum": lambda v, w, e: f"must be greater than {w}, got {v}",
    "maximum": lambda v, w, e: f"must be at most {w:g}, got {v:g}",
    "minLength": _min_length,
    "maxLength": lambda v, w, e: f"must be at most {w} characters",
    "pattern": lambda v, w, e: f"{v!r} does not match {w}",
    "minItems": lambda v, w, e: f"needs at least {w} item(s)",
    "maxItems": lambda v, w, e: f"takes at most {w} item(s)",
    "required": lambda v, w, e: f"missing required key '{_missing(v, w)}'",
    "maxProperties": lambda v, w, e: f"takes at most {w} keys",
    "minProperties": _min_properties,
}


def _missing(value: Any, required: list[str]) -> str:
    return next(k for k in required if k not in value)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"
