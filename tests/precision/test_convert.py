from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.helpers import I64, F, H, dtypes, model, node
from trtbuild.policy.specs import Match, Precision, Rule
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert


def _pin(*names: str) -> Precision:
    return Precision(
        rules=tuple(Rule(f"r{i}", Match(name=f"^{n}$"), "fp32") for i, n in enumerate(names))
    )


def _tail_model():
    # x -> Mul(w) -> ReduceSum (pinned) -> Reshape -> y ; also a shape path in int64
    return model(
        [
            node("Mul", ["x", "w"], "a", "mul"),
            node("ReduceSum", ["a"], "s", "sum", keepdims=1),
            node("Shape", ["s"], "shp", "shape"),
            node("Reshape", ["s", "shp"], "y", "reshape"),
        ],
        [("x", F, [2, 8])],
        [("y", F, [1, 1])],
        {"w": np.full((2, 8), 3.0, np.float32)},
    )


def test_pinned_result_reaches_graph_output_in_fp32():
    converted = convert(assign(_tail_model(), _pin("sum")))
    onnx.checker.check_model(converted.model, full_check=True)
    types = dtypes(converted.model)
    assert types["a"] == H  # the default region is FP16
    assert types["s"] == F and types["y"] == F  # pinned, and the reshape follows it
    casts = [n for n in converted.model.graph.node if n.op_type == "Cast"]
    assert [c.attribute[0].i for c in casts] == [H, F]  # in to FP16, FP16 -> FP32 before the sum
    assert types["shp"] == I64  # shape tensors never change type


def test_io_dtypes_kept_and_fp16_output_cast_back():
    converted = convert(assign(_tail_model(), Precision()))
    out = converted.model.graph.output[0]
    assert out.name == "y" and out.type.tensor_type.elem_type == F
    assert converted.model.graph.input[0].type.tensor_type.elem_type == F
    x = np.ones((2, 8), np.float32)
    (y,) = ort.InferenceSession(converted.model.SerializeToString()).run(None, {"x": x})
    assert y.dtype == np.float32 and y.item() == 48.0

    # every value the mixed model makes is declared, the FP16 result behind the cast too:
    # nothing is left for a reader (the neighbourhood check, TensorRT) to infer
    m = converted.model
    declared = {v.name: v.type.tensor_type for v in (*m.graph.value_info, *m.graph.output)}
    made = [o for n in m.graph.node for o in n.output]
    assert all(o in declared for o in made), [o for o in made if o not in declared]
    assert declared["y__fp16"].elem_type == H and len(declared["y__fp16"].shape.dim) == 2


def test_consecutive_pinned_nodes_share_one_region_and_casts_are_shared():
    m = model(
        [
            node("Mul", ["x", "x"], "sq", "sq"),
            node("ReduceMean", ["sq"], "m", "mean", axes=[1], keepdims=1),
            node("Sqrt", ["m"], "r", "sqrt"),
            node("Add", ["x", "r"], "y1", "add1"),
            node("Sub", ["x", "r"], "y2", "sub1"),
        ],
        [("x", F, [2, 8])],
        [("y1", F, [2, 8]), ("y2", F, [2, 8])],
    )
    converted = convert(assign(m, _pin("sq", "mean", "sqrt")))
    types = dtypes(converted.model)
    assert types["sq"] == F and types["m"] == F and types["r"] == F
    casts = [
        (n.input[0], n.attribute[0].i) for n in converted.model.graph.node if n.op_type == "Cast"
    ]
    assert len(casts) == len(set(casts)), "a (tensor, type) pair is cast once"
    assert Counter(casts)[("r", H)] == 1  # shared by add1 and sub1


