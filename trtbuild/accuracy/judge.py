"""The one judge: candidate mixed models against the FP32 reference, under one assumption.

`build`, `report`, `tune` and `benchmarks/bench_tune.py` all call `judge_all`
(or `judge`, for one candidate), so a policy, its baselines, every tune trial
and every peer tool's result are judged the same way: Polygraphy's
`SimpleCompareFunc` with the policy's tolerances on the outputs of every feed,
the first divergence along the graph on the first feed, and the ops at risk.

A verdict needs one lean run a feed: the outputs, and a finite-or-not sum of
each tensor whose non-finite value could vanish before an output
(`graph.propagation`), so an overflow an output masks is still seen, on every
feed, in a tensor of the graph or in a boundary Cast the conversion adds (its
value compared with its FP32 source's). Where a sum is not finite, a cut run of
that feed finds the first tensor that overflowed; on a feed after the first the
reference's own values are not kept, so a tensor FP32 itself holds a sentinel,
inf or NaN in is judged there by how many of each sign it holds.
`accuracy.masked_overflow` says what such an overflow does when every output
holds: `fail` (the default, `tune` alike) or `warn`. The walk along
the graph (the first divergence and the error curve) runs the reference again
beside the candidate on the first feed, each tensor compared as it is produced
and then dropped (`accuracy.stream`); by default (`accuracy.walk: on_failure`)
only a candidate that fails or may have overflowed is walked, as the walk
explains a verdict and costs three times the runs that make it. No run holds
more than `accuracy.memory_budget` allows. Where only the overflow matters
(`detail="overflow"`, `tune`'s trials), the reference is never run again: its
measures tell where the FP32 values are finite. On a GPU the engine's outputs
replace the emulated ones; the divergence and the at-risk list still come from
the emulation, and say so.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import onnx

from trtbuild.accuracy import risk
from trtbuild.accuracy.checks import describe, run_checks
from trtbuild.accuracy.data import Feed
from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.masked import overflow_text, peak_said
from trtbuild.accuracy.probes import peak_name, probe
from trtbuild.accuracy.progress import SampleProgress
from trtbuild.accuracy.reference import (
    ReferenceMeasures,
    ReferenceTensors,
    beyond_counts,
    reference_plan,
)
from trtbuild.accuracy.sessions import (
    EMULATED,
    REFERENCE,
    EngineRunner,
    OutputMetrics,
    metrics,
    same_shaped,
    shape_text,
    unmeasured,
)
from trtbuild.accuracy.stream import LeanRunner, Plan, SegmentRunner, plan_aligned
from trtbuild.fsutil import json_figure
from trtbuild.graph import qdq
from trtbuild.graph.model_io import without_weight_data
from trtbuild.graph.optypes import DEQUANTIZE, INTEGER_TYPES, SELECTIONS, SHAPE_READERS
from trtbuild.graph.propagation import unobserved
from trtbuild.numerics import data_peak, sentinel_kept
from trtbuild.policy.specs import AccuracySpec

# How much of the graph a judgement walks: the error curve and first divergence of every
# candidate (the reference runs again beside them: `accuracy.walk: always`, tune's map);
# of the candidates that fail or overflow only (`on_failure`); or only where a candidate
# overflows (tune's trials). Every detail finds an overflow an output masks, on every feed,
# in a tensor of the graph or a boundary Cast the conversion adds.
Detail = Literal["divergence", "failures", "overflow"]
DETAIL_OF_WALK: dict[str, Detail] = {"always": "divergence", "on_failure": "failures"}


@dataclass
class Verdict:
    """What the judge found about one candidate; `to_json` gives the report's keys."""

    evaluator: str  # "tensorrt", "emulated-fp16", or a label such as "onnxrt-fp32-graph"
    emulation: str | None  # storage | strict; None when a real engine produced the outputs
    passed: bool
    outputs: dict[str, OutputMetrics]
    first_divergence: dict[str, Any] | None
    error_curve: list[dict[str, Any]]
    at_risk: list[dict[str, Any]]
    run_results: Any = field(repr=False, default=None)
    overflow: dict[str, Any] | None = None  # the first intermediate turned non-finite
    overflow_fails: bool = False  # judged with an overflow an output masks as a failure
    walked: bool = True  # the first divergence was searched (False: it passed, `on_failure`)

    @property
    def masked_overflow(self) -> dict[str, Any] | None:
        """The first intermediate overflow where every output holds (None where an output
        fails anyway, or nothing overflowed): what `accuracy.masked_overflow` rules on."""
        if self.overflow is None or not all(m.passed for m in self.outputs.values()):
            return None
        return self.overflow

    def outputs_json(self) -> dict[str, Any]:
        return {k: v.to_json() for k, v in self.outputs.items()}

    def failures(self) -> dict[str, str]:
        """Output (or "(intermediate)") -> the measured error that fails it, in Polygraphy's terms."""
        out = {name: _failure(name, m) for name, m in self.outputs.items() if not m.passed}
        o = self.overflow
        if self.overflow_fails and not out and o is not None:
            out["(intermediate)"] = overflow_text(o)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "evaluator": self.evaluator,
            "emulation": self.emulation,
            "outputs": self.outputs_json(),
            "first_divergence": self.first_divergence,
            "walked": self.walked,
            "overflow": self.overflow,
            "error_curve": self.error_curve,
            "at_risk": self.at_risk,
        }


def _failure(name: str, m: OutputMetrics) -> str:
    if m.nonfinite:
        return f"{name}: {m.nonfinite} non-finite value(s) where FP32 is finite"
    if m.shape_mismatch:
        return f"{name}: {shape_text(m.shape_mismatch)}"
    where = f"sample(s) {', '.join(map(str, m.failed_samples))}" if m.failed_samples else "it"
    bad = [c for c, e in m.checks.items() if not e["passed"]] or ["simple"]
    tol = m.tolerance
    said = "; ".join(describe(c, m.checks.get(c, {}), tol) for c in bad) if tol else ""
    return (
        f"{name}: {where} fail {said or f'the {m.check_error_stat} check'}; "
        f"over the samples judged max |error| {m.max_abs:.4g}, median {m.median_abs:.4g}"
    )


@dataclass(frozen=True)
class Candidate:
    """One model to judge: a mixed graph, its label, (on a GPU) its engine, and its emulated
    graph where the caller made it once for several judgements (one per shape)."""

    mixed: onnx.ModelProto
    label: str = EMULATED
    engine_runner: EngineRunner | None = None
    emulated: onnx.ModelProto | None = None
    # what its judgements share (the probed emulated graph, the lean runner and its session):
    # a policy is judged at several points, and a whole-graph session takes any shape
    reused: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


