"""`trtbuild tune`: the smallest FP32 set that meets every tolerance, written as a policy.

Why not Polygraphy's `debug precision` or ModelOpt AutoCast: the first bisects
a prefix or suffix of layers and needs weak typing, which TensorRT 11 removed;
the second picks FP32 nodes by value range and never checks the converted
model's accuracy. Here every candidate is judged by the same evaluator as
`build` (FP16 storage emulated faithfully on the CPU), and the search moves
whole groups (normalization units, attention blocks), so a unit is never split.

The search, top to bottom:
1. `groups`: tunable compute nodes (those the policy's own rules leave at the
   default) in normalization units, attention blocks, or alone;
2. range analysis: groups whose tensors leave the low precision's range (FP16
   or BF16) on the reference data, at any shape, are pinned first;
3. grow: while the candidate fails, an overflow (the first tensor the emulation
   turns non-finite) pins its own group, or the nearest one upstream; otherwise
   a bisection over the unpinned groups, nearest the outputs first, finds the
   shortest run of them that passes, and pins its last group (the one the
   outputs cannot do without): a group in O(log n) evaluations;
4. shrink (delta debugging): unpin chunks of the pinned groups, costliest first,
   halving the chunk down to single groups; a chunk stays unpinned when every
   tolerance still holds at every shape, and each remaining pin keeps the error
   that made it necessary.
A pin set is judged once: the search remembers every verdict it recorded.
Ties are broken by a seeded shuffle, so a seed gives the same policy every run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.judge import judge
from trtbuild.accuracy.progress import StatusLine
from trtbuild.errors import UsageError
from trtbuild.front import Front
from trtbuild.graph.reductions import REDUCTIONS, reduction_depth
from trtbuild.graph.view import GraphView
from trtbuild.numerics import LOW_MAX
from trtbuild.policy.model import Match, Precision, Rule
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert

OBJECTIVES = ("nodes", "flops")


@dataclass(frozen=True)
class Group:
    """Nodes that change precision together; `kind` says why they belong together."""

    kind: str  # normalization unit, attention block, reduction, node
    nodes: tuple[int, ...]
    names: tuple[str, ...]
    cost: float  # what pinning it costs, in the chosen objective
    peak: float  # largest |value| its tensors reach on the reference data

    @property
    def label(self) -> str:
        return f"{self.kind} {self.names[0]}" + (
            f" (+{len(self.names) - 1} nodes)" if len(self.names) > 1 else ""
        )


@dataclass
class Trial:
    """One evaluation of a candidate pin set."""

    step: int
    action: str
    pinned: tuple[int, ...]  # group indices
    passed: bool
    fp16_share: float
    failing: dict[str, str]  # output -> the measured error that fails it
    worst: dict[str, float]  # output -> max_abs
    seconds: float


@dataclass
class TuneResult:
    policy: Precision
    groups: list[Group]
    pinned: list[int]
    reasons: dict[int, str]  # group -> why it is needed
    trials: list[Trial] = field(default_factory=list)
    passed: bool = False
    fp16_share: float = 0.0  # the share in the policy's low precision (`low`)
    budget: int = 0
    low: str = "fp16"
    point_seconds: dict[str, float] = field(default_factory=dict)  # point -> judging seconds

    @property
    def costliest_point(self) -> str | None:
        """`max [1, 3, 1024, 1024] (71% of the judging time)`, where there are several points."""
        if len(self.point_seconds) < 2:
            return None
        label, seconds = max(self.point_seconds.items(), key=lambda kv: kv[1])
        return f"{label} ({seconds / max(sum(self.point_seconds.values()), 1e-9):.0%} of the judging time)"

    @property
    def exhausted(self) -> bool:
        """The search used every evaluation it had: it may have stopped before the end."""
        return len(self.trials) >= self.budget > 0

    @property
    def full_search(self) -> int:
        """Evaluations a full search needs at most: the start and every group pinned; per
        group pinned while growing, a bisection (log2 of the groups) and its pin; twice
        the groups while shrinking (chunks halving down to one)."""
        n = len(self.groups)
        return 2 + n * (math.ceil(math.log2(max(n, 1))) + 1) + 2 * n


# -- groups -------------------------------------------------------------------------


def node_flops(view: GraphView, i: int) -> float:
    """Rough FLOPs of one node: products of accumulating ops, else one per output element."""
    out = view.nodes[i].output[0] if view.nodes[i].output else ""
    t = view.shape.get(out)
    elements = 1.0
    if t is not None and t.tensor_type.HasField("shape"):
        for d in t.tensor_type.shape.dim:
            elements *= d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
    depth = reduction_depth(view, i)
    return 2.0 * elements * depth if depth else elements


def groups(stages: Front, objective: str) -> list[Group]:
    """Tunable nodes (left at the default by the policy's rules), in units that move together."""
    view = stages.view
    decisions = stages.assignment.decisions
    ranges = stages.measures.ranges  # data peaks: a sentinel is not an overflow
    tunable = {i for i, d in enumerate(decisions) if d.rule == "default" and d.precision}
    taken: set[int] = set()
    out: list[Group] = []

    def add(kind: str, members: tuple[int, ...]) -> None:
        members = tuple(sorted(i for i in members if i in tunable and i not in taken))
        if not members:
            return
        taken.update(members)
        cost = sum(node_flops(view, i) if objective == "flops" else 1.0 for i in members)
        peak = max(
            (
                ranges.get(t, 0.0)
                for i in members
                for t in (*view.float_inputs(i), *view.float_outputs(i))
            ),
            default=0.0,
        )
        out.append(Group(kind, members, tuple(view.nodes[i].name for i in members), cost, peak))

    analysis = stages.analysis
    for unit in analysis.norm_units():
        add("normalization unit", unit.nodes)
    for unit in analysis.attention_units():
        add("attention block", unit.nodes)
    for i in sorted(tunable):
        add("reduction" if view.nodes[i].op_type in REDUCTIONS else "node", (i,))
    return out


# -- one evaluation ---------------------------------------------------------------


def name_regex(names: tuple[str, ...], all_names: list[str]) -> str:
    """The shortest readable regex that selects exactly `names` among `all_names`.

    A unit exported under one scope (`/blocks.1/norm2/...`) gets its scope
    prefix; anything else gets the exact names.
    """
    if len(names) > 1:
        prefix = os.path.commonprefix(list(names))  # noqa: RUF071 - cut at a "/" below
        prefix = prefix[: prefix.rfind("/") + 1] if "/" in prefix else ""
        if len(prefix) > 1:
            rx = re.compile("^" + re.escape(prefix))
            if {n for n in all_names if rx.search(n)} == set(names):
                return "^" + re.escape(prefix)
    if len(names) == 1:
        return "^" + re.escape(names[0]) + "$"
    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$"


def candidate_precision(
    base: Precision, groups_: list[Group], pinned: list[int], all_names: list[str]
) -> Precision:
    rules = list(base.rules)
    for k, g in enumerate(sorted(pinned)):
        match = Match(name=name_regex(groups_[g].names, all_names))
        rules.append(Rule(f"tuned-{k + 1}", match, "fp32"))
    return replace(base, rules=tuple(rules))


@dataclass(frozen=True)
class TrialOutcome:
    """What the search needs of one judged candidate: light, so it crosses processes."""

    passed: bool
    failing: dict[str, str]  # output (or "(intermediate)") -> the error that fails it
    overflow: dict[str, Any] | None  # the first intermediate turned non-finite
    worst: dict[str, float]  # output -> max_abs
    fp16_share: float
    seconds: float
    point_seconds: dict[str, float] = field(default_factory=dict)  # point label -> judging time


def evaluate(stages: Front, precision: Precision) -> TrialOutcome:
    """Judge one pin set with the build's own judge, at every shape; the reference and the
    view are shared.

    Only the overflow is walked (the reference is not run again): the search
    needs the outputs' verdict and the first tensor the candidate overflows,
    and an overflow an output masks fails the candidate all the same. With
    several shapes a failure names its shape, and the first overflow found
    (in the shapes' order) picks what to pin.
    """
    t = time.perf_counter()
    assignment = assign(stages.view, precision, stages.measures.ranges, stages.analysis)
    mixed = convert(assignment).model
    emulated = emulate(mixed, stages.policy.accuracy.emulation)  # once for every shape
    failing: dict[str, str] = {}
    overflow, worst, point_seconds = None, {}, {}
    for run in stages.shapes:
        started = time.perf_counter()
        verdict = judge(
            run.reference,
            stages.prepared.model,
            mixed,
            run.feeds,
            stages.policy.accuracy,
            emulated=emulated,
            detail="overflow",
            overflow_fails=True,
            progress=False,
        )
        label = f"at {run.point.name}: " if len(stages.shapes) > 1 else ""
        failing.update({f"{label}{k}": label + v for k, v in verdict.failures().items()})
        overflow = overflow or verdict.overflow
        for name, m in verdict.outputs.items():
            worst[name] = max(worst.get(name, 0.0), m.max_abs)
        point_seconds[run.point.label] = time.perf_counter() - started
    return TrialOutcome(
        passed=not failing,
        failing=failing,
        overflow=overflow,
        worst=worst,
        fp16_share=assignment.summary().low_share,
        seconds=round(time.perf_counter() - t, 3),
        point_seconds=point_seconds,
    )


# Set in each worker process by the pool's initializer, never in the parent: the stages
# arrive by fork (never pickled: the reference is large).
_WORKER: dict[str, Front] = {}


def _init_worker(stages: Front) -> None:
    _WORKER["stages"] = stages


def _evaluate_in_worker(precision: Precision) -> TrialOutcome:
    return evaluate(_WORKER["stages"], precision)


# -- the search ---------------------------------------------------------------------


class Search:
    """The search's state: its groups, what it pinned and why, and every verdict recorded.

    With `jobs > 1`, shrinking judges the next candidates in parallel on the
    assumption that each removal fails (most pins are needed), and keeps only
    what a sequential search would have judged, so a seed gives the same policy
    whatever `jobs` is.
    """

    def __init__(self, stages: Front, budget: int, objective: str, seed: int, jobs: int):
        self.stages, self.budget, self.jobs = stages, budget, jobs
        self.groups = groups(stages, objective)
        self.names = [n.name for n in stages.view.nodes]
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

    def precision(self, pinned: list[int]) -> Precision:
        return candidate_precision(self.stages.policy.precision, self.groups, pinned, self.names)

    def record(self, pinned: list[int], action: str, outcome: TrialOutcome) -> TrialOutcome:
        o = outcome
        trial = Trial(
            len(self.trials) + 1,
            action,
            tuple(sorted(pinned)),
            o.passed,
            o.fp16_share,
            o.failing,
            o.worst,
            o.seconds,
        )
        for label, seconds in o.point_seconds.items():
            self.point_seconds[label] = self.point_seconds.get(label, 0.0) + seconds
        self.trials.append(trial)
        self.known[trial.pinned] = outcome
        if self.progress:
            self.progress(trial, self.budget)
        return outcome

    def try_pins(self, pinned: list[int], action: str) -> TrialOutcome:
        """The verdict on `pinned`: remembered, or judged now and recorded as a trial."""
        known = self.known.get(tuple(sorted(pinned)))
        if known is not None:
            return known
        return self.record(pinned, action, evaluate(self.stages, self.precision(pinned)))

    def judge_many(self, candidates: list[list[int]]) -> list[TrialOutcome | None]:
        """Judge several pin sets, in parallel when there is a pool (results in order);
        None for a set whose verdict is remembered (`known`)."""
        todo = [c for c in candidates if tuple(sorted(c)) not in self.known]
        precisions = [self.precision(c) for c in todo]
        if self.pool is None or len(todo) < 2:
            fresh = iter([evaluate(self.stages, p) for p in precisions])
        else:
            fresh = iter(self.pool.map(_evaluate_in_worker, precisions))
        return [None if tuple(sorted(c)) in self.known else next(fresh) for c in candidates]

    def left(self) -> int:
        return self.budget - len(self.trials)

    def label(self, picked: list[int]) -> str:
        more = f" and {len(picked) - 1} more" if len(picked) > 1 else ""
        return self.groups[picked[0]].label + more


# -- the steps, in the order `tune` takes them ------------------------------------


# 2. range analysis: what leaves the FP16 range is the first suspect
def _start(search: Search) -> TrialOutcome:
    low = search.stages.policy.precision.default  # fp16 | bf16 (check_policy refused fp32)
    search.pinned = sorted(k for k, g in enumerate(search.groups) if g.peak > LOW_MAX[low])
    for k in search.pinned:
        search.reasons[k] = (
            f"reaches |x| = {search.groups[k].peak:.4g} on the reference data "
            f"({low.upper()} max {LOW_MAX[low]:.6g})"
        )
    action = "start: range analysis" if search.pinned else "start: policy rules only"
    return search.try_pins(search.pinned, action)


# 3. grow while failing: an overflow pins its own group; otherwise a bisection finds
#    the group the outputs cannot do without (a passing set in O(log n) steps)
def _grow(search: Search, outcome: TrialOutcome) -> TrialOutcome:
    while not outcome.passed and search.left() > 0:
        culprit = _overflowing_group(
            search.stages.view, outcome.overflow, search.by_node, search.pinned
        )
        if culprit is None:
            found = _bisect(search, outcome)
            if found is None:
                break
            outcome = found
            continue
        why = "; ".join(outcome.failing.values()) or "output below tolerance"
        search.reasons[culprit] = why
        search.pinned = sorted({*search.pinned, culprit})
        outcome = search.try_pins(search.pinned, f"pin {search.label([culprit])}")
    return outcome


def _bisect(search: Search, failing: TrialOutcome) -> TrialOutcome | None:
    """Pin the last group of the shortest run of unpinned groups (nearest the outputs
    first) that passes; None when there is none left, or all of them fail too.

    Pinning more groups rarely hurts, so the verdict along the run is taken
    as monotonic: a binary search between a failing and a passing length. Out
    of evaluations, the shortest passing run found so far is pinned whole.
    """
    rest = [k for k in range(len(search.groups)) if k not in search.pinned]
    rest.sort(key=lambda k: (-max(search.groups[k].nodes), search.tiebreak[k]))
    if not rest:
        return None
    top = search.try_pins([*search.pinned, *rest], f"pin all {len(rest)} unpinned group(s)")
    if not top.passed:
        search.pinned = sorted({*search.pinned, *rest})
        return None
    lo, hi, why = 0, len(rest), failing
    while hi - lo > 1 and search.left() > 0:
        mid = (lo + hi) // 2
        trial = search.try_pins(
            [*search.pinned, *rest[:mid]], f"bisect: pin {search.label(rest[:mid])}"
        )
        if trial.passed:
            hi = mid
        else:
            lo, why = mid, trial
    picked = rest[hi - 1 : hi] if hi - lo == 1 else rest[:hi]
    for k in picked:
        search.reasons[k] = "; ".join(why.failing.values()) or "output below tolerance"
    search.pinned = sorted({*search.pinned, *picked})
    return search.try_pins(search.pinned, f"pin {search.label(picked)}")


# 4. shrink (delta debugging): unpin chunks, costliest first, halving the chunk
#    until single groups; a group whose removal fails keeps the error as its reason
def _shrink(search: Search) -> None:
    order = sorted(search.pinned, key=lambda k: (-search.groups[k].cost, search.tiebreak[k]))
    chunk = max(1, len(order) // 2)
    while order and search.left() > 0:
        i = 0
        while i < len(order) and search.left() > 0:
            parts = [order[j : j + chunk] for j in range(i, len(order), chunk)]
            parts = parts[: max(1, min(search.jobs, search.left()))]
            tries = [[g for g in search.pinned if g not in part] for part in parts]
            for part, trial_set, fresh in zip(parts, tries, search.judge_many(tries)):
                if fresh is None:  # judged before: its verdict, and no new trial
                    outcome = search.known[tuple(sorted(trial_set))]
                else:
                    outcome = search.record(trial_set, f"unpin {search.label(part)}", fresh)
                if outcome.passed:  # later guesses assumed this failed: drop them
                    search.pinned = trial_set
                    order = [g for g in order if g not in part]
                    for g in part:
                        search.reasons.pop(g, None)
                    break
                if chunk == 1:
                    search.reasons[part[0]] = "without it: " + "; ".join(outcome.failing.values())
                i += chunk
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)


def _result(search: Search) -> TuneResult:
    """What the search found: the last trial of its final pin set, and why each pin stays."""
    final = next(t for t in reversed(search.trials) if t.pinned == tuple(sorted(search.pinned)))
    kept = "kept (not re-checked within the budget)"
    return TuneResult(
        search.precision(search.pinned),
        search.groups,
        sorted(search.pinned),
        {k: search.reasons.get(k, kept) for k in search.pinned},
        search.trials,
        final.passed,
        final.fp16_share,
        search.budget,
        search.stages.policy.precision.default,
        dict(search.point_seconds),
    )


def tune(
    stages: Front,
    *,
    budget: int = 100,
    objective: str = "nodes",
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[Trial, int], None] | None = None,
) -> TuneResult:
    """The smallest pin set (in `objective`) that passes, within `budget` evaluations."""
    search = Search(stages, budget, objective, seed, jobs)
    search.progress = progress
    with _pool(stages, jobs) as search.pool:
        outcome = _grow(search, _start(search))
        if outcome.passed:
            _shrink(search)
    return _result(search)


