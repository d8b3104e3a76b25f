"""Reading a model: the inputs a run feeds (a weight listed as a graph input, IR 3, is none
of them), and an IR 3 model whose weights are not inputs."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtbuild.errors import UsageError
from trtbuild.graph.model_io import fed_inputs, infer_shapes, load_model, no_input


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
    assert str(err) == (
        "p.yaml: inputs.image: the model has no input 'image' (name one of the model's inputs: x)"
    )
    near = no_input("inputs.imgae", "imgae", ["image", "mask"], "p.yaml")
    assert "(did you mean 'image'? name one of the model's inputs: image, mask)" in str(near)


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


def _group_norm_model(in_body: bool = False):
    """x -> GroupNormalization-21 -> Sigmoid -> y; with `in_body`, the two nodes inside
    an If's branch (the If on an input). onnx (up to 1.23) infers no GroupNormalization."""
    import onnx

    from tests.helpers import F, node

    dims = [1, 4, 8, 8] if in_body else [1, 4, "h", "w"]
    scale = numpy_helper.from_array(np.ones(4, np.float32), "s")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    nodes = [
        node("GroupNormalization", ["x", "s", "b"], "gn", "gn", num_groups=2, epsilon=1e-3),
        node("Sigmoid", ["gn"], "y", "sig"),
    ]
    inputs = [helper.make_tensor_value_info("x", F, dims)]
    outputs = [helper.make_tensor_value_info("y", F, dims)]
    if in_body:
        branch = helper.make_graph(nodes, "then", [], outputs)
        moved = helper.make_tensor_value_info("y2", F, dims)
        other = helper.make_graph([node("Identity", ["x"], "y2", "id")], "else", [], [moved])
        nodes = [node("If", ["c"], "y", "if", then_branch=branch, else_branch=other)]
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    graph = helper.make_graph(nodes, "g", inputs, outputs, [scale, bias])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(m)
    return m


def test_a_group_norms_output_is_typed_and_the_op_kept():
    """Without a stand-in every tensor after a GroupNormalization had no type: `check`
    took them for non-float, and the mixed model failed onnx.checker (exit 70)."""
    import onnx

    from trtbuild.graph.model_io import infer_shapes

    source = _group_norm_model()
    before = source.SerializeToString()
    inferred = infer_shapes(source)
    types = {vi.name: vi.type.tensor_type for vi in inferred.graph.value_info}
    assert types["gn"].elem_type == TensorProto.FLOAT
    assert [d.dim_value or d.dim_param for d in types["gn"].shape.dim] == [1, 4, "h", "w"]
    assert inferred.graph.node[0] == source.graph.node[0]  # its attributes as they were
    assert source.SerializeToString() == before  # the input is not touched
    onnx.checker.check_model(inferred, full_check=True)


