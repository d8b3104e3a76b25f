"""Policy rules as small matcher objects that say why they matched.

A rule's `match` keys are ANDed: each key is one `Matcher` (one small class
per kind, in the `MATCHERS` registry) that returns the nodes it selects with a
reason, and the rule matches their intersection. Why
sets over whole graphs rather than a per-node predicate: structural keys
(`final_reductions, last: 1`, units found by patterns) are properties of the
graph, not of one node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeVar

from trtbuild.graph.analysis import Analysis
from trtbuild.graph.view import GraphView
from trtbuild.policy.specs import Match, Rule

_M = TypeVar("_M", bound="OneKey")


@dataclass(frozen=True)
class MatchContext:
    analysis: Analysis  # the graph's structural findings, shared by every rule
    ranges: Mapping[str, float] | None = None  # tensor -> data peak on the FP32 reference

    @property
    def view(self) -> GraphView:
        return self.analysis.view


class Matcher(Protocol):
    """One kind of `match` key: made from a rule's `Match` where the key is given."""

    KEY: ClassVar[str]  # the `match` key (a field of `Match`) this kind reads

    @classmethod
    def from_match(cls, match: Match) -> Matcher: ...

    def select(self, ctx: MatchContext) -> dict[int, str]:
        """Node index -> human-readable reason."""


class OneKey:
    """A matcher of one `match` key: `from_match` gives it the value of the field `KEY`
    names, so each kind names its key once."""

    KEY: ClassVar[str]

    @classmethod
    def from_match(cls: type[_M], match: Match) -> _M:
        return cls(getattr(match, cls.KEY))  # type: ignore[call-arg]


@dataclass(frozen=True)
class NameMatcher(OneKey):
    regex: str
    KEY: ClassVar[str] = "name"

    def select(self, ctx: MatchContext) -> dict[int, str]:
        rx = re.compile(self.regex)
        return {
            i: f"name matches {self.regex!r}"
            for i, n in enumerate(ctx.view.nodes)
            if rx.search(n.name)
        }


@dataclass(frozen=True)
class OpMatcher(OneKey):
    ops: tuple[str, ...]
    KEY: ClassVar[str] = "op"

    def select(self, ctx: MatchContext) -> dict[int, str]:
        ops = set(self.ops)
        return {i: f"op is {n.op_type}" for i, n in enumerate(ctx.view.nodes) if n.op_type in ops}


@dataclass(frozen=True)
class PatternMatcher:
    pattern: str
    last: int | None = None
    KEY: ClassVar[str] = "pattern"  # with `last`, which only narrows a pattern

    @classmethod
    def from_match(cls, match: Match) -> PatternMatcher:
        return cls(match.pattern, match.last)

    def select(self, ctx: MatchContext) -> dict[int, str]:
        from trtbuild.graph import patterns

        return patterns.find(self.pattern, ctx.analysis, last=self.last)


@dataclass(frozen=True)
class MaxAbsMatcher:
    """Nodes any of whose float inputs or outputs exceed `threshold` on the reference data,
    or, with a pattern that anchors its nodes (`periodic_arguments`: the argument each
    computes), whose anchor does."""

    threshold: float
    pattern: str | None = None
    KEY: ClassVar[str] = "max_abs_above"  # with `pattern`, whose anchors it reads

    @classmethod
    def from_match(cls, match: Match) -> MaxAbsMatcher:
        return cls(match.max_abs_above, match.pattern)  # type: ignore[arg-type]

    def select(self, ctx: MatchContext) -> dict[int, str]:
        from trtbuild.errors import UsageError
        from trtbuild.graph import patterns

        if ctx.ranges is None:
            raise UsageError("max_abs_above needs reference data, which this command does not run")
        ranges = ctx.ranges
        anchored = patterns.anchors(self.pattern, ctx.analysis)
        out = {}
        for i, _node in enumerate(ctx.view.nodes):
            tensors = ctx.view.float_inputs(i) + ctx.view.float_outputs(i)
            tensors += anchored.get(i, ())
            worst = max(((ranges.get(t, 0.0), t) for t in tensors), default=(0.0, ""))
            if worst[0] > self.threshold:
                out[i] = f"|{worst[1]}| reaches {worst[0]:.4g} > {self.threshold:g}"
        return out