def judge(
    reference: ReferenceTensors,
    graph: onnx.ModelProto,
    mixed: onnx.ModelProto,
    feeds: list[Feed],
    spec: AccuracySpec,
    *,
    label: str = EMULATED,
    engine_runner: EngineRunner | None = None,
    emulated: onnx.ModelProto | None = None,
    detail: Detail | None = None,
    verbose: bool = False,
    progress: bool = True,
) -> Verdict:
    """Judge one candidate: `judge_all` with a list of one."""
    (verdict,) = judge_all(
        reference,
        graph,
        [Candidate(mixed, label, engine_runner, emulated)],
        feeds,
        spec,
        detail=detail,
        verbose=verbose,
        progress=progress,
    )
    return verdict


def judge_all(
    reference: ReferenceTensors,
    graph: onnx.ModelProto,
    candidates: list[Candidate],
    feeds: list[Feed],
    spec: AccuracySpec,
    *,
    detail: Detail | None = None,
    verbose: bool = False,
    progress: bool = True,
    samples: Sequence[int] | None = None,
    again: bool = True,
) -> list[Verdict]:
    """Judge `candidates` (or their engines) against `reference`, the FP32 run of `graph`.

    `detail` defaults to the policy's `accuracy.walk`. Why the walk waits for the
    verdict (`failures`): it runs the reference again and compares every tensor,
    three times the cost of the lean runs a verdict needs, and it explains a
    failure; a lean run's per-tensor sums still find an overflow an output masks.
    Where the policy's `accuracy.masked_overflow` is `fail`, a candidate whose
    intermediate turns non-finite where FP32 is finite fails even when every output
    holds; the rule is read here and nowhere else, so `build`, `report` and `tune`
    never disagree. `progress` shows samples on
    stderr once a run takes seconds; `tune` has a bar of its own.

    `samples`: which of a point's samples `feeds` (and `reference`'s runs) are, where
    not all of them (`tune` judges the one likeliest to fail alone first): a sample
    after the first is walked as a later feed is, against what FP32 keeps of every
    feed (only the first feed's special values are kept), and a failure names it.

    `again`: whether these candidates are judged again (another point), so each keeps its
    lean session for it; where not, each lets it go after its last feed, and the next
    candidate's is made only then (one session of the weights at a time).
    """
    detail = detail or DETAIL_OF_WALK[spec.walk]
    overflow_fails = spec.masked_overflow == "fail"
    # a policy with no pin is its FP16 baseline: one judgement (one candidate: no hashing)
    same = _identities(candidates) if len(candidates) > 1 else [0]
    unique = [candidates[same.index(k)] for k in dict.fromkeys(same)]
    measures = reference.measures
    graph = probe(graph, set(measures.bodies)).model  # bodies hand out their tensors' peaks
    # the reference's segments, planned where a run is cut (a walk, a suspect): most
    # lean runs find nothing to confirm, and `tune` judges thousands of them
    plan = functools.cache(
        lambda: reference_plan(
            graph, [*measures.order, *measures.decisions], measures.sizes, spec.budget()
        )
    )
    runs = [_Run.start(c, plan, measures, spec, detail) for c in unique]
    ticker = _ticker(candidates, len(runs), len(feeds), progress)
    index = list(samples) if samples is not None else list(range(len(feeds)))
    _run_feeds(graph, plan, runs, feeds, index, detail, ticker, again)
    judged = [_judged(reference, run, feeds, spec, verbose, index) for run in runs]
    if detail == "failures":  # the walk explains a failure or an overflow
        _walk_failures(graph, plan, runs, judged, feeds, index, spec.divergence_threshold)
    verdicts = [_verdict(reference, run, j, overflow_fails) for run, j in zip(runs, judged)]
    firsts = list(dict.fromkeys(same))
    return [verdicts[firsts.index(k)] for k in same]


def _walk_failures(
    graph: onnx.ModelProto,
    plan: Callable[[], Plan],
    runs: list[_Run],
    judged: list[_Judged],
    feeds: list[Feed],
    index: list[int],
    threshold: float,
) -> None:
    """Walk each failing or overflowing candidate on the feed that explains it: the first
    feed where a value of it may have turned non-finite there (`suspects`) or it fails
    there, else its first failing feed (one lockstep run of the reference per feed walked).

    Why not always the first feed: a candidate that fails on its fourth image alone was
    walked on the first, which passes: the first divergence then named nothing, or a
    tensor of an image that holds.

    A suspect is walked on the first feed; where no value of it overflowed there, on its
    first failing feed after (a Mixtral's padding mask, -inf in FP16, made the first sample
    a suspect, and a failure on the second was said "none" as its first divergence).

    A walked candidate's lean session is let go first (a next point makes it again): the
    walk then holds one session of the weights at a time (a 343 MB transformer's build
    peaked at 4.0 GB with both candidates' lean sessions kept through it, 3.0 GB without).
    """
    walked: dict[int, list[_Run]] = {}
    failing: dict[int, int] = {}  # a suspect's run (by id) -> its first failing feed
    for run, j in zip(runs, judged):
        if j.passed and not run.suspects:
            continue
        run.lean.let_go()
        failed = {s for m in j.outputs.values() for s in m.failed_samples}
        at = next((k for k, s in enumerate(index) if s in failed), 0)
        if run.suspects and at:
            failing[id(run)], at = at, 0
        run.walk = _Walk(run.walk.measures, threshold, "divergence", run.casts, sample=index[at])
        walked.setdefault(at, []).append(run)
    for at, group in sorted(walked.items()):
        _lockstep(graph, plan(), group, feeds[at], outputs=False)
    # a suspect that overflowed nowhere on the first feed explains nothing of a later
    # feed's failure: that feed is walked instead, as if nothing had been suspected
    again: dict[int, list[_Run]] = {}
    for run in walked.get(0, []):
        if id(run) in failing and not run.walk.overflowed():
            at = failing[id(run)]
            run.walk = _Walk(
                run.walk.measures, threshold, "divergence", run.casts, sample=index[at]
            )
            again.setdefault(at, []).append(run)
    for at, group in sorted(again.items()):
        _lockstep(graph, plan(), group, feeds[at], outputs=False)


def _ticker(candidates: list[Candidate], runs: int, feeds: int, progress: bool) -> SampleProgress:
    """The progress line of `runs` candidates judged in turn on `feeds` samples each."""
    labels = ", ".join(dict.fromkeys(c.label for c in candidates))
    return SampleProgress(f"judging {labels}", feeds * runs if progress else 0, candidates=runs)


