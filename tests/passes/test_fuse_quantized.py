"""LayerNorm fusion and BatchNorm folding on Q/DQ graphs: through the pairs where the
rewrite is exact, refused (with the pair that stops it) where it would drop a quantization."""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ROOT
from tests.helpers import plain_session
from trtbuild.passes import fuse
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes

sys.path.insert(0, str(ROOT / "scripts"))
import make_quantized

RNG = np.random.default_rng(0)


def _run(m: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    return plain_session(m).run(None, feed)


def _layernorm_record(path) -> dict:
    prepared = prepare(onnx.load(str(path)), Passes(opset=17))
    return next(r for r in prepared.records if r.name == "fuse_layernorm").details


def test_a_pair_inside_each_layernorm_keeps_it_decomposed_and_says_which(quantized_dir):
    """ONNX Runtime quantizes the variance, the Div and the Mul inside each LayerNorm."""
    assert len(_layernorm_record(quantized_dir / "transformer_tiny.onnx")["fused"]) == 5
    record = _layernorm_record(quantized_dir / "transformer_tiny_int8.onnx")
    assert record["fused"] == [] and len(record["not_fused"]) == 5
    for entry in record["not_fused"]:
        assert entry["why"].startswith("Q/DQ pair ") and "QuantizeLinear" in entry["why"]
        assert "would drop that quantization" in entry["why"]


def test_pairs_around_the_layernorms_only_fuse_as_on_the_float_model(quantized_dir, tmp_path):
    """Q/DQ before every MatMul only, where ModelOpt puts them: every LayerNorm fuses."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    out = tmp_path / "matmul_int8.onnx"
    quantize_static(
        str(quantized_dir / "transformer_tiny.onnx"),
        str(out),
        make_quantized.SeededReader(make_quantized.QUANTIZED["transformer_tiny"]),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )
    record = _layernorm_record(out)
    assert len(record["fused"]) == 5 and record["not_fused"] == []


def _quantized_layernorm() -> onnx.ModelProto:
    """x -> Q -> DQ -> a decomposed LayerNorm whose weight and bias are INT8 behind DQs."""
    gamma = np.array([12, -50, 127, 90], np.int8)
    beta = np.array([-3, 7, 0, 100], np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "z"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "z"], ["xd"], name="x_dq"),
        helper.make_node("DequantizeLinear", ["gq", "gs", "z"], ["g"], name="g_dq"),
        helper.make_node("DequantizeLinear", ["bq", "bs", "z"], ["b"], name="b_dq"),
        helper.make_node("ReduceMean", ["xd"], ["m"], name="mean", axes=[-1]),
        helper.make_node("Sub", ["xd", "m"], ["d"], name="sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
        helper.make_node("ReduceMean", ["d2"], ["v"], name="var", axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"], name="add_eps"),
        helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
        helper.make_node("Div", ["d", "s"], ["n"], name="div"),
        helper.make_node("Mul", ["n", "g"], ["ng"], name="mul"),
        helper.make_node("Add", ["ng", "b"], ["y"], name="add"),
    ]
    inits = {
        "xs": np.array(0.05, np.float32),
        "z": np.array(0, np.int8),
        "gq": gamma,
        "gs": np.array(0.01, np.float32),
        "bq": beta,
        "bs": np.array(0.002, np.float32),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-5, np.float32),
    }
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_layernorm_behind_a_pair_with_dequantized_weights_fuses_exactly():
    before = _quantized_layernorm()
    after, record = fuse.fuse_layernorm(before)
    assert [f["name"] for f in record.details["fused"]] == ["mean"]
    ops = [n.op_type for n in after.graph.node]
    assert ops == ["QuantizeLinear", "DequantizeLinear", "LayerNormalization"]
    ln = after.graph.node[-1]
    assert ln.input[0] == "xd"  # it reads the DQ, as the unit did: the pair stays
    feed = {"x": RNG.normal(0, 3, (2, 3, 4)).astype(np.float32)}
    (a,), (b,) = _run(before, feed), _run(after, feed)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def _conv_bn(pair_after_conv: bool, float_weight: bool = False) -> onnx.ModelProto:
    """A Conv with an INT8 weight behind a DQ (per output channel), then a BatchNorm whose
    first channel has a negative scale; `pair_after_conv` quantizes the Conv's output too;
    `float_weight` stores the weight in float behind a Q, as ModelOpt writes it."""
    wq = RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    wf = RNG.normal(0, 0.3, wq.shape).astype(np.float32)
    if float_weight:  # per-channel max calibration, as quantizers do: nothing saturates
        ws = (np.abs(wf).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    else:
        ws = RNG.uniform(0.001, 0.01, 4).astype(np.float32)
    weight = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="w_dq", axis=0)]
    if float_weight:
        weight.insert(
            0, helper.make_node("QuantizeLinear", ["wf", "ws", "wz"], ["wq"], name="w_q", axis=0)
        )
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "z"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "z"], ["xd"], name="x_dq"),
        *weight,
        helper.make_node("Conv", ["xd", "w", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
    ]
    bn_in = "c"
    if pair_after_conv:
        nodes += [
            helper.make_node("QuantizeLinear", ["c", "cs", "z"], ["cq"], name="c_q"),
            helper.make_node("DequantizeLinear", ["cq", "cs", "z"], ["cd"], name="c_dq"),
        ]
        bn_in = "cd"
    nodes.append(
        helper.make_node("BatchNormalization", [bn_in, "g", "be", "mu", "var"], ["y"], name="bn")
    )
    inits = {
        "xs": np.array(0.01, np.float32),
        "cs": np.array(0.1, np.float32),
        "z": np.array(0, np.int8),
        **({"wf": wf} if float_weight else {"wq": wq}),
        "ws": ws,
        "wz": np.zeros(4, np.int8),
        "cb": RNG.normal(0, 0.1, 4).astype(np.float32),
        "g": np.array([-0.7, 1.2, 0.9, 1.5], np.float32),
        "be": RNG.normal(0, 0.1, 4).astype(np.float32),
        "mu": RNG.normal(0, 0.2, 4).astype(np.float32),
        "var": RNG.uniform(0.5, 2, 4).astype(np.float32),
    }
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_batchnorm_folds_into_an_int8_conv_exactly_with_positive_scales():
    before = _conv_bn(pair_after_conv=False)
    after, record = fuse.fold_batchnorm(before)
    assert record.details["folded"] == [{"name": "conv", "batchnorm": "bn"}]
    ops = [n.op_type for n in after.graph.node]
    assert ops == ["QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "Conv"]
    inits = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    assert inits["conv.weight_bnfolded_int8"].dtype == np.int8
    assert (inits["conv.weight_bnfolded_scale"] > 0).all()  # TensorRT takes no other
    assert "wq" not in inits  # the old weight DQ went with its last reader
    feed = {"x": RNG.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)}
    (a,), (b,) = _run(before, feed), _run(after, feed)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


def test_a_batchnorm_behind_a_pair_on_the_conv_output_stays_and_says_which():
    before = _conv_bn(pair_after_conv=True)
    after, record = fuse.fold_batchnorm(before)
    assert record.details["folded"] == []
    (entry,) = record.details["not_folded"]
    assert entry["name"] == "bn" and entry["why"].startswith("Q/DQ pair c_q quantizes")
    assert [n.name for n in after.graph.node] == [n.name for n in before.graph.node]


def test_a_batchnorm_folds_into_a_conv_whose_float_weight_is_behind_a_q():
    """ModelOpt's form (a float weight, Q, DQ): the weight times s, the scales times |s|."""
    before = _conv_bn(pair_after_conv=False, float_weight=True)
    after, record = fuse.fold_batchnorm(before)
    assert record.details["folded"] == [{"name": "conv", "batchnorm": "bn"}]
    ops = [n.op_type for n in after.graph.node]
    assert ops == [
        "QuantizeLinear",
        "DequantizeLinear",
        "QuantizeLinear",
        "DequantizeLinear",
        "Conv",
    ]
    inits = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    assert (inits["conv.weight_bnfolded_scale"] > 0).all() and "wf" not in inits
    feed = {"x": RNG.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)}
    (a,), (b,) = _run(before, feed), _run(after, feed)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