@dataclass(frozen=True)
class InitializerAbsMatcher(OneKey):
    """Nodes that consume a weight whose finite magnitude exceeds `threshold`.

    Finite: a weight that is already inf in FP32 stays inf whatever its
    consumer's precision, so pinning the consumer would change nothing.
    """

    threshold: float
    KEY: ClassVar[str] = "initializer_abs_above"

    def select(self, ctx: MatchContext) -> dict[int, str]:
        view, out = ctx.view, {}
        big = {}
        for name, peak in ctx.analysis.weight_peaks().items():
            if peak > self.threshold:
                big[name] = peak
        if not big:  # the usual case: no need to look at every node's inputs
            return out
        for i, node in enumerate(view.nodes):
            hits = [(big[t], t) for t in node.input if t in big]
            if hits:
                peak, name = max(hits)
                out[i] = f"weight {name} reaches {peak:.4g} > {self.threshold:g}"
        return out


@dataclass(frozen=True)
class ReductionDepthMatcher(OneKey):
    """MatMul/Gemm/Conv/Reduce nodes that accumulate more than `depth` products."""

    depth: int
    KEY: ClassVar[str] = "reduction_depth_above"

    def select(self, ctx: MatchContext) -> dict[int, str]:
        from trtbuild.graph.reductions import reduction_depth

        out = {}
        for i, _node in enumerate(ctx.view.nodes):
            depth = reduction_depth(ctx.view, i)
            if depth is not None and depth > self.depth:
                out[i] = f"accumulates {depth} terms > {self.depth}"
        return out


# The kinds of match, one class each: the registry `select` reads, in this order. A new kind
# is a class with a `KEY` (a new field of `policy.model.Match` and the schema) added here.
# The range key last: every structural key narrows first, and a rule they leave empty reads
# no range (`may_read_ranges`: where nothing is left, `convert` runs no reference).
MATCHERS: tuple[type[Matcher], ...] = (
    NameMatcher,
    OpMatcher,
    PatternMatcher,
    InitializerAbsMatcher,
    ReductionDepthMatcher,
    MaxAbsMatcher,
)


def matchers_for(match: Match, kinds: tuple[type[Matcher], ...] = MATCHERS) -> list[Matcher]:
    """One matcher per key the rule gives, in the registry's order."""
    return [k.from_match(match) for k in kinds if getattr(match, k.KEY) not in (None, ())]


def may_read_ranges(rule: Rule, ctx: MatchContext) -> bool:
    """Whether `rule` reads the FP32 reference's ranges here: it has a range key, and its
    other keys (none, or a pattern the graph has) leave a node for the ranges to judge."""
    if rule.match.max_abs_above is None:
        return False
    structural = tuple(k for k in MATCHERS if k is not MaxAbsMatcher)
    left = _narrowed(matchers_for(rule.match, structural), ctx)
    return left is None or bool(left)


def select(rule: Rule, ctx: MatchContext) -> dict[int, str]:
    """Nodes matched by every key of `rule.match`, with the joined reasons."""
    return _narrowed(matchers_for(rule.match), ctx) or {}


def _narrowed(matchers: list[Matcher], ctx: MatchContext) -> dict[int, str] | None:
    """The nodes every one of `matchers` selects, reasons joined; None with no matcher. It
    stops once nothing is left: a range key after an empty pattern reads no range."""
    result: dict[int, str] | None = None
    for matcher in matchers:
        if result is not None and not result:
            break
        picked = matcher.select(ctx)
        if result is None:
            result = dict(picked)
        else:
            result = {i: f"{result[i]}; {picked[i]}" for i in result if i in picked}
    return result