def test_a_group_norm_inside_a_body_computes_in_fp16(tmp_path):
    """The stand-in reaches into bodies: a GroupNormalization in an If's branch was
    `no-float` (its output had no type), left out of the conversion."""
    import onnx

    import trtbuild

    onnx.save(_group_norm_model(in_body=True), tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    nodes = {n.name: n.precision for n in trtbuild.check(policy, quiet=True).nodes}
    assert nodes["if/then_branch/gn"] == "fp16"


def test_a_group_norm_network_converts_to_a_valid_mixed_model(tmp_path):
    """The mixed model of a GroupNorm network failed onnx.checker (exit 70): the tensors
    after the GroupNorm, untyped, were left FP32 beside FP16 ones."""
    import onnx

    import trtbuild
    from tests.helpers import F, model, node

    gn = node("GroupNormalization", ["x", "s", "b"], "g", "gn", num_groups=2)
    nodes = [gn, node("Sigmoid", ["g"], "h", "sig"), node("Add", ["h", "x"], "y", "add")]
    inits = {"s": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}
    m = model(nodes, [("x", F, [1, 4, 8, 8])], [("y", F, [1, 4, 8, 8])], inits, opset=21)
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    mixed = trtbuild.convert(policy, quiet=True)  # validated: onnx.checker's full check
    low = {n.name for n in mixed.graph.node if n.op_type != "Cast"}
    assert {n.name: n.precision for n in trtbuild.check(policy, quiet=True).nodes} == dict.fromkeys(
        low, "fp16"
    )


def test_a_group_norm_models_weights_come_back_whole_and_its_shapes_as_inferred():
    """`_stand_ins` infers a copy whose large weights have no data (a GroupNorm model held
    one whole copy more than any other): the model returned holds every weight as it
    was, and a Conv behind a weight past `SHAPING_MOST` and a Resize whose scales shape
    its output are inferred as they are with the data."""
    import onnx

    from tests.helpers import F, node
    from trtbuild.graph.model_io import SHAPING_MOST, infer_shapes

    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 4, 3, 3)).astype(np.float32)  # 288 elements: kept whole too
    big = rng.normal(size=(64, 8, 3, 3)).astype(np.float32)
    assert w.size <= SHAPING_MOST < big.size
    weights = {"s": np.ones(8, np.float32), "b": np.zeros(8, np.float32), "w": w, "big": big,
               "scales": np.array([1, 1, 2, 2], np.float32)}  # fmt: skip
    nodes = [
        node("Conv", ["x", "w"], "c", "conv", pads=[1, 1, 1, 1]),
        node("GroupNormalization", ["c", "s", "b"], "g", "gn", num_groups=2),
        node("Resize", ["g", "", "scales"], "r", "up", mode="nearest"),
        node("Conv", ["r", "big"], "y", "conv2"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )  # fmt: skip
    source = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    inferred = infer_shapes(source)
    assert list(inferred.graph.initializer) == list(source.graph.initializer)
    assert inferred.graph.node[1] == source.graph.node[1]
    shapes = {
        vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in (*inferred.graph.value_info, *inferred.graph.output)
    }
    assert shapes["g"] == [1, 8, 8, 8] and shapes["r"] == [1, 8, 16, 16]
    assert shapes["y"] == [1, 64, 14, 14]
    onnx.checker.check_model(inferred, full_check=True)


def test_a_model_of_large_weights_is_inferred_as_onnx_infers_it(monkeypatch, nafnet_path):
    """Past `LIGHT_FROM` elements of weights a model is inferred in a copy without its large
    weights' data (a 400 MB weight: 2.0 GB peak and 3.2 s before, 0.83 GB and 1.1 s): the
    types and shapes are onnx's own, bodies included, and the weights come back whole."""
    import onnx

    from tests.helpers import if_model
    from trtbuild.graph import model_io

    monkeypatch.setattr(model_io, "LIGHT_FROM", 0)  # every model takes that path here
    for source in (onnx.load(nafnet_path), if_model(), _reshaped_by_its_shape()):
        del source.graph.value_info[:]
        plain = onnx.shape_inference.infer_shapes(source, strict_mode=False, data_prop=True)
        light = model_io.infer_shapes(source)
        assert light.SerializeToString() == plain.SerializeToString()
        # anew: a value info the model held (here one of nothing) is not inferred with
        source.graph.value_info.append(onnx.helper.make_tensor_value_info("stale", 1, [7]))
        anew = model_io.infer_shapes(source, anew=True)
        assert anew.SerializeToString() == plain.SerializeToString()
        kept = model_io.infer_shapes(source)
        assert "stale" in {v.name for v in kept.graph.value_info}
    # the opset upgrade's: onnx's defaults, as onnx.version_converter infers (no stand-in)
    for source in (
        onnx.load(nafnet_path),
        if_model(),
        _reshaped_by_its_shape(),
        _group_norm_model(),
    ):
        as_converter = model_io.converter_inferred(source)
        plain = onnx.shape_inference.infer_shapes(source)
        assert as_converter.SerializeToString() == plain.SerializeToString()


def test_shapes_inferred_anew_give_none_back_where_inference_fails():
    """Where onnx's inference raises, `anew` gives the model back without the value infos
    it held, as stripping them first did (they would read as inferred)."""
    import numpy as np
    import onnx
    import pytest
    from onnx import TensorProto, helper, numpy_helper

    from trtbuild.graph import model_io

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 2])  # its weight is [3]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.ones(3, np.float32), "x")],
        value_info=[helper.make_tensor_value_info("stale", TensorProto.FLOAT, [7])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.shape_inference.infer_shapes(model, strict_mode=False)
    assert not model_io.infer_shapes(model, anew=True).graph.value_info
    assert [v.name for v in model_io.infer_shapes(model).graph.value_info] == ["stale"]


def _reshaped_by_its_shape():
    """x reshaped by its own Shape: its output's dims are known with data propagation only."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_read_as_bytes_is_checked_as_those_bytes_or_as_parsed(tmp_path):
    """`load_model(raw=)` checks the file's bytes as they are where they are the whole
    binary model, and the parsed model where they are not: the same verdicts as from the
    path, in onnx's text format, with external data, and for an IR 3 model."""
    import onnx
    import pytest

    from trtbuild.graph.model_io import load_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(1, 4096)[:, :4], "w")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    saved = {
        "m.onnxtxt": lambda p: onnx.save(model, p, format="onnxtxt"),
        "m.onnx": lambda p: onnx.save(model, p),
        "ext.onnx": lambda p: onnx.save(
            model, p, save_as_external_data=True, location="ext.data", size_threshold=0
        ),
    }
    for name, save in saved.items():
        save(tmp_path / name)
        loaded = load_model(tmp_path / name, raw=(tmp_path / name).read_bytes())
        assert numpy_helper.to_array(loaded.graph.initializer[0]).tolist() == [[0, 1, 2, 3]]
        assert loaded == load_model(tmp_path / name)  # as from the path
    model.ir_version = 3  # weights not graph inputs: forgiven from the bytes too
    onnx.save(model, tmp_path / "ir3.onnx")
    assert load_model(tmp_path / "ir3.onnx", raw=(tmp_path / "ir3.onnx").read_bytes())
    del model.graph.node[0].input[1:]
    onnx.save(model, tmp_path / "bad.onnx")
    for raw in ((tmp_path / "bad.onnx").read_bytes(), None):
        with pytest.raises(UsageError, match="invalid ONNX model"):
            load_model(tmp_path / "bad.onnx", raw=raw)


