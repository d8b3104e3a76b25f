"""The nightly accuracy job: build and report every policy, keep history, flag regressions.

Why a history: precision breaks when a model, an exporter, TensorRT or a policy
changes, and the question in the morning is "what got worse, since when, and
why". Each night is one run in an SQLite file (per policy and per output: the
metrics, the verdict, the evaluator, the versions and the hashes of model and
policy), so a regression is judged against the last night the same policy
passed, and the summary can draw each policy's trend.

Stages, top to bottom: `discover` the policies, `run_policy` each (in its own
process with `--jobs`, so one crash or one Polygraphy logger cannot touch
another), `record` the night, `regressions` against history, `render` the
summary files.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import socket
import sqlite3
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.accuracy.render import METRICS
from trtbuild.errors import EXIT_ACCURACY, EXIT_OK, TrtbuildError, UsageError
from trtbuild.fsutil import write_bytes, write_text

GROWTH = ("max_abs", "median_abs")  # the errors whose growth counts as a regression

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started TEXT NOT NULL,
    finished TEXT NOT NULL,
    host TEXT NOT NULL,
    versions TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    policy TEXT NOT NULL,
    status TEXT NOT NULL,              -- pass | fail | error
    exit_code INTEGER NOT NULL,
    evaluator TEXT,
    emulation TEXT,                    -- storage | strict | NULL (a real engine)
    backend TEXT,
    model_sha256 TEXT,
    policy_sha256 TEXT,
    fp16_share REAL,
    fp32_nodes INTEGER,
    message TEXT,
    versions TEXT,
    PRIMARY KEY (run_id, policy)
);
CREATE TABLE IF NOT EXISTS outputs (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    policy TEXT NOT NULL,
    output TEXT NOT NULL,
    passed INTEGER NOT NULL,
    max_abs REAL, mean_abs REAL, median_abs REAL, p99_abs REAL,
    max_rel REAL, max_abs_of_range REAL, cosine REAL, psnr REAL, nonfinite INTEGER,
    PRIMARY KEY (run_id, policy, output)
);
"""
# Columns added since the first history format: an older file gains them on open.
ADDED_COLUMNS = (("results", "emulation", "TEXT"), ("outputs", "max_abs_of_range", "REAL"))


@dataclass
class PolicyResult:
    """What one policy did tonight; plain data so it crosses process boundaries."""

    policy: str  # the policy's file stem, the key in history
    path: str
    status: str  # pass | fail | error
    exit_code: int
    message: str = ""
    evaluator: str | None = None
    emulation: str | None = None
    backend: str | None = None
    model_sha256: str | None = None
    policy_sha256: str | None = None
    fp16_share: float | None = None
    fp32_nodes: int | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Regression:
    policy: str
    kind: str  # "pass→fail", "error", "error grew"
    detail: str
    since: str | None = None  # started-time of the last passing run


def discover(policies_dir: Path) -> list[Path]:
    if not policies_dir.is_dir():
        raise UsageError(
            "policies folder not found", where=str(policies_dir), hint="pass --policies DIR"
        )
    found = sorted(p for p in policies_dir.iterdir() if p.suffix in (".yaml", ".yml"))
    if not found:
        raise UsageError(
            "no *.yaml policies in this folder", where=str(policies_dir), hint="pass --policies DIR"
        )
    return found


