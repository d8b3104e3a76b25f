"""A `Policy` back to the document it came from: the mapping `from_dict` reads, and its YAML.

Why two forms: a machine needs a document that means the same wherever it goes
(`to_dict`, and the canonical YAML a policy without a file is identified by: every
value, every path absolute, `Policy.from_dict(policy.to_dict(), name=policy.name)`
equals the policy); a person keeps and reviews the file (`to_yaml`): paths as the source
wrote them (relative to where the file is saved), only the keys that are not defaults,
and the comments above rules (tune's reasons). Each section's plain keys come from the field table
(`keys.written`), so a new field is written as soon as it is declared; only what the
loader builds is written here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.policy.keys import written
from trtbuild.policy.source import spelled
from trtbuild.policy.specs import SIMPLE_KEYS, Tolerance, simple_applies

if TYPE_CHECKING:
    from trtbuild.policy.specs import AccuracySpec, DataSpec, InputSpec, Rule

# `model.Policy` reads this module to write itself; naming Policy here, even for type
# checking, would be an import cycle (tests/test_layout.py counts those too), so it is read
# by its fields (name, model, inputs, ..., source).
PolicyLike = Any


@dataclass(frozen=True)
class _Writer:
    """How values are written: each path as `path` says; defaults too, or only changes."""

    path: Callable[[Path], str] = str
    defaults: bool = True

    def keys(self, obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        return written(obj, skip, path=self.path, defaults=self.defaults)

    def doc(self, policy: PolicyLike) -> dict[str, Any]:
        precision = policy.precision
        doc = {
            "version": 1,
            "model": self.path(policy.model),
            "inputs": {s.name: self.input(s) for s in policy.inputs},
            "passes": self.keys(policy.passes),
            "precision": self.keys(precision) | {"rules": [self.rule(r) for r in precision.rules]},
            "build": self.keys(policy.build),
            "accuracy": self.accuracy(policy.accuracy),
        }
        return doc if self.defaults else {k: v for k, v in doc.items() if v not in ({}, None)}

    def input(self, spec: InputSpec) -> dict[str, Any]:
        data = self.data(spec.data)
        return self.keys(spec) | ({"data": data} if data or self.defaults else {})

    def data(self, data: DataSpec) -> dict[str, Any]:
        """One source's keys (the loader takes one of file, distribution and images)."""
        if data.images is not None:
            skip = ("distribution", "mean", "std", "derive")  # the images' own mean and std
            return self.keys(data.images) | self.keys(data, skip)
        if data.file is not None:
            return self.keys(data, ("distribution",))
        return self.keys(data, ("derive",))

    def rule(self, rule: Rule) -> dict[str, Any]:
        # a rule's own keys are written whole (they say what it is); an option at its
        # default (`dequantize: false`) only where every default is written
        out = written(rule, path=self.path, defaults=self.defaults)
        return {"id": out.pop("id"), "match": written(rule.match), **out}

    def tolerance(self, tol: Tolerance, default: Tolerance | None = None) -> dict[str, Any]:
        """The keys that make this tolerance (the simple check's only where it applies); for
        an output, where only changes are written, those that differ from the `default`'s
        (the loader reads an output's keys over the default's)."""
        full = written(tol, () if tol.simple else SIMPLE_KEYS)
        if self.defaults:
            return full
        if default is None:
            out = merged = self.keys(tol, () if tol.simple else SIMPLE_KEYS)
        else:
            base = written(default, () if default.simple else SIMPLE_KEYS)
            out = {k: v for k, v in full.items() if base.get(k) != v}
            merged = {**self.tolerance(default), **out}
        if tol.simple and not simple_applies(merged):  # the loader would leave it out
            out["atol"] = tol.atol
        return out

    def _default_tolerance(self, a: AccuracySpec) -> dict[str, Any]:
        """The default tolerance's keys; where every value is written and an output is judged
        without the simple check, the simple keys at the class's defaults left out.

        Why: the loader reads each output's keys over the default's, and any simple key
        among them turns the simple check on: the default's `atol: 0.001` written would
        judge a `compare: indices` output's logits again by atol (the same values whether
        written or not).
        """
        found = self.tolerance(a.default_tolerance)
        if not self.defaults or all(t.simple for _, t in a.output_tolerances):
            return found
        fields = Tolerance.__dataclass_fields__
        return {k: v for k, v in found.items() if k not in SIMPLE_KEYS or v != fields[k].default}

    def accuracy(self, a: AccuracySpec) -> dict[str, Any]:
        shapes = {}
        for point in a.shapes:
            entry: dict[str, Any] = {name: list(dims) for name, dims in point.dims}
            if point.file is not None:
                entry["data"] = {"file": self.path(point.file)}
            if point.skip is not None:
                entry["skip"] = point.skip
            shapes[point.name] = entry
        default = a.default_tolerance
        outputs = {name: self.tolerance(t, default) for name, t in a.output_tolerances}
        tolerances = {"default": self._default_tolerance(a), "outputs": outputs}
        if not self.defaults:
            tolerances = {k: v for k, v in tolerances.items() if v}
        return self.keys(a) | {
            **({"shapes": shapes} if shapes else {}),
            **({"tolerances": tolerances} if tolerances else {}),
        }


