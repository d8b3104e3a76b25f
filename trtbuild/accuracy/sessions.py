"""Runners and metrics: ONNX Runtime sessions with tensors marked, the engine's runner,
and the per-output figures a report shows.

Polygraphy does what it is made for: `TrtRunner` executes an engine,
`SimpleCompareFunc` judges each output with the policy's tolerances
(`accuracy.judge`). trtbuild adds what Polygraphy does not: sessions with
every tensor marked (one run gives outputs and intermediates) and the metrics.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from trtbuild.cores import usable_cores
from trtbuild.errors import BackendError
from trtbuild.fsutil import strict_json
from trtbuild.graph.model_io import model_data_apart
from trtbuild.numerics import RELATIVE_EPSILON, data_peak
from trtbuild.shared import Shared

REFERENCE = "onnxrt-fp32"
EMULATED = "emulated-fp16"


def _polygraphy_indent() -> Callable[[], object]:
    from polygraphy.logger import G_LOGGER

    indent = G_LOGGER.logging_indent
    return lambda: setattr(G_LOGGER, "logging_indent", indent)


def _polygraphy_silenced() -> Callable[[], object]:
    from polygraphy.logger import G_LOGGER

    old = G_LOGGER.module_severity
    G_LOGGER.module_severity = G_LOGGER.CRITICAL
    return lambda: setattr(G_LOGGER, "module_severity", old)


def _runtime_warnings_ignored() -> Callable[[], object]:
    caught = warnings.catch_warnings()
    caught.__enter__()
    warnings.simplefilter("ignore", RuntimeWarning)
    return lambda: caught.__exit__(None, None, None)


# Polygraphy's logger and the warnings filters are the process's: each is set by the first
# thread in and given back by the last out (`shared`), not saved and restored per thread
_INDENT = Shared(_polygraphy_indent)
_SILENCED = Shared(_polygraphy_silenced)
_NO_RUNTIME_WARNINGS = Shared(_runtime_warnings_ignored)


@contextlib.contextmanager
def quiet_polygraphy(verbose: bool = False) -> Iterator[None]:
    """Polygraphy's log off (trtbuild renders its own verdicts; Polygraphy's go to
    --verbose), numpy's RuntimeWarnings ignored, and Polygraphy's indent (samples compared
    on threads interleave its own) given back after: the process as it was once the last
    thread in it leaves, however many ran at once."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_INDENT.held())
        if not verbose:
            stack.enter_context(_SILENCED.held())
        stack.enter_context(_NO_RUNTIME_WARNINGS.held())
        stack.enter_context(np.errstate(all="ignore"))
        yield


# ONNX Runtime's CPU memory, shared by every judging session (see `_shared_arena`).
_ARENA_CONFIG = {"arena_extend_strategy": 1}  # kSameAsRequested: grow by what is asked, no more


@functools.lru_cache(maxsize=1)
def _shared_arena() -> None:
    """One CPU arena for every session the judge makes, registered once a process.

    Why: a session's own arena keeps its peak for the session's life (a cut run
    has a session per segment, so the peaks add up), and no arena at all
    allocates every tensor afresh, so the kernel spends more time faulting pages
    in than the kernels spend computing (`benchmarks/bench_memory.py`, PP-OCRv4 det
    at 1280x1280: the accuracy stage took 7.0 to 8.6 s without, 3.5 to 4.5 s with).
    One arena that grows by what is asked, shrunk at the end of every run
    (`run_session`), reuses memory within a run and gives it back after. Only
    sessions that opt in (`session.use_env_allocators`) use it; no other session
    in the process changes.
    """
    from trtbuild.ortload import onnxruntime

    ort = onnxruntime()

    info = ort.OrtMemoryInfo(
        "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
    )
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(_ARENA_CONFIG))


