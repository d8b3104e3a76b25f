"""The nightly accuracy job: build and report every policy, keep history, flag regressions.

Why a history: precision breaks when a model, an exporter, TensorRT or a policy
changes, and the question in the morning is "what got worse, since when, and
why". Each night is one run in an SQLite file (per policy and per output: the
metrics, the verdict, the evaluator, the versions and the hashes of model and
policy), so a regression is judged against the last night the same policy
passed, and the summary can draw each policy's trend.

Stages, top to bottom, one module each: `runner` discovers the policies and
builds each, `history` records the night, `regressions` judges it against
history, `summary` renders the table, the trends and JUnit.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trtbuild.errors import EXIT_ACCURACY, EXIT_OK
from trtbuild.fsutil import write_bytes, write_text
from trtbuild.nightly.history import open_history, record, trend
from trtbuild.nightly.regressions import Regression, regressions
from trtbuild.nightly.runner import PolicyResult, discover, run_all
from trtbuild.nightly.summary import junit, summary_html, summary_md, table, title, trend_png


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
    use_cache: bool = True,
) -> Night:
    from trtbuild import pipeline

    paths = discover(policies_dir)
    db = open_history(history)
    try:
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        results = run_all(paths, out_dir, backend, jobs, progress, use_cache)
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