def _run_feeds(
    graph: onnx.ModelProto,
    plan: Callable[[], Plan],
    runs: list[_Run],
    feeds: list[Feed],
    index: list[int],
    detail: Detail,
    ticker: SampleProgress,
    again: bool = True,
) -> None:
    """Every candidate on every feed, one candidate after another (`judge_all`'s `again`):
    the first feed walked as `detail` says (a later sample first, as a later feed), the
    others for their outputs and their first overflow."""
    if index[0] and detail != "overflow":  # their walks hold sample 0's special values
        raise ValueError(f"a walk of detail {detail!r} starts at sample 0, not {index[0]}")
    if detail == "divergence":
        _lockstep(graph, plan(), runs, feeds[0])
    for n, run in enumerate(runs):
        if index[0]:  # a later sample first: walked as a later feed
            run.outputs.append(run.later_feed(feeds[0], index[0] + 1, shrink=len(feeds) == 1))
        elif detail != "divergence":  # a suspect is confirmed here only where no walk will
            run.overflow_pass(feeds[0], shrink=len(feeds) == 1, confirm=detail == "overflow")
        ticker.tick(n * len(feeds) + 1)
        for k, feed in enumerate(feeds[1:], start=2):
            outputs = run.later_feed(feed, index[k - 1] + 1, shrink=k == len(feeds))
            if run.candidate.engine_runner is None:  # an engine's outputs come from it
                run.outputs.append(outputs)
            ticker.tick(n * len(feeds) + k)
        if not again:
            run.lean.let_go()
    ticker.done()


def _identities(candidates: list[Candidate]) -> list[tuple[str, int, bytes]]:
    """Each candidate's identity: candidates with one label, engine and graph get one
    judgement.

    The graphs are told apart without their large weights' data first
    (`model_io.without_weight_data`: graphs that differ there differ whole), and hashed
    whole only where that leaves two alike: a policy with pins and its FP16 baseline
    differ in their nodes, and hashing a 343 MB model's bytes took 0.3 s each."""
    light = [_identity(c, without_weight_data(c.mixed)) for c in candidates]
    alike = {k for k in light if light.count(k) > 1}
    return [_identity(c, c.mixed) if k in alike else k for c, k in zip(candidates, light)]


def _identity(c: Candidate, graph: onnx.ModelProto) -> tuple[str, int, bytes]:
    digest = hashlib.sha256(graph.SerializeToString(deterministic=True)).digest()
    return c.label, id(c.engine_runner), digest


@dataclass
class _Run:
    """One candidate's emulated graph, its runners, and what its runs found."""

    candidate: Candidate
    emulated: onnx.ModelProto
    reference_plan: Callable[[], Plan]  # planned on first use
    lean: LeanRunner  # the outputs (and tensors' finite sums) only, whole
    walk: _Walk
    casts: dict[str, tuple[str, str]] = field(default_factory=dict)  # boundary Cast outputs
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)  # per feed
    cut: SegmentRunner | None = None  # every tensor handed out, cut where the reference is
    suspects: bool = False  # the first feed's lean run: a value may have turned non-finite
    later: dict[str, Any] | None = None  # the first overflow on a feed after the first

    @classmethod
    def start(
        cls,
        c: Candidate,
        plan: Callable[[], Plan],
        measures: ReferenceMeasures,
        spec: AccuracySpec,
        detail: Detail,
    ) -> _Run:
        bodies = tuple(sorted(measures.bodies))
        emulated = c.reused.get(("emulated", spec.emulation, bodies))
        if emulated is None:
            made = c.emulated if c.emulated is not None else emulate(c.mixed, spec.emulation)
            emulated = c.reused[("emulated", spec.emulation, bodies)] = probe(
                made, set(bodies)
            ).model
        casts = c.reused.get("casts")
        if casts is None:
            casts = c.reused["casts"] = boundary_casts(c.mixed, measures)
        mode = "divergence" if detail == "divergence" else "overflow"  # "failures" walks later
        walk = _Walk(measures, spec.divergence_threshold, mode, casts)
        # every lean run (every feed, whatever the detail): values where the reference is
        # special, and a finite sum of each tensor whose overflow could vanish elsewhere
        tensors = {o for n in emulated.graph.node for o in n.output} & set(walk.depth)
        shown = [*measures.outputs]
        shown += sorted(tensors & set(measures.special) - set(shown))
        sinks = set(measures.outputs) - set(measures.special)  # compared where FP32 is finite
        where = ("unobserved", id(emulated), id(measures), tuple(shown))  # a point's samples
        checked = c.reused.get(where)
        if checked is None:
            checked = unobserved(emulated, tensors - set(shown), sinks, measures.shapes)
            c.reused[where] = checked
        key = ("lean", id(emulated), tuple(shown), tuple(sorted(checked)))
        lean = c.reused.get(key) or LeanRunner(emulated, shown, checked)
        c.reused[key] = lean
        return cls(c, emulated, plan, lean, walk, casts)

    def cut_runner(self) -> SegmentRunner:
        """The runner that hands out every tensor, made on first use (a divergence, a suspect)."""
        if self.cut is None:
            present = {o for n in self.emulated.graph.node for o in n.output}  # peers fuse nodes
            walked = {*self.walk.depth, *self.walk.decisions}
            marked = (present & walked) | set(self.walk.measures.outputs)
            plan = plan_aligned(self.emulated, marked, self.reference_plan())
            self.cut = SegmentRunner(self.emulated, plan)
        return self.cut

    def later_feed(self, feed: Feed, k: int, *, shrink: bool = True) -> dict[str, np.ndarray]:
        """The graph outputs of feed `k` (1-based, after the first), and its overflow where
        none is named yet: the lean run's sums, confirmed by a cut run of this feed where one
        is not finite. `shrink=False` where another lean run follows (`run_session`)."""
        values = self.lean.run(feed, shrink=shrink)
        measures = self.walk.measures
        outputs = {o: values[o] for o in measures.outputs if o in values}
        if self.later is not None or self.walk.overflowed():
            return outputs  # the verdict names the first overflow; later ones change nothing
        walk = _Walk(measures, self.walk.threshold, "overflow", self.casts, sample=k - 1)
        walk.take({t: v for t, v in values.items() if t in walk.depth}, None)
        # an output or a special tensor that turned non-finite may carry an overflow from
        # upstream: the cut run finds its origin, as on the first feed (`tune` pins it)
        suspects = bool(self.lean.suspects(values)) or walk.overflowed()
        del values
        if suspects:
            runner = self.cut_runner()
            for seg, cut in zip(runner.plan.segments, runner.run(feed)):
                walk.take({t: cut[t] for t in seg.marked}, None)
        self.later = walk.finish()[2]
        return outputs

    def overflow_pass(self, feed: Feed, *, shrink: bool = True, confirm: bool = True) -> None:
        """The first feed, unless every candidate is walked: one lean run, and (`confirm`) the
        cut run only where a tensor's sum says one of its values may not be finite (the walk
        then finds which); `shrink=False` where more lean runs follow."""
        values = self.lean.run(feed, shrink=shrink)
        outputs = self.walk.measures.outputs
        self.outputs.append({o: values[o] for o in outputs if o in values})
        self.walk.take({t: v for t, v in values.items() if t in self.walk.depth}, None)
        suspects = self.lean.suspects(values)
        del values
        # an output or a special tensor that turned non-finite may carry an overflow from
        # upstream, where no sum is placed (`unobserved`): the cut run finds its origin
        self.suspects = bool(suspects) or self.walk.overflowed()
        if self.suspects and confirm:
            runner = self.cut_runner()
            for seg, cut in zip(runner.plan.segments, runner.run(feed)):
                self.walk.take({t: cut[t] for t in seg.marked}, None)