def _weighted() -> onnx.ModelProto:
    """A model whose every kind of field is set, with a large weight and a small one."""
    w = numpy_helper.from_array(np.arange(2048, dtype=np.float32).reshape(2, 1024), "w")
    shape = numpy_helper.from_array(np.array([1024, 2], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["w", "shape"], ["r"], name="reshape"),
            helper.make_node("MatMul", ["x", "r"], ["y"], name="mm", doc_string="kept"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        [w, shape],
        doc_string="the graph's",
        value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, [1024, 2])],
    )
    m = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
        producer_name="p",
    )
    helper.set_model_props(m, {"author": "someone"})
    m.graph.sparse_initializer.append(
        helper.make_sparse_tensor(
            numpy_helper.from_array(np.array([1.0], np.float32), "sparse"),
            numpy_helper.from_array(np.array([0], np.int64), "sparse_i"),
            [4],
        )
    )
    m.graph.quantization_annotation.add(tensor_name="r")
    m.training_info.add().algorithm.node.add(op_type="Identity", input=["y"], output=["t"])
    big_shape = numpy_helper.from_array(np.ones(2048, np.int64), "sizes")  # inference reads
    m.graph.initializer.append(big_shape)
    m.functions.append(
        helper.make_function("local", "f", ["a"], ["b"], [], [helper.make_opsetid("", 17)])
    )
    return m


def test_a_model_without_its_weights_data_keeps_every_other_field_and_gets_them_back():
    from trtbuild.graph.model_io import with_weight_data, without_weight_data

    m = _weighted()
    light = without_weight_data(m)
    expected = onnx.ModelProto()
    expected.CopyFrom(m)
    expected.graph.initializer[0].CopyFrom(
        onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 1024])
    )
    assert light == expected  # the small shape tensor and the large integer one kept whole
    assert light.ByteSize() < m.ByteSize() - 8000
    assert with_weight_data(light, m) and light == m
    for change in ("dims", "data", "type"):
        back = without_weight_data(m)
        if change == "dims":
            back.graph.initializer[0].dims[:] = [1024, 2]
        elif change == "data":
            back.graph.initializer[0].raw_data = b"\0" * 8
        else:
            back.graph.initializer[0].data_type = TensorProto.FLOAT16
        assert not with_weight_data(back, m), change
    twice = onnx.ModelProto()
    twice.CopyFrom(m)
    twice.graph.initializer.append(m.graph.initializer[0])  # two weights named alike
    assert not with_weight_data(without_weight_data(twice), twice)


def test_a_model_assembled_from_parts_is_the_one_make_model_makes():
    from trtbuild.graph.model_io import assembled

    m = _weighted()
    g = m.graph
    made = helper.make_model(
        helper.make_graph(g.node, "parts", g.input, g.output, g.initializer),
        opset_imports=m.opset_import,
    )
    made.ir_version = m.ir_version
    together = assembled(m, "parts", g.node, g.input, g.output, g.initializer)
    assert together.SerializeToString() == made.SerializeToString()


