"""The nightly accuracy job: build and report every policy, keep history, flag regressions.

Why a history: precision breaks when a model, an exporter, TensorRT or a policy
changes, and the question in the morning is "what got worse, since when, and
why". Each night is one run in a database (per policy and per output: the
metrics, the verdict, the lane it was judged in, the versions and the hashes
of model and policy), so a regression is judged against the last night the
same policy passed in the same lane, and the summary can draw each trend.

Past one machine, a night is a CI matrix: shards (`--shard K/N`, a policy's
shard fixed by its name) times GPU kinds, all writing one history (PostgreSQL)
under one `--run-id`; `summarize` then judges the whole night from the history
alone.

Stages, top to bottom, one module each: `runner` discovers the policies and
builds each, `history` records the night, `regressions` judges it against
history, `summary` renders the tables, the trends and JUnit.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.errors import EXIT_ACCURACY, EXIT_OK, UsageError
from trtbuild.fsutil import write_bytes, write_text
from trtbuild.nightly.history import History, history_url, open_history
from trtbuild.nightly.regressions import Regression, regressions
from trtbuild.nightly.runner import PolicyResult, discover, run_all, shard_of
from trtbuild.nightly.summary import (
    junit,
    lanes_section,
    summary_html,
    summary_md,
    table,
    title,
    trend_png,
)


@dataclass
class Night:
    run_id: int | None
    results: list[PolicyResult]
    regressions: list[Regression]
    missing: list[str] = field(default_factory=list)  # shards expected that did not report

    @property
    def exit_code(self) -> int:
        bad = any(r.status != "pass" for r in self.results)
        return EXIT_ACCURACY if bad or self.regressions or self.missing else EXIT_OK

    def attention(self) -> list[str]:
        return sorted(
            {r.policy for r in self.results if r.status != "pass"}
            | {g.policy for g in self.regressions}
        )


@dataclass(frozen=True)
class Shard:
    """Which part of a night this process runs: shard `index` of `count`, of night `night`."""

    index: int = 1
    count: int = 1
    night: str | None = None


def nightly(
    policies_dir: Path,
    out_dir: Path,
    history: str | Path,
    *,
    jobs: int = 1,
    backend: str | None = None,
    margin: float = 0.25,
    progress=None,
    use_cache: bool = True,
    shard: Shard | None = None,
    device: str | None = None,
) -> Night:
    """Run this shard's policies, record them in one transaction, judge and render them.

    The results are in `OUT/nightly.json` before the history is opened: a history
    that cannot be reached (exit 2) loses nothing.
    """
    from trtbuild.artifacts import versions

    shard = shard or Shard()
    history_url(history)  # a bad URL is exit 2 before anything runs
    paths = [p for p in discover(policies_dir) if shard_of(p.stem, shard.count) == shard.index]
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    results = run_all(paths, out_dir, backend, jobs, progress, use_cache, device)
    _write_json(out_dir, started, shard, results, [], None)
    run = {"night": shard.night, "device": device or _device(results)}
    if shard.count > 1:
        run.update(shard=shard.index, shards=shard.count)
    with _kept(out_dir):
        db = open_history(history)
        try:
            run_id = db.record(started, results, versions("none"), **run)
            found = regressions(db, run_id, results, margin, shard.night)
            pngs = {r.policy: trend_png(r.policy, db.trend(r.policy, r.device)) for r in results}
        finally:
            db.close()
    night = Night(run_id, results, found)
    _render(out_dir, title(started, night.attention()), night, pngs, started, shard)
    return night


def summarize(
    history: str | Path, night_id: str, out_dir: Path, *, margin: float = 0.25, shards: int = 0
) -> Night:
    """The whole night from the history alone: every shard, every lane, what is missing."""
    db = open_history(history)
    try:
        runs, found = db.night(night_id)
        if not runs:
            raise UsageError(
                f"no shard of night '{night_id}' is in the history",
                where=db.where,
                hint="pass the --run-id the shards ran with (in CI, the workflow's run id)",
            )
        regs = [g for run_id, r in found for g in regressions(db, run_id, [r], margin, night_id)]
        results = [r for _, r in found]
        pngs = {r.policy: trend_png(r.policy, db.trend(r.policy, r.device)) for r in results}
    finally:
        db.close()
    night = Night(None, results, regs, missing_shards(runs, shards))
    started = min(r["started"] for r in runs)
    heading = title(f"{started} (night {night_id})", night.attention() + night.missing)
    _render(out_dir, heading, night, pngs, started, Shard(night=night_id))
    return night


def missing_shards(runs: list[dict[str, Any]], expected: int = 0) -> list[str]:
    """`shard K/N on DEVICE` for each shard a device's jobs should have written and did not.

    N is `expected` where given, else the largest count a shard of that device recorded.
    """
    missing = []
    for device in sorted({r["device"] or "" for r in runs}):
        mine = [r for r in runs if (r["device"] or "") == device]
        count = expected or max((r["shards"] or 1) for r in mine)
        seen = {r["shard"] or 1 for r in mine}
        missing += [f"shard {k}/{count} on {device}" for k in range(1, count + 1) if k not in seen]
    return missing


def _device(results: list[PolicyResult]) -> str:
    from trtbuild.nightly.runner import CPU_LANE

    return next((r.device for r in results if r.device), CPU_LANE)


@contextmanager
def _kept(out_dir: Path) -> Iterator[None]:
    """Say where the night's results are when the history cannot take them (exit 2)."""
    try:
        yield
    except UsageError as exc:
        kept = f"; tonight's results are kept in {out_dir / 'nightly.json'}"
        raise UsageError(exc.message + kept, where=exc.where, hint=exc.hint) from None


def _render(
    out_dir: Path,
    heading: str,
    night: Night,
    pngs: dict[str, bytes],
    started: str,
    shard: Shard,
) -> None:
    for name, png in pngs.items():
        write_bytes(out_dir / "trends" / f"{name}.png", png)
    rows = table(night.results, night.regressions)
    lanes = lanes_section(night.results, night.missing)
    write_text(out_dir / "summary.md", summary_md(heading, rows, lanes))
    write_text(out_dir / "summary.html", summary_html(heading, rows, pngs, lanes))
    write_text(out_dir / "junit.xml", junit(night.results, night.regressions, night.missing))
    _write_json(out_dir, started, shard, night.results, night.regressions, night.run_id, night)


def _write_json(
    out_dir: Path,
    started: str,
    shard: Shard,
    results: list[PolicyResult],
    found: list[Regression],
    run_id: int | None,
    night: Night | None = None,
) -> None:
    doc = {
        "run_id": run_id,
        "night": shard.night,
        "shard": f"{shard.index}/{shard.count}" if shard.count > 1 else None,
        "started": started,
        "results": [{**asdict(r), "flags": r.flags} for r in results],
        "regressions": [asdict(g) for g in found],
        "missing_shards": night.missing if night is not None else [],
    }
    write_text(out_dir / "nightly.json", json.dumps(doc, indent=2) + "\n")


__all__ = ["History", "Night", "Shard", "missing_shards", "nightly", "summarize"]
