"""The report model: what `build` and `report` found, typed, and the sections that show it.

Why one model: report.json, report.md, report.html, junit.xml, the terminal
lines and the nightly history all say the same things; they read these
dataclasses, and Markdown and HTML render the same `sections`, so no renderer
can leave out what another shows. `to_json` keeps report.json's stable keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trtbuild.accuracy.checks import describe, image_like, map_like
from trtbuild.accuracy.masked import RULE_KEY, overflow_text
from trtbuild.accuracy.points import DATA_KINDS, InputData, point_label
from trtbuild.accuracy.sessions import EMULATED, REFERENCE, OutputMetrics, shape_text
from trtbuild.sizes import fmt_bytes

if TYPE_CHECKING:
    from trtbuild.accuracy.breakdown import ErrorSplit
    from trtbuild.accuracy.judge import Verdict
    from trtbuild.accuracy.points import ShapePoint
    from trtbuild.precision.assign import PrecisionSummary
    from trtbuild.record import BuildRecord

# The per-output metrics every rendering shows, in this order (report.md, report.html,
# the nightly summary and history); written once here.
METRICS = (
    "max_abs",
    "mean_abs",
    "median_abs",
    "p99_abs",
    "max_rel",
    "max_abs_of_range",
    "cosine",
    "psnr",
    "nonfinite",
)

# Marks the body of report.html and summary.html once every plot has decoded, so a
# headless browser (and a person's devtools) can tell a broken image from a missing one.
PLOTS_LOADED_SCRIPT = """
window.addEventListener('load',function(){var i=[].slice.call(document.images);
document.body.setAttribute('data-plots-loaded',i.filter(function(x){return x.complete&&x.naturalWidth>0}).length+'/'+i.length);});
"""


@dataclass
class ShapeVerdict:
    """The policy and its all-FP16 baseline judged at one point of the input space."""

    name: str  # shape | min | opt | max | a named point (opt=min where equal)
    inputs: dict[str, tuple[int, ...]]
    main: Verdict
    fp16: Verdict
    data: dict[str, InputData] = field(default_factory=dict)  # where each input's data is from
    split: ErrorSplit | None = None  # with accuracy.reference_model: the error in two parts

    @property
    def label(self) -> str:
        """`max [1, 3, 256, 256]`: the name and the dims, of each input where there are several."""
        return point_label(self.name, self.inputs)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inputs": {n: list(d) for n, d in self.inputs.items()},
            "data": {n: d.to_json() for n, d in self.data.items()},
            "passed": self.main.passed,
            "outputs": self.main.outputs_json(),
            "at_risk": self.main.at_risk,
            "first_divergence": self.main.first_divergence,
            "walked": self.main.walked,
            "reference_model": self.split.to_json() if self.split else None,
            "overflow": self.main.overflow,
            "baselines": {
                "fp16": {
                    "passed": self.fp16.passed,
                    "first_divergence": self.fp16.first_divergence,
                    "walked": self.fp16.walked,
                }
            },
        }


# The order a verdict names points in: the profile's, then the named ones as given.
_POINT_ORDER = {"min": 0, "opt": 1, "max": 2, "shape": 1}


def point_rank(name: str) -> int:
    """Where a point stands in a verdict: min, opt (or shape), max, then named points."""
    return _POINT_ORDER.get(name.split("=")[0], 3)


def in_point_order(points: list) -> list:
    """Points (anything with `.name`) as min, opt, max, then named points in their order."""
    return sorted(points, key=lambda p: point_rank(p.name))


def data_summary(points: list[tuple[str, Mapping[str, InputData]]]) -> str:
    """`image data`, or `file data at opt; data derived from a file at max`: what the (name,
    data) points were judged on, each kind of data once."""
    by_kind: dict[str, list[str]] = {}
    for name, data in sorted(points, key=lambda p: point_rank(p[0])):
        for kind in dict.fromkeys(d.kind for d in data.values()):
            by_kind.setdefault(kind, []).append(name)
    parts = []
    for kind, word in DATA_KINDS.items():
        names = by_kind.get(kind)
        if names:
            parts.append(word if len(names) == len(points) else f"{word} at {', '.join(names)}")
    return "; ".join(parts)


@dataclass
class Report:
    """One policy's accuracy report: the policy's verdict and its baselines at the primary
    shape (`shape` or `opt`), and at every point of the input space in `shapes`."""

    policy: str
    model: str
    samples: int
    emulation: str  # the policy's setting; the divergence always comes from it
    divergence_threshold: float
    precision: PrecisionSummary
    main: Verdict
    fp16: Verdict
    fp32: Verdict | None = None  # `accuracy.fp32_check`
    shapes: list[ShapeVerdict] = field(default_factory=list)  # every point, the primary first
    skipped: list[ShapePoint] = field(default_factory=list)  # points not judged (`.skip`: why)
    warnings: list[str] = field(default_factory=list)
    backend: str = "none"
    version: str = ""
    build: BuildRecord | None = None  # build.json's facts (Engines section); not in JSON
    masked_overflow_rule: str = "fail"  # the policy's `accuracy.masked_overflow`
    flat_outputs: list[dict[str, Any]] = field(default_factory=list)  # `evaluation.flat_outputs`

    @property
    def passed(self) -> bool:
        """Every shape passes (the policy's engine serves its whole profile)."""
        return all(s.main.passed for s in self.shapes) if self.shapes else self.main.passed

    @property
    def failing_shapes(self) -> list[ShapeVerdict]:
        return [s for s in self.shapes if not s.main.passed]

    @property
    def failing_divergence(self) -> dict[str, Any] | None:
        """Where a failing policy first goes wrong (its first failing point's walk, else the
        primary point's); None where it passes or nothing was walked."""
        return None if self.passed else deciding(self)[0].first_divergence

    @property
    def at_risk(self) -> list[dict[str, Any]]:
        """Ops at risk at any shape, each quantity at its largest peak."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for verdict in [s.main for s in self.shapes] or [self.main]:
            for r in verdict.at_risk:
                key = (r["node"], r["quantity"])
                if key not in found or r["peak"] > found[key]["peak"]:
                    found[key] = r
        return list(found.values())

    @property
    def split(self) -> ErrorSplit | None:
        """The primary point's error split (`accuracy.reference_model`), else None."""
        return self.shapes[0].split if self.shapes else None

    @property
    def masked_overflows(self) -> list[tuple[ShapeVerdict, dict[str, Any]]]:
        """(point, its first masked overflow) wherever every output holds and an intermediate
        turned non-finite where FP32 is finite: what `accuracy.masked_overflow` rules on."""
        points = self.shapes or []
        return [(s, s.main.masked_overflow) for s in points if s.main.masked_overflow]

    def masked_overflow_json(self) -> dict[str, Any]:
        """report.json's `masked_overflow`: the rule, where it applied, what was checked."""
        return {
            "rule": self.masked_overflow_rule,
            "found": [{"point": s.name, **o} for s, o in self.masked_overflows],
            "checked": OVERFLOW_CHECKED,
        }

    @property
    def divergence_evaluator(self) -> str:
        return f"{EMULATED} ({self.emulation})"

    def to_json(self) -> dict[str, Any]:
        fp16_failed = [s.name for s in self.shapes if not s.fp16.passed]
        baselines: dict[str, Any] = {
            "fp16": {
                **self.fp16.to_json(),
                # every point, as the policy's `passed`; the figures are the primary point's
                "passed": not fp16_failed if self.shapes else self.fp16.passed,
                "failed_points": fp16_failed,
            }
        }
        if self.fp32 is not None:
            baselines["fp32"] = {
                "passed": self.fp32.passed,
                "evaluator": self.fp32.evaluator,
                "outputs": self.fp32.outputs_json(),
            }
        return {
            **self.main.to_json(),
            "passed": self.passed,
            "failed_points": [s.name for s in self.failing_shapes],
            "at_risk": self.at_risk,
            "shapes": [s.to_json() for s in self.shapes],
            "skipped_shapes": [s.skipped_json() for s in self.skipped],
            "data": data_summary([(s.name, s.data) for s in self.shapes]),
            "divergence_evaluator": self.divergence_evaluator,
            "policy": self.policy,
            "model": self.model,
            "samples": self.samples,
            "precision": self.precision.to_json(),
            "baselines": baselines,
            "reference_model": self.split.to_json() if self.split else None,
            "divergence_threshold": self.divergence_threshold,
            "masked_overflow": self.masked_overflow_json(),
            "flat_outputs": self.flat_outputs,
            "warnings": self.warnings,
            "trtbuild_version": self.version,
            "backend": self.backend,
        }


def deciding_point(report: Report) -> ShapeVerdict | None:
    """The point that decides the verdict: the first that fails, else the primary one.

    Why: report.md and report.html show it first. A build that failed at max showed
    opt's outputs, all passing, and "not searched" for its first divergence.
    """
    failing = report.failing_shapes
    return failing[0] if failing else (report.shapes[0] if report.shapes else None)


def deciding(report: Report) -> tuple[Verdict, Verdict, str | None]:
    """The policy's verdict and the all-FP16 baseline's at `deciding_point`, with its label
    where there are several points (`max [1, 3, 256, 256]`; None at the only one)."""
    point = deciding_point(report)
    if point is None:
        return report.main, report.fp16, None
    return point.main, point.fp16, point.label if len(report.shapes) > 1 else None


def failing_overflow(report: Report) -> dict[str, Any] | None:
    """Where a failing output's non-finite values begin, where its first divergence is
    elsewhere: the deciding point's first intermediate turned non-finite. (A Phi's FP8
    logits were all inf, from a Softmax's NaN, and the verdict named only a weight DQ 6%
    off before it: `report.json` `overflow` alone held the Softmax.)"""
    if report.passed:
        return None
    main = deciding(report)[0]
    found, first = main.overflow, main.first_divergence or {}
    if found is None or found.get("node") == first.get("node"):
        return None
    nonfinite = any(m.nonfinite and not m.passed for m in main.outputs.values())
    return found if nonfinite else None


# -- the document both Markdown and HTML render --------------------------------------
# Inline markup in text: `code` and **bold**, which Markdown keeps and HTML converts.


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]