@functools.lru_cache(maxsize=2)
def _run_options(shrink: bool = True):
    from trtbuild.ortload import onnxruntime

    ort = onnxruntime()

    options = ort.RunOptions()
    if shrink:
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def run_session(
    session, names: list[str], feed: dict[str, np.ndarray], *, shrink: bool = True
) -> list[np.ndarray]:
    """`session.run`, then (with `shrink`) the shared arena gives back what the run no longer
    holds. Without it, the next run reuses those pages instead of faulting them in again: a
    caller passes `shrink=False` where another run of the same graph follows at once.

    Why `run` and its copies, not `run_with_ort_values` and views of the arena: on
    PP-OCRv4 det at 1280x1280 the views took the same time and peak (#36).
    """
    return session.run(names, feed, _run_options(shrink))


def intra_op_threads() -> int:
    """ONNX Runtime's intra-op threads: the cores this process may run on where that is fewer
    than the machine has, else 0 (ONNX Runtime's own choice, one a physical core).

    Why: ONNX Runtime counts the machine's cores, so a process that `taskset`, a
    container or a CI runner limits to fewer runs more threads than it has cores,
    and they wait on each other at every op.
    """
    allowed = usable_cores()
    return allowed if allowed < (os.cpu_count() or allowed) else 0


@dataclass(frozen=True)
class SessionModel:
    """A model for one ONNX Runtime session: its bytes, and its large weights' data apart
    (`model_io.data_apart`: each file's name and bytes), which ONNX Runtime copies as it
    makes the session. The caller lets it go once the session is made: no copy of the
    weights is held beside the session's own."""

    data: bytes
    files: tuple[tuple[str, bytes], ...] = ()


def session_model(model: onnx.ModelProto, weights: Iterable[onnx.TensorProto] = ()) -> SessionModel:
    """`model`, every field of it, with `weights` added to its weights, for a session: the
    large ones given apart where this ONNX Runtime takes files of memory (else in its
    bytes, as before; `model_io.model_data_apart`)."""
    light, files = model_data_apart(model, weights, apart=_memory_files())
    return SessionModel(light.SerializeToString(), tuple(files))


@functools.lru_cache(maxsize=1)
def _memory_files() -> bool:
    """Whether this ONNX Runtime's Python API reads external data from files of memory
    (`add_external_initializers_from_files_in_memory`, new in 2025: an older one gets
    the weights in the model's bytes)."""
    from trtbuild.ortload import onnxruntime

    return hasattr(onnxruntime().SessionOptions, "add_external_initializers_from_files_in_memory")


def _session(model: bytes | str | SessionModel, in_order: bool = False):
    """A session with optimisations off (the emulation's Cast pairs and every marked tensor
    survive), on the shared arena, whose idle threads sleep.

    Why no spinning: the judge alternates ONNX Runtime runs with numpy work on
    the same cores, and spinning workers take the cores numpy needs.
    """
    from trtbuild.ortload import onnxruntime

    ort = onnxruntime()

    _shared_arena()
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: trtbuild reports a failed run in its words
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_mem_pattern = False  # a pattern is one block of the run's peak, held
    options.add_session_config_entry("session.use_env_allocators", "1")
    options.enable_cpu_mem_arena = False  # never an arena of its own, should the shared one go
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = intra_op_threads()
    if in_order:  # the graph's own order: a check placed after its tensor frees it there
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    source = model
    if isinstance(model, SessionModel):
        source = model.data
        if model.files:  # copied as the session is made (ONNX Runtime's documented contract)
            names, buffers = zip(*model.files)
            sizes = [len(b) for b in buffers]
            options.add_external_initializers_from_files_in_memory(
                list(names), list(buffers), sizes
            )
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def plain_session(model: bytes | SessionModel):
    """A session for one segment of a cut run: it computes what the whole graph would."""
    return _session(model)


def lean_session(model: bytes | str | SessionModel):
    """A whole graph run as inference runs it (intermediates freed as they are consumed),
    in the graph's order: what a lean run needs."""
    return _session(model, in_order=True)


