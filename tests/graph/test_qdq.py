"""The Q/DQ index on ONNX Runtime INT8 models made by the project's script."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.helpers import model, node
from trtbuild.cli import main
from trtbuild.graph.analysis import Analysis
from trtbuild.graph.qdq import QdqGraph, dequantize, fp8_capable, holds, quantize, unheld
from trtbuild.graph.view import GraphView


def _qdq(path) -> QdqGraph:
    return Analysis(GraphView(onnx.load(path))).qdq()


def test_inventory_of_the_int8_cnn(quantized_dir):
    q = _qdq(quantized_dir / "nafnet_tiny_int8.onnx")
    inv = q.inventory()
    assert inv["quantized_ops"] == {"int8": 14}  # every Conv of nafnet_tiny
    assert inv["dq_fed"]["Conv"] == 14
    assert set(inv["pairs"]) == {"int8"}
    assert all(n.symmetric for n in q.nodes.values())
    weights = [n for n in q.nodes.values() if n.is_dq and n.axis is not None]
    assert weights and all(n.scale_value.size > 1 for n in weights)  # per-channel


def test_groups_join_a_q_with_its_dqs(quantized_dir):
    q = _qdq(quantized_dir / "transformer_tiny_int8.onnx")
    assert q.inventory()["quantized_ops"] == {"int8": 18}  # every MatMul
    for g in q.groups:
        if g.q is not None:
            assert g.dqs, "ONNX Runtime's Q always feeds a DQ"
            assert all(q.nodes[d].quantized == q.nodes[g.q].quantized for d in g.dqs)
        else:
            assert len(g.dqs) == 1 and q.nodes[g.dqs[0]].quantized in q.view.initializers
    assert sorted(m for g in q.groups for m in g.members) == sorted(q.nodes)


def test_asymmetric_zero_points_are_seen(quantized_dir):
    q = _qdq(quantized_dir / "nafnet_tiny_asym.onnx")
    assert any(not n.symmetric for n in q.nodes.values())
    assert "uint8" in q.inventory()["pairs"]  # ONNX Runtime's default asymmetric activations


def test_float_model_has_none(nafnet_path):
    q = _qdq(nafnet_path)
    assert not q and q.inventory()["pairs"] == {} and q.quantized_ops == {}


def test_holds_refuses_what_fp16_cannot_keep():
    assert holds(np.array([0.02, 1.0]), TensorProto.FLOAT16)
    assert not holds(np.array([3e-10]), TensorProto.FLOAT16)  # 0 in FP16
    assert not holds(np.array([1e-6]), TensorProto.FLOAT16)  # subnormal
    assert not holds(np.array([7e4]), TensorProto.FLOAT16)
    assert holds(np.array([3e-10]), TensorProto.FLOAT)
    assert not holds(None, TensorProto.FLOAT)  # not a constant


def test_unheld_names_the_scales_each_low_type_cannot_keep():
    v = np.array([1.0, 1e-6, 7e4, np.nan, 2.0**-14, 1e-39])
    assert unheld(v, TensorProto.FLOAT16).tolist() == [False, True, True, True, False, True]
    assert unheld(v, TensorProto.BFLOAT16).tolist() == [False, False, False, True, False, True]


def test_fp8_needs_ada():
    assert fp8_capable("8.9") and fp8_capable("12.0")
    assert not fp8_capable("8.6") and not fp8_capable("7.5")


def _conv_with(scale, bias_dtype=TensorProto.INT8, scale_input=None) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv(DQ(w), DQ(b)): a hand-made Q/DQ graph with one thing wrong."""
    from onnx import helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
        numpy_helper.from_array(np.ones((2, 2, 1, 1), np.int8), "w"),
        numpy_helper.from_array(np.array([0.1, 0.1], np.float32), "ws"),
        numpy_helper.from_array(
            np.ones(2, np.int32 if bias_dtype == TensorProto.INT32 else np.int8), "b"
        ),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", scale_input or "s", "z"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", scale_input or "s", "z"], ["xd"], name="dq"),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], name="w_dq", axis=0),
        helper.make_node("DequantizeLinear", ["b", "ws"], ["bd"], name="b_dq"),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], name="conv"),
    ]
    if scale_input:
        nodes.insert(0, helper.make_node("Abs", ["x_scale_src"], [scale_input], name="computed"))
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 4, 4]) for n in ("x", "y")]
    extra = (
        [helper.make_tensor_value_info("x_scale_src", TensorProto.FLOAT, [])] if scale_input else []
    )
    graph = helper.make_graph(nodes, "g", [vi[0], *extra], vi[1:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _violations(model, capabilities=("8.9",)):
    from trtbuild.graph.qdq import violations

    return violations(QdqGraph(GraphView(model)), capabilities)


def test_violations_name_the_node_and_the_fix():
    assert _violations(_conv_with(0.05)) == []
    (bias,) = _violations(_conv_with(0.05, TensorProto.INT32))
    assert bias.node == "b_dq" and bias.field == "format" and "QuantizeBias" in bias.fix
    zero = _violations(_conv_with(0.0))
    assert {v.node for v in zero} == {"q", "dq"} and all("> 0" in v.problem for v in zero)
    assert all("empty" in v.fix for v in zero)
    (endless, _) = _violations(_conv_with(float("inf")))  # a mask's sentinel calibrated
    assert endless.field == "scale" and "what scale s quantizes left out (conv)" in endless.fix
    computed = _violations(_conv_with(0.05, scale_input="computed_scale"))
    assert computed[0].problem.startswith("scale computed_scale is not a constant")


def test_an_endless_scale_names_every_op_that_reads_what_it_quantizes():
    """ModelOpt quantized a Qwen2's attention mask (finfo.min: an inf scale) for one layer's
    Add and left the other's reading it directly; the fix named no op, and excluding only
    the Add its DQ feeds moved the pair to the other (both must be excluded)."""
    from onnx import helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array(np.inf, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["mask"], name="/model/Where_1"),
        helper.make_node("QuantizeLinear", ["mask", "s", "z"], ["mq"], name="q"),
        helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["md"], name="dq"),
        helper.make_node("Add", ["x", "md"], ["a1"], name="/layers.1/Add_2"),
        helper.make_node("Add", ["x", "mask"], ["a0"], name="/layers.0/Add_2"),
        helper.make_node("Add", ["a0", "a1"], ["y"], name="sum"),
    ]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "g", vi[:1], vi[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    found = _violations(model)
    assert {v.node for v in found} == {"q", "dq"}
    for v in found:
        assert "left out (/layers.1/Add_2, /layers.0/Add_2)" in v.fix, v.fix


def _reference(
    op: str, x: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int, block: int = 0
):
    """ONNX's own QuantizeLinear / DequantizeLinear (onnx.reference) on one constant."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    inits = [numpy_helper.from_array(a, n) for a, n in ((scale, "s"), (zero, "z"))]
    out_type = zero.dtype if op == "QuantizeLinear" else scale.dtype
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(out_type))
    graph = helper.make_graph(
        [
            helper.make_node(
                op, ["x", "s", "z"], ["y"], axis=axis, **({"block_size": block} if block else {})
            )
        ],
        "g",
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info("y", elem, x.shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def test_dequantize_and_quantize_compute_as_onnx_defines_them():
    rng = np.random.default_rng(0)
    stored = rng.integers(-128, 128, (3, 4, 2)).astype(np.int8)
    scale = rng.uniform(1e-3, 1.0, 4).astype(np.float32)
    zero = rng.integers(-5, 5, 4).astype(np.int8)
    want = _reference("DequantizeLinear", stored, scale, zero, axis=1)
    got = dequantize(stored, scale, zero, axis=1)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert dequantize(np.int8(3), np.float32([0.5])).shape == ()  # a scalar stays a scalar

    x = rng.normal(0, 100, (3, 4, 2)).astype(np.float32)  # saturates at both ends
    want = _reference("QuantizeLinear", x, scale, zero, axis=1)
    assert np.array_equal(quantize(x, scale, "int8", zero, axis=1), want.astype(np.float64))
    fp8 = _reference("QuantizeLinear", x, scale, np.zeros(4, ml_dtypes.float8_e4m3fn), axis=1)
    assert np.array_equal(quantize(x, scale, "fp8", axis=1), fp8.astype(np.float64))


def test_a_blocked_dequantize_computes_as_onnx_defines_it():
    """Opset 21's blocked quantization: one scale per block of 4 along axis 0 (a last, short
    block of 2), as `dequantize: true` reads around such a weight's DQ."""
    rng = np.random.default_rng(1)
    stored = rng.integers(-8, 8, (10, 6)).astype(np.int8)
    scale = rng.uniform(0.01, 0.1, (3, 6)).astype(np.float32)
    zero = rng.integers(-2, 2, (3, 6)).astype(np.int8)
    want = _reference("DequantizeLinear", stored, scale, zero, axis=0, block=4)
    assert np.array_equal(dequantize(stored, scale, zero, axis=0, block=4), want)


