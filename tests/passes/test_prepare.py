from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from trtbuild.graph.model_io import opset_of
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes


def _run(model: onnx.ModelProto, feed):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feed
    )


def test_prepare_upgrades_opset_lifts_constants_and_keeps_numerics(nafnet_path):
    source = onnx.load(nafnet_path)
    prepared = prepare(onnx.load(nafnet_path), Passes(opset=17))
    assert opset_of(prepared.model) == 17
    assert not [n for n in prepared.model.graph.node if n.op_type == "Constant"]
    lifted = next(r for r in prepared.records if r.name == "lift_constants")
    assert lifted.changed == 8
    feed = {"input": np.random.default_rng(0).uniform(0, 1, (1, 3, 64, 64)).astype(np.float32)}
    for before, after in zip(_run(source, feed), _run(prepared.model, feed)):
        np.testing.assert_allclose(after, before, rtol=1e-5)


def test_prepare_keeps_node_names_and_is_idempotent(nafnet_path):
    source_names = {n.name for n in onnx.load(nafnet_path).graph.node if n.op_type != "Constant"}
    once = prepare(onnx.load(nafnet_path), Passes(opset=17)).model
    twice = prepare(once, Passes(opset=17)).model
    assert {n.name for n in once.graph.node} == source_names
    assert [n.name for n in twice.graph.node] == [n.name for n in once.graph.node]


def test_prepare_never_lowers_the_opset(nafnet_path):
    prepared = prepare(onnx.load(nafnet_path), Passes(opset=11))
    assert opset_of(prepared.model) == 13


def test_prepare_leaves_its_input_as_it_was(models_dir):
    """Every pass that changes a graph changes a copy: unnamed nodes, Constants, BatchNorms,
    inferred shapes and an opset upgrade all in one model."""
    for name in ("nafnet_tiny", "transformer_tiny", "gfpgan_tiny", "bert_tiny"):
        source = onnx.load(models_dir / f"{name}.onnx")
        source.graph.node[0].name = ""  # one unnamed node
        before = source.SerializeToString()
        prepared = prepare(source, Passes(opset=17)).model
        assert source.SerializeToString() == before, name
        assert prepared is not source


def test_the_opset_upgrade_reaches_into_bodies_and_what_it_adds_there_is_named():
    from tests.precision.test_control_flow import _layernorm_in_a_loop
    from trtbuild.graph.view import GraphView

    source = _layernorm_in_a_loop()  # opset 13: ReduceMean's axes an attribute, in a body
    prepared = prepare(source, Passes(opset=18)).model
    view = GraphView(prepared)
    names = [n.name for n in view.nodes]
    assert all(names) and len(set(names)) == len(names)
    means = [n for n in view.nodes if n.op_type == "ReduceMean"]
    assert means and all(len(n.input) == 2 for n in means)  # axes became an input
    x = {"x": np.random.default_rng(0).normal(size=(1, 8)).astype(np.float32)}
    np.testing.assert_allclose(_run(prepared, x)[0], _run(source, x)[0], rtol=1e-5)


def test_folding_keeps_an_output_declared_again_without_its_shape():
    """An exporter that lists the output in value_info too, as a bare FLOAT (a dynamically
    quantized OCR model's `[1, seqlen]`): onnx-graphsurgeon took that declaration and
    exported the output without a shape, which no inference could give back (a Reshape to
    a shape of unknown length) and onnx.checker refuses; the prepared model keeps the
    output's own declaration and stays valid."""
    from onnx import TensorProto, helper

    from tests.helpers import I64, F, model, node

    m = model(
        [node("Shape", ["x"], "unused", "dead"), node("Reshape", ["x", "to"], "y", "reshape")],
        [("x", F, [1, "n"]), ("to", I64, ["k"])],
        [("y", F, [1, "n"])],
    )
    m.graph.value_info.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    onnx.checker.check_model(m, full_check=True)
    prepared = prepare(m, Passes())
    assert next(r for r in prepared.records if r.name == "fold_constants").changed == 1
    onnx.checker.check_model(prepared.model, full_check=True)
    (y,) = prepared.model.graph.output
    assert [d.dim_value or d.dim_param for d in y.type.tensor_type.shape.dim] == [1, "n"]


def test_an_output_folded_to_a_constant_keeps_the_shape_the_fold_gives():
    """With the input's shape overridden (which clears the outputs' declared shapes), an
    output that folds to a constant has its shape from the fold alone: it stays. A guard
    against putting back the graph's own output declarations after the fold (a version of
    the value_info fix did, and broke this); `_io_declared_once` passes it."""
    from tests.helpers import F, model, node

    m = model(
        [node("Shape", ["x"], "s", "shape"), node("Cast", ["s"], "y", "cast", to=1)],
        [("x", F, [1, "n"])],
        [("y", F, [2])],
    )
    m.graph.output.append(onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None))
    m.graph.node.append(onnx.helper.make_node("Relu", ["x"], ["z"], name="relu"))
    prepared = prepare(m, Passes(override_input_shapes=(("x", (1, 64)),)))
    onnx.checker.check_model(prepared.model, full_check=True)
    y = next(o for o in prepared.model.graph.output if o.name == "y")
    assert [d.dim_value for d in y.type.tensor_type.shape.dim] == [2]
