"""Reading a model: the inputs a run feeds (a weight listed as a graph input, IR 3, is none
of them), and an IR 3 model whose weights are not inputs."""

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


def test_an_ir_3_model_whose_weights_are_not_inputs_is_read_as_it_is(tmp_path):
    """IR 3 requires weights to be graph inputs; ONNX Runtime's own `mul_1.onnx` does not
    list them, and onnx.checker's refusal was exit 2 ("invalid ONNX model") for a model
    ONNX Runtime and TensorRT read. Read as it is (IR 3: `prepare` makes it IR 4); any
    other refusal stays exit 2."""
    import onnx
    import pytest

    from trtbuild.graph.model_io import load_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(onnx.checker.ValidationError, match="not in graph input"):
        onnx.checker.check_model(model)
    loaded = load_model(tmp_path / "m.onnx")
    assert loaded.ir_version == 3 and loaded.graph.initializer[0].name == "w"
    del model.graph.node[0].input[1:]  # and a Mul of one input stays refused
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(UsageError, match="invalid ONNX model"):
        load_model(tmp_path / "bad.onnx")