def test_weight_shared_by_fp16_and_fp32_consumers_gets_two_copies_never_clamped():
    big = np.array([1.0, 70000.0], np.float32)
    m = model(
        [
            node("Mul", ["x", "w"], "a", "m16"),
            node("Mul", ["x", "w"], "b", "m32"),
            node("Add", ["a", "b"], "y", "add"),
        ],
        [("x", F, [2])],
        [("y", F, [2])],
        {"w": big},
    )
    converted = convert(assign(m, replace(_pin("m32"), guards=())))  # no guard: see the inf
    inits = {t.name: t for t in converted.model.graph.initializer}
    assert inits["w"].data_type == F and inits["w__fp16"].data_type == H
    assert np.isinf(onnx.numpy_helper.to_array(inits["w__fp16"])[1])  # not silently clamped to 1e4
    assert any("weight w reaches 7e+04" in w for w in converted.warnings)


def test_rule_that_matches_nothing_warns():
    a = assign(_tail_model(), Precision(rules=(Rule("ghost", Match(name="nope"), "fp32"),)))
    assert a.warnings == ["rule 'ghost' matches no node"]  # a guard finding nothing is silent
    assert a.rule_hits == {
        "ghost": 0,
        "guard:weight-range": 0,
        "guard:periodic-range": 0,
        "guard:shape-arithmetic": 0,
    }


def test_decisions_say_why(nafnet_path):
    from trtbuild.passes.prepare import prepare
    from trtbuild.policy.specs import Passes

    prepared = prepare(onnx.load(nafnet_path), Passes(opset=17)).model
    a = assign(prepared, _pin("/head/ReduceSum"))
    by_name = {n.name: d for n, d in zip(a.view.nodes, a.decisions)}
    assert by_name["/head/ReduceSum"].rule == "r0"
    assert by_name["/out/total"].rule == "follows-input"
    assert by_name["/out/total"].precision == "fp32"
    assert by_name["/intro/Conv"].rule == "default"


def test_weights_converted_in_batches_are_each_rounded_and_warned_of_in_order(monkeypatch):
    """Small FP32 weights are converted to FP16 together (`_Halves`), a chunk at a time;
    each must come out as its own conversion would: its bytes, its dims, its name, and
    a warning for each one beyond FP16, in the graph's order, whichever path it took."""
    from trtbuild.precision import convert as module

    monkeypatch.setattr(module._Halves, "CHUNK", 64)  # a chunk is 16 values: many flushes
    rng = np.random.default_rng(0)
    weights = {
        "w0": np.array([7e4, 1.0], np.float32),  # beyond FP16, batched: pending until w3
        "w1": rng.standard_normal(20_000).astype(np.float32) * 1e5,  # large: the general path
        "w2": np.zeros((0, 4), np.float32),  # empty: the general path
        "w3": rng.standard_normal((3, 5)).astype(np.float32),  # fills the chunk: a flush
        "w4": rng.standard_normal((2, 2, 3)).astype(np.float32),
        "w5": np.array([-9e4], np.float32),  # beyond FP16 again, the last batch
    }
    shapes = {k: list(v.shape) for k, v in weights.items()}
    m = model(
        [node("Mul", [f"x{k}", k], f"y{k}", f"mul{k}") for k in weights],
        [(f"x{k}", F, s) for k, s in shapes.items()],
        [(f"y{k}", F, s) for k, s in shapes.items()],
        weights,
    )
    converted = convert(assign(m, Precision(guards=())))
    inits = {t.name: t for t in converted.model.graph.initializer}
    for k, w in weights.items():
        assert inits[k].data_type == H and list(inits[k].dims) == list(w.shape)
        with np.errstate(over="ignore"):
            expected = w.astype(np.float16)
        assert np.array_equal(onnx.numpy_helper.to_array(inits[k]), expected)
    beyond = [w.split()[1] for w in converted.warnings if "beyond FP16" in w]
    assert beyond == ["w0", "w1", "w5"]  # w0 said first, though converted after w1


