"""The nightly history: one SQLite file, one run per night, per policy and per output.

Why SQLite: a night is written in one transaction (whole or not at all), and the
questions asked of it (the last passing night, a policy's trend) are queries.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import sqlite3
from pathlib import Path
from typing import Any

from trtbuild.accuracy.report import METRICS
from trtbuild.errors import UsageError
from trtbuild.nightly.runner import PolicyResult

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
    shapes TEXT,                       -- JSON [{name, inputs, passed}]: every point judged
    PRIMARY KEY (run_id, policy)
);
CREATE TABLE IF NOT EXISTS outputs (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    policy TEXT NOT NULL,
    output TEXT NOT NULL,
    passed INTEGER NOT NULL,
    max_abs REAL, mean_abs REAL, median_abs REAL, p99_abs REAL,
    max_rel REAL, max_abs_of_range REAL, cosine REAL, psnr REAL, nonfinite INTEGER,
    checks TEXT,                       -- JSON {check: {passed, value, threshold}}
    PRIMARY KEY (run_id, policy, output)
);
"""
# Columns added since the first history format: an older file gains them on open.
ADDED_COLUMNS = (
    ("results", "emulation", "TEXT"),
    ("outputs", "max_abs_of_range", "REAL"),
    ("results", "shapes", "TEXT"),
    ("outputs", "checks", "TEXT"),
)


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


def number(v: Any) -> float | None:
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
                "backend, model_sha256, policy_sha256, fp16_share, fp32_nodes, message, versions, "
                "shapes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    json.dumps(r.shapes),
                ),
            )
            for name, m in r.outputs.items():
                db.execute(
                    f"INSERT INTO outputs (run_id, policy, output, passed, {', '.join(METRICS)}, "
                    f"checks) VALUES (?, ?, ?, ?{', ?' * len(METRICS)}, ?)",
                    (
                        run_id,
                        r.policy,
                        name,
                        int(m["passed"]),
                        *(number(m.get(k)) for k in METRICS),
                        json.dumps(m.get("checks", {})),
                    ),
                )
    return run_id


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