@dataclass(frozen=True)
class Plot:
    """A figure (HTML draws it; Markdown names it); `output` for per-output plots."""

    kind: str  # error-curve | histogram | heatmap
    alt: str
    output: str | None = None


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list[Para | Table | Plot]
    collapsed: bool = False  # long lists: folded in HTML


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "–"
    return str(v)


def tolerance_text(m: OutputMetrics) -> str:
    """Every check the output is judged by, each metric next to its threshold."""
    if m.tolerance is None or not m.checks:
        return f"atol {m.atol:g}, rtol {m.rtol:g} on the {m.check_error_stat}"
    return "; ".join(describe(c, e, m.tolerance) for c, e in m.checks.items())


def _verdict_cell(m: OutputMetrics, theirs: str = "FP32's") -> str:
    """pass, **FAIL**, or **FAIL** with both shapes where some sample's shape is not
    `theirs` (what it was compared with)."""
    said = f": {shape_text(m.shape_mismatch, theirs)}" if m.shape_mismatch else ""
    return ("pass" if m.passed else "**FAIL**") + said


def outputs_table(outputs: dict[str, OutputMetrics]) -> Table:
    rows = [
        (
            f"`{name}`",
            _verdict_cell(m),
            *(fmt(getattr(m, c)) for c in METRICS),
            tolerance_text(m),
        )
        for name, m in outputs.items()
    ]
    return Table(("output", "verdict", *METRICS, "tolerance"), rows)


