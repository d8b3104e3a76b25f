"""A DQ of a scalar constant becomes a weight: TensorRT takes no quantized constant of rank 0
(ONNX Runtime's `quantize_static` quantizes a GELU's 0.5 so: exit 3 at the engine build)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from tests.helpers import F, model, needs_rtx, node, plain_session
from trtbuild.cli import main
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes

I8 = np.int8


def _quantized() -> onnx.ModelProto:
    """y = (x * DQ(scalar) + DQ([1])) @ DQ(weight): the scalar's DQ read twice."""
    return model(
        [node("DequantizeLinear", ["half_q", "half_s", "z"], "half", "half_dq"),
         node("Mul", ["x", "half"], "a", "/mul"), node("Mul", ["a", "half"], "b", "/mul2"),
         node("DequantizeLinear", ["one_q", "one_s", "z1"], "one", "one_dq"),
         node("Add", ["b", "one"], "c", "/add"),
         node("DequantizeLinear", ["w_q", "w_s", "z"], "w", "w_dq"),
         node("MatMul", ["c", "w"], "y", "/matmul")],
        [("x", F, [2, 4])],
        [("y", F, [2, 3])],
        {"half_q": np.array(50, I8), "half_s": np.array(0.01, np.float32), "z": np.array(0, I8),
         "one_q": np.array([100], I8), "one_s": np.array(0.01, np.float32), "z1": np.array([0], I8),
         "w_q": np.arange(-6, 6, dtype=I8).reshape(4, 3), "w_s": np.array(0.1, np.float32)},
        opset=13,
    )  # fmt: skip


def test_a_scalars_dq_becomes_its_value_and_every_other_dq_stays():
    source = _quantized()
    prepared = prepare(source, Passes(opset=17)).model
    ops = {n.name: n.op_type for n in prepared.graph.node}
    assert "half_dq" not in ops and {"one_dq", "w_dq"} <= set(ops), ops
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in prepared.graph.initializer}
    assert weights["half"].dtype == np.float32 and weights["half"] == np.float32(50 * 0.01)
    assert "half_q" not in weights and "half_s" not in weights  # read by nothing else
    assert "z" in weights  # the weight's DQ reads it still
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    (want,) = plain_session(source).run(None, {"x": x})
    (got,) = plain_session(prepared).run(None, {"x": x})
    assert np.array_equal(got, want)  # the value DequantizeLinear computes, exactly


@needs_rtx
def test_a_model_with_a_quantized_scalar_builds_an_engine(tmp_path, capsys):
    onnx.save(_quantized(), tmp_path / "q.onnx")
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: q.onnx\npasses: {opset: 17}\n")
    out = tmp_path / "out"
    code = main(["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(out)])
    assert code in (0, 1), capsys.readouterr().err  # was 3: "Quantized constant (half_q) ..."
    assert (out / "engine.plan").stat().st_size > 0
    assert TensorProto.INT8 in {
        t.data_type for t in onnx.load(out / "mixed.onnx").graph.initializer
    }


def test_a_scalars_dq_inside_a_body_stays_and_the_model_holds():
    """Only the main graph's: a body's DQ folded into a main-graph weight of its output's
    name would define that value twice."""
    from onnx import helper

    from tests.helpers import if_on_sign

    def branch(tag: str) -> onnx.GraphProto:
        return helper.make_graph(
            [node("DequantizeLinear", ["hq", "hs", "hz"], f"{tag}_c", f"{tag}_dq"),
             node("Mul", ["x", f"{tag}_c"], f"{tag}_out", f"{tag}_mul")],
            tag, [], [helper.make_tensor_value_info(f"{tag}_out", F, [1, 4])],
        )  # fmt: skip

    weights = {"hq": np.array(50, I8), "hs": np.array(0.01, np.float32), "hz": np.array(0, I8)}
    source = if_on_sign(branch("then"), branch("else"), [1, 4], weights)
    prepared = prepare(source, Passes(opset=17)).model
    onnx.checker.check_model(prepared, full_check=True)
    x = np.array([[1.0, 2.0, -0.5, 0.25]], np.float32)
    (want,) = plain_session(source).run(None, {"x": x})
    (got,) = plain_session(prepared).run(None, {"x": x})
    assert np.array_equal(got, want)
