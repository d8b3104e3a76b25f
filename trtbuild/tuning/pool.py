"""Judging `tune`'s candidates: one evaluation, the error map that seeds the search, workers.

Why worker processes: a trial is ONNX Runtime plus Python (assigning, converting,
emulating), mostly one core, and the search often knows its next candidates
before the verdicts come (the next doublings, both halves of a bisection, the
next removals). The front reach the workers by fork, never pickled: the
reference can be large.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.judge import Candidate, judge, judge_all
from trtbuild.accuracy.reference import ReferenceTensors
from trtbuild.accuracy.sessions import REFERENCE, usable_cores
from trtbuild.front import Front
from trtbuild.policy.specs import Precision
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert

# Workers beyond four rarely pay: the search seldom knows more than a few candidates ahead.
MAX_DEFAULT_JOBS = 4


def default_jobs() -> int:
    """`--jobs` by default: min(4, the cores this process may use)."""
    return min(MAX_DEFAULT_JOBS, usable_cores())


@dataclass(frozen=True)
class TrialOutcome:
    """What the search needs of one judged candidate: light, so it crosses processes."""

    passed: bool
    failing: dict[str, str]  # output (or "(intermediate)") -> the error that fails it
    overflow: dict[str, Any] | None  # the first intermediate turned non-finite
    worst: dict[str, float]  # output -> max_abs
    low_share: float
    seconds: float
    point_seconds: dict[str, float] = field(default_factory=dict)  # point label -> judging time
    failed_outputs: tuple[str, ...] = ()  # graph outputs that fail at some shape


def evaluate(front: Front, precision: Precision, points: tuple[int, ...] = ()) -> TrialOutcome:
    """Judge one pin set with the build's own judge, at every shape (or only at `points`,
    indices into `front.shapes`, for `merge`); the reference and the view are shared.

    Only the overflow is walked (the reference is not run again): the search
    needs the outputs' verdict and the first tensor the candidate overflows.
    An overflow an output masks is ruled on as `build` rules on it (the policy's
    `accuracy.masked_overflow`: fails by default, passes with `warn`). With
    several shapes a failure names its shape, and the first overflow found
    (in the shapes' order) picks what to pin.
    """
    t = time.perf_counter()
    assignment = assign(front.view, precision, front.measures.ranges, front.analysis)
    mixed = convert(assignment).model
    # emulated, probed and given its session once, for every shape (the session takes any)
    candidate = Candidate(mixed, emulated=emulate(mixed, front.policy.accuracy.emulation))
    failing: dict[str, str] = {}
    overflow, worst, point_seconds, failed = None, {}, {}, set()
    for run in [front.shapes[k] for k in points] if points else front.shapes:
        started = time.perf_counter()
        (verdict,) = judge_all(
            run.reference,
            front.prepared.model,
            [candidate],
            run.feeds,
            front.policy.accuracy,
            detail="overflow",
            progress=False,
        )
        label = f"at {run.point.name}: " if len(front.shapes) > 1 else ""
        failing.update({f"{label}{k}": label + v for k, v in verdict.failures().items()})
        failed.update(name for name, m in verdict.outputs.items() if not m.passed)
        overflow = overflow or verdict.overflow
        for name, m in verdict.outputs.items():
            worst[name] = max(worst.get(name, 0.0), m.max_abs)
        point_seconds[run.point.label] = time.perf_counter() - started
    return TrialOutcome(
        passed=not failing,
        failing=failing,
        overflow=overflow,
        worst=worst,
        low_share=assignment.summary().low_share,
        seconds=round(time.perf_counter() - t, 3),
        point_seconds=point_seconds,
        failed_outputs=tuple(sorted(failed)),
    )


def merge(parts: list[TrialOutcome], seconds: float) -> TrialOutcome:
    """One outcome from the outcomes of one pin set at each point, in the points' order:
    what `evaluate` at every point returns (the first overflow in that order, the worst
    error of all), so a set judged point by point in parallel gives the same trial."""
    failing: dict[str, str] = {}
    worst: dict[str, float] = {}
    point_seconds: dict[str, float] = {}
    for part in parts:
        failing.update(part.failing)
        point_seconds.update(part.point_seconds)
        for name, value in part.worst.items():
            worst[name] = max(worst.get(name, 0.0), value)
    return TrialOutcome(
        passed=not failing,
        failing=failing,
        overflow=next((p.overflow for p in parts if p.overflow), None),
        worst=worst,
        low_share=parts[0].low_share,
        seconds=round(seconds, 3),
        point_seconds=point_seconds,
        failed_outputs=tuple(sorted({o for p in parts for o in p.failed_outputs})),
    )


def error_map(front: Front, precision: Precision) -> dict[str, float]:
    """Each tensor's error against FP32 (max |error| over its range) in one candidate, on
    the first feed of the primary shape: what the search's ranking reads.

    Why one feed: the map only orders the suspects; the verdicts that decide
    still judge every feed at every shape. The reference runs again beside the
    candidate here (the judge's `divergence` walk), once per search.
    """
    from polygraphy.comparator import RunResults

    run = front.shapes[0]
    first = RunResults()
    first.append((REFERENCE, [run.reference.run_results[REFERENCE][0]]))
    reference = ReferenceTensors(run.reference.measures, first)
    assignment = assign(front.view, precision, front.measures.ranges, front.analysis)
    verdict = judge(
        reference,
        front.prepared.model,
        convert(assignment).model,
        run.feeds[:1],
        front.policy.accuracy,
        detail="divergence",
        progress=False,
    )
    return {p["tensor"]: float(p["rel_error"]) for p in verdict.error_curve}


# Set in each worker process by the pool's initializer, never in the parent: the front
# arrives by fork (never pickled: the reference is large).
_WORKER: dict[str, Front] = {}


def _init_worker(front: Front) -> None:
    _WORKER["front"] = front


def evaluate_in_worker(precision: Precision) -> TrialOutcome:
    """`evaluate` in a worker, on the front it inherited."""
    return evaluate(_WORKER["front"], precision)


def evaluate_point_in_worker(job: tuple[Precision, int]) -> TrialOutcome:
    """`evaluate` at one point (an index into the inherited front's shapes) in a worker."""
    precision, point = job
    return evaluate(_WORKER["front"], precision, (point,))


@contextlib.contextmanager
def pool(front: Front, jobs: int) -> Iterator[Any]:
    """Worker processes that inherit `front` by fork; None with one job (or no fork)."""
    import concurrent.futures
    import multiprocessing

    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    context = multiprocessing.get_context("fork")  # fork: initargs are inherited, not pickled
    with concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_init_worker, initargs=(front,)
    ) as workers:
        yield workers
