"""ONNX Runtime, imported where a stage first needs it, with its native stderr caught.

Why a module of its own, below every stage: at import ONNX Runtime logs from C++ straight
to file descriptor 2, in colour, past any Python setting (where HOME is not writable:
"Failed to persist telemetry device ID"); a terminal or CI log must show trtbuild's lines
only. Every place that imports it (the passes' folding, the judge's sessions, the
versions of an artifact) asks here, so a command that needs no session (`convert` or
`check` from the cache) never pays for the import, and a library user's first session is
as quiet as the CLI's. The lines it said are kept as debug records of the `trtbuild`
logger. An import that fails raises ImportError, as a plain import does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from types import ModuleType
from typing import IO

from trtbuild.errors import printable

# one thread at a time catches descriptor 2: two first calls at once (two builds on threads)
# each saved what they found, and the second found the first's file, gave it back last,
# and every later line on stderr went to that deleted file
_IMPORTING = [threading.Lock()]
if hasattr(os, "register_at_fork"):  # a child of fork has only the forking thread: a new lock
    os.register_at_fork(after_in_child=lambda: _IMPORTING.__setitem__(0, threading.Lock()))


def onnxruntime() -> ModuleType:
    """The `onnxruntime` module, imported once with file descriptor 2 caught."""
    if "onnxruntime" not in sys.modules:
        with _IMPORTING[0]:
            if "onnxruntime" not in sys.modules:
                _import_quietly()
    import onnxruntime

    return onnxruntime


def _import_quietly() -> None:
    """Import ONNX Runtime with fd 2 caught, and with Ctrl-C and SIGTERM held until it
    ends (`fsutil.stops_held`): a stop whose handler raised inside its native module's
    init crashed the interpreter (SIGSEGV) or made the import fail as 'import numpy failed'."""
    from trtbuild.fsutil import stops_held

    with stops_held():
        _import_caught()


def _scratch() -> IO[bytes] | None:
    """A file to catch descriptor 2 in: in memory where the system makes one (Linux's
    memfd), else a temporary file; None where neither can be had.

    Why not a temporary file alone: a container with a read-only root and no writable
    /tmp, TMPDIR or working folder has no temporary folder, and tempfile's FileNotFoundError
    ended every command that ran a session as a bug (exit 70); what is caught here is
    a few lines ONNX Runtime prints, which then reach the terminal instead."""
    import tempfile

    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no memfd here
        return open(os.memfd_create("trtbuild-stderr", os.MFD_CLOEXEC), "w+b")
    with contextlib.suppress(OSError):
        return tempfile.TemporaryFile()
    return None


def _import_caught() -> None:
    if sys.stderr is not None:  # none at all in a service's process (pythonw, `2>&-`)
        sys.stderr.flush()
    scratch = _scratch()
    try:
        saved = os.dup(2) if scratch is not None else None
    except OSError:  # descriptor 2 closed: nothing to catch
        saved = None
    if saved is None or scratch is None:
        if scratch is not None:
            scratch.close()
        import onnxruntime

        return
    with scratch as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            pass  # raised again by the caller's own import, with fd 2 given back
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        said = caught.read(1 << 16).decode(errors="replace")
    for line in said.splitlines():
        logging.getLogger("trtbuild").debug("onnxruntime: %s", printable(line))