def _lockstep(
    graph: onnx.ModelProto, plan: Plan, runs: list[_Run], feed: Feed, *, outputs: bool = True
) -> None:
    """The first feed: the reference and every candidate, segment by segment; with
    `outputs`, the candidates' outputs of this feed are kept (no lean run made them).

    A reference tensor is held until every candidate has produced its own (the
    same segment, unless a candidate's graph moved it later), then dropped.
    """
    ref: Iterator[dict[str, np.ndarray]] = SegmentRunner(graph, plan).run(feed, once=True)
    # a walk after the verdicts (not `outputs`) is the last run of these candidates' cut
    # runners: each segment's session goes once it ran, as the reference's does
    streams = [run.cut_runner().run(feed, once=not outputs) for run in runs]
    names = set(runs[0].walk.measures.outputs) if runs else set()
    pending: dict[str, np.ndarray] = {}
    firsts: list[dict[str, np.ndarray]] = [{} for _ in runs]
    for k, seg in enumerate(plan.segments):
        values = next(ref)
        pending.update({t: values[t] for t in seg.marked})
        del values
        for run, stream, first in zip(runs, streams, firsts):
            values = next(stream)
            produced = {t: values[t] for t in run.cut_runner().plan.segments[k].marked}
            run.walk.take(produced, pending)
            first.update({o: v for o, v in produced.items() if o in names})
            del values, produced
        done = [r.cut_runner().plan.segment_of for r in runs]
        for t in [t for t in pending if all(d.get(t, -1) <= k for d in done)]:
            del pending[t]
    handed = {o: v for o, v in feed.items() if o in names}  # an input handed out as it is
    for run, first in zip(runs, firsts):
        if outputs:
            run.outputs.append({**handed, **first})


@dataclass
class _Judged:
    """What the outputs say of one candidate, before any walk: Polygraphy's verdicts."""

    label: str
    emulation: str | None
    outputs: dict[str, OutputMetrics]
    results: Any

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.outputs.values())


def _judged(
    reference: ReferenceTensors,
    run: _Run,
    feeds: list[Feed],
    spec: AccuracySpec,
    verbose: bool,
    index: list[int],
) -> _Judged:
    """Polygraphy's verdict on the outputs (the engine's, where the candidate has one)."""
    from polygraphy.comparator.struct import IterationResult

    c = run.candidate
    label, emulation = c.label, spec.emulation
    iterations = [IterationResult(outs, runner_name=label) for outs in run.outputs]
    if c.engine_runner is not None:
        iterations, label, emulation = c.engine_runner.run(feeds, verbose), "tensorrt", None
    outputs, results = compare(reference, iterations, label, spec, verbose, index)
    return _Judged(label, emulation, outputs, results)


def _verdict(
    reference: ReferenceTensors, run: _Run, judged: _Judged, overflow_fails: bool
) -> Verdict:
    """The outputs' verdict, with the walk's divergence and overflow and the ops at risk."""
    first_div, curve, overflow = run.walk.finish()
    failing = [o for o, m in judged.outputs.items() if not m.passed]
    first_div = decided(first_div, run.walk.flipped, run.candidate.mixed, failing)
    first_div = in_steps(first_div, curve, run.candidate.mixed)
    if first_div is not None and run.walk.sample:  # walked on a later sample: which
        first_div = {**first_div, "sample": run.walk.sample}
    overflow = overflow or run.later  # the first feed's, else the first later feed's
    return Verdict(
        evaluator=judged.label,
        emulation=judged.emulation,
        passed=judged.passed and not (overflow_fails and overflow is not None),
        outputs=judged.outputs,
        first_divergence=first_div,
        error_curve=curve,
        at_risk=risk.at_risk(reference.measures.internals, run.candidate.mixed),
        run_results=judged.results,
        overflow=overflow,
        overflow_fails=overflow_fails,
        walked=run.walk.detail == "divergence",
    )


def compare(
    reference: ReferenceTensors,
    iterations: list,
    label: str,
    spec: AccuracySpec,
    verbose: bool,
    index: Sequence[int] | None = None,
) -> tuple[dict[str, OutputMetrics], Any]:
    """Polygraphy's verdicts per output and sample with the policy's checks, plus metrics;
    a failing sample named by `index` (which of the point's samples each iteration is),
    else by its place."""
    from polygraphy.comparator import RunResults

    ref_iters = reference.run_results[REFERENCE]
    names = reference.measures.outputs
    results = RunResults()
    results.append((REFERENCE, ref_iters))
    results.append((label, iterations))
    tol = {n: spec.tolerance(n) for n in names}
    with ThreadPoolExecutor(1, thread_name_prefix="trtbuild-metrics") as pool:
        # numpy leaves the GIL for the partitions: the metrics take the other core meanwhile
        figures = [pool.submit(_joined_metrics, ref_iters, iterations, n) for n in names]
        found = run_checks(ref_iters, iterations, label, tol, verbose)
    outputs = {}
    for name, figure in zip(names, figures):
        m = figure.result()
        shown = found[name].pop("shown", {})
        judged = found[name]
        for c in judged.values() if index is not None else ():  # among the point's samples
            c["failed_samples"] = [index[k] for k in c["failed_samples"]]
            if "worst" in c:
                c["worst"]["sample"] = index[c["worst"]["sample"]]
        failed = sorted({k for c in judged.values() for k in c["failed_samples"]})
        shapes = m.pop("shape_mismatch")
        for d in shapes if index is not None else ():
            d["sample"] = index[d["sample"]]
        failed = sorted({*failed, *(d["sample"] for d in shapes)})
        cosine = judged["cosine"]["value"] if "cosine" in judged else shown.get("cosine")
        psnr = judged["psnr"]["value"] if "psnr" in judged else shown.get("psnr")
        outputs[name] = OutputMetrics(
            passed=not failed and m["nonfinite"] == 0,
            shape_mismatch=shapes,
            failed_samples=failed,
            atol=tol[name].atol,
            rtol=tol[name].rtol,
            check_error_stat=tol[name].check_error_stat,
            cosine=round(cosine, 6) if cosine is not None and np.isfinite(cosine) else 0.0,
            psnr=round(psnr, 3) if psnr is not None and not np.isnan(psnr) else None,
            checks=judged,
            tolerance=tol[name],
            **m,
        )
    return outputs, results


