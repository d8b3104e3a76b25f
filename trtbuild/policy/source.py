"""Where a policy came from: captured once by the loader, read by `model.Policy` for its
identity and the lines its errors name (`load` knows no `Policy`, so this sits below both)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PolicySource", "line_of", "shown", "spelled"]

FieldPath = tuple[str | int, ...]  # ("inputs", "x", "data"); a list item by its index


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
        lines: (field path, line) for every key and list item of `text` (1-based): what
            errors found after loading (against the model, the data) point at. A function
            of `text`, so kept here and not in the policy's value.
        spellings: (resolved path, the path as written made absolute) for each relative
            path the source wrote through a symlink (`dump.spelled`): `to_yaml` writes
            the link, not its target.
    """

    base_dir: Path
    path: Path | None = None
    text: str | None = None
    sha256: str | None = None
    fingerprint: str = ""
    absolute: frozenset[str] = frozenset()
    notes: tuple[tuple[str, str], ...] = ()
    lines: tuple[tuple[FieldPath, int], ...] = ()
    spellings: tuple[tuple[str, str], ...] = ()

    def line(self, field: FieldPath) -> int | None:
        """The line of `field` in `text`, or of the nearest enclosing field it gives."""
        return line_of(dict(self.lines), field)

    def writes(self, field: FieldPath) -> bool:
        """Whether `text` writes `field` itself (not only a section around it): a value
        equal to its default is the user's own choice there, not a default."""
        return any(written == tuple(field) for written, _ in self.lines)


def line_of(lines: Mapping[FieldPath, int], field: FieldPath) -> int | None:
    """The line of `field`, else of the nearest enclosing field `lines` holds (a default
    not written, a key an alias merged in: the section that holds it); None where not even
    its top-level key is written (the document's first line would point at nothing)."""
    probe = tuple(field)
    while probe:
        if probe in lines:
            return lines[probe]
        probe = probe[:-1]
    return None


def unsaved(name: str) -> str:
    """What names a policy that has no file (made in code), in its errors and its record."""
    return f"<policy {name}>"


def shown(path: Path) -> str:
    """`path` as errors write it: relative to the working folder where it lies inside it (as
    the user typed `--policy policies/x.yaml`), else whole; one spelling for the errors
    loading finds and those found later against the model (`Policy.where_of`)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except (ValueError, FileNotFoundError):  # outside it, or no working folder (removed)
        return str(path)


def spelled(base: Path, value: str, target: Path | None = None) -> Path:
    """The path `value` (relative to `base`) as written, made absolute without resolving its
    symlinks, where it names the same file as resolving it does (`target`); else `target`.

    Why: a project whose `models/` is a link to another disk wrote `../models/m.onnx`; a
    policy saved elsewhere named `../../../data/disk/models/m.onnx`, the link's target,
    where the link is what the person keeps. Lexically `link/..` is not the link's parent,
    so a spelling that resolves elsewhere is not used.
    """
    resolved = (base / value).resolve() if target is None else target
    written = Path(os.path.normpath(base / value))
    return written if written.resolve() == resolved else resolved
