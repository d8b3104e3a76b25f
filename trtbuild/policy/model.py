"""The validated policy as one immutable value, and the ways to get one.

Frozen, as its parts are (`specs` says why). The parts live in `specs`; reading a file
or a mapping in `load` (which knows no `Policy`, so the arrows point one way); writing
one back in `dump`.

Why a policy carries its identity (`name`, `source`) rather than a path: a policy made
in code, changed with `dataclasses.replace` or returned by `tune` has no file, or not
the file it came from. What a build records (`build.json`'s policy and hash), the
default out folder, finding an earlier build and the `where` of an error all come from
the value: a file's path and bytes where the value is what the file says, else the
name and the sha256 of the policy's canonical YAML.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from trtbuild.errors import PATH, UsageError, check_argument, surroundings_raised
from trtbuild.fsutil import write_text
from trtbuild.policy.source import PolicySource, shown, unsaved
from trtbuild.policy.specs import AccuracySpec, BuildSpec, InputSpec, Passes, Precision, Rule

__all__ = ["Policy", "PolicySource", "load_policy", "parse_policy", "validated"]


@dataclass(frozen=True)
class Policy:
    """A policy, validated: its name, its model and sections (paths absolute), its source.

    Equality is the policy's meaning (name and sections); `source` says where it came
    from and is not compared. `dataclasses.replace` and `with_rules` give new values; a
    changed policy is no longer what its file says, so it is identified by its content.
    """

    name: str
    model: Path
    inputs: tuple[InputSpec, ...] = ()
    passes: Passes = field(default_factory=Passes)
    precision: Precision = field(default_factory=Precision)
    build: BuildSpec = field(default_factory=BuildSpec)
    accuracy: AccuracySpec = field(default_factory=AccuracySpec)
    source: PolicySource | None = field(default=None, compare=False, repr=False)

    @cached_property
    def fingerprint(self) -> str:
        """The sha256 of the policy's canonical YAML (every value, absolute paths, sorted)."""
        from trtbuild.policy.dump import canonical_yaml

        return hashlib.sha256(canonical_yaml(self).encode()).hexdigest()

    @property
    def current_source(self) -> PolicySource | None:
        """`source` where it still describes this policy (not after a change in code)."""
        src = self.source
        return src if src is not None and src.fingerprint == self.fingerprint else None

    @property
    def path(self) -> Path | None:
        """The file this policy is, or None (made in code, changed since it was read)."""
        src = self.current_source
        return src.path if src is not None else None

    @property
    def sha256(self) -> str:
        """Its file's (or text's) sha256 where it is what that says, else its fingerprint."""
        src = self.current_source
        return src.sha256 if src is not None and src.sha256 else self.fingerprint

    @property
    def where(self) -> str:
        """Its file's path, else `<policy NAME>`: its identity (build.json's, errors')."""
        path = self.path
        return str(path) if path is not None else unsaved(self.name)

    def where_of(self, *field: str | int) -> str:
        """PATH:LINE of `field` (or of the nearest enclosing field written; PATH as `shown` spells
        it; no line where none holds it) while the policy is its file, else `where`."""
        src = self.current_source
        return _located(src, field) if src and src.path else self.where

    @classmethod
    def from_dict(
        cls, mapping: Mapping[str, Any], base_dir: str | Path = ".", name: str = "policy"
    ) -> Policy:
        """A policy from the mapping a policy file holds, validated as a file is.

        Takes what `yaml.safe_load` returns (`atol: 1e-2`, a string in YAML 1.1, is the
        number it means where a number goes) and what Python code passes: paths (`Path`),
        tuples, numpy scalars. The mapping is not changed.

        Args:
            mapping: the document (`version`, `model`, ...).
            base_dir: what relative paths (the model, data files) are relative to.
            name: the policy's name (`build/<name>/` by default).

        Raises:
            UsageError: the same messages as for a file, naming the field and the fix.
        """
        from trtbuild.policy.load import mapping_fields

        _check_arguments(name, base_dir)
        fields, source = mapping_fields(mapping, Path(base_dir).resolve(), name)
        return _sourced(cls(name=name, **fields), source)

    def with_rules(self, *rules: Rule | Mapping[str, Any], drop: Iterable[str] = ()) -> Policy:
        """A new policy: each rule replaces the rule of its id, or is added after the rest.

        Args:
            rules: `Rule`s, or mappings as a policy file writes a rule
                (`{"id": ..., "match": {...}, "precision": "fp32"}`).
            drop: ids of rules to remove.

        Raises:
            UsageError: a rule that a policy file could not hold (the loader's message).
        """
        from trtbuild.policy.load import merged_rules

        found = merged_rules(self.precision, rules, _rule_ids(drop))
        return replace(self, precision=replace(self.precision, rules=found))

    def to_dict(self) -> dict[str, Any]:
        """What `from_dict(..., name=self.name)` reads back as an equal policy (absolute paths)."""
        from trtbuild.policy.dump import policy_dict

        return policy_dict(self)

    def to_yaml(self, where: str | Path | None = None) -> str:
        """The policy as a person writes it: paths as its source had them, only the keys
        that are not defaults, the comments above rules (tune's reasons) kept; where it is
        what its source text says and is saved beside it, that text, every comment kept.

        Args:
            where: the file it will be saved as: relative paths are written from its
                folder. Default: the source's folder (absolute paths without a source).
        """
        from trtbuild.policy.text import person_yaml

        check_argument("where", where, PATH, "a file's path (str or Path), or None")
        return person_yaml(self, Path(where).resolve().parent if where is not None else None)

    def save(self, path: str | Path) -> Policy:
        """`to_yaml(path)` written whole or not at all (else `UsageError`); the policy it is now."""
        check_argument("path", path, PATH, "a file's path (str or Path)", optional=False)
        text = validated(self).to_yaml(path)
        surroundings_raised(write_text)(path, text)
        return parse_policy(text, Path(path).resolve(), name=self.name)