def test_a_constant_of_shape_filled_beyond_fp16_is_warned_of():
    """Hugging Face's `torch.full(shape, finfo.min)` under a dynamic shape is a
    ConstantOfShape no fold makes a weight: made FP16, its fill became -inf unsaid (a
    weight of that value is warned of). A fill FP16 holds, or one already inf, is not."""
    fills = {"big": -3.4e38, "held": -6e4, "inf": -np.inf}
    m = model(
        [node("Shape", ["x"], "s", "shape")]
        + [
            node(
                "ConstantOfShape",
                ["s"],
                f"c{k}",
                k,
                value=onnx.numpy_helper.from_array(np.array([v], np.float32)),
            )
            for k, v in fills.items()
        ]
        + [node("Max", ["x", f"c{k}"], f"y{k}", f"max{k}") for k in fills],
        [("x", F, ["n", 4])],
        [(f"y{k}", F, ["n", 4]) for k in fills],
    )
    converted = convert(assign(m, Precision(guards=())))
    said = [w for w in converted.warnings if "ConstantOfShape" in w]
    assert len(said) == 1 and said[0].startswith("ConstantOfShape big fills -3.4e+38"), said


def test_what_goes_in_or_out_of_a_sequence_stays_fp32():
    """A tensor computed in FP16 put in a sequence, and one taken out and computed on: a
    sequence's element type is declared once, so the sequence ops stay FP32 and the FP16
    value is cast to FP32 on its way in (the mixed model failed onnx.checker: "Inferred
    elem type differs", exit 70 from `build`). They count as no compute in the share."""
    m = model(
        [
            node("Relu", ["x"], "r", "relu"),
            node("SequenceConstruct", ["r", "x"], "seq", "pack"),
            node("SequenceAt", ["seq", "zero"], "first", "take"),
            node("ConcatFromSequence", ["seq"], "both", "join", axis=0),
            node("Mul", ["first", "two"], "y", "double"),
            node("Neg", ["both"], "z", "negate"),
        ],
        [("x", F, [1, 4])],
        [("y", F, [1, 4]), ("z", F, [2, 4])],
        {"zero": np.array(0, np.int64), "two": np.array(2.0, np.float32)},
    )
    assignment = assign(m, Precision())
    nodes = assignment.view.nodes
    said = {n.name: (d.precision, d.rule) for n, d in zip(nodes, assignment.decisions)}
    assert said["relu"] == said["double"] == said["negate"] == ("fp16", "default")
    assert said["pack"] == said["take"] == said["join"] == ("fp32", "sequence")
    converted = convert(assignment)
    onnx.checker.check_model(converted.model, full_check=True)
    types = dtypes(converted.model)
    assert types["r"] == H and types["first"] == types["both"] == F
    assert assignment.summary().low_share == 1.0  # relu, double, negate: every compute node
    x = np.array([[-1.0, 0.5, 2.0, -3.0]], np.float32)
    session = ort.InferenceSession(converted.model.SerializeToString())
    y, z = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, 2 * np.maximum(x, 0))
    np.testing.assert_array_equal(z, -np.concatenate([np.maximum(x, 0), x]))


