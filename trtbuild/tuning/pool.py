"""Judging `tune`'s candidates: one evaluation, the error map that seeds the search, workers.

Why worker processes: a trial is ONNX Runtime plus Python (assigning, converting,
emulating), mostly one core, and the search often knows its next candidates
before the verdicts come (the next doublings, both halves of a bisection, the
next removals). The front reach the workers by fork, never pickled: the
reference can be large.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.judge import Candidate, Verdict, judge, judge_all
from trtbuild.accuracy.reference import ReferenceTensors
from trtbuild.accuracy.sessions import REFERENCE
from trtbuild.children import run_task, stop_workers, worker_killed, worker_signals
from trtbuild.errors import raise_if_stopped
from trtbuild.front import Front
from trtbuild.policy.specs import Precision
from trtbuild.precision.assign import PrecisionSummary, assign
from trtbuild.precision.convert import convert

# A point (an index into `front.shapes`) and some of its samples (indices into its feeds).
Unit = tuple[int, tuple[int, ...]]


@dataclass(frozen=True)
class TrialOutcome:
    """What the search needs of one judged candidate: light, so it crosses processes."""

    passed: bool
    failing: dict[str, str]  # output (or "(intermediate)") -> the error that fails it
    overflow: dict[str, Any] | None  # the first intermediate turned non-finite
    worst: dict[str, float]  # output -> max_abs
    low_share: float
    seconds: float
    share: str  # `PrecisionSummary.share_text`: `80.0% FP16, 15.0% INT8`
    point_seconds: dict[str, float] = field(default_factory=dict)  # point label -> judging time
    failed_outputs: tuple[str, ...] = ()  # graph outputs that fail at some shape
    points: tuple[int, ...] = ()  # the points judged (indices into front.shapes), in order
    # the units judged (`judge_units`: a point and some of its samples), in order
    units: tuple[Unit, ...] = ()
    failed_on: int | None = None  # the sample a failure names first (where a unit failed)


def evaluate(front: Front, precision: Precision, points: tuple[int, ...] = ()) -> TrialOutcome:
    """Judge one pin set with the build's own judge at every shape (or only at `points`,
    indices into `front.shapes`), each on all its samples at once, the reference and the
    view shared: every point judged whatever fails. The search never calls it (it stops
    a candidate at its first failing unit); it is the oracle that early stop is checked
    against, in the tests and for a caller who wants every point's verdict."""
    started = time.perf_counter()
    every = points or tuple(range(len(front.shapes)))
    units = [(k, tuple(range(len(front.shapes[k].feeds)))) for k in every]
    return merge(judge_units(front, precision, units), time.perf_counter() - started)


def judge_units(
    front: Front, precision: Precision, units: Sequence[Unit], *, stop: bool = False
) -> list[TrialOutcome]:
    """One outcome per unit of `units` (a point and some of its samples), in that order;
    with `stop`, none after the first that fails.

    Why units: a candidate that fails on one sample fails, and at a large point a
    sample's run is most of what judging it costs (modnet at 1024²: 0.39 of 0.93 s,
    two samples); the search judges the sample likeliest to fail alone, then the
    others at once. A unit's verdict is the same whoever judged it and in whichever
    order, so the search composes units as it composes points.

    Only the overflow is walked (the reference is not run again): the search needs
    the outputs' verdict and the first tensor the candidate overflows. An overflow an
    output masks is ruled on as `build` rules on it (`accuracy.masked_overflow`). With
    several shapes a failure names its shape. The candidate is converted, emulated
    and given its session once for all its units (the session takes any shape); the
    first part's seconds include that.
    """
    t = time.perf_counter()
    candidate, summary = _candidate(front, precision)
    parts: list[TrialOutcome] = []
    for k, index in units:
        run = front.shapes[k]
        started = time.perf_counter()
        (verdict,) = judge_all(
            run.reference.samples(index),
            front.prepared.model,
            [candidate],
            [run.feeds[j] for j in index],
            front.policy.accuracy,
            detail="overflow",
            progress=False,
            samples=index,
        )
        part = _outcome(front, k, verdict, summary, t if not parts else started, started)
        named = [j for m in verdict.outputs.values() for j in m.failed_samples]
        named += [verdict.overflow.get("sample", 0)] if verdict.overflow else []
        failed_on = None if part.passed else (named or list(index))[0]
        parts.append(dataclasses.replace(part, units=((k, index),), failed_on=failed_on))
        if stop and not part.passed:
            break
    return parts


