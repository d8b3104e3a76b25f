"""Attention blocks, and the normalization units they feed.

Why: users know the failure as "the LayerNorm after attention" (NAFNet's
artifacts, transformer outlier features): attention concentrates energy in a
few channels or tokens, the residual stream carries it on, and the next
normalization squares it past 65504. So a policy needs to find attention by
shape, whatever the exporter named it, and follow its output to the
normalizations it reaches.

Forms recognised:
- fused attention ops (ONNX `Attention`, onnxruntime's `MultiHeadAttention`,
  `GroupQueryAttention`, ...);
- Softmax self-attention: MatMul(Q, Kᵀ) of two activations, optional scale
  (`Mul`/`Div`) and mask (`Add`/`Where`), `Softmax`, MatMul(P, V), with layout
  ops (reshapes, squeezes, transposes, as tf2onnx leaves Keras' attention) on
  either side of the Softmax and MatMul or Einsum products; the block is that
  core, not the Q/K/V projections;
- channel attention as in NAFNet's SCA and squeeze-excitation:
  GlobalAveragePool (or a spatial `ReduceMean`) → 1×1 Conv / MatMul / Gemm and
  activations → `Mul` with the pooled tensor itself, or with features computed from
  it (KBNet's `x * x1 * sca`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtbuild.graph.norms import reduce_axes
from trtbuild.graph.optypes import DATA_MOVEMENT
from trtbuild.graph.view import GraphView

FUSED_ATTENTION = frozenset(
    {
        "Attention",
        "MultiHeadAttention",
        "GroupQueryAttention",
        "PackedAttention",
        "PackedMultiHeadAttention",
        "DecoderMaskedMultiHeadAttention",
    }
)
PRODUCTS = frozenset({"MatMul", "Einsum"})
# Between Q·Kᵀ and Softmax: scaling, masking, bias, layout, and logit soft-capping
# (Gemma 2's `cap * tanh(scores / cap)`: without Tanh its attention was no block, so
# `attention` and `layernorm_after_attention` matched nothing in it).
SCORE_OPS = frozenset({"Mul", "Div", "Add", "Sub", "Where", "Cast", "Clip", "Tanh"}) | DATA_MOVEMENT
# Between Softmax and ·V: dropout, masking, layout (tf2onnx reshapes and squeezes here).
PROB_OPS = frozenset({"Cast", "Dropout", "Mul", "Where"}) | DATA_MOVEMENT
ACTIVATIONS = frozenset(
    {
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Gelu",
        "Erf",
        "Clip",
        "Elu",
        "Selu",
        "Softplus",
        "Mish",
    }
)
# Inside a channel-attention branch: projections, their biases, activations, layout.
BRANCH_OPS = (
    frozenset({"Conv", "MatMul", "Gemm", "Add", "Mul", "Div", "Sub"}) | ACTIVATIONS | DATA_MOVEMENT
)
# What carries an attention output on to a normalization: projections, residual
# adds, gates, activations and layout; a normalization unit (or anything else)
# ends the path.
CARRIERS = (
    frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "Add", "Sub", "Mul", "Div"})
    | frozenset({"Cast", "Dropout"})
    | ACTIVATIONS
    | DATA_MOVEMENT
)
_MAX_HOPS = 8  # how far scale/mask/activation chains are followed


@dataclass(frozen=True)
class AttentionUnit:
    """One attention block; `nodes` are graph indices, `output` the node whose result leaves it."""

    kind: str  # "self-attention", "channel-attention" or a fused op type
    nodes: tuple[int, ...]
    output: int
    reason: str


def _activation_input(view: GraphView, tensor: str) -> bool:
    """A tensor computed from the graph's inputs, not a weight or constant."""
    return tensor not in view.initializers and (tensor in view.producer or tensor in view.inputs)


def _path_back(view: GraphView, tensor: str, through: frozenset[str], to: frozenset[str]):
    """Nodes from a producer of op `to` forward to `tensor`, through ops in `through`."""
    stack = [(tensor, ())]
    while stack:
        t, path = stack.pop()
        p = view.producer.get(t)
        if p is None or len(path) > _MAX_HOPS:
            continue
        op = view.nodes[p].op_type
        if op in to:
            return p, path
        if op in through:
            for inp in view.nodes[p].input:
                if inp and _activation_input(view, inp):
                    stack.append((inp, (p, *path)))
    return None


def _path_forward(view: GraphView, tensor: str, through: frozenset[str], to: frozenset[str]):
    """The first consumer of op `to` reached from `tensor` through ops in `through`."""
    queue = deque([(tensor, ())])
    seen = set()
    while queue:
        t, path = queue.popleft()
        for c in view.consumers.get(t, []):
            if c in seen or len(path) > _MAX_HOPS:
                continue
            seen.add(c)
            op = view.nodes[c].op_type
            if op in to:
                return c, path
            if op in through:
                queue.extend((o, (*path, c)) for o in view.nodes[c].output if o)
    return None


def _self_attention(view: GraphView, s: int) -> AttentionUnit | None:
    node = view.nodes[s]
    back = _path_back(view, node.input[0], SCORE_OPS, PRODUCTS)
    fwd = _path_forward(view, node.output[0], PROB_OPS, PRODUCTS)
    if back is None or fwd is None:
        return None
    qk, scores = back
    av, probs = fwd
    for m in (qk, av):  # activation x activation: not a classifier head on weights
        if not all(_activation_input(view, t) for t in view.nodes[m].input if t):
            return None
    nodes = tuple(sorted({qk, *scores, s, *probs, av}))
    return AttentionUnit(
        "self-attention",
        nodes,
        av,
        f"self-attention {view.nodes[qk].name} → {node.name} → {view.nodes[av].name}",
    )


