"""The DQs of scalar constants, dequantized into weights: a quantized constant TensorRT refuses.

Why: TensorRT takes a quantized constant of rank 0 nowhere ("Quantized constant (q) is only
allowed before DQ or PLUGIN_V2 or kPLUGIN_V3 node", when the engine is built; one of shape
[1] it takes). ONNX Runtime's `quantize_static` quantizes a GELU's scalar constants (0.5,
1/sqrt(2)) so, and TensorRT-RTX refused a Whisper encoder quantized as docs/quantized.md
says (exit 3) while `check` passed. A DQ of a constant is a constant: its value as
`DequantizeLinear` computes it (`qdq.dequantize`, the value ONNX Runtime's FP32 reference
computes) is what the graph means, and the ops reading it compute in the policy's precision
as with any weight. Scalars, and a DQ of any rank inside arithmetic on constants alone
that no Conv, ConvTranspose, MatMul or Gemm reads (BEiT's relative position bias table,
quantized by ONNX Runtime before its `Concat` and `Gather`: TensorRT-RTX's builder failed
on it with a Myelin check, exit 3, at every precision). A DQ TensorRT fuses into a kernel
stays, as it will run it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtbuild.graph.optypes import DEQUANTIZE, as_float_type
from trtbuild.graph.qdq import FUSED_OPS, QdqGraph, QdqNode, dequantize, quantize
from trtbuild.graph.view import GraphView, constant
from trtbuild.passes.basic import PassRecord, copied, drop_unused_initializers

# What a DQ of a constant may hold here: integers `qdq.dequantize` reads as they are stored
# (an INT4 weight is packed, an FP8 one is stored as bytes: left to TensorRT's own rules)
_BODIES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_STORED = frozenset(
    {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
)


def dequantize_scalar_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Each DQ of a scalar constant in the main graph becomes a weight of its output's name;
    the Q/DQ weights no node reads any more are dropped."""
    record = PassRecord("dequantize_scalar_weights")
    if not any(n.op_type == DEQUANTIZE for n in model.graph.node):
        return model, record  # no DQ in the main graph: not the view's 40 ms on 10k nodes, twice
    view = GraphView(model)
    qdq = QdqGraph(view)
    fixed = _constant_valued(view)
    stored = {
        n.index: v
        for n in qdq.nodes.values()
        if (v := _scalar_stored(view, qdq, n, fixed)) is not None
    }
    found = [qdq.nodes[i] for i in stored]
    if not found:
        return model, record
    model = copied(model)  # passes never change their input
    graph, gone = model.graph, {n.index for n in found} | _quantize_left(view, qdq, stored)
    kept = [node for i, node in zip(view.top, graph.node) if i not in gone]  # the main graph's
    del graph.node[:]
    graph.node.extend(kept)
    for n in found:
        value = dequantize(stored[n.index], n.scale_value, n.zero_value, n.axis, n.block_size)
        dtype = view.dtype.get(n.float_tensor) or view.dtype[n.scale]
        graph.initializer.append(
            numpy_helper.from_array(as_float_type(value, dtype), n.float_tensor)
        )
        readers = sorted({view.nodes[c].op_type for c in view.consumers.get(n.float_tensor, [])})
        record.details.setdefault("dequantized", []).append(
            {
                "name": n.name,
                "why": (
                    "a quantized scalar (TensorRT takes none)"
                    if np.ndim(value) == 0
                    else "arithmetic on constants, read by no kernel"
                )
                + f", read by {', '.join(readers)}",
            }
        )
        record.changed += 1
    drop_unused_initializers(model)  # the quantized scalars, scales and zero points read no more
    return model, record