def run_policy(path: Path, out_dir: Path, backend: str | None) -> PolicyResult:
    """Build and report one policy; every failure becomes a result, never an exception."""
    from trtbuild import pipeline
    from trtbuild.fsutil import sha256_file
    from trtbuild.policy import load_policy

    result = PolicyResult(policy=path.stem, path=str(path), status="error", exit_code=70)
    try:
        result.policy_sha256 = sha256_file(path)
        policy = load_policy(path)
        if policy.model.is_file():
            result.model_sha256 = sha256_file(policy.model)
        outcome = pipeline.build(policy, out_dir / path.stem, backend)
    except TrtbuildError as exc:
        result.exit_code, result.message = exc.exit_code, str(exc)
        return result
    except Exception as exc:  # a bug in trtbuild: keep the traceback in the summary
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        result.message = f"internal error (a bug): {exc}\n" + "".join(tb[-3:])
        return result
    report = outcome.report
    result.status = "pass" if report["passed"] else "fail"
    result.exit_code = outcome.exit_code
    result.evaluator = report["evaluator"]
    result.emulation = report.get("emulation")
    result.backend = report.get("backend")
    result.fp16_share = report["precision"]["fp16_share"]
    result.fp32_nodes = report["precision"]["fp32_nodes"]
    result.versions = pipeline.versions(result.backend or "none")
    result.outputs = report["outputs"]
    if not report["passed"]:
        failing = [n for n, m in report["outputs"].items() if not m["passed"]]
        result.message = "outputs below tolerance: " + ", ".join(failing)
    return result


def _run_one(args: tuple[Path, Path, str | None]) -> PolicyResult:
    return run_policy(*args)


def run_all(
    paths: list[Path], out_dir: Path, backend: str | None, jobs: int, progress=None
) -> list[PolicyResult]:
    tasks = [(p, out_dir, backend) for p in paths]
    if jobs <= 1:
        results = []
        for task in tasks:
            results.append(_run_one(task))
            if progress:
                progress(results[-1])
        return results
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_run_one, task): task[0] for task in tasks}
        done: dict[Path, PolicyResult] = {}
        for future in concurrent.futures.as_completed(futures):
            done[futures[future]] = future.result()
            if progress:
                progress(done[futures[future]])
    return [done[p] for p in paths]


# -- history ----------------------------------------------------------------------


def open_history(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        db = sqlite3.connect(path)
        db.executescript(SCHEMA_SQL)
        for table_name, column, kind in ADDED_COLUMNS:
            have = {row[1] for row in db.execute(f"PRAGMA table_info({table_name})")}
            if column not in have:
                db.execute(f"ALTER TABLE {table_name} ADD COLUMN {column} {kind}")
    except sqlite3.DatabaseError as exc:
        raise UsageError(
            f"cannot use the history database: {exc}",
            where=str(path),
            hint="point --history at an SQLite file written by trtbuild nightly, or a new path",
        ) from None
    db.row_factory = sqlite3.Row
    return db


def _number(v: Any) -> float | None:
    if isinstance(v, str):  # "inf" / "nan" as JSON writes them
        return float(v)
    return v


def record(
    db: sqlite3.Connection, started: str, results: list[PolicyResult], versions: dict
) -> int:
    """One night, written in one transaction: it is in the history whole or not at all."""
    finished = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    with db:
        cur = db.execute(
            "INSERT INTO runs (started, finished, host, versions) VALUES (?, ?, ?, ?)",
            (started, finished, socket.gethostname(), json.dumps(versions)),
        )
        run_id = cur.lastrowid
        for r in results:
            db.execute(
                "INSERT INTO results (run_id, policy, status, exit_code, evaluator, emulation, "
                "backend, model_sha256, policy_sha256, fp16_share, fp32_nodes, message, versions) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    r.policy,
                    r.status,
                    r.exit_code,
                    r.evaluator,
                    r.emulation,
                    r.backend,
                    r.model_sha256,
                    r.policy_sha256,
                    r.fp16_share,
                    r.fp32_nodes,
                    r.message,
                    json.dumps(r.versions),
                ),
            )
            for name, m in r.outputs.items():
                db.execute(
                    f"INSERT INTO outputs (run_id, policy, output, passed, {', '.join(METRICS)}) "
                    f"VALUES (?, ?, ?, ?{', ?' * len(METRICS)})",
                    (
                        run_id,
                        r.policy,
                        name,
                        int(m["passed"]),
                        *(_number(m.get(k)) for k in METRICS),
                    ),
                )
    return run_id


