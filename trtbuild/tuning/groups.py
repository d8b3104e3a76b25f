"""What `tune` moves and in what order it suspects them: groups, their costs, their ranking.

Why groups: a normalization unit or an attention block split between FP16 and
FP32 is a policy nobody would write, so they move whole. Why a ranking: one
emulated run already shows where the error against FP32 jumps (a subtraction
that cancels, a gain); the groups on a failing output's path whose error jumps,
or whose error a later jump amplifies, are tried first, so a passing set is
usually found among the first few suspects rather than by halving every group.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from trtbuild.front import Front
from trtbuild.graph.qdq import is_qdq
from trtbuild.graph.reductions import REDUCTIONS, reduction_depth
from trtbuild.graph.view import GraphView
from trtbuild.numerics import LOW_EPS, LOW_INF_AT
from trtbuild.policy.specs import Match, Precision, Rule

# A group whose reference values pass LOW_INF_AT by this factor turns non-finite in the low
# precision whatever its neighbours do (their rounding moves a value far less than 1%).
SURE = 1.01
# Relative rounding of one store in each low precision (half a step): the error floor of a
# tensor.
UNIT = {low: eps / 2 for low, eps in LOW_EPS.items()}
# An error that grows by less than this across a node is rounding noise, not a jump.
JUMP = 2.0


@dataclass(frozen=True)
class Group:
    """Nodes that change precision together; `kind` says why they belong together."""

    kind: str  # normalization unit, attention block, reduction, node
    nodes: tuple[int, ...]
    names: tuple[str, ...]
    cost: float  # what pinning it costs, in the chosen objective
    peak: float  # largest |value| its tensors reach on the reference data
    regex: str = ""  # its rule's name regex where not one of its names' own (a merged scope)
    # where only a value it reads from outside reaches `peak`: that value (its reason says
    # "reads", not "reaches": a Tanh fed 8e4 makes nothing past 1, but would store it in FP16)
    read: str = ""

    @property
    def label(self) -> str:
        if self.regex:  # a merged scope: its rule says what it selects
            return f"{self.kind} {self.regex} ({len(self.names)} nodes)"
        return f"{self.kind} {self.names[0]}" + (
            f" (+{len(self.names) - 1} nodes)" if len(self.names) > 1 else ""
        )

    def overflows(self, low: str) -> bool:
        """True when the group cannot run in `low` at all: a tensor of it would be inf.

        Why it matters: such a pin never needs re-checking (unpinning it fails
        by overflow at some shape, every time), which saves an evaluation each.
        """
        return self.peak >= LOW_INF_AT[low] * SURE


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


def groups(front: Front, objective: str) -> list[Group]:
    """Tunable nodes (left at the default by the policy's rules), in units that move together.

    The float ops only: a QuantizeLinear/DequantizeLinear is never a candidate (it
    follows the ops around it; pinning the op a DQ feeds keeps its INT8 math).
    """
    view = front.view
    decisions = front.assignment.decisions
    ranges = front.measures.ranges  # data peaks: a sentinel is not an overflow
    tunable = {
        i
        for i, d in enumerate(decisions)
        if d.rule == "default" and d.precision and not is_qdq(view.nodes[i].op_type)
    }
    taken: set[int] = set()
    out: list[Group] = []

    def add(kind: str, members: tuple[int, ...]) -> None:
        members = tuple(sorted(i for i in members if i in tunable and i not in taken))
        if not members:
            return
        taken.update(members)
        cost = sum(node_flops(view, i) if objective == "flops" else 1.0 for i in members)
        made = {t for i in members for t in view.float_outputs(i)}
        read = {t for i in members for t in view.float_inputs(i)} - made
        peak = max((ranges.get(t, 0.0) for t in made | read), default=0.0)
        outside = sorted(t for t in read if ranges.get(t, 0.0) == peak)
        makes = any(ranges.get(t, 0.0) == peak for t in made)
        names = tuple(view.nodes[i].name for i in members)
        read_at = outside[0] if outside and not makes else ""
        out.append(Group(kind, members, names, cost, peak, read=read_at))

    analysis = front.analysis
    for unit in analysis.norm_units():
        add("normalization unit", unit.nodes)
    for unit in analysis.attention_units():
        add("attention block", unit.nodes)
    for i in sorted(tunable):
        add("reduction" if view.nodes[i].op_type in REDUCTIONS else "node", (i,))
    return out


def beyond_range(groups_: list[Group], low: str) -> list[int]:
    """Range analysis: the groups whose tensors leave the low precision's range (from
    `LOW_INF_AT` on: below it a value rounds to the largest, as the judge finds)."""
    return sorted(k for k, g in enumerate(groups_) if g.peak >= LOW_INF_AT[low])


# -- the ranking --------------------------------------------------------------------


def on_path(view: GraphView, outputs: Iterable[str]) -> set[int]:
    """Every node an output depends on (bodies of control nodes included): only these
    can change it."""
    queue = [view.producer[o] for o in outputs if o in view.producer]
    seen: set[int] = set()
    while queue:
        i = queue.pop()
        if i in seen:
            continue
        seen.add(i)
        queue += view.predecessors(i) + view.inside(i)
    return seen


def _jump(view: GraphView, i: int, errors: dict[str, float], floor: float) -> float:
    """How much a node multiplies the error it is given (1 below `JUMP`: rounding noise)."""
    given = max((errors.get(t, 0.0) for t in view.float_inputs(i)), default=0.0)
    made = max((errors.get(t, 0.0) for t in view.float_outputs(i)), default=0.0)
    ratio = min(made, 1e30) / max(given, floor)
    return ratio if ratio >= JUMP else 1.0


def suspects(score: dict[int, float], groups_: list[Group]) -> list[int]:
    """The groups `suspicion` scored, most suspect first; ties go to the group nearest the
    outputs, as a plain bisection would order them."""
    return sorted(score, key=lambda k: (-score[k], -max(groups_[k].nodes)))


def suspicion(
    view: GraphView,
    groups_: list[Group],
    rest: list[int],
    errors: dict[str, float],
    failed: Iterable[str],
    low: str,
) -> dict[int, float]:
    """Each group of `rest` on a failing output's path, and how suspect it is.

    A node's suspicion is the jump of the error across it times the largest
    product of jumps on its way to a failing output: the amplifier itself and
    what feeds it (its inputs' rounding is what it amplifies) come first.
    Groups off every failing output's path cannot change the verdict and are left out.
    """
    path = on_path(view, failed)
    jump = {i: _jump(view, i, errors, UNIT[low]) for i in path}
    gain: dict[int, float] = {}
    for i in sorted(path, reverse=True):  # consumers have larger indices than producers
        after = [jump[s] * gain[s] for s in view.successors(i) if s in gain]
        gain[i] = max(after, default=1.0)
    score = {
        k: max((jump[i] * gain[i] for i in groups_[k].nodes if i in path), default=0.0)
        for k in rest
    }
    return {k: v for k, v in score.items() if v > 0.0}


# -- a pin set as a policy -------------------------------------------------------------


def group_regex(group: Group, all_names: list[str]) -> str:
    """The name regex of the FP32 rule that pins `group`: a merged scope's own, else the
    shortest that selects exactly its nodes. One function, so the rule written and the pin
    found again in it (the tuned policy's comments) are the same string."""
    return group.regex or name_regex(group.names, all_names)


def name_regex(names: tuple[str, ...], all_names: list[str]) -> str:
    """The shortest readable regex that selects exactly `names` among `all_names`.

    A unit exported under one scope (`/blocks.1/norm2/...`) gets its scope
    prefix; anything else gets the exact names, ended by `$` where that selects exactly
    them, else by `\\Z` (ONNX names are any string: `/n/Add` and `/n/Add\\n` are two nodes).
    """
    if len(names) > 1:
        prefix = os.path.commonprefix(list(names))  # noqa: RUF071 - cut at a "/" below
        prefix = prefix[: prefix.rfind("/") + 1] if "/" in prefix else ""
        if len(prefix) > 1:
            rx = re.compile("^" + re.escape(prefix))
            if {n for n in all_names if rx.search(n)} == set(names):
                return "^" + re.escape(prefix)
    body = re.escape(names[0]) if len(names) == 1 else f"(?:{'|'.join(map(re.escape, names))})"
    # `$` also matches before a trailing newline (rules match by `re.search`): where a node
    # is named as one of `names` plus "\n", only `\Z` selects exactly `names`
    newline = {f"{n}\n" for n in names} - set(names)
    return f"^{body}\\Z" if newline.intersection(all_names) else f"^{body}$"


def candidate_precision(
    base: Precision, groups_: list[Group], pinned: list[int], all_names: list[str]
) -> Precision:
    """The policy's precision with one FP32 rule per pinned group, after its own rules."""
    added = tuple(rule for rule, _ in pin_rules(base, groups_, pinned, all_names))
    return replace(base, rules=(*base.rules, *added))


def pin_rules(
    base: Precision, groups_: list[Group], pinned: list[int], all_names: list[str]
) -> list[tuple[Rule, int]]:
    """(rule, group) for each pinned group, in order: the rules `candidate_precision` adds,
    each with the group it pins (the tuned policy's comment says that group's reason)."""
    used, k = {r.id for r in base.rules}, 0  # a tuned policy tuned again keeps its own ids
    found = []
    for g in sorted(pinned):
        k += 1
        while f"tuned-{k}" in used:
            k += 1
        match = Match(name=group_regex(groups_[g], all_names))
        found.append((Rule(f"tuned-{k}", match, "fp32"), g))
    return found


# -- merging pins into the rules a person would write ---------------------------------

# A scope is offered as one rule only where its nodes left unpinned cost at most this share
# of the pins it replaces: a readable rule, not a large loss of low-precision nodes.
MERGE_EXTRA = 0.5


@dataclass(frozen=True)
class Scope:
    """A name scope (`/decoder/block3/`) offered as one FP32 rule for the pins inside it."""

    prefix: str
    members: tuple[int, ...]  # the pinned single-node groups it replaces
    covered: tuple[int, ...]  # every group inside it, pinned or not
    extra: float  # the cost of its groups not pinned yet

    def group(self, groups_: list[Group]) -> Group:
        """The groups it covers as one group, whose rule is the scope's prefix."""
        nodes = tuple(sorted(i for k in self.covered for i in groups_[k].nodes))
        names = tuple(n for k in self.covered for n in groups_[k].names)
        cost = sum(groups_[k].cost for k in self.covered)
        peak = max(groups_[k].peak for k in self.covered)
        return Group("scope", nodes, names, cost, peak, "^" + re.escape(self.prefix))


def _prefixes(name: str) -> list[str]:
    """`/a/b/Conv` -> [`/a/`, `/a/b/`]: every scope a node's name sits in, outermost first."""
    cuts = [i for i, ch in enumerate(name) if ch == "/" and i > 0]
    return [name[: i + 1] for i in cuts]


def scopes(groups_: list[Group], pinned: list[int]) -> list[Scope]:
    """The scopes worth one rule instead of their pinned single nodes, best first.

    Why scopes: an exporter names nodes by the module that made them
    (`/f_branch/conv_f.0/Conv`), and a person pins a module, not its nodes
    one by one. A scope is offered where it holds two or more single-node pins,
    splits no group, and what it would add costs at most `MERGE_EXTRA` of the
    pins' own cost; the judge still decides. Best first: the most pins replaced,
    then the least added, then the shallower scope.
    """
    singles = [k for k in pinned if len(groups_[k].nodes) == 1]
    found: dict[str, Scope] = {}
    for prefix in sorted({p for k in singles for p in _prefixes(groups_[k].names[0])}):
        inside = [k for k, g in enumerate(groups_) if any(n.startswith(prefix) for n in g.names)]
        if any(not all(n.startswith(prefix) for n in groups_[k].names) for k in inside):
            continue  # it would split a unit
        members = tuple(k for k in inside if k in singles)
        extra = sum(groups_[k].cost for k in inside if k not in pinned)
        if len(members) >= 2 and extra <= MERGE_EXTRA * sum(groups_[k].cost for k in members):
            found[prefix] = Scope(prefix, members, tuple(inside), extra)
    return sorted(found.values(), key=lambda s: (-len(s.members), s.extra, len(s.prefix)))
