"""The opset upgrade: the number raised where onnx's converter would change nothing else,
the converter on the whole model where it might; the prepared graph the same either way."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import make_models
from tests.helpers import scan8_sum
from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.model_io import opset_of
from trtbuild.passes import opset
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes

TOP = onnx.defs.onnx_opset_version()
# real models: a CNN exported at opset 17, a recurrent model with If bodies
REAL = ("yolov8n", "silero_vad")


def _normal(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without what shape inference writes: value infos, and the names it gives
    unknown dims (numbered in the order it meets them)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for _, graph in subgraphs.walk(out.graph):
        del graph.value_info[:]
        for value in (*graph.input, *graph.output):
            for dim in value.type.tensor_type.shape.dim:
                if re.fullmatch(r"unk__\d+", dim.dim_param):
                    dim.dim_param = "unk"
    return out


def _prepared_both_ways(model: onnx.ModelProto, target: int, monkeypatch) -> tuple:
    fast = prepare(model, Passes(opset=target)).model
    with monkeypatch.context() as patch:  # trtbuild's own shortcut off: the converter's way
        patch.setattr(opset, "raised", lambda *_: None)
        whole = prepare(model, Passes(opset=target)).model
    return fast, whole


def _probe(model: onnx.ModelProto, current: int, target: int) -> onnx.ModelProto | None:
    """`raised`'s probe of a model that declares its values' types."""
    nodes = opset._changing(model, current, target)
    types = opset._declared(model, {t for n in nodes for t in (*n.input, *n.output) if t})
    return opset._probe(nodes, types, len(model.graph.node), current, model.ir_version)


def _models(models_dir: Path, real_model) -> list[tuple[str, onnx.ModelProto]]:
    names = [(n, models_dir / f"{n}.onnx") for n in make_models.MODELS]
    names += [(n, real_model(n)) for n in REAL]
    return [(n, onnx.load(p)) for n, p in names]


def test_the_prepared_graph_is_the_converters(models_dir, real_model, monkeypatch):
    """At each later opset where the shortcut is taken, the prepared graph is the one the
    converter's way prepares, but for the names shape inference gives (the shortcut is
    taken on most of them: a broken shortcut cannot pass as "never taken")."""
    taken = []
    for name, model in _models(models_dir, real_model):
        current = opset_of(model)
        for target in sorted({t for t in (17, 19, 21, TOP) if t > current}):
            if opset.raised(model, current, target) is None:
                continue
            taken.append((name, target))
            fast, whole = _prepared_both_ways(model, target, monkeypatch)
            assert _normal(fast) == _normal(whole), (name, target)
    assert {"transformer_tiny", "keras_bert", "gru_enhancer", "yolov8n"} <= {n for n, _ in taken}
    assert len(taken) >= 20, taken
    assert not {"loop_sum", "silero_vad"} & {n for n, _ in taken}  # control flow: converter


def _model(node: onnx.NodeProto, opset_version: int, shaped: bool = True) -> onnx.ModelProto:
    rank = [2, 3, 4] if shaped else None
    inputs = [helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, rank)]
    weights = [helper.make_tensor(t, TensorProto.INT64, [2], [3, 2]) for t in node.input[1:]]
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
    )
    graph.initializer.extend(weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset_version)])


def test_a_node_the_converter_rewrites_takes_the_converter():
    """Softmax below 13 on a middle axis becomes Flatten, Softmax, Reshape: the whole
    model goes through the converter, whose new nodes are named after the Softmax."""
    model = _model(helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1), 11)
    assert opset.raised(model, 11, 17) is None
    upgraded, record = opset.upgrade_opset(model, 17)
    assert [n.op_type for n in upgraded.graph.node] == ["Shape", "Flatten", "Softmax", "Reshape"]
    assert {a["from"] for a in record.details["added"]} == {"sm"}


def test_a_compatible_step_raises_the_number_alone():
    """Reshape 13 to 14 adds `allowzero` (its default is 13's behaviour): the converter
    leaves the node as it was, so the model gets the new number and the shapes the
    converter's inference writes (a copy: the caller's model is not changed), and keeps
    what the converter's round trip drops (a node's metadata, as an exporter writes it)."""
    model = _model(helper.make_node("Reshape", ["x", "shape"], ["y"], name="r"), 13)
    model.graph.node[0].metadata_props.add(key="pkg.torch.onnx.stack_trace", value="x.py:1")
    before = model.SerializeToString()
    upgraded, record = opset.upgrade_opset(model, 17)
    assert model.SerializeToString() == before
    assert opset_of(upgraded) == 17 and upgraded.graph.node == model.graph.node
    assert upgraded.graph.initializer == model.graph.initializer
    converted = onnx.version_converter.convert_version(model, 17)
    assert upgraded.graph.output == converted.graph.output  # typed by the same inference
    assert record.changed == 1 and record.details == {"from": 13, "to": 17}
    assert opset.raised(model, 13, 17) is not None


def test_a_model_importing_the_default_domain_twice_or_not_at_all_goes_whole():
    """Both "" and "ai.onnx" imported, in either order, or no default domain at all: the
    converter's to raise (the first) or refuse (exit 2), as before the shortcut."""
    model = _model(helper.make_node("Relu", ["x"], ["y"], name="r"), 13)
    model.opset_import.append(helper.make_opsetid("ai.onnx", 13))
    assert opset.raised(model, 13, 17) is None
    upgraded, _ = opset.upgrade_opset(model, 17)
    assert [(o.domain, o.version) for o in upgraded.opset_import] == [("", 17), ("ai.onnx", 13)]
    custom = _model(helper.make_node("Fused", ["x"], ["y"], name="f", domain="com.example"), 13)
    custom.opset_import[0].domain = "com.example"
    assert opset.raised(custom, 1, 17) is None
    with pytest.raises(UsageError, match="version_converter cannot take"):
        opset.upgrade_opset(custom, 17)