def regressions(
    db: sqlite3.Connection, run_id: int, results: list[PolicyResult], margin: float
) -> list[Regression]:
    """Each policy against its last passing run before `run_id`."""
    found = []
    for r in results:
        last = db.execute(
            "SELECT r.run_id, runs.started FROM results r JOIN runs ON runs.id = r.run_id "
            "WHERE r.policy = ? AND r.status = 'pass' AND r.run_id < ? "
            "ORDER BY r.run_id DESC LIMIT 1",
            (r.policy, run_id),
        ).fetchone()
        if last is None:
            continue
        since = last["started"]
        if r.status != "pass":
            kind = "pass→fail" if r.status == "fail" else "pass→error"
            found.append(
                Regression(r.policy, kind, r.message.splitlines()[0] if r.message else "", since)
            )
            continue
        before = {
            row["output"]: row
            for row in db.execute(
                "SELECT * FROM outputs WHERE run_id = ? AND policy = ?", (last["run_id"], r.policy)
            )
        }
        for name, m in r.outputs.items():
            old = before.get(name)
            if old is None:
                continue
            for key in GROWTH:
                now, then = _number(m.get(key)), old[key]
                if now is None or then is None:
                    continue
                if now > then * (1 + margin) and now - then > 1e-12:
                    found.append(
                        Regression(
                            r.policy,
                            "error grew",
                            f"{name}.{key} {then:.4g} → {now:.4g} (+{(now / then - 1) if then else float('inf'):.0%}, margin {margin:.0%})",
                            since,
                        )
                    )
    return found


def trend(db: sqlite3.Connection, policy: str, limit: int = 60) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT runs.id, runs.started, r.status FROM results r JOIN runs ON runs.id = r.run_id "
        "WHERE r.policy = ? ORDER BY runs.id DESC LIMIT ?",
        (policy, limit),
    ).fetchall()
    out = []
    for row in reversed(rows):
        outputs = {
            o["output"]: dict(o)
            for o in db.execute(
                "SELECT * FROM outputs WHERE run_id = ? AND policy = ?", (row["id"], policy)
            )
        }
        out.append(
            {
                "run": row["id"],
                "started": row["started"],
                "status": row["status"],
                "outputs": outputs,
            }
        )
    return out


# -- summary ----------------------------------------------------------------------


def trend_png(policy: str, points: list[dict[str, Any]]) -> bytes:
    """median and max |error| of every output, night after night; failing nights marked."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = list(range(len(points)))
    names = sorted({n for p in points for n in p["outputs"]})
    positive = False
    for name in names:
        for key, style in (("median_abs", "-"), ("max_abs", ":")):
            ys = [p["outputs"].get(name, {}).get(key) for p in points]
            ys = [y if y is not None and 0 < y < float("inf") else float("nan") for y in ys]
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
        ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _worst(r: PolicyResult, key: str) -> str:
    """The worst output's error with its scale: max_abs as a share of the output's range,
    median_abs as a multiple of the output's atol."""
    rows = [(m, _number(m.get(key))) for m in r.outputs.values() if m.get(key) is not None]
    if not rows:
        return "–"
    m, worst = max(rows, key=lambda mv: mv[1])
    scale = _number(m.get("max_abs_of_range"))
    if key == "max_abs" and scale is not None:
        return f"{worst:.4g} ({scale:.2g} of range)"
    if key == "median_abs" and m.get("atol"):
        return f"{worst:.4g} ({worst / m['atol']:.2g}× atol)"
    return f"{worst:.4g}"


COLUMNS = (
    "policy",
    "status",
    "evaluator",
    "FP16 share",
    "worst max_abs",
    "worst median_abs",
    "regression",
    "message",
)


def _evaluator(r: PolicyResult) -> str:
    if not r.evaluator:
        return "–"
    return f"{r.evaluator} ({r.emulation})" if r.emulation else r.evaluator


def table(results: list[PolicyResult], found: list[Regression]) -> list[tuple[bool, list[str]]]:
    """One row per policy (ok?, cells): the summary's table, for Markdown and HTML alike."""
    by_policy = _by_policy(found)
    rows = []
    for r in results:
        regs = by_policy.get(r.policy, [])
        cells = [
            r.policy,
            "pass" if r.status == "pass" else r.status.upper(),
            _evaluator(r),
            f"{r.fp16_share:.1%}" if r.fp16_share is not None else "–",
            _worst(r, "max_abs"),
            _worst(r, "median_abs"),
            "; ".join(f"{g.kind}: {g.detail} (last pass {g.since})" for g in regs) or "–",
            r.message.splitlines()[0] if r.message else "",
        ]
        rows.append((r.status == "pass" and not regs, cells))
    return rows


