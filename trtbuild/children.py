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
from typing import Any

# Deaths by these signals are the machine's (the OOM killer's SIGKILL, a kill by another
# process), not a crash of the library's own code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE).
KILLED = tuple(
    getattr(signal, n) for n in ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n)
)


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
