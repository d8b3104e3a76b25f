"""The DQs of scalar constants, dequantized into weights: a quantized constant TensorRT refuses.

Why: TensorRT takes a quantized constant of rank 0 nowhere ("Quantized constant (q) is only
allowed before DQ or PLUGIN_V2 or kPLUGIN_V3 node", when the engine is built; one of shape
[1] it takes). ONNX Runtime's `quantize_static` quantizes a GELU's scalar constants (0.5,
1/sqrt(2)) so, and TensorRT-RTX refused a Whisper encoder quantized as docs/quantized.md
says (exit 3) while `check` passed. A DQ of a constant is a constant: its value as
`DequantizeLinear` computes it (`qdq.dequantize`, the value ONNX Runtime's FP32 reference
computes) is what the graph means, and the ops reading it compute in the policy's precision
as with any weight. Only scalars: a DQ TensorRT takes stays, as it will run it.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from trtbuild.graph.optypes import as_float_type
from trtbuild.graph.qdq import QdqGraph, QdqNode, dequantize
from trtbuild.graph.view import GraphView, constant
from trtbuild.passes.basic import PassRecord, copied, drop_unused_initializers

# What a DQ of a constant may hold here: integers `qdq.dequantize` reads as they are stored
# (an INT4 weight is packed, an FP8 one is stored as bytes: left to TensorRT's own rules)
_STORED = frozenset(
    {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
)


def dequantize_scalar_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Each DQ of a scalar constant in the main graph becomes a weight of its output's name;
    the Q/DQ weights no node reads any more are dropped."""
    record = PassRecord("dequantize_scalar_weights")
    view = GraphView(model)
    found = [n for n in QdqGraph(view).nodes.values() if _scalar_weight(view, n)]
    if not found:
        return model, record
    model = copied(model)  # passes never change their input
    graph, gone = model.graph, {n.index for n in found}
    kept = [node for i, node in zip(view.top, graph.node) if i not in gone]  # the main graph's
    del graph.node[:]
    graph.node.extend(kept)
    for n in found:
        stored = constant(view, n.quantized)
        value = dequantize(stored, n.scale_value, n.zero_value, n.axis, n.block_size)
        dtype = view.dtype.get(n.float_tensor) or view.dtype[n.scale]
        graph.initializer.append(
            numpy_helper.from_array(as_float_type(value, dtype), n.float_tensor)
        )
        readers = sorted({view.nodes[c].op_type for c in view.consumers.get(n.float_tensor, [])})
        record.details.setdefault("dequantized", []).append(
            {
                "name": n.name,
                "why": f"a quantized scalar (TensorRT takes none), read by {', '.join(readers)}",
            }
        )
        record.changed += 1
    drop_unused_initializers(model)  # the quantized scalars, scales and zero points read no more
    return model, record


def _scalar_weight(view: GraphView, n: QdqNode) -> bool:
    """A DQ in the main graph of an integer constant of rank 0, with a constant scale and
    zero point, whose output is no graph output."""
    i = n.index
    if not n.is_dq or view.parent[i] is not None or n.float_tensor in view.outputs:
        return False
    stored = constant(view, n.quantized)
    if view.dtype.get(n.quantized) not in _STORED or stored is None or stored.ndim != 0:
        return False
    return n.scale_value is not None and not (n.zero_point and n.zero_value is None)
