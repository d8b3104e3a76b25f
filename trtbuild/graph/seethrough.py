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

from trtbuild.graph.qdq import QdqGraph, QdqNode
from trtbuild.graph.view import GraphView

# the formats whose constants are dequantized here: the integers' saturation bounds, and
# the FP8 types' (ml_dtypes, which onnx's numpy_helper reads them as) with their largest value
_INTEGER_FORMATS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                    "uint16": (0, 65535), "int32": (-(2**31), 2**31 - 1)}  # fmt: skip
_FLOAT_FORMATS = {"fp8": ("float8_e4m3fn", 448.0), "fp8e5m2": ("float8_e5m2", 57344.0)}


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
    known = dq.format in _INTEGER_FORMATS or dq.format in _FLOAT_FORMATS
    if not known or dq.scale_value is None or _blocked(view, dq):
        return None
    if q is None:
        if dq.quantized not in view.initializers:
            return None
        stored = view.initializer_array(dq.quantized)
    else:
        if q.float_tensor not in view.initializers or q.scale_value is None or _blocked(view, q):
            return None
        stored = _quantize(view.initializer_array(q.float_tensor), q)
    zero = dq.zero_value if dq.zero_value is not None else np.zeros(1, np.int64)
    with np.errstate(over="ignore"):  # a sentinel (finfo.min) quantized and back may be inf
        return (
            (stored.astype(np.float64) - _along(zero, dq, stored.ndim))
            * _along(dq.scale_value, dq, stored.ndim)
        ).astype(np.float32)


def _blocked(view: GraphView, node: QdqNode) -> bool:
    """Blocked quantization (opset 21 `block_size`) is left as it is."""
    return any(a.name == "block_size" and a.i for a in view.nodes[node.index].attribute)


def _along(values: np.ndarray, node: QdqNode, rank: int) -> np.ndarray:
    """A per-tensor or per-axis scale or zero point, broadcastable against the data."""
    values = np.asarray(values, np.float64)
    if values.size == 1 or node.axis is None or rank == 0:
        return values.reshape(())
    shape = [1] * rank
    shape[node.axis % rank] = values.size
    return values.reshape(shape)


def _quantize(x: np.ndarray, q: QdqNode) -> np.ndarray:
    """QuantizeLinear on a constant: round half to even, saturate (ONNX's definition); FP8
    rounds to its nearest value (ml_dtypes) after saturating to its largest."""
    scaled = x.astype(np.float64) / _along(q.scale_value, q, x.ndim)
    if q.format in _FLOAT_FORMATS:
        import ml_dtypes

        kind, top = _FLOAT_FORMATS[q.format]
        return np.clip(scaled, -top, top).astype(getattr(ml_dtypes, kind)).astype(np.float64)
    low, high = _INTEGER_FORMATS[q.format]
    zero = q.zero_value if q.zero_value is not None else np.zeros(1, np.int64)
    return np.clip(np.rint(scaled) + _along(zero, q, x.ndim), low, high)


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