@contextlib.contextmanager
def _pool(stages: Front, jobs: int) -> Iterator[Any]:
    """Worker processes that inherit `stages` by fork; None with one job (or no fork)."""
    import concurrent.futures
    import multiprocessing

    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    context = multiprocessing.get_context("fork")  # fork: initargs are inherited, not pickled
    with concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_init_worker, initargs=(stages,)
    ) as pool:
        yield pool


def _overflowing_group(
    view: GraphView, first: dict[str, Any] | None, by_node: dict[int, int], pinned: list[int]
) -> int | None:
    """The unpinned group where the emulation first turns non-finite (or nearest upstream)."""
    if first is None:
        return None
    index = {n.name: i for i, n in enumerate(view.nodes)}
    queue, seen = [index[first["node"]]], set()
    while queue:
        i = queue.pop(0)
        if i in seen:
            continue
        seen.add(i)
        k = by_node.get(i)
        if k is not None and k not in pinned:
            return k
        queue.extend(view.predecessors(i))
    return None


# -- writing the tuned policy --------------------------------------------------------


def _rel(path: Path, start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)


def _flow(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000)
    return text.split("\n...")[0].strip()  # a bare scalar ends with a document marker


def _rebase(value: str, here: Path, there: Path) -> str:
    """A path written relative to the source policy, relative to the tuned one; absolute stays."""
    if Path(value).is_absolute() or "://" in value:
        return value
    return _rel((here / value).resolve(), there)


