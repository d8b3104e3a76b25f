"""The checks an output is judged by: Polygraphy's compare functions, one registry.

Why Polygraphy's: users of TensorRT judge with `polygraphy run --atol/--rtol`,
`--check-error-stat quantile --error-quantile`, `--psnr-threshold`,
`--cosine-similarity-threshold`, `--snr-threshold` and `--index-tolerance`;
the same names in a policy mean the same computation here. Each check is one
Polygraphy compare function over the outputs it applies to (their
`IterationResult`s only), so an output with no PSNR threshold is never judged
by PSNR; with `--verbose` it runs through `Comparator.compare_accuracy`, whose
log shows every output's statistics. Without it the simple check is Polygraphy's
`SimpleCompareFunc` less the statistics of that log (`accuracy.simple`: the same
results, a third of the time on a large output). Every check an output has must
pass on every sample.

Cosine similarity is measured on every output and PSNR on image-like ones even
without a threshold (a threshold that cannot fail), so reports show them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtbuild.errors import UsageError
from trtbuild.policy.specs import Tolerance


@dataclass(frozen=True)
class Metric:
    """A single-number check: its Polygraphy compare function, policy key and result field."""

    func: str  # class name in polygraphy.comparator
    key: str  # the threshold's name in a policy, as Polygraphy's argument
    value: str  # the attribute of the result that holds the metric
    unit: str
    identical: float  # the metric of two outputs alike (an empty pair's: `_where_empty`)


METRICS = {
    "psnr": Metric("PsnrCompareFunc", "psnr_threshold", "psnr", " dB", math.inf),
    "cosine": Metric(
        "CosineSimilarityCompareFunc", "cosine_similarity_threshold", "cosine_similarity", "", 1.0
    ),
    "snr": Metric("SnrCompareFunc", "snr_threshold", "snr", " dB", math.inf),
}
NEVER_FAILS = {"psnr": float("-inf"), "cosine": -1.0, "snr": float("-inf")}


def image_like(shape: tuple[int, ...]) -> bool:
    """NCHW or NHWC with 1 or 3 channels: an output PSNR means something for."""
    return len(shape) == 4 and bool({shape[1], shape[-1]} & {1, 3})


def map_like(shape: tuple[int, ...]) -> bool:
    """Any NCHW map of some spatial extent (a detector's score, box and landmark maps):
    an output whose error has a place worth drawing."""
    return len(shape) == 4 and min(shape[2], shape[3]) >= 4


def run_checks(
    ref_iters: list, iterations: list, label: str, tol: dict[str, Tolerance], verbose: bool
) -> dict[str, dict[str, dict[str, Any]]]:
    """output -> check -> {passed, failed_samples, value, threshold} over every sample."""
    from trtbuild.accuracy.sessions import quiet_polygraphy

    found: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in tol}
    pair = _Pair(ref_iters, iterations, label, verbose)
    with quiet_polygraphy(verbose):
        _simple(found, pair, tol)
        for check, metric in METRICS.items():
            _metric(found, pair, tol, check, metric)
        _indices(found, pair, tol)
    return found


@dataclass(frozen=True)
class _Pair:
    """The reference's samples and a candidate's, compared check by check."""

    ref_iters: list
    iterations: list
    label: str
    verbose: bool  # through Polygraphy's Comparator, which logs every output's statistics

    def compare(
        self, names: list[str], func, ref_iters=None, iterations=None, reference_second=False
    ) -> list:
        """Polygraphy's per-sample results of `func` on the outputs `names` alone; the
        reference first (PSNR's peak and SNR's signal are the first output's), or second
        (`reference_second`: the simple check's relative error divides by the second).

        Why call `func` itself unless verbose: `Comparator.compare_accuracy` computes
        every output's statistics (quantiles included) for its log whether or not the
        log is shown, three times per sample here; `func` gives the same results.
        """
        from polygraphy.comparator import Comparator, RunResults
        from polygraphy.comparator.struct import IterationResult

        from trtbuild.accuracy.sessions import REFERENCE
        from trtbuild.cores import usable_cores

        order = [
            (REFERENCE, self.ref_iters if ref_iters is None else ref_iters),
            (self.label, self.iterations if iterations is None else iterations),
        ]
        if reference_second:
            order.reverse()
        sides = [
            [IterationResult({n: _comparable(it[n]) for n in names}, runner_name=r) for it in its]
            for r, its in order
        ]
        if not self.verbose:  # samples at once: numpy leaves the GIL while it partitions
            # (their warnings meet the filter `quiet_polygraphy` holds around this call)
            with ThreadPoolExecutor(max(1, min(len(sides[0]), usable_cores()))) as pool:
                return list(pool.map(func, *sides))
        results = RunResults()
        for (runner, _), side in zip(order, sides):
            results.append((runner, side))
        return Comparator.compare_accuracy(results, compare_func=func)[0][tuple(results.keys())]


def _comparable(value: np.ndarray) -> np.ndarray:
    """An output as Polygraphy's functions can take it: a 0-d output as one value (its
    metrics index their inputs), a boolean one as 0 and 1 (its quantiles, PSNR and SNR
    subtract, which numpy refuses for booleans; 0/1 differ where the booleans do)."""
    value = np.atleast_1d(value)
    return value.view(np.uint8) if value.dtype == np.bool_ else value


def _record(
    found: dict, check: str, per_iter: list, names: list[str], extra: dict | None = None
) -> None:
    for name in names:
        failed = [k for k, it in enumerate(per_iter) if not bool(it[name])]
        more = (extra or {}).get(name, {})
        found[name][check] = {"passed": not failed, "failed_samples": failed, **more}


def _simple(found: dict, pair: _Pair, tol: dict[str, Tolerance]) -> None:
    """Polygraphy's simple comparison; without --verbose, one that computes no statistics
    for its log (`accuracy.simple`): the same results."""
    from polygraphy.comparator import SimpleCompareFunc

    from trtbuild.accuracy.simple import QuietSimpleCompareFunc

    names = [n for n, t in tol.items() if t.simple]
    if not names:
        return
    quantiles = {n: tol[n].error_quantile for n in names if tol[n].error_quantile is not None}
    kind = SimpleCompareFunc if pair.verbose else QuietSimpleCompareFunc
    func = kind(
        atol={n: tol[n].atol for n in names},
        rtol={n: tol[n].rtol for n in names},
        check_error_stat={n: tol[n].check_error_stat for n in names},
        error_quantile=quantiles or None,
    )
    # the candidate first, as `polygraphy run --trt --onnxrt` orders them: Polygraphy's
    # relative error divides by the second output ("within 1% of the second"), which
    # must be FP32's (by the candidate's, 0.5 where FP32 says 0.3 was 40% off, not 67%)
    per_iter = pair.compare(names, func, reference_second=True)
    per_iter = _where_empty(pair, names, per_iter, _no_error)
    _record(found, "simple", per_iter, names, {n: _worst(per_iter, n, tol[n]) for n in names})


def _where_empty(pair: _Pair, names: list[str], per_iter: list, alike: Callable) -> list:
    """Each sample's results, where an output is empty on both sides (the same shape: no box
    kept by either side's NMS) made `alike(result)`, the result of two outputs alike,
    judged by its own threshold: nothing differs there.

    Why: Polygraphy's statistics of an empty error are 0 for the max and the median (its
    `use_higher_precision`), NaN for the mean and inf for a quantile, and its PSNR and SNR
    NaN, so a detector failed `check_error_stat: mean` on a sample where neither side kept
    a box.
    """
    fixed = []
    for k, results in enumerate(per_iter):
        results = dict(results)
        for n in names:
            ref, got, was = pair.ref_iters[k][n], pair.iterations[k][n], results.get(n)
            if not np.size(ref) and np.shape(ref) == np.shape(got) and hasattr(was, "thresholds"):
                results[n] = alike(was)
        fixed.append(results)
    return fixed


def _no_error(was: Any) -> Any:
    """A simple comparison's result with every statistic 0, under `was`'s threshold."""
    from polygraphy.comparator import OutputCompareResult

    q = 0.0 if was.quantile_absdiff is not None else None
    return OutputCompareResult(
        max_absdiff=0.0, max_reldiff=0.0, mean_absdiff=0.0, mean_reldiff=0.0,
        median_absdiff=0.0, median_reldiff=0.0, quantile_absdiff=q, quantile_reldiff=q,
        thresholds=was.thresholds,
        passed=True if was.thresholds.check_error_stat == "elemwise" else None,
    )  # fmt: skip


# Polygraphy's statistic each `check_error_stat` judges (`elemwise`: every element, its max shown)
_STAT = {"elemwise": "max", "max": "max", "mean": "mean", "median": "median"}


def _worst(per_iter: list, name: str, tol: Tolerance) -> dict[str, Any]:
    """The failing sample whose judged statistic is largest, with it (absolute, relative).

    Why: the figures shown are over every sample judged, so a median within atol could
    sit next to FAIL: one sample's median is what failed, and a report names it.
    """
    stat = _STAT.get(tol.check_error_stat, "quantile")
    failed = [(k, it[name]) for k, it in enumerate(per_iter) if _figured(it[name]) and not it[name]]
    if not failed:
        return {}
    k, worst = max(failed, key=lambda f: _nan_largest(float(getattr(f[1], f"{stat}_absdiff"))))
    absolute, relative = (float(getattr(worst, f"{stat}_{d}diff")) for d in ("abs", "rel"))
    return {"worst": {"sample": k, "abs": absolute, "rel": relative}}


def _nan_largest(value: float) -> tuple[bool, float]:
    """A key that puts NaN above every number: a NaN error is the worst (Python's `max`
    keeps a NaN only where it comes first)."""
    return value != value, value


def _metric(found, pair: _Pair, tol, check: str, metric: Metric) -> None:
    from polygraphy import comparator

    judged = {
        n: getattr(t, metric.key) for n, t in tol.items() if getattr(t, metric.key) is not None
    }
    shown = {
        n: NEVER_FAILS[check]
        for n in tol
        if n not in judged
        and (check == "cosine" or (check == "psnr" and image_like(pair.ref_iters[0][n].shape)))
    }
    thresholds = {**shown, **judged}
    if not thresholds:
        return
    names = list(thresholds)
    func = getattr(comparator, metric.func)(**{metric.key: thresholds})
    alike = lambda was: type(was)(metric.identical, thresholds=was.thresholds)  # noqa: E731
    per_iter = _where_empty(pair, names, pair.compare(names, func), alike)
    for name in names:  # a bare bool: Polygraphy would not compare (the shapes differ)
        values = [float(getattr(it[name], metric.value)) for it in per_iter if _figured(it[name])]
        # the worst sample's figure, NaN first: it fails every threshold (a sample whose
        # output is NaN has a NaN cosine), and `min` would skip it but in first place
        worst = min(values, key=lambda v: (v == v, v)) if values else None  # NaN least
        entry = {"value": worst, "threshold": judged.get(name)}
        if name in judged:
            failed = [k for k, it in enumerate(per_iter) if not bool(it[name])]
            found[name][check] = {"passed": not failed, "failed_samples": failed, **entry}
        else:
            found[name].setdefault("shown", {})[check] = worst


def _figured(result: Any) -> bool:
    return not isinstance(result, (bool, np.bool_))


def _indices(found: dict, pair: _Pair, tol: dict[str, Tolerance]) -> None:
    from polygraphy.comparator import IndicesCompareFunc
    from polygraphy.comparator.struct import IterationResult

    names = [n for n, t in tol.items() if t.compare == "indices"]
    if not names:
        return
    _compared(tol, names, pair.ref_iters)
    top_k = {n: (tol[n].top_k, tol[n].ranked_axis) for n in names if tol[n].top_k}

    def indices(iters: list) -> list:
        if not top_k:
            return iters
        return [
            IterationResult(
                {n: top_indices(v, *top_k[n]) if n in top_k else v for n, v in it.items()},
                runner_name=it.runner_name,
            )
            for it in iters
        ]

    func = IndicesCompareFunc(index_tolerance={n: tol[n].index_tolerance or 0 for n in names})
    per_iter = pair.compare(names, func, indices(pair.ref_iters), indices(pair.iterations))
    extra = {n: {"threshold": tol[n].index_tolerance or 0, "top_k": tol[n].top_k} for n in names}
    _record(found, "indices", per_iter, names, extra)


def compares_nothing(tol: Tolerance, dims: tuple) -> tuple[str, str, str] | None:
    """Why a `compare: indices` tolerance compares nothing of an output of `dims` (a number
    each, None where unknown; a scalar is judged as one value): the tolerance key at fault,
    the reason and the hint (`{name}` for the output's), or None where it compares some.

    Why: `IndicesCompareFunc` leaves the last `index_tolerance` values of each row out of
    the comparison, so such a tolerance compares nothing and always passes: an ArgMax's
    `[B, 1]` class with `index_tolerance: 1` passed where FP16 chose class 10 and FP32 15.
    A one-channel map's top 1 along its channel is index 0 on both sides, whatever FP16 did.
    """
    if tol.compare != "indices":
        return None
    dims = dims or (1,)
    ranked = tol.top_k and -len(dims) <= tol.ranked_axis < len(dims)
    if ranked and dims[tol.ranked_axis % len(dims)] == 1:  # its top 1 is index 0
        axis = tol.ranked_axis % len(dims)
        return (
            "top_k",
            f"top_k ranks the output {{name}} along axis {axis}, of length 1: its top index "
            "is 0 whatever the values, so the check would always pass",
            "judge {name} by its values (atol/rtol, psnr_threshold): a one-channel map has "
            "no classes to rank",
        )
    last = dims[-1]  # the rows are the last axis: the top k where they are taken along it
    along_last = tol.top_k and tol.ranked_axis in (-1, len(dims) - 1)
    if along_last:
        last = tol.top_k if last is None else min(tol.top_k, last)
    if not tol.index_tolerance or last is None or tol.index_tolerance < last:
        return None
    what = f"its top {last}" if along_last else f"rows of {last} (its last axis)"
    return (
        "index_tolerance",
        f"index_tolerance {tol.index_tolerance} leaves nothing of the output {{name}} to "
        f"compare ({what}): Polygraphy's IndicesCompareFunc leaves the last index_tolerance "
        "values of each row out, so it would always pass",
        f"give an index_tolerance below {last}"
        + ("" if along_last else ", or top_k on the scores the indices come from"),
    )


def _compared(tol: dict[str, Tolerance], names: list[str], iters: list) -> None:
    """Exit 2 where a `compare: indices` compares nothing of the dims the data gives (a
    dynamic axis `check` could not read): it would pass whatever the candidate computed."""
    for n in names:
        for dims in dict.fromkeys(np.shape(it[n]) for it in iters if np.size(it[n])):
            found = compares_nothing(tol[n], dims)  # an empty output compares nothing anyway
            if found is None:
                continue
            key, reason, hint = found
            raise UsageError(
                f"accuracy.tolerances ({key}): {reason.format(name=repr(n))}, at the output's "
                f"shape {list(dims)} on this point's data",
                hint=hint.format(name=repr(n)),
            )


def top_indices(output: np.ndarray, k: int, axis: int = -1) -> np.ndarray:
    """The indices of `output`'s `k` largest values along `axis`, as Polygraphy's
    `TopKPostprocessFunc` gives them (a stable argsort of -x, its first k), and where k is
    1 on floats from one argmax, which is that first entry exactly (the first index of the
    largest value) unless a NaN is there (argsort puts NaN last, argmax first). Not on
    integers: -x wraps an unsigned one (and the smallest signed), and Polygraphy's answer
    is the judge's.

    Why: the stable sort orders the whole axis to keep its first entry. On PP-OCRv6's
    recognizer (6,625 classes at each of 8 x 80 positions) that took 0.35 s a tensor, a
    third of `tune`'s judging, against a few milliseconds.
    """
    from polygraphy import util

    a = np.asarray(output)
    if k == 1 and a.ndim and a.shape[axis] and a.dtype.kind == "f" and not np.isnan(a).any():
        return np.expand_dims(np.argmax(a, axis=axis), axis)
    return util.array.topk(a, k, axis)[1]


def _relative(worst: dict[str, Any]) -> str:
    """`, relative 0.2308`, or nothing where the figure is NaN: Polygraphy divides an integer
    output's error by its values without the epsilon a float gets (an index of 0 is 0/0),
    and "relative nan" beside a top-k index output's 224 read as a broken comparison."""
    rel = worst.get("rel")
    return f", relative {rel:.4g}" if rel is not None and rel == rel else ""


def describe(check: str, entry: dict[str, Any], tol: Tolerance) -> str:
    """One check as a report shows it: the measured value next to its threshold."""
    if check == "simple":
        stat = tol.check_error_stat
        if stat == "quantile":
            stat = f"{tol.error_quantile:g} quantile"
        worst = entry.get("worst")
        at = f" (sample {worst['sample']}: {worst['abs']:.4g}{_relative(worst)})" if worst else ""
        return f"atol {tol.atol:g}, rtol {tol.rtol:g} on the {stat}{at}"
    if check == "indices":
        what = f"top-{tol.top_k} indices" if tol.top_k else "indices"
        what += f" along axis {tol.ranked_axis}" if tol.ranked_axis != -1 else ""
        return f"{what} within {entry.get('threshold', 0)} position(s)"
    metric = METRICS[check]
    value, threshold = entry.get("value"), float(entry.get("threshold", float("nan")))
    got = f"{_beside(value, threshold)}{metric.unit}" if value is not None else "–"
    return f"{check} {got} (>= {threshold:.15g}{metric.unit})"


def _beside(value: float, threshold: float) -> str:
    """A metric's value with the digits that keep its side of the threshold: four where they
    do, more where rounding would carry it across.

    Why: a cosine of 0.99999 against a threshold of 0.9999999 was shown `cosine 1 (>= 1)`
    beside FAIL, both rounded to four digits; a figure that seems to pass cannot say why it
    failed.
    """
    for digits in range(4, 18):
        shown = f"{value:.{digits}g}"
        if (float(shown) >= threshold) == (value >= threshold):
            return shown
    return repr(value)
