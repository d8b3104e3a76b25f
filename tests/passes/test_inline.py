"""Local functions are inlined in `prepare`, each call's nodes named under the call."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tests.helpers import F, node, plain_session
from trtbuild.cli import main
from trtbuild.graph import subgraphs
from trtbuild.passes.inline import inline_functions
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes

LOCAL = "local"


def _functions() -> list[onnx.FunctionProto]:
    """`Scale(a) = tanh(a * 2)` with unnamed nodes, and `Twice(a) = Scale(Scale(a)) + a`,
    whose calls of Scale are nested calls."""
    two = helper.make_tensor("two", onnx.TensorProto.FLOAT, [], [2.0])
    scale = helper.make_function(
        LOCAL,
        "Scale",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["c"], value=two),
            helper.make_node("Mul", ["a", "c"], ["m"]),
            helper.make_node("Tanh", ["m"], ["b"]),
        ],
        [helper.make_opsetid("", 17)],
    )
    twice = helper.make_function(
        LOCAL,
        "Twice",
        ["a"],
        ["b"],
        [
            helper.make_node("Scale", ["a"], ["s1"], domain=LOCAL, name="first"),
            helper.make_node("Scale", ["s1"], ["s2"], domain=LOCAL, name="second"),
            helper.make_node("Add", ["s2", "a"], ["b"], name="skip"),
        ],
        [helper.make_opsetid("", 17), helper.make_opsetid(LOCAL, 1)],
    )
    return [scale, twice]


def _model() -> onnx.ModelProto:
    """A Conv, a call of Scale, a call of Twice, and a call of Scale inside an If's branch
    (on the sign of the sum): every place a call can be."""
    call = helper.make_node

    def branch(name: str, op: str) -> onnx.GraphProto:
        nodes = [call(op, ["t"], ["r"], domain=LOCAL if op == "Scale" else "", name=f"in_{name}")]
        out = [helper.make_tensor_value_info("r", F, [1, 4, 8, 8])]
        return helper.make_graph(nodes, name, [], out)

    w = onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w"
    )
    then, other = branch("then", "Scale"), branch("else", "Relu")
    nodes = [
        call("Conv", ["x", "w"], ["y0"], name="conv", pads=[1, 1, 1, 1]),
        call("Scale", ["y0"], ["y1"], domain=LOCAL, name="scale"),
        call("Twice", ["y1"], ["t"], domain=LOCAL, name="block"),
        call("ReduceSum", ["t"], ["sum"], name="sum", keepdims=0),
        call("Greater", ["sum", "zero"], ["positive"], name="sign"),
        node("If", ["positive"], "y", "gate", then_branch=then, else_branch=other),
    ]
    zero = onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])],
        [w, zero],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(LOCAL, 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=_functions())
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_every_call_is_inlined_under_its_own_name_and_computes_the_same():
    """Each call (in the graph, nested in a function, in an If's branch) becomes its
    function's nodes named `{call}/{node or op}`; no function, no call and no `local`
    opset is left; the outputs are the original's; the input is not changed."""
    model = _model()
    before = model.SerializeToString()
    inlined, record = inline_functions(model)
    assert model.SerializeToString() == before
    assert record.changed == 5  # scale, block, block's two Scales, the branch's Scale
    assert not inlined.functions and [o.domain for o in inlined.opset_import] == [""]
    names = {n.name for n in subgraphs.all_nodes(inlined)}
    assert {"scale/Mul", "scale/Tanh", "block/skip", "block/first/Mul", "block/second/Tanh"} <= (
        names
    )
    assert "in_then/Tanh" in names  # a call inside a body, under its (here unqualified) name
    assert all(n.domain == "" for n in subgraphs.all_nodes(inlined))
    for sign in (1.0, -1.0):  # both branches taken
        x = {"x": sign * np.random.default_rng(1).uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)}
        (want,) = plain_session(model).run(None, x)
        (got,) = plain_session(inlined).run(None, x)
        np.testing.assert_array_equal(got, want)


def test_prepare_inlines_and_records_it():
    prepared = prepare(_model(), Passes(opset=17))
    record = next(r for r in prepared.records if r.name == "inline_functions")
    assert record.to_json() == {
        "pass": "inline_functions",
        "changed": 5,
        "functions": [{"name": "Scale"}, {"name": "Twice"}],
    }
    assert not prepared.model.functions
    names = {n.name for n in subgraphs.all_nodes(prepared.model)}
    assert "gate/then_branch/in_then/Tanh" in names  # named before: the qualified call name


def test_a_rule_pins_what_a_call_computed(tmp_path, capsys):
    """A model with local functions is checked end to end (its FP32 reference ran in
    segments that carried no functions, and ONNX Runtime refused them: exit 2), and a
    rule on the call's scope selects exactly its nodes."""
    onnx.save(_model(), tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nprecision:\n  default: fp16\n  rules:\n"
        "    - {id: block, match: {name: ^block/}, precision: fp32}\n"
        "build: {backend: none}\n"
    )
    assert main(["check", "--policy", str(policy)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    pinned = sorted(r[0] for r in rows if len(r) > 3 and r[3] == "block")
    assert pinned == [
        "block/first/Mul",
        "block/first/Tanh",
        "block/second/Mul",
        "block/second/Tanh",
        "block/skip",
    ]


def test_a_users_node_keeps_its_name_and_a_function_keeps_its_opsets():
    """A node already named `act/Relu` keeps the name (the call's Relu takes `act/Relu_1`);
    two unnamed nodes of one op in a body get `Mul` and `Mul_1`; a body's `com.microsoft`
    op, a domain only the function imported, is imported by the model (the inliner left
    it out: onnx.checker refused the model)."""
    act = helper.make_function(
        LOCAL,
        "Act",
        ["a"],
        ["b"],
        [
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("Mul", ["r", "r"], ["m"]),
            helper.make_node("Mul", ["m", "r"], ["m3"]),
            helper.make_node("Gelu", ["m3"], ["b"], domain="com.microsoft"),
        ],
        [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r0"], name="act/Relu"),
            helper.make_node("Act", ["r0"], ["y"], domain=LOCAL, name="act"),
        ],
        "g",
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [helper.make_tensor_value_info("y", F, [1, 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(LOCAL, 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[act])
    model.ir_version = 8
    inlined, _ = inline_functions(model)
    onnx.checker.check_model(inlined, full_check=True)
    names = [(n.name, n.op_type) for n in inlined.graph.node]
    assert names == [
        ("act/Relu", "Relu"),  # the user's
        ("act/Relu_1", "Relu"),
        ("act/Mul", "Mul"),
        ("act/Mul_1", "Mul"),
        ("act/Gelu", "Gelu"),
    ]
    assert {(o.domain, o.version) for o in inlined.opset_import} == {("", 17), ("com.microsoft", 1)}
    x = {"x": np.array([[-1.0, 0.5, 1.0, 2.0]], np.float32)}
    np.testing.assert_array_equal(
        plain_session(inlined).run(None, x)[0], plain_session(model).run(None, x)[0]
    )