def test_local_functions_go_whole():
    """A function's nodes are at the function's own opset imports: not the shortcut's."""
    model = _model(helper.make_node("Relu", ["x"], ["y"], name="r"), 13)
    assert opset.raised(model, 13, 17) is not None
    model.functions.append(
        helper.make_function(
            "local",
            "Twice",
            ["a"],
            ["b"],
            [helper.make_node("Add", ["a", "a"], ["b"])],
            [helper.make_opsetid("", 13)],
        )
    )
    assert opset.raised(model, 13, 17) is None


def test_nodes_alike_but_for_their_types_are_probed_apart():
    """ReduceLogSum 27 to 28 refuses an integer input: a float node and an INT32 one are
    two probes, and the converter's refusal sends the model whole (and exit 2), where one
    probe for both would have raised the number."""
    if TOP < 28:
        pytest.skip(f"onnx {onnx.__version__} has no opset 28")
    reduce = [
        helper.make_node("ReduceLogSum", [x], [y], name=y, keepdims=1)
        for x, y in (("x", "a"), ("i", "b"))
    ]
    tail = [helper.make_node("Abs", [x], [y], name=y) for x, y in (("a", "a1"), ("b", "b1"))]
    tail.append(helper.make_node("Abs", ["a1"], ["a2"], name="a2"))  # not probed: 28 kept it
    inputs = [helper.make_tensor_value_info(n, t, [2, 3]) for n, t in (("x", 1), ("i", 6))]
    outputs = [helper.make_tensor_value_info(n, t, [1, 1]) for n, t in (("a2", 1), ("b1", 6))]
    graph = helper.make_graph(reduce + tail, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    assert len(_probe(model, 27, 28).graph.node) == 2
    assert opset.raised(model, 27, 28) is None
    with pytest.raises(UsageError, match="version_converter cannot take"):
        opset.upgrade_opset(model, 28)


def test_a_value_typed_by_inference_alone_is_probed_in_that_type():
    """An INT32 ReduceLogSum fed by a Cast the model does not declare: probed untyped, the
    converter took it 27 to 28 and the number was raised, where the converter refuses the
    whole model (28 does not take INT32)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], name="cast", to=TensorProto.INT32),
        helper.make_node("ReduceLogSum", ["c"], ["r"], name="r", keepdims=1),
        helper.make_node("Cast", ["r"], ["y"], name="back", to=TensorProto.FLOAT),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 27)]
    )
    if TOP < 28:
        pytest.skip("this onnx has no opset 28")
    assert opset.raised(model, 27, 28) is None
    with pytest.raises(UsageError, match="version_converter cannot take"):
        opset.upgrade_opset(model, 28)


def test_a_value_the_model_does_not_type_is_probed_as_the_converter_infers_it(monkeypatch):
    """The converter infers shapes before its adapters read them: a value the model does
    not declare (a TorchScript export declares none inside its graph) is probed with the
    type inference finds, a rank it does not find left out as the adapters see it; where
    inference fails, the converter decides."""
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")
    rankless = _model(node, 13, shaped=False)
    upgraded = opset.raised(rankless, 13, 17)
    assert upgraded is not None and opset_of(upgraded) == 17
    assert _normal(upgraded) == _normal(onnx.version_converter.convert_version(rankless, 17))
    made = _model(helper.make_node("Reshape", ["x2", "shape"], ["y"], name="r"), 13)
    made.graph.node.insert(0, helper.make_node("Relu", ["x"], ["x2"], name="relu"))
    made.graph.input[0].name = "x"  # x2: a value with no value info at all
    assert not any(v.name == "x2" for v in made.graph.value_info)
    upgraded = opset.raised(made, 13, 17)
    assert upgraded is not None and opset_of(upgraded) == 17
    assert [v.name for v in upgraded.graph.value_info] == ["x2"]  # the converter's inference
    fast, whole = _prepared_both_ways(made, 17, monkeypatch)
    assert _normal(fast) == _normal(whole)
    with monkeypatch.context() as patch:  # inference fails: the converter says why
        patch.setattr(opset, "converter_inferred", _raises)
        assert opset.raised(made, 13, 17) is None


def _raises(*_):
    raise onnx.shape_inference.InferenceError("[ShapeInferenceError] refused")


def _converter_registry() -> list[tuple[str, int, int, str]]:
    """(op, from, to, adapter class) of each upward step onnx's converter registers, read
    from its header where the wheel ships it."""
    header = Path(onnx.__file__).parent / "version_converter" / "convert.h"
    if not header.is_file():
        pytest.skip(f"{header} is not in this onnx wheel")
    steps = []
    for call in re.findall(r"registerAdapter\((.*?)\);", header.read_text(), re.S):
        call = " ".join(call.split())
        kind = re.search(r"make_unique<(\w+)>", call)
        found = re.search(r'"(\w+)",\s*(?:OpSetID\()?(\d+)\)?,\s*(?:OpSetID\()?(\d+)', call)
        if found is None and kind is not None:  # a class of one step: Split_12_13
            found = re.fullmatch(r"(\w+?)_(\d+)_(\d+)", kind[1])
        if found is not None and int(found[3]) > int(found[2]):
            steps.append((found[1], int(found[2]), int(found[3]), kind[1] if kind else "lambda"))
    return steps


def test_every_step_called_widened_only_is_one_the_converter_calls_compatible():
    """`_types_widened_only` is read from the schemas; onnx's converter decides by its own
    registry. Every upward step the schemas call a widening only must be one the registry
    adapts by `CompatibleAdapter` (the version's number, nothing else)."""
    steps = _converter_registry()
    assert len(steps) > 300, "the registry was not read"
    widened = [s for s in steps if opset._types_widened_only(s[0], s[1], s[2])]
    assert widened and all(kind == "CompatibleAdapter" for *_, kind in widened), [
        s for s in widened if s[3] != "CompatibleAdapter"
    ]
    # and each step of a schema's history it calls a widening is one the converter has
    # (an op's step without an adapter makes the converter refuse the model)
    registered = {(op, to): kind for op, _, to, kind in steps}
    history: dict[str, set[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            history.setdefault(schema.name, set()).add(schema.since_version)
    for op, versions in history.items():
        for old, new in itertools.pairwise(sorted(versions)):
            if opset._types_widened_only(op, old, new):
                assert registered.get((op, new)) == "CompatibleAdapter", (op, new)
    # and the rule is not "everything": steps the converter rewrites are not widenings
    assert not opset._types_widened_only("Softmax", 12, 13)
    assert not opset._types_widened_only("ReduceMean", 17, 18)


def test_a_model_without_value_infos_folds_as_after_the_converter(monkeypatch):
    """The converter infers shapes first, and onnx-graphsurgeon folds a `Shape` by them: a
    TorchScript export declares no intermediate shape, and the shortcut's model without
    them kept `Shape` -> `Reshape` where the converter's folded it (6 to 78 more nodes in
    torchvision and transformers exports)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    assert opset.raised(model, 16, 17) is not None
    fast, whole = _prepared_both_ways(model, 17, monkeypatch)
    assert [n.op_type for n in fast.graph.node] == ["Relu", "Reshape"]
    assert _normal(fast) == _normal(whole)


def test_a_probed_nodes_metadata_is_no_change_and_many_distinct_nodes_go_whole():
    """The converter drops a node's metadata (torch's dynamo exporter writes it on every
    node): AveragePool 18 to 19 (19 adds `dilations`) is probed, and its metadata is not
    a change. Where most nodes would be probed, the converter's own pass is the quicker."""
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[1, 1])
    node.metadata_props.add(key="pkg.torch.onnx.stack_trace", value="x.py:1")
    node.attribute[0].doc_string = "window"
    model = _model(node, 18)
    upgraded = opset.raised(model, 18, 19)
    assert upgraded is not None and upgraded.graph.node == model.graph.node
    second = helper.make_node("AveragePool", ["y"], ["z"], name="pool2", kernel_shape=[1, 2])
    model.graph.node.append(second)
    model.graph.output[0].name = "z"
    model.graph.value_info.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]))
    assert _probe(model, 18, 19) is None
    del model.graph.node[1:]  # the one probed node: the shortcut again
    assert _probe(model, 18, 19) is not None