def test_large_weights_given_apart_name_files_of_memory_and_everything_else_stays():
    from trtbuild.graph.model_io import MEMORY_FILE, data_apart, model_data_apart

    m = _weighted()
    fp16 = numpy_helper.from_array(np.ones((4, 512), np.float16), "h")
    listed = onnx.TensorProto(name="l", data_type=TensorProto.FLOAT, dims=[2048])
    listed.float_data.extend([1.0] * 2048)  # no raw data: as it is
    tensors = [*m.graph.initializer, fp16, listed]
    kept, files = data_apart(tensors)
    assert [t.name for t in kept] == [t.name for t in tensors]
    assert files == [
        (f"{MEMORY_FILE}0", m.graph.initializer[0].raw_data),
        (f"{MEMORY_FILE}1", fp16.raw_data),
    ]
    for t, (name, data) in zip((kept[0], kept[-2]), files):
        assert t.data_location == TensorProto.EXTERNAL and not t.HasField("raw_data")
        said = {e.key: e.value for e in t.external_data}
        assert said == {"location": name, "offset": "0", "length": str(len(data))}
    assert kept[1:-2] == list(m.graph.initializer[1:]) and kept[-1] == listed  # integers whole
    light, same = model_data_apart(m)
    assert same == files[:1]
    expected = onnx.ModelProto()
    expected.CopyFrom(m)
    expected.graph.initializer[0].CopyFrom(kept[0])
    assert light == expected  # every other field as it is
    bare = onnx.ModelProto()
    bare.CopyFrom(m)
    del bare.graph.initializer[:]
    beside, same = model_data_apart(bare, m.graph.initializer)  # weights given beside it
    assert beside == expected and same == files[:1]
    assert model_data_apart(bare, m.graph.initializer, apart=False) == (m, [])


