"""A night that meets a strange policies folder, a damaged history or a broken `OUT`: the
night runs and records what it can; the user's or the machine's fault is exit 2 naming
the path and the fix, never exit 70 (a bug) and never a hang. Real files, a real SQLite
history, a real full disk (a tmpfs, where it can be mounted)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import TRTBUILD, F, model, node
from tests.nightly.test_retry import _record, _result
from trtbuild.cli import main
from trtbuild.nightly.history import open_history
from trtbuild.nightly.runner import shard_of

LOOP = (ROOT / "policies" / "loop_sum.yaml").read_text()


def _loop_policy(folder: Path, models_dir: Path, name: str = "loop_sum.yaml") -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(LOOP.replace("../models/", f"{models_dir}/"))
    return path


def _nightly(policies: Path, out: Path, history: Path, *extra: str) -> int:
    args = ["nightly", "--policies", str(policies), "--out", str(out), "--history", str(history)]
    return main([*args, "--backend", "none", "--no-cache", *extra])


def test_a_policy_name_that_is_not_utf8_runs_and_is_written_escaped(tmp_path, models_dir, capsys):
    """`g\\xfe.yaml` (Latin-1, legal on Linux) was exit 70 for the whole night."""
    policies, out, history = tmp_path / "policies", tmp_path / "out", tmp_path / "h.sqlite"
    _loop_policy(policies, models_dir)
    raw = os.fsdecode(b"g\xfe")
    _loop_policy(policies, models_dir, raw + ".yaml")
    assert shard_of(raw, 7) == int(hashlib.sha256(b"g\xfe").hexdigest(), 16) % 7 + 1

    assert _nightly(policies, out, history) == 0
    assert "  g\\xfe: pass" in capsys.readouterr().out
    with sqlite3.connect(history) as db:
        names = db.execute("SELECT policy FROM results ORDER BY policy").fetchall()
    assert names == [("g\\xfe",), ("loop_sum",)]
    assert "| `g\\xfe` | pass |" in (out / "summary.md").read_text(encoding="utf-8")
    assert "g\\xfe" in (out / "summary.html").read_text(encoding="utf-8")
    assert 'name="g\\xfe @ cpu-emulation"' in (out / "junit.xml").read_text(encoding="utf-8")
    assert (out / "g\\xfe" / "report.json").is_file() and (out / "trends" / "g\\xfe.png").is_file()


@contextlib.contextmanager
def _opened(fifo: Path) -> Iterator[threading.Event]:
    """Set when anything opens `fifo` to read; the open is then let through at once
    (end of file), so a night that reads it fails this test instead of hanging it."""
    seen, stop = threading.Event(), threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:  # ENXIO: no reader yet
                assert exc.errno == errno.ENXIO
                continue
            os.close(fd)
            seen.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def test_a_fifo_named_yaml_is_that_policys_error_unopened_and_the_others_run(
    tmp_path, models_dir, capsys
):
    """A FIFO `fifo.yaml` in the folder made the night hang for ever."""
    policies, out, history = tmp_path / "policies", tmp_path / "out", tmp_path / "h.sqlite"
    _loop_policy(policies, models_dir)
    os.mkfifo(policies / "fifo.yaml")
    with _opened(policies / "fifo.yaml") as seen:
        assert _nightly(policies, out, history) == 1
    assert not seen.is_set(), "the night opened the FIFO"
    said = capsys.readouterr().out
    assert "ERROR fifo: " in said and "not a regular file" in said
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT policy, status, exit_code FROM results ORDER BY policy")
        assert rows.fetchall() == [("fifo", "error", 2), ("loop_sum", "pass", 0)]


def test_a_history_whose_schema_is_no_number_is_exit_2_naming_it(tmp_path, models_dir, capsys):
    history = tmp_path / "h.sqlite"
    open_history(history).close()
    with sqlite3.connect(history) as db:
        db.execute("UPDATE trtbuild_meta SET value = 'abc' WHERE key = 'schema'")
    argv = ["summary", "--history", str(history), "--run-id", "1", "--out", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{history}: " in err and "trtbuild_meta.schema) is 'abc', not a number" in err
    assert "Traceback" not in err
    policies = tmp_path / "policies"
    _loop_policy(policies, models_dir)
    assert _nightly(policies, tmp_path / "out", history) == 2
    err = capsys.readouterr().err
    assert "not a number" in err and "tonight's results are kept in" in err


def test_text_in_a_metric_of_the_history_is_read_as_missing(tmp_path, capsys):
    """Text in `outputs.max_abs` was a TypeError (exit 70) in the regressions."""
    history, out = tmp_path / "h.sqlite", tmp_path / "s"
    _record(history, "n1", [_result("p", "pass", 1.0)], "2026-01-01T00:00:00+00:00")
    with sqlite3.connect(history) as db:
        db.execute("UPDATE outputs SET max_abs = 'abc', checks = '{not json'")
        db.execute("UPDATE results SET low_share = 'half'")
    _record(history, "n2", [_result("p", "pass", 4.0)], "2026-01-02T00:00:00+00:00")
    argv = ["summary", "--history", str(history), "--out", str(out), "--run-id"]
    assert main([*argv, "n1"]) == 0  # the damaged night itself: its max_abs is missing
    assert main([*argv, "n2"]) == 1  # median_abs grew 4x: still judged
    said = capsys.readouterr().out
    assert "error grew: y.median_abs" in said and "y.max_abs" not in said
    assert "| `p` | pass |" in (out / "summary.md").read_text()
    db = open_history(history)
    try:
        assert [p["outputs"]["y"]["max_abs"] for p in db.trend("p")] == [None, 8.0]
    finally:
        db.close()


@pytest.mark.parametrize("command", ["nightly", "summary"])
@pytest.mark.parametrize("margin", ["nan", "inf", "-inf", "-1"])
def test_a_margin_that_is_not_finite_or_is_negative_is_exit_2(tmp_path, command, margin, capsys):
    """`--margin nan` was taken, and no error grows past NaN: every growth was off."""
    history = tmp_path / "h.sqlite"
    extra = ["--run-id", "1"] if command == "summary" else ["--policies", str(tmp_path)]
    argv = [command, *extra, "--history", str(history), "--out", str(tmp_path / "o")]
    assert main([*argv, f"--margin={margin}"]) == 2
    assert "--margin" in capsys.readouterr().err and not history.exists()


def test_summary_of_a_history_that_is_not_there_is_exit_2_and_creates_nothing(tmp_path, capsys):
    """A mistyped `--history` left an empty 36 KB history behind, and said "no shard"."""
    typo = tmp_path / "typo" / "h.sqlite"
    argv = ["summary", "--history", str(typo), "--run-id", "1", "--out", str(tmp_path / "s")]
    assert main(argv) == 2
    assert f"history not found: {typo}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    uri = ["summary", "--history", f"sqlite:///{typo}", "--run-id", "1"]
    assert main([*uri, "--out", str(tmp_path / "s")]) == 2 and list(tmp_path.iterdir()) == []


@pytest.fixture
def full_disk(tmp_path) -> Iterator[Path]:
    """A folder on a real 1 MiB tmpfs with no space left (mounting needs root)."""
    folder = tmp_path / "full"
    folder.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        pytest.skip("no tmpfs can be mounted here")
    try:
        with open(folder / "filler", "wb") as f, pytest.raises(OSError, match="No space"):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_out_disk_still_records_the_night_in_the_history(tmp_path, full_disk):
    """The history (another disk) lost the whole night, and the ERROR lines were never
    printed, when `OUT` was full: it is recorded first, then the out fault is exit 2."""
    policies, history = tmp_path / "policies", tmp_path / "h.sqlite"
    policies.mkdir()
    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    (policies / "m.onnx").write_bytes(m.SerializeToString())
    (policies / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    out = full_disk / "night"
    argv = ["nightly", "--policies", str(policies), "--out", str(out), "--history", str(history)]
    done = subprocess.run([TRTBUILD, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("trtbuild: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(out) in errors[0] and "no space left on the device" in errors[0]
    assert "the night is recorded in the history (run 1)" in errors[0]
    assert "free space on the disk that holds" in errors[0]
    assert "ERROR p: " in done.stdout and "ATTENTION: p" in done.stdout, done.stdout
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT policy, status, exit_code FROM results").fetchall()
    assert rows == [("p", "error", 2)]


def test_an_out_folder_that_refuses_new_files_still_records_the_night(tmp_path, capsys):
    """`/proc` answers a new file with "no such file": the night is recorded, then exit 2
    naming the out folder (it was exit 70 from the first write)."""
    policies, history = tmp_path / "policies", tmp_path / "h.sqlite"
    policies.mkdir()
    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    (policies / "m.onnx").write_bytes(m.SerializeToString())
    (policies / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    assert _nightly(policies, Path("/proc/trtbuild-night"), history) == 2
    err = capsys.readouterr().err
    assert "/proc/trtbuild-night/nightly.json: the folder refuses new files there" in err, err
    assert "the night is recorded in the history (run 1)" in err
    with sqlite3.connect(history) as db:
        assert db.execute("SELECT policy, status, exit_code FROM results").fetchall() == [
            ("p", "error", 2)
        ]


def test_a_symlink_planted_as_the_trends_folder_is_not_written_through(
    tmp_path, models_dir, capsys
):
    """`OUT/trends -> elsewhere`: the night's plots were written where it pointed,
    overwriting a file there. Nothing goes through it: exit 2 naming it, the rest written."""
    policies, out, history = tmp_path / "policies", tmp_path / "out", tmp_path / "h.sqlite"
    _loop_policy(policies, models_dir)
    assert _nightly(policies, out, history) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "loop_sum.png").write_bytes(b"mine")
    for plot in (out / "trends").iterdir():
        plot.unlink()
    (out / "trends").rmdir()
    (out / "trends").symlink_to(elsewhere)
    capsys.readouterr()
    assert _nightly(policies, out, history) == 2
    err = capsys.readouterr().err
    assert f"{out / 'trends'}: a symlink where the night's trend plots go" in err, err
    assert (elsewhere / "loop_sum.png").read_bytes() == b"mine"
    assert (out / "summary.md").exists() and (out / "junit.xml").exists()


def test_summary_refuses_a_folder_of_the_users_as_the_nightly_does(tmp_path, capsys):
    """`summary --out` wrote summary.md, junit.xml and nightly.json over the user's own
    files, where `nightly --out` refuses such a folder; its own folder it takes again."""
    history = tmp_path / "h.sqlite"
    _record(history, "n1", [_result("p", "pass", 1.0)], "2026-01-01T00:00:00+00:00")
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "summary.md").write_text("my notes\n")
    argv = ["summary", "--history", str(history), "--run-id", "n1", "--out"]
    assert main([*argv, str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"trtbuild: error: {mine}: the output folder" in err and "Traceback" not in err
    assert (mine / "summary.md").read_text() == "my notes\n"
    assert sorted(p.name for p in mine.iterdir()) == ["summary.md"]
    out = tmp_path / "s"
    assert main([*argv, str(out)]) == 0
    assert main([*argv, str(out)]) == 0  # its own folder, marked
    assert (out / ".trtbuild-output").is_file() and (out / "summary.md").is_file()


def test_a_history_whose_folder_cannot_be_made_is_exit_2_and_keeps_the_night(
    tmp_path, models_dir, capsys
):
    """A file where the history's folder goes (`--history model.onnx/h.sqlite`, a typo):
    making the folder raised FileExistsError, a traceback and exit 70 after the night ran."""
    policies = tmp_path / "policies"
    _loop_policy(policies, models_dir)
    (tmp_path / "taken").write_text("a file, not a folder")
    assert _nightly(policies, tmp_path / "out", tmp_path / "taken" / "h.sqlite") == 2
    err = capsys.readouterr().err
    assert "cannot create the history's folder: File exists" in err and "Traceback" not in err
    assert "tonight's results are kept in" in err and (tmp_path / "out" / "nightly.json").exists()


def test_two_files_of_one_policy_name_are_exit_2_before_the_night(tmp_path, models_dir, capsys):
    """`x.yaml` and `x.yml` are both policy `x`: both ran into `OUT/x/` (one report over the
    other), then the history's unique key refused the night, exit 2 saying the history
    could not be used."""
    policies = tmp_path / "policies"
    first = _loop_policy(policies, models_dir)
    (policies / "loop_sum.yml").write_text(first.read_text())
    history, out = tmp_path / "h.sqlite", tmp_path / "out"
    assert _nightly(policies, out, history) == 2
    err = capsys.readouterr().err
    assert "loop_sum.yaml and loop_sum.yml are both policy 'loop_sum'" in err
    assert "rename one of them" in err and "history" not in err
    assert not out.exists() and not history.exists()  # nothing run, nothing recorded


def test_a_policy_named_as_the_nights_own_trends_folder_is_exit_2(tmp_path, models_dir, capsys):
    """`trends.yaml` was built into `OUT/trends/`, the folder of every policy's trend plot:
    the plots went into its build folder and its own plot was missing after the first night."""
    policies = tmp_path / "policies"
    _loop_policy(policies, models_dir, name="trends.yaml")
    out = tmp_path / "out"
    assert _nightly(policies, out, tmp_path / "h.sqlite") == 2
    err = capsys.readouterr().err
    assert "policy 'trends' would be written into OUT/trends" in err and "rename" in err
    assert not out.exists()


@pytest.mark.parametrize("table", ["outputs", "results", "runs"])
def test_a_history_missing_one_of_its_tables_is_exit_2_naming_it(
    tmp_path, models_dir, table, capsys
):
    """`outputs` dropped: summary and nightly made it again, empty, without a word (every
    night then measured nothing: no error grew, the trends went blank)."""
    history = tmp_path / "h.sqlite"
    _record(history, "n1", [_result("p", "pass", 1.0)], "2026-01-01T00:00:00+00:00")
    with sqlite3.connect(history) as db:
        db.execute(f"DROP TABLE {table}")
    argv = ["summary", "--history", str(history), "--run-id", "n1", "--out", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{history}: " in err and f"has no table '{table}'" in err
    assert "Traceback" not in err
    policies = tmp_path / "policies"
    _loop_policy(policies, models_dir)
    assert _nightly(policies, tmp_path / "out", history) == 2
    assert "tonight's results are kept in" in capsys.readouterr().err
    with sqlite3.connect(history) as db:  # nothing made again behind the user's back
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert table not in names


@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE outputs RENAME COLUMN passed TO ok",
        "ALTER TABLE outputs RENAME TO metrics",
    ],
)
def test_a_newer_trtbuilds_history_says_so_before_its_tables_are_judged(tmp_path, change, capsys):
    """A history of schema 4 whose outputs a newer trtbuild changed was 'a table of another
    schema' or 'a damaged history' (restore it from a backup): the fix is to upgrade."""
    history = tmp_path / "h.sqlite"
    _record(history, "n1", [_result("p", "pass", 1.0)], "2026-01-01T00:00:00+00:00")
    with sqlite3.connect(history) as db:
        db.execute("UPDATE trtbuild_meta SET value = '4' WHERE key = 'schema'")
        db.execute(change)
    argv = ["summary", "--history", str(history), "--run-id", "n1", "--out", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "has schema 4, written by a newer trtbuild" in err and "upgrade trtbuild" in err
    assert "another schema" not in err and "no table" not in err


def test_a_night_the_history_refused_replaces_the_last_nights_summary(tmp_path, models_dir, capsys):
    """The history unusable (exit 2) after a failing night: OUT's summary.md and junit.xml
    were the last recorded night's (`ALL PASS`, `failures="0"`) beside tonight's
    nightly.json, and the failure was on no line of the terminal."""
    policies, out, history = tmp_path / "policies", tmp_path / "out", tmp_path / "h.sqlite"
    path = _loop_policy(policies, models_dir)
    assert _nightly(policies, out, history) == 0
    assert "ALL PASS" in (out / "summary.md").read_text().splitlines()[0]
    with sqlite3.connect(history) as db:
        db.execute("UPDATE trtbuild_meta SET value = 'abc' WHERE key = 'schema'")
    text = path.read_text()  # the running sum's pin lost: it overflows FP16
    path.write_text(text[: text.index("  rules:")] + "  rules: []\n" + text[text.index("build:") :])
    capsys.readouterr()
    assert _nightly(policies, out, history) == 2
    said = capsys.readouterr()
    assert "FAIL loop_sum: outputs below tolerance" in said.out
    assert "not a number" in said.err and "tonight's results are kept in" in said.err
    first = (out / "summary.md").read_text().splitlines()[0]
    assert "ATTENTION: loop_sum" in first and "NOT RECORDED" in first
    assert 'failures="1"' in (out / "junit.xml").read_text()
    assert "NOT RECORDED" in (out / "summary.html").read_text()


def test_a_reader_of_stdout_that_leaves_does_not_cut_the_night(tmp_path, models_dir):
    """`trtbuild nightly ... | grep -q FAIL` (or `| head -1`): the reader left after the first
    policy's line, and the next line's BrokenPipeError ended the night there: the later
    policies never ran, nothing was recorded, exit 141. Now the night runs to its end and is
    recorded; its exit is the night's, or 141 where it passed."""
    policies, out, history = tmp_path / "policies", tmp_path / "out", tmp_path / "h.sqlite"
    for name in ("a.yaml", "b.yaml", "c.yaml"):
        _loop_policy(policies, models_dir, name)
    cmd = [sys.executable, "-m", "trtbuild", "nightly", "--policies", str(policies)]
    cmd += ["--out", str(out)]
    cmd += ["--history", str(history), "--backend", "none", "--no-cache"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"  a: pass\n"
    proc.stdout.close()  # the reader leaves
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 141, err
    assert "Traceback" not in err
    with sqlite3.connect(history) as db:
        rows = db.execute("SELECT policy, status FROM results ORDER BY policy").fetchall()
    assert rows == [("a", "pass"), ("b", "pass"), ("c", "pass")]
    assert "ALL PASS" in (out / "summary.md").read_text().splitlines()[0]


def test_a_policy_name_that_does_not_print_is_escaped_on_the_terminal(tmp_path, models_dir, capsys):
    """`a<ESC>[31m.yaml` and a name holding a newline: the night's lines printed them raw (the
    terminal recoloured; `x<LF>all 9 results pass` forged a verdict line of its own)."""
    policies = tmp_path / "policies"
    _loop_policy(policies, models_dir, "a\x1b[31m.yaml")
    _loop_policy(policies, models_dir, "x\nall 9 results pass.yaml")
    (policies / "z\x1b.yaml").write_text("version: 1\nmodel: [oops\n")
    assert _nightly(policies, tmp_path / "out", tmp_path / "h.sqlite") == 1
    said = capsys.readouterr().out
    assert "\x1b" not in said and "\nall 9 results pass" not in said
    assert "  a\\x1b[31m: pass" in said and "  x\\nall 9 results pass: pass" in said
    assert "ERROR z\\x1b: " in said
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "\x1b" not in summary and "| `x\\nall 9 results pass` | pass |" in summary


def test_a_history_fault_once_the_night_is_recorded_says_it_is_recorded(
    tmp_path, models_dir, capsys, monkeypatch
):
    """The history took the night, then failed while its trends were read (a PostgreSQL
    server restarting, SQLite's lock held past its wait): OUT's summary said NOT RECORDED
    and the error that tonight's results were kept in nightly.json alone, of a night that
    is in the history. (The fault is made by the history's own reader: no server here
    restarts on cue.)"""
    from trtbuild.nightly import history as history_mod

    policies, out, history = tmp_path / "policies", tmp_path / "out", tmp_path / "h.sqlite"
    _loop_policy(policies, models_dir)

    def lost(self, *args, **kwargs):
        raise history_mod._unusable(self.where, sqlite3.OperationalError("database is locked"))

    monkeypatch.setattr(history_mod.History, "trend", lost)
    assert _nightly(policies, out, history) == 2
    err = capsys.readouterr().err
    assert "the night is recorded in the history (run 1), not judged" in err, err
    first = (out / "summary.md").read_text().splitlines()[0]
    assert "RECORDED (run 1), NOT JUDGED" in first and "NOT RECORDED" not in first, first
    with sqlite3.connect(history) as db:
        assert db.execute("SELECT policy, status FROM results").fetchall() == [("loop_sum", "pass")]


def test_stdout_on_a_full_disk_does_not_cut_the_night(tmp_path, models_dir):
    """A CI log on a full volume: the first policy's line raised ENOSPC and ended the night
    there (exit 2), the later policies never run and nothing recorded. The night goes on
    without its lines, says so once on stderr, and is recorded; the exit says stdout was
    lost (141), as for a reader that left."""
    policies, out, history = tmp_path / "policies", tmp_path / "out", tmp_path / "h.sqlite"
    for name in ("a.yaml", "b.yaml"):
        _loop_policy(policies, models_dir, name)
    cmd = [sys.executable, "-m", "trtbuild", "nightly", "--policies", str(policies)]
    cmd += ["--out", str(out), "--history", str(history), "--backend", "none", "--no-cache"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        done = subprocess.run(cmd, env=env, stdout=full, stderr=subprocess.PIPE, timeout=600)
    err = done.stderr.decode()
    assert done.returncode == 141, err
    assert "Traceback" not in err and err.count("the night goes on without its lines") == 1, err
    with sqlite3.connect(history) as db:
        assert sorted(db.execute("SELECT policy FROM results").fetchall()) == [("a",), ("b",)]