def test_requantized_names_what_the_quantize_reads_up_through_casts_and_only_for_activations():
    from trtbuild.graph.qdq import requantized

    h = TensorProto.FLOAT16
    m = model(
        [
            node("Relu", ["x"], "r", "relu"),
            node("Cast", ["r"], "c", "to32", to=TensorProto.FLOAT),
            node("Cast", ["c"], "c16", "to16", to=h),
            node("QuantizeLinear", ["c16", "s", "z"], "q", "q"),
            node("DequantizeLinear", ["q", "s", "z"], "dq", "dq"),
            node("DequantizeLinear", ["wq", "s", "z"], "wdq", "wdq"),
            node("QuantizeLinear", ["x", "s", "z"], "qx", "qx"),
            node("DequantizeLinear", ["qx", "s", "z"], "dqx", "dqx"),
            node("QuantizeLinear", ["r", "s", "z8"], "q8", "q8"),
            node("Constant", [], "sc", "sc", value=onnx.numpy_helper.from_array(np.float16(0.25))),
            node("DequantizeLinear", ["q8", "sc", "z8"], "dq8", "dq8"),
            node("DequantizeLinear", ["dq", "s", "z"], "y", "dqdq"),  # refused below: not a Q's
            node("Sum", ["dq", "wdq", "dqx", "dq8"], "out", "sum"),
        ],
        [("x", h, [4])],
        [("out", h, [4]), ("y", h, [4])],
        {
            "s": np.float16(0.5),
            "z": np.int8(0),
            "z8": np.array(0, ml_dtypes.float8_e4m3fn),
            "wq": np.array([1, 2, 3, 4], np.int8),
        },
        opset=21,
    )
    found = requantized(m, "dq")
    assert (found.quantize, found.maker, found.maker_low, found.integer) == (
        "q",
        "relu",
        True,
        True,
    )
    assert found.scale.tolist() == 0.5
    fp8 = requantized(m, "dq8")
    assert (fp8.maker, fp8.integer, fp8.scale.tolist()) == ("relu", False, 0.25)  # a Constant's
    assert requantized(m, "dqx").maker == ""  # a graph input's
    assert requantized(m, "wdq") is None  # a weight's: no Q, no rounding before it
    assert requantized(m, "sum") is None and requantized(m, "nowhere") is None
    assert requantized(m, "dqdq") is None  # it reads a DQ's output, not a Q's
    m.graph.node[3].domain = "com.example"  # a Q of another domain's: not ONNX's rounding
    assert requantized(m, "dq") is None


