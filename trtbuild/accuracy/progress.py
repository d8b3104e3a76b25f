"""Progress on stderr for runs over many samples, shown only once they take a while.

Why only after a delay: `make demo` and CI logs stay quiet for the usual four
samples, while 500 samples of a large model no longer look like a hang.
"""

from __future__ import annotations

import sys
import time

DELAY_SECONDS = 2.0


class SampleProgress:
    """`label: k/N samples` on stderr, once the run has taken `DELAY_SECONDS`."""

    def __init__(self, label: str, total: int, stream=None):
        self.label, self.total = label, total
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = False

    def tick(self, done: int) -> None:
        """Report `done` samples; silent for a total of 0 (progress switched off)."""
        if not self.total:
            return
        now = time.monotonic()
        if now - self.start < DELAY_SECONDS or (now - self.last < 1.0 and done < self.total):
            return
        self.last, self.shown = now, True
        tty = self.stream.isatty()
        text = f"{self.label}: {done}/{self.total} samples"
        self.stream.write(("\r" + text) if tty else (text + "\n"))
        self.stream.flush()

    def done(self) -> None:
        if self.shown and self.stream.isatty():
            self.stream.write("\n")
            self.stream.flush()
