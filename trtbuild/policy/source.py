"""Where a policy came from: captured once by the loader, read by `model.Policy` for its
identity (`load` knows no `Policy`, so this sits below both)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["PolicySource"]


@dataclass(frozen=True)
class PolicySource:
    """Where a policy came from, captured once when it was read.

    Attributes:
        base_dir: the folder its relative paths are relative to.
        path: the file it was read from (absolute); None for a mapping or a text.
        text: the text it was read from (a file's, or `tune`'s rendering); None for a
            mapping.
        sha256: the sha256 of that text's bytes (a file's is `sha256sum`'s); None
            without a text.
        fingerprint: the sha256 of the canonical YAML of the policy it was read as: the
            source describes a policy only while that policy's fingerprint is this one.
        absolute: the paths the source wrote absolute (resolved); `to_yaml` keeps them so.
        notes: (rule id, comment) for the comments written above rules (tune's reasons).
    """

    base_dir: Path
    path: Path | None = None
    text: str | None = None
    sha256: str | None = None
    fingerprint: str = ""
    absolute: frozenset[str] = frozenset()
    notes: tuple[tuple[str, str], ...] = ()
