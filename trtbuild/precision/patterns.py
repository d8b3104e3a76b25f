"""Structural patterns and graph measures used by match keys.

Why structure, not names: users know their failures by shape ("the LayerNorm",
"the last reduction"), and names differ across exporters and versions. Each
finder returns node index -> reason; a unit (every node of a decomposed
LayerNorm) is matched as a whole so it is never split across precisions.
"""

from __future__ import annotations

import math
from collections import deque

from onnx import helper

from trtbuild.errors import UsageError
from trtbuild.precision.graphview import GraphView

FUSED_NORMS = frozenset(
    {
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "RMSNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
    }
)
REDUCTIONS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "GlobalAveragePool",
        "GlobalMaxPool",
    }
)
NOT_YET = {"attention", "layernorm_after_attention"}


def find(pattern: str, view: GraphView, last: int | None = None) -> dict[int, str]:
    if pattern in NOT_YET:
        raise UsageError(
            f"match.pattern '{pattern}' is not implemented in this version of trtbuild",
            hint="use pattern: layernorm, or match by 'name' and 'op' for now",
        )
    if pattern == "layernorm":
        return {i: reason for unit, reason in norm_units(view) for i in unit}
    if pattern == "softmax":
        return {
            i: f"{n.op_type}"
            for i, n in enumerate(view.nodes)
            if n.op_type in ("Softmax", "LogSoftmax")
        }
    if pattern == "final_reductions":
        return final_reductions(view, last)
    raise UsageError(f"unknown pattern '{pattern}'")


# -- normalization units --------------------------------------------------------


def _consumers(view: GraphView, tensor: str, op: str | tuple[str, ...]) -> list[int]:
    ops = (op,) if isinstance(op, str) else op
    return [c for c in view.consumers.get(tensor, []) if view.nodes[c].op_type in ops]


def _is_scalar_const(view: GraphView, tensor: str, value: float | None = None) -> bool:
    if tensor not in view.initializers:
        return False
    arr = view.initializer_array(tensor)
    return arr.size == 1 and (value is None or float(arr.ravel()[0]) == value)


def _square_of(view: GraphView, x: str) -> int | None:
    """Pow(x, 2) or Mul(x, x) consuming x."""
    for c in view.consumers.get(x, []):
        n = view.nodes[c]
        if n.op_type == "Pow" and n.input[0] == x and _is_scalar_const(view, n.input[1], 2.0):
            return c
        if n.op_type == "Mul" and n.input[0] == x and n.input[1] == x:
            return c
    return None


def _normalise_tail(view: GraphView, x: str, sq: int) -> list[int] | None:
    """From x² onwards: ReduceMean → Add(eps) → Sqrt → Div(x, ·) | Reciprocal → Mul(x, ·)."""
    chain = []
    mean = _consumers(view, view.nodes[sq].output[0], "ReduceMean")
    if not mean:
        return None
    add = _consumers(view, view.nodes[mean[0]].output[0], "Add")
    if not add:
        return None
    sqrt = _consumers(view, view.nodes[add[0]].output[0], "Sqrt")
    if not sqrt:
        return None
    chain = [sq, mean[0], add[0], sqrt[0]]
    std = view.nodes[sqrt[0]].output[0]
    div = [c for c in _consumers(view, std, "Div") if view.nodes[c].input[0] == x]
    if div:
        return [*chain, div[0]]
    for r in _consumers(view, std, "Reciprocal"):
        mul = [
            c for c in _consumers(view, view.nodes[r].output[0], "Mul") if x in view.nodes[c].input
        ]
        if mul:
            return [*chain, r, mul[0]]
    return None


def _affine(view: GraphView, unit: list[int]) -> list[int]:
    """The optional Mul(weight) and Add(bias) by initializers after a normalization."""
    for op in ("Mul", "Add"):
        out = view.nodes[unit[-1]].output[0]
        nxt = view.consumers.get(out, [])
        if len(nxt) == 1 and view.nodes[nxt[0]].op_type == op:
            other = [t for t in view.nodes[nxt[0]].input if t != out]
            if other and all(t in view.initializers for t in other):
                unit = [*unit, nxt[0]]
                continue
        break
    return unit


