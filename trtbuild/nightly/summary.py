"""The night's summary: a table (Markdown and HTML alike), trend plots, JUnit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np

from trtbuild.nightly.history import number
from trtbuild.nightly.regressions import Regression, by_policy
from trtbuild.nightly.runner import PolicyResult
from trtbuild.words import percent

# The largest error a trend plots: FP32's largest number, the largest a measured error of an
# FP32 output can be. Larger (1e308 in a history a hand or a fault changed) overflowed the
# log axis' margin to inf, and the night ended as an internal error.
PLOTTED_MAX = float(np.finfo(np.float32).max)


def trend_name(policy: str, device: str | None, devices: int) -> str:
    """A trend plot's name, its file's stem in `trends/`: the policy's, and with its device
    where the night ran on `devices` > 1 (each device's nights are a trend of their own:
    one plot per policy showed the last device's under every row of the policy, a
    failing lane's shading missing). A `/` in a device's name (`--device rack/a10`) is
    written `_`: the name is one file."""
    if devices <= 1:
        return policy
    return f"{policy} @ {(device or '–').replace('/', '_')}"


def trend_png(policy: str, points: list[dict[str, Any]]) -> bytes:
    """The trend figure as PNG bytes."""
    import io

    fig = trend_figure(policy, points)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def trend_figure(policy: str, points: list[dict[str, Any]]) -> Any:
    """median and max |error| of every output, night after night; failing nights marked."""
    from trtbuild.accuracy.report_html import figure

    fig, ax = figure(figsize=(7, 3.2))  # no pyplot: `main(argv)` leaves the caller's backend
    x = list(range(len(points)))
    names = sorted({n for p in points for n in p["outputs"]})
    positive = False
    for name in names:
        for key, style in (("median_abs", "-"), ("max_abs", ":")):
            ys = [p["outputs"].get(name, {}).get(key) for p in points]
            ys = [y if y is not None and 0 < y <= PLOTTED_MAX else float("nan") for y in ys]
            positive = positive or any(y == y for y in ys)
            ax.plot(x, ys, style, marker="o", ms=3, label=f"{name} {key}")
    for i, p in enumerate(points):
        if p["status"] != "pass":
            ax.axvspan(i - 0.4, i + 0.4, color="#d62728", alpha=0.15)
    ax.set_xticks(x, [f"#{p['run']}\n{p['started'][5:10]}" for p in points], fontsize=9)
    if positive:  # errors of exactly zero (an all-FP32 policy) have no log scale
        ax.set_yscale("log")
    ax.set_ylabel("|error|")
    ax.set_title(f"{policy} (red: failing night)", fontsize=10)
    if names:  # beside the axes, where it cannot cover a line
        ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    ax.margins(y=0.08)  # a line at the extreme stays off the frame
    ax.grid(alpha=0.3)
    return fig


def _worst(r: PolicyResult, key: str) -> str:
    """The worst output's error with its scale: a share of that output's range.

    Outputs differ in scale (an image in [0, 1], an energy near 1e7), so an absolute
    error alone reads wrong; the range is the one scale every output has.
    """
    rows = [(m, number(m.get(key))) for m in r.outputs.values() if m.get(key) is not None]
    if not rows:
        return "–"
    m, worst = max(rows, key=lambda mv: _of_range(mv[0], mv[1]))
    share = _of_range(m, worst)
    return f"{worst:.4g} ({share:.2g} of range)" if share >= 0 else f"{worst:.4g}"


def _of_range(m: dict[str, Any], error: float) -> float:
    """`error` / the output's FP32 range (max_abs / max_abs_of_range); -1 when unknown."""
    max_abs, share = number(m.get("max_abs")), number(m.get("max_abs_of_range"))
    if not max_abs or not share or not math.isfinite(max_abs) or not math.isfinite(share):
        return float("inf") if error == float("inf") else -1.0
    return error / (max_abs / share)


COLUMNS = (
    "policy",
    "status",
    "evaluator",
    "device",
    "low-precision share (FP16 or BF16)",
    "worst max_abs",
    "worst median_abs",
    "regression",
    "flags",
    "message",
)


def _evaluator(r: PolicyResult) -> str:
    if not r.evaluator:
        return "–"
    return f"{r.evaluator} ({r.emulation})" if r.emulation else r.evaluator


def _share(r: PolicyResult) -> str:
    """`43.1%`, or `21.5% + 21.5% INT8/FP8` for a quantized model's policy."""
    if r.low_share is None:
        return "–"
    q = f" + {percent(r.quantized_share)} INT8/FP8" if r.quantized_share else ""
    return f"{percent(r.low_share)}{q}"


def table(results: list[PolicyResult], found: list[Regression]) -> list[tuple[bool, list[str]]]:
    """One row per policy (ok?, cells): the summary's table, for Markdown and HTML alike."""
    grouped = by_policy(found)
    rows = []
    for r in results:
        regs = [g for g in grouped.get(r.policy, []) if g.device == r.device]
        cells = [
            r.policy,
            "pass" if r.status == "pass" else r.status.upper(),
            _evaluator(r),
            r.device or "–",
            _share(r),
            _worst(r, "max_abs"),
            _worst(r, "median_abs"),
            "; ".join(f"{g.kind}: {g.detail} (last pass {g.since})" for g in regs) or "–",
            "; ".join(r.flags) or "–",
            r.message.splitlines()[0] if r.message else "",
        ]
        rows.append((r.status == "pass" and not regs, cells))
    return rows


@dataclass(frozen=True)
class Lanes:
    """The policies side by side in every lane of the night, and what disagrees or is missing."""

    head: list[str]  # "policy", then one column per lane
    rows: list[list[str]]
    split: list[str]  # "POLICY passes on A but fails on B"
    missing: list[str]  # "shard K/N on DEVICE"

    def shown(self) -> bool:
        return len(self.head) > 2 or bool(self.split or self.missing)


def lanes_section(results: list[PolicyResult], missing: list[str]) -> Lanes:
    """A lane is a device and an evaluator: a policy right on one GPU and wrong on another
    is what a nightly over several is for, so it is called out."""
    cell = {(r.policy, lane): r.status for r in results for lane in _lanes_of(r, results)}
    lanes = sorted({lane for _, lane in cell})
    policies = sorted({r.policy for r in results})
    rows = [[p, *(cell.get((p, lane), "–") for lane in lanes)] for p in policies]
    split = []
    for p in policies:
        passing = [lane for lane in lanes if cell.get((p, lane)) == "pass"]
        failing = [lane for lane in lanes if cell.get((p, lane)) in ("fail", "error")]
        if passing and failing:
            split.append(f"{p} passes on {', '.join(passing)} but fails on {', '.join(failing)}")
    return Lanes(["policy", *lanes], rows, split, missing)


def _lanes_of(r: PolicyResult, results: list[PolicyResult]) -> list[str]:
    """The lanes `r` is a cell of: its own; or, for a policy that ended before any judging
    (an error: no evaluator), every lane of its device, where it has no verdict either (a
    lane of its own, "(–)", would read as a second evaluator the night did not have)."""
    if r.evaluator:
        return [_lane(r)]
    judged = {_lane(o) for o in results if o.evaluator and o.device == r.device}
    return sorted(judged) or [_lane(r)]


def _lane(r: PolicyResult) -> str:
    """`DEVICE (EVALUATOR)`: a lane's column head."""
    return f"{r.device or '–'} ({_evaluator(r)})"


def _lanes_md(lanes: Lanes) -> list[str]:
    if not lanes.shown():
        return []
    out = ["", "## Lanes", ""]
    out += [f"- **missing: {m}** (it did not report)" for m in lanes.missing]
    out += [f"- **{s}**" for s in lanes.split]
    out += ["", "| " + " | ".join(lanes.head) + " |", "|" + "---|" * len(lanes.head)]
    out += ["| " + " | ".join([f"`{r[0]}`", *r[1:]]) + " |" for r in lanes.rows]
    return out


def _lanes_html(lanes: Lanes) -> str:
    from html import escape

    if not lanes.shown():
        return ""
    notes = "".join(f"<li><b>missing: {escape(m)}</b></li>" for m in lanes.missing)
    notes += "".join(f"<li><b>{escape(s)}</b></li>" for s in lanes.split)
    head = "".join(f"<th>{escape(c)}</th>" for c in lanes.head)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in lanes.rows
    )
    return f"<h2>Lanes</h2><ul>{notes}</ul><table><tr>{head}</tr>{body}</table>"


