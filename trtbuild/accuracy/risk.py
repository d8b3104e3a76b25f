"""Ops at risk: FP16 ops whose *internal* quantities would leave the FP16 range.

Why a list and not a verdict: what a kernel keeps in FP16 inside one op is
undocumented for TensorRT, so the default emulation (`storage`) assumes FP32
accumulation, as GPU libraries do. The report still names every FP16 op whose
internal sums, squares or variances exceed 65504 on the FP32 reference data,
so a user can pin it where the deployed kernel turns out to keep them in FP16.
`strict` emulation stores exactly the quantities listed here for means and
fused LayerNorms.

One registry (`QUANTITIES`) says, per op type, which internal quantities
exist and how to measure their peak from the op's FP32 input and output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtbuild.graph import subgraphs
from trtbuild.graph.norms import reduce_axes
from trtbuild.graph.view import GraphView
from trtbuild.numerics import LOW_INF_AT, LOW_MAX, finite_peak

# op input/output arrays and attributes -> {quantity: peak |value|}
Measure = Callable[[np.ndarray, np.ndarray, tuple[int, ...] | None], dict[str, float]]


@dataclass(frozen=True)
class Quantity:
    """How one op type's internal quantities are measured, and why they matter."""

    measure: Measure
    why: str


def _mean_sum(x: np.ndarray, y: np.ndarray, axes) -> dict[str, float]:
    count = x.size // max(y.size, 1)
    return {"sum behind the mean": finite_peak(y.astype(np.float64)) * count}


def _partial_sums(x: np.ndarray, y: np.ndarray, axes) -> dict[str, float]:
    return {
        "partial sums (bound: sum of |x|)": finite_peak(np.abs(x).sum(axis=axes, dtype=np.float64))
    }


def _sum_of_squares(x: np.ndarray, y: np.ndarray, axes) -> dict[str, float]:
    return {"sum of squares": finite_peak(y.astype(np.float64) ** 2)}


def _moments(x: np.ndarray, y: np.ndarray, axes: tuple[int, ...]) -> dict[str, float]:
    """Why in place: a normalization's input at 1024x1024 is tens of MB in float64, and
    each temporary is a pass over it (0.08 s -> 0.045 s on [1, 16, 1024, 1024], the same
    values: modnet's reference measures 17 of them at every point)."""
    sq = x.astype(np.float64)  # a copy, `x` untouched: the deviations are made in it
    count = math.prod(x.shape[a] for a in axes)
    mean = sq.mean(axis=axes, keepdims=True)
    np.subtract(sq, mean, out=sq)
    np.square(sq, out=sq)
    return {
        "sum behind the mean": finite_peak(mean) * count,
        "squared deviations": finite_peak(sq),
        "sum of squared deviations (behind the variance)": finite_peak(sq.sum(axis=axes)),
    }


def _trailing(rank: int, axis: int) -> tuple[int, ...]:
    return tuple(range(axis % rank, rank))


_STATISTICS = Quantity(_moments, "a kernel that keeps its statistics in FP16 overflows")

QUANTITIES: dict[str, Quantity] = {
    "ReduceMean": Quantity(_mean_sum, "a kernel that keeps the sum in FP16 overflows"),
    "GlobalAveragePool": Quantity(_mean_sum, "a kernel that keeps the sum in FP16 overflows"),
    "ReduceSum": Quantity(_partial_sums, "a kernel that accumulates in FP16 can overflow"),
    "ReduceL2": Quantity(_sum_of_squares, "a kernel that keeps the squares' sum in FP16 overflows"),
    "LayerNormalization": _STATISTICS,
    "InstanceNormalization": _STATISTICS,
    "GroupNormalization": _STATISTICS,
}


def _axes(view: GraphView, i: int, rank: int) -> tuple[int, ...] | None:
    """The axes an op reduces over for an input of `rank`; None where it reduces all."""
    node = view.nodes[i]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "LayerNormalization":
        return _trailing(rank, attrs.get("axis", -1))
    if node.op_type in ("InstanceNormalization", "GlobalAveragePool"):
        return tuple(range(2, rank))
    axes = reduce_axes(view, i)
    return None if axes is None else tuple(a % rank for a in axes)


