"""trtbuild: TensorRT engines under a per-layer precision policy, proven against FP32.

The library (`trtbuild.api`): `load_policy`, `Policy`, `check`, `convert`, `build`, `tune`,
their result types, and `TrtbuildError`; loaded on first use, so `trtbuild --help` and
`import trtbuild` stay instant. Type checkers and editors see every name with its type
through `__init__.pyi` (tests/test_api.py checks it names what `_API` does), and
`dir(trtbuild)` lists them.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = {
    "load_policy": "trtbuild.policy",
    "Policy": "trtbuild.policy",
    "PolicySource": "trtbuild.policy",
    "Rule": "trtbuild.policy.specs",
    "Match": "trtbuild.policy.specs",
    "check": "trtbuild.api",
    "convert": "trtbuild.api",
    "build": "trtbuild.api",
    "tune": "trtbuild.api",
    "open_cache": "trtbuild.api",
    "CheckResult": "trtbuild.results",
    "CheckedPoint": "trtbuild.results",
    "SkippedPoint": "trtbuild.results",
    "BuildResult": "trtbuild.results",
    "TuneResult": "trtbuild.results",
    "NodeDecision": "trtbuild.results",
    "OutputResult": "trtbuild.results",
    "PointResult": "trtbuild.results",
    "AtRisk": "trtbuild.results",
    "Divergence": "trtbuild.results",
    "FlippedDecision": "trtbuild.results",
    "Pin": "trtbuild.results",
    "TrtbuildError": "trtbuild.errors",
    "UsageError": "trtbuild.errors",
    "BackendError": "trtbuild.errors",
}

__all__ = ["__version__", *_API]  # one list: `_API` (the stub names the same; a test checks)


def __getattr__(name: str) -> Any:
    """The public API, imported when first named (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'trtbuild' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    """The public names and the module's own dunders, before any is imported."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})