# What the masked-overflow rule looked at, in every report (report.json's `checked`).
OVERFLOW_CHECKED = (
    "every sample at every judged point, in the emulation: each tensor of the graph whose "
    "non-finite value could vanish before an output, and each boundary Cast the conversion "
    "adds; on samples after the first, a tensor FP32 itself holds a sentinel, inf or NaN in "
    "on some sample by how many of each sign (and NaN) it holds against FP32's there"
)


def nonfinite_paragraph(report: Report) -> list[Para]:
    """Where a failing output's non-finite values begin, where that is not the first
    divergence (`failing_overflow`)."""
    o = failing_overflow(report)
    return [Para(f"Non-finite values begin at `{overflow_text(o)}`.")] if o else []


def overflow_paragraph(report: Report) -> Para:
    """Masked overflow: the rule and what it found, point by point."""
    rule = f"`{RULE_KEY}: {report.masked_overflow_rule}`"
    found = report.masked_overflows
    if not found:
        return Para(
            f"Masked overflow ({rule}): none; no intermediate turns non-finite where FP32 is "
            f"finite while the outputs hold (checked: {OVERFLOW_CHECKED})."
        )
    verdict = "**FAILS** the policy" if report.masked_overflow_rule == "fail" else "warned only"
    where = "; ".join(f"at {s.label}: `{overflow_text(o)}`" for s, o in found)
    return Para(
        f"Masked overflow ({rule}): {verdict}: every output holds, but {where}. Pin that node "
        "(a `name` rule, or `trtbuild tune`); where the inf is meant (the outputs hide it by "
        f"design), `{RULE_KEY}: warn` lets the policy pass."
    )