def norm_units(view: GraphView) -> list[tuple[list[int], str]]:
    """Every normalization unit: fused ops, decomposed LayerNorm (any axis), decomposed RMSNorm."""
    units, taken = [], set()
    for i, n in enumerate(view.nodes):
        if n.op_type in FUSED_NORMS:
            units.append(([i], f"{n.op_type} op"))
            taken.add(i)
    for i, n in enumerate(view.nodes):  # LayerNorm: mean, x - mean, then the RMS tail on d
        if n.op_type != "ReduceMean" or i in taken:
            continue
        x, m = n.input[0], n.output[0]
        subs = [c for c in _consumers(view, m, "Sub") if view.nodes[c].input[:2] == [x, m]]
        if not subs:
            continue
        d = view.nodes[subs[0]].output[0]
        sq = _square_of(view, d)
        tail = _normalise_tail(view, d, sq) if sq is not None else None
        if tail is None:
            continue
        unit = _affine(view, [i, subs[0], *tail])
        if taken.isdisjoint(unit):
            units.append((unit, f"decomposed LayerNorm unit from {n.name}"))
            taken.update(unit)
    for i, n in enumerate(view.nodes):  # RMSNorm: no centring
        if i in taken or n.op_type not in ("Pow", "Mul"):
            continue
        x = n.input[0]
        if _square_of(view, x) != i:
            continue
        tail = _normalise_tail(view, x, i)
        if tail is None:
            continue
        unit = _affine(view, tail)
        if taken.isdisjoint(unit):
            units.append((unit, f"decomposed RMSNorm unit from {n.name}"))
            taken.update(unit)
    return units


# -- reductions -----------------------------------------------------------------


def final_reductions(view: GraphView, last: int | None) -> dict[int, str]:
    """Reductions with no further reduction on any path to a graph output; the `last` nearest."""
    n = len(view.nodes)
    downstream = [False] * n  # a reduction lies strictly downstream
    for i in range(n - 1, -1, -1):
        downstream[i] = any(
            view.nodes[s].op_type in REDUCTIONS or downstream[s] for s in view.successors(i)
        )
    finals = [
        i
        for i, node in enumerate(view.nodes)
        if node.op_type in REDUCTIONS and not downstream[i] and view.reaches_output[i]
    ]
    dist = _distance_to_outputs(view)
    finals.sort(key=lambda i: (dist.get(i, math.inf), -i))
    chosen = finals if last is None else finals[:last]
    return {i: f"final reduction ({dist.get(i, 0)} node(s) from an output)" for i in chosen}


def _distance_to_outputs(view: GraphView) -> dict[int, int]:
    dist: dict[int, int] = {}
    queue = deque()
    for out in view.outputs:
        if out in view.producer:
            dist[view.producer[out]] = 0
            queue.append(view.producer[out])
    while queue:
        i = queue.popleft()
        for p in view.predecessors(i):
            if p not in dist:
                dist[p] = dist[i] + 1
                queue.append(p)
    return dist


def _dims(view: GraphView, tensor: str) -> list[int | None] | None:
    t = view.shape.get(tensor)
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim]


def reduction_depth(view: GraphView, index: int) -> int | None:
    """How many products one output element accumulates (ModelOpt's reduction depth).

    None where the op does not accumulate or the shapes are unknown.
    """
    node = view.nodes[index]
    op = node.op_type
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x = _dims(view, node.input[0]) if node.input else None
    if x is None:
        return None
    if op == "MatMul":
        return x[-1] if x and x[-1] else None
    if op == "Gemm":
        k = x[0] if attrs.get("transA", 0) else x[-1]
        return k or None
    if op in ("Conv", "ConvTranspose"):
        w = _dims(view, node.input[1]) if len(node.input) > 1 else None
        if not w or any(d is None for d in w[1:]):
            return None
        return math.prod(w[1:])  # (C_in / group) * kernel elements
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        spatial = x[2:]
        return math.prod(spatial) if spatial and None not in spatial else None
    if op.startswith("Reduce"):
        axes = attrs.get("axes")
        if axes is None and len(node.input) > 1 and node.input[1] in view.initializers:
            axes = view.initializer_array(node.input[1]).tolist()
        if axes is None:
            axes = [] if attrs.get("noop_with_empty_axes", 0) else list(range(len(x)))
        dims = [x[a] for a in axes]
        return math.prod(dims) if dims and None not in dims else None
    return None
