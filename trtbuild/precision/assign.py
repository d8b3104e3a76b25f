"""Classify every node: which precision it computes in, and why.

Order of the classification (first that applies wins):
1. nodes with no float output compute nothing in float: they keep their inputs' types;
2. the policy's rules, first match wins, then the enabled guards (`guard:*`);
3. data-movement ops follow the precision of their input;
4. the policy's default.
An op whose ONNX schema has no FP16/BF16 type stays FP32 whatever asked for it; a Cast of
integers to float that is read in FP32 runs FP32 (`EXACT_CAST`), and what follows it again.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import onnx

from trtbuild.graph.analysis import Analysis
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.optypes import (
    DATA_MOVEMENT,
    PRECISION_DTYPE,
    TENSORRT_REFUSES,
    computes,
    opset_typing,
)
from trtbuild.graph.subgraphs import CONTROL_FLOW
from trtbuild.graph.view import GraphView, in_sequences
from trtbuild.numerics import LOW_WHOLE
from trtbuild.policy.specs import Precision
from trtbuild.precision import rules as rules_mod
from trtbuild.words import percent


@dataclass(frozen=True)
class Decision:
    precision: str | None  # fp16 | bf16 | fp32 | None (computes nothing in float)
    rule: str  # rule id, or "default", "follows-input", "input-output", "schema", EXACT_CAST, ...
    reason: str
    opset: int | None = None  # "schema": the first opset whose schema has the asked type


@dataclass
class Assignment:
    view: GraphView
    decisions: list[Decision]
    # the findings the assignment read (its Q/DQ index, the weights' peaks): conversion
    # reads them too, once per graph and not once per tune trial
    analysis: Analysis
    rule_hits: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    quantized: dict[int, str] = field(default_factory=dict)  # quantized op -> int8 | fp8
    dq_precisions: dict[int, tuple[str, ...]] = field(default_factory=dict)  # DQ -> per consumer
    dequantized: frozenset[int] = frozenset()  # ops a `dequantize: true` rule takes out of INT8
    dead_qdq: frozenset[int] = frozenset()  # Q/DQ left without a consumer by those: dropped

    @property
    def qdq(self) -> Any:
        """The Q/DQ index the assignment read (`graph.qdq.QdqGraph`, kept by the analysis)."""
        return self.analysis.qdq()

    def precision_of(self, index: int) -> str | None:
        return self.decisions[index].precision

    def summary(self) -> PrecisionSummary:
        """The `precision` block of report.json.

        Counts are of compute nodes (`optypes.computes`): data movement, casts and
        Q/DQ nodes count in no precision; a quantized op (a Conv/MatMul/Gemm TensorRT
        fuses with its DQs) counts as INT8 or FP8 whatever its float precision.
        """
        counts = {"fp16": 0, "bf16": 0, "fp32": 0, "int8": 0, "fp8": 0}
        pinned = []
        for i, (node, d) in enumerate(zip(self.view.nodes, self.decisions)):
            if d.precision is not None and computes(node.op_type):
                counts[self.quantized.get(i, d.precision)] += 1
            if d.precision == "fp32" and d.rule in self.rule_hits:
                pinned.append({"node": node.name, "op": node.op_type, "rule": d.rule})
        compute = sum(counts.values())
        low = "bf16" if counts["bf16"] > counts["fp16"] else "fp16"

        def share(n: int) -> float:
            return stored_share(n, compute)

        return PrecisionSummary(
            fp16_nodes=counts["fp16"],
            bf16_nodes=counts["bf16"],
            fp32_nodes=counts["fp32"],
            fp16_share=share(counts["fp16"]),
            pinned=pinned,
            rule_hits=dict(self.rule_hits),
            low=low,
            low_share=share(counts[low]),
            int8_nodes=counts["int8"],
            fp8_nodes=counts["fp8"],
            quantized_share=share(counts["int8"] + counts["fp8"]),
            quantized=self.qdq.inventory(self.quantized),
        )


def stored_share(n: int, total: int) -> float:
    """`n` of `total` to four places, as report.json holds it: 1.0 or 0.0 only where it is
    all or none (one FP32 node of twenty thousand rounded to 1.0, and read "100.0% FP16")."""
    if not total or n in (0, total):
        return n / total if total else 0.0
    return min(max(round(n / total, 4), 0.0001), 0.9999)


@dataclass(frozen=True)
class PrecisionSummary:
    """How many compute nodes run in each precision, and which rules pinned which nodes."""

    fp16_nodes: int
    bf16_nodes: int
    fp32_nodes: int
    fp16_share: float
    pinned: list[dict[str, str]]  # node, op, rule
    rule_hits: dict[str, int]
    low: str = "fp16"  # the low precision the policy computes in: fp16 | bf16
    low_share: float = 0.0  # compute nodes in that precision
    int8_nodes: int = 0  # quantized compute (ops TensorRT fuses with INT8 DQs)
    fp8_nodes: int = 0  # the same with FP8 DQs
    quantized_share: float = 0.0  # compute nodes in INT8 or FP8
    quantized: dict[str, Any] = field(default_factory=dict)  # Q/DQ inventory (`graph.qdq`)

    @property
    def pinned_compute(self) -> int:
        """The compute nodes rules pinned to FP32 (a guard's included): what the verdict line
        and the reports count, as the shares count compute nodes. Why not every pinned row:
        a guard's FP32 `Cast` of shape arithmetic computes nothing, and "2 node(s) pinned"
        beside "100.0% FP16" under `rules: []` read as a contradiction."""
        return sum(1 for p in self.pinned if computes(p["op"]))

    @property
    def low_name(self) -> str:
        """`FP16` or `BF16`: the policy's low precision as the reports' prose names it (the
        contract keys, `fp16_share` and the evaluator `emulated-fp16`, keep their names)."""
        return self.low.upper()

    def share_text(self) -> str:
        """`95.0% FP16` or `95.0% BF16`: what a BF16 policy buys is counted as BF16; a
        quantized model's INT8/FP8 compute as its own class (`80.0% FP16, 15.0% INT8`)."""
        text = f"{percent(self.low_share)} {self.low_name}"
        compute = self.fp16_nodes + self.bf16_nodes + self.fp32_nodes
        compute += self.int8_nodes + self.fp8_nodes
        for name, n in (("INT8", self.int8_nodes), ("FP8", self.fp8_nodes)):
            if n:
                text += f", {percent(n / compute)} {name}"
        return text

    def to_json(self) -> dict[str, Any]:
        # shallow, not dataclasses.asdict: that deep-copies every pinned row (a tenth of a
        # second on 10k nodes), and the rows are plain str dicts
        return {f.name: copy.copy(getattr(self, f.name)) for f in fields(self)}


def assign(
    graph: GraphView | onnx.ModelProto,
    precision: Precision,
    ranges: Mapping[str, float] | None = None,
    analysis: Analysis | None = None,
) -> Assignment:
    """Decide every node's precision; `graph` is not modified.

    Pass the stage's `Analysis` where there is one (its structural findings are
    kept, so `tune`'s trials do not find the same units again). `ranges` are
    the FP32 reference's data peaks, for `max_abs_above`.
    """
    view = graph if isinstance(graph, GraphView) else GraphView(graph)
    analysis = analysis if analysis is not None and analysis.view is view else Analysis(view)
    ctx = rules_mod.MatchContext(analysis, ranges)
    qdq = analysis.qdq()  # Q/DQ nodes are never picked by a rule: they follow the ops around
    picks: list[tuple[str, str, str] | None] = [None] * len(view.nodes)
    hits: dict[str, int] = {}
    warnings: list[str] = []
    for rule in precision.all_rules():
        selected = rules_mod.select(rule, ctx)
        fresh = 0
        for i, reason in selected.items():
            if picks[i] is None and view.float_outputs(i) and i not in qdq.nodes:
                picks[i] = (rule.precision, rule.id, reason)
                fresh += 1
        hits[rule.id] = fresh
        if rule.id.startswith("guard:"):
            continue  # a guard that finds nothing to guard is the usual case
        if selected and all(i in qdq.nodes for i in selected):
            warnings.append(
                f"rule '{rule.id}' matches only QuantizeLinear/DequantizeLinear nodes, which are "
                "never pinned: they follow the ops around them (match the op a DQ feeds)"
            )
        elif not selected:
            warnings.append(f"rule '{rule.id}' matches no node")
        elif not fresh:
            warnings.append(
                f"rule '{rule.id}' matches only nodes that earlier rules already decided"
            )

    _into_bodies(view, picks, hits)
    decisions = _decisions(view, picks, precision)
    exact = _exact_casts(view, decisions, precision.default)
    if exact:  # decided again: the data movement after such a Cast follows it to FP32
        decisions = _decisions(view, picks, precision, exact)
    if hint := _opset_hint(view, decisions):
        warnings.append(hint)
    assignment = Assignment(view, decisions, analysis, hits, warnings)
    return _with_qdq(assignment, qdq, precision) if qdq else assignment


def _decisions(
    view: GraphView,
    picks: list[tuple[str, str, str] | None],
    precision: Precision,
    fixed: Mapping[int, Decision] | None = None,
) -> list[Decision]:
    """Every node's decision: `fixed`'s, a rule's pick, else following its input (data
    movement), else the default; then within what its op's schema allows."""
    fixed = fixed or {}
    decisions: list[Decision] = []
    default = Decision(precision.default, "default", f"policy default {precision.default}")
    schema: dict[tuple, Decision | None] = {}  # `_respect_schema`'s verdicts, by what they read
    for i, node in enumerate(view.nodes):
        if node.op_type in CONTROL_FLOW and i in view.body_of:
            decisions.append(_CONTROL)
            continue
        if in_sequences(view, i):
            decisions.append(_SEQUENCE)  # before no-float: what it puts in is cast to FP32
            continue
        if node.op_type == "BitCast" and node.domain in DEFAULT_DOMAINS:
            decisions.append(_BITCAST)
            continue
        if not view.float_outputs(i):
            doubles = any(view.dtype.get(t) == onnx.TensorProto.DOUBLE for t in node.output)
            decisions.append(_DOUBLE if doubles else _NO_FLOAT)
            continue
        if i in fixed:
            decision = fixed[i]
        elif picks[i] is not None:
            prec, rid, reason = picks[i]
            decision = Decision(prec, rid, reason)
        elif node.op_type in DATA_MOVEMENT or float_cast(view, i):
            decision = _follow_input(view, decisions, i, precision.default)
        else:
            decision = default  # a frozen Decision: every node of the default shares one
        decisions.append(_respect_schema(view, i, decision, schema))
    return decisions


EXACT_CAST = "exact-cast"  # the decision's rule: a Cast of integers kept FP32 for its readers


def _exact_casts(view: GraphView, decisions: list[Decision], low: str) -> dict[int, Decision]:
    """FP32 for each Cast left to the default that makes floats of a non-float value (a
    shape's dimension, an index) which is read in FP32: by a node running FP32, a control
    node (its bodies keep their exported types) or as a graph output (its dtype is kept),
    directly or through the data movement that follows it.

    Why: FP16 holds integers exactly only up to 2048 (BF16 to 256), so making such a value
    low and casting it back for its FP32 reader rounds it for nothing; and TensorRT-RTX
    refuses the round trip in a shape computation (YOLOv8's anchors: Shape, Gather, Cast,
    then Range, which has no FP16 type: "Input 0's element type (float) differs from input
    1's element type (half)"). A low-precision reader still gets the same value, cast down
    from the exact one (data movement that follows the Cast, a Concat whose first input
    it is too, is FP32 with it: the same values, one cast more; one that follows another
    input is read through as that one runs).
    """
    found: dict[int, Decision] = {}
    if low not in LOW_WHOLE:  # an FP32 default: nothing is made low
        return found
    casts = [i for i, d in enumerate(decisions) if d.rule == "default" and integer_cast(view, i)]
    if not casts:
        return found
    reader = _fp32_readers(view, decisions)
    whole = LOW_WHOLE[low]  # below it every integer is exact in `low`
    for i in casts:
        if reader[i] is not None:
            why = (
                f"makes floats of integers that {reader[i]} reads in FP32: exact there "
                f"({low.upper()} holds integers exactly only up to {whole})"
            )
            found[i] = Decision("fp32", EXACT_CAST, why)
    return found


def integer_cast(view: GraphView, i: int) -> bool:
    """Whether node i is a Cast that makes floats of a non-float value (`EXACT_CAST`)."""
    return view.nodes[i].op_type == "Cast" and not view.float_inputs(i)


def float_cast(view: GraphView, i: int) -> bool:
    """Whether node i is a Cast of floats to floats, which follows its input as data
    movement does.

    Why: it computes nothing (the mixed model sets its `to`), and left to the default it
    stored a pinned value low on its way out: ModelOpt's default export casts each output
    back (`total_cast_to_fp32`, FP32 to FP32 once prepared), and NAFNet's 1.4e7 sum, pinned
    to FP32, turned inf there.
    """
    return view.nodes[i].op_type == "Cast" and bool(view.float_inputs(i))


def _fp32_readers(view: GraphView, decisions: list[Decision]) -> list[str | None]:
    """For each node, what reads its outputs in FP32 (a node's name, or a graph output),
    directly or through the data movement following it; None where nothing does.

    One pass from the last node back (a node's readers come after it, a body's after its
    outer values and before its control node): linear, however many Casts share a chain.
    """
    outputs = set(view.outputs)
    found: list[str | None] = [None] * len(view.nodes)
    for i in range(len(view.nodes) - 1, -1, -1):
        out = next((t for t in view.nodes[i].output if t in outputs), None)
        if out is not None:
            found[i] = f"graph output {out}"
            continue
        for r in view.successors(i):
            d = decisions[r]
            if d.precision == "fp32" or d.rule == "control-flow":
                found[i] = view.nodes[r].name
            elif d.rule == "follows-input" and _followed(view, decisions, r) == i:
                found[i] = found[r]  # (a Concat following another input stays as it is)
            if found[i] is not None:
                break
    return found


def _with_qdq(assignment: Assignment, qdq, precision: Precision) -> Assignment:
    """Decide the Q/DQ nodes last, from the ops around them (`precision.quantized`)."""
    from trtbuild.precision import quantized

    view, decisions = assignment.view, assignment.decisions
    _dequantized_data_follows_readers(view, decisions, qdq)
    dequantized = _dequantized(assignment, qdq, precision)
    peaks = assignment.analysis.dequantized_peaks()  # a DQ of a constant holds its values too
    promoted, warnings = quantized.promote_for_scales(
        view, qdq, [d.precision for d in decisions], dequantized, peaks
    )
    for i, why in promoted.items():
        decisions[i] = Decision("fp32", quantized.SCALE_RULE, why)
    plan = quantized.plan(view, qdq, [d.precision for d in decisions], dequantized, peaks)
    for i, p in plan.precision.items():
        rule = quantized.QDQ_RULE if i in qdq.nodes else quantized.LAYOUT_RULE
        decisions[i] = Decision(p, rule, plan.reasons[i])
    assignment.warnings.extend(warnings)
    assignment.quantized = {i: f for i, f in qdq.quantized_ops.items() if i not in dequantized}
    assignment.dq_precisions = plan.dq_precisions
    assignment.dequantized, assignment.dead_qdq = dequantized, plan.dead
    return assignment


def _dequantized_data_follows_readers(view: GraphView, decisions: list[Decision], qdq) -> None:
    """Data movement that follows a DequantizeLinear (through more data movement) is FP32
    where a node reading it runs FP32: DQ -> Reshape -> InstanceNormalization, a quantized
    UNet's GroupNorm.

    Why: a DQ computes in the precision of what it feeds, and the data movement after it
    followed the DQ, so neither had one of its own: both took the default, and the pinned
    op read the dequantized values rounded to FP16. `tune` pinning every group of such a
    UNet still failed against the quantized graph in FP32 (PSNR 30 where an all-FP32 rule
    gives 0 error) and said FP16 was not what failed it. Readers are decided before
    makers (one pass from the last node back: a chain resolves at once).
    """
    for i in range(len(view.nodes) - 1, -1, -1):
        d = decisions[i]
        if (
            d.rule != "follows-input"
            or d.precision == "fp32"
            or not _after_dq(view, decisions, i, qdq)
        ):
            continue
        reader = _fp32_reader(view, decisions, i, qdq)
        if reader is not None:
            why = f"moves dequantized data; follows its FP32 reader {view.nodes[reader].name}"
            decisions[i] = Decision("fp32", "follows-input", why)


def _fp32_reader(view: GraphView, decisions: list[Decision], i: int, qdq) -> int | None:
    """A node reading node i's output in FP32, seen through a QuantizeLinear to the ops its
    DQs feed (DQ -> Reshape -> Q -> DQ -> InstanceNormalization: ONNX Runtime quantizes
    around data movement too); None where none does."""
    for r in view.successors(i):
        if r in qdq.nodes and not qdq.nodes[r].is_dq:
            dqs = qdq.group_of[r].dqs if r in qdq.group_of else ()
            ops = [c for dq in dqs for c in qdq.fed_by(dq)]
            found = next((c for c in ops if decisions[c].precision == "fp32"), None)
        else:
            found = r if decisions[r].precision == "fp32" else None
        if found is not None:
            return found
    return None


def _after_dq(view: GraphView, decisions: list[Decision], i: int, qdq) -> bool:
    """Whether data-movement node i follows a DequantizeLinear, directly or through the
    data movement between them."""
    seen = 0
    while (p := _followed(view, decisions, i)) is not None and seen < len(view.nodes):
        if p in qdq.nodes:
            return qdq.nodes[p].is_dq
        if decisions[p].rule != "follows-input":
            return False
        i, seen = p, seen + 1
    return False


def _dequantized(assignment: Assignment, qdq, precision: Precision) -> frozenset[int]:
    """The DQ-fed ops that a rule with `dequantize: true` decided; a warning for such a rule
    that decided none."""
    ids = [r.id for r in precision.all_rules() if r.dequantize]
    # the ops a DQ feeds (`dq_fed`): not the layout ops between them, which follow their op
    found = frozenset(i for i in qdq.dq_fed if assignment.decisions[i].rule in ids)
    for rid in ids:
        if not any(assignment.decisions[i].rule == rid for i in found):
            assignment.warnings.append(
                f"rule '{rid}' has dequantize: true but decides no op that a DequantizeLinear feeds"
            )
    return found


_CONTROL_REASON = "computes in its bodies; its outputs keep their exported types"
_CONTROL = Decision(None, "control-flow", _CONTROL_REASON)
_NO_FLOAT = Decision(None, "no-float", "produces no floating-point tensor")
_DOUBLE = Decision(None, "no-float", "computes in FP64 as exported: the policy lowers FP32 only")
# Why apart: its output's type is `to`, of its input's bit width; as a node of the policy's
# precision it declared an FP16 output `to` still made FP32 (exit 70), or read FP16 bits.
_BITCAST = Decision(
    None, "bitcast", "reinterprets its input's bits: both keep their exported types"
)
_SEQUENCE = Decision(
    "fp32", "sequence", "a sequence's elements keep one type: what goes in or comes out is FP32"
)


def _into_bodies(
    view: GraphView, picks: list[tuple[str, str, str] | None], hits: dict[str, int]
) -> None:
    """A rule that matches an If/Loop/Scan applies to every node of its bodies no rule took.

    Why: pinning a whole body (a loop that accumulates) is one rule, the way
    `tune` pins it; a node of the body that a rule names keeps that rule.
    Innermost first, so an inner control node's own rule wins inside it.
    """
    for i in sorted(view.body_of, key=lambda k: len(view.inside(k))):
        if picks[i] is None:
            continue
        prec, rid, reason = picks[i]
        for k in view.inside(i):
            if picks[k] is None and view.float_outputs(k):
                picks[k] = (prec, rid, f"inside {view.nodes[i].name}: {reason}")
                hits[rid] = hits.get(rid, 0) + 1


def _follow_input(view: GraphView, decisions: list[Decision], i: int, default: str) -> Decision:
    p = _followed(view, decisions, i)
    if p is None and _hands_out_weights(view, i):
        return _WEIGHT_OUT
    if p is None and (passed := _passes_input_through(view, i)) is not None:
        return passed
    if p is None:
        return Decision(default, "default", f"policy default {default}")
    src, verb = view.nodes[p].name, "converts" if view.nodes[i].op_type == "Cast" else "moves data"
    return Decision(decisions[p].precision, "follows-input", f"{verb}; follows {src}")


def _hands_out_weights(view: GraphView, i: int) -> bool:
    """Data movement of weights alone (every input a weight) into graph outputs that no node
    reads (a constant the model hands out, `prepare`'s `weight_outputs`): a low copy would
    only round the values it hands out. Not a lookup by an input (an embedding's `Gather`),
    nor what other nodes read on."""
    ins, outs = [t for t in view.nodes[i].input if t], view.float_outputs(i)
    return (
        bool(ins)
        and all(t in view.initializers for t in ins)
        and all(not view.consumers.get(o) and o in view.outputs for o in outs)
    )


_WEIGHT_OUT = Decision("fp32", "weight-output", "hands a weight out as it is: FP32, unrounded")


def _passes_input_through(view: GraphView, i: int) -> Decision | None:
    """Data movement of graph inputs alone (every float value it reads one; a shape or an
    index may come from anywhere) into graph outputs no node reads (a model that hands its
    input back beside its result, torch's `return y, x`): in the input's own type, or a
    low copy rounds the input the engine hands back (an FP32 `x` came out as
    FP32(FP16(x)), two casts for nothing). Not an embedding's lookup of a weight by an
    input. None where it is not such a copy."""
    ins, outs = view.float_inputs(i), view.float_outputs(i)
    if not ins or not all(t in view.inputs for t in ins):
        return None
    if not all(not view.consumers.get(o) and o in view.outputs for o in outs):
        return None
    own = {view.dtype.get(t) for t in ins}
    precision = next((p for p, d in PRECISION_DTYPE.items() if own == {d}), "fp32")
    return Decision(precision, "input-output", f"hands a graph input out as it is: {precision}")


def _followed(view: GraphView, decisions: list[Decision], i: int) -> int | None:
    """The node data-movement node i follows: its first float input's maker with a
    precision, unless another's is FP32 (None: none has one).

    Why FP32 first: a `Concat` of a pinned value and a low one that followed the low one
    cast the pinned value down, and a value pinned for its range turned inf there (the
    ONNX model zoo's Inception v1: a Relu's 9.6e4 concatenated with FP16 branches).
    """
    makers = [view.producer.get(t) for t in view.float_inputs(i)]
    made = [p for p in makers if p is not None and decisions[p].precision is not None]
    return next((p for p in made if decisions[p].precision == "fp32"), made[0] if made else None)


def _respect_schema(
    view: GraphView, i: int, decision: Decision, memo: dict[tuple, Decision | None]
) -> Decision:
    """`decision`, or FP32 where the op's schema has no type for its precision. `memo`
    holds the verdicts by all they read (op, domain, precision, the first float output's
    slot): a 10k-node graph has a few dozen such, and their messages name no node."""
    if decision.precision in (None, "fp32"):
        return decision
    node = view.nodes[i]
    first = next((k for k, t in enumerate(node.output) if view.is_float(t)), None)
    key = (node.op_type, node.domain, decision.precision, first)
    if key not in memo:
        memo[key] = _schema_refuses(view, i, decision.precision, first)
    return memo[key] or decision


def _schema_refuses(view: GraphView, i: int, precision: str, first: int | None) -> Decision | None:
    """FP32 and why, where node i's op has no schema or none that types its first float
    output (slot `first`) in `precision`; None where it has."""
    types, op = view.types(i), view.nodes[i].op_type
    if not types.known:
        return Decision("fp32", "schema", f"no ONNX schema for {op}; kept FP32")
    if op in TENSORRT_REFUSES[precision] and view.nodes[i].domain in ("", "ai.onnx"):
        return Decision("fp32", "schema", f"TensorRT runs no {precision} {op}; kept FP32")
    out_var = types.output_var(first) if first is not None else None
    dtype = PRECISION_DTYPE[precision]
    if types.is_var(out_var) and not types.allows(out_var, dtype):
        reason = f"{op} has no {precision} type at opset {view.opset}"
        onnx_op = first is not None and view.nodes[i].domain in ("", "ai.onnx")
        later = opset_typing(op, view.opset, first, dtype) if onnx_op else None
        if later is not None:
            reason += f" (opset {later} has one: passes.opset: {later})"
        return Decision("fp32", "schema", reason, later)
    return None


def _opset_hint(view: GraphView, decisions: list[Decision]) -> str | None:
    """One warning for the nodes kept FP32 only by their schema at this opset, where a later
    opset types them in the asked precision: the ops, and the `passes.opset` that does."""
    later = {i: d.opset for i, d in enumerate(decisions) if d.rule == "schema" and d.opset}
    if not later:
        return None
    ops = Counter(view.nodes[i].op_type for i in later)
    named = ", ".join(f"{op} {n}" for op, n in ops.most_common())
    need, opset = max(later.values()), view.opset
    return (
        f"{len(later)} node(s) stay FP32 only because their op's schema at opset {opset} has no "
        f"type for the policy's precision ({named}; each one's reason in check's table): "
        f"set passes.opset: {need}, whose schemas have one"
    )
