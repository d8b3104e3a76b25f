"""The search's pins and the reasons it gives them, on real judging (no mocks)."""

from __future__ import annotations

import numpy as np
import onnx

from tests.helpers import F, model, node


def _chain(tmp_path):
    """y = x * c0 * ... * c11, each c = 1 + k/3000 (FP16 cannot hold it), atol 1e-4: every
    Mul's rounding is needed in FP32, and a full search pins all twelve."""
    nodes, weights, t = [], {}, "x"
    for k in range(12):
        weights[f"c{k}"] = np.array(1 + (k + 1) / 3000, np.float32)
        nodes.append(node("Mul", [t, f"c{k}"], f"m{k}", f"/mul{k}"))
        t = f"m{k}"
    nodes.append(node("Identity", [t], "y", "/out"))
    onnx.save(model(nodes, [("x", F, [1, 64])], [("y", F, [1, 64])], weights), tmp_path / "c.onnx")
    policy = tmp_path / "c.yaml"
    policy.write_text(
        "version: 1\nmodel: c.onnx\nbuild: {backend: none}\nprecision: {rules: []}\n"
        "inputs: {x: {shape: [1, 64], data: {distribution: uniform, low: 1, high: 2}}}\n"
        "accuracy: {samples: 1, tolerances: {default: {atol: 1e-4, rtol: 0}}}\n"
    )
    return policy


def test_a_pin_the_budget_left_unchecked_says_so_not_another_runs_error(tmp_path):
    """Out of budget after the bisection, every one of twelve pins gave the error of the run
    with eleven of them (itself pinned there): only the one that run left out is explained
    by it; the rest are kept unchecked, and said so."""
    import trtbuild

    result = trtbuild.tune(_chain(tmp_path), budget=8, quiet=True)
    assert result.passed and result.budget_exhausted and len(result.pins) == 12
    kept = [p for p in result.pins if p.reason == "kept (not re-checked within the budget)"]
    measured = [p for p in result.pins if p not in kept]
    assert len(kept) == 11 and len(measured) == 1, [p.reason for p in result.pins]
    assert "fail atol 0.0001" in measured[0].reason
    full = trtbuild.tune(_chain(tmp_path), budget=40, quiet=True)
    assert all(p.reason.startswith("without it: ") for p in full.pins)
    alone = next(p for p in full.pins if p.group == measured[0].group)
    assert alone.reason == "without it: " + measured[0].reason  # the same run, measured once
