"""Structural keys: nodes alike to ONNX Runtime's loader share a key (#46).

A key stands for a node's `RADIUS`-hop neighbourhood, so ONNX Runtime's check loads one
neighbourhood per key: equal keys must mean the same ops, types, attributes and small
constants around the node, whatever the weights and the names.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.helpers import F, H, model, node, plain_session
from trtbuild.graph import structure

DIM, BLOCKS = 4, 10


def _chain(fp16_block: int | None = None, op: dict[int, str] | None = None) -> onnx.ModelProto:
    """x → BLOCKS × (MatMul w_k → Add b_k → act) → y; each block's weights its own
    random values. Block `fp16_block` runs in FP16 between Casts; `op` swaps a block's
    activation (Relu by default)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], {}, "x"
    for k in range(BLOCKS):
        half = k == fp16_block
        kind = np.float16 if half else np.float32
        if half:
            nodes.append(node("Cast", [x], f"c{k}", f"b{k}/in", to=H))
            x = f"c{k}"
        inits[f"w{k}"] = rng.standard_normal((DIM, DIM)).astype(kind)
        inits[f"b{k}"] = rng.standard_normal(DIM).astype(kind)
        nodes.append(node("MatMul", [x, f"w{k}"], f"m{k}", f"b{k}/matmul"))
        nodes.append(node("Add", [f"m{k}", f"b{k}"], f"a{k}", f"b{k}/add"))
        nodes.append(node((op or {}).get(k, "Relu"), [f"a{k}"], f"r{k}", f"b{k}/act"))
        x = f"r{k}"
        if half:
            nodes.append(node("Cast", [x], f"f{k}", f"b{k}/out", to=F))
            x = f"f{k}"
    nodes.append(node("Identity", [x], "y", "out"))
    return model(nodes, [("x", F, [1, DIM])], [("y", F, [1, DIM])], inits)


def _keys(m: onnx.ModelProto) -> dict[str, str]:
    s = structure.structure(m, structure.value_types(m))
    return {n.name: k for n, k in zip(m.graph.node, s.keys, strict=True)}


def test_identical_layers_share_keys_whatever_their_weights_and_names():
    keys = _keys(_chain())
    middle = [keys[f"b{k}/matmul"] for k in range(3, BLOCKS - 3)]
    assert len(set(middle)) == 1  # each block's own random weights: alike to the loader
    assert keys["b0/matmul"] != keys["b5/matmul"]  # the first reads the graph's input
    assert keys["b5/matmul"] != keys["b5/add"]


def test_a_type_or_an_op_that_differs_gives_another_key():
    plain, half = _keys(_chain()), _keys(_chain(fp16_block=5))
    assert half["b5/matmul"] != plain["b5/matmul"]  # FP16 in and out
    assert half["b2/matmul"] == plain["b2/matmul"]  # far from block 5: alike
    swapped = _keys(_chain(op={5: "Sigmoid"}))
    assert swapped["b5/act"] != plain["b5/act"] and swapped["b2/act"] == plain["b2/act"]


def test_a_key_sees_radius_hops_and_no_further():
    """The swapped activation of block 5 is 1 hop from b5/add; each block is 3 nodes, so a
    node d hops before it is block 5 - d/3 away. Its key changes exactly up to RADIUS."""
    plain, swapped = _keys(_chain()), _keys(_chain(op={5: "Sigmoid"}))
    order = [n.name for n in _chain().graph.node]
    at = order.index("b5/act")
    changed = [d for d in range(1, 9) if plain[order[at - d]] != swapped[order[at - d]]]
    assert changed == list(range(1, structure.RADIUS + 1))


def test_small_integer_constants_are_keyed_by_value_weights_are_not():
    def reshaped(shape: list[int], scale: float) -> onnx.ModelProto:
        return model(
            [
                node("Mul", ["x", "s"], "m", "mul"),
                node("Reshape", ["m", "shape"], "y", "reshape"),
            ],
            [("x", F, [2, 3])],
            [("y", F, [shape[0], shape[1]])],
            {"shape": np.array(shape, np.int64), "s": np.full((2, 3), scale, np.float32)},
        )

    a, b = _keys(reshaped([3, 2], 1.0)), _keys(reshaped([6, 1], 1.0))
    assert a["reshape"] != b["reshape"]  # a shape drives ONNX Runtime's rewrites
    assert _keys(reshaped([3, 2], 2.0))["mul"] == a["mul"]  # a weight's values do not


def test_a_neighbourhood_is_a_model_onnx_runtime_loads():
    m = _chain(fp16_block=5)
    types = structure.value_types(m)
    s = structure.structure(m, types)
    at = [n.name for n in m.graph.node].index("b5/matmul")
    ball = s.ball([at])
    sub = structure.neighbourhood_model(m, types, ball)
    assert [n.name for n in sub.graph.node] == [m.graph.node[v].name for v in sorted(ball)]
    onnx.checker.check_model(sub, full_check=True)
    (border,) = sub.graph.input  # what the first node of the ball reads, typed as inferred
    assert border.type.tensor_type.elem_type == F
    assert {t.name for t in sub.graph.initializer} <= {t.name for t in m.graph.initializer}
    assert len(plain_session(sub).get_outputs()) == 1  # loads; one value leaves the ball


def test_a_value_of_unknown_type_on_the_border_cannot_be_cut():
    m = _chain()
    del m.graph.value_info[:]  # as a model shape inference could not type
    s = structure.structure(m, {})
    with pytest.raises(structure.Unbuildable, match="no type is known"):
        structure.neighbourhood_model(m, {}, s.ball([12]))


def test_values_a_model_does_not_declare_are_typed_by_inference():
    """A value whose maker's inputs are declared is inferred from its maker alone; one
    whose maker reads an undeclared value too, from the whole model."""
    declared = structure.value_types(_chain(fp16_block=5))
    for drop in ({"m5"}, {"c5", "m5"}):
        m = _chain(fp16_block=5)
        kept = [v for v in m.graph.value_info if v.name not in drop]
        del m.graph.value_info[:]
        m.graph.value_info.extend(kept)
        found = structure.value_types(m)
        assert {t: found[t] for t in drop} == {t: declared[t] for t in drop}


def test_a_body_reading_outer_values_the_other_way_round_gives_another_key():
    """x → Relu → a, x → Sigmoid → b; an If whose branch computes a - b or b - a: the
    body's outer reads are numbered by first use and linked to their makers in that
    order, so which value is subtracted from which is in the If's key (not a list of
    names sorted, alike both ways)."""
    from onnx import helper

    def subtracting(first: str, second: str) -> onnx.ModelProto:
        out = helper.make_tensor_value_info("d", F, [2])
        branch = helper.make_graph([node("Sub", [first, second], "d", "sub")], "b", [], [out])
        return model(
            [
                node("Relu", ["x"], "a", "relu"),
                node("Sigmoid", ["x"], "b", "sigmoid"),
                node("If", ["c"], "y", "if", then_branch=branch, else_branch=branch),
            ],
            [("x", F, [2]), ("c", onnx.TensorProto.BOOL, [])],
            [("y", F, [2])],
        )

    assert _keys(subtracting("a", "b"))["if"] != _keys(subtracting("b", "a"))["if"]
    assert _keys(subtracting("a", "b"))["if"] == _keys(subtracting("a", "b"))["if"]