def _scalar_stored(
    view: GraphView, qdq: QdqGraph, n: QdqNode, fixed: set[str]
) -> np.ndarray | None:
    """The integer constant a DQ in the main graph dequantizes, with a constant scale and
    zero point, its output no graph output (None: another DQ, or a Q): stored, or a
    main-graph Q's of a float constant (`_made_of_constant`) where every op that reads the
    DQ reads only constants and such DQs, so that it folds on. Of rank 0; of any rank where
    every reader computes from constants alone (`fixed`) and no kernel reads the value
    (`_reaches_a_kernel`): arithmetic on constants that TensorRT need not see quantized."""
    i = n.index
    if not n.is_dq or view.parent[i] is not None or n.float_tensor in view.outputs:
        return None
    if n.scale_value is None or (n.zero_point and n.zero_value is None):
        return None
    if view.dtype.get(n.quantized) not in _STORED:
        return None
    readers = [view.nodes[c] for c in view.consumers.get(n.float_tensor, [])]
    stored = constant(view, n.quantized)
    if stored is None and all(
        all(not t or _constant_or_pair(view, qdq, t) for t in r.input) for r in readers
    ):
        stored = _made_of_constant(view, qdq, n)
    if stored is not None and np.ndim(stored) == 0:
        return stored
    if not readers or not all(o in fixed for r in readers for o in r.output if o):
        return None  # a DQ of a weight an op of the network reads: TensorRT's to run
    if _reaches_a_kernel(view, n.float_tensor, fixed):
        return None
    return stored if stored is not None else _made_of_constant(view, qdq, n, any_rank=True)


def _constant_valued(view: GraphView) -> set[str]:
    """Every main-graph tensor computed from weights and `Constant`s alone (Q/DQs of them
    included), none from a graph input."""
    fixed = set(view.initializers)
    for i in view.top:
        node = view.nodes[i]
        drawn = node.op_type.startswith("Random") or node.op_type in ("Bernoulli", "Multinomial")
        if drawn or any(a.type in _BODIES for a in node.attribute):
            continue  # what it draws, or what a body computes: not known before it runs
        if (node.input or node.op_type == "Constant") and all(
            not t or t in fixed for t in node.input
        ):
            fixed.update(o for o in node.output if o)
    return fixed


def _reaches_a_kernel(view: GraphView, tensor: str, fixed: set[str]) -> bool:
    """Whether a Conv, ConvTranspose, MatMul or Gemm reads `tensor`, or what ops computing
    from constants alone make of it: an INT8 or FP8 weight TensorRT fuses into its kernel
    (a DQ, then a Transpose, then a MatMul), which must reach it quantized."""
    todo, seen = [tensor], {tensor}
    while todo:
        for c in view.consumers.get(todo.pop(), []):
            node = view.nodes[c]
            if node.op_type in FUSED_OPS:
                return True
            for o in node.output:
                if o and o in fixed and o not in seen:
                    seen.add(o)
                    todo.append(o)
    return False


def _made_of_constant(
    view: GraphView, qdq: QdqGraph, n: QdqNode, *, any_rank: bool = False
) -> np.ndarray | None:
    """What DQ `n`'s main-graph Q makes of a float constant of rank 0, as QuantizeLinear
    computes it. Why: ONNX Runtime's `quantize_static` quantized a MobileViT's shape
    arithmetic (`ceil(h / 2) * 2` traced to constants, a Q/DQ pair after each op, then a
    Cast to int64), which the fold leaves at each pair, and TensorRT-RTX could not compute
    the shape behind them (exit 3)."""
    q = qdq.nodes.get(view.producer.get(n.quantized, -1))
    if q is None or view.parent[q.index] is not None or q.scale_value is None or q.block_size:
        return None
    x = constant(view, q.float_tensor)
    if x is None or (x.ndim != 0 and not any_rank) or (q.zero_point and q.zero_value is None):
        return None
    return quantize(x, q.scale_value, q.format, q.zero_value, q.axis)


def _constant_or_pair(view: GraphView, qdq: QdqGraph, tensor: str) -> bool:
    """A constant, or the output of a DQ whose Q quantizes a scalar constant."""
    if constant(view, tensor) is not None:
        return True
    dq = qdq.nodes.get(view.producer.get(tensor, -1))
    return dq is not None and dq.is_dq and _made_of_constant(view, qdq, dq) is not None


def _quantize_left(view: GraphView, qdq: QdqGraph, stored: dict[int, np.ndarray]) -> set[int]:
    """The Qs whose every reader is a DQ `stored` replaces, their output no graph output."""
    left = set()
    for i in stored:
        q = view.producer.get(qdq.nodes[i].quantized)
        readers = view.consumers.get(qdq.nodes[i].quantized, [])
        unread = qdq.nodes[i].quantized not in view.outputs
        if q in qdq.nodes and unread and all(c in stored for c in readers):
            left.add(q)
    return left
