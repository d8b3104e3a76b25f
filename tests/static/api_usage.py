"""A user's script as a type checker sees it: `make test` runs mypy over this file.

Not run by pytest (tests/test_readme.py runs the README's example). It fails mypy if a public
name became `Any` (the lazy `trtbuild.__getattr__` hides names from checkers unless they are
imported under TYPE_CHECKING) or a result's field lost its type.
"""

from __future__ import annotations

from pathlib import Path

from typing_extensions import assert_type

import trtbuild


def export(folder: Path) -> None:
    doc = {"version": 1, "model": "model.onnx", "precision": {"default": "fp16"}}
    policy = trtbuild.Policy.from_dict(doc, base_dir=folder, name="model")
    assert_type(policy, trtbuild.Policy)
    policy = policy.with_rules(trtbuild.Rule("pow", trtbuild.Match(op=("Pow",)), "fp32"))
    assert_type(policy.sha256, str)
    assert_type(policy.path, Path | None)
    tuned = trtbuild.tune(policy, budget=20, objective="nodes", quiet=True)
    assert_type(tuned, trtbuild.TuneResult)
    assert_type(tuned.low_precision_share, float)
    assert_type(tuned.budget_exhausted, bool)
    assert_type(tuned.pins[0], trtbuild.Pin)
    assert tuned.search is not None
    assert_type(tuned.search.trials[0].passed, bool)
    saved = tuned.policy.save(folder / "model.tuned.yaml")
    result = trtbuild.build(saved, backend="none")
    assert_type(result, trtbuild.BuildResult)
    assert_type(result.points[0], trtbuild.PointResult)
    assert_type(result.points[0].outputs["y"].max_abs, float)
    assert_type(result.points[0].first_divergence, trtbuild.Divergence | None)
    checked = trtbuild.check(trtbuild.load_policy("policies/nafnet.yaml"))
    assert_type(checked.nodes[0], trtbuild.NodeDecision)
    assert_type(checked.at_risk, list[trtbuild.AtRisk])
    assert_type(checked.points[0].inputs, dict[str, tuple[int, ...]])
    try:
        trtbuild.build(policy, backend="none")
    except trtbuild.TrtbuildError as exc:
        assert_type(exc.exit_code, int)