def test_a_saturated_weight_in_a_negative_channel_is_not_folded():
    """Negated, a weight the Q saturates at -128 would be 128: not exact, so kept."""
    before = _conv_bn(pair_after_conv=False, float_weight=True)
    for t in before.graph.initializer:
        if t.name == "ws":  # a hundredth of the calibrated scales: most weights saturate
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) / 100, "ws"))
    after, record = fuse.fold_batchnorm(before)
    (entry,) = record.details["not_folded"]
    assert "negative BatchNorm scale holds -128" in entry["why"]
    assert [n.name for n in after.graph.node] == [n.name for n in before.graph.node]


def test_a_layernorm_reading_x_and_its_pair_stays_decomposed_and_exact():
    """Some of the unit's nodes read the DQ, some the raw x: the float graph under the pair
    sees one LayerNorm, but one fused input would change the other nodes' math."""
    before = _quantized_layernorm()
    for node in before.graph.node:
        if node.name == "sub":
            node.input[0] = "x"  # the deviation from the raw input, the mean from the DQ
    after, record = fuse.fuse_layernorm(before)
    assert record.details["fused"] == []
    (kept,) = record.details["not_fused"]
    assert "'x' and 'xd'" in kept["why"]
    feed = {"x": RNG.normal(0, 3, (2, 3, 4)).astype(np.float32)}
    (a,), (b,) = _run(before, feed), _run(after, feed)
    np.testing.assert_array_equal(b, a)


