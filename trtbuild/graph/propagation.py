"""Where a non-finite value must show: the tensors downstream of which no op can hide it.

Why: the judge tells an overflow an output masks (an inf that a Clip, a Relu or
a Softmax turns finite again) from a per-tensor sum placed in the candidate's
own run, and a sum reads its whole tensor again. An inf or a NaN that enters
`Add`, `Mul`, a stride-1 `Conv` or a reshape always leaves a non-finite value in
the op's output (inf * 0 and inf - inf are NaN), so the sum of that output sees
it too. Only a tensor none of whose readers pass its non-finite values on to
an observed tensor needs a sum of its own; the walk that confirms a suspect
then finds the first tensor that turned non-finite, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import onnx

from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.optypes import FLOAT_TYPES

_ALL = None  # every input
_FIRST = (0,)

# op -> the inputs each of whose values reaches some output value through arithmetic
# that keeps a non-finite value non-finite (IEEE: inf * 0, inf - inf and any op on NaN
# give NaN). Not: ops that select or clamp (Relu, Clip, Max, Slice, Gather, MaxPool,
# Where, Resize), that squash (Sigmoid, Tanh, Softmax, Exp of -inf), a divisor (x / inf
# is 0), strided or dilated windows (positions no window reads), nor Gemm (alpha = 0).
PROPAGATES: Mapping[str, tuple[int, ...] | None] = {
    "Add": _ALL,
    "Sub": _ALL,
    "Mul": _ALL,
    "Sum": _ALL,
    "Mean": _ALL,
    "Concat": _ALL,
    "MatMul": _ALL,
    "Div": _FIRST,
    "Neg": _FIRST,
    "Abs": _FIRST,
    "Sqrt": _FIRST,
    "Log": _FIRST,
    "Identity": _FIRST,
    "Reshape": _FIRST,
    "Flatten": _FIRST,
    "Squeeze": _FIRST,
    "Unsqueeze": _FIRST,
    "Transpose": _FIRST,
    "Expand": _FIRST,
    "DepthToSpace": _FIRST,
    "SpaceToDepth": _FIRST,
    "ReduceSum": _FIRST,
    "ReduceMean": _FIRST,
    "ReduceSumSquare": _FIRST,
    "GlobalAveragePool": _FIRST,
    "LayerNormalization": _FIRST,
    "InstanceNormalization": _FIRST,
    "GroupNormalization": _FIRST,
    "BatchNormalization": _FIRST,
    "Cast": _FIRST,  # to a float type only (`_passes_on`)
    "Conv": _FIRST,  # every stride and dilation 1 only (`_passes_on`)
}


def _passes_on(node: onnx.NodeProto, index: int) -> bool:
    """Whether a non-finite value in `node`'s input `index` leaves one in its output."""
    if node.domain not in DEFAULT_DOMAINS or len(node.output) != 1:
        return False
    inputs = PROPAGATES.get(node.op_type, ())
    if inputs is not _ALL and index not in inputs:
        return False
    if node.op_type not in ("Cast", "Conv"):
        return True
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Cast":
        return attrs.get("to") in FLOAT_TYPES | {onnx.TensorProto.DOUBLE}
    # Conv: stride 1, dilation 1: some window reads every position
    return all(s == 1 for s in attrs.get("strides", ())) and all(
        d == 1 for d in attrs.get("dilations", ())
    )


def unobserved(
    model: onnx.ModelProto,
    tensors: Iterable[str],
    sinks: Iterable[str],
    shapes: Mapping[str, tuple] | None = None,
) -> set[str]:
    """The fewest of `tensors` to sum so that a non-finite value in any of them shows in a
    sum or in one of `sinks` (the outputs compared value by value).

    Walks the main graph backwards: a tensor is observed where it is a sink, is
    summed, or feeds an op that passes non-finite values on (`PROPAGATES`) into
    an observed tensor that is not empty in `shapes` (the reference's, where
    known). A tensor of `tensors` that is not observed is summed.
    """
    wanted, shapes = set(tensors), shapes or {}
    observed = set(sinks)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, k))
    summed: set[str] = set()
    for node in reversed(model.graph.node):
        for out in node.output:
            if out not in observed and any(
                len(r.output) == 1  # (`_passes_on` asks it too) the cheap test first
                and r.output[0] in observed
                and _passes_on(r, k)
                and not _empty(shapes, r.output[0])
                for r, k in readers.get(out, ())
            ):
                observed.add(out)
            if out in wanted and out not in observed:
                summed.add(out)
                observed.add(out)
    return summed | (wanted - {o for n in model.graph.node for o in n.output})


def _empty(shapes: Mapping[str, tuple], name: str) -> bool:
    shape = shapes.get(name)
    return shape is not None and math.prod(shape) == 0
