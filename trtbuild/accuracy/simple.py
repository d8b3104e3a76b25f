"""Polygraphy's `SimpleCompareFunc`, without the statistics of a log nobody reads.

Why: Polygraphy's simple comparison computes, besides the statistics it judges, a
line of statistics of the absolute and the relative error for its log (std, var,
median, p90, p95, p99 of each), whether or not that log is shown: eight more
partitions of the output. On a 1024x1024 matte that was 0.13 s a sample instead of
0.04 s, and a fifth of what `tune` spent on modnet (its trials judge a matte each).

What is kept Polygraphy's: its `__call__` (which outputs, their options, the shapes
aligned), its statistics functions (`comparator.util`), its result
(`OutputCompareResult`) and verdict (`SimpleThreshold`, or the elemwise verdict the
result stores, a public argument). Only the log's lines are left out (and the heatmaps
and plots, which trtbuild never asks for), and the cases this module does not take
(integer or boolean outputs, matching infinities compared equal) are Polygraphy's own
method.
A test holds every field and verdict equal to Polygraphy's on ties, zeros, infinities,
NaNs, and half and double values. `--verbose` runs Polygraphy's own function, its
log shown (`checks._Pair.compare`).
"""

from __future__ import annotations

import copy

import numpy as np
from polygraphy.comparator import OutputCompareResult, SimpleCompareFunc, SimpleThreshold
from polygraphy.comparator import util as comp_util
from polygraphy.util import array

from trtbuild.numerics import RELATIVE_EPSILON

_FLOATS = (np.float16, np.float32, np.float64)


class QuietSimpleCompareFunc(SimpleCompareFunc):
    """`SimpleCompareFunc` whose outputs' comparison computes what it judges and returns,
    not its log's statistics; the same arguments, results and verdicts."""

    def _check_outputs_match(
        self,
        out0,
        out0_name,
        out1,
        out1_name,
        per_out_rtol,
        per_out_atol,
        per_out_err_stat,
        runner0_name,
        runner1_name,
        per_out_quantile,
    ):
        if not self._takes(out0, out1, per_out_err_stat):
            return super()._check_outputs_match(
                out0,
                out0_name,
                out1,
                out1_name,
                per_out_rtol=per_out_rtol,
                per_out_atol=per_out_atol,
                per_out_err_stat=per_out_err_stat,
                runner0_name=runner0_name,
                runner1_name=runner1_name,
                per_out_quantile=per_out_quantile,
            )
        absdiff = array.abs(array.subtract(comp_util.cast_up(out0), comp_util.cast_up(out1)))
        out1_with_eps = copy.copy(comp_util.cast_up(out1))
        out1_with_eps[out1_with_eps == 0] += RELATIVE_EPSILON
        reldiff = array.divide(absdiff, array.abs(out1_with_eps))
        judged = {"max": comp_util.compute_max, "mean": comp_util.compute_mean}
        judged["median"] = comp_util.compute_median
        if per_out_err_stat == "quantile":
            judged["quantile"] = lambda d: comp_util.compute_quantile(d, per_out_quantile)
        stats = {  # by keyword: a field moved in a later Polygraphy fails, not misplaced
            f"{name}_{kind}diff": judged[name](diff) if name in judged else None
            for kind, diff in (("abs", absdiff), ("rel", reldiff))
            for name in ("max", "mean", "median", "quantile")
        }
        passed = None
        if per_out_err_stat == "elemwise":
            mismatches = (array.greater(absdiff, per_out_atol) | array.isnan(absdiff)) & (
                array.greater(reldiff, per_out_rtol) | array.isnan(reldiff)
            )
            passed = not bool(array.any(mismatches))
        threshold = SimpleThreshold(per_out_err_stat, per_out_atol, per_out_rtol)
        return OutputCompareResult(**stats, thresholds=threshold, passed=passed)

    def _takes(self, out0, out1, stat: str) -> bool:
        """Whether this comparison is one this class computes (else Polygraphy's method):
        numpy floats, a statistic Polygraphy knows, infinities not compared equal."""
        return (
            isinstance(out0, np.ndarray)
            and isinstance(out1, np.ndarray)
            and out0.dtype in _FLOATS
            and out1.dtype in _FLOATS
            and stat in ("max", "mean", "median", "quantile", "elemwise")
            and not self.infinities_compare_equal
        )
