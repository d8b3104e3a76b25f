"""`build.json` as a typed record: what was built from what, with which versions, at what cost.

Why a module of its own, below everything: the report renders it (its Engines
section) and the artifacts write it, so it sits under both and neither imports
the other for it.
"""

from __future__ import annotations

import copy
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from trtbuild.errors import UsageError

# What the report's Engines section reads of each engine in build.json.
ENGINE_KEYS = ("backend", "version", "engine_bytes", "build_seconds")
# The shape of each part of an engine's summary (and of the layer audit) that readers of
# an earlier build.json read where it is there (`cache_codec.conforms`): a hand-edited or
# damaged record whose `memory` was a number ended `report` as an internal error.
ENGINE_SHAPES: dict[str, Any] = {
    "backend": str,
    "version": str,
    "engine_bytes": float,
    "build_seconds": float,
    "memory": dict[str, float | None],
    "builder_warnings": list[str],
    "int8_kernels": dict[str, Any],
}
INT8_SHAPES: dict[str, Any] = {
    "evaluator": str,
    "quantized_ops": int,
    "checked": bool,
    "why": str,
    "int8_ops": list,
    "not_int8": list,
}
AUDIT_SHAPES: dict[str, Any] = {
    "fp32_nodes_checked": int,
    "mismatched": list,
    "not_in_network": list,
    "ok": bool,
}


@dataclass(frozen=True)
class BuildRecord:
    """`build.json`: what was built from what, with which versions, and what it cost.

    `from_json` reads one back (`report` keeps an earlier build's facts): what the
    report renders (the policy, the backend, each engine's `ENGINE_KEYS`) must be
    there, or it is exit 2; the rest a record of an older trtbuild may lack.
    """

    policy: str
    backend: str
    engines: dict[str, dict[str, Any]]  # variant -> the engine's summary (ENGINE_KEYS at least)
    model: str = ""
    versions: dict[str, Any] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    passes: list[dict[str, Any]] = field(default_factory=list)
    timings_seconds: dict[str, float] = field(default_factory=dict)
    cache: dict[str, str] = field(default_factory=dict)
    casts: int = 0
    layer_audit: dict[str, Any] | None = None
    layers: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The keys in build.json's order (the one `trtbuild build` has always written)."""
        order = ("policy", "model", "backend", "versions", "hashes", "passes")
        order += ("timings_seconds", "cache", "casts", "engines", "layer_audit", "layers")
        return {k: copy.copy(getattr(self, k)) for k in (*order, "warnings")}

    @classmethod
    def from_json(cls, data: Any, path: Path) -> BuildRecord:
        """The record in `data`, or exit 2 naming the first thing this trtbuild cannot read."""
        problems = [] if isinstance(data, dict) else ["it is not a mapping"]
        required = [
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        ]
        if not problems:
            problems = [f"{name} is missing" for name in required if name not in data]
        engines = data.get("engines") if isinstance(data, dict) else None
        if not problems and not isinstance(engines, dict):
            problems = ["engines is not a mapping"]
        for variant, engine in engines.items() if not problems else ():
            missing = [k for k in ENGINE_KEYS if not isinstance(engine, dict) or k not in engine]
            problems += [f"engines.{variant}.{k} is missing" for k in missing]
        problems = problems or _misshapen(cls, data)
        if problems:
            raise UsageError(
                f"{problems[0]}; it is not a record this trtbuild wrote",
                where=str(path),
                hint="build again (trtbuild build) or remove the file",
            )
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _misshapen(cls: type, data: dict[str, Any]) -> list[str]:
    """Each part of a record (its fields as annotated, each engine's and the audit's parts
    as `ENGINE_SHAPES` and its neighbours say) that does not have its shape, said."""
    from trtbuild.cache_codec import conforms

    hints = typing.get_type_hints(cls)
    parts = [(f.name, data[f.name], hints[f.name]) for f in fields(cls) if f.name in data]
    for variant, engine in data["engines"].items():
        at = f"engines.{variant}"
        parts += [(f"{at}.{k}", engine[k], h) for k, h in ENGINE_SHAPES.items() if k in engine]
        int8 = engine.get("int8_kernels") or {}
        parts += [
            (f"{at}.int8_kernels.{k}", int8[k], h) for k, h in INT8_SHAPES.items() if k in int8
        ]
    audit = data.get("layer_audit") or {}
    if isinstance(audit, dict):
        parts += [(f"layer_audit.{k}", audit[k], h) for k, h in AUDIT_SHAPES.items() if k in audit]
    return [
        f"{name} is not {_shape_name(hint)}"
        for name, value, hint in parts
        if not conforms(value, hint)
    ]


def _shape_name(hint: Any) -> str:
    """An annotation as a message says it: `a dict[str, float | None]`."""
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return f"a {text or str(hint).replace('typing.', '')}"