# set on a Policy the loader made (`_sourced`) or `validated` checked: the value as read;
# `dataclasses.replace` makes a new object without it
_VALIDATED = "_validated"


def validated(policy: Policy) -> Policy:
    """`policy` checked as its file would be, unless the loader made it or it was checked:
    changed in code (`dataclasses.replace`), its values may be what no file can hold.

    Why: `replace(policy, accuracy=replace(policy.accuracy, samples=0))` was an IndexError
    in build, a negative `atol` or `name="../x"` went through (the latter published
    outside `build/`), `default="fp8"` was a KeyError deep in the assignment and a list
    or a `str` where a tuple or a `Path` goes a TypeError: never the loader's message
    naming the field. The value is read back from `to_dict` as `from_dict` reads a mapping (its
    messages name `<policy NAME>` and the field); where the reading differs only in
    type (a list for a tuple, a str for a Path), the reading is the one used.

    Raises:
        UsageError: a field no policy file could hold, named with its fix.
    """
    if policy.__dict__.get(_VALIDATED):  # read by the loader, or checked here before
        return policy
    try:
        doc = policy.to_dict()
    except (AttributeError, TypeError, ValueError) as exc:
        raise UsageError(
            f"a field holds what no policy holds ({type(exc).__name__}: {exc})",
            where=unsaved(str(policy.name)),
            hint="change a policy with with_rules, or dataclasses.replace with the values "
            "its fields hold (tuples, Paths, Rules), or make one with Policy.from_dict",
        ) from None
    read = Policy.from_dict(doc, name=policy.name)
    found = policy if read == policy else _origins_kept(read, policy)
    found.__dict__[_VALIDATED] = True  # not a field: no part of the value (as `fingerprint`)
    return found