def bound_flavour() -> bool | None:
    """Which TensorRT Polygraphy's backend is bound to in this process: True for TensorRT-RTX,
    None before its first import.

    Why ask Polygraphy: it binds `polygraphy.backend.trt` to tensorrt or tensorrt_rtx
    when that module is first imported, once per process; its own module says which.
    """
    runner = sys.modules.get("polygraphy.backend.trt.runner")
    if runner is None:
        return None
    return runner.trt.__name__ == "tensorrt_rtx"  # the module it bound (imported on access)


@contextlib.contextmanager
def tensorrt_flavour(rtx: bool) -> Iterator[None]:
    """Polygraphy's `USE_TENSORRT_RTX`, set while trtbuild uses its TensorRT backend and
    given back after, so no other Polygraphy user in this process inherits it."""
    bound = bound_flavour()
    if bound is not None and bound != rtx:
        raise BackendError(
            "this process already ran engines of the other TensorRT flavour; Polygraphy "
            "binds one per process",
            hint="run this build in a trtbuild process of its own (nightly: --jobs 2 or more)",
        )
    with _FLAVOURS[rtx].held():  # two runs at once: the flag of before the first, after both
        yield


def _flavour(rtx: bool) -> Callable[[], object]:
    from polygraphy import config as pg_config

    old = pg_config.USE_TENSORRT_RTX
    pg_config.USE_TENSORRT_RTX = rtx
    return lambda: setattr(pg_config, "USE_TENSORRT_RTX", old)


_FLAVOURS = {rtx: Shared(functools.partial(_flavour, rtx)) for rtx in (False, True)}


@dataclass
class EngineRunner:
    """Polygraphy's `TrtRunner` on a built engine (needs a GPU), with its flavour."""

    runner: Any
    rtx: bool

    def run(self, feeds: list[dict[str, np.ndarray]], verbose: bool = False) -> list:
        """One Polygraphy `IterationResult` per feed."""
        from polygraphy.comparator import Comparator

        with tensorrt_flavour(self.rtx), quiet_polygraphy(verbose):
            return list(Comparator.run([self.runner], data_loader=feeds)[self.runner.name])


def trt_runner(engine: bytes, backend: str, name: str = "tensorrt") -> EngineRunner:
    rtx = backend == "tensorrt-rtx"
    with tensorrt_flavour(rtx):
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        return EngineRunner(TrtRunner(EngineFromBytes(engine), name=name), rtx)


@dataclass
class OutputMetrics:
    passed: bool
    max_abs: float
    mean_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    max_abs_of_range: float  # max_abs over the reference's largest |value|: error with its scale
    cosine: float
    nonfinite: int
    atol: float
    rtol: float
    check_error_stat: str
    psnr: float | None = None
    failed_samples: list[int] = field(default_factory=list)  # Polygraphy's verdict per sample
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # accuracy.checks, judged
    # samples whose output's shape is not FP32's: {sample, reference, candidate}
    shape_mismatch: list[dict[str, Any]] = field(default_factory=list)
    tolerance: Any = None  # the policy's Tolerance for this output (not in JSON)
    # False where no sample had the reference's shape: the figures are `unmeasured()`'s
    # (not in JSON, where `shape_mismatch` says which samples)
    measured: bool = True

    def to_json(self) -> dict[str, Any]:
        out = {
            k: v for k, v in self.__dict__.items() if k not in ("checks", "tolerance", "measured")
        }
        out["checks"] = self.checks
        return strict_json(out)  # a check's figures nest: `simple.worst.abs`


def shape_text(shapes: list[dict[str, Any]], theirs: str = "FP32's") -> str:
    """`shape [3300, 2] where FP32's is [3311, 2] (sample 0)`: the first sample whose
    shape differs, and how many more; `theirs`: what it was compared with."""
    d = shapes[0]
    more = f" and {len(shapes) - 1} more" if len(shapes) > 1 else ""
    return (
        f"shape {d['candidate']} where {theirs} is {d['reference']} (sample {d['sample']}"
        f"{more}: a count the data decides)"
    )