def policy_dict(policy: PolicyLike) -> dict[str, Any]:
    """The policy as the mapping its file holds (version 1): every value, absolute paths."""
    return _Writer().doc(policy)


def canonical_yaml(policy: PolicyLike) -> str:
    """The text a policy without a file is identified by: `policy_dict`, keys sorted."""
    import yaml

    from trtbuild.policy.load import PolicyDumper

    doc = policy_dict(policy)
    return yaml.dump(doc, Dumper=PolicyDumper, sort_keys=True, default_flow_style=None)


def rule_dict(rule: Rule) -> dict[str, Any]:
    """One rule as a person's policy file holds it: its options at their defaults left out
    (a tuned pin says `precision: fp32`, not `dequantize: false`)."""
    return _Writer(defaults=False).rule(rule)


def relative(path: Path, folder: Path) -> str:
    """`path` from `folder` (absolute where there is no relative path: another drive)."""
    try:
        return os.path.relpath(path, folder)
    except ValueError:
        return str(path)


def flow(value: Any) -> str:
    """One value as a YAML flow node on one line."""
    import yaml

    from trtbuild.policy.load import PolicyDumper

    text = yaml.dump(value, Dumper=PolicyDumper, default_flow_style=True, width=10_000)
    return text.split("\n...")[0].strip()  # a bare scalar ends with a document marker


def human_yaml(
    policy: PolicyLike,
    folder: Path | None,
    header: tuple[str, ...] = (),
    notes: dict[str, str] | None = None,
) -> str:
    """The policy as a person writes it, to be saved in `folder`.

    Paths the source wrote absolute stay so, the others are relative to `folder` (all
    absolute where `folder` is None); only keys that are not defaults; one rule a line,
    each with the comment its source had above it (`notes`, by rule id, add to them).
    `header` lines (comments) come first, after an editor's `$schema` line.
    """
    source = policy.source
    absolute = source.absolute if source is not None else frozenset()
    written = dict(source.spellings) if source is not None else {}

    def path(p: Path) -> str:
        if folder is None or str(p) in absolute:
            return str(p)
        return relative(Path(written.get(str(p), str(p))), folder)

    doc = _Writer(path=path, defaults=False).doc(policy)
    precision = doc.pop("precision", None) or {"rules": []}
    rules = precision.pop("rules")
    said = dict(source.notes if source is not None else ()) | (notes or {})
    top = {k: doc.pop(k) for k in list(doc) if k in ("version", "model", "inputs", "passes")}
    lines = [*_schema_line(source, folder), *header, _block(top)]
    lines.append("precision:")
    lines += [f"  {key}: {flow(value)}" for key, value in precision.items()]
    lines.append("  rules: []" if not rules else "  rules:")
    for rule in rules:
        if rule["id"] in said:
            lines.append(f"    # {said[rule['id']]}")
        lines.append(f"    - {flow(rule)}")
    if doc:
        lines.append(_block(doc))
    return "\n".join(lines) + "\n"


def _block(doc: dict[str, Any]) -> str:
    """Top-level keys in block style, each value as PyYAML lays it out (a mapping of
    scalars in flow style: `build: {backend: none}`). Key by key: a mapping whose values
    are all scalars is itself flow to PyYAML, and `{version: 1, model: m.onnx}` followed by
    `precision:` is no YAML."""
    import yaml

    from trtbuild.policy.load import PolicyDumper

    lines = []
    for key, value in doc.items():
        if isinstance(value, (dict, list)) and value:
            dumped = yaml.dump(
                {key: value},
                Dumper=PolicyDumper,
                sort_keys=False,
                default_flow_style=None,
                width=100,
            )
            lines.append(dumped.rstrip())
        else:
            lines.append(f"{key}: {flow(value)}")
    return "\n".join(lines)


def _schema_line(source: Any, folder: Path | None) -> list[str]:
    """The editor's `$schema` comment from the source's header, re-based to `folder`."""
    marker = "# yaml-language-server: $schema="
    for line in (source.text or "").splitlines() if source is not None else ():
        if not line.startswith("#"):
            break
        if line.startswith(marker):
            value = line[len(marker) :].strip()
            if folder is not None and not Path(value).is_absolute() and "://" not in value:
                value = relative(spelled(source.base_dir, value), folder)
            return [marker + value]
    return []