def _joined_metrics(ref_iters: list, iterations: list, name: str) -> dict[str, Any]:
    """One output's metrics over every sample at once, and the samples where its shape is
    not FP32's (`shape_mismatch`), which the figures leave out.

    Why: a count the data decides (a `NonZero`'s, a `NonMaxSuppression`'s, what they
    index) may differ from FP32's where FP16 moved a value across a threshold. Polygraphy
    fails such a sample without a figure; where no sample has FP32's shape, every error
    figure is the worst there is (inf) and the cosine 0.
    """
    shapes = [(np.shape(r[name]), np.shape(o[name])) for r, o in zip(ref_iters, iterations)]
    mismatch = [
        {"sample": k, "reference": list(r), "candidate": list(o)}
        for k, (r, o) in enumerate(shapes)
        if r != o
    ]
    same = same_shaped(ref_iters, iterations, name)
    if not same:
        return {**unmeasured(), "shape_mismatch": mismatch, "measured": False}
    found = metrics(np.concatenate([r.ravel() for r, _ in same]),
                    np.concatenate([o.ravel() for _, o in same]))  # fmt: skip
    return {**found, "shape_mismatch": mismatch}


def boundary_casts(
    mixed: onnx.ModelProto, measures: ReferenceMeasures
) -> dict[str, tuple[str, str]]:
    """Each Cast of the main graph to FP16 or BF16 whose source is a tensor the reference
    measures (a node's output or a graph input) and whose output is not: the boundaries the
    conversion adds, `{output: (FP32 source, Cast node)}`. Its value is its source's rounded,
    so the source's reference judges it: an inf there where FP32 is finite is an overflow."""
    from onnx import TensorProto

    known = {t for t, _, _ in measures.order}
    sources = known | {i.name for i in mixed.graph.input}
    low = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    found = {}
    for node in mixed.graph.node:
        if node.op_type != "Cast" or not node.input or not node.output:
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        src, out = node.input[0], node.output[0]
        if to in low and src in sources and out not in known:
            found[out] = (src, node.name or out)
    return found


