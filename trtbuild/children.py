"""What trtbuild's child processes share: how a death by a signal is named and whose it is.

Why children at all: the libraries trtbuild drives can crash on a valid model (ONNX
Runtime's optimisers, TensorRT's builder, with SIGSEGV); in a child that is an outcome
to report, not the end of trtbuild.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trtbuild.errors import Terminated, UsageError, raise_if_stopped, stop_raised

T = TypeVar("T")

# Deaths by these signals are the machine's (the OOM killer's SIGKILL, a kill by another
# process), not a crash of the library's own code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE).
KILLED = tuple(
    getattr(signal, n) for n in ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n)
)


BROKEN_GRACE = 5.0  # seconds a broken pool's workers are given to be reaped (`worker_killed`)


def signal_name(number: int) -> str:
    """`SIGSEGV`, or `signal 35` for one Python has no name for (a real-time signal)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def import_path() -> str:
    """Where the child imports from: the parent's own absolute import folders, less the
    working folder (`python -m` puts it first; an `onnxruntime.py` planted there is what
    `-I` keeps out). Why not `-I`'s own path alone: it drops the user site and
    PYTHONPATH, and an ONNX Runtime installed there is the one the parent runs."""
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:  # the working folder was removed
        here = ""
    kept = [p for p in sys.path if os.path.isabs(p) and os.path.realpath(p) != here]
    return os.pathsep.join(kept)


def feed(pipe: Any, *parts: bytes) -> None:
    """Write a job into a child's stdin and close it (in a thread: a pipe holds 64 KiB, a
    model far more); a child that died meanwhile reads nothing."""
    with contextlib.suppress(OSError, ValueError), pipe:  # BrokenPipe, or closed by a kill
        for data in parts:
            pipe.write(data)


# In a pool's worker: whether a task runs now (`run_task`), read by its signal handler
_BUSY = [False]


def worker_signals() -> None:
    """A pool worker's initializer: Ctrl-C and SIGTERM end it as they end the command.

    Why its own handlers (not the parent's, inherited by fork alone): a worker between
    tasks ends at once (an idle one printed `Terminated`'s traceback from its queue); one
    running a task raises once, in that task, so its staging is removed, then ignores
    the signals that follow (a terminal's Ctrl-C reaches it, then the parent's SIGTERM:
    the second cut its cleanup short, leaving staging folders in the night's `OUT`).
    """
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, _stop_worker)


def _stop_worker(number: int, _frame: Any) -> None:
    if kept(number):  # raised again once the staging folder is made or removed whole
        return

    for other in (signal.SIGINT, signal.SIGTERM):
        # one stop: the cleanup runs whole. A handler that does nothing, not SIG_IGN: a
        # signal already caught when SIG_IGN is set is raised as "Signal 15 ignored due to
        # race condition" (an OSError, with its traceback)
        signal.signal(other, _heard)
    if not _BUSY[0]:
        os._exit(128 + number)
    raise stop_raised(number)  # recorded: where a library swallows it, `run_task` still ends


def kept(number: int) -> bool:
    """Whether `fsutil.stops_held` keeps this stop for the end of its block. Read from the
    loaded module, imported by nothing here: a handler runs between any two lines."""
    fsutil = sys.modules.get("trtbuild.fsutil")
    return fsutil is not None and fsutil.stop_kept(number)


def _heard(*_: Any) -> None:
    """A signal after the one that stops a worker: nothing more to do."""


def run_task(task: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`task(*args, **kwargs)` in a worker (`worker_signals`): an interrupt it was stopped
    by ends the worker once the task's cleanup has run, taking no other task (a pool
    queues the next one to it ahead, and it ran that one to its end)."""
    _BUSY[0] = True
    try:
        result = task(*args, **kwargs)
        raise_if_stopped()  # a stop the task swallowed: its result is not handed back
        return result
    except KeyboardInterrupt as exc:
        os._exit(143 if isinstance(exc, Terminated) else 130)
    finally:
        _BUSY[0] = False


def stop_workers(pool: Any) -> None:
    """Every worker of a `concurrent.futures.ProcessPoolExecutor` sent SIGTERM, nothing more
    started. Why: leaving its `with` waits for the tasks in flight, and on SIGTERM the
    workers were left running for good (a nightly's publishing after the night)."""
    stop = getattr(pool, "terminate_workers", None)  # Python 3.14
    if stop is not None:
        stop()
        return
    workers = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown drops it
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.terminate()


# what a process ended from outside is told, by `tune --jobs` and the nightly alike
KILLED_HINT = "where it was the out-of-memory killer, free memory or lower --jobs"


def ended_by(code: int | None) -> int | None:
    """The signal from outside (`KILLED`) that ended a child of exit `code`: `-s` as
    multiprocessing reports a signal, or `128 + s` as trtbuild's own stop handlers exit;
    None for a crash (SIGSEGV), a plain exit or a process still running."""
    if code is None:
        return None
    number = -code if code < 0 else code - 128 if code > 128 else None
    return number if number in KILLED else None


def worker_killed(pool: Any) -> UsageError | None:
    """Why a `ProcessPoolExecutor` broke, where a worker was ended from outside (the
    out-of-memory killer's SIGKILL, a kill by another process): the user's to fix, exit 2;
    None where a worker crashed (SIGSEGV) or nothing can be told. Read before the pool is
    shut down (its workers are forgotten then).

    Why: `tune --jobs` and the nightly's workers are processes, and one the OOM killer took
    broke the pool: BrokenProcessPool ended the command as a bug (exit 70)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    deadline = time.monotonic() + BROKEN_GRACE  # the pool ends the others as it breaks; an
    while any(w.exitcode is None for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)  # exit code reads None until the pool's thread has reaped it
    signals = [ended_by(w.exitcode) for w in workers if w.exitcode not in (None, 0)]
    if not signals or None in signals:  # a crash (SIGSEGV, exit 1) among them: a bug
        return None
    first = signal.SIGKILL if signal.SIGKILL in signals else signals[0]
    return UsageError(
        f"a worker process was killed ({signal_name(first)}): another process or the "
        "machine ended it",
        hint=KILLED_HINT,
    )
