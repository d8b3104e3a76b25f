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

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.errors import EXIT_ACCURACY, EXIT_OK, UsageError, surroundings_error
from trtbuild.fsutil import write_bytes, write_json, write_text
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
    trend_name,
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
    that cannot be reached (exit 2) loses nothing. And the history does not depend on
    `OUT`: when `OUT` cannot be written (a full disk), the night is still recorded,
    every file that can be written is, the night's lines are printed, and then the
    fault is exit 2 naming its path.
    """
    shard = shard or Shard()
    history_url(history)  # a bad URL is exit 2 before anything runs
    paths = [p for p in discover(policies_dir) if shard_of(p.stem, shard.count) == shard.index]
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    results = run_all(paths, out_dir, backend, jobs, progress, use_cache, device)
    fault = _written(_write_json, out_dir, started, shard, results, [], None)
    run = {"night": shard.night, "device": device or _device(results)}
    if shard.count > 1:
        run.update(shard=shard.index, shards=shard.count)
    try:
        with _kept(out_dir if fault is None else None):
            run_id, found, pngs = _record(history, started, results, run, margin, out_dir)
    except _Recorded as exc:  # in the history, though not judged from it: not NOT RECORDED
        said = (
            f"; RECORDED (run {exc.run_id}), NOT JUDGED: the history failed after it took the night"
        )
        _unrecorded(out_dir, started, results, shard, said)
        raise exc.error from None
    except UsageError:
        _unrecorded(out_dir, started, results, shard)
        raise
    night = Night(run_id, results, found)
    late = _render(out_dir, title(started, night.attention()), night, pngs, started, shard)
    fault = fault if fault is not None else late
    if fault is not None:
        raise _out_fault(fault, night)
    return night


def _record(
    history: str | Path,
    started: str,
    results: list[PolicyResult],
    run: dict[str, Any],
    margin: float,
    out_dir: Path,
) -> tuple[int, list[Regression], dict[str, bytes]]:
    """Record the night in the history, then judge it and draw the trends from it (in
    memory: nothing here writes to `OUT`, so its faults cannot cost the history)."""
    from trtbuild.artifacts import versions

    db = open_history(history)
    try:
        run_id = db.record(started, results, versions("none"), **run)
        try:
            found = regressions(db, run_id, results, margin, run["night"])
            pngs = _trends(db, results, out_dir)
        except UsageError as exc:
            recorded = f"; the night is recorded in the history (run {run_id}), not judged"
            said = UsageError(exc.message + recorded, where=exc.where, hint=exc.hint)
            raise _Recorded(run_id, said) from None
    finally:
        db.close()
    return run_id, found, pngs


class _Recorded(Exception):
    """A history fault once the night is recorded (the connection lost while its trends
    are read): exit 2 saying it is recorded. Why apart: the night's files in `OUT` said
    "NOT RECORDED" and its results kept in `nightly.json` alone, of a night in the history."""

    def __init__(self, run_id: int, error: UsageError) -> None:
        super().__init__(error.message)
        self.run_id, self.error = run_id, error


def _trends(db: History, results: list[PolicyResult], out_dir: Path) -> dict[str, bytes]:
    """Each result's trend plot in its device's lane, by its name (`trend_name`);
    Matplotlib given a folder in `OUT` only where it has none (`report_html.plotting_in`: no
    temporary folder, HOME not writable, and the night's builds ran in workers, so this
    process had not imported it: exit 70)."""
    from trtbuild.accuracy.report_html import plotting_in

    devices = len({r.device for r in results})
    with plotting_in(out_dir):
        return {
            trend_name(r.policy, r.device, devices): trend_png(
                trend_name(r.policy, r.device, devices), db.trend(r.policy, r.device)
            )
            for r in results
        }


def _unrecorded(
    out_dir: Path,
    started: str,
    results: list[PolicyResult],
    shard: Shard,
    unjudged: str = "; NOT RECORDED: the history could not be used, no regression judged",
) -> None:
    """Tonight's lines and files in `OUT` from its results alone, where the history could
    not take the night (exit 2 follows): no regression or trend is judged.

    Why: `OUT`'s `summary.md`, `summary.html` and `junit.xml` were the last recorded
    night's, so a failing night read as that night's ALL PASS (JUnit `failures="0"`)
    beside tonight's `nightly.json`, and its failures were on no line of the terminal.
    """
    night = Night(None, results, [])
    for line in night_lines(night)[:-1]:  # the verdict line: the exit 2's message is it
        say(line)
    _render(out_dir, title(started, night.attention()) + unjudged, night, {}, started, shard)


def say(line: str) -> bool:
    """Print `line` on stdout; False where its reader left or it cannot be written (a full
    disk), stdout then sent to /dev/null.

    Why: a night's lines, one per policy as each ends, are read through a pipe that may
    close early (`| grep -q FAIL`, `| head -1`): the BrokenPipeError of the next line
    ended the night there, its later policies never run, nothing recorded, exit 141.
    The night goes on; the command's exit says the reader left where nothing else failed
    (141). So for a stdout on a full disk, said once on stderr: the first line ended the night.
    What does not print is escaped (`printable`): a policy's name is its file's, and an
    escape sequence in it recoloured the terminal, a newline forged a line of its own.
    """
    import os
    import sys

    from trtbuild.errors import printable

    try:
        print(printable(line), flush=True)
        return True
    except OSError as exc:  # the reader left, or stdout's disk is full (a CI log's volume)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        if not isinstance(exc, BrokenPipeError):
            with contextlib.suppress(OSError):
                print(f"trtbuild: warning: stdout: {exc.strerror or exc}; the night goes on "
                      "without its lines", file=sys.stderr)  # fmt: skip
        return False


def _out_fault(fault: Exception, night: Night) -> Exception:
    """The first write `OUT` refused, once the night is printed: exit 2 naming its path
    (a fault that is not the surroundings' stays a bug, exit 70, with its traceback).

    Why print here: the command prints the night's lines only for a night that returns,
    and a policy that errored on the full disk must still be named on the terminal.
    """
    for line in night_lines(night):
        say(line)
    found = fault if isinstance(fault, UsageError) else surroundings_error(fault)
    if found is None:
        return fault
    recorded = f"; the night is recorded in the history (run {night.run_id})"
    return UsageError(found.message + recorded, where=found.where, hint=found.hint)


def night_lines(night: Night) -> list[str]:
    """The night's verdict as the terminal shows it: regressions, failures, flags, missing
    shards, then ATTENTION or all pass."""
    lines = []
    for g in night.regressions:
        on = f" on {g.device}" if g.device else ""
        lines.append(f"REGRESSION {g.policy}{on}: {g.kind}: {g.detail} (last pass {g.since})")
    for r in night.results:
        if r.status != "pass":
            first = r.message.splitlines()[0] if r.message else ""
            lines.append(f"{r.status.upper()} {r.policy}: {first}")
    lines += [f"FLAG {r.policy}: {flag}" for r in night.results for flag in r.flags]
    lines += [f"MISSING {m}: it did not report" for m in night.missing]
    bad = night.attention() + night.missing
    lines.append(
        ("ATTENTION: " + ", ".join(bad)) if bad else f"all {len(night.results)} results pass"
    )
    return lines


def summarize(
    history: str | Path,
    night_id: str,
    out_dir: Path,
    *,
    margin: float = 0.25,
    shards: int = 0,
    devices: int = 0,
) -> Night:
    """The whole night from the history alone: every shard, every lane, what is missing
    (a shard of `shards`, a device of `devices` where given).

    A history that is not there is exit 2, not a new empty one (one that is there gets
    the schema, or its upgrade, as `open_history` gives every reader).
    """
    db = open_history(history, create=False)
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
        pngs = _trends(db, results, out_dir)
    finally:
        db.close()
    night = Night(
        None, results, regs, missing_shards(runs, shards) + missing_devices(runs, devices)
    )
    started = min(r["started"] for r in runs)
    heading = title(f"{started} (night {night_id})", night.attention() + night.missing)
    fault = _render(out_dir, heading, night, pngs, started, Shard(night=night_id))
    if fault is not None:
        raise fault
    return night


def missing_shards(runs: list[dict[str, Any]], expected: int = 0) -> list[str]:
    """`shard K/N on DEVICE` for each shard a device's jobs should have written and did not.

    N is `expected` where given, else the largest count a shard of that device recorded.
    Only a shard of N shards reports shard K/N: shard 1/2 runs other policies than 1/3 (a
    night whose matrix changed between attempts ran 1/2, 2/3 and 3/3; the policies of
    shard 1/3 never ran, and the summary said every result passes).
    """
    missing = []
    for device in sorted({r["device"] or "" for r in runs}):
        mine = [r for r in runs if (r["device"] or "") == device]
        count = expected or max((r["shards"] or 1) for r in mine)
        seen = {r["shard"] or 1 for r in mine if (r["shards"] or 1) == count}
        missing += [f"shard {k}/{count} on {device}" for k in range(1, count + 1) if k not in seen]
    return missing


def missing_devices(runs: list[dict[str, Any]], expected: int = 0) -> list[str]:
    """`device K of N (reported: ...)` for each of the `expected` devices past those whose
    shards reported.

    Why: a device's missing shards are counted from the shards it recorded, so a GPU kind
    none of whose jobs reported (its runners offline) left no trace, and the summary of
    the other kind's lanes said every result passes. Which device is missing is not
    known (a lane's device is the GPU's own name), only that one is.
    """
    seen = sorted({r["device"] or "" for r in runs})
    said = ", ".join(seen)
    return [
        f"device {k} of {expected} (reported: {said})" for k in range(len(seen) + 1, expected + 1)
    ]


def _device(results: list[PolicyResult]) -> str:
    """The run's device: that of a judged result where there is one.

    Why not the first result's: a policy that ended before judging (a model file missing
    on every runner) has no evaluator, so its device is `cpu-emulation`; first in its
    shard, it made the run of an A10's shard and the H100's the same device, and the later
    one's results superseded the other's (`latest`): the A10's failures vanished.
    """
    from trtbuild.nightly.runner import CPU_LANE

    judged = (r.device for r in results if r.device and r.evaluator)
    return next(judged, None) or next((r.device for r in results if r.device), CPU_LANE)


@contextmanager
def _kept(out_dir: Path | None) -> Iterator[None]:
    """Say where the night's results are when the history cannot take them (exit 2); None
    when `OUT/nightly.json` could not be written either."""
    try:
        yield
    except UsageError as exc:
        if out_dir is None:
            raise
        kept = f"; tonight's results are kept in {out_dir / 'nightly.json'}"
        raise UsageError(exc.message + kept, where=exc.where, hint=exc.hint) from None


def _written(write: Callable[..., None], *args: Any) -> Exception | None:
    """Run one write into `OUT`; the fault it raised, if any (an OSError, or the UsageError
    of a folder that refuses files), for the caller to raise once what does not depend on
    it (the history, the other files) is done."""
    try:
        write(*args)
    except (OSError, UsageError) as exc:
        return exc
    return None


def _trends_written(folder: Path, pngs: dict[str, bytes]) -> list[Exception | None]:
    """Each trend plot written into `folder`, a fault each; none where `folder` is a
    symlink (planted in `OUT`: the plots overwrote files where it pointed)."""
    if folder.is_symlink():
        said = UsageError(
            "a symlink where the night's trend plots go",
            where=str(folder),
            hint="remove it: trtbuild writes a folder of its own there, never through a link",
        )
        return [said]
    return [_written(write_bytes, folder / f"{name}.png", png) for name, png in pngs.items()]


def _render(
    out_dir: Path,
    heading: str,
    night: Night,
    pngs: dict[str, bytes],
    started: str,
    shard: Shard,
) -> Exception | None:
    """Write the night's files into `OUT`, each one that can be; the first fault, if any.

    Why each: on a disk with little space left, a small `junit.xml` may still fit where a
    trend did not, and CI reads it.
    """
    faults = _trends_written(out_dir / "trends", pngs)
    rows = table(night.results, night.regressions)
    lanes = lanes_section(night.results, night.missing)
    devices = len({r.device for r in night.results})
    policies = {trend_name(r.policy, r.device, devices): r.policy for r in night.results}
    html = summary_html(heading, rows, pngs, lanes, policies)
    faults += [
        _written(write_text, out_dir / "summary.md", summary_md(heading, rows, lanes, list(pngs))),
        _written(write_text, out_dir / "summary.html", html),
        _written(
            write_text,
            out_dir / "junit.xml",
            junit(night.results, night.regressions, night.missing),
        ),
        _written(
            _write_json,
            out_dir,
            started,
            shard,
            night.results,
            night.regressions,
            night.run_id,
            night,
        ),
    ]
    return next((f for f in faults if f is not None), None)


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
    write_json(out_dir / "nightly.json", doc)


__all__ = [
    "History",
    "Night",
    "Shard",
    "missing_devices",
    "missing_shards",
    "night_lines",
    "nightly",
    "say",
    "summarize",
]
