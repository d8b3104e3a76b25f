"""Structural patterns and graph measures used by match keys.

Patterns (`layernorm`, `attention`, ...) are not implemented yet: a policy that
names one fails with a clear message rather than silently matching nothing.
"""

from __future__ import annotations

import math

from onnx import helper

from trtbuild.errors import UsageError
from trtbuild.precision.graphview import GraphView


def find(pattern: str, view: GraphView, last: int | None = None) -> dict[int, str]:
    raise UsageError(
        f"match.pattern '{pattern}' is not implemented in this version of trtbuild",
        hint="match the unit by 'name' and 'op' for now (see policies/nafnet.yaml)",
    )


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
