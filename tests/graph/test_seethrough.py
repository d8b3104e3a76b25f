"""Patterns see through Q→DQ pairs: a quantized model's units are its float original's.

The quantized models are ONNX Runtime's `quantize_static` INT8 versions of the example
models (`scripts/make_quantized.py`: an image CNN, a transformer, a BERT-class encoder with
the finfo.min mask), which put a pair after every Add, Mul and Div and a
DQ behind every weight: before the float graph was seen through, no LayerNorm, attention
block or norm after attention was found in them.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtbuild.graph import patterns
from trtbuild.graph.analysis import Analysis
from trtbuild.graph.seethrough import see_through
from trtbuild.graph.view import GraphView
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes


def _analysis(path, fuse: bool = False) -> Analysis:
    prepared = prepare(onnx.load(str(path)), Passes(opset=17, fuse_layernorm=fuse))
    return Analysis(GraphView(prepared.model))


def _found(analysis: Analysis) -> dict[str, set[str]]:
    nodes = analysis.view.nodes
    return {
        name: {nodes[i].name for i in patterns.find(name, analysis)} for name in patterns.PATTERNS
    }


@pytest.mark.parametrize("stem", ["nafnet_tiny", "transformer_tiny", "bert_tiny"])
def test_every_pattern_finds_the_same_nodes_on_the_quantized_model(quantized_dir, stem):
    float_found = _found(_analysis(quantized_dir / f"{stem}.onnx"))
    quantized = _analysis(quantized_dir / f"{stem}_int8.onnx")
    found = _found(quantized)
    assert found["layernorm"] and found["layernorm_after_attention"] and found["attention"]
    assert found == float_found  # the same nodes by name, pattern by pattern
    assert len(quantized.norm_units()) == len(
        _analysis(quantized_dir / f"{stem}.onnx").norm_units()
    )
    qdq = {i for i, n in enumerate(quantized.view.nodes) if n.op_type.endswith("QuantizeLinear")}
    assert qdq  # the model is quantized, and no unit holds a Q/DQ node (they are not compute)
    assert not qdq & {i for u in quantized.norm_units() for i in u.nodes}
    assert not qdq & {i for u in quantized.attention_units() for i in u.nodes}


def test_the_normalization_units_are_counted_alike_when_the_float_model_is_fused(quantized_dir):
    """With fusion on, the float transformer's LayerNorms are fused and the quantized model's
    are kept decomposed (a pair inside each): each is one unit all the same."""
    fused = _analysis(quantized_dir / "transformer_tiny.onnx", fuse=True)
    kept = _analysis(quantized_dir / "transformer_tiny_int8.onnx", fuse=True)
    assert len(fused.norm_units()) == len(kept.norm_units()) == 5
    assert {u.kind for u in fused.norm_units()} == {"LayerNormalization"}
    assert {u.kind for u in kept.norm_units()} == {"layernorm"}


def test_a_float_model_has_nothing_to_see_through(quantized_dir):
    view = GraphView(onnx.load(str(quantized_dir / "nafnet_tiny.onnx")))
    assert see_through(view) is None
    analysis = Analysis(view)
    assert analysis.see_through() == (analysis, None)


def test_a_weight_seen_through_is_its_dequantized_value_exactly(quantized_dir):
    view = GraphView(onnx.load(str(quantized_dir / "nafnet_tiny_int8.onnx")))
    seen = see_through(view)
    dq = next(
        i
        for i, n in enumerate(view.nodes)
        if n.op_type == "DequantizeLinear" and n.input[0] in view.initializers
        and view.initializer_array(n.input[1]).size > 1
    )  # fmt: skip
    node = view.nodes[dq]
    q, scale = view.initializer_array(node.input[0]), view.initializer_array(node.input[1])
    expected = q.astype(np.float32) * scale.reshape(-1, *[1] * (q.ndim - 1))
    value = numpy_helper.to_array(seen.view.initializers[node.output[0]])
    np.testing.assert_array_equal(value, expected)
    assert dq in seen.through and dq not in seen.back
    # the float graph's nodes are the quantized graph's compute nodes, in order
    assert [seen.view.nodes[k].name for k in range(len(seen.back))] == [
        view.nodes[i].name for i in seen.back
    ]


def test_an_fp8_model_s_patterns_are_found_through_its_pairs(quantized_dir, tmp_path):
    """FP8 (E4M3) Q/DQ from ONNX Runtime: its weights, LayerNorm scales included, are FP8
    constants behind DQs, dequantized as DequantizeLinear computes them."""
    import make_quantized
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    source, out = quantized_dir / "nafnet_tiny.onnx", tmp_path / "nafnet_fp8.onnx"
    quantize_static(
        str(source),
        str(out),
        make_quantized.SeededReader(make_quantized.QUANTIZED["nafnet_tiny"]),
        quant_format=QuantFormat.QDQ,
        weight_type=QuantType.QFLOAT8E4M3FN,
        activation_type=QuantType.QFLOAT8E4M3FN,
        calibrate_method=CalibrationMethod.Distribution,
        extra_options={"QuantizeBias": False},
    )
    quantized = _analysis(out)
    assert any(n.op_type == "DequantizeLinear" for n in quantized.view.nodes)
    found = _found(quantized)
    assert found["layernorm"] and found == _found(_analysis(source))
