"""ONNX Runtime sessions created in a child process, and what to say when one fails.

Why a child: ONNX Runtime's graph optimisers can crash (SIGSEGV) on a valid
model; in a child that is an outcome to report, not the end of trtbuild. The
child imports nothing but ONNX Runtime, starts isolated (`python -I`, a minimal
environment), reads the model from a pipe (no temporary file to leave behind), dies
with its parent, and is waited for a bounded time (`default_timeout`).

Why children started ahead (`Spares`): a child's interpreter and `import onnxruntime`
take about 0.15 s, a neighbourhood's session a few ms. A child imports ONNX Runtime
first, then waits for its one job (`give`); started while the parent computes the
plan or waits for the previous load, it is ready when the next load is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import onnx
from onnx import helper

from trtbuild.children import KILLED, feed, import_path, signal_name
from trtbuild.graph import subgraphs
from trtbuild.graph.model_io import infer_shapes

RESULT = "@trtbuild-result@"  # the child's answer follows this on its own line
# The child: import ONNX Runtime, then wait for its one job on stdin (a JSON line: the
# model's source, "-" for the bytes that follow or a file's path, the optimisation level,
# verbose or not) and create one CPU session, saying why it failed. Why the import
# first: a child started ahead (`Spares`) has paid it when its job comes, so a load costs
# only the session's creation. It dies with its parent (Linux's PR_SET_PDEATHSIG), and
# its one answer is the line after RESULT (whatever else a library prints).
CHILD = """\
import ctypes, json, os, signal, sys
sys.path[:] = [p for p in sys.argv[1].split(os.pathsep) if p] or sys.path  # the parent's
if int(sys.argv[2]) and hasattr(os, "nice"):  # started long ahead: import on idle CPU
    os.nice(int(sys.argv[2]))
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
def end(code):  # not the interpreter's finalization with ONNX Runtime loaded (20-80 ms)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
def answer(kind, message):
    sys.stdout.write("\\n" + RESULT + json.dumps({"kind": kind, "message": message}) + "\\n")
    end(3)
try:
    import onnxruntime as ort
except ImportError as exc:  # the environment's fault, not the model's
    answer("ImportError", str(exc))
line = sys.stdin.buffer.readline()
if not line:  # closed without a job: a spare nobody needed
    end(4)
job = json.loads(line)
model = sys.stdin.buffer.read() if job["source"] == "-" else job["source"]
options = ort.SessionOptions()
options.log_severity_level = 0 if job["verbose"] else 3
options.intra_op_num_threads = 1
if job["level"] == "off":
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
try:
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
except Exception as exc:
    answer(type(exc).__name__, str(exc))
