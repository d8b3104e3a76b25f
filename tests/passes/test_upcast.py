"""A model that computes in FP16 is made to compute in FP32, its interface kept."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import F, H, model, node, plain_session, sequence_loop, sparse_tensor
from trtbuild.cli import main
from trtbuild.graph import subgraphs
from trtbuild.passes.prepare import prepare
from trtbuild.passes.upcast import upcast_low_precision
from trtbuild.policy.specs import Passes

I16 = TensorProto.INT16
GAIN = 300.0  # x in [0, 1) times 300, squared: past FP16's 65504 inside, not outside


def _rms(dtype: int) -> onnx.ModelProto:
    """sqrt(mean((x * 300)^2)) + an offset, every float in `dtype` (IO included): a weight,
    a `Constant`, a `ConstantOfShape` (the offset's zeros), a Cast of an integer, and an If
    on the mean's sign whose branches declare their output in `dtype`."""
    np_type = np.float16 if dtype == H else np.float32
    gain = numpy_helper.from_array(np.array(GAIN, np_type), "gain")
    half = helper.make_tensor("half", dtype, [], [0.5])
    zero = helper.make_tensor("z", dtype, [1], [0.0])

    def branch(name: str, op: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info("b", dtype, [1])
        return helper.make_graph([helper.make_node(op, ["root"], ["b"])], name, [], [out])

    then, other = branch("then", "Identity"), branch("else", "Neg")
    nodes = [
        helper.make_node("Mul", ["x", "gain"], ["g"], name="gain"),
        helper.make_node("Pow", ["g", "two"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["mean"], name="mean", keepdims=0),
        helper.make_node("Sqrt", ["mean"], ["root0"], name="root"),
        helper.make_node("Constant", [], ["c"], name="c", value=half),
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "i0"], ["n"], name="n"),
        helper.make_node("Cast", ["n"], ["nf"], name="cast_n", to=dtype),
        helper.make_node("Mul", ["nf", "c"], ["off"], name="offset"),
        helper.make_node("ConstantOfShape", ["one"], ["zeros"], name="zeros", value=zero),
        helper.make_node("Add", ["off", "zeros"], ["off1"], name="offset1"),
        helper.make_node("Add", ["root0", "off1"], ["root"], name="shifted"),
        helper.make_node("Greater", ["mean", "zero"], ["pos"], name="sign"),
        node("If", ["pos"], "y", "gate", then_branch=then, else_branch=other),
    ]
    inits = [
        gain,
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array(0, np_type), "zero"),
        numpy_helper.from_array(np.array(2, np_type), "two"),
    ]
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", dtype, [1, 256])],
        [helper.make_tensor_value_info("y", dtype, [1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _low_anywhere(model: onnx.ModelProto, low: int = H) -> list[str]:
    """Every `low` weight, attribute, cast or declared value inside the graph (not its IO,
    nor the Cast that hands a `low` output out)."""
    outputs = {o.name for o in model.graph.output}
    found = [t.name for t in model.graph.initializer if t.data_type == low]
    for scope, graph in subgraphs.walk(model.graph):
        declared = [
            *graph.value_info,
            *(graph.input if scope else ()),
            *(graph.output if scope else ()),
        ]
        found += [v.name for v in declared if v.type.tensor_type.elem_type == low]
        for n in (n for n in graph.node if not set(n.output) & outputs):
            for a in n.attribute:
                is_low = (a.t.data_type if a.type == onnx.AttributeProto.TENSOR else a.i) == low
                if is_low and a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.INT):
                    found.append(f"{n.name}.{a.name}")
    return found


def test_an_fp16_model_computes_what_its_fp32_twin_computes_and_keeps_its_bindings():
    """The FP16 model stores x*300 squared, inf in FP16; made FP32 inside,
    it gives exactly what the same network in FP32 gives, cast to FP16 at its output; its
    input and output stay FP16, and nothing inside is FP16 any more."""
    low = _rms(H)
    before = low.SerializeToString()
    wide, record = upcast_low_precision(low)
    assert low.SerializeToString() == before  # the input model is not changed
    assert record.changed and record.details == {"from": "fp16"}
    assert _low_anywhere(wide) == []
    io = [v.type.tensor_type.elem_type for v in (*wide.graph.input, *wide.graph.output)]
    assert io == [H, H]
    x = np.random.default_rng(0).uniform(0.5, 1, (1, 256)).astype(np.float16)
    assert (GAIN * float(x.max())) ** 2 > 65504  # the square, stored in FP16: inf
    (got,) = plain_session(wide).run(None, {"x": x})
    (twin,) = plain_session(_rms(F)).run(None, {"x": x.astype(np.float32)})
    assert got.dtype == np.float16 and np.isfinite(got).all()
    np.testing.assert_array_equal(got, twin.astype(np.float16))


def test_an_fp32_model_is_left_as_it_is():
    """The same object, no record: an FP32 model, and one that only takes an FP16 input and
    casts it at once (it computes in FP32)."""
    fp32 = _rms(F)
    assert upcast_low_precision(fp32)[0] is fp32
    takes_fp16 = model(
        [node("Cast", ["x"], "xf", "c", to=F), node("Relu", ["xf"], "y", "r")],
        [("x", H, [1, 2])],
        [("y", F, [1, 2])],
    )
    same, record = upcast_low_precision(takes_fp16)
    assert same is takes_fp16 and record.changed == 0


INTERFACES = {
    # an output that is a weight, one that is the input itself, one another node reads
    "weight out": ([node("Add", ["x", "w"], "y", "add")], ["y", "w"], True),
    "input out": ([node("Relu", ["x"], "y", "r")], ["y", "x"], False),
    "read out": ([node("Relu", ["x"], "a", "r"), node("Neg", ["a"], "b", "n")], ["a", "b"], False),
}


@pytest.mark.parametrize("case", sorted(INTERFACES))
def test_the_bindings_are_kept_whatever_the_graph_does_with_them(case):
    """Every output keeps its FP16 binding and its values (exact here: the ops are), an
    FP16 network without weights says it computed in fp16 (its warning names the type)."""
    nodes, outputs, weight = INTERFACES[case]
    inits = {"w": np.array([[1, 2]], np.float16)} if weight else {}
    given = model(nodes, [("x", H, [1, 2])], [(o, H, [1, 2]) for o in outputs], inits)
    wide, record = upcast_low_precision(given)
    onnx.checker.check_model(wide, full_check=True)
    assert [o.name for o in wide.graph.output] == outputs and record.details == {"from": "fp16"}
    assert {o.type.tensor_type.elem_type for o in wide.graph.output} == {H}
    x = {"x": np.array([[1.5, -2.0]], np.float16)}
    for got, want in zip(plain_session(wide).run(None, x), plain_session(given).run(None, x)):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def _loop(dtype: int) -> onnx.ModelProto:
    """acc += x * k three times, x an input read only inside the body, whose `value_info`
    declares the product (as shape inference writes it): every float in `dtype`."""
    np_type = np.float16 if dtype == H else np.float32
    body = helper.make_graph(
        [
            node("Mul", ["x", "k"], "xk", "mul"),
            node("Add", ["acc_in", "xk"], "acc_out", "add"),
            node("Identity", ["cond_in"], "cond_out", "go"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", dtype, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", dtype, [2]),
        ],
        value_info=[helper.make_tensor_value_info("xk", dtype, [2])],
    )
    inits = {"M": np.array(3, np.int64), "a0": np.array([1, 2], np_type), "k": np.array(2, np_type)}
    return model(
        [node("Loop", ["M", "", "a0"], "acc", "loop", body=body)],
        [("x", dtype, [2])],
        [("acc", dtype, [2])],
        inits,
    )


def test_a_body_that_declares_fp16_values_computes_in_fp32_too():
    """A body's `value_info` is the model's inside: left FP16, ONNX Runtime refused the
    upcast Loop ("Type (tensor(float16)) of output arg (xk) ... does not match")."""
    wide, _ = upcast_low_precision(_loop(H))
    onnx.checker.check_model(wide, full_check=True)
    x = np.array([1.5, 2.5], np.float16)
    (got,) = plain_session(wide).run(None, {"x": x})
    (twin,) = plain_session(_loop(F)).run(None, {"x": x.astype(np.float32)})
    np.testing.assert_array_equal(got, twin.astype(np.float16))


def test_type_attributes_and_sequences_are_made_fp32():
    """A window's `output_datatype` (the model runs), a LayerNorm's `stash_type` and an
    Attention's `softmax_precision` (FP32 after), a sequence's elements (the model runs
    and computes what it did). BitCast's `to`: `test_bf16_..._a_bitcast_keeps_its_type`."""
    window = model(
        [
            node("HannWindow", ["n"], "win", "w", output_datatype=H),
            node("Mul", ["x", "win"], "y", "m"),
        ],
        [("x", H, [4])],
        [("y", H, [4])],
        {"n": np.array(4, np.int64)},
    )
    wide, _ = upcast_low_precision(window)
    plain_session(wide).run(None, {"x": np.ones(4, np.float16)})
    norm = model(
        [node("LayerNormalization", ["x", "g"], "y", "ln", stash_type=H)],
        [("x", H, [1, 4])],
        [("y", H, [1, 4])],
        {"g": np.ones(4, np.float16)},
    )
    (ln,) = [
        n for n in upcast_low_precision(norm)[0].graph.node if n.op_type == "LayerNormalization"
    ]
    assert [a.i for a in ln.attribute if a.name == "stash_type"] == [F]
    qkv = [(n, H, [1, 2, 4, 8]) for n in "qkv"]
    attention = model(
        [node("Attention", ["q", "k", "v"], "y", "att", softmax_precision=H)],
        qkv,
        [("y", H, [1, 2, 4, 8])],
        opset=23,
    )
    (att,) = [n for n in upcast_low_precision(attention)[0].graph.node if n.op_type == "Attention"]
    assert [a.i for a in att.attribute if a.name == "softmax_precision"] == [F]
    sequence = model(
        sequence_loop("x", H, "M"),
        [("x", H, [4])],
        [("y", H, [3, 4])],
        {"M": np.array(3, np.int64)},
    )
    x = np.arange(4, dtype=np.float16)
    (got,) = plain_session(prepare(sequence, Passes()).model).run(None, {"x": x})
    np.testing.assert_array_equal(got, np.tile(x, 3))


def test_a_sparse_fp16_constant_is_made_dense_then_fp32():
    """`prepare` makes sparse weights dense first (`dense_weights`), so upcast sees an FP16
    sparse Constant as a dense one and makes it FP32, its values exact."""
    sparse = sparse_tensor([1.5, -2.0], [1, 3], [4], np.float16)
    m = model(
        [node("Constant", [], "k", "k", sparse_value=sparse), node("Add", ["x", "k"], "y", "add")],
        [("x", H, [4])],
        [("y", H, [4])],
    )
    prepared = prepare(m, Passes()).model
    (k,) = [t for t in prepared.graph.initializer if t.name == "k"]
    assert k.data_type == F and numpy_helper.to_array(k).tolist() == [0, 1.5, 0, -2]


def test_bf16_is_made_fp32_and_a_bitcast_keeps_its_type():
    """A BF16 weight, a Cast to BF16 and a BF16 input: FP32 inside, the record says bf16. A
    BitCast's `to` names the type whose bits it reads, not a precision: it stays FP16."""
    bf16 = TensorProto.BFLOAT16
    graph = helper.make_graph(
        [
            node("Mul", ["x", "k"], "y0", "scale"),
            node("Cast", ["y0"], "y", "narrow", to=bf16),
            node("BitCast", ["raw"], "half", "bits", to=H),
        ],
        "g",
        [helper.make_tensor_value_info(n, t, [4]) for n, t in (("x", bf16), ("raw", I16))],
        [helper.make_tensor_value_info(n, t, [4]) for n, t in (("y", bf16), ("half", H))],
        [helper.make_tensor("k", bf16, [], [3.0])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    wide, record = upcast_low_precision(m)
    assert record.details == {"from": "bf16/fp16"} and _low_anywhere(wide, bf16) == []
    (bits,) = [n for n in wide.graph.node if n.op_type == "BitCast"]
    assert [a.i for a in bits.attribute if a.name == "to"] == [H]


def test_prepare_upcasts_and_a_policy_pins_the_square(tmp_path, capsys):
    """End to end: `check` on the FP16 model passes and names the square's range (before
    the upcast it was exit 2, "the FP32 reference holds inf"); with it pinned `build`
    passes."""
    prepared = prepare(_rms(H), Passes())
    assert [r.to_json()["from"] for r in prepared.records if r.name == "upcast"] == ["fp16"]
    onnx.save(_rms(H), tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"

    def write(rules: str) -> None:
        policy.write_text(
            "version: 1\nmodel: m.onnx\n"
            "inputs:\n  x: {data: {distribution: uniform, low: 0.5, high: 1.0}}\n"
            f"precision:\n  default: fp16\n  rules: {rules}\nbuild: {{backend: none}}\n"
        )

    write("[]")
    assert main(["check", "--policy", str(policy)]) == 0
    err = capsys.readouterr().err
    assert "square (Pow) reaches" in err
    assert "the model computes in fp16 as exported: prepare made it compute in FP32" in err
    assert "its fp16 inputs and outputs stay fp16" in err  # they are FP16: kept
    write("[{id: sq, match: {name: ^(square|mean)$}, precision: fp32}]")
    assert main(["build", "--policy", str(policy), "-o", str(tmp_path / "out")]) == 0


def _conv(quantized: bool) -> onnx.ModelProto:
    """A Conv; `quantized`: as ModelOpt writes it by default (`--high_precision_dtype fp16`):
    the input cast to FP16, Q/DQ pairs with FP16 scales (the weight INT8 per channel), the
    output cast back to FP32; opset 19."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    scale = np.abs(w).reshape(4, -1).max(axis=1) / 127
    q = np.round(w / scale[:, None, None, None]).astype(np.int8)
    inits = [numpy_helper.from_array((q * scale[:, None, None, None]).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    if quantized:
        inits = [
            numpy_helper.from_array(q, "wq"),
            numpy_helper.from_array(scale.astype(np.float16), "ws"),
            numpy_helper.from_array(np.array(1 / 64, np.float16), "xs"),
            numpy_helper.from_array(np.array(0, np.int8), "xz"),
        ]
        nodes = [
            helper.make_node("Cast", ["x"], ["x16"], name="x_to_fp16", to=H),
            helper.make_node("QuantizeLinear", ["x16", "xs", "xz"], ["xq"], name="xq"),
            helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="xd"),
            helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], name="wd", axis=0),
            helper.make_node("Conv", ["xd", "wd"], ["y16"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Cast", ["y16"], ["y"], name="y_to_fp32", to=F),
        ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_model_quantized_with_fp16_scales_is_judged_like_one_with_fp32_scales(tmp_path):
    """ModelOpt's default output: its scales become FP32 (exact), and the policy judges it
    against the FP32 model it was quantized from; `build` passes at INT8's tolerance."""
    prepared = prepare(_conv(True), Passes())
    scales = {t.name: t.data_type for t in prepared.model.graph.initializer}
    assert scales["xs"] == scales["ws"] == F and scales["wq"] == TensorProto.INT8
    onnx.save(_conv(True), tmp_path / "q.onnx")
    onnx.save(_conv(False), tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: q.onnx\nprecision: {default: fp16, rules: []}\n"
        "build: {backend: none}\naccuracy:\n  reference_model: m.onnx\n"
        "  tolerances: {default: {atol: 0.1, rtol: 0, check_error_stat: max}}\n"
    )
    assert main(["build", "--policy", str(policy), "-o", str(tmp_path / "out")]) == 0
    warned = json.loads((tmp_path / "out" / "report.json").read_text())["warnings"]
    said = [w for w in warned if w.startswith("the model computes in fp16 as exported")]
    assert len(said) == 1 and "inputs and outputs stay" not in said[0], said  # its are FP32


def test_an_fp16_output_past_the_range_says_the_model_narrows_it(tmp_path, capsys):
    """An FP16 output whose FP32 value is 1e5: the reference's inf is where the model casts
    it to FP16 (its binding), and the message says so rather than blame the weights."""
    gain = numpy_helper.from_array(np.array(1000.0, np.float16), "k")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"], name="gain")],
        "g",
        [helper.make_tensor_value_info("x", H, [1, 8])],
        [helper.make_tensor_value_info("y", H, [1, 8])],
        [gain],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\n"
        "inputs:\n  x: {data: {distribution: uniform, low: 100.0, high: 200.0}}\n"
    )
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "the model casts it to FP16 there, past that type's range" in err
    assert "export the output (or cast) as FP32" in err and "checkpoint" not in err