def title(started: str, night_attention: list[str]) -> str:
    verdict = "ALL PASS" if not night_attention else "ATTENTION: " + ", ".join(night_attention)
    return f"trtbuild nightly {started}: {verdict}"


def summary_md(heading: str, rows: list[tuple[bool, list[str]]]) -> str:
    lines = [f"# {heading}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for _, cells in rows:
        cells = [c.replace("|", "\\|") for c in cells]
        cells[0] = f"`{cells[0]}`"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Trends", ""]
    lines += [f"![{cells[0]}](trends/{cells[0]}.png)" for _, cells in rows]
    lines += ["", "Reports: `<policy>/report.html` next to this file.", ""]
    return "\n".join(lines)


def summary_html(heading: str, rows: list[tuple[bool, list[str]]], pngs: dict[str, bytes]) -> str:
    import base64
    from html import escape

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
        f"<figcaption><a href='{escape(name)}/report.html'>{escape(name)} report</a>"
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
        f"</title><style>{style}</style></head><body><h1>{escape(heading)}</h1>"
        f"<table><tr>{head}</tr>{body}</table><h2>Trends</h2>{figs}</body></html>\n"
    )


def _by_policy(found: list[Regression]) -> dict[str, list[Regression]]:
    grouped: dict[str, list[Regression]] = {}
    for g in found:
        grouped.setdefault(g.policy, []).append(g)
    return grouped


def junit(results: list[PolicyResult], found: list[Regression]) -> str:
    """One test case per policy; failing, erroring and regressed policies fail."""
    from trtbuild.accuracy.render import junit_xml

    regs = _by_policy(found)
    cases = []
    for r in results:
        problems = [f"{r.status}: {r.message}"] if r.status != "pass" else []
        problems += [f"regression ({g.kind}): {g.detail}" for g in regs.get(r.policy, [])]
        cases.append(("trtbuild.nightly", r.policy, "\n".join(problems) or None))
    return junit_xml("trtbuild-nightly", cases)


@dataclass
class Night:
    run_id: int
    results: list[PolicyResult]
    regressions: list[Regression]

    @property
    def exit_code(self) -> int:
        if any(r.status != "pass" for r in self.results) or self.regressions:
            return EXIT_ACCURACY
        return EXIT_OK

    def attention(self) -> list[str]:
        return sorted(
            {r.policy for r in self.results if r.status != "pass"}
            | {g.policy for g in self.regressions}
        )


def nightly(
    policies_dir: Path,
    out_dir: Path,
    history: Path,
    *,
    jobs: int = 1,
    backend: str | None = None,
    margin: float = 0.25,
    progress=None,
) -> Night:
    from trtbuild import pipeline

    paths = discover(policies_dir)
    db = open_history(history)
    try:
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        results = run_all(paths, out_dir, backend, jobs, progress)
        run_id = record(db, started, results, pipeline.versions("none"))
        found = regressions(db, run_id, results, margin)
        pngs = {r.policy: trend_png(r.policy, trend(db, r.policy)) for r in results}
    finally:
        db.close()
    for name, png in pngs.items():
        write_bytes(out_dir / "trends" / f"{name}.png", png)
    night = Night(run_id, results, found)
    heading = title(started, night.attention())
    rows = table(results, found)
    write_text(out_dir / "summary.md", summary_md(heading, rows))
    write_text(out_dir / "summary.html", summary_html(heading, rows, pngs))
    write_text(out_dir / "junit.xml", junit(results, found))
    write_text(
        out_dir / "nightly.json",
        json.dumps(
            {
                "run_id": run_id,
                "started": started,
                "results": [asdict(r) for r in results],
                "regressions": [asdict(g) for g in found],
            },
            indent=2,
        )
        + "\n",
    )
    return night