def test_the_converter_runs_without_the_large_weights_and_gives_the_same_model(
    models_dir, real_model, monkeypatch
):
    """Where the whole model goes through the converter, it is given the model without its
    large weights' data (a 345 MB ViT: 2.9 s and a 2.7 GB peak before) and the weights
    are put back: the same model as the converter's on the model as it is."""
    convert, given = onnx.version_converter.convert_version, []

    def counted(model, target):
        given.append(model.ByteSize())
        return convert(model, target)

    compared = []
    for name, model in _models(models_dir, real_model):
        current = opset_of(model)
        for target in sorted({t for t in (17, 19, 21, TOP) if t > current}):
            if opset.raised(model, current, target) is not None:
                continue
            whole = convert(model, target)
            with monkeypatch.context() as patch:
                patch.setattr(onnx.version_converter, "convert_version", counted)
                given.clear()
                assert opset._converted(model, current, target) == whole, (name, target)
            compared.append((name, model.ByteSize() - given[0]))
    assert len(compared) >= 10 and any(spared for _, spared in compared), compared
    heavy = _model(helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1), 11)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], [0.5] * 4096)
    heavy.graph.initializer.append(weight)
    heavy.graph.node.append(helper.make_node("Add", ["y", "w"], ["z"], name="add"))
    heavy.graph.output[0].name = "z"
    with monkeypatch.context() as patch:
        patch.setattr(onnx.version_converter, "convert_version", counted)
        given.clear()
        assert opset._converted(heavy, 11, 17) == convert(heavy, 11 + 6)
    assert len(given) == 1 and heavy.ByteSize() - given[0] >= 4096 * 4  # once, no weight data

    def changing(model, target):  # a converter that changed the weight: the model as it is
        given.append(model.ByteSize())
        out = convert(model, target)
        if len(given) == 1:
            out.graph.initializer[0].data_type = TensorProto.FLOAT16
        return out

    with monkeypatch.context() as patch:
        patch.setattr(onnx.version_converter, "convert_version", changing)
        given.clear()
        assert opset._converted(heavy, 11, 17) == convert(heavy, 17)
    assert given[1] == heavy.ByteSize()


def test_an_upgrade_that_changes_the_models_inputs_or_outputs_is_refused():
    """onnx.version_converter's Scan 8 to 9 adapter drops Scan-8's batch axis from the
    graph's inputs and outputs (ONNX's scan_sum node test): the prepared model refused the
    feeds the model takes, and computed another function."""
    model = scan8_sum()
    onnx.checker.check_model(model, full_check=True)
    with pytest.raises(UsageError, match=r"changes the model's input 'initial' from opset 8"):
        prepare(model, Passes(opset=17))
    assert opset_of(prepare(model, Passes()).model) == 8  # not upgraded: as it is
