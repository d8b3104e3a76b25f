"""A point with an empty input (a dim of 0) is run once in a child process first.

Why: a dim may be 0 (a decoder's first step reads an empty cache), and ONNX Runtime 1.32
dies with SIGSEGV on some ops fed an empty tensor (a ReduceMean and InstanceNormalization
of a [1, 3, 0, 8] map). The FP32 reference runs in trtbuild's own process, so that crash
ended trtbuild with no message; run first in a child, it is exit 2 naming the point and
the input. A point with no empty input is not run twice.

The child imports numpy and ONNX Runtime only (`python -I`, the parent's import folders
less the working folder), reads the model and the feed (an .npz, no pickle) from its
stdin, runs once with optimisations off, and exits; an error ONNX Runtime raises is the
reference run's to say, in this process, so only a death by a signal is an answer.
"""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import onnx

from trtbuild.children import KILLED, import_path, signal_name

CHILD = """\
import ctypes, io, os, signal, sys
sys.path[:] = [p for p in sys.argv[1].split(os.pathsep) if p] or sys.path  # the parent's
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
import numpy as np
import onnxruntime as ort
data = sys.stdin.buffer.read()
model, feed = data[: int(sys.argv[2])], np.load(io.BytesIO(data[int(sys.argv[2]) :]))
options = ort.SessionOptions()
options.log_severity_level = 4
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
try:
    ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(
        None, {k: feed[k] for k in feed.files}
    )
except Exception:
    pass
os._exit(0)
"""
SECONDS = 600.0  # a run longer than this is no crash of the kind this looks for


def has_empty(feed: dict[str, np.ndarray]) -> bool:
    """Whether some input of `feed` holds no elements (a dim of 0)."""
    return any(np.size(v) == 0 and np.ndim(v) > 0 for v in feed.values())


def crash(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> str | None:
    """The signal ONNX Runtime dies by running `model` on `feed` in a child (`SIGSEGV`);
    None where it does not die by one of its own (an error it raises, a kill from outside,
    or a run past `SECONDS`)."""
    data = model.SerializeToString()
    arrays = io.BytesIO()
    np.savez(arrays, **feed)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", CHILD, import_path(), str(len(data))],
            input=data + arrays.getvalue(),
            capture_output=True,
            timeout=SECONDS,
        )
    except subprocess.TimeoutExpired:
        return None
    code = done.returncode
    return signal_name(-code) if code < 0 and -code not in KILLED else None
