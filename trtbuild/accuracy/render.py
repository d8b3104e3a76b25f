"""Human and CI renderings of a report: Markdown and JUnit XML."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape, quoteattr


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "–"
    return str(v)


def _outputs_table(outputs: dict[str, dict[str, Any]]) -> list[str]:
    cols = [
        "max_abs",
        "mean_abs",
        "median_abs",
        "p99_abs",
        "max_rel",
        "cosine",
        "psnr",
        "nonfinite",
    ]
    lines = [
        "| output | verdict | " + " | ".join(cols) + " | tolerance |",
        "|---|---|" + "---|" * len(cols) + "---|",
    ]
    for name, m in outputs.items():
        tol = f"atol {m['atol']:g}, rtol {m['rtol']:g} ({m['check_error_stat']})"
        verdict = "pass" if m["passed"] else "**FAIL**"
        lines.append(
            f"| `{name}` | {verdict} | " + " | ".join(_fmt(m.get(c)) for c in cols) + f" | {tol} |"
        )
    return lines


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
        f"- evaluator: **{report['evaluator']}** against the ONNX Runtime FP32 reference, "
        f"{report['samples']} sample(s)",
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
                f"| {name} | {e['backend']} {e['version']} | {e['engine_bytes']:,} B | "
                f"{_fmt(mem.get('weights_bytes'))} B | {_fmt(mem.get('activation_bytes'))} B | {e['build_seconds']} |"
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
    """The few lines a terminal or a CI log shows."""
    p = report["precision"]
    base = report["baselines"]["fp16"]
    lines = [
        f"{'PASSED' if report['passed'] else 'FAILED'} ({report['evaluator']}): "
        f"{p['fp16_share']:.1%} FP16, {len(p['pinned'])} node(s) pinned to FP32"
    ]
    for name, m in report["outputs"].items():
        lines.append(
            f"  {name}: {'pass' if m['passed'] else 'FAIL'}  max_abs={_fmt(m['max_abs'])} "
            f"median_abs={_fmt(m['median_abs'])} nonfinite={m['nonfinite']}"
        )
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
                f"max_abs={_fmt(m['max_abs'])} median_abs={_fmt(m['median_abs'])} "
                f"nonfinite={m['nonfinite']} (atol {m['atol']:g}, rtol {m['rtol']:g}, "
                f"{m['check_error_stat']})"
            )
        cases.append((f"trtbuild.{report['evaluator']}", name, failure))
    return junit_xml(report["policy"], cases)
