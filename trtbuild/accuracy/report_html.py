"""`report.html`: one self-contained page with the verdict and the plots that explain it.

Why a page with plots: the question after a failure is *where* precision
breaks, and a curve of the error along the graph's depth answers it at a
glance (the FP16 baseline's curve jumps at the overflowing node, the policy's
stays flat). The page embeds every plot as a PNG data URI and has no external
resource, so it can be attached to a CI run or mailed as one file.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from trtbuild.accuracy.judge import Verdict
from trtbuild.accuracy.report import (
    PLOTS_LOADED_SCRIPT,
    Para,
    Plot,
    Report,
    Section,
    Table,
    deciding,
    header,
    on_sample,
    sections,
)
from trtbuild.accuracy.sessions import REFERENCE, same_shaped

POLICY_COLOR = "#1f77b4"
BASELINE_COLOR = "#ff7f0e"
NONFINITE_COLOR = "#d62728"


def figure(*grid: int, figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A figure and its axes of Matplotlib's own, drawn to PNG by `_png` (and the nightly's
    trends): no pyplot.

    Why: pyplot's figures belong to the process (its backend, its open figures, neither
    thread-safe), and the report drew through it after `matplotlib.use("Agg")`: a
    notebook's or a script's own backend was Agg after every `build`, its plots gone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)  # its own Agg canvas, whatever the process's backend
    return fig, fig.subplots(*grid)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _rel(value: Any) -> float:
    return float(value) if not isinstance(value, str) else float("inf")


def error_curve_plot(report: Report) -> str:
    """Relative error of every float tensor along topological depth, policy vs all-FP16, at
    the point that decides the verdict (`report.deciding`, a function of the report)."""
    main, fp16, _ = deciding(report)
    fig, ax = figure(figsize=(10, 3.8))
    threshold = report.divergence_threshold
    curves = [
        (
            label + ("" if v.walked else " (not searched: its first sample passes)"),
            v.error_curve,
            color,
        )
        for label, v, color in (
            ("policy", main, POLICY_COLOR),
            ("all-FP16 baseline", fp16, BASELINE_COLOR),
        )
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
    first = fp16.first_divergence
    if first:
        at = next((p["depth"] for p in curves[1][1] if p["node"] == first["node"]), None)
        if at is not None:  # named in the legend, so no text lies on the curves
            # a passing baseline still diverges somewhere first: say which, not "breaks"
            verb = "breaks" if not fp16.passed else "first diverges"
            label = f"all-FP16 {verb} at {first['node']}{on_sample(first)}"
            ax.axvline(at, color=BASELINE_COLOR, ls=":", lw=1, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("depth (float tensors in topological order)")
    ax.set_ylabel("max |error| / tensor range")
    low = report.precision.low_name  # a BF16 policy beside the all-FP16 baseline
    lows = low if low == "FP16" else f"{low} and FP16"
    ax.set_title(f"Error along the graph (emulated {lows} vs FP32; ✕ = non-finite)")
    legend_outside(ax)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def legend_outside(ax) -> None:
    """A readable legend below the axes, where it cannot cover a line or a bar."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=10, frameon=False)


def _errors(evaluation: Verdict, output: str) -> tuple[np.ndarray, int]:
    results = evaluation.run_results
    same = same_shaped(results[REFERENCE], results[evaluation.evaluator], output)
    refs = [np.asarray(r, np.float64).ravel() for r, _ in same] or [EMPTY]
    outs = [np.asarray(o, np.float64).ravel() for _, o in same] or [EMPTY]
    diff = np.abs(np.concatenate(outs) - np.concatenate(refs))
    finite = np.isfinite(diff)
    return diff[finite], int(np.count_nonzero(~finite))


EMPTY = np.zeros(0)


def histogram_plot(output: str, main: Verdict, base: Verdict) -> str:
    """|error| distribution of one output over every sample, on a log axis."""
    fig, ax = figure(figsize=(5, 3.2))
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
    axis = -1 if ref.shape[-1] in (1, 3) and ref.shape[1] not in (1, 3) else 0  # NHWC or NCHW
    with np.errstate(all="ignore"):
        return np.nanmax(np.where(np.isfinite(diff), diff, np.inf), axis=axis)


