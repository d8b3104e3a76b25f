"""An array in a low float type rounds as ONNX's Cast rounds it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from trtbuild.graph.optypes import as_float_type


@pytest.mark.parametrize(
    "dtype", [TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT], ids=str
)
def test_as_float_type_rounds_as_a_cast(dtype):
    big = np.finfo(np.float32).min  # Hugging Face's mask value: -inf in FP16 and BF16
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 65519.0, 65520.0, big, 1e-8, 0.1], np.float32)
    node = helper.make_node("Cast", ["x"], ["y"], to=dtype)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", dtype, x.shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with np.errstate(over="ignore"):
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = as_float_type(x, dtype)
    assert got.dtype == want.dtype
    assert np.array_equal(got.astype(np.float64), want.astype(np.float64))