_NORMS = ("LayerNormalization", "InstanceNormalization", "GroupNormalization")


def _grouped(node: onnx.NodeProto, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """A GroupNormalization's input as [N, groups, the rest] and the axis its statistics
    reduce: each group's statistics are over its channels and every position."""
    groups = next((a.i for a in node.attribute if a.name == "num_groups"), 0)
    if x.ndim < 2 or groups <= 0 or x.shape[1] % groups:
        return x, None
    return x.reshape(x.shape[0], groups, -1), (2,)


def candidates(view: GraphView) -> list[int]:
    """Nodes with internal quantities worth measuring (the reference measures these).

    Only the main graph's: ONNX Runtime hands out no tensor inside a body
    (`unmeasured` names the body nodes this leaves out).
    """
    return [i for i in view.top if view.nodes[i].op_type in QUANTITIES and view.nodes[i].input]


def unmeasured(view: GraphView, mixed: onnx.ModelProto) -> list[str]:
    """Low-precision nodes inside control-flow bodies whose internal quantities go unmeasured."""
    low = low_precision_nodes(mixed)
    return [
        n.name
        for i, n in enumerate(view.nodes)
        if view.scope[i] and n.op_type in QUANTITIES and n.name in low
    ]


def measure(view: GraphView, i: int, values: dict[str, np.ndarray]) -> dict[str, float]:
    """Peaks of node `i`'s internal quantities on one feed's FP32 values."""
    node = view.nodes[i]
    x, y = values.get(node.input[0]), values.get(node.output[0])
    if x is None or y is None or not np.issubdtype(np.asarray(x).dtype, np.floating):
        return {}
    x, y = np.asarray(x), np.asarray(y)
    if node.op_type == "GroupNormalization":  # each group's channels and positions
        x, axes = _grouped(node, x)
    else:
        axes = _axes(view, i, x.ndim) if x.ndim else None
    if node.op_type in _NORMS and not axes:
        return {}
    with np.errstate(all="ignore"):
        return QUANTITIES[node.op_type].measure(x, y, axes)


def low_precision_nodes(mixed: onnx.ModelProto) -> dict[str, str]:
    """Node name -> "fp16"/"bf16" for every node of `mixed` that computes in low precision."""
    names = {TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}
    graphs = [g for _, g in subgraphs.walk(mixed.graph)]
    dtype = {vi.name: vi.type.tensor_type.elem_type for g in graphs for vi in g.value_info}
    dtype.update({vi.name: vi.type.tensor_type.elem_type for vi in mixed.graph.output})
    out = {}
    for node in subgraphs.all_nodes(mixed):
        kind = names.get(dtype.get(node.output[0])) if node.output else None
        if kind is not None and node.op_type != "Cast":
            out[node.name] = kind
    return out


def at_risk(
    internals: dict[str, tuple[str, dict[str, float]]], mixed: onnx.ModelProto
) -> list[dict[str, object]]:
    """`report.json`'s `at_risk`: low-precision ops of `mixed` whose internals leave the range.

    `internals` is the reference's node -> (op, {quantity: peak}); no second
    emulation runs.
    """
    low = low_precision_nodes(mixed)
    found = []
    for node, (op, peaks) in internals.items():
        kind = low.get(node)
        if kind is None:
            continue
        for quantity, peak in peaks.items():
            if peak >= LOW_INF_AT[kind]:  # where storing it rounds to inf
                found.append(
                    {
                        "node": node,
                        "op": op,
                        "quantity": quantity,
                        "peak": peak,
                        "why": f"{kind.upper()} {op}: its {quantity} reach {peak:.4g} on the FP32 "
                        f"reference (max {LOW_MAX[kind]:.6g}); {QUANTITIES[op].why}",
                    }
                )
    return found