# What a report says where the judge did not walk (`accuracy.walk: on_failure`, a pass).
NOT_WALKED = (
    "not searched: every output passes and no tensor turns non-finite on the first sample, "
    "where the walk runs (`accuracy.walk: always` walks a passing candidate too)"
)


def divergence_text(d: dict[str, Any] | None, walked: bool = True) -> str:
    if not walked:
        return NOT_WALKED
    if not d:
        return "none: every intermediate tensor stays within the divergence threshold"
    return f"`{d['node']}` ({d['op']}), tensor `{d['tensor']}`: {d['reason']}{on_sample(d)}"


def on_sample(d: dict[str, Any]) -> str:
    """Which sample a first divergence was walked on, where not the first: a candidate is
    walked on the first sample it fails on (`judge`)."""
    return f", on sample {d['sample']}" if d.get("sample") else ""


def header(report: Report) -> list[str]:
    """The lines under the title: what was judged, by what, and the precision split."""
    p, main = report.precision, report.main
    how = f" ({main.emulation} emulation)" if main.emulation else ""
    lines = [
        f"policy: `{report.policy}`",
        f"model: `{report.model}`",
        f"evaluator: **{main.evaluator}**{how} against {reference_text(report)}, "
        f"{report.samples} sample(s); first divergence and error curve from "
        f"**{report.divergence_evaluator}**",
        f"precision: {p.fp16_nodes} FP16, {p.bf16_nodes} BF16{_quantized_counts(p)} and "
        f"{p.fp32_nodes} FP32 compute nodes ({p.share_text()}), {p.pinned_compute} compute "
        "node(s) pinned by rules",
    ] + ([quantized_line(p.quantized)] if p.quantized.get("dq_nodes") else [])
    if report.shapes:  # one point: its data as said (upsampled photos, ...); more: the Shapes table
        one = len(report.shapes) == 1
        data = (
            _data_cell(report.shapes[0])
            if one
            else data_summary([(s.name, s.data) for s in report.shapes])
        )
        lines.append(f"data: {data}")
    return lines


def quantized_line(inventory: Mapping[str, Any]) -> str:
    """`quantized: 82 Q/DQ pairs (82 int8), 14 quantized ops (14 int8); DQ-fed: Conv 14, ...`."""

    def per(counts: Mapping[str, int]) -> str:
        return ", ".join(f"{n} {k}" for k, n in counts.items()) or "none"

    pairs, ops = inventory.get("pairs", {}), inventory.get("quantized_ops", {})
    fed = ", ".join(f"{k} {n}" for k, n in inventory.get("dq_fed", {}).items())
    head = f"{sum(pairs.values())} Q/DQ pairs ({per(pairs)}), {sum(ops.values())} quantized ops"
    if not inventory.get("q_nodes") and not ops:  # INT4 LLMs: "36 Q/DQ pairs" with no Q
        head = (
            f"weights only, {sum(pairs.values())} DQ(s) of constant weights ({per(pairs)}), no "
            "QuantizeLinear: no op computes on quantized inputs"
        )
    else:
        head += f" ({per(ops)})"
    return (
        f"quantized: {head}; DQ-fed: {fed or 'none'}; Q/DQ nodes follow the ops around them "
        "and are never pinned"
    )


