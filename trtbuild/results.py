"""What the library's functions return: typed values, read with attributes, not dict keys.

Why a layer of its own: the pipeline's values (`Report`, `Verdict`, `OutputMetrics`)
carry what renderers need (tolerances, run results, arrays); a user reads figures
(`result.points[0].outputs["matte"].max_abs`), and an editor should complete them. Each
value here is made from report.json's keys (`docs/outputs.md`), so the two say the
same, and is frozen.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trtbuild.fsutil import NONFINITE_TEXT

if TYPE_CHECKING:
    from trtbuild.accuracy.report import Report
    from trtbuild.front import Front
    from trtbuild.policy.model import Policy
    from trtbuild.precision.assign import PrecisionSummary
    from trtbuild.tuning.search import SearchResult

Precision = Literal["fp16", "bf16", "fp32"]
Backend = Literal["auto", "tensorrt", "tensorrt-rtx", "none"]
Objective = Literal["nodes", "flops"]

__all__ = [
    "AtRisk",
    "Backend",
    "BuildResult",
    "CheckResult",
    "CheckedPoint",
    "Divergence",
    "FlippedDecision",
    "NodeDecision",
    "Objective",
    "OutputResult",
    "Pin",
    "PointResult",
    "Precision",
    "SkippedPoint",
    "TuneResult",
]


def _picked(cls: type, found: dict[str, Any]) -> Any:
    """`cls` from the keys of `found` it declares (report.json may hold more)."""
    return cls(**{f.name: found.get(f.name) for f in fields(cls) if f.name in found})


@dataclass(frozen=True)
class NodeDecision:
    """One node's precision and why: the rule that chose it and the reason in words.

    Attributes:
        name: the node's name (qualified inside `If`/`Loop`/`Scan` bodies).
        op: its op type.
        precision: fp16, bf16 or fp32; "-" for a node without a float output (it keeps
            its inputs' types).
        rule: the rule (or guard, or `default`) that chose it.
        reason: why, in words.
    """

    name: str
    op: str
    precision: str
    rule: str
    reason: str


@dataclass(frozen=True)
class AtRisk:
    """A low-precision op whose internal quantity leaves the low precision's range.

    Attributes:
        node: the node's name.
        op: its op type.
        quantity: what leaves the range (e.g. the sum of squares inside a norm).
        peak: the largest magnitude it reaches on the reference data.
        why: the consequence, in words.
    """

    node: str
    op: str
    quantity: str | None = None
    peak: float | None = None
    why: str | None = None

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> AtRisk:
        return _picked(cls, found)


@dataclass(frozen=True)
class FlippedDecision:
    """An ArgMax, ArgMin, TopK, NonZero or NonMaxSuppression whose indices are not FP32's.

    Attributes:
        node: the decision's node.
        op: its op type.
        tensor: the indices it chose.
        differ: how many of them differ from FP32's (a selection's: the index tuples
            chosen by one of the two only).
        of: how many FP32 chose.
        chosen: how many this candidate chose, for a selection (NonZero,
            NonMaxSuppression), whose count the data decides; None for the others.
    """

    node: str
    op: str
    tensor: str
    differ: int
    of: int
    chosen: int | None = None


@dataclass(frozen=True)
class Divergence:
    """The first tensor, walking the graph in order, whose error crosses the threshold.

    Attributes:
        node: the node that produced it.
        op: its op type.
        tensor: the tensor's name.
        reason: what crossed (the relative error, or a non-finite value).
        decision: the decision (ArgMax, ArgMin, TopK, NonZero, NonMaxSuppression) whose
            indices it reads (through integer-only nodes), or is, where some are not FP32's;
            None otherwise.
        sample: the sample walked (0, the first, unless the first holds and a later one
            fails: then the first that fails).
    """

    node: str | None = None
    op: str | None = None
    tensor: str | None = None
    reason: str | None = None
    decision: FlippedDecision | None = None
    sample: int = 0

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> Divergence:
        decision = found.get("decision")
        return replace(
            _picked(cls, {k: v for k, v in found.items() if k != "decision"}),
            decision=_picked(FlippedDecision, decision) if decision else None,
        )


@dataclass(frozen=True)
class OutputResult:
    """One output at one point: the verdict and the figures it was judged by.

    Attributes:
        passed: every check of its tolerance holds on every sample.
        max_abs: the largest absolute error over all samples.
        mean_abs: the mean absolute error.
        median_abs: the median absolute error.
        p99_abs: the 99th percentile of the absolute error.
        max_rel: the largest relative error.
        max_abs_of_range: max_abs over the reference's largest magnitude.
        cosine: the cosine similarity with the reference.
        nonfinite: values that are not finite where the reference is.
        psnr: the PSNR in dB, where an image output has one.
        failed_samples: the samples whose check failed.
        checks: each check judged (simple, psnr, cosine, snr, indices): its figures.
        shape_mismatch: the samples whose output's shape is not FP32's ({sample,
            reference, candidate}: a count the data decides); the figures leave them out,
            and where no sample agrees every error figure is inf.
    """

    passed: bool
    max_abs: float
    mean_abs: float = 0.0
    median_abs: float = 0.0
    p99_abs: float = 0.0
    max_rel: float = 0.0
    max_abs_of_range: float = 0.0
    cosine: float = 1.0
    nonfinite: int = 0
    psnr: float | None = None
    failed_samples: tuple[int, ...] = ()
    checks: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)
    shape_mismatch: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> OutputResult:
        values = {k: float(v) if v in NONFINITE_TEXT else v for k, v in found.items()}
        values["failed_samples"] = tuple(found.get("failed_samples") or ())
        values["shape_mismatch"] = tuple(found.get("shape_mismatch") or ())
        values["checks"] = dict(found.get("checks") or {})
        return _picked(cls, values)


@dataclass(frozen=True)
class PointResult:
    """One judged point of the input space (report.json's `shapes` entry).

    Attributes:
        name: min, opt, max, shape, or the name given in `accuracy.shapes`.
        inputs: each input's dims at this point.
        passed: every output holds here.
        outputs: each output's verdict and figures.
        at_risk: the low-precision ops whose internal quantities leave the range here.
        first_divergence: where the error first crosses the threshold (None: not walked,
            or nothing crossed).
        data: what each input was fed (report.json's `data`).
    """

    name: str
    inputs: dict[str, tuple[int, ...]]
    passed: bool
    outputs: dict[str, OutputResult]
    at_risk: tuple[AtRisk, ...] = ()
    first_divergence: Divergence | None = None
    data: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> PointResult:
        first = found.get("first_divergence")
        return cls(
            name=found["name"],
            inputs={n: tuple(d) for n, d in (found.get("inputs") or {}).items()},
            passed=bool(found["passed"]),
            outputs={n: OutputResult.from_json(m) for n, m in found["outputs"].items()},
            at_risk=tuple(AtRisk.from_json(r) for r in found.get("at_risk") or ()),
            first_divergence=Divergence.from_json(first) if first else None,
            data=dict(found.get("data") or {}),
        )


@dataclass(frozen=True)
class CheckedPoint:
    """A point `check` measured the reference at, and the data each input gets there.

    Attributes:
        name: min, opt, max, shape, or the name given in `accuracy.shapes`.
        inputs: each input's dims at this point.
        data: what each input is fed (report.json's `data`: kind, source, range, ...).
    """

    name: str
    inputs: dict[str, tuple[int, ...]]
    data: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class SkippedPoint:
    """A point the policy does not judge (`accuracy.shapes.NAME.skip`), and why.

    Attributes:
        name: the point's name.
        inputs: each input's dims there.
        reason: the policy's reason.
    """

    name: str
    inputs: dict[str, tuple[int, ...]]
    reason: str


@dataclass(frozen=True)
class CheckResult:
    """What `check` found: every node's precision, the ops at risk, the warnings, the points.

    Attributes:
        nodes: every node with its precision, rule and reason.
        at_risk: low-precision ops whose internal quantities leave the range.
        warnings: what the `trtbuild` logger was told.
        low_precision_share: the share of compute nodes in FP16 (BF16 for a BF16 policy).
        points: each point that would be judged: its name, inputs and data.
        skipped_points: the points the policy skips, with the reason.
        summary: nodes per precision and rule hits (the table's last line).
        casts: the casts the conversion inserts.
        front: what it was found on (for renderers).
    """

    nodes: list[NodeDecision]
    at_risk: list[AtRisk]
    warnings: list[str]
    low_precision_share: float
    points: list[CheckedPoint]
    skipped_points: list[SkippedPoint]
    summary: PrecisionSummary
    casts: int
    front: Front = field(repr=False)


@dataclass(frozen=True)
class BuildResult:
    """What `build` made and found.

    Attributes:
        passed: every output holds at every point.
        low_precision_share: the share of compute nodes in the low precision.
        outputs: each output at the primary point (`points[0]`).
        points: every judged point, the primary first.
        out_dir: the folder written.
        files: each artifact's name and path in `out_dir`.
        exit_code: the CLI's: 0 passed, 1 below tolerance.
        policy: the policy built (its `name` and `sha256` are build.json's).
        report: the whole report (report.json's model).
    """

    passed: bool
    low_precision_share: float
    outputs: dict[str, OutputResult]
    points: list[PointResult]
    out_dir: Path
    files: dict[str, Path]
    exit_code: int
    policy: Policy = field(repr=False)
    report: Report = field(repr=False)


@dataclass(frozen=True)
class Pin:
    """One group `tune` pinned to FP32, and why.

    Attributes:
        rule: the id of the rule that pins it in the tuned policy.
        group: the group, in words (a normalization unit, a block, a node).
        reason: the measured error or range that made the pin necessary.
    """

    rule: str
    group: str
    reason: str


@dataclass(frozen=True)
class TuneResult:
    """The tuned policy (its rules plus the pins tune added), and how the search went.

    Attributes:
        policy: the tuned policy, a new value named `<name>.tuned` (or after `output`),
            identified by its own text, not the untuned file's.
        passed: it meets every tolerance at every point.
        low_precision_share: its share of compute nodes in the low precision.
        budget_exhausted: the budget ran out where the search wanted another verdict: a
            smaller (or, failing, a passing) pin set may exist; raise `budget`.
        evaluations: the evaluations spent.
        pins: the pins added, each with its reason.
        yaml: the tuned policy as `trtbuild tune -o` writes it (`policy.to_yaml()`).
        search: the search itself (each trial, the groups), what `trtbuild tune` logs.
    """

    policy: Policy
    passed: bool
    low_precision_share: float
    budget_exhausted: bool
    evaluations: int
    pins: list[Pin]
    yaml: str
    search: SearchResult | None = field(default=None, repr=False, compare=False)