def title(started: str, night_attention: list[str]) -> str:
    verdict = "ALL PASS" if not night_attention else "ATTENTION: " + ", ".join(night_attention)
    return f"trtbuild nightly {started}: {verdict}"


def summary_md(
    heading: str, rows: list[tuple[bool, list[str]]], lanes: Lanes, trends: list[str]
) -> str:
    """The summary in Markdown (CI's job page); what does not print is escaped (`printable`):
    a newline in a policy's name (its file's) broke its row and the table after it."""
    from trtbuild.errors import printable

    heading = printable(heading)
    lines = [f"# {heading}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for _, cells in rows:
        cells = [printable(c).replace("|", "\\|") for c in cells]
        cells[0] = f"`{cells[0]}`"
        lines.append("| " + " | ".join(cells) + " |")
    lines += _lanes_md(lanes)
    lines += ["", "## Trends", ""]
    lines += [f"![{printable(name)}](trends/{quote(name)}.png)" for name in trends]
    lines += ["", "Reports: `<policy>/report.html` next to this file.", ""]
    return "\n".join(lines)


def summary_html(
    heading: str,
    rows: list[tuple[bool, list[str]]],
    pngs: dict[str, bytes],
    lanes: Lanes,
    policies: dict[str, str] | None = None,
) -> str:
    """The summary as one HTML page, its trend plots embedded; each plot's caption links
    its policy's report (`policies`: a plot's name to its policy, where they differ)."""
    import base64
    from html import escape

    from trtbuild.accuracy.report import PLOTS_LOADED_SCRIPT

    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = "".join(
        f"<tr class='{'pass' if ok else 'fail'}'>"
        + "".join(f"<td>{escape(c)}</td>" for c in cells)
        + "</tr>"
        for ok, cells in rows
    )
    figs = "".join(
        f"<figure><img class='plot' alt='{escape(name)} trend' "
        f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        f"<figcaption><a href='{escape(quote((policies or {}).get(name, name)))}/report.html'>"
        f"{escape(name)} report</a>"
        "</figcaption></figure>"
        for name, png in pngs.items()
    )
    style = (
        "body{font:14px system-ui,sans-serif;margin:24px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px}tr.fail td{background:#ffebe9}"
        "tr.pass td:nth-child(2){color:#1a7f37}figure{display:inline-block;margin:8px}"
    )
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(heading)}"
        f"</title><style>{style}</style><script>{PLOTS_LOADED_SCRIPT}</script></head><body><h1>{escape(heading)}</h1>"
        f"<table><tr>{head}</tr>{body}</table>{_lanes_html(lanes)}<h2>Trends</h2>{figs}"
        "</body></html>\n"
    )


def junit(results: list[PolicyResult], found: list[Regression], missing: list[str] = ()) -> str:
    """One test case per policy and lane; failing, erroring and regressed ones fail, and so
    does each shard that did not report."""
    from trtbuild.accuracy.render import junit_xml

    regs = by_policy(found)
    cases = []
    for r in results:
        problems = [f"{r.status}: {r.message}"] if r.status != "pass" else []
        mine = [g for g in regs.get(r.policy, []) if g.device == r.device]
        problems += [f"regression ({g.kind}): {g.detail}" for g in mine]
        name = f"{r.policy} @ {r.device}" if r.device else r.policy
        cases.append(("trtbuild.nightly", name, "\n".join(problems) or None))
    cases += [("trtbuild.nightly.shards", m, f"{m} did not report") for m in missing]
    return junit_xml("trtbuild-nightly", cases)
