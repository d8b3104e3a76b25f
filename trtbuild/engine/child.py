"""TensorRT's engine build in a child process, and what to say when the child dies.

Why a child: TensorRT's builder can crash on a valid model (TensorRT-RTX 1.7 dies with
SIGSEGV building an ONNX `Attention` whose query, key and value are one tensor, a model
onnx.checker and ONNX Runtime accept). In trtbuild's own process that ended the command
with no message, no exit code of the contract and nothing written; in a child it is
exit 3 naming the crash (or exit 2 where the machine killed it: out of memory).

The child runs the same interpreter with the parent's import folders (`python -I`, so
nothing in the working folder or the environment changes what it imports) and the
parent's environment (TensorRT reads CUDA's variables). It reads its one job from its
stdin, writes everything a library prints to stderr, and its one answer to its stdout:
both pipes are the parent's own, so what they carry is never read from disk.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtbuild.children import KILLED, signal_name
from trtbuild.errors import BackendError, TrtbuildError, UsageError
from trtbuild.policy.specs import BuildSpec, InputSpec

# The child: the parent's import folders, death with its parent (Linux), then `serve`.
CHILD = """\
import ctypes, os, signal, sys
sys.path[:] = [p for p in sys.argv[1].split(os.pathsep) if p] or sys.path  # the parent's
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
from trtbuild.engine.child import serve
serve()
"""


def build_engine(
    onnx_path: Path, backend: str, spec: BuildSpec, inputs: tuple[InputSpec, ...] = ()
) -> Any:
    """Parse a strongly typed ONNX model and build a serialized engine in a child process
    (`backends.build_here` there): its `EngineBuild`, or its error raised here.

    Ctrl-C (SIGINT to trtbuild, or to its process group) is passed to the child, which
    cancels its build; KeyboardInterrupt is raised here once it has ended.

    Raises:
        BackendError: TensorRT refused the model, or crashed on it (exit 3).
        UsageError: the machine killed the build (out of memory, say: exit 2).
    """
    job = pickle.dumps((str(onnx_path), backend, spec, inputs))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", CHILD, _import_path()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    with _passed_on(proc) as interrupted:
        threading.Thread(target=_feed, args=(proc.stdin, job), daemon=True).start()
        answer = proc.stdout.read() if proc.stdout is not None else b""
        code = proc.wait()
    if interrupted.is_set():
        raise KeyboardInterrupt
    return _answered(answer, code, backend, onnx_path)


def _answered(answer: bytes, code: int, backend: str, onnx_path: Path) -> Any:
    """The child's answer as a value or a raised error; a child that died without one
    named by its signal or exit code."""
    if answer:
        kind, *said = pickle.loads(answer)  # the answer of the child this process started
        if kind == "ok":
            return said[0]
        if kind == "error":  # trtbuild's own, by its exit code: 3 TensorRT's, 2 the user's
            code, message, where, hint = said
            raise (BackendError if code == BackendError.exit_code else UsageError)(
                message, where=where, hint=hint
            )
        if kind == "interrupted":
            raise KeyboardInterrupt
        raise RuntimeError(f"the engine build's child failed:\n{said[0]}")
    why = signal_name(-code) if code < 0 else f"exit code {code}"
    if code < 0 and -code in KILLED:
        raise UsageError(
            f"the {backend} engine build of {onnx_path.name} was killed ({why})",
            hint="another process or the machine ended it; where it was the out-of-memory "
            "killer, free memory or build on a machine with more",
        )
    raise BackendError(
        f"{backend} crashed building the engine of {onnx_path.name} ({why})",
        hint="a fault of TensorRT's own on a model ONNX Runtime runs: try another TensorRT "
        "version or backend, or report it to NVIDIA with the model; `build.backend: none` "
        "writes the mixed model and the accuracy report without an engine",
    )


@contextlib.contextmanager
def _passed_on(proc: subprocess.Popen) -> Iterator[threading.Event]:
    """SIGINT, while the child builds, set a flag and passed to the child (which cancels
    its build and answers); the interrupt is the caller's to raise once it has ended."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def passed(*_: Any) -> None:
        flag.set()
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, passed)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
        if proc.poll() is None:  # the parent's own error: the child must not outlive it
            proc.kill()
            proc.wait()


def _feed(pipe: Any, job: bytes) -> None:
    """Write the job to the child's stdin; a child that died meanwhile reads nothing."""
    with contextlib.suppress(OSError, ValueError), pipe:
        pipe.write(job)


def _import_path() -> str:
    """The parent's absolute import folders: the child imports this trtbuild and this
    TensorRT, as the parent would have."""
    return os.pathsep.join(p for p in sys.path if os.path.isabs(p))


def serve() -> None:
    """In the child: read the job, build, answer on stdout; what libraries print goes to
    stderr so that stdout carries the answer alone."""
    from trtbuild.engine.backends import build_here

    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    onnx_path, backend, spec, inputs = pickle.load(sys.stdin.buffer)  # from its parent
    try:
        answer: tuple = ("ok", build_here(Path(onnx_path), backend, spec, inputs))
    except TrtbuildError as exc:
        answer = ("error", exc.exit_code, exc.message, exc.where, exc.hint)
    except KeyboardInterrupt:
        answer = ("interrupted",)
    except BaseException:  # a bug: its traceback goes to the parent, which raises it
        answer = ("bug", traceback.format_exc())
    out.write(pickle.dumps(answer))
    out.flush()
    sys.stderr.flush()
    os._exit(0)  # not the interpreter's finalization with TensorRT loaded
