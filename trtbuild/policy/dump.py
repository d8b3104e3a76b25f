"""A `Policy` back to the document it came from: the mapping `from_dict` reads, and its YAML.

Why: a policy built or changed in Python (an export script, `tune`'s result) must be
written as a file the CLI, the nightly and a reviewer read. Every value is written
explicitly (defaults too) and every path absolute, so the document means the same
wherever it is saved: `Policy.from_dict(policy.to_dict())` equals the policy. Each
section's plain keys come from the field table (`keys.written`), so a new field is
written as soon as it is declared; only what the loader builds is written here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtbuild.policy.keys import written
from trtbuild.policy.specs import SIMPLE_KEYS

if TYPE_CHECKING:
    from trtbuild.policy.specs import AccuracySpec, DataSpec, InputSpec, Rule, Tolerance

# `model.Policy` reads this module to write itself; naming Policy here, even for type
# checking, would be an import cycle (tests/test_layout.py counts those too), so it is read
# by its fields (path, model, inputs, ...).
PolicyLike = Any


def policy_dict(policy: PolicyLike) -> dict[str, Any]:
    """The policy as the mapping its file holds (version 1)."""
    precision = policy.precision
    return {
        "version": 1,
        "model": str(policy.model),
        "inputs": {s.name: _input(s) for s in policy.inputs},
        "passes": written(policy.passes),
        "precision": written(precision) | {"rules": [_rule(r) for r in precision.rules]},
        "build": written(policy.build),
        "accuracy": _accuracy(policy.accuracy),
    }


def policy_yaml(policy: PolicyLike) -> str:
    """`policy_dict` as YAML, in the policy's own key order."""
    import yaml

    return yaml.safe_dump(policy_dict(policy), sort_keys=False, default_flow_style=None, width=100)


def _input(spec: InputSpec) -> dict[str, Any]:
    return written(spec) | {"data": _data(spec.data)}


def _data(data: DataSpec) -> dict[str, Any]:
    """One source's keys (the loader takes one of file, distribution and images)."""
    if data.images is not None:
        skip = ("distribution", "mean", "std", "derive")  # the images' own mean and std
        return written(data.images) | written(data, skip)
    if data.file is not None:
        return written(data, ("distribution",))
    return written(data, ("derive",))


def _rule(rule: Rule) -> dict[str, Any]:
    out = written(rule)
    return {"id": out.pop("id"), "match": written(rule.match), **out}


def _tolerance(tol: Tolerance) -> dict[str, Any]:
    """The keys that make this tolerance: the simple check's only where it applies."""
    return written(tol, () if tol.simple else SIMPLE_KEYS)


def _accuracy(a: AccuracySpec) -> dict[str, Any]:
    shapes = {}
    for point in a.shapes:
        entry: dict[str, Any] = {name: list(dims) for name, dims in point.dims}
        if point.file is not None:
            entry["data"] = {"file": str(point.file)}
        if point.skip is not None:
            entry["skip"] = point.skip
        shapes[point.name] = entry
    return written(a) | {
        **({"shapes": shapes} if shapes else {}),
        "tolerances": {
            "default": _tolerance(a.default_tolerance),
            "outputs": {name: _tolerance(t) for name, t in a.output_tolerances},
        },
    }
