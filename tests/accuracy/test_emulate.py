"""The emulation must reproduce FP16 overflow that ONNX Runtime's CPU FP16 hides."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.helpers import F, model, node
from trtbuild.accuracy.emulate import emulate
from trtbuild.graph.prepare import prepare
from trtbuild.policy.model import Passes, Precision
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert


def _run(m: onnx.ModelProto, feed, optimize: bool = False):
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        m.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    ).run(None, feed)


def _all_fp16(m: onnx.ModelProto) -> onnx.ModelProto:
    return convert(assign(m, Precision(default="fp16"))).model


def test_final_reduction_above_fp16_range_becomes_inf():
    m = model(
        [node("ReduceSum", ["x"], "y", "sum", keepdims=0)], [("x", F, [1000])], [("y", F, [])]
    )
    feed = {"x": np.full(1000, 100.0, np.float32)}  # sum 1e5 > 65504
    (y,) = _run(emulate(_all_fp16(m)), feed)
    assert np.isinf(y)


def test_decomposed_layernorm_variance_overflow_zeroes_output(nafnet_path):
    prepared = prepare(onnx.load(nafnet_path), Passes(opset=17)).model
    feed = {"input": np.random.default_rng(0).uniform(0, 1, (1, 3, 64, 64)).astype(np.float32)}
    mixed = _all_fp16(prepared)
    restored_ref, total_ref = _run(prepared, feed, optimize=True)
    restored, total = _run(emulate(mixed), feed)
    assert np.isfinite(total_ref) and np.isinf(total)
    assert np.abs(restored - restored_ref).max() > 1e-2


def test_fused_layernorm_in_fp16_is_emulated_conservatively():
    """A fused FP16 LayerNormalization whose squares overflow must not pass on the CPU."""
    m = model(
        [node("LayerNormalization", ["x", "g", "b"], "y", "ln", axis=-1, epsilon=1e-5)],
        [("x", F, [2, 16])],
        [("y", F, [2, 16])],
        {"g": np.ones(16, np.float32), "b": np.zeros(16, np.float32)},
    )
    x = np.random.default_rng(1).normal(0, 1000, (2, 16)).astype(np.float32)
    (ref,) = _run(m, {"x": x}, optimize=True)
    (emu,) = _run(emulate(_all_fp16(m)), {"x": x})
    assert np.isfinite(ref).all()
    assert np.abs(emu - ref).max() > 0.5  # d² > 65504 overflows: variance inf, output collapses


@pytest.mark.parametrize(
    ("op", "attrs", "opset"),
    [
        ("ReduceMean", {"axes": [2, 3], "keepdims": 1}, 17),
        ("GlobalAveragePool", {}, 17),
        ("ReduceMean", {"keepdims": 1}, 18),  # axes as an input at opset 18
    ],
)
def test_a_mean_whose_sum_leaves_fp16_is_inf_conservatively(op, attrs, opset):
    """A mean of 100s over 64x64 is 100, but its sum (409600) is stored in FP16 first."""
    inputs = ["x", "axes"] if opset >= 18 else ["x"]
    inits = {"axes": np.array([2, 3], np.int64)} if opset >= 18 else {}
    m = model(
        [node(op, inputs, "y", "mean", **attrs)],
        [("x", F, [1, 2, 64, 64])],
        [("y", F, [1, 2, 1, 1])],
        inits,
        opset=opset,
    )
    x = {"x": np.full((1, 2, 64, 64), 100.0, np.float32)}
    assert np.allclose(_run(m, x)[0], 100.0)
    assert np.isinf(_run(emulate(_all_fp16(m)), x)[0]).all()
    small = {"x": np.full((1, 2, 64, 64), 1.0, np.float32)}  # sum 4096: fine in FP16
    assert np.allclose(_run(emulate(_all_fp16(m)), small)[0], 1.0)
