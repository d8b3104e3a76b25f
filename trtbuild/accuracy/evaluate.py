"""Run the FP32 reference and one evaluator over the same feeds, and judge them.

Polygraphy does what it is made for here: `OnnxrtRunner` / `TrtRunner` execute,
`Comparator.run` collects `RunResults`, `SimpleCompareFunc` judges each output
with the policy's tolerances. trtbuild adds what Polygraphy does not: the
FP16-storage emulation as a runner, per-output metrics for the report, and the
first tensor along the graph where precision breaks.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from trtbuild.accuracy.data import Feed
from trtbuild.policy.model import AccuracySpec

EVALUATORS = ("tensorrt", "emulated-fp16")
REFERENCE = "onnxrt-fp32"
FP16_MAX = 65504.0


@contextlib.contextmanager
def quiet_polygraphy(verbose: bool = False) -> Iterator[None]:
    from polygraphy.logger import G_LOGGER

    old = G_LOGGER.module_severity
    if not verbose:  # trtbuild renders its own verdicts; Polygraphy's go to --verbose
        G_LOGGER.module_severity = G_LOGGER.CRITICAL
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    finally:
        G_LOGGER.module_severity = old


def _session(model_bytes: bytes, optimize: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:  # the emulation's Cast pairs must survive
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def onnxrt_runner(model: onnx.ModelProto, name: str, optimize: bool = True):
    from polygraphy.backend.onnxrt import OnnxrtRunner

    data = model.SerializeToString()
    return OnnxrtRunner(lambda: _session(data, optimize), name=name)


def trt_runner(engine: bytes, backend: str, name: str = "tensorrt"):
    """Polygraphy's TrtRunner on a built engine; needs a GPU."""
    from polygraphy import config as pg_config

    pg_config.USE_TENSORRT_RTX = backend == "tensorrt-rtx"
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(engine), name=name)


@dataclass
class OutputMetrics:
    passed: bool
    max_abs: float
    mean_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    cosine: float
    nonfinite: int
    atol: float
    rtol: float
    check_error_stat: str
    psnr: float | None = None
    failed_samples: list[int] = field(default_factory=list)  # Polygraphy's verdict per sample

    def to_json(self) -> dict[str, Any]:
        return {k: _finite_or_str(v) for k, v in self.__dict__.items()}


def _finite_or_str(v: Any) -> Any:
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)  # JSON has no inf/nan; "inf" is explicit
    return v


@dataclass
class Evaluation:
    evaluator: str
    passed: bool
    outputs: dict[str, OutputMetrics]
    run_results: Any = field(repr=False, default=None)

    def outputs_json(self) -> dict[str, Any]:
        return {k: v.to_json() for k, v in self.outputs.items()}