def heatmap_plot(output: str, main: Verdict, base: Verdict) -> str:
    """Where in the image the error sits: |error| of the first sample, max over channels."""
    from matplotlib.colors import LogNorm

    maps = []
    for label, ev in (("policy", main), ("all-FP16", base)):
        ref = np.asarray(ev.run_results[REFERENCE][0][output])
        out = np.asarray(ev.run_results[ev.evaluator][0][output])
        same = ref.shape == out.shape  # else a count the data decides differs from FP32's
        maps.append((label, _channels_last_map(ref, out) if same else None))
    finite = np.concatenate(
        [m[np.isfinite(m)].ravel() for _, m in maps if m is not None] or [EMPTY]
    )
    positive = finite[finite > 0]
    vmin = float(positive.min()) if positive.size else 1e-8
    vmax = float(positive.max()) if positive.size else 1.0
    fig, axes = figure(1, 2, figsize=(9, 4))
    im = None
    for ax, (label, m) in zip(axes, maps):
        ax.axis("off")
        if m is None:
            ax.set_title(f"{label} (its shape is not FP32's)", fontsize=9)
            continue
        shown = np.where(np.isfinite(m), np.maximum(m, vmin), vmax)
        im = ax.imshow(shown, cmap="magma", norm=LogNorm(vmin=vmin, vmax=max(vmax, vmin * 10)))
        bad = int(np.count_nonzero(~np.isfinite(m)))
        ax.set_title(f"{label}" + (f" ({bad} non-finite pixels)" if bad else ""), fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label="|error| (max over channels)")
    fig.suptitle(f"Error heatmap of {output}, sample 0")
    return _png(fig)


def inline(text: str) -> str:
    """The report's inline markup (`code`, **bold**) as HTML, everything else escaped."""
    out = escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _cell(text: str) -> str:
    if text == "pass":
        return '<td class="pass">pass</td>'
    if text == "**FAIL**":
        return '<td class="fail">FAIL</td>'
    return f"<td>{inline(text)}</td>"


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
    rows = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in table.rows)
    return f"<table><tr>{head}</tr>{rows}</table>"


def _plot(plot: Plot, report: Report) -> str:
    if plot.kind == "error-curve":
        src = error_curve_plot(report)
    elif plot.kind == "histogram":
        src = histogram_plot(plot.output or "", report.main, report.fp16)
    else:
        src = heatmap_plot(plot.output or "", report.main, report.fp16)
    return _img(src, plot.kind, plot.alt)


def _section(section: Section, report: Report) -> str:
    parts = []
    plots = [b for b in section.blocks if isinstance(b, Plot)]
    for block in section.blocks:
        if isinstance(block, Para):
            parts.append(f"<p>{inline(block.text)}</p>")
        elif isinstance(block, Table):
            parts.append(_table(block))
    drawn = "".join(_plot(p, report) for p in plots)
    if len(plots) > 1:
        drawn = f"<div class='grid'>{drawn}</div>"
    body = drawn + "".join(parts)
    if section.collapsed:
        return f"<details><summary>{escape(section.title)}</summary>{body}</details>"
    return f"<h2>{escape(section.title)}</h2>{body}"


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


@contextlib.contextmanager
def plotting_in(scratch: Path) -> Iterator[None]:
    """Matplotlib imported with a folder of its own in `scratch` (a staging folder, the
    night's `OUT`: removed as the block ends) where it would find none: no temporary folder, and not imported yet,
    nor given one (MPLCONFIGDIR).

    Why: its font cache must be written somewhere; where HOME's cache is not writable it
    falls back to a temporary folder, and a container with a read-only root and no tmpfs
    has none: its OSError ended `build` as a bug (exit 70) after the whole run."""
    try:
        tempfile.gettempdir()
        has_folder = True
    except FileNotFoundError:  # "No usable temporary directory found"
        has_folder = False
    if has_folder or "matplotlib" in sys.modules or os.environ.get("MPLCONFIGDIR"):
        yield
        return
    folder = scratch / ".matplotlib"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["MPLCONFIGDIR"] = str(folder)
    try:
        import matplotlib  # noqa: F401 - reads MPLCONFIGDIR now, once

        yield
    finally:
        del os.environ["MPLCONFIGDIR"]
        shutil.rmtree(folder, ignore_errors=True)


def html(report: Report) -> str:
    """The whole page: the same sections as report.md, with the plots drawn."""
    verdict = "PASSED" if report.passed else "FAILED"
    cls = "pass" if report.passed else "fail"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>trtbuild report: {verdict} {escape(report.policy)}</title>",
        f"<style>{STYLE}</style><script>{PLOTS_LOADED_SCRIPT}</script></head><body>",
        f"<h1>trtbuild accuracy report <span class='{cls}'>{verdict}</span></h1>",
        "<ul>" + "".join(f"<li>{inline(line)}</li>" for line in header(report)) + "</ul>",
    ]
    parts += [_section(s, report) for s in sections(report)]
    parts.append("</body></html>\n")
    return "\n".join(parts)
