"""The search: start from range analysis, grow along the worst error's path, then shrink.

Why in this order: range analysis and the first overflow name pins for free
(a tensor past the low precision's range is inf there, whatever else is
pinned); what no overflow names, one emulated run's error map ranks, and the
search grows the most suspect groups first, doubling, until a candidate passes,
then halves back to the shortest passing run; shrinking removes what turned out
not to be needed. With several jobs, the candidates the search may ask next are
judged in parallel, but a verdict becomes a trial only when the one-job search
asks for it: the log and the policy are the same whatever `jobs` is.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from trtbuild.front import Front
from trtbuild.graph.qdq import is_qdq
from trtbuild.graph.view import GraphView
from trtbuild.numerics import LOW_INF_AT, LOW_MAX
from trtbuild.policy.specs import Precision
from trtbuild.precision.assign import assign, integer_cast
from trtbuild.tuning.alone import MOST_ALONE, errors_alone, rank_alone
from trtbuild.tuning.groups import (
    Group,
    beyond_range,
    candidate_precision,
    groups,
    on_path,
    pin_rules,
    scopes,
    suspects,
    suspicion,
)
from trtbuild.tuning.pool import (
    TrialOutcome,
    Unit,
    error_map,
    judge_units,
    judge_units_in_worker,
    merge,
    point_size,
    pool,
)


@dataclass
class Trial:
    """One evaluation of a candidate pin set."""

    step: int
    action: str
    pinned: tuple[int, ...]  # group indices
    passed: bool
    low_share: float
    failing: dict[str, str]  # output -> the measured error that fails it
    worst: dict[str, float]  # output -> max_abs
    seconds: float
    points: tuple[str, ...] = ()  # the points judged, in order: a failure stops the walk


class Ranking(NamedTuple):
    """How the growing ranked its suspects, where the error map ranked none (`alone`)."""

    after: int  # the trials recorded before it: the log says it on the next one
    note: str  # the same whatever the machine: the log is the same whatever `jobs` is
    seconds: float


@dataclass
class SearchResult:
    """What `tune` found, and what it cost."""

    policy: Precision
    groups: list[Group]
    pinned: list[int]
    reasons: dict[int, str]  # group -> why it is needed
    share: str  # the final candidate's `PrecisionSummary.share_text`: `80.0% FP16, 15.0% INT8`
    trials: list[Trial] = field(default_factory=list)
    passed: bool = False
    low_share: float = 0.0  # the share in the policy's low precision (`low`)
    budget: int = 0
    low: str = "fp16"
    point_seconds: dict[str, float] = field(default_factory=dict)  # point -> judging seconds
    # the budget ran out where the search wanted a verdict it did not have: a smaller pin
    # set (or, failing, a passing one) may have been missed. Not "every evaluation used": a
    # search that ends on its last evaluation was given enough.
    exhausted: bool = False
    points: int = 1  # the points of the input space a candidate is judged at
    rule_groups: dict[str, int] = field(default_factory=dict)  # a pin's rule id -> its group
    # how the growing ranked its suspects where the error map ranked none
    rankings: list[Ranking] = field(default_factory=list)
    # where the quantization alone fails the tolerances against the reference model:
    # `at POINT: OUTPUT, ...` each (no FP32 pin can fix it: the search judged its start only)
    quantization_fails: list[str] = field(default_factory=list)
    # where the growing stopped at an overflow made by a node the policy keeps in the low
    # precision past its range (`_ruled_overflow`): that node, its rule and its peak, in words
    ruled_overflow: str = ""
    # the policy's own rules that keep nodes on the final candidate's failing outputs' paths
    # in the low precision: rule id -> those nodes (no pin changes them: `stuck_warning`)
    kept_low: dict[str, list[str]] = field(default_factory=dict)

    @property
    def start_share(self) -> float:
        """The low share of the first candidate (the policy's rules and range analysis's
        pins): what the values alone leave in the low precision, whatever the tolerances."""
        return self.trials[0].low_share if self.trials else 1.0

    @property
    def costliest_point(self) -> str | None:
        """`max [1, 3, 1024, 1024] (71% of the judging time)`, where several points were
        judged (with the early stop, a search cut short may have judged only the one it
        tried first: the cheapest, which says nothing of what the others cost)."""
        if self.points < 2 or len(self.point_seconds) < 2:
            return None
        label, seconds = max(self.point_seconds.items(), key=lambda kv: kv[1])
        return f"{label} ({seconds / max(sum(self.point_seconds.values()), 1e-9):.0%} of the judging time)"

    @property
    def searched(self) -> int:
        """The groups the search moved: a scope `_merge` offered is no group of its own."""
        return sum(1 for g in self.groups if not g.regex)

    @property
    def full_search(self) -> int:
        """Evaluations a full search needs at most: the start; per group pinned while
        growing, doublings and halvings (twice log2 of the groups) and its pin; twice the
        groups while shrinking (chunks halving down to one); with several points, a
        growing again per point left out and its verification."""
        n = self.searched
        grow = 1 + n * (2 * math.ceil(math.log2(max(n, 2))) + 1)
        return grow * self.points + (self.points - 1) + 2 * n


class PointWalk:
    """Each pin set's verdict per unit (a point, some of its samples), and the order a
    candidate is walked through them.

    A pin set's verdict is composed from its units' verdicts, a unit being a point
    and some of its samples (judged now or ahead, in any process), in the order of
    `units` when the search asks, up to the first failing one: what judging them
    in that order and stopping there gives, however they were judged.
    """

    def __init__(self, sizes: list[int], samples: list[int]):
        self.sizes = sizes  # the elements each point feeds: its judging cost's order
        self.samples = samples  # each point's samples
        self.parts: dict[tuple[int, ...], dict[Unit, TrialOutcome]] = {}  # by pin set, unit
        self.last_failed: dict[int, int] = {}  # point -> the last trial that failed there
        self.lead: dict[int, int] = {}  # point -> the sample a trial last failed on there
        self.counted: dict[tuple[int, ...], set[Unit]] = {}  # pin set -> units in a verdict
        # False while the search's passes are provisional (`walking`); True to verify
        self.full = True

    def order(self) -> list[int]:
        """The points in the order a candidate is walked: the one that failed last first
        (a candidate like the last failing one fails there too), then the largest
        (where sums and errors grow, and what costs most to judge: a failure found
        there spares the smaller points). Before any trial failed, the cheapest first:
        where a candidate fails is not known yet, and a failure at the cheapest point
        costs least while a pass walks every point anyway (PP-OCRv4 det's first trial
        fails at 320x320 only: 0.2 s instead of 1.3 s walking 960 and 640 first). Only
        recorded trials move it, so it is the same whatever `jobs` is."""
        n = len(self.sizes)
        ahead = -1 if self.last_failed else 1  # the largest first once a trial failed
        return sorted(
            range(n), key=lambda k: (-self.last_failed.get(k, 0), ahead * self.sizes[k], k)
        )

    def walking(self) -> list[int]:
        """The points a verdict is composed from now, in `order`: every point, or while the
        search is provisional (`full` False) all but those larger than every point some
        recorded trial failed at (every point until one fails).

        Why: a candidate like the ones that failed fails where they failed, and a point
        larger than all of those is what a pass costs most; a smaller one costs little
        to walk and would only risk a verification that fails. The search's answer is
        judged at every point before it stands.
        """
        order = self.order()
        if self.full or not self.last_failed:
            return order
        largest = max(self.sizes[k] for k in self.last_failed)
        return [k for k in order if self.sizes[k] <= largest]

    def units(self) -> list[Unit]:
        """The units a verdict walks now: at each point of `walking`, the sample a trial last
        failed on there alone (a candidate like the last failing one fails on it too, and
        a failure there spares the others' runs), then the others at once."""
        found: list[Unit] = []
        for k in self.walking():
            lead = self.lead.get(k, 0)
            rest = tuple(j for j in range(self.samples[k]) if j != lead)
            found += [(k, (lead,)), *([(k, rest)] if rest else [])]
        return found

    def provisional(self) -> bool:
        """Whether a pass composed now may leave out a point."""
        return len(self.walking()) < len(self.sizes)

    def answers(self, outcome: TrialOutcome) -> bool:
        """Whether a recorded verdict answers what is asked now: a failure anywhere always
        (a candidate that fails at one point fails); a pass only where it was judged at
        every point `walking` names now."""
        return not outcome.passed or set(self.walking()) <= set(outcome.points)

    def missing(self, key: tuple[int, ...]) -> list[Unit]:
        """The units still to judge for `key`'s verdict: those of `units` before the first
        one already known to fail (none once a failure or every pass is known)."""
        parts = self.parts.get(key, {})
        todo = []
        for unit in self.units():
            part = parts.get(unit)
            if part is None:
                todo.append(unit)
            elif not part.passed:
                break
        return todo

    def compose(self, key: tuple[int, ...]) -> TrialOutcome:
        """`key`'s verdict from its parts, walked in `units` up to the first failing one; its
        seconds those of the parts no verdict on `key` counted before (a verification
        walks the growing's passes again)."""
        parts, counted = self.parts[key], self.counted.setdefault(key, set())
        walked = []
        for unit in self.units():
            walked.append(unit)
            if not parts[unit].passed:
                break
        fresh = [parts[u] for u in walked if u not in counted]
        counted.update(walked)
        outcome = merge([parts[u] for u in walked], sum(p.seconds for p in fresh))
        spent = merge(fresh, 0.0).point_seconds if fresh else {}
        return replace(outcome, point_seconds=spent)


class Search:
    """The search's state: its groups, what it pinned and why, and every verdict recorded.

    `known` holds every recorded verdict (a pin set is judged once per unit); `walk` holds
    each pin set's verdict per unit, judged now or ahead in parallel, and composes a verdict
    from them when the one-job search asks for it: only then does it become a trial.
    """

    def __init__(self, front: Front, budget: int, objective: str, seed: int, jobs: int):
        self.front, self.budget, self.jobs = front, budget, jobs
        self.low = front.policy.precision.default  # fp16 | bf16 (check_policy refused fp32)
        self.groups = groups(front, objective)
        # a tuned rule's regex may also match Q/DQ nodes: no rule pins them (`precision.quantized`)
        self.names = [n.name for n in front.view.nodes if not is_qdq(n.op_type)]
        self.by_node = {i: k for k, g in enumerate(self.groups) for i in g.nodes}
        self.tiebreak = list(range(len(self.groups)))
        random.Random(seed).shuffle(self.tiebreak)
        self.trials: list[Trial] = []
        self.reasons: dict[int, str] = {}
        self.pinned: list[int] = []
        self.progress: Callable[[Trial, int], None] | None = None
        self.pool: Any = None
        self.known: dict[tuple[int, ...], TrialOutcome] = {}  # pin set -> its recorded verdict
        self.point_seconds: dict[str, float] = {}  # point label -> judging seconds, all trials
        self.walk = PointWalk(
            [point_size(run.point.shapes) for run in front.shapes],
            [len(run.feeds) for run in front.shapes],
        )
        self.exhausted, self.ruled_overflow = False, ""  # as SearchResult's, set as found
        # the values made low when measured -> group -> output -> its error alone
        self.alone: dict[frozenset[str], dict[int, dict[str, float]]] = {}
        self.rankings: list[Ranking] = []

    def precision(self, pinned: list[int]) -> Precision:
        return candidate_precision(self.front.policy.precision, self.groups, pinned, self.names)

    def record(self, pinned: list[int], action: str, outcome: TrialOutcome) -> TrialOutcome:
        o = outcome
        trial = Trial(
            len(self.trials) + 1,
            action,
            tuple(sorted(pinned)),
            o.passed,
            o.low_share,
            o.failing,
            o.worst,
            o.seconds,
            tuple(self.front.shapes[k].point.name for k in o.points),
        )
        for label, seconds in o.point_seconds.items():
            self.point_seconds[label] = self.point_seconds.get(label, 0.0) + seconds
        if not o.passed and o.units:  # where it failed: walked first next time
            k = o.units[-1][0]
            self.walk.last_failed[k], self.walk.lead[k] = trial.step, o.failed_on or 0
        self.trials.append(trial)
        self.known[trial.pinned] = outcome
        if self.progress:
            self.progress(trial, self.budget)
        return outcome

    def try_pins(self, pinned: list[int], action: str) -> TrialOutcome:
        """The verdict on `pinned`: remembered, or composed from its units (judged now or
        ahead) and recorded."""
        key = tuple(sorted(pinned))
        if self.remembered(key):
            return self.known[key]
        todo = self.walk.missing(key)
        if todo:
            self.judge_now(key, todo)
        return self.record(pinned, action, self.walk.compose(key))

    def judge_now(self, key: tuple[int, ...], todo: list[Unit]) -> None:
        """Judge `key` on `todo` (units, in walking order), stopping at the first failure;
        with workers, the first unit (the likeliest to fail) alone, and the others at
        once only if it passes."""
        precision = self.precision(list(key))
        parts = self.walk.parts.setdefault(key, {})
        first = todo if self.pool is None else todo[:1]
        for part in judge_units(self.front, precision, first, stop=True):
            parts[part.units[0]] = part
        rest = todo[len(first) :]
        if rest and all(parts[u].passed for u in first):
            jobs = [(precision, (u,), True) for u in rest]
            for (part,) in self.pool.map(judge_units_in_worker, jobs):
                parts[part.units[0]] = part

    def judge_ahead(self, candidates: list[list[int]]) -> None:
        """Judge the pin sets the search may ask for next, in parallel (the first is the
        one it asks for now), each along today's `order` up to its first failure; nothing
        is recorded until the search asks."""
        if self.pool is None:
            return
        keys = [tuple(sorted(c)) for c in candidates]
        todo = [k for k in dict.fromkeys(keys) if not self.remembered(k) and self.walk.missing(k)]
        todo = todo[: max(0, min(self.jobs, self.left()))]
        if len(todo) < 2:  # one set is judged where it is asked for
            return
        jobs = [(self.precision(list(k)), tuple(self.walk.missing(k)), True) for k in todo]
        for key, parts in zip(todo, self.pool.map(judge_units_in_worker, jobs)):
            self.walk.parts.setdefault(key, {}).update({p.units[0]: p for p in parts})

    def remembered(self, key: tuple[int, ...]) -> bool:
        """Whether a recorded verdict on `key` answers what is asked now (`PointWalk.answers`)."""
        return key in self.known and self.walk.answers(self.known[key])

    def left(self) -> int:
        """Evaluations left; while verdicts are provisional, one is kept for the verification."""
        return self.budget - len(self.trials) - (1 if self.walk.provisional() else 0)

    def affords(self, pinned: list[int]) -> bool:
        """Whether the search may have the verdict on `pinned`: remembered, or within the
        budget (one judged ahead is a trial too, as with one job); remembers a refusal."""
        key = tuple(sorted(pinned))
        if self.remembered(key) or self.left() > 0:
            return True
        self.exhausted = True
        return False

    def label(self, picked: list[int]) -> str:
        return self.groups[picked[0]].label + (f" and {len(picked) - 1} more" if picked[1:] else "")


def _suspects(search: Search, failing: TrialOutcome, rest: list[int]) -> list[int]:
    """The groups of `rest` on a failing output's path, most suspect first: by the error
    map (`suspicion`), or where it scores every suspect alike, by what each adds alone."""
    errors = _ranking_errors(search, failing)
    view, outputs = search.front.view, failing.failed_outputs
    score = suspicion(view, search.groups, rest, errors, outputs, search.low)
    order = suspects(score, search.groups)
    first = next(iter(score.values()), 0.0)
    if len(order) < 2 or any(not math.isclose(v, first, rel_tol=1e-9) for v in score.values()):
        return order
    return _ranked_alone(search, order, outputs)


def _ranked_alone(search: Search, order: list[int], outputs: tuple[str, ...]) -> list[int]:
    """`order` ranked by each group's error alone (`alone`), at the cheapest point; where
    the gated graph cannot run, `order` as it is: a ranking never stops `tune`.

    At most `MOST_ALONE` suspects are run, the first of `order` (nearest the outputs);
    the others follow as they are. A fixed number, not the budget left: a budget only
    cuts a search short, it never changes the path it takes.
    """
    started = time.perf_counter()
    order = suspects(dict.fromkeys(order, 0.0), search.groups)  # alike: nearest first
    ranked = order[:MOST_ALONE]
    low_made = _low_made(search)
    measured = search.alone.setdefault(low_made, {})  # under other pins: measured again
    todo = [k for k in ranked if k not in measured]
    point = min(range(len(search.walk.sizes)), key=lambda k: (search.walk.sizes[k], k))
    alike, why = f"the error map scores its {len(order)} suspects alike", ""
    try:
        found = (
            errors_alone(search.front, search.groups, todo, search.low, point, low_made)
            if todo
            else {}
        )
    except Exception as exc:  # ONNX Runtime's own errors, any of them: the map's order stands
        found, why = None, f"{type(exc).__name__}: {(str(exc) or '?').splitlines()[0][:160]}"
    if found is None:
        note = f"{alike}, and could not rank them alone ({why}): nearest the outputs first"
        search.rankings.append(Ranking(len(search.trials), note, time.perf_counter() - started))
        return order
    measured.update(found)
    blind = sum(1 for k in ranked if k not in measured)
    where = search.front.shapes[point].point.name
    rest = len(order) - len(ranked)
    before = sum(1 for k in ranked if k in measured) - len(found)  # an earlier round's
    runs = f"{len(found)} runs" + (f", {before} measured before" if before else "")
    note = (
        f"{alike}: ranked {f'the {len(ranked)} nearest the outputs ' if rest else ''}"
        f"by each one's error alone at {where} ({runs if found or not before else 'each measured before'})"
        + (f"; {blind} inside control-flow bodies, not measured, first" if blind else "")
        + (f"; the other {rest} after them (at most {MOST_ALONE} runs)" if rest else "")
    )
    search.rankings.append(Ranking(len(search.trials), note, time.perf_counter() - started))
    return rank_alone(ranked, measured, outputs) + order[len(ranked) :]


def _low_made(search: Search) -> frozenset[str]:
    """The values the current candidate's makers store in the low precision, whether or not
    their readers are pinned (`alone._Gated`). Not a Dequantize's: it follows its reader,
    and pinning the reader makes it FP32; nor a Cast's of integers, which pinning its
    reader makes FP32 too (`assign.EXACT_CAST`)."""
    view = search.front.view
    return frozenset(
        t
        for i, p in enumerate(_precisions(search, search.pinned))
        if p == search.low and not _follows_reader(view, i)
        for t in view.nodes[i].output
    )


def _follows_reader(view: GraphView, i: int) -> bool:
    """Whether node i is made FP32 by pinning what reads it: a Q/DQ, a Cast of integers."""
    return is_qdq(view.nodes[i].op_type) or integer_cast(view, i)


def _ranking_errors(search: Search, failing: TrialOutcome) -> dict[str, float]:
    """The current candidate's per-tensor errors (one emulated run beside the reference)
    at the point where it failed (the last it was judged at), else the largest."""
    point = failing.points[-1] if failing.points else search.walk.order()[0]
    return error_map(search.front, search.precision(search.pinned), point)


# -- the steps, in the order `tune` takes them ------------------------------------


def _start(search: Search) -> TrialOutcome:
    """Range analysis: what leaves the low precision's range is pinned before any trial."""
    low = search.low
    search.pinned = beyond_range(search.groups, low)
    for k in search.pinned:
        group = search.groups[k]  # it reads the peak from outside, or makes it
        said = (
            f"reads |x| = {group.peak:.4g} from {group.read}"
            if group.read
            else f"reaches |x| = {group.peak:.4g}"
        )
        search.reasons[k] = (
            f"{said} on the reference data ({low.upper()} max {LOW_MAX[low]:.6g})"
            + (f": inf in {low.upper()}" if group.overflows(low) else "")
        )
    action = "start: range analysis" if search.pinned else "start: policy rules only"
    return search.try_pins(search.pinned, action)


def _grow(search: Search, outcome: TrialOutcome) -> TrialOutcome:
    """While failing: an overflow pins its own group; otherwise the suspects grow. An
    overflow made where the policy's own rule keeps a node low, past the range in FP32
    already, stops it: no pin changes that node (`_ruled_overflow`)."""
    search.ruled_overflow = ""
    while not outcome.passed:
        search.ruled_overflow = _ruled_overflow(search, outcome.overflow)
        if search.ruled_overflow:
            break
        culprit = _overflowing_group(search, outcome.overflow)
        if culprit is not None and not search.affords([*search.pinned, culprit]):
            break
        if culprit is None:
            found = _grow_suspects(search, outcome)
            if found is None:
                break
            outcome = found
            continue
        why = "; ".join(outcome.failing.values()) or "output below tolerance"
        search.reasons[culprit] = why
        search.pinned = sorted({*search.pinned, culprit})
        before, outcome = outcome, search.try_pins(search.pinned, f"pin {search.label([culprit])}")
        if _same_overflow(before.overflow, outcome.overflow):  # upstream, and it did not help
            search.reasons[culprit] = f"pinned upstream of an overflow it did not end: {why}"
    return outcome


def _same_overflow(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two runs' first overflows are one: the same node, tensor and sample."""
    keys = ("node", "tensor", "sample")
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in keys)


def _doublings(n: int) -> list[int]:
    """1, 2, 4, ... up to n, n last: the run lengths the growing tries."""
    found, length = [], 1
    while length < n:
        found.append(length)
        length *= 2
    return [*found, n] if n else []


def _grow_suspects(search: Search, failing: TrialOutcome) -> TrialOutcome | None:
    """Pin the shortest run of suspects (most suspect first) that passes; None when every
    suspect pinned still fails on the outputs they were ranked for (all of them stay
    pinned) or the budget ran out first. Where every suspect pinned fails on an output
    that had not failed, or by an overflow that names a group not pinned yet, that trial:
    the growing goes on with that output's suspects, or pins that group (two outputs,
    each wrong on another sample: the second failed only once the first passed, and the
    search had stopped there; an overflow on a later sample, masked in the outputs, is
    judged only once the lead sample's outputs hold, and the search had stopped there
    and written a policy that `build` fails).

    Doubling the run finds a passing length in about log2 of the suspects it
    needs, and halving between the last failing and the first passing length
    finds the shortest (the verdict along the run is taken as monotonic:
    pinning more rarely hurts). Out of evaluations while halving, the shortest
    passing run found so far is pinned.
    """
    rest = [k for k in range(len(search.groups)) if k not in search.pinned]
    if not rest:  # every group pinned already: nothing to grow
        return None
    if search.left() <= 0:  # a run of new pins is a new verdict: no ranking run for nothing
        search.exhausted = True
        return None
    order = _suspects(search, failing, rest)
    run = lambda n: [*search.pinned, *order[:n]]  # noqa: E731 - the candidate of length n
    lengths = _doublings(len(order))
    lo, hi, why = 0, None, failing
    for k, n in enumerate(lengths):
        if not search.affords(run(n)):
            return None
        search.judge_ahead([run(m) for m in lengths[k : k + search.jobs]])
        trial = search.try_pins(run(n), f"grow: pin {search.label(order[:n])}")
        if trial.passed:
            hi = n
            break
        lo, why = n, trial
    if hi is None:
        return _all_suspects(search, order, failing, why)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if not search.affords(run(mid)):
            break
        search.judge_ahead([run(m) for m in (mid, (lo + mid) // 2, (mid + hi) // 2) if lo < m < hi])
        trial = search.try_pins(run(mid), f"bisect: pin {search.label(order[:mid])}")
        if trial.passed:
            hi = mid
        else:
            lo, why = mid, trial
    # the run without order[lo:hi] failed so: their reason; one in order[:lo] was pinned
    # in that run too (it was "kept (not re-checked ...)" unless the shrink measures it)
    said = "; ".join(why.failing.values()) or "output below tolerance"
    for k in order[lo:hi]:
        search.reasons[k] = said if hi - lo == 1 else f"without it and {hi - lo - 1} more: {said}"
    search.pinned = sorted({*search.pinned, *order[:hi]})
    return search.try_pins(search.pinned, f"pin {search.label(order[:hi])}")


def _all_suspects(
    search: Search, order: list[int], failing: TrialOutcome, why: TrialOutcome
) -> TrialOutcome | None:
    """Every suspect pinned, and `why` the run with all of them failing: `why` where it
    fails on an output that had not failed or by an overflow naming a group to pin
    (`_grow` goes on: the shrink measures them); else None, and each keeps that run's
    error as why it is there (none was measured alone; "kept (not re-checked within the
    budget)" blamed a budget that had not run out)."""
    search.pinned = sorted({*search.pinned, *order})
    new = set(why.failed_outputs) - set(failing.failed_outputs)
    if new or _overflowing_group(search, why.overflow) is not None:
        return why
    said = "; ".join(why.failing.values()) or "output below tolerance"
    for k in order:
        search.reasons[k] = (
            f"pinned with every suspect of the failing outputs; with all of them: {said}"
        )
    return None


def _shrink(search: Search) -> None:
    """Delta debugging: unpin chunks of the pinned groups, costliest first, halving the
    chunk down to single groups; a group whose removal fails keeps that error as its
    reason. A group beyond the low precision's range is never unpinned: it would be inf."""
    order = sorted(search.pinned, key=lambda k: (-search.groups[k].cost, search.tiebreak[k]))
    order = [k for k in order if not search.groups[k].overflows(search.low)]
    chunk = max(1, len(order) // 2)
    while order:
        i = 0
        while i < len(order):
            parts = [order[j : j + chunk] for j in range(i, len(order), chunk)]
            without = [[g for g in search.pinned if g not in part] for part in parts]
            if not search.affords(without[0]):
                return
            search.judge_ahead(without[: search.jobs])  # each assumed to fail: most pins are needed
            outcome = search.try_pins(without[0], f"unpin {search.label(parts[0])}")
            if outcome.passed:
                search.pinned = without[0]
                order = [g for g in order if g not in parts[0]]
                for g in parts[0]:
                    search.reasons.pop(g, None)
                continue
            if chunk == 1:
                search.reasons[parts[0][0]] = "without it: " + "; ".join(outcome.failing.values())
            i += chunk
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)


def _grown(search: Search) -> bool:
    """Whether growing on provisional verdicts (`PointWalk.walking`) found a pin set that
    passes at every point, judged there once it is found. A point that fails there had
    failed no trial before: the growing starts again from the range analysis, walking
    it too (the verdicts it has stay valid, so it judges only what that point may
    change). Each round walks at least one point more, so it ends.

    Why only the growing: its passes are few and costly; the shrink's passes remove
    pins one chunk after another, and a point left out there (measured on PP-OCRv4 det
    with `--objective flops`) fails the answer after most of the search, which then
    starts again.
    """
    while True:
        search.walk.full, search.reasons = False, {}
        outcome = _grow(search, _start(search))
        search.walk.full = True
        if not outcome.passed or not search.affords(search.pinned):
            return False
        if search.try_pins(search.pinned, "verify: every point").passed:
            return True
        if search.left() <= 0:
            search.exhausted = True  # it would search again, walking the point that failed
            return False


def _merge(search: Search) -> None:
    r"""Merge single-node pins into one rule per scope (`^/f_branch/conv_f\.0/`) where the
    judge agrees: a scope that selects exactly the pinned nodes is the same candidate
    (no evaluation); one that adds nodes is judged at every point and kept if it
    passes. What a person would write, at a bounded cost in low-precision nodes
    (`groups.MERGE_EXTRA`); the budget left is all it spends."""
    tried: set[str] = set()
    current = _precisions(search, search.pinned)
    while True:
        offered = [s for s in scopes(search.groups, search.pinned) if s.prefix not in tried]
        if not offered:
            return
        scope = offered[0]
        tried.add(scope.prefix)
        search.groups.append(scope.group(search.groups))
        k = len(search.groups) - 1
        merged = sorted({*(g for g in search.pinned if g not in scope.covered), k})
        pins = sum(g in scope.covered for g in search.pinned)  # single nodes and units
        if _precisions(search, merged) == current:
            search.known[tuple(merged)] = search.known[tuple(sorted(search.pinned))]
            nodes = len(search.groups[k].nodes)
            why = f"selects exactly the {nodes} nodes of the {pins} pins inside it"
        else:
            if search.left() <= 0:
                return
            if not search.try_pins(merged, f"merge into scope {scope.prefix}").passed:
                continue
            why = f"{pins} pins inside it merged; every tolerance holds with all of it"
        firsts = [search.reasons.pop(g, "") for g in search.pinned if g in scope.covered]
        why += f" (first: {firsts[0]})" if firsts and firsts[0] else ""
        blind = firsts.count("")  # pins never measured alone: still so, merged
        many = "every one" if blind == len(firsts) else f"{blind} of them"
        search.reasons[k] = why + (f"; {many} {_unmeasured(search)}" if blind else "")
        search.pinned = merged
        current = _precisions(search, merged)


def _precisions(search: Search, pinned: list[int]) -> list[str | None]:
    """Each node's precision under `pinned`: two pin sets alike here are one candidate."""
    f = search.front
    assignment = assign(f.view, search.precision(pinned), f.measures.ranges, f.analysis)
    return [d.precision for d in assignment.decisions]


def _overflowing_group(search: Search, first: dict[str, Any] | None) -> int | None:
    """The unpinned group where the emulation first turns non-finite (or nearest upstream).

    Where that is a Cast the conversion added (a value narrowed for a low reader), the
    unpinned groups reading its source first: the value fits where it is made, not
    where it is read.
    """
    if first is None or _ruled_overflow(search, first):
        return None
    view = search.front.view
    index = {n.name: i for i, n in enumerate(view.nodes)}
    queue: list[int] = []
    if first["node"] in index:
        queue.append(index[first["node"]])
    elif first.get("source"):  # a boundary Cast: not a node of the view
        source = first["source"]
        queue += sorted(view.consumers.get(source, ()))
        queue += [view.producer[source]] if source in view.producer else []
    seen: set[int] = set()
    while queue:
        i = queue.pop(0)
        if i in seen:
            continue
        seen.add(i)
        k = search.by_node.get(i)
        if k is not None and k not in search.pinned:
            return k
        queue.extend(view.predecessors(i))
    return None


def _ruled_overflow(search: Search, first: dict[str, Any] | None) -> str:
    """Where the first overflow is made by a node no group holds (the policy's own rule, or
    the model's low inputs and outputs, decided it) that runs in the low precision, and whose
    FP32 values already pass the low range: that node, what decided it and its peak, in
    words; "" otherwise.

    Why: no FP32 pin changes such a node, and walking upstream to a group to pin (what an
    overflow of a value rounded over the range needs) pinned `/a/Mul` for the inf a rule
    keeping `/b/Mul` (8e4) in FP16 makes, and gave it that inf as its reason.
    """
    if first is None or first.get("source"):  # a boundary Cast's: its readers decide it
        return ""
    f, low = search.front, search.low
    i = next((k for k, n in enumerate(f.view.nodes) if n.name == first["node"]), None)
    if i is None or i in search.by_node or f.measures is None:
        return ""
    decision = f.assignment.decisions[i]
    peak = f.measures.ranges.get(first["tensor"], 0.0)
    if decision.precision != low or peak < LOW_INF_AT[low]:
        return ""
    own = {r.id for r in f.policy.precision.all_rules()}
    by = f"the policy's rule {decision.rule}" if decision.rule in own else decision.reason
    return (
        f"{by} keeps {first['node']} ({first['op']}) in {low.upper()}, where its FP32 values "
        f"reach |x| = {peak:.4g} (inf in {low.upper()})"
    )


KEPT = "kept (not re-checked within the budget)"


def _unmeasured(search: Search) -> str:
    """A pin no run measured alone, in words: the budget's (`KEPT`) only where it ran out;
    otherwise the search stopped before its shrink (a stuck search used 7 of 100
    evaluations, and every pin sent the user to raise a budget that changed nothing)."""
    return (
        KEPT
        if search.exhausted
        else "kept (not measured alone: the search stopped before its shrink)"
    )


def _result(search: Search) -> SearchResult:
    """What the search found: the verdict on its final pin set, and why each pin stays."""
    final = search.known[tuple(sorted(search.pinned))]
    passed = final.passed and search.walk.answers(final)  # never a pass left unverified
    kept = _unmeasured(search)
    base = search.front.policy.precision
    return SearchResult(
        search.precision(search.pinned),
        search.groups,
        sorted(search.pinned),
        {k: search.reasons.get(k, kept) for k in search.pinned},
        final.share,
        search.trials,
        passed,
        final.low_share,
        search.budget,
        search.low,
        dict(search.point_seconds),
        search.exhausted,
        len(search.front.shapes),
        {r.id: g for r, g in pin_rules(base, search.groups, search.pinned, search.names)},
        list(search.rankings),
        ruled_overflow=search.ruled_overflow,
        kept_low=_kept_low(search, final),
    )


def _kept_low(search: Search, final: TrialOutcome) -> dict[str, list[str]]:
    """The policy's own rules that keep nodes on `final`'s failing outputs' paths (and its
    first overflow's) in the low precision, each with those nodes: where the search pinned every group there and still
    fails, their storage may be what fails it (a rule keeping `/br0/Add`, x + 4096, in
    FP16 failed y; with that rule saying fp32 the search passed at 65% FP16)."""
    f = search.front
    own = {r.id for r in f.policy.precision.all_rules()}
    o = final.overflow or {}  # a masked overflow fails no output: its own path
    ends = [*final.failed_outputs, *(o[k] for k in ("tensor", "source") if o.get(k))]
    found: dict[str, list[str]] = {}
    for i in sorted(on_path(f.view, ends)):
        d = f.assignment.decisions[i]
        if i not in search.by_node and d.precision == search.low and d.rule in own:
            found.setdefault(d.rule, []).append(f.view.nodes[i].name)
    return found


def tune(
    front: Front,
    *,
    budget: int = 100,
    objective: str = "nodes",
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[Trial, int], None] | None = None,
) -> SearchResult:
    """The smallest pin set (in `objective`) that passes, within `budget` evaluations.

    Data that does not exercise the model is said first, as `check` and `build` say it
    (the `trtbuild` logger): a pin set found on it proves little.
    """
    from trtbuild.evaluation import constant_inputs, flat_outputs, flat_warnings

    for warning in constant_inputs(front) + flat_warnings(flat_outputs(front), front):
        logging.getLogger("trtbuild").warning(warning)
    search = Search(front, budget, objective, seed, jobs)
    search.progress = progress
    hopeless = quantization_fails(front)
    with pool(front, jobs) as search.pool:
        if hopeless:
            _start(search)  # judged once, as the policy's candidate: no pin can pass
        elif _grown(search):
            _shrink(search)
            _merge(search)
    return replace(_result(search), quantization_fails=hopeless)


def quantization_fails(front: Front) -> list[str]:
    """Each point where the quantized graph in FP32 already fails the tolerances against
    the reference model (`accuracy.reference_model`), with the outputs it fails.

    Why before any trial: every pin keeps the quantization, so no candidate can pass. A
    ModelOpt INT8 ViT judged against its FP32 model spent 8 evaluations pinning all of
    its 56 groups and wrote a policy 0% FP16 that still failed. None where the policy's
    `dequantize: true` rules take ops out of the quantization: the graph's own run
    measures the quantization as given, not the one the policy keeps, so the search runs.
    """
    from trtbuild.accuracy.breakdown import quantization_alone

    if front.assignment.dequantized:
        return []
    found = []
    for run in front.shapes:
        if run.reference is None:  # a point judged on no reference (none is tuned)
            continue
        alone = quantization_alone(run.reference, front.policy.accuracy) or {}
        failing = [name for name, m in alone.items() if not m.passed]
        if failing:
            found.append(f"at {run.point.label}: {', '.join(failing)}")
    return found