def test_a_batchnorm_whose_scale_is_zero_is_not_folded_into_a_zero_weight_scale():
    """gamma 0 in a channel would give that channel's Q/DQ scale 0, which TensorRT refuses
    (and `check` would blame a node the user's model does not have): the BatchNorm stays."""
    before = _conv_bn(pair_after_conv=False)
    for t in before.graph.initializer:
        if t.name == "g":
            t.CopyFrom(numpy_helper.from_array(np.array([1.0, 0.0, 0.9, 1.5], np.float32), "g"))
    after, record = fuse.fold_batchnorm(before)
    (entry,) = record.details["not_folded"]
    assert entry["name"] == "bn" and "scales > 0" in entry["why"]
    assert [n.name for n in after.graph.node] == [n.name for n in before.graph.node]


def _conv_bn_blocked() -> onnx.ModelProto:
    """A Conv whose INT8 weight's DQ has one scale per block of 4 output channels (opset
    21's `block_size`), then a BatchNorm: each block's channels share a scale their
    BatchNorm factors (all different) cannot be folded into."""
    co, ci, block = 8, 4, 4
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "z"], ["xq"], name="x_q"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "z"], ["xd"], name="x_dq"),
        helper.make_node(
            "DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="w_dq", axis=0, block_size=block
        ),
        helper.make_node("Conv", ["xd", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["y"], name="bn"),
    ]
    blocks = (co // block, ci, 1, 1)
    inits = {
        "xs": np.array(0.02, np.float32),
        "z": np.array(0, np.int8),
        "wq": RNG.integers(-127, 128, (co, ci, 1, 1)).astype(np.int8),
        "ws": RNG.uniform(0.001, 0.01, blocks).astype(np.float32),
        "wz": np.zeros(blocks, np.int8),
        "g": RNG.uniform(0.5, 2, co).astype(np.float32),
        "be": RNG.normal(0, 1, co).astype(np.float32),
        "mu": RNG.normal(0, 1, co).astype(np.float32),
        "var": RNG.uniform(0.5, 2, co).astype(np.float32),
    }
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ci, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, 2, 2])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_batchnorm_after_a_block_quantized_int8_weight_is_kept_and_says_why():
    """The block scales were taken for per-channel ones: `np.broadcast_to` raised, and
    `check`, `prepare` and `build` ended in an internal error (exit 70)."""
    before = _conv_bn_blocked()
    after, record = fuse.fold_batchnorm(before)
    assert record.details["folded"] == []
    (entry,) = record.details["not_folded"]
    assert entry["name"] == "bn" and "w_dq is block-quantized (block_size 4" in entry["why"]
    assert [n.name for n in after.graph.node] == [n.name for n in before.graph.node]
    feed = {"x": RNG.uniform(0, 2, (1, 4, 2, 2)).astype(np.float32)}
    (a,), (b,) = _run(before, feed), _run(after, feed)
    np.testing.assert_array_equal(b, a)
    prepared = prepare(before, Passes())  # every pass, as `check` and `build` run them
    assert [n.op_type for n in prepared.model.graph.node][-1] == "BatchNormalization"