def _origins_kept(read: Policy, given: Policy) -> Policy:
    """`read` with what `given` says of where its values came from, which no mapping holds:
    its source, and whether each input's range was written (`to_dict` writes `low` and
    `high` always, so a default range read back was the user's own choice, and a shape
    input's missing data no longer exit 2)."""
    written = {s.name: s.data.range_given for s in given.inputs if isinstance(s, InputSpec)}
    inputs = tuple(
        replace(s, data=replace(s.data, range_given=written.get(s.name, s.data.range_given)))
        for s in read.inputs
    )
    return replace(read, inputs=inputs, source=given.source)


def _rule_ids(drop: object) -> tuple[str, ...]:
    """`with_rules`' `drop` as ids: one id given as a str (not its letters), or an iterable."""
    ids = drop if isinstance(drop, str) or not isinstance(drop, Iterable) else tuple(drop)
    if not isinstance(ids, str | tuple) or not all(isinstance(i, str) for i in ids):
        raise UsageError(f"`drop` must be rule ids (a str or an iterable of them), not {drop!r}")
    return (ids,) if isinstance(ids, str) else ids


def _located(src: PolicySource, field: tuple[str | int, ...]) -> str:
    """`path:LINE` of a field in its policy file, the path as errors spell it (`shown`); the
    path alone where not even the field's top-level key is written."""
    line = src.line(field)
    return f"{shown(src.path)}:{line}" if src.path and line else shown(src.path or Path())


def _check_arguments(name: object, base_dir: object) -> None:
    """A policy's name is a folder's name (`build/<name>/`): one plain, printable part; its
    `base_dir` a path.

    Why: `from_dict(..., name="../x")` published outside `build/`, `""` or `"."` into
    `build/` itself, and None failed inside `build` with a TypeError.
    """
    if not isinstance(base_dir, (str, os.PathLike)):
        raise UsageError(
            f"base_dir must be a folder's path, not {type(base_dir).__name__}",
            hint="pass the folder relative paths are read from (str or Path)",
        )
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or os.sep in name
        or not name.isprintable()
    ):
        raise UsageError(
            f"name must be one plain folder name (build/<name>/), not {name!r}",
            hint='name the policy as its file would be (`name="nafnet"`), without a separator',
        )


def _sourced(policy: Policy, source: PolicySource) -> Policy:
    """`policy` with `source`, the source's fingerprint its own."""
    fingerprint = policy.fingerprint
    found = replace(policy, source=replace(source, fingerprint=fingerprint))
    found.__dict__["fingerprint"] = fingerprint  # the same content: not computed again
    found.__dict__[_VALIDATED] = True  # what the loader read: `validated` need not read it
    return found


def load_policy(name: str | Path) -> Policy:
    """Load and validate a policy file; the model path is relative to the policy file.

    `nafnet.yaml` (or `nafnet`) that is not a path is looked up in `./policies/`. The
    policy is named after the file (`nafnet`) and remembers its path, text and sha256.

    Raises:
        UsageError: one message naming the file, the line, the field and the fix.
    """
    from trtbuild.policy.load import load_fields

    check_argument("name", name, PATH, "a policy file's path or name (str or Path)")
    fields, source = load_fields(name)
    return _sourced(Policy(name=source.path.stem if source.path else "policy", **fields), source)


def parse_policy(
    text: str,
    path: Path,
    shown: str | None = None,
    *,
    name: str | None = None,
    file: bool = True,
) -> Policy:
    """A policy from a text, as if read from `path` (messages say `shown`).

    Args:
        text: the policy's YAML.
        path: the file it is (or would be): its folder is the base of relative paths.
        shown: how messages name it (default `path`).
        name: the policy's name (default `path`'s stem).
        file: `path` holds `text` (False: the text is not saved anywhere yet).
    """
    from trtbuild.policy.load import parse_fields

    fields, source = parse_fields(text, path, shown)
    source = source if file else replace(source, path=None)
    return _sourced(Policy(name=name or path.stem, **fields), source)
