"""`report.html`: one self-contained page with the verdict and the plots that explain it.

Why a page with plots: the question after a failure is *where* precision
breaks, and a curve of the error along the graph's depth answers it at a
glance (the FP16 baseline's curve jumps at the overflowing node, the policy's
stays flat). The page embeds every plot as a PNG data URI and has no external
resource, so it can be attached to a CI run or mailed as one file.
"""

from __future__ import annotations

import base64
import io
from html import escape
from typing import Any

import numpy as np

from trtbuild.accuracy.evaluate import REFERENCE
from trtbuild.accuracy.judge import Verdict
from trtbuild.accuracy.render import METRICS, fmt_bytes, tolerance_text

POLICY_COLOR = "#1f77b4"
BASELINE_COLOR = "#ff7f0e"
NONFINITE_COLOR = "#d62728"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _rel(value: Any) -> float:
    return float(value) if not isinstance(value, str) else float("inf")


def error_curve_plot(report: dict[str, Any]) -> str:
    """Relative error of every float tensor along topological depth, policy vs all-FP16."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.8))
    threshold = report.get("divergence_threshold", 0.05)
    curves = [
        ("policy", report["error_curve"], POLICY_COLOR),
        ("all-FP16 baseline", report["baselines"]["fp16"]["error_curve"], BASELINE_COLOR),
    ]
    finite_max = 1e-7
    for _, curve, _ in curves:
        for p in curve:
            v = _rel(p["rel_error"])
            if np.isfinite(v) and v > 0:
                finite_max = max(finite_max, v)
    top = max(finite_max * 10, threshold * 10, 1.0)
    for label, curve, color in curves:
        depth = np.array([p["depth"] for p in curve], dtype=float)
        err = np.array([_rel(p["rel_error"]) for p in curve], dtype=float)
        shown = np.clip(np.where(np.isfinite(err), err, top), 1e-9, top)
        ax.plot(depth, shown, color=color, lw=1.5, label=label, marker=".", ms=3)
        bad = ~np.isfinite(err)
        if bad.any():
            ax.scatter(depth[bad], shown[bad], color=NONFINITE_COLOR, marker="x", zorder=3, s=30)
    ax.axhline(threshold, color="grey", ls="--", lw=1, label=f"divergence threshold {threshold:g}")
    first = report["baselines"]["fp16"].get("first_divergence")
    if first:
        at = next((p["depth"] for p in curves[1][1] if p["node"] == first["node"]), None)
        if at is not None:
            ax.axvline(at, color=BASELINE_COLOR, ls=":", lw=1)
            ax.annotate(
                f"all-FP16 breaks at {first['node']}",
                (at, top),
                xytext=(4, -12),
                textcoords="offset points",
                fontsize=8,
                color=BASELINE_COLOR,
            )
    ax.set_yscale("log")
    ax.set_xlabel("depth (float tensors in topological order)")
    ax.set_ylabel("max |error| / tensor range")
    ax.set_title("Error along the graph (emulated FP16 vs FP32; ✕ = non-finite)")
    legend_outside(ax)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def legend_outside(ax) -> None:
    """A readable legend below the axes, where it cannot cover a line or a bar."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=10, frameon=False)


def _errors(evaluation: Verdict, output: str) -> tuple[np.ndarray, int]:
    results = evaluation.run_results
    refs = [np.asarray(it[output], np.float64).ravel() for it in results[REFERENCE]]
    outs = [np.asarray(it[output], np.float64).ravel() for it in results[evaluation.evaluator]]
    diff = np.abs(np.concatenate(outs) - np.concatenate(refs))
    finite = np.isfinite(diff)
    return diff[finite], int(np.count_nonzero(~finite))


