"""A DQ of a scalar constant becomes a weight: TensorRT takes no quantized constant of rank 0
(ONNX Runtime's `quantize_static` quantizes a GELU's 0.5 so: exit 3 at the engine build)."""

from __future__ import annotations

from pathlib import Path

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


def _builds_an_engine(tmp_path, m: onnx.ModelProto, capsys, passes: str = "") -> Path:
    """A TensorRT-RTX `build` of `m` ends with an engine, whatever its accuracy: its folder."""
    onnx.save(m, tmp_path / "q.onnx")
    (tmp_path / "p.yaml").write_text(f"version: 1\nmodel: q.onnx\n{passes}")
    out = tmp_path / "out"
    code = main(["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(out)])
    assert code in (0, 1), capsys.readouterr().err
    assert (out / "engine.plan").stat().st_size > 0
    return out


@needs_rtx
def test_a_model_with_a_quantized_scalar_builds_an_engine(tmp_path, capsys):
    """It was exit 3: "Quantized constant (half_q) ..." (TensorRT takes none of rank 0)."""
    out = _builds_an_engine(tmp_path, _quantized(), capsys, "passes: {opset: 17}\n")
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


def _quantized_shape_arithmetic() -> onnx.ModelProto:
    """x reshaped to [ceil(3.5) * 2, -1], that arithmetic on constants quantized step by step
    as ONNX Runtime's `quantize_static` quantized a MobileViT's (Q/DQ around the Ceil's
    output, the 2.0 and the product, then a Cast to int64)."""
    qdq = lambda t, s: [  # noqa: E731 - a Q/DQ pair on `t`, scale `s`
        node("QuantizeLinear", [t, s, "z"], f"{t}_q", f"{t}_Q"),
        node("DequantizeLinear", [f"{t}_q", s, "z"], f"{t}_d", f"{t}_DQ"),
    ]
    return model(
        [node("Ceil", ["c"], "ceil", "/Ceil"), *qdq("ceil", "s1"), *qdq("two", "s2"),
         node("Mul", ["ceil_d", "two_d"], "prod", "/Mul"), *qdq("prod", "s3"),
         node("Cast", ["prod_d"], "h", "/Cast", to=TensorProto.INT64),
         node("Unsqueeze", ["h", "axes"], "h1", "/Unsqueeze"),
         node("Concat", ["h1", "minus1"], "shape", "/Concat", axis=0),
         node("Reshape", ["x", "shape"], "r", "/Reshape"), node("Relu", ["r"], "y", "/Relu")],
        [("x", F, [1, 4, 8, 8])],
        [("y", F, [8, 32])],
        {"c": np.array(3.5, np.float32), "two": np.array(2.0, np.float32),
         "s1": np.array(4 / 127, np.float32), "s2": np.array(2 / 127, np.float32),
         "s3": np.array(8 / 127, np.float32), "z": np.array(0, I8),
         "axes": np.array([0], np.int64), "minus1": np.array([-1], np.int64)},
        opset=17,
    )  # fmt: skip


def test_quantized_arithmetic_on_constants_is_folded_through_every_pair():
    """The fold leaves each Q/DQ: each pair of a constant it made is dequantized and folded
    on, until the shape is a constant (TensorRT-RTX could not compute the shape behind
    the pairs: exit 3)."""
    source = _quantized_shape_arithmetic()
    prepared = prepare(source, Passes(opset=17)).model
    ops = [n.op_type for n in prepared.graph.node]
    assert not {"QuantizeLinear", "DequantizeLinear", "Ceil", "Mul", "Cast"} & set(ops), ops
    x = np.linspace(-2, 2, 256, dtype=np.float32).reshape(1, 4, 8, 8)
    (want,) = plain_session(source).run(None, {"x": x})
    (got,) = plain_session(prepared).run(None, {"x": x})
    assert want.shape == (8, 32) and np.array_equal(got, want)


@needs_rtx
def test_quantized_arithmetic_on_constants_builds_an_engine(tmp_path, capsys):
    _builds_an_engine(tmp_path, _quantized_shape_arithmetic(), capsys)


def _quantized_bias_table() -> onnx.ModelProto:
    """BEiT's relative position bias as ONNX Runtime's `quantize_static` quantizes it: a
    table reshaped, a Q/DQ pair, a `Concat` with a stored DQ, a pair again, a `Gather` by
    constant indices, added to `x @ W.T` whose weight's DQ reaches its MatMul through a
    Transpose (that DQ TensorRT fuses: it stays)."""
    rng = np.random.default_rng(0)
    return model(
        [node("Reshape", ["table", "flat"], "t", "/bias/Reshape"),
         node("QuantizeLinear", ["t", "s", "z"], "tq", "/bias/t_Q"),
         node("DequantizeLinear", ["tq", "s", "z"], "td", "/bias/t_DQ"),
         node("DequantizeLinear", ["extra", "s", "z"], "ed", "/bias/extra_DQ"),
         node("Concat", ["td", "ed"], "c", "/bias/Concat", axis=0),
         node("QuantizeLinear", ["c", "s", "z"], "cq", "/bias/c_Q"),
         node("DequantizeLinear", ["cq", "s", "z"], "cd", "/bias/c_DQ"),
         node("Gather", ["cd", "index"], "b", "/bias/Gather"),
         node("QuantizeLinear", ["x", "s", "z"], "xq", "/in/Q"),
         node("DequantizeLinear", ["xq", "s", "z"], "xd", "/in/DQ"),
         node("DequantizeLinear", ["w", "ws"], "wd", "/fc/w_DQ"),
         node("Transpose", ["wd"], "wt", "/fc/Transpose", perm=[1, 0]),
         node("MatMul", ["xd", "wt"], "h", "/fc/MatMul"),
         node("Add", ["h", "b"], "y", "/bias/Add")],
        [("x", F, ["n", 2, 3])],
        [("y", F, ["n", 2, 3])],
        {"table": rng.normal(size=(3, 4)).astype(np.float32), "flat": np.array([12], np.int64),
         "extra": np.array([5, -7, 3, 1], I8), "s": np.array(0.05, np.float32),
         "z": np.array(0, I8), "index": np.array([[0, 3, 15], [7, 12, 1]], np.int64),
         "w": rng.integers(-127, 128, (3, 3)).astype(I8), "ws": np.array(0.02, np.float32)},
        opset=19,
    )  # fmt: skip


def test_quantized_arithmetic_on_a_constant_table_is_folded_and_a_kernels_weight_stays():
    """ONNX Runtime's INT8 BEiT: TensorRT-RTX's builder failed on its bias table's pairs
    with a Myelin check (exit 3, at every precision); folded, it built. The weight's DQ,
    behind its Transpose, is the MatMul's INT8 weight and stays; so do the input's pair."""
    source = _quantized_bias_table()
    prepared = prepare(source, Passes(opset=19)).model
    names = {n.name for n in prepared.graph.node}
    assert not {n for n in names if n.startswith("/bias/") and n != "/bias/Add"}, names
    assert {"/fc/w_DQ", "/fc/Transpose", "/in/Q", "/in/DQ", "/fc/MatMul"} <= names, names
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(2, 2, 3)
    (want,) = plain_session(source).run(None, {"x": x})
    (got,) = plain_session(prepared).run(None, {"x": x})
    assert np.array_equal(got, want)  # the values the pairs compute, exactly