def _quantized_counts(p: PrecisionSummary) -> str:
    """`, 14 INT8` where the model is quantized: its own class beside FP16/BF16/FP32."""
    return "".join(
        f", {n} {name}" for name, n in (("INT8", p.int8_nodes), ("FP8", p.fp8_nodes)) if n
    )


def reference_text(report: Report) -> str:
    """What the outputs are judged against: the model's FP32 run, or the reference model's."""
    if report.split is None:
        return "the ONNX Runtime FP32 reference"
    return f"{report.split.words.reference} (`{report.split.reference_model}`, ONNX Runtime FP32)"


def sections(report: Report) -> list[Section]:
    """Every section of report.md and report.html, in order."""
    main, _, at = deciding(report)
    out = [
        Section(
            f"Outputs (policy, at {at})" if at else "Outputs (policy)",
            [
                outputs_table(main.outputs),
                Para(
                    "First divergence (policy): "
                    + divergence_text(main.first_divergence, main.walked)
                ),
                *nonfinite_paragraph(report),
                overflow_paragraph(report),
            ],
        ),
        _baseline_section(report),
        _at_risk_section(report),
    ]
    point = deciding_point(report)
    if point is not None and point.split is not None:  # the point Outputs shows, its split
        out.insert(1, _split_section(point.split, report.precision.low_name, at))
    if len(report.shapes) > 1 or report.skipped:
        out.insert(1, _shapes_section(report))
    if report.fp32 is not None:
        out.append(_fp32_section(report.fp32))
    out.append(_curve_section(report))
    out.append(_distributions_section(report))
    if report.precision.pinned:
        out.append(_pinned_section(report.precision))
    if report.build and report.build.engines:
        out.append(_engines_section(report.build))
    if report.warnings:
        out.append(Section("Warnings", [Para(w) for w in report.warnings]))
    return out


def _split_section(split: ErrorSplit, low: str, at: str | None = None) -> Section:
    """Each output's error against the reference model, and its two parts, in the words of
    whether the model is quantized (`ErrorSplit.words`), at the point `at` that Outputs
    shows: a policy failing at `min` where the quantization alone fails there too was shown
    the primary point's split, "pass", as if FP16 alone had failed it."""
    words = split.words
    rows = [
        (f"`{name}`", split.label(part, low), _verdict_cell(m, split.against(part)),
         fmt(m.max_abs), fmt(m.median_abs), fmt(m.max_abs_of_range), fmt(m.cosine), fmt(m.psnr),
         str(m.nonfinite))
        for name in split.parts["policy_vs_original"]
        for part, by_output in split.parts.items()
        for m in [by_output[name]]
    ]  # fmt: skip
    head = ("output", "comparison", "verdict", "max_abs", "median_abs", "max_abs_of_range",
            "cosine", "psnr", "nonfinite")  # fmt: skip
    text = (
        f"The tolerances apply against `{split.reference_model}`, {words.reference}. "
        f"{words.alone.capitalize()} is {words.graph}"
        + (f" ({words.kept})" if words.kept else "")
        + " run in FP32"
        + " (Q/DQ as ONNX Runtime runs them)" * words.quantized
        + f" against it: no FP32 pin removes that part. The {low} part is the policy "
        f"against {words.graph} in FP32: what pins change."
    )
    blocks: list[Para | Table | Plot] = [Para(text), Table(head, rows)]
    if failing := split.quantization_fails(passed=False):
        blocks.append(
            Para(
                f"**{split.alone.capitalize()} fails the tolerances** on {', '.join(failing)}"
                f"{split.unfixable()}."
            )
        )
    if fixed := split.quantization_fails(passed=True):
        blocks.append(
            Para(
                f"{split.alone.capitalize()} fails the tolerances on {', '.join(fixed)}, which "
                f"the policy passes{words.passed_by}."
            )
        )
    return Section(f"Against {words.reference}" + (f", at {at}" if at else ""), blocks)