def _schema_line(text: str, here: Path, there: Path) -> list[str]:
    """The editor's `$schema` comment from the policy's header, re-based to `there`."""
    marker = "# yaml-language-server: $schema="
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(marker):
            return [marker + _rebase(line[len(marker) :].strip(), here, there)]
    return []


def tuned_yaml(stages: Front, result: TuneResult, out: Path, seed: int, objective: str) -> str:
    """The original policy, then one commented rule per pinned group; paths re-based to `out`."""
    import yaml

    from trtbuild.policy.load import read_yaml

    policy = stages.policy
    text = policy.path.read_text(encoding="utf-8")
    raw = read_yaml(text)
    here, there = policy.path.parent, out.resolve().parent
    raw["model"] = _rebase(raw["model"], here, there)
    for spec in (raw.get("inputs") or {}).values():
        data = (spec or {}).get("data") or {}
        for key in ("file", "images"):
            if key in data:
                data[key] = _rebase(data[key], here, there)
    for point in ((raw.get("accuracy") or {}).get("shapes") or {}).values():
        data = (point or {}).get("data")
        if isinstance(data, dict) and "file" in data:  # a list is an input named `data`
            data["file"] = _rebase(data["file"], here, there)
    build = raw.get("build") or {}
    if build.get("timing_cache"):
        build["timing_cache"] = _rebase(build["timing_cache"], here, there)
    precision = raw.pop("precision", {}) or {}
    rules = precision.pop("rules", []) or []
    verdict = "passes" if result.passed else "DOES NOT PASS (budget exhausted)"
    lines = [
        *_schema_line(text, here, there),
        f"# Tuned by `trtbuild tune` from {_rel(policy.path, there)}: {verdict} with "
        f"{result.fp16_share:.1%} of compute nodes in {result.low.upper()},",
        f"# {len(result.pinned)} group(s) pinned after {len(result.trials)} evaluation(s) "
        f"(evaluator emulated-fp16, emulation {policy.accuracy.emulation}, "
        f"objective {objective}, seed {seed}).",
    ]
    lines.append(yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=100).rstrip())
    lines.append("precision:")
    for key, value in precision.items():
        lines.append(f"  {key}: {_flow(value)}")
    lines.append("  rules:")
    if rules:
        lines.append("    # the policy's own rules, unchanged")
        lines += [f"    - {_flow(rule)}" for rule in rules]
    for k, rule in zip(result.pinned, result.policy.rules[len(rules) :]):
        lines.append(f"    # {result.groups[k].label}: {result.reasons[k]}")
        entry = {"id": rule.id, "match": {"name": rule.match.name}, "precision": "fp32"}
        lines.append(f"    - {_flow(entry)}")
    if not rules and not result.pinned:
        lines[-1] = "  rules: []   # every tolerance holds with no FP32 pin"
    return "\n".join(lines) + "\n"


