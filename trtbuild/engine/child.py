"""TensorRT's engine build in a child process, and what to say when the child dies.

Why a child: TensorRT's builder can crash on a valid model (TensorRT-RTX 1.7 dies with
SIGSEGV building an ONNX `Attention` whose query, key and value are one tensor, a model
onnx.checker and ONNX Runtime accept). In trtbuild's own process that ended the command
with no message, no exit code of the contract and nothing written; in a child it is
exit 3 naming the crash and the last errors TensorRT logged (exit 2 where the machine
killed it: out of memory).

The child runs the same interpreter (`python -I`: no PYTHONPATH, user site or working
folder of its own) on the parent's absolute import folders, this trtbuild's first, with
the parent's environment (TensorRT reads CUDA's variables). It reads its one job from its
stdin and writes its one answer to its stdout, both pipes of the parent's own (what they
carry is never read from disk); what libraries print goes to stderr, which the parent
passes on, keeping TensorRT's errors (`LOGGED` lines) for a crash's message.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import trtbuild
from trtbuild.children import KILLED, feed, import_path, signal_name
from trtbuild.errors import BackendError, TrtbuildError, UsageError, surroundings_error
from trtbuild.graph.shape_inputs import ShapeValues
from trtbuild.policy.specs import BuildSpec, InputSpec

LOGGED = "@trtbuild-logged@"  # a TensorRT error the child logged: JSON [severity, message]
INTERRUPTED = 130  # the child's exit code for a Ctrl-C before its build began
# The child: a Ctrl-C before the build is a quiet exit, the parent's import folders (argv 1),
# death with its parent (Linux; argv 2 is the parent's pid, gone already: exit), then `serve`.
CHILD = """\
import os, signal, sys
signal.signal(signal.SIGINT, lambda *_: os._exit(130))  # until the build's own handler
sys.path[:] = [p for p in sys.argv[1].split(os.pathsep) if p] or sys.path  # the parent's
if sys.platform.startswith("linux"):
    import ctypes
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
if os.getppid() != int(sys.argv[2]):  # the parent died before the death signal was set
    os._exit(1)
from trtbuild.engine.child import serve
serve()
"""
ERROR_LINES = 3  # TensorRT errors said with a crash, the last ones
# Seconds a builder has to cancel after Ctrl-C before it is killed: TensorRT-RTX deadlocks
# where it cannot start a thread (a small pids limit), and then no interrupt ended it
GRACE = 10.0


def build_engine(
    onnx_path: Path,
    backend: str,
    spec: BuildSpec,
    inputs: tuple[InputSpec, ...] = (),
    shape_values: tuple[ShapeValues, ...] = (),
) -> Any:
    """Parse a strongly typed ONNX model and build a serialized engine in a child process
    (`build_engines` of one model)."""
    return build_engines([onnx_path], backend, spec, inputs, shape_values=shape_values)[0]


def build_engines(
    onnx_paths: list[Path],
    backend: str,
    spec: BuildSpec,
    inputs: tuple[InputSpec, ...] = (),
    optional: int = 0,
    shape_values: tuple[ShapeValues, ...] = (),
) -> list[Any]:
    """Each model's serialized engine, built one after another in one child process
    (`backends.build_here` there): their `EngineBuild`s, or the first error raised here.
    Why one child: its start (an interpreter, trtbuild's and TensorRT's imports) is about
    0.25 s, and `build` builds the policy's engine and its two variants. `shape_values`:
    those of the inputs that may be shape tensors, for the profile (`backends._add_profile`).

    The last `optional` models (`build`'s variants, baselines beside the policy's engine)
    may fail: one TensorRT refuses (or crashes on) is its `BackendError` in the list, and
    the child goes on to the next (after a crash: each left is that error).

    Ctrl-C (SIGINT to trtbuild, or to its process group) is passed to the child, which
    cancels its build; KeyboardInterrupt is raised here once it has ended. The child never
    outlives this call.

    Raises:
        BackendError: TensorRT refused a model, or crashed on it (exit 3).
        UsageError: the machine killed the build (out of memory, say), or a file it needs
            is the surroundings' to fix (exit 2).
    """
    first = len(onnx_paths) - optional  # the first optional job
    job = (backend, spec, inputs, shape_values)
    jobs = b"".join(pickle.dumps((str(p), *job, k >= first)) for k, p in enumerate(onnx_paths))
    logged: collections.deque[str] = collections.deque(maxlen=ERROR_LINES)
    answers: list[tuple] = []
    with _passed_on() as (interrupted, started):
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", CHILD, _import_path(), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        with proc, _ended(proc):
            started.append(proc)
            threading.Thread(target=feed, args=(proc.stdin, jobs), daemon=True).start()
            drain = threading.Thread(target=_drain, args=(proc.stderr, logged), daemon=True)
            drain.start()
            for k, _ in enumerate(onnx_paths):  # each as it comes: one engine in memory
                answer = _read(proc.stdout)
                if answer is None:  # died (its exit code says how)
                    break
                answers.append(answer)
                if not _goes_on(answer, k >= first):  # as the child stops
                    break
                logged.clear()  # a crash after this answer says the next job's errors alone
            code = proc.wait()
            drain.join(timeout=5)
    if interrupted.is_set() or (not answers and code == INTERRUPTED):
        raise KeyboardInterrupt
    return _built(answers, code, backend, onnx_paths, first, list(logged))


def _goes_on(answer: tuple, optional: bool) -> bool:
    """Whether the child builds the next job after `answer`: after an engine, and after
    TensorRT's refusal of an optional one."""
    return answer[0] == "ok" or (
        optional and answer[0] == "error" and answer[1] == BackendError.exit_code
    )