def _blocked_gemm(scale_shape: tuple[int, int]) -> onnx.ModelProto:
    """A Gemm (transB) reading an INT4 weight [4, 8] through a DQ blocked by 4 on axis 0, its
    scale of `scale_shape`: [1, 8] fits axis 0; [4, 2] is axis 1's, as ModelOpt's awq_clip
    wrote it for a ViT's head."""
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((4, 8), ml_dtypes.int4), "w")
    scale = numpy_helper.from_array(np.full(scale_shape, 0.1, np.float32), "w_scale")
    nodes = [
        helper.make_node(
            "DequantizeLinear", ["w", "w_scale"], ["wd"], "w_dq", axis=0, block_size=4
        ),
        helper.make_node("Gemm", ["x", "wd"], ["y"], "/head/Gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [weight, scale],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_blocked_scale_of_another_axis_is_refused_naming_the_op():
    """ModelOpt's INT4 awq_clip wrote a Gemm's block scales for the other axis: ONNX Runtime
    refused the node only when the reference ran, and trtbuild said to choose input shapes."""
    import onnxruntime as ort

    assert _violations(_blocked_gemm((1, 8))) == []
    wrong = _blocked_gemm((4, 2))
    with pytest.raises(Exception, match="blocked quantization"):  # the premise: ORT refuses it
        session = ort.InferenceSession(
            wrong.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        session.run(None, {"x": np.ones((1, 8), np.float32)})
    (found,) = _violations(wrong)
    assert found.node == "w_dq" and found.field == "scale"
    assert "shape [4, 2]" in found.problem and "needs [1, 8]" in found.problem
    assert "(/head/Gemm) left out" in found.fix


def test_quantize_divides_in_fp32_as_onnx_and_onnx_runtime_do():
    """A weight a hair past a rounding tie in float64 lands on the tie in FP32 and rounds to
    even: `quantize` divided in float64, so the on-grid copy of a weight behind its own Q
    (`convert`) held the other code, a whole step from what the exported Q gives."""
    scale = np.float32(0.0123457)
    k = np.arange(-100, 100)
    ties = ((k + 0.5) * scale).astype(np.float32)
    x = np.concatenate([ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    want = _reference("QuantizeLinear", x, np.array(scale), np.array(0, np.int8), axis=0)
    assert not np.array_equal(np.rint(x.astype(np.float64) / scale), want)  # the premise
    assert np.array_equal(quantize(x, scale, "int8"), want.astype(np.float64))


def test_quantize_takes_int4_blocks_with_a_short_last_one():
    """An INT4 weight behind its own Q, blocked (opset 21): `quantize` had no INT4 bounds
    (KeyError: exit 70 from `check`) and no blocks (the weight was quantized anew at the
    rounded block scales, its codes moved)."""
    rng = np.random.default_rng(2)
    x = rng.normal(0, 0.3, (10, 6)).astype(np.float32)
    scale = rng.uniform(0.02, 0.08, (3, 6)).astype(np.float32)
    zero = np.zeros((3, 6), ml_dtypes.int4)
    want = _reference("QuantizeLinear", x, scale, zero, axis=0, block=4)
    got = quantize(x, scale, "int4", axis=0, block=4)
    assert got.min() == -8 and got.max() == 7  # saturated at both ends
    assert np.array_equal(got, want.astype(np.float64))


def test_a_ragged_last_block_is_refused_naming_the_weight(tmp_path, capsys):
    """TensorRT's parser refuses a blocked weight whose block size does not divide its axis
    ("The quantization axis must divide into whole blocks") at the build, after the judge;
    ONNX Runtime runs it, and `check` passed it."""
    from onnx import helper, numpy_helper

    m = _blocked_gemm((1, 8))
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((6, 8), ml_dtypes.int4), "w"))
    m.graph.initializer[1].CopyFrom(
        numpy_helper.from_array(np.full((2, 8), 0.1, np.float32), "w_scale")
    )
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6]))
    (found,) = _violations(m)
    assert found.node == "w_dq" and found.field == "block_size"
    assert "block_size 4 does not divide dim 0 of the weight w" in found.problem
    assert "its last block holds 2" in found.problem and "(/head/Gemm) left out" in found.fix
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\n")
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2  # (70: an unordered kind)
    assert "Q/DQ node w_dq: block_size 4 does not divide" in capsys.readouterr().err
