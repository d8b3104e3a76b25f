"""A night's workers: one the machine kills is its policy's error, not the night's end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from tests.conftest import ROOT

POLICY = (ROOT / "policies" / "loop_sum.yaml").read_text()


def _children(pid: int) -> set[int]:
    """The direct children of `pid` (every thread's), without multiprocessing's helper."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
            found |= {int(c) for c in f.read().split()}
    return {c for c in found if b"resource_tracker" not in _cmdline(c)}


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_workers_the_machine_kills_are_their_policies_errors(tmp_path, models_dir):
    """Every worker of `--jobs 2` SIGKILLed (the out-of-memory killer's signal), as soon as
    it starts: the pool's BrokenProcessPool was the night's, exit 70 with a traceback,
    nothing in the history. Now each policy runs again alone, and dies again: its error,
    exit 2, named; the night is recorded and exits 1."""
    policies = tmp_path / "policies"
    policies.mkdir()
    slow = POLICY.replace("../models/", f"{models_dir}/").replace("samples: 4", "samples: 400")
    for name in ("a", "b"):
        (policies / f"{name}.yaml").write_text(slow)
    history, out = tmp_path / "h.sqlite", tmp_path / "out"
    cmd = [sys.executable, "-m", "trtbuild", "nightly", "--policies", str(policies)]
    cmd += ["--out", str(out), "--history", str(history), "--backend", "none", "--jobs", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed: set[int] = set()
    while proc.poll() is None:  # every worker this night starts, once it is seen
        for child in _children(proc.pid) - killed:
            os.kill(child, signal.SIGKILL)
            killed.add(child)
        time.sleep(0.02)
    said, err = (s.decode() for s in proc.communicate())
    assert "Traceback" not in err, err
    assert proc.returncode == 1, err
    assert len(killed) >= 3  # a worker of the pool, then one alone per policy
    for name in ("a", "b"):
        assert f"ERROR {name}: its process was killed (SIGKILL)" in said, said
    doc = json.loads((out / "nightly.json").read_text())
    assert [(r["policy"], r["status"], r["exit_code"]) for r in doc["results"]] == [
        ("a", "error", 2),
        ("b", "error", 2),
    ]
    with sqlite3.connect(history) as db:
        assert db.execute("SELECT policy, status FROM results").fetchall() == [
            ("a", "error"),
            ("b", "error"),
        ]
