"""A night past one machine: shards writing one history at once, a summary of the whole night
from the history alone, lanes that compare like with like; with SQLite and with a real
PostgreSQL server alike (`history_target`)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trtbuild.cli import main
from trtbuild.nightly.history import SCHEMA_VERSION, open_history
from trtbuild.nightly.runner import shard_of

POLICY = (ROOT / "policies" / "loop_sum.yaml").read_text()


def _names() -> list[str]:
    """Four policy names, two in each of two shards (a shard follows from the name alone)."""
    by_shard: dict[int, list[str]] = {1: [], 2: []}
    for k in range(100):
        name = f"sum_{k}"
        if len(by_shard[shard_of(name, 2)]) < 2:
            by_shard[shard_of(name, 2)].append(name)
    return by_shard[1] + by_shard[2]


def _policies(folder, models_dir, unpinned: str | None = None):
    """The Loop example four times; `unpinned` loses its pin (its running sum then overflows)."""
    folder.mkdir(exist_ok=True)
    for name in _names():
        text = POLICY.replace("../models/", f"{models_dir}/")
        if name == unpinned:
            start, end = text.index("  rules:"), text.index("build:")
            text = text[:start] + "  rules: []\n" + text[end:]
        (folder / f"{name}.yaml").write_text(text)
    return folder


def _shard_cmd(policies, out, history, shard: str, night: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trtbuild",
        "nightly",
        *("--policies", str(policies), "--out", str(out), "--history", history),
        *("--shard", shard, "--run-id", night, "--backend", "none", *extra),
    ]


def _two_shards_at_once(policies, tmp_path, history, night: str) -> list[int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            _shard_cmd(policies, tmp_path / f"{night}-{k}", history, f"{k}/2", night),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in (1, 2)
    ]
    codes = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert b"Traceback" not in err, err.decode()
        if p.returncode not in (0, 1):  # shown with a failing assertion on the codes
            print(f"shard exit {p.returncode}:\n{err.decode()[-2000:]}")
        codes.append(p.returncode)
    return codes


# Another process's write lock on a new history, not yet in WAL mode: what a shard holds
# while it switches the file to WAL, when two shards open a new history at once
_LOCK_HOLDER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


def _until_opened(proc: subprocess.Popen, written: Path, grace: float = 1.0) -> None:
    """Wait until `proc` has ended, or for `grace` seconds once it wrote `written` (a
    nightly writes `nightly.json`, then opens the history at once)."""
    end, seen = time.monotonic() + 600, None
    while proc.poll() is None and time.monotonic() < end:
        if seen is None and written.exists():
            seen = time.monotonic()
        if seen is not None and time.monotonic() > seen + grace:
            return
        time.sleep(0.02)


def test_a_shard_opening_a_new_history_another_shard_is_making_waits_for_it(tmp_path, models_dir):
    """The switch of a new SQLite history to WAL meets another shard's write lock: the shard
    waits for it. It exited 2 at once ("cannot use the history database: database is
    locked"): SQLite's busy timeout does not wait for a lock taken over one's own read."""
    history = tmp_path / "history.sqlite"
    policies, out = _policies(tmp_path / "policies", models_dir), tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(history)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        shard = subprocess.Popen(
            _shard_cmd(policies, out, str(history), "1/2", "night-1"),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _until_opened(shard, out / "nightly.json")  # it meets the lock, then it is let go
    finally:
        holder.communicate("\n", timeout=60)
    _, err = shard.communicate(timeout=600)
    assert shard.returncode == 0, err.decode()
    with contextlib.closing(sqlite3.connect(history)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT night, shard FROM runs").fetchall() == [("night-1", 1)]


def _summary(history, night, out, *extra) -> int:
    return main(["summary", "--history", history, "--run-id", night, "--out", str(out), *extra])


def test_two_shards_at_once_then_a_lost_pin_is_named_by_its_shard_and_the_summary(
    tmp_path, models_dir, history_target, capsys
):
    policies = _policies(tmp_path / "policies", models_dir)
    assert _two_shards_at_once(policies, tmp_path, history_target, "night-1") == [0, 0]
    assert _summary(history_target, "night-1", tmp_path / "s1") == 0
    summary = (tmp_path / "s1" / "summary.md").read_text()
    assert "ALL PASS" in summary.splitlines()[0] and "night-1" in summary.splitlines()[0]
    for name in _names():
        assert f"| `{name}` | pass |" in summary
    doc = json.loads((tmp_path / "s1" / "nightly.json").read_text())
    assert sorted(r["policy"] for r in doc["results"]) == sorted(_names())

    lost = _names()[2]  # in shard 2
    _policies(policies, models_dir, unpinned=lost)
    assert _two_shards_at_once(policies, tmp_path, history_target, "night-2") == [0, 1]
    capsys.readouterr()
    assert _summary(history_target, "night-2", tmp_path / "s2") == 1
    said = capsys.readouterr().out
    assert f"REGRESSION {lost} on cpu-emulation: pass→fail" in said
    assert "the policy changed since that pass" in said
    summary = (tmp_path / "s2" / "summary.md").read_text()
    assert f"ATTENTION: {lost}" in summary.splitlines()[0]
    assert 'failures="1"' in (tmp_path / "s2" / "junit.xml").read_text()


def test_a_shard_that_did_not_report_fails_the_summary_and_is_named(
    tmp_path, models_dir, history_target, capsys
):
    policies = _policies(tmp_path / "policies", models_dir)
    cmd = _shard_cmd(policies, tmp_path / "out", history_target, "1/2", "night-7")
    assert main(cmd[3:]) == 0
    capsys.readouterr()
    assert _summary(history_target, "night-7", tmp_path / "s") == 1
    said = capsys.readouterr().out
    assert "MISSING shard 2/2 on cpu-emulation: it did not report" in said
    assert "missing: shard 2/2 on cpu-emulation" in (tmp_path / "s" / "summary.md").read_text()
    assert _summary(history_target, "night-8", tmp_path / "s") == 2  # no such night


def test_shards_of_another_count_do_not_stand_for_a_missing_one(tmp_path, models_dir, capsys):
    """A night whose matrix changed between attempts: shards 1/2, 2/3 and 3/3. Shard 1/2 ran
    other policies than 1/3, whose policies never ran, yet shard 1 counted as seen: every
    result passed and the summary exited 0."""
    policies = _policies(tmp_path / "policies", models_dir)
    history = str(tmp_path / "h.sqlite")
    for shard in ("1/2", "2/3", "3/3"):
        cmd = _shard_cmd(policies, tmp_path / "out", history, shard, "night-9")
        assert main(cmd[3:]) == 0
    capsys.readouterr()
    assert _summary(history, "night-9", tmp_path / "s") == 1
    assert "MISSING shard 1/3 on cpu-emulation: it did not report" in capsys.readouterr().out
    assert _summary(history, "night-9", tmp_path / "s", "--shards", "2") == 1
    assert "MISSING shard 2/2 on cpu-emulation" in capsys.readouterr().out


def test_a_pass_on_the_cpu_then_a_fail_on_a_gpu_is_not_a_regression_of_the_cpu_lane(
    tmp_path, models_dir, history_target, capsys
):
    policies = _policies(tmp_path / "policies", models_dir)
    base = ["nightly", "--policies", str(policies), "--history", history_target]
    base += ["--backend", "none"]
    assert main([*base, "--out", str(tmp_path / "n1")]) == 0
    lost = _names()[0]
    _policies(policies, models_dir, unpinned=lost)
    capsys.readouterr()
    gpu = [*base, "--out", str(tmp_path / "n2"), "--device", "NVIDIA A10"]
    assert main(gpu) == 1  # it fails tonight on the A10 ...
    said = capsys.readouterr().out
    assert f"FAIL {lost}" in said and "REGRESSION" not in said  # ... with no pass there before
    _policies(policies, models_dir)
    assert main([*base, "--out", str(tmp_path / "n3")]) == 0  # the CPU lane: no regression
    history = open_history(history_target)
    try:
        trend = history.trend(lost, "cpu-emulation")
    finally:
        history.close()
    assert [t["status"] for t in trend] == ["pass", "pass"]


@pytest.mark.parametrize(
    ("history", "says", "ran"),
    [
        ("mysql://user@host/db", "unsupported scheme 'mysql'", False),  # said before it runs
        ("postgresql://user@127.0.0.1:1/none", "cannot use the history database", True),
        ("OTHER", "a table 'runs' of another schema (no column", True),
    ],
    ids=["bad-url", "unreachable", "another-schema"],
)
def test_an_unusable_history_is_exit_2_with_one_line_and_the_night_kept(
    tmp_path, models_dir, history, says, ran, capsys
):
    if history == "OTHER":
        history = str(tmp_path / "other.sqlite")
        with sqlite3.connect(history) as db:
            db.execute("CREATE TABLE runs (x INTEGER)")
    policies = _policies(tmp_path / "policies", models_dir)
    out = tmp_path / "out"
    code = main(["nightly", "--policies", str(policies), "--out", str(out), "--history", history])
    err = capsys.readouterr().err
    assert code == 2 and says in err, err
    assert err.count("trtbuild: error:") == 1 and "Traceback" not in err
    assert (out / "nightly.json").is_file() == ran
    if ran:  # a history that fails after the night ran loses none of it
        assert "tonight's results are kept in" in err
        kept = json.loads((out / "nightly.json").read_text())
        assert sorted(r["policy"] for r in kept["results"]) == sorted(_names())
        assert all(r["status"] == "pass" for r in kept["results"])


def test_a_history_of_the_first_format_upgrades_in_place(tmp_path, models_dir):
    """A file written before shards and lanes: it gains the columns, its nights stay."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, started TEXT NOT NULL, "
            "finished TEXT NOT NULL, host TEXT NOT NULL, versions TEXT NOT NULL);"
            "CREATE TABLE results (run_id INTEGER NOT NULL REFERENCES runs(id), policy TEXT NOT "
            "NULL, status TEXT NOT NULL, exit_code INTEGER NOT NULL, evaluator TEXT, backend "
            "TEXT, model_sha256 TEXT, policy_sha256 TEXT, fp16_share REAL, fp32_nodes INTEGER, "
            "message TEXT, versions TEXT, PRIMARY KEY (run_id, policy));"
            "CREATE TABLE outputs (run_id INTEGER NOT NULL, policy TEXT NOT NULL, output TEXT NOT "
            "NULL, passed INTEGER NOT NULL, max_abs REAL, mean_abs REAL, median_abs REAL, "
            "p99_abs REAL, max_rel REAL, cosine REAL, psnr REAL, nonfinite INTEGER, PRIMARY KEY "
            "(run_id, policy, output));"
            "INSERT INTO runs VALUES (1, '2026-01-01T02:00:00+00:00', '2026-01-01T02:10:00+00:00',"
            " 'old-host', '{}');"
            "INSERT INTO results (run_id, policy, status, exit_code, fp16_share) VALUES "
            "(1, 'old', 'pass', 0, 0.75);"
        )
    policies = _policies(tmp_path / "policies", models_dir)
    args = ["nightly", "--policies", str(policies), "--out", str(tmp_path / "o")]
    assert main([*args, "--history", str(path), "--backend", "none"]) == 0
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(results)")}
        assert {"device", "trt_version", "emulation", "shapes", "low_share"} <= columns
        assert "fp16_share" not in columns  # renamed: it held FP16 or BF16, the policy's own
        assert db.execute("SELECT low_share FROM results WHERE run_id = 1").fetchone() == (0.75,)
        assert db.execute("SELECT value FROM trtbuild_meta").fetchone() == (str(SCHEMA_VERSION),)
        assert db.execute("SELECT count(*) FROM runs").fetchone() == (2,)
        assert db.execute("SELECT policy FROM results WHERE run_id = 1").fetchone() == ("old",)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--shard", "3/2", "--run-id", "n"], "--shard '3/2': give K/N with 1 <= K <= N"),
        (["--shard", "1/2"], "--shard needs --run-id"),
    ],
)
def test_bad_shards_are_exit_2(tmp_path, flags, says, capsys):
    assert main(["nightly", "--policies", str(tmp_path), *flags]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("command", ["nightly", "summary"])
def test_a_blank_run_id_or_one_with_a_newline_is_exit_2(tmp_path, models_dir, command, capsys):
    """`--run-id "$RUN_ID"` with the variable unset: every such night was one night, each
    recorded as a retry (attempt 2, 3, ...) of the last, so `summary` judged only the latest
    and a failing night vanished behind a later passing one. Nothing runs or is recorded."""
    history, out = tmp_path / "h.sqlite", tmp_path / "out"
    if command == "nightly":
        folder = tmp_path / "policies"
        _policies(folder, models_dir)
        argv = ["nightly", "--policies", str(folder), "--backend", "none", "--no-cache"]
    else:
        open_history(history).close()
        argv = ["summary"]
    argv += ["--history", str(history), "--out", str(out), "--run-id"]
    for run_id, says in (("", "--run-id '' is blank"), ("47\n11", "holds a control character")):
        assert main([*argv, run_id]) == 2
        assert says in capsys.readouterr().err
        assert not out.exists()
        if command == "nightly":
            assert not history.exists()
