"""trtbuild: TensorRT engines under a per-layer precision policy, proven against FP32.

The library (`trtbuild.api`): `load_policy`, `check`, `convert`, `build`, `tune`, their
result types, and `TrtbuildError`; loaded on first use, so `trtbuild --help` and
`import trtbuild` stay instant.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = {
    "load_policy": "trtbuild.policy",
    "Policy": "trtbuild.policy",
    "check": "trtbuild.api",
    "convert": "trtbuild.api",
    "convert_front": "trtbuild.api",
    "build": "trtbuild.api",
    "tune": "trtbuild.api",
    "open_cache": "trtbuild.api",
    "CheckResult": "trtbuild.api",
    "BuildResult": "trtbuild.api",
    "TuneResult": "trtbuild.api",
    "NodeDecision": "trtbuild.api",
    "OutputResult": "trtbuild.api",
    "TrtbuildError": "trtbuild.errors",
    "UsageError": "trtbuild.errors",
    "BackendError": "trtbuild.errors",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """The public API, imported when first named (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'trtbuild' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)
