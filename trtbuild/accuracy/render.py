"""Text renderings of a `Report`: Markdown (its `sections`), the terminal lines, JUnit XML."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trtbuild.accuracy.masked import masked_at, overflow_node, overflow_text, rule_said
from trtbuild.accuracy.points import MADE_UP
from trtbuild.accuracy.report import (
    STRICT_STORED,
    Para,
    Plot,
    Report,
    Section,
    Table,
    data_summary,
    failing_overflow,
    fmt,
    header,
    in_point_order,
    on_sample,
    point_rank,
    sections,
    tolerance_text,
)
from trtbuild.accuracy.sessions import shape_said, shape_text
from trtbuild.words import first_few


def markdown(report: Report) -> str:
    verdict = "PASSED" if report.passed else "FAILED"
    lines = [f"# trtbuild accuracy report: {verdict}", ""]
    lines += [f"- {line}" for line in header(report)] + [""]
    for section in sections(report):
        lines += _section_md(section)
    return "\n".join(lines)


def _section_md(section: Section) -> list[str]:
    lines = [f"## {section.title}", ""]
    for block in section.blocks:
        if isinstance(block, Para):
            lines += [block.text, ""]
        elif isinstance(block, Table):
            lines.append("| " + " | ".join(block.header) + " |")
            lines.append("|" + "---|" * len(block.header))
            lines += [
                "| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in block.rows
            ]
            lines.append("")
        elif isinstance(block, Plot):
            lines += [f"*Plot in report.html: {block.alt}.*", ""]
    return lines


def at_risk_lines(
    at_risk: list[dict[str, Any]],
    emulation: str | None,
    failed_at: str | None = None,
    low: str = "FP16",
) -> str:
    """One summary line for a terminal: how many low-precision ops are at risk, and the worst few.

    `failed_at`: the node where a failing verdict first diverges (`Report.failing_divergence`).
    `low`: the policy's low precision (`PrecisionSummary.low_name`), so a BF16 policy's line
    speaks of BF16, not FP16.
    Why: the line says "not failed" of the ops it lists, and what the emulation assumes
    inside them; an op that is also the failure, or whose sums `strict` stores itself, is
    said as such, not as a risk the verdict left out.
    """
    if not at_risk:
        return f"at risk: none (no {low} op's internal sums or squares leave the {low} range)"
    worst: dict[str, dict[str, Any]] = {}  # each node once, by its worst quantity
    for r in sorted(at_risk, key=lambda r: (r["node"] != failed_at, -r["peak"])):
        worst.setdefault(r["node"], r)  # the failure first: never among the "+N more"
    marked = {failed_at: "; the first divergence above"}
    shown = first_few(
        [f"{n} ({r['quantity']} {r['peak']:.3g}{marked.get(n, '')})" for n, r in worst.items()]
    )
    if emulation == "strict":
        assumed = (
            f"the strict emulation stores {STRICT_STORED} in {low} itself "
            "and assumes FP32 inside other kernels"
        )
    elif emulation:
        assumed = f"the {emulation} emulation assumes FP32 inside kernels"
    else:
        assumed = "measured on the FP32 reference"
    failed = "" if failed_at in worst else "not failed; "
    return (
        f"at risk ({failed}{assumed}): {len(worst)} {low} "
        f"op(s) whose internal quantities leave {low} if a kernel keeps them in {low}: {shown}"
    )


def summary(report: Report) -> str:
    """The few lines a terminal or a CI log shows, each error with its scale and tolerance.

    The verdict names the points it judged and the data it judged them on; with
    several points each gets its own lines (a failing one lists its failing
    outputs), data not the user's own is said per point, and so is every point
    the policy skips.
    """
    main = report.main
    shapes = report.shapes if len(report.shapes) > 1 else []
    lines = [verdict_line(report)]
    if shapes:
        lines.append(f"  at {shapes[0].label}:")
    indent = "    " if shapes else "  "
    lines += [_output_line(name, m, indent) for name, m in main.outputs.items()]
    lines += split_lines(report.split, indent, report.precision.low_name)
    for s in shapes[1:]:
        bad = {n: m for n, m in s.main.outputs.items() if not m.passed}
        lines.append(f"  at {s.label}: {'pass' if s.main.passed else 'FAIL'}")  # masked too
        lines += [_output_line(name, m, indent) for name, m in bad.items()]
        if bad:  # what the quantization alone costs there: no pin fixes that part
            lines += split_lines(s.split, indent, report.precision.low_name)
    ordered = in_point_order(report.shapes)
    lines += data_lines(
        [(s.label, s.data) for s in ordered], [(s.label, s.skip) for s in report.skipped]
    )
    lines += masked_lines(report)
    failing = report.failing_shapes
    first = report.failing_divergence
    if first:  # where a failing policy goes wrong, named
        at = f", at {failing[0].label}" if shapes and failing else ""  # which point's walk
        at += on_sample(first)
        lines.append(f"  first divergence at {first['node']} ({first['reason']}){at}")
    if begins := failing_overflow(report):  # a failing output's inf or NaN begins elsewhere
        at = f", at {failing[0].label}" if shapes and failing else ""
        lines.append(f"  non-finite values begin at {overflow_text(begins)}{at}")
    low = report.precision.low_name
    lines.append(at_risk_lines(report.at_risk, main.emulation, (first or {}).get("node"), low))
    lines.append(_baseline_line(report))
    return "\n".join(lines)


def judged_line(front) -> str:
    """What `check` measured: every point with its data, made-up data and skipped points said."""
    runs = sorted(front.shapes, key=lambda r: point_rank(r.point.name))
    summary = data_summary([(r.point.name, r.data) for r in runs])
    said = f" ({summary})" if summary else ""  # a model without inputs draws no data
    lines = [f"measured at {', '.join(r.point.label for r in runs)}{said}"]
    lines += data_lines(
        [(r.point.label, r.data) for r in runs], [(p.label, p.skip) for p in front.skipped]
    )
    return "\n".join(lines)


def data_lines(points: list[tuple[str, Mapping]], skipped: list[tuple[str, str]]) -> list[str]:
    """Each point's data that is not the user's own (derived, synthetic), and each point not
    judged: the same lines under `build`'s verdict and `check`'s table."""
    lines = []
    for label, data in points:
        for name, d in data.items():
            if d.kind in MADE_UP:
                who = f"{name}: " if len(data) > 1 else ""
                lines.append(f"  data at {label}: {who}{d.source}")
    return lines + [f"  not judged: {label} ({reason})" for label, reason in skipped]


def verdict_line(report: Report) -> str:
    """`PASSED at min [..], opt [..], max [..] (emulated-fp16, storage emulation; image data)`,
    or `FAILED at max [..]; passed at ...`: every judged point named, failing ones first."""
    p, main = report.precision, report.main
    how = main.evaluator + (f", {main.emulation} emulation" if main.emulation else "")
    data = data_summary([(s.name, s.data) for s in report.shapes])
    ordered = in_point_order(report.shapes)
    failing = [s.label for s in ordered if not s.main.passed]
    passing = [s.label for s in ordered if s.main.passed]
    if report.passed or not ordered:
        where = f" at {', '.join(passing)}" if passing else ""
    else:
        where = f" at {', '.join(failing)}" + (
            f"; passed at {', '.join(passing)}" if passing else ""
        )
    if report.split is not None:
        how += ", against " + against_model(report.split)
    return (
        f"{'PASSED' if report.passed else 'FAILED'}{where} ({how}{'; ' + data if data else ''}): "
        f"{_masked_clause(report)}{p.share_text()}, {p.pinned_compute} node(s) pinned to FP32"
    )


def against_model(split: Any) -> str:
    """`nafnet_tiny.onnx before quantization`, or `the reference model nafnet_fp32.onnx` where
    the judged model holds no Q/DQ (`ErrorSplit.quantized`)."""
    name = Path(split.reference_model).name
    return f"{name} before quantization" if split.quantized else f"{split.words.reference} {name}"


def split_lines(split: Any, indent: str = "  ", low: str = "FP16") -> list[str]:
    """With `accuracy.reference_model`: each output's error split into the quantization's
    own and the `low` (FP16 or BF16) part, and the outputs no FP32 pin can fix; outputs the
    quantization alone fails and the policy passes (its `dequantize: true` rules) are said
    so, not as unfixable."""
    if split is None:
        return []
    lines, alone = [], split.alone
    for name in split.parts["policy_vs_original"]:
        q = split.parts["quantized_vs_original"][name]
        h = split.parts["policy_vs_quantized"][name]
        said = shape_said(q, split.against("quantized_vs_original"))
        part = shape_said(h, split.against("policy_vs_quantized"))
        lines.append(
            f"{indent}{name}: {alone.removeprefix('the ')} {said}max_abs={fmt(q.max_abs)} "
            f"median_abs={fmt(q.median_abs)} ({'pass' if q.passed else 'FAIL'}); {low} part "
            f"{part}max_abs={fmt(h.max_abs)} median_abs={fmt(h.median_abs)}"
        )
    if failing := split.quantization_fails(passed=False):
        lines.append(
            f"{indent}{alone} fails the tolerances on {', '.join(failing)}{split.unfixable()}"
        )
    if fixed := split.quantization_fails(passed=True):
        lines.append(
            f"{indent}{alone} fails the tolerances on {', '.join(fixed)}, which the policy "
            f"passes{split.words.passed_by}"
        )
    return lines


def _masked_clause(report: Report) -> str:
    """`masked overflow at /mul (Mul) fails it (accuracy.masked_overflow: fail); `, or `only
    warned`: the rule that decided, on the verdict line, wherever one applied."""
    found = report.masked_overflows
    if not found:
        return ""
    nodes = ", ".join(dict.fromkeys(overflow_node(o) for _, o in found))
    rule = report.masked_overflow_rule
    did = "fails it" if rule == "fail" else "only warned"
    return f"masked overflow at {nodes} {did} {rule_said(rule)}; "


def masked_lines(report: Report) -> list[str]:
    """One line per point with a masked overflow: where, which sample, how many values."""
    return [f"  {masked_at(s.label, o)}" for s, o in report.masked_overflows]


def _output_line(name: str, m: Any, indent: str = "  ") -> str:
    head = f"{indent}{name}: {'pass' if m.passed else 'FAIL'}  "
    tail = f"[{tolerance_text(m)}]"
    if not m.measured:
        return f"{head}{shape_text(m.shape_mismatch)}; {tail}"
    head += shape_said(m)
    return (
        f"{head}max_abs={fmt(m.max_abs)} ({fmt(m.max_abs_of_range)} of its range)  "
        f"median_abs={fmt(m.median_abs)}  nonfinite={m.nonfinite}  {tail}"
    )


def _baseline_line(report: Report) -> str:
    """The all-FP16 baseline's verdict: where it first fails, and its first divergence there.

    A failing baseline without one is said why: its failing outputs, where no intermediate
    tensor's error reached the divergence threshold (a tolerance tighter than FP16's own
    rounding, on a small model). "FAILS" alone named nothing to look at.
    """
    fails = [s for s in report.shapes if not s.fp16.passed]
    base = fails[0].fp16 if fails else report.fp16
    where = f" at {fails[0].label}" if fails and len(report.shapes) > 1 else ""
    failing = bool(fails) or not base.passed
    first = base.first_divergence
    said = f"all-FP16 baseline: {'FAILS' + where if failing else 'passes'}"
    if first:
        return said + f"; first divergence at {first['node']} ({first['reason']}){on_sample(first)}"
    bad = [f"{n} (max_abs={fmt(m.max_abs)})" for n, m in base.outputs.items() if not m.passed]
    if not failing or not bad:
        return said
    said += f" on {first_few(bad)}"
    if base.walked:
        said += (
            "; no intermediate tensor's error reaches the divergence threshold "
            f"({report.divergence_threshold:g} of its range)"
        )
    return said


def _masked_cases(report: Report, per_point: bool) -> list[tuple[str, str, str | None]]:
    """A case per point with a masked overflow: failing under `accuracy.masked_overflow:
    fail`; under `warn` a passing case whose name says it was warned (JUnit has no warning)."""
    rule = report.masked_overflow_rule
    cases = []
    for s, o in report.masked_overflows:
        name = "masked overflow" + (f" @ {s.label}" if per_point else "")
        text = f"{overflow_text(o)}; every output holds {rule_said(rule)}"
        if rule == "fail":
            cases.append((f"trtbuild.{report.main.evaluator}", name, text))
        else:
            cases.append((f"trtbuild.{report.main.evaluator}", f"{name} (warned: {text})", None))
    return cases


# What XML 1.0 cannot hold, even escaped: control characters but tab, newline and return,
# lone surrogates (a name's undecodable byte, as Python's surrogateescape holds it), U+FFFE/F
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    """`text` with each character XML 1.0 cannot hold written as `\\xNN`/`\\uNNNN`.

    Why: a policy named with an escape character (`x\\x1by.yaml`), or a library's
    message holding one, made `junit.xml` not well-formed, and a CI that cannot parse it
    shows no test, failing ones included."""
    return _NOT_XML.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text
    )


def junit_xml(suite: str, cases: list[tuple[str, str, str | None]], skipped=()) -> str:
    """JUnit XML from (classname, name, failure text or None) cases, and (classname, name,
    reason) skipped ones; CI dashboards read it."""
    # imported here: xml.sax pulls in urllib, which `check` does not need at start-up
    from xml.sax.saxutils import escape as _escape
    from xml.sax.saxutils import quoteattr as _quoteattr

    def escape(text: str) -> str:
        return _escape(_xml_safe(text))

    def quoteattr(text: str) -> str:
        return _quoteattr(_xml_safe(text))

    lines = []
    for classname, name, failure in cases:
        body = ""
        if failure:
            first = failure.splitlines()[0][:200]
            body = f"<failure message={quoteattr(first)}>{escape(failure)}</failure>"
        lines.append(
            f"    <testcase classname={quoteattr(classname)} name={quoteattr(name)}>{body}</testcase>"
        )
    for classname, name, reason in skipped:
        lines.append(
            f"    <testcase classname={quoteattr(classname)} name={quoteattr(name)}>"
            f"<skipped message={quoteattr(reason[:200])}/></testcase>"
        )
    failures = sum(1 for c in cases if c[2])
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuites>\n  <testsuite name={quoteattr(suite)} tests="{len(cases) + len(skipped)}" '
        f'failures="{failures}" skipped="{len(skipped)}">\n'
        + "\n".join(lines)
        + "\n  </testsuite>\n</testsuites>\n"
    )


def junit(report: Report) -> str:
    """One test case per output (and shape, where there are several), so CI dashboards show
    which output broke, and where."""
    cases = []
    points = [(s.label, s.main) for s in report.shapes] or [("", report.main)]
    for label, verdict in points:
        for name, m in verdict.outputs.items():
            failure = None
            if not m.passed:
                failure = (
                    f"{shape_said(m)}max_abs={fmt(m.max_abs)} median_abs={fmt(m.median_abs)} "
                    f"nonfinite={m.nonfinite} ({tolerance_text(m)})"
                )
            case = f"{name} @ {label}" if len(points) > 1 or report.skipped else name
            cases.append((f"trtbuild.{report.main.evaluator}", case, failure))
    cases += _masked_cases(report, len(points) > 1 or bool(report.skipped))
    skipped = [
        (f"trtbuild.{report.main.evaluator}", f"{name} @ {s.label}", f"not judged: {s.skip}")
        for s in report.skipped
        for name in report.main.outputs
    ]
    return junit_xml(report.policy, cases, skipped)
