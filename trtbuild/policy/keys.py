"""The policy's fields as one table: each field of a `specs` dataclass says its YAML key.

Why on the dataclass: a field's name, type, bounds, default and description were
once written three times (the JSON Schema, the dataclasses, the loader's
`.get(key, default)`) and drifted (the schema told editors one default, the code
used another). Now the field's `metadata` holds a `Key`, and everything reads it:
`section` makes the JSON Schema (defaults shown from the dataclass itself), the
loader takes exactly the keys a section declares, converted as `read` says, and
`trtbuild schema` / `docs/policy.schema.json` / the docs' field table follow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, fields
from pathlib import Path
from typing import Any

KEY = "trtbuild.policy.key"

# JSON Schema kinds the policy's fields share. Every field has a bound, so loading and
# acting on a policy takes bounded time and memory whatever the YAML holds; numbers are
# finite (the validator rejects NaN and inf).
BIG = 1e30
NUMBER: dict[str, Any] = {"type": "number", "minimum": -BIG, "maximum": BIG}
NONNEG: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": BIG}
NAME: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 4096}
BOOL: dict[str, Any] = {"type": "boolean"}
DIMS: dict[str, Any] = {
    "type": "array",
    "items": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
    "minItems": 0,
    "maxItems": 16,
}
NUMBERS: dict[str, Any] = {
    "oneOf": [NUMBER, {"type": "array", "items": NUMBER, "minItems": 1, "maxItems": 16}]
}
# A size in bytes: a number, or a string with a unit (4GiB, 512MiB).
SIZE: dict[str, Any] = {
    "oneOf": [
        {"type": "integer", "minimum": 1, "maximum": 2**50},
        {"type": "string", "pattern": r"^\d+(\.\d+)?\s*([KMG]i?B|B)?$", "maxLength": 32},
    ]
}


def enum(values: tuple | list) -> dict[str, Any]:
    return {"enum": list(values)}


def integer(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


@dataclass(frozen=True)
class Key:
    """How one dataclass field appears in a policy file.

    Attributes:
        schema: the JSON Schema of the YAML value (its description included).
        yaml: the YAML key, where it is not the field's name.
        read: turns the validated YAML value into the field's value (None: as it is).
        path: the value is a path relative to the policy file (made absolute).
        built: the loader makes the value itself, from this key and checks across
            keys (a nested section, a list of rules); `read` and `path` do not apply.
        show_default: the schema shows the dataclass's default (editors complete it);
            False where the default is not what a user would write.
        write: turns the field's value back into the YAML value (`Policy.to_dict`), where
            lists and strings for tuples and paths will not do; None leaves the key out.
    """

    schema: Mapping[str, Any]
    yaml: str | None = None
    read: Callable[[Any], Any] | None = None
    path: bool = False
    built: bool = False
    show_default: bool = True
    write: Callable[[Any], Any] | None = None


def key(schema: Mapping[str, Any], description: str | None = None, **options: Any) -> dict:
    """A field's `metadata`: `field(default=..., metadata=key(NONNEG, "why it exists"))`."""
    node = {**schema, "description": description} if description else dict(schema)
    return {KEY: Key(schema=node, **options)}


def keyed(cls: type) -> Iterator[tuple[Field, Key, str]]:
    """(field, its Key, its YAML name) for every field of `cls` a policy file can give."""
    for f in fields(cls):
        if KEY in f.metadata:
            k = f.metadata[KEY]
            yield f, k, k.yaml or f.name


def section(*classes: type, **extra: Any) -> dict[str, Any]:
    """The JSON Schema of a mapping whose keys are those of `classes`, defaults shown.

    Several classes share one mapping where one YAML section makes them (`data:` makes
    a DataSpec and, with `images`, an ImageSpec); a key both declare must be declared
    alike. Only a single class's fields without a default are required: in a shared
    section the classes are alternatives.
    """
    props: dict[str, Any] = {}
    for cls in classes:
        for f, k, name in keyed(cls):
            node = _with_default(f, k)
            if props.setdefault(name, node) != node:
                raise TypeError(f"{cls.__name__}.{f.name}: '{name}' is declared otherwise before")
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, **extra}
    out["properties"] = props
    required = []
    if len(classes) == 1:
        required = [
            name
            for f, _, name in keyed(classes[0])
            if f.default is MISSING and f.default_factory is MISSING
        ]
    return out | ({"required": required} if required else {})


def _with_default(f: Field, k: Key) -> dict[str, Any]:
    """The key's schema with `default` where the dataclass's default is a plain value."""
    node = dict(k.schema)
    value = f.default
    if not k.show_default or value is MISSING or value is None:
        return node
    value = list(value) if isinstance(value, tuple) else value
    kinds = (list,) if node.get("type") == "array" else ()
    if isinstance(value, (bool, int, float, str, *kinds)):
        node["default"] = value
    return node


def given(raw: Mapping[str, Any], cls: type, base: Path, skip: tuple = ()) -> dict[str, Any]:
    """The fields of `cls` that `raw` (validated) gives, read as their Keys say.

    Why only the keys given: an absent key takes the dataclass's own default, so a
    default is written once. Built fields are the loader's own to make.
    """
    out = {}
    for f, k, name in keyed(cls):
        if name not in raw or k.built or f.name in skip:
            continue
        value = raw[name]
        if k.path:
            value = (base / value).resolve() if value else None
        elif k.read is not None:
            value = k.read(value)
        out[f.name] = value
    return out


def written(
    obj: Any,
    skip: tuple[str, ...] = (),
    *,
    path: Callable[[Path], str] = str,
    defaults: bool = True,
) -> dict[str, Any]:
    """The keys `obj`'s class declares, as a policy file holds them: what `given` reads back
    as the same values. A None is left out; built fields are their writer's to add.

    Args:
        path: how a path is written (absolute by default; relative for a person's file).
        defaults: write a value equal to the field's default too (False: what a person
            writes, the keys that change something, sizes in whole units as `1GiB`).
    """
    out = {}
    for f, k, name in keyed(type(obj)):
        value = getattr(obj, f.name)
        if k.built or f.name in skip or value is None:
            continue
        if not defaults and value == _default(f):
            continue
        if not defaults and k.schema.get("oneOf") == SIZE["oneOf"]:
            value = _size_text(value)
        elif _real(k.schema) and isinstance(value, int | float) and not isinstance(value, bool):
            value = float(value) + 0.0  # `atol: 1` is `atol: 1.0`, and -0.0 is 0.0
        elif k.write is not None:
            value = k.write(value)
        else:
            value = _plain(value, path)
        if value is not None:
            out[name] = value
    return out


def _real(schema: Mapping[str, Any]) -> bool:
    """Whether the key holds a real number (`"type": "number"`), not an integer.

    Why written as a float: equality is the value's, and 1 == 1.0 and 0.0 == -0.0; written
    as given, `atol: 1` and `atol: 1.0` were equal policies (one hash) of two canonical
    texts, so two sha256s: build.json's hash, the policy's identity and the cache's keys
    told one policy apart from itself."""
    kind = schema.get("type")
    return "number" in (kind if isinstance(kind, list) else [kind])


def _size_text(value: int) -> int | str:
    """A size as a person writes it (`1GiB`, `512MiB`) where it is a whole number of units."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value % scale == 0:
            return f"{value // scale}{unit}"
    return value


def _default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _plain(value: Any, path: Callable[[Path], str] = str) -> Any:
    if isinstance(value, tuple):
        return [_plain(v, path) for v in value]
    return path(value) if isinstance(value, Path) else value