def metrics(ref: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    ref = np.asarray(ref, dtype=np.float64).ravel()
    out = np.asarray(out, dtype=np.float64).ravel()
    nonfinite = int(np.count_nonzero(~np.isfinite(out) & np.isfinite(ref)))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        diff = np.abs(out - ref)
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = diff / np.maximum(np.abs(ref), np.finfo(np.float32).tiny)
        denom = np.linalg.norm(ref) * np.linalg.norm(out)
        cosine = (
            float(np.dot(ref, out) / denom)
            if denom and np.isfinite(denom)
            else (1.0 if not diff.any() else 0.0)
        )
        return {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "mean_abs": float(diff.mean()) if diff.size else 0.0,
            "median_abs": float(np.median(diff)) if diff.size else 0.0,
            "p99_abs": float(np.percentile(diff, 99)) if diff.size else 0.0,
            "max_rel": float(rel.max()) if rel.size else 0.0,
            "cosine": round(cosine, 6) if np.isfinite(cosine) else 0.0,
            "nonfinite": nonfinite,
        }


def psnr(ref: np.ndarray, out: np.ndarray) -> float | None:
    """PSNR for image-like (NCHW/NHWC, 1 or 3 channels) outputs, peak = reference range."""
    if ref.ndim != 4 or not ({ref.shape[1], ref.shape[-1]} & {1, 3}):
        return None
    with np.errstate(all="ignore"):
        mse = float(np.mean((out.astype(np.float64) - ref) ** 2))
        peak = float(ref.max() - ref.min()) or 1.0
        if not np.isfinite(mse):
            return 0.0
        return round(10 * np.log10(peak**2 / mse), 3) if mse > 0 else float("inf")


def judge(
    reference: ReferenceTensors,
    candidate_runner,
    feeds: list[Feed],
    spec: AccuracySpec,
    evaluator: str,
    verbose: bool = False,
) -> Evaluation:
    """Run the candidate and judge it against the reference's outputs with the tolerances."""
    from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc

    ref_iters = reference.run_results[REFERENCE]
    names = list(ref_iters[0].keys())
    with quiet_polygraphy(verbose):
        candidate = Comparator.run([candidate_runner], data_loader=feeds)
        results = RunResults()
        results.append((REFERENCE, ref_iters))
        results.append((candidate_runner.name, candidate[candidate_runner.name]))
        func = SimpleCompareFunc(
            atol={n: spec.tolerance(n).atol for n in names},
            rtol={n: spec.tolerance(n).rtol for n in names},
            check_error_stat={n: spec.tolerance(n).check_error_stat for n in names},
        )
        verdicts = Comparator.compare_accuracy(results, compare_func=func)
    verdict = verdicts[0]  # one AccuracyResult per compare function
    pair = (REFERENCE, candidate_runner.name)
    per_iter = verdict[pair]
    out_iters = results[candidate_runner.name]
    outputs = {}
    for name in names:
        refs = [np.asarray(it[name]) for it in ref_iters]
        outs = [np.asarray(it[name]) for it in out_iters]
        m = metrics(
            np.concatenate([r.ravel() for r in refs]), np.concatenate([o.ravel() for o in outs])
        )
        tol = spec.tolerance(name)
        failed = [k for k, it in enumerate(per_iter) if not bool(it[name])]
        ok = not failed and m["nonfinite"] == 0
        outputs[name] = OutputMetrics(
            passed=ok,
            failed_samples=failed,
            atol=tol.atol,
            rtol=tol.rtol,
            check_error_stat=tol.check_error_stat,
            psnr=psnr(refs[0], outs[0]),
            **m,
        )
    return Evaluation(evaluator, all(o.passed for o in outputs.values()), outputs, results)


# -- intermediate tensors -------------------------------------------------------


def float_node_outputs(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(tensor, node, op) for every float tensor a node produces, in topological order."""
    from trtbuild.precision.graphview import GraphView

    view = GraphView(model)
    return [(t, n.name, n.op_type) for i, n in enumerate(view.nodes) for t in view.float_outputs(i)]


def all_tensors_session(model: onnx.ModelProto, names: list[str]):
    """A session whose outputs are the named tensors (optimisations off: none is fused away)."""
    from polygraphy.backend.onnx import modify_outputs

    with quiet_polygraphy():
        marked = modify_outputs(model, outputs=names, copy=True)
    return _session(marked.SerializeToString(), optimize=False)


def run_all_tensors(sess, feed: Feed) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed)))


@dataclass
class ReferenceTensors:
    """One FP32 run per feed with every float tensor marked.

    Range rules and boundary warnings need each tensor's peak over all feeds;
    the first divergence needs the first feed's values; the comparator needs the
    graph outputs of every feed, as Polygraphy RunResults. One pass gives all.
    """

    order: list[tuple[str, str, str]]
    first: dict[str, np.ndarray]
    ranges: dict[str, float]
    run_results: Any = field(repr=False, default=None)


def reference_tensors(reference: onnx.ModelProto, feeds: list[Feed]) -> ReferenceTensors:
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    order = float_node_outputs(reference)
    names = [t for t, _, _ in order]
    outputs = [o.name for o in reference.graph.output]
    sess = all_tensors_session(reference, list(dict.fromkeys([*names, *outputs])))
    first: dict[str, np.ndarray] = {}
    ranges: dict[str, float] = {}
    iterations = []
    for k, feed in enumerate(feeds):
        values = run_all_tensors(sess, feed)
        if k == 0:
            first = values
        iterations.append(IterationResult({o: values[o] for o in outputs}, runner_name=REFERENCE))
        for name, v in {**values, **feed}.items():
            v = np.asarray(v)
            if np.issubdtype(v.dtype, np.floating) and v.size:
                with np.errstate(all="ignore"):
                    ranges[name] = max(ranges.get(name, 0.0), float(np.nanmax(np.abs(v))))
    results = RunResults()
    results.append((REFERENCE, iterations))
    return ReferenceTensors(order, first, ranges, results)


def divergence(
    reference: ReferenceTensors,
    emulated: onnx.ModelProto,
    feed: Feed,
    threshold: float,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """First tensor (topological order) that is non-finite or off by > threshold of its range.

    `feed` must be the feed `reference.first` was computed on. Returns the
    divergence (or None) and the per-layer error curve along depth.
    """
    ref = reference.first
    emu = run_all_tensors(all_tensors_session(emulated, [t for t, _, _ in reference.order]), feed)
    first, curve = None, []
    for depth, (tensor, node, op) in enumerate(reference.order):
        if tensor not in ref or tensor not in emu:
            continue
        r = np.asarray(ref[tensor], dtype=np.float64)
        e = np.asarray(emu[tensor], dtype=np.float64)
        if r.shape != e.shape:
            continue
        with np.errstate(all="ignore"):
            bad = int(np.count_nonzero(~np.isfinite(e) & np.isfinite(r)))
            scale = float(np.nanmax(np.abs(r))) if r.size else 0.0
            err = float(np.nanmax(np.abs(e - r))) if r.size else 0.0
        rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
        if bad:
            rel = float("inf")
        curve.append(
            {
                "depth": depth,
                "node": node,
                "op": op,
                "tensor": tensor,
                "rel_error": _finite_or_str(rel),
                "ref_max_abs": scale,
                "nonfinite": bad,
            }
        )
        if first is None and (bad or rel > threshold):
            reason = (
                f"{bad} non-finite value(s) where FP32 is finite (FP32 peak |x| = {scale:.4g})"
                if bad
                else f"error {rel:.2%} of the tensor's range exceeds {threshold:.0%}"
            )
            first = {"node": node, "op": op, "tensor": tensor, "reason": reason}
    return first, curve