def write_log(path: Path, result: TuneResult) -> None:
    from trtbuild.fsutil import write_text

    rows = []
    for t in result.trials:
        rows.append(
            json.dumps(
                {
                    "step": t.step,
                    "action": t.action,
                    "pinned_groups": [result.groups[k].label for k in t.pinned],
                    "passed": t.passed,
                    "fp16_share": t.fp16_share,
                    "failing": t.failing,
                    "max_abs": t.worst,
                    "seconds": t.seconds,
                }
            )
        )
    write_text(path, "\n".join(rows) + "\n")


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, stream: TextIO | None = None, width: int = 24):
        self.line = StatusLine(stream)
        self.width = width

    def __call__(self, trial: Trial, budget: int) -> None:
        filled = min(self.width, round(self.width * trial.step / max(budget, 1)))
        bar = "#" * filled + "." * (self.width - filled)
        state = "pass" if trial.passed else "fail"
        self.line.write(
            f"tune [{bar}] {trial.step}/{budget} {state} {trial.fp16_share:.1%}  "
            f"{trial.action[:60]}"
        )

    def done(self) -> None:
        self.line.done()


def check_args(budget: int, objective: str, jobs: int = 1) -> None:
    if budget < 1:
        raise UsageError("--budget must be at least 1")
    if not 1 <= jobs <= 256:
        raise UsageError("--jobs must be between 1 and 256")
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}")


def check_output(policy, output: Path, force: bool) -> None:
    """Refuse to overwrite the policy being tuned: its comments and rules would be lost."""
    if output.resolve() == policy.path.resolve() and not force:
        raise UsageError(
            "-o names the policy being tuned; writing there would replace it and lose its comments",
            where=str(output),
            hint="write the tuned policy to another file, or pass --force to replace it",
        )


def check_policy(policy) -> None:
    """Tuning pins nodes to FP32, so it needs a policy whose default is a low precision."""
    if policy.precision.default == "fp32":
        raise UsageError(
            "precision.default: tune pins nodes to FP32, and this policy's default is already fp32",
            where=str(policy.path),
            hint="set precision.default: fp16 (or bf16) and let tune find what must stay fp32",
        )