def test_a_sequence_maps_body_stays_fp32_and_its_reference_runs(tmp_path, capsys):
    """A SequenceMap's body computes on the sequence's elements: its nodes, and those of an
    If inside it, stay FP32 with it (an FP16 Relu there made the mixed model invalid), and
    the FP32 reference, which measures the peaks inside If, Loop and Scan bodies, leaves
    its body alone (it took it for a Scan: StopIteration, exit 70 from `check`), so no
    warning says the body's tensors are measured by their peaks."""
    from tests.helpers import bare_policy
    from trtbuild.cli import main

    def branch(op: str, name: str) -> onnx.GraphProto:
        out = onnx.helper.make_tensor_value_info(f"{name}_out", F, [4])
        return onnx.helper.make_graph([node(op, ["e"], f"{name}_out", name)], name, [], [out])

    body = onnx.helper.make_graph(
        [
            node("ReduceSum", ["e"], "total", "total", keepdims=0),
            node("Greater", ["total", "zero"], "up", "positive"),
            node("If", ["up"], "o", "choose", then_branch=branch("Relu", "inner_relu"),
                 else_branch=branch("Neg", "inner_neg")),
        ],
        "b",
        [onnx.helper.make_tensor_value_info("e", F, [4])],
        [onnx.helper.make_tensor_value_info("o", F, [4])],
    )  # fmt: skip
    m = model(
        [
            node("Relu", ["x"], "r", "relu"),
            node("SplitToSequence", ["r"], "s", "split", axis=0, keepdims=0),
            node("SequenceMap", ["s"], "s2", "map", body=body),
            node("ConcatFromSequence", ["s2"], "c", "join", axis=0),
            node("Mul", ["c", "two"], "y", "double"),
        ],
        [("x", F, [2, 4])],
        [("y", F, [8])],
        {"two": np.float32(2), "zero": np.float32(0)},
        opset=18,
    )
    assignment = assign(m, Precision())
    nodes = assignment.view.nodes
    said = {n.name: (d.precision, d.rule) for n, d in zip(nodes, assignment.decisions)}
    assert said["inner_relu"] == said["inner_neg"] == said["total"] == ("fp32", "sequence")
    assert said["map"] == ("fp32", "sequence")
    assert said["relu"] == said["double"] == ("fp16", "default")
    converted = convert(assignment)
    onnx.checker.check_model(converted.model, full_check=True)
    x = np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], np.float32)
    (y,) = ort.InferenceSession(converted.model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, 2 * np.maximum(x, 0).reshape(-1))
    assert main(["check", "--policy", str(bare_policy(tmp_path, m))]) == 0
    assert "inside the control flow" not in capsys.readouterr().err


def test_an_op_whose_attribute_names_its_float_type_computes_in_fp16(tmp_path):
    """An EyeLike (`dtype` FLOAT) made FP16 kept its `dtype`: onnx.checker refused the mixed
    model ("Inferred elem type differs"), exit 70 from `convert` and `build`. The attribute
    now names the type the node computes in, and ONNX Runtime runs the model."""
    from tests.helpers import bare_policy
    from trtbuild.cli import main

    m = model(
        [node("EyeLike", ["x"], "e", "eye", dtype=F), node("Mul", ["x", "e"], "y", "mask")],
        [("x", F, [4, 4])],
        [("y", F, [4, 4])],
    )
    out = tmp_path / "mixed.onnx"
    assert main(["convert", "--policy", str(bare_policy(tmp_path, m)), "-o", str(out)]) == 0
    mixed = onnx.load(out)
    (eye,) = [n for n in mixed.graph.node if n.op_type == "EyeLike"]
    assert eye.attribute[0].i == onnx.TensorProto.FLOAT16
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    (y,) = ort.InferenceSession(str(out)).run(None, {"x": x})
    assert np.array_equal(y, np.diag(np.diag(x)))


def _converted_once_before() -> onnx.ModelProto:
    """A model trtbuild converted once and `prepare` made compute in FP32 again: it holds the
    names the conversion makes (`x__fp16`, `y__fp16`, `trtbuild/cast_fp32/y`)."""
    return model(
        [
            node("Cast", ["x"], "x__fp16", "trtbuild/cast_fp16/x", to=F),
            node("Mul", ["x__fp16", "w"], "y__fp16", "mul"),
            node("Cast", ["y__fp16"], "y", "trtbuild/cast_fp32/y", to=F),
        ],
        [("x", F, [2, 8])],
        [("y", F, [2, 8])],
        {"w": np.full((2, 8), 3.0, np.float32)},
    )