def shape_said(m: OutputMetrics, theirs: str = "FP32's") -> str:
    """`shape [..] where FP32's is [..] (...); ` before an output's figures where some sample's
    shape is not FP32's (the figures are then the other samples'), else nothing."""
    if not m.shape_mismatch:
        return ""
    return f"{shape_text(m.shape_mismatch, theirs)}; " + (
        "figures where the shapes agree: " if m.measured else "no sample to measure: "
    )


def same_shaped(refs: list, outs: list, name: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Output `name` of each pair of samples (the reference's, a candidate's) whose shapes
    agree: a count the data decides (`NonZero`'s) may differ, and then has no element-wise
    error."""
    pairs = [(np.asarray(r[name]), np.asarray(o[name])) for r, o in zip(refs, outs)]
    return [(r, o) for r, o in pairs if r.shape == o.shape]


def unmeasured() -> dict[str, Any]:
    """`metrics()`'s figures where no sample could be measured (every sample's shape differs
    from the reference's): each error the worst there is, no value non-finite."""
    return {k: 0 if k == "nonfinite" else float("inf") for k in metrics(np.zeros(1), np.zeros(1))}


def _floats(values: np.ndarray) -> np.ndarray:
    a = np.asarray(values).ravel()
    return a if a.dtype.kind == "f" else a.astype(np.float64)


def metrics(ref: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    """Each output's error figures, in float64 whatever the outputs' dtype.

    Why the care: at 1280² with two samples these are 3.3M elements per output
    and per candidate, so the figures come from one float64 difference, made in
    place: the relative error reuses one buffer, NaN becomes inf only when there
    is a NaN, and the median and 99th percentile partition the difference itself
    once the order-dependent mean is taken (order statistics are the same numbers
    whatever the order). Safe on a worker thread: nothing process-wide is touched.
    """
    ref, out = _floats(ref), _floats(out)
    if not ref.size:  # an empty output is measured as one exact value: every figure is 0
        ref = out = np.zeros(1)
    nonfinite = int(np.count_nonzero(~np.isfinite(out) & np.isfinite(ref)))
    with np.errstate(all="ignore"):  # per thread; warnings' filters are the process's
        diff = np.abs(np.subtract(out, ref, dtype=np.float64))
        max_abs = float(diff.max())
        if np.isnan(max_abs):  # a NaN is the worst error there is
            diff[np.isnan(diff)] = np.inf
            max_abs = np.inf
        scale = np.abs(ref, dtype=np.float64)
        scale[scale == 0] = RELATIVE_EPSILON  # as the verdict's relative error (Polygraphy's)
        max_rel = float(np.divide(diff, scale, out=scale).max())
        mean_abs = float(diff.mean())
        peak = data_peak(ref)
        median = float(np.median(diff, overwrite_input=True))
        return {
            "max_abs": max_abs,
            "mean_abs": mean_abs,
            "median_abs": median,
            "p99_abs": _percentile_99(diff),
            "max_rel": max_rel,
            "max_abs_of_range": max_abs / peak if peak > 0 else 0.0,
            "nonfinite": nonfinite,
        }


def _percentile_99(diff: np.ndarray) -> float:
    """The 99th percentile of |error| (NaN already made inf), numpy's, but where numpy's
    interpolation meets an inf: there it computes inf - inf or inf x 0, NaN (an output
    that turned inf at 2 of 2 elements read `p99_abs: nan` beside `max_abs: inf`). The
    percentile is then the order statistic it falls on (101 errors, the last inf: the
    100th, finite), or inf where it lies between a value and an inf."""
    value = float(np.percentile(diff, 99, overwrite_input=True))
    if value == value:
        return value
    where = 0.99 * (diff.size - 1)  # numpy's linear method: between these two ranks
    low = math.floor(where)
    if where > low:
        return math.inf
    return float(np.partition(diff.ravel(), low)[low])