class _Walk:
    """One candidate's walk along the graph: a point per tensor, measured as tensors come.

    With the reference's tensor (`detail="divergence"`), a point is its error
    against FP32 (`point`); without it, only whether the candidate turned
    non-finite where FP32 is finite, told from the reference's measures (a
    tensor that held a NaN, an inf or a sentinel there kept its values). A
    boundary Cast's output (`casts`) is judged by its source's reference, for an
    overflow only. `sample` > 0 (from 0): a later feed, whose reference values are not
    kept (`_overflow` says what is judged there).
    """

    def __init__(
        self,
        measures: ReferenceMeasures,
        threshold: float,
        detail: Detail,
        casts: dict[str, tuple[str, str]] | None = None,
        sample: int = 0,
    ):
        self.measures, self.threshold, self.detail = measures, threshold, detail
        self.sample = sample
        self.depth = {t: (d, node, op) for d, (t, node, op) in enumerate(measures.order)}
        self.peak_of = {peak_name(t): t for t in measures.bodies}  # a body tensor's peak
        self.depth.update({p: self.depth[t] for p, t in self.peak_of.items() if t in self.depth})
        self.casts = {}
        for out, (src, node) in (casts or {}).items():
            if src in self.depth or src in measures.shapes:  # a graph input: before every node
                self.casts[out] = src
                self.depth[out] = (self.depth.get(src, (-1,))[0], node, "Cast")
        self.points: dict[int, dict[str, Any]] = {}
        self.boundary: dict[tuple[int, str], dict[str, Any]] = {}  # (depth, Cast output)
        self.decisions = {t: (node, op) for t, node, op in measures.decisions}
        self.flipped: dict[str, dict[str, Any]] = {}  # decision indices that are not FP32's

    def take(self, values: dict[str, np.ndarray], ref: dict[str, np.ndarray] | None) -> None:
        for name, e in values.items():
            if name in self.decisions:
                self._decision(name, e, None if ref is None else ref.get(name))
                continue
            where = self.depth.get(name)
            if where is None:
                continue
            depth, node, op = where
            if name in self.casts:  # a boundary Cast: an overflow of its source's values
                p = self._overflow(self.casts[name], np.asarray(e))
                if p is not None and p["nonfinite"]:
                    p.update(tensor=name, source=self.casts[name])
                    self.boundary[(depth, name)] = {"depth": depth, "node": node, "op": op, **p}
                continue
            tensor = self.peak_of.get(name, name)
            if tensor != name:  # inside a body only the peak is known: an overflow, or nothing
                p = self._overflow(tensor, np.asarray(e))
                if p is not None:
                    p["inside"] = "a control-flow body, where only its peak is measured"
            elif ref is not None:
                r = ref.get(tensor)
                p = None if r is None else point(self.measures, tensor, r, e, self.sample == 0)
            else:
                p = self._overflow(tensor, np.asarray(e))
            if p is not None:
                self.points[depth] = {"depth": depth, "node": node, "op": op, **p}

    def _decision(self, tensor: str, e: np.ndarray, r: np.ndarray | None) -> None:
        found = None if r is None else _flip(tensor, *self.decisions[tensor], r, e)
        if found:
            self.flipped[tensor] = found

    def _overflow(self, tensor: str, e: np.ndarray) -> dict[str, Any] | None:
        """Whether `e` turned non-finite where FP32 is finite. On the first feed the values of
        a tensor FP32 holds a NaN, an inf or a sentinel in are kept and compared; on a later
        one they are not, and such a tensor is judged by how many of its values are past
        the sentinels' magnitude (or inf) of each sign, and NaN: more than FP32's there are
        an overflow (`_beyond`)."""
        r = self.measures.special.get(tensor) if self.sample == 0 else None
        if r is not None:
            return point(self.measures, tensor, r, e)
        if not _measured(self.measures, tensor, e, self.sample):
            return None
        if self.sample and tensor in self.measures.beyond:
            return _beyond(self.measures, self.sample, tensor, e)
        if e.size and np.isfinite(max(float(e.max()), -float(e.min()))):
            return None  # every value finite: no overflow (the usual case, one cheap pass)
        nan = int(np.count_nonzero(np.isnan(e)))
        bad = int(np.count_nonzero(~np.isfinite(e)))
        if not bad:
            return None
        return overflow_point(self.measures, tensor, bad, nan, self.sample)

    def overflowed(self) -> bool:
        """Whether a tensor taken so far turned non-finite where FP32 is finite."""
        return bool(self.boundary) or any(p["nonfinite"] for p in self.points.values())

    def _ordered(self) -> list[dict[str, Any]]:
        """Every point along the graph; a boundary Cast's overflow right after its source."""
        keys = [((d, 0, ""), self.points[d]) for d in self.points]
        keys += [((d, 1, name), p) for (d, name), p in self.boundary.items()]
        return [p for _, p in sorted(keys, key=lambda kp: kp[0])]

    def finish(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
        """(first divergence, error curve, first overflow); only the overflow without `divergence`."""
        ordered = self._ordered()
        overflow = next((p for p in ordered if p.get("nonfinite")), None)
        overflow = {k: v for k, v in overflow.items() if k != "_nan"} if overflow else None
        if overflow is not None:
            overflow["sample"] = self.sample
        if self.detail != "divergence":
            return None, [], overflow
        first = None
        for p in ordered:
            bad, nan, rel = p["nonfinite"], p.pop("_nan"), p["rel_error"]
            rel = float(rel) if isinstance(rel, str) else rel
            if first is None and (bad or rel > self.threshold):
                first = _first_divergence(p, bad, nan, rel, self.threshold)
        return first, ordered, overflow


def _beyond(
    measures: ReferenceMeasures, sample: int, tensor: str, e: np.ndarray
) -> dict[str, Any] | None:
    """A later feed's tensor where FP32 holds a sentinel, an inf or a NaN on some feed: an
    overflow where it holds more values past the sentinels' magnitude of a sign, or more
    NaN than FP32's NaN and inf, than FP32 does on this feed (`sample`), or more of them
    all together (one FP32 inf excused both a NaN and an overflow's inf of its sign).

    Why counts: FP32's values of a later feed are not kept. The tensor was not judged
    there at all (an -inf attention mask) or by its NaNs alone (a finfo.min one): an Add of
    a mask whose unmasked sum passed 65504 on the second sample was +inf beside the mask's
    -inf, hidden by a Clip, and the policy passed.
    """
    pos, neg, nan, inf = measures.beyond[tensor].get(sample, (0, 0, 0, 0))
    got = beyond_counts(e)
    # a NaN where FP32 is inf (0 / 0 where FP32 divides by 0) is no overflow: as on the
    # first feed, only a value FP32 holds finite (or as a sentinel) is judged
    excess = sum(got[:3]) - (pos + neg + nan)  # no more values past the range in all
    nan = max(0, got[2] - nan - inf)
    bad = max(max(0, got[0] - pos) + max(0, got[1] - neg) + nan, excess)
    if not bad:
        return None
    return overflow_point(measures, tensor, bad, nan, sample)


def overflow_point(
    measures: ReferenceMeasures, tensor: str, bad: int, nan: int, sample: int
) -> dict[str, Any]:
    """An overflow's walk point on feed `sample`, with the FP32 peak that explains it.

    Why not the first feed's peak: an overflow on the third sample alone (x * 1e3 at 7.2e4)
    was said with the first sample's, 5.4e4, below what overflows (and one at 65510 with
    0.99). A later feed's peak is kept where it passes FP16's range (`later_peaks`); below
    it, the peak over the point's samples is said, and said to be so (`peak_over`).
    """
    if not sample:
        return _point_json(tensor, bad, nan, measures.first_peaks.get(tensor, 0.0), float("inf"))
    later = measures.later_peaks.get(tensor, {}).get(sample)
    if later is not None:
        return _point_json(tensor, bad, nan, later, float("inf"))
    p = _point_json(tensor, bad, nan, measures.ranges.get(tensor, 0.0), float("inf"))
    return {**p, "peak_over": "samples"}


def _measured(measures: ReferenceMeasures, tensor: str, e: np.ndarray, sample: int) -> bool:
    """Whether `e` is the tensor the reference measured (a peer tool's graph may reuse a
    name for another shape). On the first feed its shape is the measured one; a later
    feed's may differ where the data decides it (a NonZero's count), so only its rank is
    asked: an overflow there is judged, whatever the first feed's count was."""
    shape = measures.shapes.get(tensor)
    if shape is None:
        return False
    return shape == e.shape if sample == 0 else len(shape) == e.ndim


def _differing(r: np.ndarray | None, e: np.ndarray) -> int:
    """How many of `e`'s indices are not the reference's `r` (0 without `r`, or where the
    shapes differ: a peer tool's graph)."""
    if r is None or np.shape(r) != np.shape(e):
        return 0
    return int(np.count_nonzero(np.asarray(r) != np.asarray(e)))


def _flip(tensor: str, node: str, op: str, r: np.ndarray, e: np.ndarray) -> dict[str, Any] | None:
    """A decision's indices against FP32's: where any differs, which and how many (a
    selection's: the index tuples chosen by one of the two only, and how many each chose)."""
    axis = SELECTIONS.get(op)
    if axis is None:
        differ, counts = _differing(r, e), {"of": int(np.size(r))}
    else:
        differ, counts = _selected(r, e, axis)
    return (
        {"node": node, "op": op, "tensor": tensor, "differ": differ, **counts} if differ else None
    )


def _selected(r: np.ndarray, e: np.ndarray, axis: int) -> tuple[int, dict[str, int]]:
    """A selection's index tuples (along `axis`) chosen by one of FP32 and `e` only, and how
    many each chose: {"of": FP32's count, "chosen": the candidate's}."""
    r, e = np.asarray(r), np.asarray(e)
    counts = {"of": int(r.shape[axis]) if r.ndim == 2 else 0,
              "chosen": int(e.shape[axis]) if e.ndim == 2 else 0}  # fmt: skip
    if r.ndim != 2 or e.ndim != 2 or r.shape[1 - axis] != e.shape[1 - axis]:
        return 0, counts  # not a selection's shape: a peer tool's graph
    if not r.shape[1 - axis]:  # a scalar's NonZero: empty tuples, only their count
        return abs(counts["of"] - counts["chosen"]), counts

    def tuples(a: np.ndarray) -> np.ndarray:  # each chosen tuple as one comparable value
        rows = np.ascontiguousarray(np.moveaxis(a, axis, 0), dtype=np.int64)
        return rows.view(np.dtype((np.void, 8 * rows.shape[1]))).ravel()

    return int(np.setxor1d(tuples(r), tuples(e)).size), counts


def decided(
    first: dict[str, Any] | None,
    flipped: dict[str, dict[str, Any]],
    mixed: onnx.ModelProto,
    failing: Sequence[str] = (),
) -> dict[str, Any] | None:
    """The first divergence, with the decision it reads whose indices are not FP32's, if any;
    where nothing diverged, such a decision a failing output reads (or is) is named.

    Why: a codebook's `Gather` of another code (CodeFormer's, a VQGAN's) is off by whole
    values, and it is the `ArgMin` upstream that chose it: FP16's error in the distances
    flipped a choice between near codes. A classifier's `ArgMax` output fails with no float
    tensor past the threshold. The indices are read directly or through integer-only nodes
    (an `Unsqueeze`, a one-hot's `ScatterElements`), not through a `Shape` of them.
    """
    if not flipped or (first is None and not failing):
        return first
    made = {o: n for n in mixed.graph.node for o in n.output}
    reads = _decisions_read(mixed, flipped, made)
    if first is not None:
        node = next((n for n in mixed.graph.node if n.name == first["node"]), None)
        d = reads(list(node.input) if node is not None else [])
        if d is None:
            return first
        counted = f"{d['differ']} of {d['of']} of which are not FP32's"
        said = f"; it reads the indices {d['node']} ({d['op']}) chose, {_counted(d, counted)}"
        return {**first, "reason": first["reason"] + said, "decision": d}
    found = [  # the output itself, or what its node reads (a Gather of the chosen indices)
        d
        for d in (reads([o, *(made[o].input if o in made else ())]) for o in failing)
        if d is not None
    ]
    if not found:
        return None
    order = {n.name: i for i, n in enumerate(mixed.graph.node)}
    d = min(found, key=lambda d: order.get(d["node"], len(order)))  # the earliest in the graph
    said = _counted(d, f"{d['differ']} of {d['of']} indices differ from FP32's")
    return {"node": d["node"], "op": d["op"], "tensor": d["tensor"], "reason": said, "decision": d}


def _counted(d: dict[str, Any], counted: str) -> str:
    """How a decision's indices differ from FP32's (`counted`, or a selection's counts), and
    why, in words."""
    if "chosen" in d:  # a selection (NonZero, NonMaxSuppression): the count is the data's too
        counted = (
            f"{d['chosen']} indices where FP32 chose {d['of']}, {d['differ']} of them chosen "
            "by one of the two only"
        )
    return (
        f"{counted}: the error in that {d['op']}'s input chose otherwise between near values, "
        "and what computes that input decides it"
    )


def in_steps(
    first: dict[str, Any] | None, curve: list[dict[str, Any]], mixed: onnx.ModelProto
) -> dict[str, Any] | None:
    """A first divergence at a DequantizeLinear of an activation, said in quantization steps,
    with the node whose FP16 rounding its QuantizeLinear turned into them.

    Why: "error 100% of the tensor's range" at a DQ whose values span one step read as a
    broken quantization; it was one value that FP16's rounding of the Q's input moved
    across a rounding boundary, and the rule that keeps it is on that input's maker.
    """
    if first is None or first.get("op") != DEQUANTIZE or "decision" in first:
        return first
    point = next((p for p in curve if p.get("tensor") == first["tensor"]), None)
    found = qdq.requantized(mixed, first["node"])
    if point is None or point.get("nonfinite") or found is None or not found.maker:
        return first  # (a Q of a graph input reads it as given: FP32 rounds it no other way)
    q, maker = found.quantize, found.maker
    n = _step_count(point, found)
    if found.maker_low and (n is None or n < 1.5):
        said = (
            f"FP16's rounding of `{maker}`'s output, which `{q}` quantizes, moved values across "
            f"its rounding boundaries; a rule keeping `{maker}` in FP32 keeps them"
        )
    elif found.maker_low:  # one rounding moves a value within the Q's range by one step at most
        said = (
            f"FP16's error in what `{q}` quantizes moved values across its rounding boundaries, "
            f"by more steps than one rounding of `{maker}`'s output can: it came from further up"
        )
    else:  # pinned, or a Q/DQ: FP16's error came from further up
        said = f"FP16's error in what `{q}` quantizes moved values across its rounding boundaries"
    return {**first, "reason": f"{first['reason']}: {_steps(n, found)}, where {said}"}


def _step_count(point: dict[str, Any], found: qdq.Requantized) -> float | None:
    """The error at a DQ in its Q's steps, where they are even (an integer grid, one scale)
    and the error is a number; None elsewhere.

    Why it matters beyond the words: FP16's rounding of a value the Q reads within its range
    (|x| <= 127.5 steps) moves it by under a tenth of a step, so across one rounding boundary
    at most; more steps than one came from further up, where no rule on the Q's input's
    maker keeps them.
    """
    error = float(point["rel_error"]) * point["ref_max_abs"]
    scale = found.scale
    even = found.integer and scale is not None and scale.size == 1 and scale.flat[0] > 0
    if not even or not np.isfinite(error) or error <= 0:
        return None
    return error / float(scale.flat[0])  # type: ignore[union-attr]


def _steps(n: float | None, found: qdq.Requantized) -> str:
    """`n` steps in words, with the step's size; where they are uneven or uncounted, so."""
    if n is None:
        return "whole quantization steps"
    step = float(found.scale.flat[0])  # type: ignore[union-attr]
    return f"{n:.3g} quantization step{'' if round(n, 3) == 1 else 's'} of {step:.4g}"


def _decisions_read(
    mixed: onnx.ModelProto, flipped: dict[str, dict[str, Any]], made: dict[str, onnx.NodeProto]
) -> Callable[[list[str]], dict[str, Any] | None]:
    """A search up from some tensors, through integer-only values, for a flipped decision
    (`made`: each value's maker)."""
    graph = mixed.graph
    ends = (*graph.input, *graph.value_info, *graph.output)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in ends}

    def reads(todo: list[str]) -> dict[str, Any] | None:
        seen: set[str] = set()
        while todo:
            t = todo.pop()
            if t in flipped:
                return flipped[t]
            if t in seen or t not in made or types.get(t) not in INTEGER_TYPES:
                continue
            seen.add(t)
            if made[t].op_type not in SHAPE_READERS:  # a shape is no index's value
                todo += [i for i in made[t].input if i]
        return None

    return reads