def _weight_codes(m: onnx.ModelProto, q_name: str) -> np.ndarray:
    """The INT8 codes the weight Q whose name holds `q_name` gives, as ONNX Runtime runs it."""
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    q = next(n for n in probe.graph.node if n.op_type == "QuantizeLinear" and q_name in n.name)
    probe.graph.output.append(helper.make_tensor_value_info(q.output[0], TensorProto.INT8, None))
    feed = {"x": np.zeros((1, 3, 8, 8), np.float32)}
    return plain_session(probe).run([q.output[0]], feed)[0].astype(np.int32)


def _with(m: onnx.ModelProto, **values: np.ndarray) -> onnx.ModelProto:
    for t in m.graph.initializer:
        if t.name in values:
            t.CopyFrom(numpy_helper.from_array(values[t.name], t.name))
    return m


def test_a_float_weight_near_rounding_ties_keeps_every_code_through_the_fold():
    """Folded as w * s and scale * |s|, each rounded to FP32, a weight within a few
    millionths of a step of a rounding tie took the next code (76 of 512 in the finding's
    model): the folded Q now gives each weight the exported Q's code, negated where the
    BatchNorm scale is negative, and the float weight stays w * s within a thousandth of
    a step."""
    rng = np.random.default_rng(5)
    ws = rng.uniform(0.005, 0.02, (4, 1, 1, 1)).astype(np.float32)
    codes = rng.integers(-120, 121, (4, 3, 3, 3))
    near = codes + 0.5 - rng.uniform(1e-7, 4e-6, codes.shape) * rng.choice([-1, 1], codes.shape)
    wf = (near * ws.astype(np.float64)).astype(np.float32)
    # only ties float32 and float64 division round alike (ONNX Runtime's and numpy's Q)
    alike = np.rint(wf / ws) == np.rint(wf.astype(np.float64) / ws)
    wf = np.where(alike, wf, ((codes + 0.25) * ws).astype(np.float32))
    var = rng.uniform(0.5, 2, 4).astype(np.float32)
    before = _with(
        _conv_bn(pair_after_conv=False, float_weight=True), wf=wf, ws=ws.ravel(), var=var
    )
    after, record = fuse.fold_batchnorm(before)
    assert record.details["folded"] == [{"name": "conv", "batchnorm": "bn"}]
    inits = {t.name: numpy_helper.to_array(t) for t in before.graph.initializer}
    s = (inits["g"] / np.sqrt(inits["var"].astype(np.float64) + 1e-5)).reshape(-1, 1, 1, 1)
    exported, folded = _weight_codes(before, "w_q"), _weight_codes(after, "bnfolded")
    np.testing.assert_array_equal(folded, exported * np.sign(s).astype(np.int32))
    new = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    step = new["conv.weight_bnfolded_scale"].reshape(-1, 1, 1, 1)
    moved = np.abs(new["conv.weight_bnfolded_float"] - wf.astype(np.float64) * s) / step
    assert moved.max() < 2e-3  # the float weight a `dequantize: true` op reads
    feed = {"x": RNG.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)}
    (a,), (b,) = _run(before, feed), _run(after, feed)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


def test_a_weight_saturated_at_127_in_a_negative_channel_is_not_folded():
    """Negated, a weight its Q saturates at 127 (quotient 140) quantizes to -128, not
    -127: the fold gave it another code, so the BatchNorm stays."""
    before = _conv_bn(pair_after_conv=False, float_weight=True)
    inits = {t.name: numpy_helper.to_array(t) for t in before.graph.initializer}
    wf = np.abs(inits["wf"])  # positive only: nothing at -128
    wf[0, 0, 0, 0] = 140 * inits["ws"][0]  # channel 0's BatchNorm scale is negative
    after, record = fuse.fold_batchnorm(_with(before, wf=wf))
    (entry,) = record.details["not_folded"]
    assert "negative BatchNorm scale holds a weight its Q saturates at 127" in entry["why"]
    assert [n.name for n in after.graph.node] == [n.name for n in before.graph.node]