del session  # its teardown too is the load's
end(0)
""".replace("RESULT", repr(RESULT))
FAILED = 3  # the child's exit code for a session that raised
SPARE_NICE = 10  # how much lower a child started long ahead runs (`Spares.fill`; not on Windows)
PROBES = 16  # child sessions at most to find the node a crash needs
PROBE_SECONDS = 120.0  # and at most this long
# How long a session may take to create, by default: a minute, and a second more per
# 4 MiB of model (a 1 GiB model: 5 min). The policy's build.ort_check_timeout overrides it.
BASE_SECONDS = 60.0
BYTES_PER_SECOND = 4 << 20
# What the child's environment keeps: where programs and libraries are, the locale, the
# temporary folder and HOME (ONNX Runtime keeps its telemetry id under it, as it does in
# trtbuild's own process); nothing that changes what Python imports (PYTHONPATH and the
# like are ignored under -I anyway).
ENVIRONMENT = ("PATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "HOME")
ENVIRONMENT += ("SYSTEMROOT",)  # Windows: its DLLs


def default_timeout(size: int) -> float:
    """Seconds a session of a model of `size` bytes may take to create before the check
    gives up (`BASE_SECONDS` and one more per `BYTES_PER_SECOND`)."""
    return BASE_SECONDS + size / BYTES_PER_SECOND


class TimedOut(Exception):
    """The child did not answer within its time (stopped, swapping, or a very slow load)."""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    kind: str = ""  # ONNX Runtime's exception type, where it raised
    message: str = ""
    crash: str | None = None  # the signal (SIGSEGV) or exit code of a child that died
    killed: bool = False  # ended by a signal from outside (`KILLED`): the OOM killer's

    @property
    def no_kernel(self) -> bool:
        """ONNX Runtime has no CPU kernel for a type (BF16 ReduceMean): no fault of the model.

        Also where it says so as a type error of its own cast (`INSERTED_CAST`): an op with
        a kernel of FP32 only whose output the schema lets be FP16 (MelWeightMatrix's
        `output_datatype`) gets ONNX Runtime's casts around it, typed wrong by ONNX Runtime,
        and the valid mixed model was said invalid (exit 70)."""
        return self.kind == "NotImplemented" or INSERTED_CAST in self.message


# The name ONNX Runtime gives the casts it puts around a node it has no kernel of the
# model's type for (its InsertCastTransformer): a failure that names one is its own.
INSERTED_CAST = "InsertedPrecisionFreeCast"


def start(nice: int = 0) -> subprocess.Popen:
    """A child that imports ONNX Runtime and waits for its one job (`give`); `nice` lowers
    its priority (`SPARE_NICE`: a child started ahead of its job).

    Why so isolated: `python -I` (no PYTHONPATH, no user site, no script folder on
    sys.path, so an `onnxruntime.py` in the working folder is not what the check
    imports), a minimal environment (`ENVIRONMENT`), and the model on stdin: no
    temporary file that a kill of trtbuild would leave behind.
    """
    env = {k: os.environ[k] for k in ENVIRONMENT if k in os.environ}
    return subprocess.Popen(
        [sys.executable, "-I", "-c", CHILD, import_path(), str(nice)],
        cwd=Path(sys.executable).anchor or "/",
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def give(
    proc: subprocess.Popen, source: Path | bytes, level: str, verbose: bool = False
) -> subprocess.Popen:
    """Hand a started child (`start`) its one job: a session for the model (its bytes, or
    its file), `level` "default" or "off"; `verbose` logs ONNX Runtime's graph
    transformers on stderr. Returns `proc`, to wait for with `outcome`."""
    name = "-" if isinstance(source, bytes) else str(source)
    job = json.dumps({"source": name, "level": level, "verbose": verbose}).encode() + b"\n"
    pipe, proc.stdin = proc.stdin, None  # communicate() must not close it under the thread
    parts = (job, source) if isinstance(source, bytes) else (job,)
    # a thread: the pipe holds 64 KiB, the model far more
    threading.Thread(target=feed, args=(pipe, *parts), daemon=True).start()
    return proc


class Spares:
    """Children started ahead (`start`), each handed the next job (`take`): a load costs
    only its session's creation, the child's interpreter and `import onnxruntime` (about
    0.15 s) having run beside the parent's work. Still one child per session: a crash
    ends only its own load.

    Why some at a lower priority (`fill`'s `nice`, `SPARE_NICE`): children started long
    before their jobs (a cold `convert` starts its check's as it prepares the graph) are
    work ahead of need, and on two cores several importing at once took CPU from the
    parent whose work they wait for (the graph passes ran 0.1 to 0.2 s slower at the
    default priority, and the whole no faster). Their loads run while the parent waits,
    where the lower priority costs nothing on an idle core; on a machine whose every
    core is busy they are slower (about six times against one busy process), within
    their timeout (`default_timeout`). The first child a check loads in, and the spares
    started as others are taken, keep the default priority (`validate.start_ahead`).

    Why an object passed down and closed: every child it started, idle or handed a job,
    is killed and waited for by `close` (a `with` block), whichever way the check ends.
    Use it from one thread: Linux's PR_SET_PDEATHSIG kills a child when the thread that
    started it ends, not only the process.
    """

    def __init__(self, keep: int = 1) -> None:
        self.keep = keep  # idle children at most, started again as they are taken
        self.idle: list[subprocess.Popen] = []
        self.children: list[subprocess.Popen] = []  # every one started, to reap
        self.closed = False

    def fill(self, count: int | None = None, nice: int = 0) -> None:
        """Start idle children up to `count` (`keep` by default), at a lower priority by
        `nice` (`SPARE_NICE`: children started long before their jobs). A start that
        fails (no process left) is no error here: `take` starts its own and says so."""
        while not self.closed and len(self.idle) < (self.keep if count is None else count):
            try:
                proc = start(nice)
            except OSError:
                return
            self.children.append(proc)
            self.idle.append(proc)

    def take(
        self, source: Path | bytes, level: str, verbose: bool = False, refill: bool = True
    ) -> subprocess.Popen:
        """A child given the job (`give`): an idle one where there is one, else one
        started now (OSError where none can start); the next spare is started at once,
        unless `refill` is False (the caller's last planned load: a spare would import
        ONNX Runtime beside the parent's last steps only to be killed)."""
        if self.closed:
            raise RuntimeError("the spares were closed: their check has ended")
        if self.idle:
            proc = self.idle.pop(0)
        else:
            proc = start()
            self.children.append(proc)
        give(proc, source, level, verbose)
        if refill:
            self.fill()
        return proc

    def close(self) -> None:
        """Kill every child still running (idle or loading) and wait for each: no
        orphan, no zombie. Taking is over; closing again does nothing."""
        self.closed = True
        children, self.idle, self.children = self.children, [], []
        for proc in children:
            if proc.poll() is None:
                proc.kill()  # all first: they end together
        for proc in children:
            stop(proc)

    def __enter__(self) -> Spares:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def stop(proc: subprocess.Popen | None) -> None:
    """Kill a child (where it still runs) and wait for it (`reap`); None: nothing."""
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        reap(proc)


def reap(proc: subprocess.Popen) -> None:
    """Wait for an ended (or killed) child and close its pipes."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        proc.stdin = None
    with contextlib.suppress(OSError, ValueError):
        proc.communicate()


def outcome(proc: subprocess.Popen, timeout: float | None = None) -> Outcome:
    """Wait for a child (at most `timeout` seconds) and read what happened.

    Raises:
        TimedOut: it did not end in time; it is killed first.
    """
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise TimedOut(f"no answer within {timeout:.0f} s") from None
    code = proc.returncode
    if code == 0:
        return Outcome(True)
    said = _said(out.decode(errors="replace"))
    if code == FAILED and said is not None:
        return Outcome(False, said[0], said[1])
    why = signal_name(-code) if code < 0 else f"exit code {code}"
    killed = code < 0 and -code in KILLED
    tail = (err or out).decode(errors="replace")[-500:]
    return Outcome(False, message=tail, crash=why, killed=killed)


def _said(out: str) -> tuple[str, str] | None:
    """The child's (kind, message) from its RESULT line; None where there is none (a
    child that printed something else and exited)."""
    for line in reversed(out.splitlines()):
        if not line.startswith(RESULT):
            continue
        try:
            said = json.loads(line[len(RESULT) :])
        except ValueError:
            return None
        if isinstance(said, dict) and all(
            isinstance(said.get(k), str) for k in ("kind", "message")
        ):
            return said["kind"], said["message"]
        return None
    return None


@cache
def version() -> str:
    """The installed ONNX Runtime's version, read without importing it."""
    return installed()[1]


@cache
def installed() -> tuple[str, str]:
    """(distribution, version) of the installed ONNX Runtime (`onnxruntime-gpu` builds other
    kernels than `onnxruntime` at the same version), read without importing it."""
    from importlib import metadata

    for name in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "onnxruntime", "(version unknown)"


def judge() -> str:
    """What a load's verdict holds for: ONNX Runtime's distribution and version, onnx's and
    Python's versions, and the CPU's features. Every remembered verdict (the validated
    model's record, the neighbourhoods' memory) is keyed by it, so a cache shared by
    machines or kept across upgrades never answers for another judge."""
    dist, ort = installed()
    return f"{dist}={ort};onnx={onnx.__version__};python={sys.version};cpu={cpu_features()}"


@cache
def cpu_features() -> str:
    """The CPU's feature flags: ONNX Runtime picks kernels and graph rewrites by them (its
    NCHWc blocking by AVX-512: a load that passes on one CPU may crash on another).
    Linux's /proc/cpuinfo; elsewhere the platform's machine and processor names."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith(("flags", "Features")) and ":" in line:
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def warning(
    first: Outcome, data: bytes, timeout: float | None, load: Callable[..., subprocess.Popen]
) -> str:
    """What the default-optimised load of the model `data` did, where, and what a user of
    ONNX Runtime can do.

    A crash names the graph transformer it happened in (ONNX Runtime's verbose log)
    and the node it needs (the shortest prefix of the graph that still crashes), loads in
    children `load(source, level, verbose)` gives (`Spares.take`, or the caller's own
    that says a child that cannot start in its words); an error is ONNX Runtime's own
    first line, which names its node.
    """
    head = f"ONNX Runtime {version()} "
    tail = (
        "; the model is valid (onnx.checker's full check passes, and ONNX Runtime loads it "
        "with graph optimisations off) and TensorRT builds it. To run it in ONNX Runtime, "
    )
    if first.crash is None:
        said = first.message.strip().splitlines()[0][:400] if first.message.strip() else first.kind
        return (
            head + f"refuses the mixed model under its default graph optimisations: {said}"
            f"{tail}lower SessionOptions.graph_optimization_level"
        )
    transformer = _last_transformer(load(data, "default", True), timeout)
    where = f" in its {transformer}" if transformer else ""
    node = _crashing_node(data, timeout, load)
    at = f", at node {node.name!r} ({node.op_type})" if node is not None else ""
    fix = (
        f'pass disabled_optimizers=["{transformer}"] to InferenceSession'
        if transformer
        else "lower SessionOptions.graph_optimization_level"
    )
    return (
        head + f"crashes ({first.crash}) creating a session for the mixed model with its "
        f"default graph optimisations{where}{at}{tail}{fix}"
    )


def _last_transformer(proc: subprocess.Popen, timeout: float | None) -> str | None:
    """The graph transformer ONNX Runtime's verbose log (of the child `proc`, loading the
    crashing model) last started before the crash."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    found = re.findall(r"Applying graph transformer (\w+)", err.decode(errors="replace"))
    return found[-1] if found and proc.returncode != 0 else None


def _crashing_node(
    data: bytes, timeout: float | None, load: Callable[..., subprocess.Popen]
) -> onnx.NodeProto | None:
    """The node whose addition makes a prefix of the graph crash (bisection, bounded; each
    probe a child of `load`: `Spares.take`)."""
    model = onnx.load_model_from_string(data)
    nodes = list(model.graph.node)
    typed = infer_shapes(model)  # never fails: an inference error must not hide the warning
    types = {v.name: v for v in (*typed.graph.value_info, *typed.graph.output)}
    low, high, deadline = 0, len(nodes), time.monotonic() + PROBE_SECONDS
    for _ in range(PROBES):
        if high - low <= 1 or time.monotonic() > deadline:
            break
        middle = (low + high) // 2
        probe = _prefix(model, middle, types).SerializeToString()
        try:
            crashed = outcome(load(probe, "default"), timeout).crash is not None
        except TimedOut:
            break
        low, high = (low, middle) if crashed else (middle, high)
    return nodes[high - 1] if high - low <= 1 and nodes else None


def _prefix(model: onnx.ModelProto, count: int, types: dict) -> onnx.ModelProto:
    """The first `count` nodes, every value they leave unread a graph output."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[count:]
    read = {t for n in out.graph.node for t in subgraphs.node_reads(n)}
    made = [o for n in out.graph.node for o in n.output if o and o not in read]
    outputs = [types[o] for o in made if o in types] or [
        helper.make_empty_tensor_value_info(o) for o in made[-1:]
    ]
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    return out