def _shapes_section(report: Report) -> Section:
    """A column per point of the input space: each output's verdict and worst error there."""
    shapes = report.shapes
    rows = []
    for name in report.main.outputs:
        cells = []
        for sv in shapes:
            m = sv.main.outputs[name]
            cells.append(f"{'pass' if m.passed else '**FAIL**'} {fmt(m.max_abs)}")
        rows.append((f"`{name}`", *cells))
    rows.append(("first divergence", *(_short_divergence(s.main) for s in shapes)))
    rows.append(("masked overflow", *(_short_overflow(s.main) for s in shapes)))
    rows.append(("all-FP16", *("passes" if s.fp16.passed else "**FAILS**" for s in shapes)))
    rows.append(("data", *(_data_cell(s) for s in shapes)))
    text = (
        "The policy is judged at every point of its optimization profile (and every named "
        "shape of `accuracy.shapes`): sums grow with the input, and the engine serves them "
        "all. It passes only where every column passes. Cells: verdict and max |error|."
    )
    head = ("output", *(s.label for s in shapes))
    parts: list = [Para(text), Table(head, rows)]
    parts += [Para(f"Not judged: {s.label}: {s.skip}.") for s in report.skipped]
    return Section("Shapes", parts)


def _data_cell(sv: ShapeVerdict) -> str:
    """Each input's data at a point (its name where there are several inputs)."""
    many = len(sv.data) > 1
    return "; ".join(f"{n}: {d.source}" if many else d.source for n, d in sv.data.items())


def _short_overflow(v: Verdict) -> str:
    o = v.masked_overflow
    return f"`{o['node']}` (sample {o.get('sample', 0)})" if o else "none"


def _short_divergence(v: Verdict) -> str:
    d = v.first_divergence
    return f"`{d['node']}`{on_sample(d)}" if d else ("none" if v.walked else "not searched")


def _baseline_section(report: Report) -> Section:
    """The all-FP16 baseline at the primary shape, and where else it fails."""
    base = report.fp16
    verdict = "passes" if base.passed else "**FAILS**"
    text = f"All-FP16 {verdict} ({base.evaluator})"
    if len(report.shapes) > 1:
        fails = [s.label for s in report.shapes if not s.fp16.passed]
        elsewhere = f"; it **FAILS** at {', '.join(fails)}" if fails else " at every shape"
        text += f" at {report.shapes[0].label}{elsewhere} (the Shapes table)"
    return Section(
        "What the policy buys: all-FP16 baseline",
        [
            Para(text + "."),
            outputs_table(base.outputs),
            Para(
                f"First divergence (all-FP16): {divergence_text(base.first_divergence, base.walked)}"
            ),
        ],
    )


# What `strict` stores in FP16 inside a kernel (`emulate._strict_kernel`), as the at-risk
# lines of the terminal and the report say it
STRICT_STORED = "the sums behind means and LayerNorms"


def _at_risk_section(report: Report) -> Section:
    rows, low = report.at_risk, report.precision.low_name
    if not rows:
        return Section(
            "Ops at risk", [Para(f"None: no {low} op's internal quantities leave the {low} range.")]
        )
    emulation = report.main.emulation
    if emulation == "strict":
        assumed = (
            f"The verdict above (`strict`) stores {STRICT_STORED} in {low} itself, so it has "
            f"judged those; the others fail only on a kernel that keeps them in {low}."
        )
    else:
        assumed = (
            f"The verdict above assumes `{emulation or 'the engine'}`; these fail only on a "
            f"kernel that keeps them in {low}."
        )
    text = (
        f"{low} ops whose internal quantities (sums behind means, squared deviations) leave the "
        f"{low} range on the FP32 reference. {assumed} Pin them (a `name` rule) to be safe on "
        "any kernel."
    )
    failed = (report.failing_divergence or {}).get("node")
    table = Table(
        ("node", "op", "quantity", "peak"),
        [(_node_cell(r["node"], failed), r["op"], r["quantity"], f"{r['peak']:.4g}") for r in rows],
    )
    return Section("Ops at risk", [Para(text), table])


def _node_cell(node: str, failed: str | None) -> str:
    """A node of the at-risk table, said to be where the failing verdict first diverges."""
    return (
        f"`{node}` (the first divergence of the failing verdict)" if node == failed else f"`{node}`"
    )


def _fp32_section(fp32: Verdict) -> Section:
    verdict = "passes" if fp32.passed else "**FAILS**"
    return Section(
        "All-FP32 check",
        [
            Para(
                f"All-FP32 {verdict} ({fp32.evaluator}): differences here come from the "
                "backend itself, not from FP16."
            ),
            outputs_table(fp32.outputs),
        ],
    )