def _built(
    answers: list[tuple], code: int, backend: str, paths: list[Path], first: int, logged: list[str]
) -> list[Any]:
    """Each job's engine, or an optional job's `BackendError`; an error of a required job
    (or of the machine's, or a bug) raised."""
    found: list[Any] = []
    for k, path in enumerate(paths):
        answer = answers[k] if k < len(answers) else None
        if answer is not None and answer[0] == "ok":
            found.append(answer[1])
            continue
        if k > len(answers):  # after a crash on the job before: never attempted
            crashed = paths[len(answers)].name
            found.append(BackendError(f"{path.name} not built: the build child crashed on {crashed}"))  # fmt: skip
            continue
        try:
            _answered(answer, code, backend, path, logged)
        except BackendError as exc:
            if k < first:
                raise
            found.append(exc)
    return found


def _answered(
    answer: tuple | None, code: int, backend: str, onnx_path: Path, logged: list[str] = ()
) -> NoReturn:
    """A job that did not build, raised: the child's failed answer, or a child that died
    without one named by its signal or exit code, with the last errors TensorRT logged."""
    if answer is not None:
        kind, *said = answer
        if kind == "error":  # trtbuild's own, by its exit code: 3 TensorRT's, 2 the user's
            exit_code, message, where, hint, field = said
            error = BackendError if exit_code == BackendError.exit_code else UsageError
            raise error(message, where=where, hint=hint, field=tuple(field))
        if kind == "interrupted":
            raise KeyboardInterrupt
        raise RuntimeError(f"the engine build's child failed:\n{said[0]}")
    if code > 0:  # no answer, no signal: the child itself failed (it could not start)
        raise RuntimeError(f"the engine build's child ended with exit code {code}, no answer")
    why = signal_name(-code)
    said = f"; TensorRT's last error(s): {' | '.join(logged)}" if logged else ""
    if -code in KILLED:
        raise UsageError(
            f"the {backend} engine build of {onnx_path.name} was killed ({why}){said}",
            hint="another process or the machine ended it; where it was the out-of-memory "
            "killer, free memory or build on a machine with more",
        )
    raise BackendError(
        f"{backend} crashed building the engine of {onnx_path.name} ({why}){said}",
        hint="a fault of TensorRT's own on a model ONNX Runtime runs: try another TensorRT "
        "version or backend, or report it to NVIDIA with the model; `build.backend: none` "
        "writes the mixed model and the accuracy report without an engine",
    )


