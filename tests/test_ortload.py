"""ONNX Runtime's import: its native lines caught, and descriptor 2 given back whatever runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

# The main thread's first call holds descriptor 2 on its file and starts importing; a second
# thread's first call comes then, and its own import waits for the first's to end.
_SECOND_CALL_DURING_THE_FIRST = textwrap.dedent(
    """
    import os, sys, threading
    from trtbuild.ortload import onnxruntime

    second_at_import, first_done = threading.Event(), threading.Event()
    second = threading.Thread(target=onnxruntime)

    def hook(event, args):
        if event != "import" or args[0] != "onnxruntime":
            return
        if threading.current_thread() is second:
            second_at_import.set()
            first_done.wait(30)
        elif not second.is_alive():
            second.start()
            second_at_import.wait(3)  # never, where the second waits for this import

    sys.addaudithook(hook)
    onnxruntime()
    first_done.set()
    second.join()
    os.write(2, b"stderr-after\\n")
    """
)


def test_two_first_imports_at_once_give_descriptor_2_back():
    """Two threads' first calls at once: the second saved descriptor 2 while the first had it
    on its file, gave that back last, and every later line on stderr went to a deleted file."""
    done = subprocess.run(
        [sys.executable, "-c", _SECOND_CALL_DURING_THE_FIRST],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "stderr-after" in done.stderr
