"""The policy's JSON Schema, and its validation in trtbuild's words.

Why one dict: `trtbuild schema` exports exactly what the loader enforces, so an
editor's completion and the CLI's verdict never disagree. `jsonschema` validates;
its first error is then said as users need it: "did you mean 'op'?" and the YAML
line number, not a schema path.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from trtbuild.policy.keys import NAME, section
from trtbuild.policy.specs import AccuracySpec, BuildSpec, InputSpec, Passes, Precision

# The document: its version and model, then one section per part of the policy, each
# made from its dataclass's fields (`keys` says why), so the defaults shown are the
# ones the loader leaves to the dataclass.
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://trtbuild.invalid/policy-v1.json",
    "title": "trtbuild precision policy",
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "model"],
    "properties": {
        "version": {"const": 1},
        "model": {**NAME, "description": "relative to the policy file"},
        "inputs": {
            "type": "object",
            "maxProperties": 1000,
            "additionalProperties": section(InputSpec),
        },
        "passes": section(Passes),
        "precision": section(Precision),
        "build": section(BuildSpec),
        "accuracy": section(AccuracySpec),
    },
}


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
    """A validator of `schema` (the class is made once: `from_dict` validates in rounds)."""
    return _validator_class()(schema)


@functools.cache
def _validator_class() -> Any:
    """Draft 2020-12, where a number is finite and a bool is neither number nor integer."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many(
        {
            "number": lambda _, v: _is_number(v) and _finite(v),
            "integer": lambda _, v: isinstance(v, int) and not isinstance(v, bool) and _finite(v),
        }
    )
    return jsonschema.validators.extend(base, type_checker=checker)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: int | float) -> bool:
    """Whether `v` is a finite float64 (a YAML integer of 400 digits is not: math.isfinite
    raised OverflowError, a traceback, exit 70; and an integer no number checks skip its
    bounds: `samples` of 400 digits passed its maximum)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


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
        there = list(
            dict.fromkeys(p for p in _places(SCHEMA, ()) if p[-1] == extra and p[:-1] != path)
        )
        if there:  # a key of another level (a top-level `data:`): surer than a near name
            allowed = "allowed: " + ", ".join(props)
            hint = f"`{extra}` goes under {' or '.join(_dotted(p) for p in there)}; {allowed}"
        return SchemaViolation((*path, extra), f"unknown key '{extra}'; {hint}")
    return SchemaViolation(path, _MESSAGES.get(kind, _generic)(value, want, e))


def _places(schema: Mapping[str, Any], path: tuple) -> Iterator[tuple]:
    """The path of every key the schema allows, `<name>` for a key the user names (an
    input, an output, a point), through `oneOf`/`anyOf` alternatives and list items."""
    for key, sub in schema.get("properties", {}).items():
        yield (*path, key)
        yield from _places(sub, (*path, key))
    named = schema.get("additionalProperties")
    if isinstance(named, Mapping):
        yield from _places(named, (*path, "<name>"))
    for alternative in (*schema.get("oneOf", ()), *schema.get("anyOf", ())):
        yield from _places(alternative, path)
    if isinstance(schema.get("items"), Mapping):
        yield from _places(schema["items"], (*path, "[]"))


def _dotted(path: tuple) -> str:
    return ".".join(path).replace(".[]", "[]")


def _generic(value: Any, want: Any, e: Any) -> str:
    return e.message


def _type_message(value: Any, want: Any, e: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if _is_number(value) and not _finite(value):  # an integer past float64's range
        return f"must be a finite number, got an integer of {len(str(abs(value)))} digits"
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
