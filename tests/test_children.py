"""A pool worker's signals (`children.worker_signals`, `run_task`): a task stopped once, its
cleanup whole, the worker ended; an idle worker ended at once, without a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT

# A worker whose task is stopped by Ctrl-C, then, in its cleanup, by SIGTERM (a terminal's
# Ctrl-C reaches the whole group, then the parent stops its workers)
TASK = textwrap.dedent(
    """
    import os, signal, sys, time
    from trtbuild.children import run_task, worker_signals

    def task():
        try:
            print("started", flush=True)
            time.sleep(30)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the parent's, during the cleanup
            time.sleep(0.2)
            print("cleaned", flush=True)

    worker_signals()
    run_task(task)
    """
)


def _signalled(code: str, ready: bytes, sent: int) -> tuple[subprocess.Popen, bytes, bytes]:
    """`code` run in a process of its own, sent `sent` once it printed `ready`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline() == ready
    proc.send_signal(sent)
    out, err = proc.communicate(timeout=30)
    return proc, out, err


def test_a_task_stopped_twice_runs_its_cleanup_whole_and_ends_the_worker():
    proc, out, err = _signalled(TASK, b"started\n", signal.SIGINT)
    assert out == b"cleaned\n" and proc.returncode == 130, err.decode()
    assert b"Traceback" not in err


def test_an_idle_worker_ends_at_once_without_a_traceback():
    idle = "import time\nfrom trtbuild.children import worker_signals\nworker_signals()\n"
    idle += "print('idle', flush=True)\ntime.sleep(30)\n"
    proc, _, err = _signalled(idle, b"idle\n", signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM and err == b"", err.decode()


# A task holding stops (`fsutil.stops_held`) while another thread takes the process's
# signal: the worker's handler runs in the main thread, inside the block
HELD_TASK = textwrap.dedent(
    """
    import signal, sys, threading, time
    from trtbuild import fsutil
    from trtbuild.children import run_task, worker_signals

    def task():
        done = threading.Event()
        other = threading.Thread(target=done.wait)
        other.start()
        try:
            with fsutil.stops_held():
                signal.pthread_kill(other.ident, int(sys.argv[1]))
                for _ in range(200):  # the handler runs between these
                    time.sleep(0.001)
                print("whole", flush=True)
            print("not stopped", flush=True)
        finally:
            done.set()

    worker_signals()
    run_task(task)
    """
)


def test_a_stop_another_thread_takes_waits_for_the_held_block_of_a_task():
    for sent in (signal.SIGINT, signal.SIGTERM):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        code = [sys.executable, "-c", HELD_TASK, str(int(sent))]
        done = subprocess.run(code, capture_output=True, env=env, timeout=60)
        assert done.stdout == b"whole\n", done.stderr.decode()
        assert done.returncode == 128 + sent and b"Traceback" not in done.stderr


# A task whose stop a library swallows (a bare `except:` around an import: a nightly worker's
# SIGTERM raised inside numpy's imports was lost, and it published two policies after the
# night had ended), then, with PUBLISH, publishes a folder as `build` does
SWALLOWED = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from trtbuild.artifacts import staged_output
    from trtbuild.children import run_task, worker_signals

    def task(out):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
        except BaseException:
            pass
        print("ran on", flush=True)
        if PUBLISH:
            with staged_output(Path(out), ("report.json",)) as stage:
                (stage / "report.json").write_text("{}")
        return "result"

    worker_signals()
    print(run_task(task, sys.argv[1]), flush=True)
    """
)


def _swallowed(tmp_path, publish: bool) -> tuple[subprocess.CompletedProcess, bool]:
    out = tmp_path / "out"
    code = f"PUBLISH = {publish}\n" + SWALLOWED
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], capture_output=True, env=env, timeout=60
    )
    return done, out.exists()


def test_a_stop_a_library_swallowed_still_ends_the_task_and_its_worker(tmp_path):
    """The handler takes one stop and ignores the next (its cleanup runs whole), so a
    swallowed one was the worker's last: it ran on, and handed its result back."""
    done, _ = _swallowed(tmp_path, publish=False)
    assert done.stdout == b"ran on\n" and done.returncode == 143, done.stderr.decode()


def test_a_stop_a_library_swallowed_publishes_nothing(tmp_path):
    done, published = _swallowed(tmp_path, publish=True)
    assert done.returncode == 143 and not published, done.stderr.decode()
    assert list(tmp_path.iterdir()) == []  # no staging folder left either


def test_a_child_ended_from_outside_is_told_apart_from_a_crash_the_same_way_everywhere():
    """`tune --jobs` called a worker that exited 1 killed (exit 2) and the nightly called one
    its own stop handler ended at 143 (SIGTERM from outside) a bug (exit 70): one reading
    of an exit code now serves both (`ended_by`)."""
    import signal

    from trtbuild.children import ended_by
    from trtbuild.nightly.runner import _died

    assert ended_by(-signal.SIGKILL) == signal.SIGKILL
    assert ended_by(128 + signal.SIGTERM) == signal.SIGTERM  # trtbuild's own handler's exit
    assert ended_by(-signal.SIGSEGV) is None and ended_by(1) is None and ended_by(None) is None
    task = (Path("p.yaml"), None, None, None, None)
    term = _died(task, 128 + signal.SIGTERM)
    assert term.exit_code == 2 and "was killed (SIGTERM)" in term.message, term
    crash = _died(task, -signal.SIGSEGV)
    assert crash.exit_code == 70 and "ended (SIGSEGV)" in crash.message, crash
    assert _died(task, 1).exit_code == 70
