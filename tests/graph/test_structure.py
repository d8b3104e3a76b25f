"""Structural keys: nodes alike to ONNX Runtime's loader share a key (#46).

A key stands for a node's `RADIUS`-hop neighbourhood, so ONNX Runtime's check loads one
neighbourhood per key: equal keys must mean the same ops, types, attributes and small
constants around the node, whatever the weights and the names.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.compose
import pytest
from onnx import numpy_helper

from tests.helpers import F, H, if_model, model, node, plain_session, scan_model
from trtbuild.graph import structure
from trtbuild.graph.optypes import INTEGER_TYPES

DIM, BLOCKS = 4, 10
PINNED = (
    "ae2b6a8db609b930ee5f7c38740254dd"  # `_chain(fp16_block=5)`'s b5/matmul, as VERSION 2 keyed it
)


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


def _twins(swap: bool = False, perm: list[int] | None = None, power: float = 2.0):
    """x → Relu → a, x → Sigmoid → b, then twice Sub(a, b) → Transpose → Pow(2) → y_k; the
    second twin's Sub reads (b, a) where `swap`, its Transpose has `perm`, its Pow `power`."""
    nodes = [node("Relu", ["x"], "a", "relu"), node("Sigmoid", ["x"], "b", "sigmoid")]
    for k in (1, 2):
        twin = k == 2
        turned = perm if twin and perm else [1, 0]
        nodes += [
            node("Sub", ["b", "a"] if twin and swap else ["a", "b"], f"d{k}", f"sub{k}"),
            node("Transpose", [f"d{k}"], f"t{k}", f"transpose{k}", perm=turned),
            node("Pow", [f"t{k}", f"p{k}"], f"y{k}", f"pow{k}"),
        ]
    powers = {"p1": np.array(2.0, np.float32), "p2": np.array(power, np.float32)}
    return model(nodes, [("x", F, [2, 2])], [("y1", F, [2, 2]), ("y2", F, [2, 2])], powers)


def test_one_edge_slot_one_attribute_one_constant_value_tell_twins_apart():
    """The rounds run on numbers, this graph's own: two nodes of one graph get one number
    only where digests would be alike. Twins alike share keys; swapping one Sub's operands
    changes no signature (both float, rank 2), only which slot each producer feeds; a perm
    or a scalar exponent changes one signature; each tells the twins apart near it."""
    alike = _keys(_twins())
    assert [alike[f"{n}1"] == alike[f"{n}2"] for n in ("sub", "transpose", "pow")] == [True] * 3
    swapped = _keys(_twins(swap=True))
    assert swapped["sub1"] != swapped["sub2"] and swapped["pow1"] != swapped["pow2"]
    permuted = _keys(_twins(perm=[0, 1]))
    assert permuted["transpose1"] != permuted["transpose2"] and permuted["sub1"] != permuted["sub2"]
    cubed = _keys(_twins(power=3.0))
    assert cubed["pow1"] != cubed["pow2"] and cubed["sub1"] != cubed["sub2"]  # 2 hops away
    assert cubed["relu"] != alike["relu"]  # 3 hops away


def test_two_models_alike_but_for_weights_and_names_have_the_same_keys():
    a = _chain()
    b = _chain()
    rng = np.random.default_rng(1)
    for t in b.graph.initializer:  # other weights
        t.CopyFrom(numpy_helper.from_array(rng.standard_normal(t.dims).astype(np.float32), t.name))
    renamed = onnx.compose.add_prefix(b, "other/")  # every node and value renamed
    assert list(_keys(a).values()) == list(_keys(renamed).values())


def _digest_rounds(m: onnx.ModelProto) -> list[str]:
    """The keys as the rounds over digests make them (each node's digest with its
    neighbours' tag and digest, sorted, hashed again `RADIUS` times): what the rounds on
    numbers must give, digit for digit (a memory of keys made so stays valid)."""
    wiring = structure._Wiring(m.graph, structure.value_types(m))
    links = wiring.links()
    signed = [structure._hash(repr(s).encode()) for s in wiring.signatures]
    labels = [signed[c] for c in wiring.labels]
    for _ in range(structure.RADIUS):
        labels = [
            structure._hash(
                labels[v], *sorted(links.tags[t] + labels[u] for u, t in links.pairs(v))
            )
            for v in range(len(labels))
        ]
    return [label.hex() for label in labels]


@pytest.mark.parametrize(
    "make", [lambda: _chain(fp16_block=5), lambda: _twins(swap=True), if_model, scan_model]
)
def test_the_rounds_on_numbers_give_the_keys_the_rounds_on_digests_give(make):
    m = make()
    s = structure.structure(m, structure.value_types(m))
    assert list(s.keys) == _digest_rounds(m)


def test_keys_are_the_same_in_another_process_and_pinned():
    """Keys are remembered in the cache across processes: no hash seed, no dict or set
    order in them. The pinned digest is the key VERSION 2 made (before the rounds ran on
    numbers): a change of what a key holds changes it, and must bump `VERSION`."""
    import subprocess
    import sys

    m = _chain(fp16_block=5)
    here = _keys(m)
    script = (
        "import sys, onnx; from trtbuild.graph import structure as s; "
        "m = onnx.load_model_from_string(sys.stdin.buffer.read()); "
        "print(' '.join(s.structure(m, s.value_types(m)).keys))"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script],
            input=m.SerializeToString(),
            capture_output=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert done.stdout.decode().split() == list(here.values())
    assert structure.VERSION == 2 and here["b5/matmul"] == PINNED


def test_a_small_tensor_is_keyed_by_its_values_however_it_is_stored():
    """A small constant's raw bytes are read as they are: the same key as its values
    stored in typed fields (which numpy reads), for each type read raw."""
    for kind, nbytes in structure._RAW_BYTES.items():
        values = [1, 0, 1] if kind == onnx.TensorProto.BOOL else [3, 1, 2]
        if kind not in INTEGER_TYPES:
            values = values[:1]  # a float is keyed by value only as a scalar
        array = np.array(values, onnx.helper.tensor_dtype_to_np_dtype(kind))
        raw = numpy_helper.from_array(array, "c")
        fields = onnx.helper.make_tensor("c", kind, [len(values)], array, raw=False)
        assert raw.HasField("raw_data") and len(raw.raw_data) == nbytes * len(values)
        assert structure._tensor_key(raw) == structure._tensor_key(fields) != b"W%d" % kind
    big = numpy_helper.from_array(np.zeros(2, np.float32), "w")
    assert structure._tensor_key(big) == b"W%d" % onnx.TensorProto.FLOAT  # weights: type only


@pytest.mark.parametrize("make", [lambda: _chain(fp16_block=5), if_model, lambda: _twins()])
def test_a_ball_holds_the_nodes_within_radius_hops_of_its_centres(make):
    """`ball` walks the keys' flat links: the same nodes as a search over who reads what
    whom makes (a body's outer reads included)."""
    from trtbuild.graph import subgraphs

    m = make()
    nodes = list(m.graph.node)
    maker = {o: u for u, n in enumerate(nodes) for o in n.output if o}
    near: list[set[int]] = [set() for _ in nodes]
    for v, n in enumerate(nodes):
        for u in {maker[t] for t in subgraphs.node_reads(n) if t in maker}:
            near[v].add(u)
            near[u].add(v)
    s = structure.structure(m, structure.value_types(m))
    for v in range(len(nodes)):
        found = {v}
        for radius in range(structure.RADIUS + 1):
            assert s.ball([v], radius) == found
            found = found | {u for w in found for u in near[w]}
