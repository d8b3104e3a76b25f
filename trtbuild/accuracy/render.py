"""Human and CI renderings of a report: Markdown and JUnit XML."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape, quoteattr

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


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "–"
    return str(v)


def fmt_bytes(n: int | float | None) -> str:
    """One byte format everywhere: binary units with three significant digits."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} GiB"


def tolerance_text(m: dict[str, Any]) -> str:
    return f"atol {m['atol']:g}, rtol {m['rtol']:g} on the {m['check_error_stat']}"


def _outputs_table(outputs: dict[str, dict[str, Any]]) -> list[str]:
    cols = METRICS
    lines = [
        "| output | verdict | " + " | ".join(cols) + " | tolerance |",
        "|---|---|" + "---|" * len(cols) + "---|",
    ]
    for name, m in outputs.items():
        verdict = "pass" if m["passed"] else "**FAIL**"
        lines.append(
            f"| `{name}` | {verdict} | "
            + " | ".join(fmt(m.get(c)) for c in cols)
            + f" | {tolerance_text(m)} |"
        )
    return lines


def at_risk_lines(at_risk: list[dict[str, Any]], emulation: str | None) -> str:
    """One summary line for a terminal: how many FP16 ops are at risk, and the worst few."""
    if not at_risk:
        return "at risk: none (no FP16 op's internal sums or squares leave the FP16 range)"
    nodes = list(dict.fromkeys(r["node"] for r in at_risk))
    worst = sorted(at_risk, key=lambda r: -r["peak"])[:3]
    shown = ", ".join(f"{r['node']} ({r['quantity']} {r['peak']:.3g})" for r in worst)
    assumed = f"the {emulation} emulation assumes FP32 inside kernels" if emulation else ""
    more = f", +{len(nodes) - 3} more" if len(nodes) > 3 else ""
    return (
        f"at risk (not failed; {assumed or 'measured on the FP32 reference'}): {len(nodes)} FP16 "
        f"op(s) whose internal quantities leave FP16 if a kernel keeps them in FP16: {shown}{more}"
    )


def _at_risk_section(report: dict[str, Any]) -> list[str]:
    rows = report.get("at_risk") or []
    lines = ["## Ops at risk", ""]
    if not rows:
        return [*lines, "None: no FP16 op's internal quantities leave the FP16 range.", ""]
    lines += [
        "FP16 ops whose internal quantities (sums behind means, squared deviations) leave the "
        "FP16 range on the FP32 reference. The verdict above assumes "
        f"`{report.get('emulation') or 'the engine'}`; these fail only on a kernel that keeps "
        "them in FP16. Pin them (a `name` rule) to be safe on any kernel.",
        "",
        "| node | op | quantity | peak |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r['node']}` | {r['op']} | {r['quantity']} | {r['peak']:.4g} |" for r in rows]
    return [*lines, ""]


def _divergence(d: dict[str, Any] | None) -> str:
    if not d:
        return "none: every intermediate tensor stays within the divergence threshold"
    return f"`{d['node']}` ({d['op']}), tensor `{d['tensor']}`: {d['reason']}"


