"""The inputs a run feeds: a weight listed as a graph input (IR 3) is none of them."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from trtbuild.errors import UsageError
from trtbuild.graph.model_io import fed_inputs, no_input


def test_a_weight_listed_as_a_graph_input_is_not_fed():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [x, w],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((1, 4), np.float32), "w")],
    )
    model = helper.make_model(graph)
    assert [vi.name for vi in fed_inputs(model)] == ["x"]
    err = no_input("inputs.image", "image", ["x"], "p.yaml")
    assert isinstance(err, UsageError)
    assert str(err) == "p.yaml: inputs.image: the model has no input 'image' (its inputs are x)"
