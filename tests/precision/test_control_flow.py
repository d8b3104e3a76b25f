"""Policies inside If/Loop/Scan bodies: rules match body nodes, and the casts keep one type
per value across branches and iterations."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.helpers import F, if_model, model, node, scan_model
from trtbuild.graph import subgraphs
from trtbuild.graph.view import GraphView
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Match, Passes, Precision, Rule
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert
from trtbuild.precision.validate import validate_mixed


def _mixed(m: onnx.ModelProto, *rules: Rule) -> tuple[GraphView, onnx.ModelProto]:
    view = GraphView(prepare(m, Passes()).model)
    converted = convert(assign(view, Precision(default="fp16", rules=rules)))
    validate_mixed(converted.model)  # onnx.checker (full) and an ONNX Runtime session
    return view, converted.model


def _types(m: onnx.ModelProto) -> dict[str, int]:
    graphs = [g for _, g in subgraphs.walk(m.graph)]
    types = {vi.name: vi.type.tensor_type.elem_type for g in graphs for vi in g.value_info}
    types.update({vi.name: vi.type.tensor_type.elem_type for g in graphs for vi in g.output})
    types.update({t.name: t.data_type for t in m.graph.initializer})
    return types


def _run(m: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


@pytest.mark.parametrize("x", [[1.0, -2.0, 3.0, 4.0], [-1.0, -2.0, 3.0, -4.0]])
def test_both_branches_hand_out_the_declared_type_and_compute_in_fp16(x):
    source = if_model()
    _, mixed = _mixed(source)
    branch = next(n for n in mixed.graph.node if n.op_type == "If")
    for attr, body in subgraphs.bodies(branch):
        assert [vi.type.tensor_type.elem_type for vi in body.output] == [TensorProto.FLOAT], attr
        assert body.node[-1].op_type == "Cast"  # computed in FP16, cast back at the border
    assert _types(mixed)["w"] == TensorProto.FLOAT16  # the outer weight, converted once
    feed = {"x": np.array([x], np.float32)}
    np.testing.assert_allclose(_run(mixed, feed)[0], _run(source, feed)[0], rtol=1e-3)


def test_an_outer_value_a_body_reads_in_fp16_is_cast_once_before_the_control_node(models_dir):
    _, mixed = _mixed(onnx.load(models_dir / "loop_sum.onnx"))
    top = [n.op_type for n in mixed.graph.node]
    loop = top.index("Loop")
    assert "Cast" in top[:loop]  # the input's FP16 copy, made outside the loop
    body = dict(subgraphs.bodies(mixed.graph.node[loop]))["body"]
    carried_in, carried_out = body.input[2], body.output[1]
    assert carried_in.type.tensor_type.elem_type == TensorProto.FLOAT
    assert carried_out.type.tensor_type.elem_type == TensorProto.FLOAT  # one type each turn


def test_a_rule_on_the_control_node_pins_its_whole_body_and_a_body_rule_wins_inside(models_dir):
    view = GraphView(prepare(onnx.load(models_dir / "loop_sum.onnx"), Passes()).model)
    rules = (
        Rule("inner", Match(name="running_sum/body/project$"), "fp16"),
        Rule("whole-loop", Match(name="^running_sum$"), "fp32"),
    )
    a = assign(view, Precision(default="fp16", rules=rules))
    by_name = {n.name: d for n, d in zip(view.nodes, a.decisions)}
    assert by_name["running_sum/body/accumulate"].precision == "fp32"
    assert by_name["running_sum/body/accumulate"].reason.startswith("inside running_sum:")
    assert by_name["running_sum/body/project"].rule == "inner"
    assert by_name["running_sum"].rule == "control-flow"
    assert a.rule_hits["whole-loop"] == 2  # the Loop and its Add


def test_scan_state_keeps_its_type_across_iterations():
    source = scan_model(gain=3.0)
    _, mixed = _mixed(source, Rule("sum", Match(name="accumulate$"), "fp32"))
    scan = next(n for n in mixed.graph.node if n.op_type == "Scan")
    body = dict(subgraphs.bodies(scan))["body"]
    assert body.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert body.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    feed = {"x": np.random.default_rng(0).uniform(0, 1, (8, 4)).astype(np.float32)}
    for got, want in zip(_run(mixed, feed), _run(source, feed)):
        np.testing.assert_allclose(got, want, rtol=2e-3)


def _layernorm_in_a_loop() -> onnx.ModelProto:
    """A Loop body that normalises its carried value over the last axis (decomposed LayerNorm)."""
    vi = helper.make_tensor_value_info
    n = helper.make_node
    body = helper.make_graph(
        [
            n("ReduceMean", ["h_in"], ["mean"], "ln/ReduceMean", axes=[-1]),
            n("Sub", ["h_in", "mean"], ["d"], "ln/Sub"),
            n("Pow", ["d", "two"], ["sq"], "ln/Pow"),
            n("ReduceMean", ["sq"], ["var"], "ln/ReduceMean_1", axes=[-1]),
            n("Add", ["var", "eps"], ["ve"], "ln/Add"),
            n("Sqrt", ["ve"], ["std"], "ln/Sqrt"),
            n("Div", ["d", "std"], ["normed"], "ln/Div"),
            n("Add", ["normed", "x"], ["h_out"], "residual"),
            n("Identity", ["cond_in"], ["cond_out"], "go_on"),
        ],
        "body",
        [
            vi("i", TensorProto.INT64, []),
            vi("cond_in", TensorProto.BOOL, []),
            vi("h_in", F, [1, 8]),
        ],
        [vi("cond_out", TensorProto.BOOL, []), vi("h_out", F, [1, 8])],
    )
    return model(
        [node("Loop", ["steps", "go", "x"], "y", "blocks", body=body)],
        [("x", F, [1, 8])],
        [("y", F, [1, 8])],
        {
            "steps": np.array(3, np.int64),
            "go": np.array(True),
            "two": np.array(2.0, np.float32),
            "eps": np.array(1e-5, np.float32),
        },
        opset=13,
    )


def test_structural_patterns_find_a_layernorm_inside_a_body():
    view = GraphView(prepare(_layernorm_in_a_loop(), Passes()).model)
    rule = Rule("ln", Match(pattern="layernorm"), "fp32")
    a = assign(view, Precision(default="fp16", rules=(rule,)))
    pinned = {n.name for n, d in zip(view.nodes, a.decisions) if d.rule == "ln"}
    assert pinned >= {f"blocks/body/ln/{op}" for op in ("ReduceMean", "Sub", "Pow", "Sqrt", "Div")}
    assert "blocks/body/residual" not in pinned


def test_a_weight_a_branch_reads_in_fp16_and_a_pinned_node_in_fp32_is_held_in_both():
    """The pinned outer Mul keeps `w` in FP32 and the branch reads its FP16 copy: the branch
    read `w` itself, FP32 beside its FP16 input (invalid: exit 70)."""
    source = if_model()
    outer = helper.make_node("Mul", ["x", "w"], ["z"], name="/outer")
    source.graph.node.append(outer)
    source.graph.output.append(helper.make_tensor_value_info("z", F, [1, 4]))
    pin = Rule("pin", Match(name="^/outer$"), "fp32")
    _, mixed = _mixed(source, pin)
    types = _types(mixed)
    assert types["w"] == TensorProto.FLOAT
    branch = next(n for n in mixed.graph.node if n.op_type == "If")
    read = {t for _, body in subgraphs.bodies(branch) for n in body.node for t in n.input}
    copy = next(t for t in read if t.startswith("w__"))
    assert types[copy] == TensorProto.FLOAT16
    feed = {"x": np.array([[1.0, -2.0, 3.0, 4.0]], np.float32)}
    for got, want in zip(_run(mixed, feed), _run(source, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-3)
