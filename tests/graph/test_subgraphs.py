"""Control flow in the one index over a graph: every body node listed, named and connected."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from tests.helpers import if_model, scan_model
from trtbuild.graph import subgraphs
from trtbuild.graph.view import GraphView
from trtbuild.passes.basic import name_unnamed_nodes
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes


def test_body_nodes_come_before_their_control_node_with_qualified_names():
    view = GraphView(prepare(if_model(), Passes()).model)
    names = [n.name for n in view.nodes]
    branch = names.index("branch")
    inside = [names[k] for k in view.inside(branch)]
    assert set(inside) == {
        "branch/then_branch/then_relu",
        "branch/then_branch/mul",
        "branch/then_branch/scale",
        "branch/else_branch/else_neg",
        "branch/else_branch/mul",
        "branch/else_branch/scale",
    }
    assert all(k < branch for k in view.inside(branch))
    assert len(set(names)) == len(names)
    mul = names.index("branch/then_branch/mul")
    assert view.scope[mul] == "branch/then_branch" and view.parent[mul] == branch
    assert view.top == [i for i, s in enumerate(view.scope) if not s]


def test_values_two_branches_define_alike_are_renamed_apart():
    model, record = name_unnamed_nodes(if_model())
    made = [o for _, g in subgraphs.walk(model.graph) for n in g.node for o in n.output]
    assert len(made) == len(set(made)), made
    assert "p" in made
    assert {"branch/then_branch/p", "branch/else_branch/p"} & set(made)
    assert record.changed > 0
    onnx.checker.check_model(model, full_check=True)


def test_a_body_reads_outer_values_and_its_outputs_reach_the_graph_output():
    model = prepare(if_model(), Passes()).model
    view = GraphView(model)
    branch = next(n for n in model.graph.node if n.op_type == "If")
    assert {"x", "w"} <= set(subgraphs.node_reads(branch))
    scale = [n.name for n in view.nodes].index("branch/then_branch/scale")
    assert view.reaches_output[scale]
    assert any(view.scope[k] for k in view.consumers["w"])  # the outer weight, read inside


def test_scan_state_and_scanned_outputs_are_indexed():
    view = GraphView(prepare(scan_model(), Passes()).model)
    scan = [n.op_type for n in view.nodes].index("Scan")
    ops = sorted(view.nodes[k].op_type for k in view.inside(scan))
    assert ops == ["Add", "Mul", "Mul"]
    assert scan in view.consumers["acc_out"]


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        ("then_output", "its then_branch output 0 (then_out) is float16 but its else_branch"),
        ("scan_state", "its body takes carried value 0 (acc_in) as float32 but hands it back"),
    ],
)
def test_typing_problem_names_the_border_that_cannot_keep_one_type(mutate, says):
    if mutate == "then_output":
        node = if_model().graph.node[2]
        then = dict(subgraphs.bodies(node))["then_branch"]
        then.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    else:
        node = scan_model().graph.node[0]
        node.attribute[0].g.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    assert says in subgraphs.typing_problem(node)


def test_bodies_are_found_on_every_op_that_may_hold_one_and_only_read_there():
    """The schema says which default-domain ops hold graphs (SequenceMap as well as If,
    Loop, Scan); another domain's op may hold one, whatever its name."""
    body = helper.make_graph([], "b", [], [])
    holders = [
        helper.make_node("SequenceMap", ["s"], ["o"], body=body),
        helper.make_node("If", ["c"], ["o"], then_branch=body, else_branch=body),
        helper.make_node("Add", ["x"], ["o"], domain="my.ops", decoder=body),  # not ai.onnx's
    ]
    for node in holders:
        assert subgraphs.has_body(node) and subgraphs.bodies(node)[0][1] == body
    plain = helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])
    assert not subgraphs.has_body(plain) and subgraphs.bodies(plain) == []
    refused = helper.make_node("Relu", ["x"], ["y"], g=body)  # onnx.checker refuses it
    assert not subgraphs.has_body(refused) and subgraphs.bodies(refused) == []
    unknown = helper.make_node("NoSuchOp", ["x"], ["y"], g=body)  # no schema: its attributes
    assert subgraphs.bodies(unknown) == [("g", body)]