def test_names_the_conversion_makes_are_new_where_the_model_holds_them_already():
    # Before, the second conversion wrote a second `y__fp16` (onnx.checker: not single
    # assignment) and a second node `trtbuild/cast_fp32/y` (ONNX Runtime refuses): exit 70.
    m = convert(assign(_converted_once_before(), Precision())).model
    onnx.checker.check_model(m, full_check=True)
    made = [o for n in m.graph.node for o in n.output]
    names = [n.name for n in m.graph.node]
    assert len(made) == len(set(made)) and len(names) == len(set(names)), (made, names)
    assert dtypes(m)["y__fp16"] == H  # the source's own value, now computed in FP16
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    for level in (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    ):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(
            m.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        (y,) = session.run(None, {"x": x})
        assert y.dtype == np.float32 and np.array_equal(y, x * 3)


def _shared_weight_model() -> onnx.ModelProto:
    return model(
        [node("Mul", ["x", "w"], "a", "m16"), node("Mul", ["x", "w"], "b", "m32"),
         node("Add", ["a", "b"], "y", "add")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"w": np.full((1, 4), 3.0, np.float32)},
    )  # fmt: skip


def _unique_names(m: onnx.ModelProto) -> None:
    """Every value is made once and every node named once, bodies included."""
    from trtbuild.graph import subgraphs

    made, names = [], []
    for _, g in subgraphs.walk(m.graph):
        made += [o for n in g.node for o in n.output if o] + [t.name for t in g.initializer]
        names += [n.name for n in g.node]
    twice = {k for k in made if made.count(k) > 1} | {k for k in names if names.count(k) > 1}
    assert not twice, twice


@pytest.mark.parametrize("case", ["tail", "shared", "if"])
def test_converting_again_what_trtbuild_converted_makes_only_new_names(case):
    """A mixed model prepared back to FP32 holds every name the conversion makes (casts
    into and out of a pinned region, a weight's FP16 copy, the casts of a body's outer
    reads): converting it again under the same policy made them a second time (exit 70)."""
    from tests.helpers import if_model
    from trtbuild.passes.prepare import prepare
    from trtbuild.policy.specs import Passes

    source, precision = {
        "tail": (_tail_model(), _pin("sum")),
        "shared": (_shared_weight_model(), _pin("m32")),
        "if": (if_model(), _pin("then_relu")),
    }[case]
    once = convert(assign(prepare(source, Passes(fold_constants=False)).model, precision)).model
    back = prepare(once, Passes(fold_constants=False)).model  # computes in FP32 again
    twice = convert(assign(back, precision)).model
    onnx.checker.check_model(twice, full_check=True)
    _unique_names(twice)
    shapes = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in source.graph.input
    }
    feed = {
        k: np.linspace(-1, 1, int(np.prod(d)), dtype=np.float32).reshape(d)
        for k, d in shapes.items()
    }
    want = ort.InferenceSession(once.SerializeToString()).run(None, feed)
    for level in (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    ):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        got = ort.InferenceSession(twice.SerializeToString(), options).run(None, feed)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_weights_copy_and_an_inputs_cast_get_names_the_model_does_not_hold():
    """The model already holds a value `w__fp16` and a node `trtbuild/cast_fp16/x` (a Relu):
    the FP16 copy of the shared weight and the cast of x into the FP16 Mul take others."""
    m = model(
        [node("Relu", ["x"], "w__fp16", "trtbuild/cast_fp16/x"),
         node("Mul", ["x", "w"], "a", "m16"), node("Mul", ["x", "w"], "b", "m32"),
         node("Add", ["a", "b"], "s", "add"), node("Add", ["s", "w__fp16"], "y", "add2")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"w": np.full((1, 4), 3.0, np.float32)},
    )  # fmt: skip
    mixed = convert(assign(m, _pin("m32"))).model
    onnx.checker.check_model(mixed, full_check=True)
    _unique_names(mixed)
    x = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)
    (y,) = ort.InferenceSession(mixed.SerializeToString()).run(None, {"x": x})
    assert np.array_equal(y, 6 * x + np.maximum(x, 0))  # exact in FP16 for these values


