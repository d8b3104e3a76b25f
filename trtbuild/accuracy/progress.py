"""Progress on stderr: one status line, and sample counts shown once a run takes a while.

Why only after a delay: `make demo` and CI logs stay quiet for the usual four
samples, while 500 samples of a large model no longer look like a hang. Why one
`StatusLine` for every progress display (samples here, `tune`'s bar): a terminal
gets one line rewritten in place, a log gets one line per update, the same way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

DELAY_SECONDS = 2.0

# The library's `quiet=`: progress off for one call (and the threads it starts with this
# context), not for the process: another caller's progress is its own.
SILENT: ContextVar[bool] = ContextVar("trtbuild_progress_silent", default=False)


@contextmanager
def silenced(on: bool = True) -> Iterator[None]:
    """Every status line made inside the block writes nothing (where `on`)."""
    token = SILENT.set(on or SILENT.get())
    try:
        yield
    finally:
        SILENT.reset(token)


class StatusLine:
    """One line on a terminal, rewritten in place; a line per update anywhere else."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr  # looked up now, not at import
        self.width = 0  # the longest text so far: a shorter one must cover it
        # no stderr at all (`2>&-`, a service's process): nothing to show a status on
        self.silent = SILENT.get() or self.stream is None
        self.tty = not self.silent and self.stream.isatty()

    def write(self, text: str) -> None:
        if self.silent:
            return
        self.width = max(self.width, len(text))
        self.stream.write(("\r" + text.ljust(self.width)) if self.tty else (text + "\n"))
        self.stream.flush()

    def done(self) -> None:
        """End the rewritten line, if one was written."""
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


class SampleProgress:
    """`label: k/N samples` on stderr, once the run has taken `DELAY_SECONDS`; with several
    candidates judged one after another, `label: sample k/N of candidate c/C`.

    Why say the candidate: `build` judges its policy and the all-FP16 baseline on the same
    samples, one after the other; a count of both ("3/4 samples" for two samples) read as
    samples the policy does not have.
    """

    def __init__(self, label: str, total: int, stream: TextIO | None = None, candidates: int = 1):
        self.label, self.total, self.candidates = label, total, max(1, candidates)
        self.line = StatusLine(stream)
        self.start = time.monotonic()
        self.last = 0.0

    def tick(self, done: int) -> None:
        """Report `done` runs (the candidates' samples in turn); silent for a total of 0
        (progress switched off)."""
        if not self.total:
            return
        now = time.monotonic()
        if now - self.start < DELAY_SECONDS or (now - self.last < 1.0 and done < self.total):
            return
        self.last = now
        if self.candidates == 1:
            self.line.write(f"{self.label}: {done}/{self.total} samples")
            return
        per = self.total // self.candidates
        c, k = divmod(max(done, 1) - 1, per)
        self.line.write(
            f"{self.label}: sample {k + 1}/{per} of candidate {c + 1}/{self.candidates}"
        )

    def done(self) -> None:
        self.line.done()
