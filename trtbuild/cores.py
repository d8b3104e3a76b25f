"""The cores this process may use, and how many `tune` workers that makes by default.

Why a module of its own, importing nothing heavy: the command line's `--help` says
the default of `--jobs` (`DEFAULT_JOBS`), and `--help` must stay instant; the search,
the sessions' thread counts and the help read the same numbers here.
"""

from __future__ import annotations

import os

# Workers beyond four rarely pay: the search seldom knows more than a few candidates ahead.
MAX_DEFAULT_JOBS = 4
# The cores a worker is given by default. ONNX Runtime runs one candidate on all the
# cores a process may use (two run it in 0.65x the time one does, modnet at 1024²), so
# workers on the same cores wait on each other at every op: on 2 cores `--jobs 2` was
# slower than `--jobs 1` on modnet (96 vs 77 s) and PP-OCRv4 det (19.5 vs 18 s). Not
# confined to fewer cores: every judging process then runs ONNX Runtime alike, and a
# verdict is the same whichever process judged it.
CORES_PER_JOB = 2
# `default_jobs` in words, for the help and the library's docs
DEFAULT_JOBS = (
    f"one per {CORES_PER_JOB} cores this process may use, from 1 up to {MAX_DEFAULT_JOBS}"
)


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else the machine's; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """`--jobs` by default (`DEFAULT_JOBS`)."""
    return max(1, min(MAX_DEFAULT_JOBS, usable_cores() // CORES_PER_JOB))