def histogram_plot(output: str, main: Verdict, base: Verdict) -> str:
    """|error| distribution of one output over every sample, on a log axis."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    series = [("policy", main, POLICY_COLOR), ("all-FP16", base, BASELINE_COLOR)]
    data = [(label, *_errors(ev, output), color) for label, ev, color in series]
    positive = np.concatenate([d[d > 0] for _, d, _, _ in data]) if data else np.array([])
    lo = float(np.log10(positive.min())) if positive.size else -8.0
    hi = float(np.log10(positive.max())) if positive.size else 0.0
    bins = np.linspace(lo - 0.5, max(hi, lo) + 0.5, 40)
    for label, diff, nonfinite, color in data:
        logs = np.log10(np.maximum(diff, 10.0 ** (lo - 0.5)))
        extra = f", {nonfinite} non-finite" if nonfinite else ""
        ax.hist(logs, bins=bins, alpha=0.6, color=color, label=f"{label}{extra}")
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("log10 |error|")
    ax.set_ylabel("elements")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts are whole numbers
    ax.set_title(f"|error| of {output}")
    legend_outside(ax)
    return _png(fig)


def _channels_last_map(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    diff = np.abs(out[0].astype(np.float64) - ref[0])
    axis = 0 if ref.shape[1] in (1, 3) else -1
    with np.errstate(all="ignore"):
        return np.nanmax(np.where(np.isfinite(diff), diff, np.inf), axis=axis)


def heatmap_plot(output: str, main: Verdict, base: Verdict) -> str:
    """Where in the image the error sits: |error| of the first sample, max over channels."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    maps = []
    for label, ev in (("policy", main), ("all-FP16", base)):
        ref = np.asarray(ev.run_results[REFERENCE][0][output])
        out = np.asarray(ev.run_results[ev.evaluator][0][output])
        maps.append((label, _channels_last_map(ref, out)))
    finite = np.concatenate([m[np.isfinite(m)].ravel() for _, m in maps])
    positive = finite[finite > 0]
    vmin = float(positive.min()) if positive.size else 1e-8
    vmax = float(positive.max()) if positive.size else 1.0
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, (label, m) in zip(axes, maps):
        shown = np.where(np.isfinite(m), np.maximum(m, vmin), vmax)
        im = ax.imshow(shown, cmap="magma", norm=LogNorm(vmin=vmin, vmax=max(vmax, vmin * 10)))
        bad = int(np.count_nonzero(~np.isfinite(m)))
        ax.set_title(f"{label}" + (f" ({bad} non-finite pixels)" if bad else ""), fontsize=9)
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8, label="|error| (max over channels)")
    fig.suptitle(f"Error heatmap of {output}, sample 0")
    return _png(fig)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "–" if v is None else escape(str(v))


def _table(outputs: dict[str, dict[str, Any]]) -> str:
    head = "".join(f"<th>{c}</th>" for c in METRICS)
    rows = []
    for name, m in outputs.items():
        verdict = '<td class="pass">pass</td>' if m["passed"] else '<td class="fail">FAIL</td>'
        cells = "".join(f"<td>{_fmt(m.get(c))}</td>" for c in METRICS)
        tol = escape(tolerance_text(m))
        rows.append(f"<tr><td><code>{escape(name)}</code></td>{verdict}{cells}<td>{tol}</td></tr>")
    return (
        f"<table><tr><th>output</th><th>verdict</th>{head}<th>tolerance</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _at_risk(report: dict[str, Any]) -> str:
    rows = report.get("at_risk") or []
    if not rows:
        return "<h2>Ops at risk</h2><p>None: no FP16 op's internal quantities leave the FP16 range.</p>"
    body = "".join(
        f"<tr><td><code>{escape(r['node'])}</code></td><td>{escape(r['op'])}</td>"
        f"<td>{escape(r['quantity'])}</td><td>{r['peak']:.4g}</td></tr>"
        for r in rows
    )
    assumed = escape(report.get("emulation") or "the engine")
    return (
        "<h2>Ops at risk</h2><p>FP16 ops whose internal quantities leave the FP16 range on the "
        f"FP32 reference. The verdict assumes <code>{assumed}</code>; these fail only on a kernel "
        "that keeps them in FP16. Pin them to be safe on any kernel.</p>"
        f"<table><tr><th>node</th><th>op</th><th>quantity</th><th>peak</th></tr>{body}</table>"
    )


def _engines(build: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(e['backend'])} {escape(str(e['version']))}</td>"
        f"<td>{fmt_bytes(e['engine_bytes'])}</td>"
        f"<td>{fmt_bytes(e.get('memory', {}).get('weights_bytes'))}</td>"
        f"<td>{fmt_bytes(e.get('memory', {}).get('activation_bytes'))}</td>"
        f"<td>{e['build_seconds']}</td></tr>"
        for k, e in build["engines"].items()
    )
    audit = build.get("layer_audit") or {}
    line = ""
    if audit:
        ok = "yes" if audit.get("ok") else f"NO: {escape(str(audit.get('mismatched')))}"
        line = (
            f"<p>Every FP32 node is an FP32 layer in the parsed network: {ok} "
            f"({audit.get('fp32_nodes_checked')} checked).</p>"
        )
    return (
        "<h2>Engines</h2><table><tr><th>variant</th><th>backend</th><th>engine size</th>"
        f"<th>weights</th><th>activations</th><th>build s</th></tr>{rows}</table>{line}"
    )


def _divergence(d: dict[str, Any] | None) -> str:
    if not d:
        return "none: every intermediate tensor stays within the divergence threshold"
    return (
        f"<code>{escape(d['node'])}</code> ({escape(d['op'])}), tensor "
        f"<code>{escape(d['tensor'])}</code>: {escape(d['reason'])}"
    )


def _img(src: str, kind: str, alt: str) -> str:
    return f'<figure><img class="plot" data-plot="{kind}" alt="{escape(alt)}" src="{src}"></figure>'


STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1 .pass,h1 .fail{padding:2px 10px;border-radius:4px;color:#fff}
.pass{color:#1a7f37}.fail{color:#cf222e;font-weight:600}
h1 .pass{background:#1a7f37;color:#fff}h1 .fail{background:#cf222e;color:#fff}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
code{background:#f6f8fa;padding:0 3px;border-radius:3px}
figure{margin:8px 0}img.plot{max-width:100%;border:1px solid #eee}
.grid{display:flex;flex-wrap:wrap;gap:8px}.label{color:#57606a}
"""

# Marks the body once every plot has decoded, so a headless browser (and a
# person's devtools) can tell a broken image from a missing one.
SCRIPT = """
window.addEventListener('load',function(){var i=[].slice.call(document.images);
document.body.setAttribute('data-plots-loaded',i.filter(function(x){return x.complete&&x.naturalWidth>0}).length+'/'+i.length);});
"""


def html(
    report: dict[str, Any],
    build: dict[str, Any] | None,
    main: Verdict,
    base: Verdict,
) -> str:
    """The whole page; plots come from the run results of both evaluations."""
    import matplotlib

    matplotlib.use("Agg")  # no display on build machines

    verdict = "PASSED" if report["passed"] else "FAILED"
    cls = "pass" if report["passed"] else "fail"
    p = report["precision"]
    b = report["baselines"]["fp16"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>trtbuild report: {verdict} {escape(report['policy'])}</title>",
        f"<style>{STYLE}</style><script>{SCRIPT}</script></head><body>",
        f"<h1>trtbuild accuracy report <span class='{cls}'>{verdict}</span></h1>",
        "<ul>",
        f"<li>policy <code>{escape(report['policy'])}</code>, model <code>{escape(report['model'])}</code></li>",
        f"<li>evaluator <b>{escape(report['evaluator'])}</b>"
        + (f" ({escape(report['emulation'])} emulation)" if report.get("emulation") else "")
        + " against the ONNX Runtime FP32 "
        f"reference, {report['samples']} sample(s); first divergence and error curves from "
        f"<b>{escape(report['divergence_evaluator'])}</b></li>",
        f"<li>{p['fp16_nodes']} FP16 and {p['fp32_nodes']} FP32 compute nodes "
        f"({p['fp16_share']:.1%} FP16), {len(p['pinned'])} pinned by rules</li>",
        "</ul>",
        "<h2>Outputs (policy)</h2>",
        _table(report["outputs"]),
        f"<p>First divergence (policy): {_divergence(report['first_divergence'])}</p>",
        "<h2>What the policy buys: all-FP16 baseline</h2>",
        f"<p>All-FP16 <span class='{'pass' if b['passed'] else 'fail'}'>"
        f"{'passes' if b['passed'] else 'FAILS'}</span> ({escape(b['evaluator'])}).</p>",
        _table(b["outputs"]),
        f"<p>First divergence (all-FP16): {_divergence(b['first_divergence'])}</p>",
        _at_risk(report),
    ]
    fp32 = report["baselines"].get("fp32")
    if fp32:
        parts += [
            "<h2>All-FP32 sanity check</h2>",
            f"<p>All-FP32 <span class='{'pass' if fp32['passed'] else 'fail'}'>"
            f"{'passes' if fp32['passed'] else 'FAILS'}</span> ({escape(fp32['evaluator'])}): "
            "differences here come from the backend itself, not from FP16.</p>",
            _table(fp32["outputs"]),
        ]
    parts += [
        "<h2>Error along the graph</h2>",
        _img(error_curve_plot(report), "error-curve", "relative error per tensor along depth"),
        "<h2>Error distributions</h2><div class='grid'>",
    ]
    for name in report["outputs"]:
        parts.append(_img(histogram_plot(name, main, base), "histogram", f"|error| of {name}"))
    parts.append("</div>")
    images = [n for n, m in report["outputs"].items() if m.get("psnr") is not None]
    if images:
        parts.append("<h2>Error heatmaps</h2>")
        for name in images:
            parts.append(_img(heatmap_plot(name, main, base), "heatmap", f"error map of {name}"))
    if p["pinned"]:
        rows = "".join(
            f"<tr><td><code>{escape(x['node'])}</code></td><td>{escape(x['op'])}</td>"
            f"<td><code>{escape(x['rule'])}</code></td></tr>"
            for x in p["pinned"]
        )
        parts.append(
            f"<details><summary>{len(p['pinned'])} pinned node(s)</summary>"
            f"<table><tr><th>node</th><th>op</th><th>rule</th></tr>{rows}</table></details>"
        )
    if build and build.get("engines"):
        parts.append(_engines(build))
    if report.get("warnings"):
        parts.append("<h2>Warnings</h2><ul>")
        parts += [f"<li>{escape(w)}</li>" for w in report["warnings"]]
        parts.append("</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