def _first_divergence(
    p: dict[str, Any], bad: int, nan: int, rel: float, threshold: float
) -> dict[str, Any]:
    """The first divergence at walk point `p`: where, and why in words."""
    first = {"node": p["node"], "op": p["op"], "tensor": p["tensor"]}
    first["reason"] = _reason(bad, nan, rel, threshold, peak_said(p))
    if "source" in p:
        first["reason"] += f", in the boundary Cast the conversion adds after `{p['source']}`"
    if "inside" in p:  # a peak: whether a value turned non-finite, not how many
        kind = "NaN" if nan else "inf"
        first["reason"] = (
            f"turns {kind} where FP32 is finite ({peak_said(p)}), inside {p['inside']}"
        )
    return first


def divergence(
    measures: ReferenceMeasures,
    values: dict[str, np.ndarray],
    ref: dict[str, np.ndarray] | None,
    threshold: float,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
    """One walk over a feed's tensors at once: (first divergence, error curve, first overflow).

    With `ref`, the reference's tensors, as `detail="divergence"` measures them;
    without, only the overflow, from the measures, as `detail="overflow"` does.
    """
    walk = _Walk(measures, threshold, "divergence" if ref is not None else "overflow")
    walk.take(values, ref)
    return walk.finish()


def _reason(bad: int, nan: int, rel: float, threshold: float, peak: str) -> str:
    if bad:
        kinds = ", ".join(f"{n} {k}" for n, k in ((nan, "NaN"), (bad - nan, "inf")) if n)
        return f"{bad} non-finite value(s) ({kinds}) where FP32 is finite ({peak})"
    return f"error {rel:.2%} of the tensor's range exceeds {threshold:.0%}"


def point(
    measures: ReferenceMeasures, tensor: str, r: np.ndarray, e: np.ndarray, first: bool = True
) -> dict[str, Any] | None:
    """One tensor's error against FP32, or None where the shapes differ (a peer tool's graph).

    A sentinel the candidate keeps (-3.4e38 become -inf) is not a divergence; a NaN always is.
    `first`: `r` is the first feed's, whose peaks the measures hold (another feed's error is
    scaled by its own peak).
    """
    r, e = np.asarray(r), np.asarray(e)
    if r.shape != e.shape:
        return None
    if tensor in measures.sentinel_tensors:
        keep = ~sentinel_kept(r, e)
        r, e = r[keep], e[keep]
    # the same figure as data_peak(r) on the first feed, measured once
    scale = measures.first_peaks.get(tensor) if first else None
    bad, nan, scale, err = _error(r, e, data_peak(r) if scale is None else scale)
    rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
    return _point_json(tensor, bad, nan, scale, float("inf") if bad else rel)


def _point_json(tensor: str, bad: int, nan: int, scale: float, rel: float) -> dict[str, Any]:
    return {
        "tensor": tensor,
        "rel_error": json_figure(rel),
        "ref_max_abs": scale,
        "nonfinite": bad,
        "_nan": nan,
    }


# Elements per block of the float64 difference: 8 MB, in cache, never a tensor-sized copy.
_BLOCK = 1 << 20
_SCRATCH = threading.local()


def _scratch() -> np.ndarray:
    """This thread's 8 MB block for the differences, made once: a fresh block per tensor
    is fresh pages, and faulting them in cost as much as the subtraction."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None:
        buf = _SCRATCH.buf = np.empty(_BLOCK, np.float64)
    return buf


def _error(r: np.ndarray, e: np.ndarray, scale: float) -> tuple[int, int, float, float]:
    """(non-finite values of `e` where `r` is finite, of which NaN, `scale` (the data peak
    of `r`), largest |e - r| where both are finite), the difference exact (float64).

    Without a tensor-sized copy when every value is finite (the usual case, on
    every tensor of every judgement): a finite difference means both sides are
    finite. The masks only when it is not.
    """
    with np.errstate(all="ignore"):
        err = _max_abs_diff(r, e)
        if np.isfinite(err):
            return 0, 0, scale, err
        diff = np.abs(np.asarray(np.subtract(e, r, dtype=np.float64)))
        broke = ~np.isfinite(e) & np.isfinite(r)
        bad, nan = int(np.count_nonzero(broke)), int(np.count_nonzero(broke & np.isnan(e)))
        finite = diff[np.isfinite(e) & np.isfinite(r)]
        return bad, nan, scale, float(finite.max()) if finite.size else 0.0


def _max_abs_diff(r: np.ndarray, e: np.ndarray) -> float:
    """max |e - r|, exact (as float64 gives it); NaN or inf where a value is not finite.

    Block by block: |e - r| in float32 first (half the bytes of float64), then
    float64 only in the blocks whose float32 maximum is the largest. Rounding
    to float32 is monotonic, so the exact maximum lies in one of those blocks;
    a float32 difference that overflows is not finite, and the caller then
    takes the exact difference of every value.
    """
    half = r.dtype in (np.float32, np.float16) and e.dtype in (np.float32, np.float16)
    if r.shape != e.shape:  # broadcast (a peer's graph): as numpy gives it
        diff = np.asarray(np.subtract(e, r, dtype=np.float64))  # 0-d stays an array
        return _max_abs(diff) if diff.size else 0.0
    scratch = _scratch()
    if r.size <= _BLOCK or not half:
        if r.size > _BLOCK:
            return _max_abs(np.subtract(e, r, dtype=np.float64))
        diff = scratch[: r.size].reshape(r.shape)
        return _max_abs(np.subtract(e, r, out=diff, dtype=np.float64)) if r.size else 0.0
    r, e = np.ravel(r), np.ravel(e)
    buf = scratch.view(np.float32)[:_BLOCK]
    peaks = []
    for start in range(0, r.size, _BLOCK):
        part = buf[: min(_BLOCK, r.size - start)]
        np.subtract(
            e[start : start + _BLOCK], r[start : start + _BLOCK], out=part, dtype=np.float32
        )
        peak = _max_abs(part)
        if not np.isfinite(peak):
            return peak
        peaks.append(peak)
    top = max(peaks)
    exact = scratch  # the same bytes, reused
    err = 0.0
    for k in (k for k, p in enumerate(peaks) if p == top):
        for start in range(k * _BLOCK, min((k + 1) * _BLOCK, r.size), exact.size):
            part = exact[: min(exact.size, r.size - start)]
            np.subtract(
                e[start : start + part.size],
                r[start : start + part.size],
                out=part,
                dtype=np.float64,
            )
            err = max(err, float(np.abs(part, out=part).max()))
    return err


def _max_abs(d: np.ndarray) -> float:
    """max |d| as max(max d, -min d), exactly: two reads and no pass that writes |d|
    (a third of the walk's time on PP-OCRv4 det at 1280x1280). NaN where one is."""
    high, low = float(d.max()), float(d.min())
    if np.isnan(high) or np.isnan(low):
        return float("nan")
    return abs(max(high, -low))  # abs: +0.0, as |d| gives, where every d is -0.0
