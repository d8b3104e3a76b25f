"""The precision of Q/DQ nodes: decided by the float ops around them, never by a rule.

Why a stage of its own: in a strongly typed network a DequantizeLinear's output
type is its scale's type, and TensorRT fuses a DQ into the Conv/MatMul/Gemm (or
residual Add) it feeds only when nothing stands between them. So a DQ computes
in the precision of the op it feeds (a DQ shared by ops of two precisions is
cloned, one per precision, in `convert`), a Q in the precision of its input, and
an FP32 pin on a quantized op keeps its INT8 math: its DQs give it FP32. A Q/DQ
group (a Q and its DQs, or a weight's DQ) keeps one scale value; a scale that
the low precision cannot hold (zero, subnormal, above 65504 for FP16) keeps
its whole group in FP32, and the op it feeds with it, named in a warning; so do
the values of a DQ of a constant that the low precision turns inf (a quantized
-1e6 mask at a scale FP16 holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from trtbuild.graph.optypes import DTYPE_NAME, PRECISION_DTYPE, as_float_type
from trtbuild.graph.qdq import SCALE_OPSET, QdqGraph, holds, unheld
from trtbuild.graph.view import GraphView
from trtbuild.numerics import LOW_INF_AT, LOW_MAX

QDQ_RULE = "qdq"  # the `rule` of a Q/DQ node's decision: it follows the ops around it
# a layout op between a DQ and the op TensorRT fuses it with (DQ -> Transpose -> MatMul)
LAYOUT_RULE = "qdq-layout"
# an op kept FP32 because a scale it reads, or a constant's dequantized values, do not fit the
# low type
SCALE_RULE = "qdq-scale"


@dataclass(frozen=True)
class QdqPlan:
    """Per Q/DQ node (and layout op of a DQ's path, `QdqGraph.layout`): its precision and
    why; per DQ: every precision its consumers need (the first is the DQ's own; `convert`
    clones the DQ for each other one)."""

    precision: dict[int, str]
    reasons: dict[int, str]
    dq_precisions: dict[int, tuple[str, ...]]
    dead: frozenset[int] = frozenset()  # left without a consumer by `dequantize: true` rules


def promote_for_scales(
    view: GraphView,
    qdq: QdqGraph,
    precision_of: list[str | None],
    dequantized: frozenset[int] = frozenset(),
    peaks: Mapping[int, float] | None = None,
) -> tuple[dict[int, str], list[str]]:
    """Ops a DQ feeds whose low precision cannot hold the DQ's group's scale, or the values
    it dequantizes from a constant (`peaks`: `Analysis.dequantized_peaks`): they go FP32.

    Every consumer, not only the ops TensorRT fuses with a DQ (Conv, ConvTranspose,
    MatMul, Gemm, the residual Add): nothing stands between a DQ and what it feeds,
    and a scale above FP16's range dequantizes to values beyond it (a quantized
    attention-mask constant of -3.4e38 has a scale of 2.7e36); a scale FP16 holds may
    too (a -1e6 mask at a scale of 7874 turned inf in an FP16 DQ, where the same
    constant as a float weight is pinned by guard:weight-range).
    """
    promoted: dict[int, str] = {}
    warnings: list[str] = []
    lows: set[str] = set()
    for group in qdq.groups:
        scale = qdq.group_scale(group)
        for dq in group.dqs:
            for c in qdq.fed_by(dq):
                p = precision_of[c]
                if p in (None, "fp32") or c in promoted or c in qdq.nodes or c in dequantized:
                    continue
                unfit = _unfit(qdq, dq, scale, p, peaks)
                if unfit is None:
                    continue
                promoted[c] = unfit[0]
                lows.add(p.upper())
                warnings.append(
                    f"{view.nodes[c].name} ({view.nodes[c].op_type}) stays FP32 with its "
                    f"Q/DQ pair: {unfit[0]}; {unfit[1]}"
                )
    return promoted, _at_most(warnings, " or ".join(sorted(lows)))


def _unfit(
    qdq: QdqGraph,
    dq: int,
    scale: np.ndarray | None,
    p: str,
    peaks: Mapping[int, float] | None,
) -> tuple[str, str] | None:
    """Why DQ `dq` cannot compute in the low precision `p` (its reason, and what is kept), or
    None where it can: its group's `scale` does not fit `p`, or its values from a constant
    (`peaks`) reach `numerics.LOW_INF_AT`, where `p` stores them as inf (below it a value
    rounds to the largest, as the overflow warnings measure it)."""
    name = qdq.nodes[dq].name
    if not holds(scale, PRECISION_DTYPE[p]):
        value = _extreme(scale, PRECISION_DTYPE[p])
        return f"the scale of {name} ({value}) does not fit {p.upper()}", KEPT_SCALE
    peak = (peaks or {}).get(dq, 0.0)
    if peak < LOW_INF_AT.get(p, np.inf):
        return None
    why = (
        f"the values of {name} reach {peak:.4g}, past {p.upper()}'s range "
        f"(±{LOW_MAX[p]:.6g}): {p.upper()} stores them as inf"
    )
    return why, "a weight that large is kept FP32, as guard:weight-range keeps a float one"


KEPT_SCALE = "the scale is kept, never flushed"


SCALE_WARNINGS = 8  # ops named one by one; the rest counted in one line


def _at_most(warnings: list[str], low: str) -> list[str]:
    """The first `SCALE_WARNINGS` warnings and one that counts the rest.

    Why: ModelOpt's FP16 DeepLabV3 on random weights has 102 ops whose scales FP16 cannot
    hold; a line for each buried the verdict, and `check` lists each op (rule `qdq-scale`).
    """
    if len(warnings) <= SCALE_WARNINGS + 1:
        return warnings
    more = len(warnings) - SCALE_WARNINGS
    rest = (
        f"{more} more op(s) stay FP32 with their Q/DQ pairs for scales or dequantized values "
        f"{low} cannot hold, each kept, never flushed (`trtbuild check` lists them: rule "
        f"{SCALE_RULE})"
    )
    return [*warnings[:SCALE_WARNINGS], rest]


def plan(
    view: GraphView,
    qdq: QdqGraph,
    precision_of: list[str | None],
    dequantized: frozenset[int] = frozenset(),
    peaks: Mapping[int, float] | None = None,
) -> QdqPlan:
    """Every Q/DQ node's precision, from the final precisions of the other nodes.

    A DQ whose every consumer is `dequantized` (it reads around the DQ) is dead; a
    Q is dead when all its DQs are and nothing else reads its output. `peaks`: as
    `promote_for_scales`'.
    """
    precision: dict[int, str] = {}
    reasons: dict[int, str] = {}
    dq_precisions: dict[int, tuple[str, ...]] = {}
    dead: set[int] = set()
    low_ok = view.opset >= SCALE_OPSET
    for i, n in qdq.nodes.items():
        if not n.is_dq:
            continue
        readers = view.consumers.get(n.float_tensor, [])
        around = dequantized if read_around(view, qdq, i) else frozenset()
        if (
            readers
            and all(qdq.layout.get(c, c) in around for c in readers)
            and n.float_tensor not in view.outputs
        ):
            dead.add(i)
        wanted = _dq_wants(qdq, i, readers, precision_of, around, low_ok, peaks)
        dq_precisions[i] = tuple(dict.fromkeys(wanted)) or ("fp32",)
        precision[i] = dq_precisions[i][0]
        reasons[i] = "a DQ computes in the precision of the ops it feeds" + (
            f" (cloned for {', '.join(dq_precisions[i][1:])})" if len(dq_precisions[i]) > 1 else ""
        )
    _layout_precisions(view, qdq, precision_of, low_ok, precision, reasons, peaks)
    for i, n in qdq.nodes.items():
        if n.is_dq:
            continue
        p = view.producer.get(n.float_tensor)
        mine = precision.get(p) if p in qdq.nodes else (precision_of[p] if p is not None else None)
        mine = mine or DTYPE_NAME.get(view.dtype.get(n.float_tensor, 0), "fp32")
        fits = low_ok and mine != "fp32" and holds(n.scale_value, PRECISION_DTYPE[mine])
        precision[i] = mine if fits else "fp32"
        reasons[i] = "a Q computes in the precision of its input" + (
            "" if precision[i] == mine else f"; its scale does not fit {mine.upper()}"
        )
    for g in qdq.groups:
        readers = view.consumers.get(qdq.nodes[g.q].quantized, []) if g.q is not None else []
        if (
            g.q is not None
            and g.dqs
            and all(d in dead for d in g.dqs)
            and len(readers) == len(g.dqs)
            and qdq.nodes[g.q].quantized not in view.outputs  # handed out: it stays
        ):
            dead.add(g.q)
    return QdqPlan(precision, reasons, dq_precisions, frozenset(dead))


def read_around(view: GraphView, qdq: QdqGraph, dq: int) -> bool:
    """Whether a `dequantize: true` op reads around DQ `dq`: its quantized input is a weight
    (made float once) or a Q's output (the tensor in front of the Q is read). A DQ of an INT8
    graph input, or of a Q's output moved by a Reshape, stays and is read as it is (its
    input was looked up as a weight: KeyError, exit 70)."""
    t = qdq.nodes[dq].quantized
    return t in view.initializers or view.producer.get(t) in qdq.nodes


def _dq_wants(
    qdq: QdqGraph,
    dq: int,
    readers: list[int],
    precision_of: list[str | None],
    dequantized: frozenset[int],
    low_ok: bool,
    peaks: Mapping[int, float] | None = None,
) -> list[str]:
    """The precision each reader of a DQ needs it in: the reader's own (a layout chain's: the
    op's behind it), FP32 where the group's scale or the DQ's values from a constant do not
    fit that type (`_unfit`); none for a reader that reads around the DQ (`dequantize: true`
    on it, or on the op behind its chain)."""
    scale = qdq.group_scale(qdq.group_of[dq])
    wanted = []
    for c in readers:
        op = qdq.layout.get(c, c)
        p = precision_of[op] if c not in qdq.nodes and op not in dequantized else None
        if p is not None:
            fits = p == "fp32" or (low_ok and _unfit(qdq, dq, scale, p, peaks) is None)
            wanted.append(p if fits else "fp32")
    return wanted


def _layout_precisions(
    view: GraphView,
    qdq: QdqGraph,
    precision_of: list[str | None],
    low_ok: bool,
    precision: dict[int, str],
    reasons: dict[int, str],
    peaks: Mapping[int, float] | None = None,
) -> None:
    """Each layout op of a DQ's path (DQ -> Transpose -> MatMul) computes as the op behind
    it, so no Cast stands inside the path (into `precision` and `reasons`)."""
    for c, op in qdq.layout.items():
        dq = qdq.dq_behind(view.nodes[c].output[0])
        p = precision_of[op]
        if dq is None or p is None:
            continue
        scale = qdq.group_scale(qdq.group_of[dq])
        fits = p == "fp32" or (low_ok and _unfit(qdq, dq, scale, p, peaks) is None)
        precision[c] = p if fits else "fp32"
        reasons[c] = (
            f"moves the values of {qdq.nodes[dq].name} into {view.nodes[op].name}, which "
            "TensorRT fuses with it: computes as that op"
        )


def group_value(qdq: QdqGraph, i: int, dtypes: set[int]) -> np.ndarray | None:
    """The scale Q/DQ `i` holds, as float32, when its group's members compute in `dtypes`.

    Where any member holds the group's scales in a low type, that type's rounding is
    the value, and FP32 members hold the same rounded value: a Q and its DQ never
    disagree. Each member keeps its own scale (a requantizing pair keeps both).
    """
    value = qdq.nodes[i].scale_value
    if value is None:
        return None
    value = np.asarray(value, dtype=np.float32)
    whole = qdq.group_scale(qdq.group_of[i])
    for d in sorted(dtypes):
        if d != PRECISION_DTYPE["fp32"] and holds(whole, d):
            return as_float_type(value, d).astype(np.float32)
    return value


def _extreme(scale: np.ndarray | None, dtype: int) -> str:
    """The first scale value `dtype` cannot hold (`unheld`), for a warning."""
    if scale is None:
        return "not a constant"
    v = np.asarray(scale, dtype=np.float64).ravel()
    bad = v[unheld(v, dtype)]
    return f"{(bad if bad.size else v)[0]:.3g}"
