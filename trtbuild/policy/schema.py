"""The policy's JSON Schema, and a validator for the subset of it the schema uses.

Why one dict: `trtbuild schema` exports exactly what the loader enforces, so an
editor's completion and the CLI's verdict never disagree. The validator is ours
rather than `jsonschema`'s because users need "did you mean 'op'?" and the YAML
line number, not a schema path.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from trtbuild.policy.model import EMULATIONS, GUARDS

PRECISIONS = ("fp16", "bf16", "fp32")
PATTERNS = (
    "layernorm",
    "layernorm_after_attention",
    "attention",
    "softmax",
    "final_reductions",
)
BACKENDS = ("auto", "tensorrt", "tensorrt-rtx", "none")
ERROR_STATS = ("max", "mean", "median", "elemwise")

# Every field has a bound, so loading and acting on a policy takes bounded time
# and memory whatever the YAML holds. Numbers are finite (NaN and inf rejected).
MAX_SAMPLES = 10_000
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

_TOLERANCE = {
    "type": "object",
    "description": "Polygraphy CompareFunc.simple settings for one output.",
    "additionalProperties": False,
    "properties": {
        "atol": _NONNEG,
        "rtol": _NONNEG,
        "check_error_stat": {"enum": list(ERROR_STATS)},
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
            "items": {"type": "integer", "minimum": 1, "maximum": 65536},
            "minItems": 2,
            "maxItems": 2,
        },
        "layout": {"enum": ["NCHW", "NHWC"]},
        "channels": {"enum": ["RGB", "BGR", "GRAY"]},
        "scale": {
            **_NUMBER,
            "description": "pixels are multiplied by this before mean/std (default 1/255)",
        },
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
        "pattern": {"enum": list(PATTERNS)},
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
                "opset": {"type": "integer", "minimum": 7, "maximum": 99},
                "fuse_layernorm": {"type": "boolean"},
                "fold_constants": {"type": "boolean"},
                "fold_batchnorm": {"type": "boolean"},
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
                "workspace": {
                    "oneOf": [
                        {"type": "integer", "minimum": 1, "maximum": 2**50},
                        {
                            "type": "string",
                            "pattern": r"^\d+(\.\d+)?\s*([KMG]i?B|B)?$",
                            "maxLength": 32,
                        },
                    ]
                },
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


class SchemaViolation(Exception):
    """A value breaks the schema; `path` locates it for the loader's line lookup."""

    def __init__(self, path: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.path = path
        self.message = message


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _coerce_number(value: Any) -> Any:
    """YAML 1.1 reads `1e-3` (no dot) as a string; accept it as the number users meant."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


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


def validate(value: Any, schema: Mapping[str, Any] = SCHEMA, path: tuple = ()) -> Any:
    """Check `value` against `schema`; return it with numbers coerced.

    Raises:
        SchemaViolation: at the first problem, with the path of the bad field.
    """
    import re

    if "const" in schema and value != schema["const"]:
        raise SchemaViolation(path, f"must be {schema['const']!r}, got {_describe(value)}")
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(repr(c) for c in schema["enum"])
        close = difflib.get_close_matches(str(value), [str(c) for c in schema["enum"]], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SchemaViolation(path, f"{_describe(value)} is not one of {choices}{hint}")
    if "oneOf" in schema:
        errors = []
        for option in schema["oneOf"]:
            try:
                return validate(value, option, path)
            except SchemaViolation as exc:
                errors.append(exc)
        # The most specific complaint is the one that got furthest into the value.
        raise max(errors, key=lambda e: len(e.path))
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if "number" in types or "integer" in types:
            value = _coerce_number(value)
            if "integer" in types and isinstance(value, float) and value.is_integer():
                value = int(value)
        if not any(_TYPES[t](value) for t in types):
            want = " or ".join("a " + t if t != "integer" else "an integer" for t in types)
            raise SchemaViolation(path, f"must be {want}, got {_describe(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaViolation(path, f"must be a finite number, got {value}")
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaViolation(path, f"must be at least {schema['minimum']}, got {value}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            raise SchemaViolation(
                path, f"must be greater than {schema['exclusiveMinimum']}, got {value}"
            )
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaViolation(path, f"must be at most {schema['maximum']:g}, got {value:g}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise SchemaViolation(path, "must not be empty")
        if len(value) > schema.get("maxLength", len(value)):
            raise SchemaViolation(path, f"must be at most {schema['maxLength']} characters")
        if "pattern" in schema and not re.match(schema["pattern"], value):
            raise SchemaViolation(path, f"{value!r} does not match {schema['pattern']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise SchemaViolation(path, f"needs at least {schema['minItems']} item(s)")
        if len(value) > schema.get("maxItems", len(value)):
            raise SchemaViolation(path, f"takes at most {schema['maxItems']} item(s)")
        if "items" in schema:
            value = [validate(v, schema["items"], (*path, i)) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        value = _validate_object(value, schema, path)
    return value


def _validate_object(value: Mapping, schema: Mapping[str, Any], path: tuple) -> dict:
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key in value:
        if not isinstance(key, str):
            raise SchemaViolation(path, f"keys must be strings, got {_describe(key)}")
    if extra is False:  # a misspelt key explains a "missing" one, so name it first
        for key in value:
            if key not in props:
                close = difflib.get_close_matches(key, list(props), n=1, cutoff=0.5)
                hint = f"did you mean '{close[0]}'?" if close else "allowed: " + ", ".join(props)
                raise SchemaViolation((*path, key), f"unknown key '{key}'; {hint}")
    for key in schema.get("required", []):
        if key not in value:
            raise SchemaViolation(path, f"missing required key '{key}'")
    if len(value) > schema.get("maxProperties", len(value)):
        raise SchemaViolation(path, f"takes at most {schema['maxProperties']} keys")
    if len(value) < schema.get("minProperties", 0):
        keys = ", ".join(props)
        raise SchemaViolation(path, f"must not be empty (use one of: {keys})")
    out = {}
    for key, item in value.items():
        if key in props:
            out[key] = validate(item, props[key], (*path, key))
        elif isinstance(extra, Mapping):
            out[key] = validate(item, extra, (*path, key))
        else:
            out[key] = item
    return out