def _curve_section(report: Report) -> Section:
    """The policy's error along the graph, and the baseline's, at the deciding point."""
    main, fp16, at = deciding(report)
    title = f"Error along the graph, at {at}" if at else "Error along the graph"
    if not (main.walked or fp16.walked):
        return Section(title, [Para(f"Policy and all-FP16 baseline: {NOT_WALKED}.")])
    worst = sorted(
        (p for p in main.error_curve if p.get("rel_error") is not None),
        key=lambda p: -float(p["rel_error"]),
    )[:5]
    rows = [(f"`{p['node']}`", p["op"], fmt(float(p["rel_error"]))) for p in worst]
    return Section(
        title,
        [
            Plot("error-curve", "relative error per tensor along depth"),
            Para("Largest relative errors of the policy (max |error| / tensor range):"),
            Table(("node", "op", "relative error"), rows),
        ],
    )


def _distributions_section(report: Report) -> Section:
    blocks: list[Para | Table | Plot] = [
        Plot("histogram", f"|error| of {name}", name) for name in report.main.outputs
    ]
    first = report.main.run_results[REFERENCE][0] if report.main.run_results else {}
    blocks += [
        Plot("heatmap", f"error map of {name}", name)
        for name in report.main.outputs
        if name in first and (image_like(first[name].shape) or map_like(first[name].shape))
    ]
    return Section("Error distributions", blocks)


def _pinned_section(p: PrecisionSummary) -> Section:
    rows = [(f"`{x['node']}`", x["op"], f"`{x['rule']}`") for x in p.pinned]
    return Section(
        f"Pinned nodes ({len(p.pinned)})", [Table(("node", "op", "rule"), rows)], collapsed=True
    )


def _audit_text(audit: dict[str, Any]) -> str:
    """The layer audit's finding; nothing checked is said as such, never as a pass."""
    checked, missing = audit.get("fp32_nodes_checked") or 0, audit.get("not_in_network") or []
    if not checked and not missing:
        return "Layer audit: no node runs in FP32, so there is no FP32 layer to check."
    if not audit.get("ok"):
        return f"Every FP32 node is an FP32 layer in the parsed network: **NO**: {audit.get('mismatched')}"
    text = f"Every FP32 node is an FP32 layer in the parsed network: yes ({checked} checked)."
    if missing:
        text += f" **Warning**: {len(missing)} FP32 node(s) have no layer of their name, unchecked."
    return text


def _engines_section(build: BuildRecord) -> Section:
    rows = []
    for name, e in build.engines.items():
        mem = e.get("memory", {})
        rows.append(
            (
                name,
                f"{e['backend']} {e['version']}",
                fmt_bytes(e["engine_bytes"]),
                fmt_bytes(mem.get("weights_bytes")),
                fmt_bytes(mem.get("activation_bytes")),
                str(e["build_seconds"]),
            )
        )
    head = ("variant", "backend", "engine size", "weights", "activations", "build s")
    blocks: list[Para | Table | Plot] = [Table(head, rows)]
    audit = build.layer_audit or {}
    if audit:
        blocks.append(Para(_audit_text(audit)))
    blocks += [
        Para(int8_text(name, e["int8_kernels"]))
        for name, e in build.engines.items()
        if e.get("int8_kernels")
    ]
    return Section("Engines", blocks)


def int8_text(variant: str, check: dict[str, Any]) -> str:
    """Whether the quantized ops of an engine run INT8 kernels (`int8_kernels` in build.json):
    the inspector's finding on a GPU, or said as not checked."""
    head = f"INT8 kernels ({variant}, {check['evaluator']}): "
    if not check.get("checked"):
        return head + check.get("why", "not checked")
    done, missing = check.get("int8_ops", []), check.get("not_int8", [])
    text = f"{len(done)} of {check['quantized_ops']} quantized ops run INT8"
    if missing:
        shown = ", ".join(f"`{m}`" for m in missing[:5]) + (" …" if len(missing) > 5 else "")
        text += f"; **not INT8**: {shown}"
    return head + text + "."
