"""The float graph under a quantized one: every Q→DQ pair and weight DQ seen through.

Why: the structural finders (normalization units, attention blocks, final
reductions) and the passes built on them match float ops that feed each other
directly. A Q/DQ graph puts a QuantizeLinear→DequantizeLinear pair between
them (ONNX Runtime's `quantize_static` after every Add, Mul and Div; ModelOpt
before every Conv and MatMul) and its weights behind a DequantizeLinear, so
nothing matched: 0 LayerNorms where the float model has four. Rather than teach
every matcher about Q/DQ, they run on this graph, where

- the consumers of an activation pair's DQ read the Q's input instead;
- a DQ of a constant (a weight, or a constant behind a Q) is that constant
  dequantized, exactly as DequantizeLinear computes it (an initializer named
  as the DQ's output);

and `back` maps every node of it to its index in the quantized graph. Q/DQ
nodes are no node of it, so no unit ever holds one (they are not compute).
The quantized graph is not changed; where a pair cannot be seen through (its
DQ read inside a control-flow body, or a graph output) it stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtbuild.graph.qdq import (
    FLOAT8_TYPES,
    INTEGER_BOUNDS,
    QdqGraph,
    QdqNode,
    dequantize,
    quantize,
)
from trtbuild.graph.view import GraphView


@dataclass(frozen=True)
class SeenThrough:
    """The float graph (`view`), which of its nodes is which in the quantized graph (`back`),
    and the Q/DQ nodes it sees through (indices in the quantized graph)."""

    view: GraphView
    back: tuple[int, ...]
    through: frozenset[int]
    alias: dict[str, str]  # a DQ output seen through -> the tensor its consumers read here


def see_through(view: GraphView, qdq: QdqGraph | None = None) -> SeenThrough | None:
    """The float graph of `view`, or None where it has no Q/DQ node to see through."""
    qdq = qdq if qdq is not None else QdqGraph(view)
    if not qdq:
        return None
    alias: dict[str, str] = {}
    constants: dict[str, np.ndarray] = {}
    through: set[int] = set()
    for group in qdq.groups:
        if view.scope[group.members[0]]:
            continue  # inside a body: bodies keep their pairs
        q = qdq.nodes[group.q] if group.q is not None else None
        for d in group.dqs:
            dq = qdq.nodes[d]
            if not _seeable(view, dq):
                continue
            value = _constant_through(view, q, dq)
            if value is not None:
                constants[dq.float_tensor] = value
            elif q is not None and q.float_tensor not in view.initializers:
                alias[dq.float_tensor] = q.float_tensor
            else:
                continue
            through.add(d)
        if q is not None and _unread(view, q, through):
            through.add(q.index)
    if not through:
        return None
    model, kept = _float_model(view, through, alias, constants)
    return SeenThrough(GraphView(model), tuple(kept), frozenset(through), alias)


def _seeable(view: GraphView, dq: QdqNode) -> bool:
    """Every reader of the DQ is a main-graph node, and it is no graph output."""
    out = dq.float_tensor
    return out not in view.outputs and all(not view.scope[c] for c in view.consumers.get(out, []))


def _unread(view: GraphView, q: QdqNode, through: set[int]) -> bool:
    """A Q whose output only DQs seen through read (and no graph output)."""
    readers = view.consumers.get(q.quantized, [])
    return q.quantized not in view.outputs and all(c in through for c in readers)


def _constant_through(view: GraphView, q: QdqNode | None, dq: QdqNode) -> np.ndarray | None:
    """The DQ's value where it is a constant's (a weight's, or a constant behind a Q), as
    DequantizeLinear computes it; None where it is an activation or not an integer format."""
    known = dq.format in INTEGER_BOUNDS or dq.format in FLOAT8_TYPES
    if not known or dq.scale_value is None or dq.block_size:  # blocked: left as it is
        return None
    if q is None:
        if dq.quantized not in view.initializers:
            return None
        stored = view.initializer_array(dq.quantized)
    else:
        if q.float_tensor not in view.initializers or q.scale_value is None or q.block_size:
            return None
        x = view.initializer_array(q.float_tensor)
        stored = quantize(x, q.scale_value, q.format, q.zero_value, q.axis)
    return dequantize(stored, dq.scale_value, dq.zero_value, dq.axis)


def _float_model(
    view: GraphView, through: set[int], alias: dict[str, str], constants: dict[str, np.ndarray]
) -> tuple[onnx.ModelProto, list[int]]:
    """The model without the nodes seen through, its readers renamed, its constants added;
    and the original index of each node it keeps, in `GraphView`'s order."""
    nodes = []
    for i in view.top:
        if i in through:
            continue
        node = onnx.NodeProto()
        node.CopyFrom(view.nodes[i])
        for k, t in enumerate(node.input):
            if t in alias:
                node.input[k] = alias[t]
        nodes.append(node)
    g = view.graph
    inits = [*g.initializer, *(numpy_helper.from_array(v, n) for n, v in constants.items())]
    graph = helper.make_graph(
        nodes, g.name, list(g.input), list(g.output), inits, value_info=list(g.value_info)
    )
    model = helper.make_model(graph, opset_imports=list(view.model.opset_import))
    model.ir_version = view.model.ir_version
    kept = [i for i in range(len(view.nodes)) if i not in through]
    return model, kept