def _spatial_pool(view: GraphView, i: int) -> bool:
    node = view.nodes[i]
    if node.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
        return True
    if node.op_type != "ReduceMean":
        return False
    axes = reduce_axes(view, i)
    t = view.shape.get(node.input[0])
    if t is None or not t.tensor_type.HasField("shape"):
        return False
    rank = len(t.tensor_type.shape.dim)  # NCHW or NCDHW; [B, T, C] is not spatial
    return bool(axes) and rank >= 4 and all((a % rank) >= 2 for a in axes)


def _derives(view: GraphView, tensor: str, x: str, pool: int) -> bool:
    """Whether `tensor` is computed from `x` within `_MAX_HOPS` nodes (x itself included),
    not through the pool `pool` (a SiLU's `h * sigmoid(h)` inside the branch is computed
    from the pooled value: no feature of x). Breadth first: a node is first met on its
    shortest path, so a long path to it never hides a short one."""
    queue, seen = deque([(tensor, 0)]), set()
    while queue:
        t, hops = queue.popleft()
        if t == x:
            return True
        p = view.producer.get(t)
        if p is None or p == pool or p in seen or hops >= _MAX_HOPS:
            continue
        seen.add(p)
        queue.extend((i, hops + 1) for i in view.nodes[p].input if i)
    return False


def _gates(view: GraphView, mul: int, gate: str, x: str, pool: int) -> bool:
    """A Mul of the branch's output `gate` with the pooled tensor `x` or features computed
    from it: KBNet's `x * x1 * sca` gates convolutions of the pooled tensor, not the tensor
    itself (`attention` found no block in it, and `layernorm_after_attention` no norm)."""
    return any(_derives(view, t, x, pool) for t in view.nodes[mul].input if t and t != gate)


def _channel_attention(view: GraphView, g: int) -> AttentionUnit | None:
    """Pool → branch → Mul(x, ·), where x is the pooled tensor or computed from it."""
    x = view.nodes[g].input[0]
    queue = deque([(view.nodes[g].output[0], ())])
    seen: set[int] = set()
    while queue:
        t, path = queue.popleft()
        for c in view.consumers.get(t, []):
            node = view.nodes[c]
            if node.op_type == "Mul" and path and _gates(view, c, t, x, g):
                nodes = tuple(sorted({g, *path, c}))
                return AttentionUnit(
                    "channel-attention",
                    nodes,
                    c,
                    f"channel attention {view.nodes[g].name} → {node.name}",
                )
            if c in seen or len(path) >= _MAX_HOPS or node.op_type not in BRANCH_OPS:
                continue
            if x in node.input:  # the branch rejoined x some other way: not a gate
                continue
            seen.add(c)
            queue.extend((o, (*path, c)) for o in node.output if o)
    return None


def attention_units(view: GraphView) -> tuple[AttentionUnit, ...]:
    """Every attention block in the graph; blocks never overlap."""
    return tuple(_find_attention_units(view))


def _find_attention_units(view: GraphView) -> list[AttentionUnit]:
    units: list[AttentionUnit] = []
    taken: set[int] = set()
    for i, node in enumerate(view.nodes):
        unit = None
        if node.op_type in FUSED_ATTENTION:
            unit = AttentionUnit(node.op_type, (i,), i, f"{node.op_type} op")
        elif node.op_type == "Softmax":
            unit = _self_attention(view, i)
        elif _spatial_pool(view, i):
            unit = _channel_attention(view, i)
        if unit is not None and taken.isdisjoint(unit.nodes):
            units.append(unit)
            taken.update(unit.nodes)
    return units


def norms_after_attention(
    view: GraphView, attention: Sequence[AttentionUnit], units: Sequence[Any]
) -> dict[int, str]:
    """Normalization units whose input an attention block reaches without another norm between.

    One forward pass in topological order: each node carries the nearest
    attention block whose output flows into it through projections, residual
    adds, gates, activations and layout ops. A normalization unit stops the
    flow; whatever else (pooling, a reduction) also stops it. The units come from
    the caller (`graph.analysis.Analysis` finds each once), so this module needs
    nothing above it.
    """
    ends = {unit.output: unit for unit in attention}
    in_norm = {i for unit in units for i in unit.nodes}
    carried: list[tuple[str, int] | None] = [None] * len(view.nodes)
    for i, node in enumerate(view.nodes):
        if i in in_norm:
            continue
        if i in ends:
            carried[i] = (view.nodes[i].name, 0)
            continue
        if node.op_type not in CARRIERS:
            continue
        found = [carried[p] for p in view.predecessors(i) if carried[p] is not None]
        if found:
            name, hops = min(found, key=lambda f: f[1])
            carried[i] = (name, hops + 1)
    out: dict[int, str] = {}
    for unit in units:
        p = view.producer.get(unit.x) if unit.x else None
        if p is None or carried[p] is None:
            continue
        name, hops = carried[p]
        why = f"{unit.reason}, fed by attention at {name} ({hops + 1} node(s) on, no norm between)"
        out.update(dict.fromkeys(unit.nodes, why))
    return out
