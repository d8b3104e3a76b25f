"""A process-wide setting a call changes while it runs, shared by the threads that run one.

Why: a dependency's logger (Polygraphy's, onnx-graphsurgeon's, ONNX Runtime's default
one) and Python's warnings filters belong to the process, not to a thread. Each thread
saving them on entry and restoring them on exit interleaves where two threads run
trtbuild at once (two builds from one `Policy`, a judge's samples on a pool): the second
saves the first's quiet value, the first gives back the original while the second still
runs, then the second restores the quiet value, and it stays after every call has
returned (a filter ignoring every RuntimeWarning of the user's, Polygraphy's log
silenced, its indent grown). Here the first thread to need a setting makes it, and the
last to leave gives back what was there before the first came.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["Shared"]


class Shared:
    """One process-wide setting, held while any thread needs it.

    Args:
        make: sets the setting and returns what gives back the value it found.
    """

    def __init__(self, make: Callable[[], Callable[[], object]]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._holders = 0
        self._undo: Callable[[], object] | None = None
        if hasattr(os, "register_at_fork"):  # POSIX
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A new lock in a child made by fork (tune's workers), which has only the thread
        that forked: a lock another thread held at that instant is never released there.
        The holders' count stays: the setting is the parent's until the child ends."""
        self._lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        """The setting made for the `with` block; undone when the last holder leaves."""
        with self._lock:
            if self._holders == 0:
                self._undo = self._make()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                undo = self._undo if self._holders == 0 else None
                if undo is not None:
                    self._undo = None
                    undo()
