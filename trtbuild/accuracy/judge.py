"""The one judge: a candidate mixed model against the FP32 reference, under one assumption.

`build`, `report`, `tune` and `benchmarks/bench_tune.py` all call `judge`, so a
policy, its baselines, every tune trial and every peer tool's result are judged
the same way: one ONNX Runtime session per candidate on its emulated graph
with every tensor it needs marked (outputs of every feed, intermediates of the
first), Polygraphy's `SimpleCompareFunc` with the policy's tolerances on the
outputs, the first divergence along the graph, and the ops at risk. On a GPU
the engine's outputs replace the emulated ones; the divergence and the
at-risk list still come from the emulation, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from trtbuild.accuracy import risk
from trtbuild.accuracy.data import Feed
from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.evaluate import (
    EMULATED,
    REFERENCE,
    EngineRunner,
    OutputMetrics,
    finite_or_str,
    marked_session,
    metrics,
    psnr,
    quiet_polygraphy,
    run_marked,
)
from trtbuild.accuracy.progress import SampleProgress
from trtbuild.accuracy.reference import ReferenceTensors
from trtbuild.numerics import data_peak, sentinel_kept
from trtbuild.policy.model import AccuracySpec


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

    def outputs_json(self) -> dict[str, Any]:
        return {k: v.to_json() for k, v in self.outputs.items()}

    def first_overflow(self) -> dict[str, Any] | None:
        """The first intermediate the emulation makes non-finite where FP32 is finite."""
        return next((p for p in self.error_curve if p.get("nonfinite")), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "evaluator": self.evaluator,
            "emulation": self.emulation,
            "outputs": self.outputs_json(),
            "first_divergence": self.first_divergence,
            "error_curve": self.error_curve,
            "at_risk": self.at_risk,
        }


def judge(
    reference: ReferenceTensors,
    mixed: onnx.ModelProto,
    feeds: list[Feed],
    spec: AccuracySpec,
    *,
    label: str = EMULATED,
    engine_runner: EngineRunner | None = None,
    verbose: bool = False,
    progress: bool = True,
) -> Verdict:
    """Judge `mixed` (or, with `engine_runner`, its engine) against `reference`.

    `progress` shows samples on stderr once a run takes seconds; `tune` has a bar of its own.
    """
    from polygraphy.comparator.struct import IterationResult

    emulated = emulate(mixed, spec.emulation)
    present = {o for n in emulated.graph.node for o in n.output}  # a peer tool may fuse nodes
    tensors = [t for t, _, _ in reference.measures.order if t in present]
    sess = marked_session(emulated, list(dict.fromkeys(tensors + reference.measures.outputs)))
    emulated_feeds = feeds if engine_runner is None else feeds[:1]
    iterations, first = [], {}
    ticker = SampleProgress(f"judging {label}", len(emulated_feeds) if progress else 0)
    for k, feed in enumerate(emulated_feeds):
        values = run_marked(sess, feed)
        if k == 0:
            first = values
        outs = {o: values[o] for o in reference.measures.outputs}
        iterations.append(IterationResult(outs, runner_name=label))
        ticker.tick(k + 1)
    ticker.done()
    emulation: str | None = spec.emulation
    if engine_runner is not None:
        iterations, label, emulation = engine_runner.run(feeds, verbose), "tensorrt", None
    outputs, results = compare(reference, iterations, label, spec, verbose)
    first_div, curve = divergence(reference, first, spec.divergence_threshold)
    return Verdict(
        evaluator=label,
        emulation=emulation,
        passed=all(m.passed for m in outputs.values()),
        outputs=outputs,
        first_divergence=first_div,
        error_curve=curve,
        at_risk=risk.at_risk(reference.measures.internals, mixed),
        run_results=results,
    )


def compare(
    reference: ReferenceTensors, iterations: list, label: str, spec: AccuracySpec, verbose: bool
) -> tuple[dict[str, OutputMetrics], Any]:
    """Polygraphy's verdict per output and sample with the policy's tolerances, plus metrics."""
    from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc

    ref_iters = reference.run_results[REFERENCE]
    names = reference.measures.outputs
    results = RunResults()
    results.append((REFERENCE, ref_iters))
    results.append((label, iterations))
    tol = {n: spec.tolerance(n) for n in names}
    func = SimpleCompareFunc(
        atol={n: t.atol for n, t in tol.items()},
        rtol={n: t.rtol for n, t in tol.items()},
        check_error_stat={n: t.check_error_stat for n, t in tol.items()},
    )
    with quiet_polygraphy(verbose):
        per_iter = Comparator.compare_accuracy(results, compare_func=func)[0][(REFERENCE, label)]
    outputs = {}
    for name in names:
        refs = [np.asarray(it[name]) for it in ref_iters]
        outs = [np.asarray(it[name]) for it in iterations]
        m = metrics(
            np.concatenate([r.ravel() for r in refs]), np.concatenate([o.ravel() for o in outs])
        )
        failed = [k for k, it in enumerate(per_iter) if not bool(it[name])]
        outputs[name] = OutputMetrics(
            passed=not failed and m["nonfinite"] == 0,
            failed_samples=failed,
            atol=tol[name].atol,
            rtol=tol[name].rtol,
            check_error_stat=tol[name].check_error_stat,
            psnr=psnr(refs[0], outs[0]),
            **m,
        )
    return outputs, results


def divergence(
    reference: ReferenceTensors, values: dict[str, np.ndarray], threshold: float
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """First tensor (topological order) that is non-finite or off by > threshold of its range.

    `values` are the candidate's tensors on the first feed. A sentinel the
    candidate keeps (-3.4e38 become -inf) is not a divergence; a NaN always is.
    Returns the divergence (or None) and the per-tensor error curve along depth.
    """
    first, curve = None, []
    for depth, (tensor, node, op) in enumerate(reference.measures.order):
        if tensor not in reference.first or tensor not in values:
            continue
        r, e = np.asarray(reference.first[tensor]), np.asarray(values[tensor])
        if r.shape != e.shape:
            continue
        if tensor in reference.measures.sentinel_tensors:
            keep = ~sentinel_kept(r, e)
            r, e = r[keep], e[keep]
        bad, nan, scale, err = _error(r, e)
        rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
        rel = float("inf") if bad else rel
        curve.append(
            {
                "depth": depth,
                "node": node,
                "op": op,
                "tensor": tensor,
                "rel_error": finite_or_str(rel),
                "ref_max_abs": scale,
                "nonfinite": bad,
            }
        )
        if first is None and (bad or rel > threshold):
            kinds = ", ".join(f"{n} {k}" for n, k in ((nan, "NaN"), (bad - nan, "inf")) if n)
            reason = (
                f"{bad} non-finite value(s) ({kinds}) where FP32 is finite "
                f"(FP32 peak |x| = {scale:.4g})"
                if bad
                else f"error {rel:.2%} of the tensor's range exceeds {threshold:.0%}"
            )
            first = {"node": node, "op": op, "tensor": tensor, "reason": reason}
    return first, curve


def _error(r: np.ndarray, e: np.ndarray) -> tuple[int, int, float, float]:
    """(non-finite values of `e` where `r` is finite, of which NaN, data peak of `r`,
    largest |e - r| where both are finite), the difference taken in float64.

    One pass over a float64 difference when every value is finite (the usual
    case, on every tensor of every `tune` trial): a finite difference means
    both sides are finite. The masks only when it is not.
    """
    scale = data_peak(r)
    with np.errstate(all="ignore"):
        diff = np.asarray(np.subtract(e, r, dtype=np.float64))  # 0-d stays an array
        np.abs(diff, out=diff)
        err = float(diff.max()) if diff.size else 0.0
        if np.isfinite(err):
            return 0, 0, scale, err
        broke = ~np.isfinite(e) & np.isfinite(r)
        bad, nan = int(np.count_nonzero(broke)), int(np.count_nonzero(broke & np.isnan(e)))
        finite = diff[np.isfinite(e) & np.isfinite(r)]
        return bad, nan, scale, float(finite.max()) if finite.size else 0.0