@contextlib.contextmanager
def _passed_on() -> Iterator[tuple[threading.Event, list[subprocess.Popen]]]:
    """SIGINT, while a child builds, sets a flag and is passed to the child (which cancels
    its build and answers); the caller raises the interrupt once the child has ended.
    Installed before the child starts, so no Ctrl-C finds a child without it."""
    flag = threading.Event()
    started: list[subprocess.Popen] = []
    if threading.current_thread() is not threading.main_thread():
        yield flag, started  # only the main thread gets signals
        return

    def passed(*_: Any) -> None:
        first = not flag.is_set()
        flag.set()
        if started and os.name != "nt":  # Windows' console gives the child its own Ctrl-C
            with contextlib.suppress(OSError, ValueError):
                started[0].send_signal(signal.SIGINT)
        if started and first:  # a builder that cannot cancel (deadlocked) is killed
            timer = threading.Timer(GRACE, _kill, args=(started[0],))
            timer.daemon = True  # never what keeps this process alive
            try:
                timer.start()
            except RuntimeError:  # no thread to wait with (the pids limit it is for): now
                _kill(started[0])

    previous = signal.signal(signal.SIGINT, passed)
    try:
        yield flag, started
    finally:
        signal.signal(signal.SIGINT, previous)


def _kill(proc: subprocess.Popen) -> None:
    """The child killed where it has not ended (Ctrl-C's grace over)."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()


@contextlib.contextmanager
def _ended(proc: subprocess.Popen) -> Iterator[None]:
    """The child killed and reaped where this process leaves the build by an error of its
    own (or an interrupt before the child could answer)."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _read(pipe: Any) -> tuple | None:
    """The child's answer, unpickled as it arrives; None where it wrote none, or died
    writing it (its exit code then says why)."""
    try:
        return pickle.load(pipe)  # the answer of the child this process started
    except (EOFError, pickle.UnpicklingError, ValueError, AttributeError, ImportError):
        return None


def _drain(pipe: Any, logged: collections.deque[str]) -> None:
    """The child's stderr passed on as it comes, less TensorRT's errors (`LOGGED` lines),
    which are kept: the last of them are a crash's message."""
    for raw in pipe:
        line = raw.decode(errors="replace")
        if line.startswith(LOGGED):
            with contextlib.suppress(ValueError, TypeError):
                severity, message = json.loads(line[len(LOGGED) :])
                logged.append(f"{severity}: {message}")
            continue
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no stderr: dropped
            sys.stderr.write(line)
            sys.stderr.flush()


def _import_path() -> str:
    """This trtbuild's folder, then the import folders every child gets (`import_path`):
    the child imports this trtbuild (not another one installed) and the TensorRT the
    parent would."""
    return os.pathsep.join([str(Path(trtbuild.__file__).resolve().parents[1]), import_path()])


def serve() -> None:
    """In the child: each job in turn, built and answered on stdout, until its stdin ends
    or a job fails; what libraries print goes to stderr so that stdout carries the answers
    alone."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    while True:
        try:
            job = pickle.load(sys.stdin.buffer)  # a job of its parent
        except EOFError:
            break
        answer = _answer(job[:5])
        out.write(pickle.dumps(answer))
        out.flush()
        if not _goes_on(answer, job[5]):
            break
    sys.stderr.flush()
    os._exit(0)  # not the interpreter's finalization with TensorRT loaded


def _answer(job: tuple) -> tuple:
    """One job's answer: its engine, or its error as the parent raises it."""
    try:
        answer: tuple = ("ok", _build(job))
    except TrtbuildError as exc:
        answer = ("error", exc.exit_code, exc.message, exc.where, exc.hint, exc.field)
    except KeyboardInterrupt:
        answer = ("interrupted",)
    except BaseException as exc:  # the surroundings' (a full disk), else a bug: its traceback
        found = surroundings_error(exc)
        answer = (
            ("error", found.exit_code, found.message, found.where, found.hint, found.field)
            if found is not None
            else ("bug", traceback.format_exc())
        )
    return answer


def _build(job: tuple) -> Any:
    """`backends.build_here` on the job, TensorRT's errors also written to stderr as they
    are logged (`LOGGED`), where the parent keeps them should this process crash."""
    from trtbuild.engine.backends import build_here

    def echo(severity: str, message: str) -> None:
        sys.stderr.write(LOGGED + json.dumps([severity, message]) + "\n")
        sys.stderr.flush()

    onnx_path, backend, spec, inputs, shape_values = job
    return build_here(Path(onnx_path), backend, spec, inputs, echo=echo, shape_values=shape_values)
