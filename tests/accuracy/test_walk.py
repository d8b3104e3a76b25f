"""When the judge walks the graph (`accuracy.walk`): a failure and an overflow an output
masks are always explained; a passing candidate is walked only when the policy asks.

Real builds (`backend: none`) of a two-node graph: x * gain, then Clip to [0, 1]. With
gain 10 and x in [0, 1) the product stays in FP16's range; with gain 1e5 it turns inf in
FP16 (unless pinned), and the Clip hides that from the output (inf -> 1, as FP32's
1e5 -> 1).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.helpers import F, model, node
from trtbuild.cli import main


def _build(tmp_path, gain: float, walk: str | None, atol: float = 1e-2, rules: str = "[]") -> dict:
    m = model(
        [node("Mul", ["x", "g"], "p", "scale"), node("Clip", ["p", "lo", "hi"], "y", "clip")],
        [("x", F, [1, 64])],
        [("y", F, [1, 64])],
        {"g": np.float32(gain), "lo": np.float32(0.0), "hi": np.float32(1.0)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    walk_line = f"\n  walk: {walk}" if walk else ""
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\n"
        "inputs:\n  x: {shape: [1, 64], data: {distribution: uniform, low: 0.0, high: 1.0}}\n"
        f"precision: {{default: fp16, rules: {rules}}}\nbuild: {{backend: none}}\n"
        f"accuracy:\n  samples: 2{walk_line}\n"
        f"  tolerances: {{default: {{atol: {atol}, rtol: 0.0, check_error_stat: max}}}}\n"
    )
    assert main(["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "o")]) in (
        0,
        1,
    )
    return json.loads((tmp_path / "o" / "report.json").read_text())


def test_a_passing_policy_is_not_walked_and_the_report_says_so(tmp_path):
    report = _build(tmp_path, gain=0.5, walk=None)
    assert report["passed"] and report["walked"] is False
    assert report["first_divergence"] is None and report["error_curve"] == []
    md = (tmp_path / "o" / "report.md").read_text()
    assert (
        "not searched: every output passes and no tensor turns non-finite on the first sample" in md
    )


def test_walk_always_walks_a_passing_policy(tmp_path):
    report = _build(tmp_path, gain=0.5, walk="always")
    assert report["passed"] and report["walked"] is True
    assert [p["node"] for p in report["error_curve"]] == ["scale", "clip"]


def test_a_failing_policy_is_walked(tmp_path):
    report = _build(tmp_path, gain=0.5, walk=None, atol=1e-9)  # FP16 rounding alone fails it
    assert not report["passed"] and report["walked"] is True
    assert [p["node"] for p in report["error_curve"]] == ["scale", "clip"]
    assert report["first_divergence"] is None  # every tensor within 5% of its range


def test_the_walks_candidates_hold_one_session_at_a_time(tmp_path, monkeypatch):
    """A failing policy and its FP16 baseline are walked in lockstep beside the reference,
    after their verdicts: their lean sessions are let go first, and each segment's session,
    the reference's and the candidates', goes once it ran, so no two sessions of the
    weights (each a copy in ONNX Runtime) are alive at once."""
    import weakref

    from trtbuild.accuracy import stream
    from trtbuild.accuracy.stream import SegmentRunner

    made, leans, alive_at_each = [], [], []
    real, lean = SegmentRunner._session, stream.lean_session

    def watched(self, k, inputs):
        alive_at_each.append(sum(r() is not None for r in (*made, *leans)))
        session = real(self, k, inputs)
        made.append(weakref.ref(session))
        return session

    def watched_lean(model):
        alive_at_each.append(sum(r() is not None for r in (*made, *leans)))
        session = lean(model)
        leans.append(weakref.ref(session))
        return session

    monkeypatch.setattr(SegmentRunner, "_session", watched)
    monkeypatch.setattr(stream, "lean_session", watched_lean)
    pin = "[{id: c, match: {name: clip}, precision: fp32}]"
    report = _build(tmp_path, gain=0.5, walk=None, atol=1e-9, rules=pin)
    assert report["walked"] is True and report["baselines"]["fp16"]["walked"] is True
    # the walk's: the reference, each candidate (after the FP32 reference's measuring run,
    # where no earlier test's cache holds its measures), and before them the lean runs',
    # one candidate's after the other's went (the build's last point: judged no more)
    assert len(made) in (3, 4) and len(leans) == 2 and alive_at_each[-5:] == [0] * 5


@pytest.mark.parametrize("walk", [None, "always"])
def test_an_overflow_the_output_masks_is_walked_to_its_node(tmp_path, walk):
    """The policy pins the product from the reference's ranges, but the Cast to FP16 the
    conversion adds before the Clip turns it inf; its all-FP16 baseline overflows in the
    product itself. The Clip hides both from the output, and both fail
    (`accuracy.masked_overflow: fail`), each walked to where the inf appears."""
    report = _build(tmp_path, gain=1e5, walk=walk)
    assert not report["passed"] and report["walked"] is True
    assert all(o["passed"] for o in report["outputs"].values())
    assert report["first_divergence"]["node"] == "trtbuild/cast_fp16/p"
    assert report["overflow"]["source"] == "p"
    base = report["baselines"]["fp16"]
    assert not base["passed"] and base["walked"] is True
    first = base["first_divergence"]
    assert first["node"] == "scale" and "64 non-finite value(s) (64 inf)" in first["reason"]


def _ties(tmp_path) -> dict:
    """x (at the ties of a Q's grid) -> Mul by 1.0003 -> Q -> DQ -> MatMul: FP16 rounds 1.0003
    to 1, and round-half-to-even then puts a value one step from where FP32 puts it, on a
    DQ whose values span one step."""
    step = 2.0**-7
    w = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Mul", ["x", "k"], ["m"], name="scale"),
        onnx.helper.make_node("QuantizeLinear", ["m", "s", "z"], ["q"], name="q"),
        onnx.helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
        onnx.helper.make_node("MatMul", ["dq", "w"], ["y"], name="mm"),
    ]
    inits = {"k": np.float32(1.0003), "s": np.float32(step), "z": np.int8(0), "w": w}
    m = model(nodes, [("x", F, [4, 8])], [("y", F, [4, 8])], inits, opset=19)
    onnx.save(m, tmp_path / "m.onnx")
    odd = 2 * np.random.default_rng(1).integers(-1, 1, size=(1, 4, 8)) + 1
    np.savez(tmp_path / "x.npz", x=(odd * step / 2).astype(np.float32))
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs: {x: {shape: [4, 8], data: {file: x.npz}}}\n"
        "build: {backend: none}\naccuracy: {samples: 1, tolerances: {default: {atol: 1e-3, rtol: 1e-3}}}\n"
    )
    code = main(["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "o")])
    assert code == 1
    return json.loads((tmp_path / "o" / "report.json").read_text())["first_divergence"]


def test_a_divergence_at_a_dequantize_is_said_in_steps_with_what_fp16_rounded(tmp_path):
    """ "error 100% of the tensor's range" at a DQ one step wide read as a broken
    quantization: it is one step, made by FP16's rounding of what the Q quantizes."""
    first = _ties(tmp_path)
    assert first["node"] == "dq" and first["op"] == "DequantizeLinear"
    assert first["reason"] == (
        "error 100.00% of the tensor's range exceeds 5%: 1 quantization step of 0.007812, "
        "where FP16's rounding of `scale`'s output, which `q` quantizes, moved values across "
        "its rounding boundaries; a rule keeping `scale` in FP32 keeps them"
    )


def test_steps_no_rounding_of_the_qs_input_makes_are_not_laid_on_its_maker(tmp_path):
    """x near 1050 rounded to FP16 (a step of 1 there), minus 1050, then a Q of step 0.02:
    the DQ is off by up to 25 steps, which no rounding of the Sub's own output makes (it
    moves a value in the Q's range by under a tenth of a step). The reason said FP16's
    rounding of the Sub's output did it and that a rule keeping the Sub in FP32 keeps them,
    which it does not: the error came from further up."""
    w = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Mul", ["x", "one"], ["a"], name="copy"),
        onnx.helper.make_node("Sub", ["a", "c"], ["b"], name="shift"),
        onnx.helper.make_node("QuantizeLinear", ["b", "s", "z"], ["q"], name="q"),
        onnx.helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
        onnx.helper.make_node("MatMul", ["dq", "w"], ["y"], name="mm"),
    ]
    inits = {"one": np.float32(1), "c": np.float32(1050), "s": np.float32(0.02),
             "z": np.int8(0), "w": w}  # fmt: skip
    onnx.save(model(nodes, [("x", F, [4, 8])], [("y", F, [4, 8])], inits, opset=19),
              tmp_path / "m.onnx")  # fmt: skip
    x = 1050 + np.random.default_rng(1).uniform(-50, 50, size=(1, 4, 8))
    x[0, 0, :4] = [1048.3, 1049.6, 1050.4, 1051.7]  # within the Q's range, FP16 rounds by steps
    np.savez(tmp_path / "x.npz", x=x.astype(np.float32))
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs: {x: {shape: [4, 8], data: {file: x.npz}}}\n"
        "build: {backend: none}\naccuracy: {samples: 1, tolerances: {default: {atol: 1e-3, rtol: 1e-3}}}\n"
    )
    assert main(["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "o")]) == 1
    first = json.loads((tmp_path / "o" / "report.json").read_text())["first_divergence"]
    assert first["node"] == "dq", first
    assert "quantization steps of 0.02, where FP16's error in what `q` quantizes" in first["reason"]
    assert "by more steps than one rounding of `shift`'s output can" in first["reason"]
    assert "a rule keeping" not in first["reason"]


@pytest.mark.parametrize("walk", ["on_failure", "always"])
def test_an_input_handed_out_as_an_output_is_judged_whatever_walks(tmp_path, walk):
    """torch's `return y, x`: the output x comes from no node, so no segment of the walk makes
    it; it is judged as the lean run judges it (as given)."""
    m = model(
        [node("Mul", ["x", "g"], "y", "scale")],
        [("x", F, [1, 64])],
        [("y", F, [1, 64]), ("x", F, [1, 64])],
        {"g": np.float32(3.0)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 64]}\n"
        f"build: {{backend: none}}\naccuracy:\n  samples: 2\n  walk: {walk}\n"
    )
    code = main(["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "o")])
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert code == 0 and report["passed"]
    assert report["outputs"]["x"]["max_abs"] == 0.0
