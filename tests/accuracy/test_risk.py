"""What the CPU verdict assumes inside a kernel, and the ops at risk whatever it assumes.

The GFPGAN-style example's decoder normalises a 128x128 map: its statistics sum
16384 values past 65504 while no stored tensor leaves the FP16 range. With only
its final reduction pinned it passes when kernels sum in FP32 (`storage`, the
default), fails when they keep the sums in FP16 (`strict`), and is listed under
`at_risk` either way.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtbuild.cli import main


def _build(policy, out) -> tuple[int, dict]:
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    return code, json.loads((out / "report.json").read_text())


def test_storage_passes_and_lists_the_decoder_statistics_at_risk(example_policy, tmp_path, capsys):
    code, report = _build(example_policy("gfpgan"), tmp_path / "storage")
    assert code == 0 and report["passed"]
    assert report["emulation"] == "storage" and report["evaluator"] == "emulated-fp16"
    assert [p["node"] for p in report["precision"]["pinned"]] == ["/energy/ReduceSumSquare"]
    risky = {(r["node"], r["quantity"]) for r in report["at_risk"]}
    assert ("/decoder/norm/ReduceMean", "sum behind the mean") in risky
    assert all(r["peak"] > 65504 and r["op"] == "LayerNormalization" for r in report["at_risk"])
    out = capsys.readouterr().out
    assert "storage emulation" in out and "at risk (not failed" in out
    md = (tmp_path / "storage" / "report.md").read_text()
    html = (tmp_path / "storage" / "report.html").read_text()
    assert "## Ops at risk" in md and "/decoder/norm/ReduceMean" in md
    assert "<h2>Ops at risk</h2>" in html and "/decoder/norm/ReduceMean" in html


def test_strict_fails_the_same_policy_on_the_stored_sums(example_policy, tmp_path, capsys):
    """The op at risk is the failure here: the lines say so, not "not failed", and not that
    `strict` assumes FP32 inside the kernel whose sums it stores."""
    policy = example_policy("gfpgan", accuracy={"emulation": "strict"})
    code, report = _build(policy, tmp_path / "strict")
    assert code == 1 and not report["outputs"]["face"]["passed"]
    assert report["emulation"] == "strict"
    assert report["outputs"]["energy"]["passed"]  # the pinned reduction is fine either way
    assert report["first_divergence"]["node"] == "/decoder/norm/ReduceMean"
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("at risk"))
    assert "not failed" not in line and "assumes FP32 inside kernels" not in line
    assert "stores the sums behind means and LayerNorms in FP16 itself" in line
    assert line.endswith(
        "/decoder/norm/ReduceMean (sum of squared deviations (behind the variance) 5.69e+06; the first divergence above)"
    )
    md = (tmp_path / "strict" / "report.md").read_text()
    assert "| `/decoder/norm/ReduceMean` (the first divergence of the failing verdict) |" in md
    assert "fail only on a kernel that keeps them in FP16" in md  # the others' risk
    assert "these fail only on a kernel" not in md


def test_check_lists_the_ops_at_risk(example_policy, capsys):
    assert main(["check", "--policy", str(example_policy("gfpgan")), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["at_risk"]
    assert {r["node"] for r in found} == {"/decoder/norm/ReduceMean"}


def test_a_pinned_op_is_not_at_risk(example_policy, tmp_path):
    rule = '[{id: norm, match: {name: "^/decoder/norm/"}, precision: fp32}]'
    _, report = _build(example_policy("gfpgan", rules=rule), tmp_path / "pinned")
    assert report["at_risk"] == []


@pytest.mark.parametrize("emulation", ["storage", "strict"])
def test_both_emulations_are_accepted(example_policy, emulation):
    policy = example_policy("gfpgan", accuracy={"emulation": emulation})
    assert main(["check", "--policy", str(policy)]) == 0


def test_a_misspelt_emulation_is_refused_with_a_suggestion(example_policy, capsys):
    bad = example_policy("gfpgan", accuracy={"emulation": "storge"})
    assert main(["check", "--policy", str(bad)]) == 2
    assert "did you mean 'storage'" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_normalizations_statistics_are_measured_without_touching_its_input(dtype):
    """The deviations are squared in place in a copy: the same values as the plain
    formula, and the reference's tensor (which later checks read) unchanged."""
    from trtbuild.accuracy.risk import _moments

    x = np.random.default_rng(0).normal(3.0, 200.0, size=(1, 4, 8, 8)).astype(dtype)
    before = x.copy()
    found = _moments(x, x, (2, 3))
    wide = x.astype(np.float64)
    mean = wide.mean(axis=(2, 3), keepdims=True)
    sq = (wide - mean) ** 2
    assert found == {
        "sum behind the mean": float(np.abs(mean).max()) * 64,
        "squared deviations": float(sq.max()),
        "sum of squared deviations (behind the variance)": float(sq.sum(axis=(2, 3)).max()),
    }
    np.testing.assert_array_equal(x, before)


def test_a_group_norms_statistics_are_its_groups():
    """GroupNormalization (opset 21, as torch.onnx's dynamo exporter writes GroupNorm) is
    measured: each group's statistics are over its channels and positions together."""
    from tests.helpers import F, model, node
    from trtbuild.accuracy.risk import QUANTITIES, measure
    from trtbuild.graph.view import GraphView

    gn = node("GroupNormalization", ["x", "s", "b"], "y", "gn", num_groups=2)
    inits = {"s": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}
    m = model([gn], [("x", F, [1, 4, 4, 4])], [("y", F, [1, 4, 4, 4])], inits, opset=21)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (1, 4, 4, 4)) + np.array([0, 900, -900, 0]).reshape(1, 4, 1, 1)
    x = x.astype(np.float32)
    found = measure(GraphView(m), 0, {"x": x, "y": x})
    wide = x.astype(np.float64).reshape(1, 2, 32)
    sq = (wide - wide.mean(axis=2, keepdims=True)) ** 2
    assert "GroupNormalization" in QUANTITIES
    # channels 0 and 1 (means 0 and 900) are one group: ~32 * 450^2, far past per channel's
    assert found["sum of squared deviations (behind the variance)"] == pytest.approx(
        sq.sum(axis=2).max()
    )
    assert found["sum of squared deviations (behind the variance)"] > 6e6