def test_a_model_past_protobufs_limit_is_saved_with_one_data_file_and_left_as_it_was(
    tmp_path, monkeypatch
):
    """onnx's `save_as_external_data` clears the weights of the model it is given; `build`
    goes on judging the prepared graph it saved."""
    from trtbuild.graph import model_io

    m = _weighted()
    m.graph.initializer[0].doc_string = "a weight's own words"
    before = m.SerializeToString()
    monkeypatch.setattr(model_io, "_serialized", lambda model: None)  # past 2 GiB: not serialized
    model_io.save_model(m, tmp_path / "m.onnx")
    assert m.SerializeToString() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert (tmp_path / "m.onnx.data").stat().st_size == 2048 * 4 + 2048 * 8  # w, sizes
    light = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    assert [t.data_location for t in light.graph.initializer] == [1, 0, 1]  # shape kept inline
    back = onnx.load(tmp_path / "m.onnx")  # its data read back: the model it was
    for t in back.graph.initializer:
        t.ClearField("data_location")  # onnx's loader sets it to DEFAULT
    assert back == m
    # the model's bytes not written (a full disk): the data file is not renamed either
    import contextlib
    import errno
    from pathlib import Path

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    with contextlib.suppress(OSError):
        model_io.save_model(m, tmp_path / "n.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def _garbled(tmp_path, what: bytes) -> str:
    """A model whose text `what` (4 bytes, made for this: a name, the graph's, the producer's)
    holds a byte that is not UTF-8: the same length, so protobuf's lengths still hold; a
    local function calls `Relu`."""
    inner = helper.make_node("Relu", ["fx"], ["fy"], name="fnod")
    function = helper.make_function(
        "ai.local", "Fn", ["fx"], ["fy"], [inner], [helper.make_opsetid("", 13)]
    )
    nodes = [
        helper.make_node("ReduceMean", ["xval"], ["m"], name="node", axes=[1], keepdims=1),
        helper.make_node("Fn", ["m"], ["y"], name="call", domain="ai.local"),
    ]
    graph = helper.make_graph(
        nodes,
        "grph",
        [helper.make_tensor_value_info("xval", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("ai.local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[function])
    model.producer_name = "mine"
    raw = model.SerializeToString()
    assert raw.count(what) >= 1
    path = tmp_path / "m.onnx"
    path.write_bytes(raw.replace(what, what[:1] + b"\x94" + what[2:]))
    return str(path)


@pytest.mark.parametrize("what", [b"node", b"xval", b"axes", b"fnod", b"Redu", b"grph", b"mine"])
def test_a_name_that_is_not_utf8_is_a_damaged_model_not_an_internal_error(tmp_path, what):
    """Found by mutating a model's bytes: protobuf reads such a name as bytes, onnx.checker
    passed a node's, and `check` crashed joining it with text (an attribute's made the
    checker's own message fail to decode, an op type's the walk into bodies)."""
    with pytest.raises(UsageError) as info:
        load_model(_garbled(tmp_path, what))
    garbled = what[:1] + bytes([0x94]) + what[2:]
    said = f"not a readable ONNX model (the text {repr(garbled)[:-1]}"  # b'R\\x94du...: an op's
    assert said in str(info.value) and "the file is damaged" in str(info.value)


@pytest.mark.parametrize(
    ("where", "elem", "said"),
    [
        ("input", 80, "its input 'x' has element type 80, which is no ONNX type"),
        ("input", 0, "its input 'x' declares no element type (UNDEFINED)"),
        ("output", 80, "its output 'y' has element type 80, which is no ONNX type"),
    ],
)
def test_an_input_or_output_of_no_onnx_type_is_a_damaged_model(tmp_path, where, elem, said):
    """onnx.checker passes an element type ONNX does not have; an input's ended `check` as
    an internal error (found by mutating a model's bytes). An output left UNDEFINED is
    read as it was (shape inference types it)."""
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    value = model.graph.input[0] if where == "input" else model.graph.output[0]
    value.type.tensor_type.elem_type = elem
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(UsageError, match=re.escape(f"not a readable ONNX model ({said})")):
        load_model(tmp_path / "m.onnx")
    model.graph.output[0].type.tensor_type.elem_type = 0
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    onnx.save(model, tmp_path / "m.onnx")
    assert load_model(tmp_path / "m.onnx").graph.output[0].name == "y"


def test_a_body_reading_lifted_axes_and_sizes_keeps_the_shapes_they_give():
    """ViTMatte's relative-position resize in an `If` reads axes and sizes that
    `lift_constants` made main-graph weights: onnx's inference of a body sees no outer
    value, lost the length of the `Resize`'s `sizes`, and onnx's full check refused the
    model (exit 70 from check, convert and build)."""
    then = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["n", "axes"], ["u"], name="unsqueeze"),
            helper.make_node("Concat", ["head", "u"], ["sizes"], name="concat", axis=0),
            helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], name="resize"),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["i"], name="same")],
        "else",
        [],
        [helper.make_tensor_value_info("i", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([0], np.int64), "axes"),
            numpy_helper.from_array(np.array([1, 16], np.int64), "head"),
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inferred = infer_shapes(m, anew=True)
    (body,) = [a.g for a in inferred.graph.node[0].attribute if a.name == "then_branch"]
    sizes = {v.name: v for v in body.value_info}["sizes"].type.tensor_type.shape
    assert [d.dim_value for d in sizes.dim] == [3]
    assert not any(v.name.startswith("trtbuild/") for v in body.value_info)
    assert [n.op_type for n in body.node] == ["Unsqueeze", "Concat", "Resize"]  # as it was
    onnx.checker.check_model(inferred, full_check=True)


def test_a_bodys_untyped_inputs_are_typed_where_the_body_reads_outer_shapes():
    """ONNX lets a Scan body declare its inputs untyped (the function-expanded
    LinearAttention does). Where the body reads a small integer weight of the main graph,
    inference runs on a copy and its types are transplanted: the body's inputs were left
    untyped, `convert` took the float state for no float, the FP16 `Add` of it read FP32,
    and the mixed model failed the full check (exit 70)."""
    from tests.helpers import plain_session
    from trtbuild.policy.specs import Precision
    from trtbuild.precision.assign import assign
    from trtbuild.precision.convert import convert

    F = TensorProto.FLOAT
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["xt", "two"], ["m"], name="m"),
            helper.make_node("Add", ["st", "m"], ["sum"], name="add"),
            helper.make_node("Reshape", ["sum", "shape"], ["st_out"], name="reshape"),
        ],
        "body",
        [onnx.ValueInfoProto(name="st"), onnx.ValueInfoProto(name="xt")],  # no type at all
        [helper.make_tensor_value_info("st_out", F, [4])],
    )
    scan = helper.make_node("Scan", ["s0", "x"], ["s"], "scan", body=body, num_scan_inputs=1)
    graph = helper.make_graph(
        [scan],
        "g",
        [helper.make_tensor_value_info(n, F, d) for n, d in (("s0", [4]), ("x", [3, 4]))],
        [helper.make_tensor_value_info("s", F, [4])],
        [
            numpy_helper.from_array(np.float32(2), "two"),
            numpy_helper.from_array(np.array([4], np.int64), "shape"),  # read inside the body
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    typed = infer_shapes(m, anew=True)
    body_inputs = typed.graph.node[0].attribute[0].g.input
    assert [i.type.tensor_type.elem_type for i in body_inputs] == [F, F]
    converted = convert(assign(typed, Precision()))
    onnx.checker.check_model(converted.model, full_check=True)
    feed = {"s0": np.ones(4, np.float32), "x": np.arange(12, dtype=np.float32).reshape(3, 4)}
    (want,) = plain_session(m).run(None, feed)
    (got,) = plain_session(converted.model).run(None, feed)
    np.testing.assert_array_equal(got, want)  # small whole numbers: exact in FP16
