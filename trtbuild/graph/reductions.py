"""Reductions: which nodes accumulate, how many terms, and which are the last before an output.

Why in `graph/`: the precision rules (`final_reductions`, `reduction_depth_above`),
`tune`'s cost model and the benchmarks all ask these structural questions of
the same graph, and none of them owns the answer.
"""

from __future__ import annotations

import math
from collections import deque

from onnx import helper

from trtbuild.graph.norms import reduce_axes
from trtbuild.graph.view import GraphView

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
    if tensor in view.initializers:  # weights carry their shape; value_info does not list them
        return list(view.initializers[tensor].dims)
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
        axes = reduce_axes(view, index)
        if axes is None:
            axes = [] if attrs.get("noop_with_empty_axes", 0) else list(range(len(x)))
        dims = [x[a] for a in axes]
        return math.prod(dims) if dims and None not in dims else None
    return None