def markdown(report: dict[str, Any], build: dict[str, Any] | None) -> str:
    p = report["precision"]
    verdict = "PASSED" if report["passed"] else "FAILED"
    base = report["baselines"]["fp16"]
    lines = [
        f"# trtbuild accuracy report: {verdict}",
        "",
        f"- policy: `{report['policy']}`",
        f"- model: `{report['model']}`",
        f"- evaluator: **{report['evaluator']}**"
        + (f" ({report['emulation']} emulation)" if report.get("emulation") else "")
        + f" against the ONNX Runtime FP32 reference, {report['samples']} sample(s)",
        f"- precision: {p['fp16_nodes']} FP16 and {p['fp32_nodes']} FP32 compute nodes "
        f"({p['fp16_share']:.1%} FP16), {len(p['pinned'])} pinned by rules",
        "",
        "## Outputs (policy)",
        "",
        *_outputs_table(report["outputs"]),
        "",
        f"First divergence (policy, {report['divergence_evaluator']}): {_divergence(report['first_divergence'])}",
        "",
        "## What the policy buys: all-FP16 baseline",
        "",
        f"All-FP16 {'passes' if base['passed'] else 'FAILS'} ({base['evaluator']}).",
        "",
        *_outputs_table(base["outputs"]),
        "",
        f"First divergence (all-FP16): {_divergence(base['first_divergence'])}",
        "",
        *_at_risk_section(report),
    ]
    fp32 = report["baselines"].get("fp32")
    if fp32:
        lines += [
            "## All-FP32 check",
            "",
            f"All-FP32 {'passes' if fp32['passed'] else 'FAILS'} ({fp32['evaluator']}): what "
            "the backend changes apart from FP16.",
            "",
            *_outputs_table(fp32["outputs"]),
            "",
        ]
    if p["pinned"]:
        lines += ["## Pinned nodes", "", "| node | op | rule |", "|---|---|---|"]
        lines += [f"| `{x['node']}` | {x['op']} | `{x['rule']}` |" for x in p["pinned"]]
        lines.append("")
    if build and build.get("engines"):
        lines += [
            "## Engines",
            "",
            "| variant | backend | engine size | weights | activations | build s |",
            "|---|---|---|---|---|---|",
        ]
        for name, e in build["engines"].items():
            mem = e.get("memory", {})
            lines.append(
                f"| {name} | {e['backend']} {e['version']} | {fmt_bytes(e['engine_bytes'])} | "
                f"{fmt_bytes(mem.get('weights_bytes'))} | {fmt_bytes(mem.get('activation_bytes'))} "
                f"| {e['build_seconds']} |"
            )
        audit = build.get("layer_audit") or {}
        if audit:
            ok = "yes" if audit.get("ok") else f"NO: {audit.get('mismatched')}"
            lines += [
                "",
                f"Every FP32 node is an FP32 layer in the parsed network: {ok} "
                f"({audit.get('fp32_nodes_checked')} checked).",
            ]
        lines.append("")
    if report.get("warnings"):
        lines += ["## Warnings", ""] + [f"- {w}" for w in report["warnings"]] + [""]
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    """The few lines a terminal or a CI log shows, each error with its scale and tolerance."""
    p = report["precision"]
    base = report["baselines"]["fp16"]
    how = report["evaluator"] + (
        f", {report['emulation']} emulation" if report.get("emulation") else ""
    )
    lines = [
        f"{'PASSED' if report['passed'] else 'FAILED'} ({how}): "
        f"{p['fp16_share']:.1%} FP16, {len(p['pinned'])} node(s) pinned to FP32"
    ]
    for name, m in report["outputs"].items():
        lines.append(
            f"  {name}: {'pass' if m['passed'] else 'FAIL'}  max_abs={fmt(m['max_abs'])} "
            f"({fmt(m.get('max_abs_of_range'))} of its range)  median_abs={fmt(m['median_abs'])}  "
            f"nonfinite={m['nonfinite']}  [{tolerance_text(m)}]"
        )
    lines.append(at_risk_lines(report.get("at_risk") or [], report.get("emulation")))
    first = base["first_divergence"]
    lines.append(
        f"all-FP16 baseline: {'passes' if base['passed'] else 'FAILS'}"
        + (f"; first divergence at {first['node']} ({first['reason']})" if first else "")
    )
    return "\n".join(lines)


def junit_xml(suite: str, cases: list[tuple[str, str, str | None]]) -> str:
    """JUnit XML from (classname, name, failure text or None) cases; CI dashboards read it."""
    lines = []
    for classname, name, failure in cases:
        body = ""
        if failure:
            first = failure.splitlines()[0][:200]
            body = f"<failure message={quoteattr(first)}>{escape(failure)}</failure>"
        lines.append(
            f"    <testcase classname={quoteattr(classname)} name={quoteattr(name)}>{body}</testcase>"
        )
    failures = sum(1 for c in cases if c[2])
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuites>\n  <testsuite name={quoteattr(suite)} tests="{len(cases)}" '
        f'failures="{failures}">\n' + "\n".join(lines) + "\n  </testsuite>\n</testsuites>\n"
    )


def junit(report: dict[str, Any]) -> str:
    """One test case per output, so CI dashboards show which output broke."""
    cases = []
    for name, m in report["outputs"].items():
        failure = None
        if not m["passed"]:
            failure = (
                f"max_abs={fmt(m['max_abs'])} median_abs={fmt(m['median_abs'])} "
                f"nonfinite={m['nonfinite']} ({tolerance_text(m)})"
            )
        cases.append((f"trtbuild.{report['evaluator']}", name, failure))
    return junit_xml(report["policy"], cases)