def _candidate(front: Front, precision: Precision) -> tuple[Candidate, PrecisionSummary]:
    """The pin set converted and emulated once for all its points (the session takes any
    shape), and its precision summary."""
    assignment = assign(front.view, precision, front.measures.ranges, front.analysis)
    mixed = convert(assignment).model
    candidate = Candidate(mixed, emulated=emulate(mixed, front.policy.accuracy.emulation))
    return candidate, assignment.summary()


def _outcome(
    front: Front,
    k: int,
    verdict: Verdict,
    summary: PrecisionSummary,
    since: float,
    started: float,
) -> TrialOutcome:
    """What the search keeps of a verdict at point `k`: its seconds counted from `since`
    (the first part's include the conversion), the point's judging time from `started`."""
    run = front.shapes[k]
    label = f"at {run.point.name}: " if len(front.shapes) > 1 else ""
    failing = {f"{label}{out}": label + v for out, v in verdict.failures().items()}
    now = time.perf_counter()
    return TrialOutcome(
        passed=not failing,
        failing=failing,
        overflow=verdict.overflow,
        worst={name: m.max_abs for name, m in verdict.outputs.items()},
        low_share=summary.low_share,
        seconds=round(now - since, 3),
        share=summary.share_text(),
        point_seconds={run.point.label: now - started},
        failed_outputs=tuple(sorted(n for n, m in verdict.outputs.items() if not m.passed)),
        points=(k,),
    )


def merge(parts: list[TrialOutcome], seconds: float) -> TrialOutcome:
    """One outcome from the outcomes of one pin set on each unit, in the order they were
    walked: the first overflow in that order, the worst error of all, the points and
    units walked. The same parts in the same order give the same outcome however (and
    in how many processes) they were judged."""
    failing: dict[str, str] = {}
    worst: dict[str, float] = {}
    point_seconds: dict[str, float] = {}
    for part in parts:
        failing.update(part.failing)
        for label, spent in part.point_seconds.items():  # a point's samples add up
            point_seconds[label] = point_seconds.get(label, 0.0) + spent
        for name, value in part.worst.items():
            worst[name] = max(worst.get(name, 0.0), value)
    return TrialOutcome(
        passed=not failing,
        failing=failing,
        overflow=next((p.overflow for p in parts if p.overflow), None),
        worst=worst,
        low_share=parts[0].low_share,
        seconds=round(seconds, 3),
        share=parts[0].share,
        point_seconds=point_seconds,
        failed_outputs=tuple(sorted({o for p in parts for o in p.failed_outputs})),
        points=tuple(dict.fromkeys(k for p in parts for k in p.points)),
        units=tuple(u for p in parts for u in p.units),
        failed_on=next((p.failed_on for p in parts if p.failed_on is not None), None),
    )


def error_map(front: Front, precision: Precision, point: int = 0) -> dict[str, float]:
    """Each tensor's error against FP32 (max |error| over its range) in one candidate, on
    the first feed of one point (an index into `front.shapes`): what the search's
    ranking reads.

    Why one feed at one point: the map only orders the suspects; the verdicts
    that decide still judge every feed at every shape. The search asks for the
    point where the candidate failed (the costliest, unless a cheaper one failed
    first): the error that fails is largest there. The reference runs again
    beside the candidate here (the judge's `divergence` walk), once per growth.
    """
    from polygraphy.comparator import RunResults

    run = front.shapes[point]
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
    worker_signals()


def judge_units_in_worker(job: tuple[Precision, tuple[Unit, ...], bool]) -> list[TrialOutcome]:
    """`judge_units` in a worker, on the front it inherited: (precision, units, stop)."""
    precision, units, stop = job
    return run_task(judge_units, _WORKER["front"], precision, units, stop=stop)


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
        try:
            yield workers
        except concurrent.futures.process.BrokenProcessPool as exc:
            killed = worker_killed(workers)  # before the stop: its workers are forgotten then
            stop_workers(workers)
            raise_if_stopped()  # the workers went with a stop of the command's own
            if killed is None:
                raise
            raise killed from exc
        except BaseException:  # Ctrl-C, SIGTERM: the batch in flight not waited for
            stop_workers(workers)
            raise


def point_size(shapes: dict[str, tuple[int, ...]]) -> int:
    """The elements a point feeds (every input's): the order of its judging cost."""
    return sum(math.prod(dims) for dims in shapes.values())