@pytest.mark.parametrize(
    ("nodes", "inputs", "feed", "dims"),
    [
        (  # ConstantOfShape without `value`: float32 zeros, by ONNX's default
            [
                node("Shape", ["x"], "s", "shape"),
                node("ConstantOfShape", ["s"], "z", "zeros"),
                node("Add", ["x", "z"], "y", "add"),
            ],
            [("x", F, ["n", 4])],
            {"x": np.ones((2, 4), np.float32)},
            ["n", 4],
        ),
        (  # a window's length from an input: `output_datatype` absent is FLOAT
            [node("HannWindow", ["n"], "w", "window"), node("Mul", ["w", "w"], "y", "square")],
            [("n", I64, [])],
            {"n": np.array(8, np.int64)},
            ["m"],
        ),
    ],
    ids=["constant-of-shape", "hann-window"],
)
def test_an_op_typed_float_by_a_default_attribute_is_retyped_when_made_fp16(
    nodes, inputs, feed, dims
):
    """The attribute that types the output was only rewritten where the model wrote it: made
    FP16, the op kept FLOAT's default beside FP16 consumers (onnx.checker refused: exit 70)."""
    from trtbuild.precision.validate import validate_mixed

    m = model(nodes, inputs, [("y", F, dims)])
    mixed = convert(assign(m, Precision(default="fp16"))).model
    validate_mixed(mixed)  # onnx.checker (full) and an ONNX Runtime session
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(mixed.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got.run(None, feed)[0], want.run(None, feed)[0], rtol=1e-3)


def test_an_output_no_given_input_types_is_typed_as_the_ops_inference_types_it():
    """LinearAttention's `present_state` (`S`) follows the query where no `past_state` is
    given: converted to FP16, it was declared FP32 while its inference makes it FP16, and
    onnx.checker's full check failed (exit 70). A LayerNormalization's `Mean` stays its
    `stash_type`'s FP32."""
    la = model(
        [
            node(
                "LinearAttention",
                ["q", "k", "v", "", "", "beta"],
                ["out", "state"],
                "la",
                q_num_heads=4,
                kv_num_heads=4,
                update_rule="delta",
            ),
            node("LayerNormalization", ["out", "g"], ["y", "mean"], "ln", axis=-1),
        ],
        [("q", F, [2, 4, 32]), ("k", F, [2, 4, 32]), ("v", F, [2, 4, 32]), ("beta", F, [2, 4, 4])],
        [("y", F, [2, 4, 32]), ("state", F, [2, 4, 8, 8]), ("mean", F, [2, 4, 1])],
        {"g": np.ones(32, np.float32)},
        opset=27,
    )
    converted = convert(assign(la, Precision()))
    onnx.checker.check_model(converted.model, full_check=True)
    types = dtypes(converted.model)
    assert types["out"] == H and types["mean"] == F
    rng = np.random.default_rng(0)
    feed = {n: rng.uniform(0, 0.5, (2, 4, 32)).astype(np.float32) for n in ("q", "k", "v")}
    feed["beta"] = rng.uniform(0, 1, (2, 4, 4)).astype(np.float32)
    session = ort.InferenceSession(converted.model.SerializeToString())
    assert [o.dtype for o in session.run(None, feed)] == [np.float32] * 3


def test_a_bitcast_keeps_its_exported_types_in_and_out():
    """BitCast's output type is `to`, of its input's bit width: as a node of the policy's
    FP16 its float output was declared FP16 with `to` still FLOAT (the full check failed,
    exit 70), and a float input read in FP16 would be other bits."""
    m = model(
        [
            node("Exp", ["x"], "e", "exp"),
            node("BitCast", ["e"], "i", "to_int", to=onnx.TensorProto.INT32),
            node("BitCast", ["n"], "f", "to_float", to=F),
            node("Mul", ["f", "e"], "y", "mul"),
        ],
        [("x", F, [4]), ("n", onnx.TensorProto.INT32, [4])],
        [("y", F, [4]), ("i", onnx.TensorProto.INT32, [4])],
        opset=26,
    )
    a = assign(m, Precision())
    assert {d.precision for n, d in zip(a.view.nodes, a.decisions) if n.op_type == "BitCast"} == {
        None
    }
    converted = convert(a)
    onnx.checker.check_model(converted.model, full_check=True)
    types = dtypes(converted.model)
    assert types["f"] == F and types["e"] == H and types["i"] == onnx.TensorProto.INT32
    (bitcast,) = [n for n in converted.model.graph.node if n.name == "to_int"]
    assert types[bitcast.input[0]] == F  # the FP16 exp cast back before its bits are read
