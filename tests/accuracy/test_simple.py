"""The quiet simple comparison against Polygraphy's own: every field and verdict equal."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtbuild.accuracy.sessions import quiet_polygraphy

FIELDS = (
    "max_absdiff",
    "max_reldiff",
    "mean_absdiff",
    "mean_reldiff",
    "median_absdiff",
    "median_reldiff",
    "quantile_absdiff",
    "quantile_reldiff",
)


def _pairs() -> list[tuple[np.ndarray, np.ndarray]]:
    """Ties, both zeros in the second output, infinities of both signs, a NaN on either
    side; half, float and double, each side its own type; an empty output; a pair within
    every tolerance."""
    rng = np.random.default_rng(0)
    found = []
    for dt0 in (np.float16, np.float32, np.float64):
        for dt1 in (np.float16, np.float32, np.float64):
            a = rng.normal(size=(3, 41)).astype(dt0)
            b = (a.astype(np.float64) + rng.normal(0, 1e-2, a.shape)).astype(dt1)
            b[0, :5], b[0, 5] = 0.0, -0.0  # zeros to divide by
            a[1, 0], b[1, 0] = np.inf, np.inf
            a[1, 1], b[1, 1] = -np.inf, 3.0
            a[1, 2], b[2, 3] = np.nan, np.nan
            b[2, :10] = a[2, :10]  # ties: an error of exactly 0
            found.append((a, b))
            found.append((a[:, :0], b[:, :0]))
    clean = rng.normal(size=(5, 7)).astype(np.float32)
    found.append((clean, clean + np.float32(1e-4)))  # within every tolerance below
    ints = rng.integers(0, 4, (6, 6))
    found.append((ints.astype(np.float32), (ints + (ints == 2)).astype(np.float32)))
    return found


def _equal(x, y) -> bool:
    if x is None or y is None:
        return x is y
    return (math.isnan(x) and math.isnan(y)) or x == y


@pytest.mark.parametrize("stat", ["max", "mean", "median", "quantile", "elemwise"])
def test_every_field_and_verdict_is_polygraphys(stat):
    from polygraphy.comparator import SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.simple import QuietSimpleCompareFunc

    verdicts = set()
    for a, b in _pairs():
        for atol, rtol in ((1e-2, 0.0), (0.0, 1e-1), (5e-3, 5e-2)):
            args = {"atol": atol, "rtol": rtol, "check_error_stat": stat, "error_quantile": 0.9}
            ref, cand = (IterationResult({"o": x}, runner_name=n) for x, n in ((a, "r"), (b, "c")))
            with quiet_polygraphy():
                want = SimpleCompareFunc(**args)(ref, cand)["o"]
                got = QuietSimpleCompareFunc(**args)(ref, cand)["o"]
            assert type(got) is type(want)
            assert bool(got) == bool(want)
            verdicts.add(bool(want))
            for f in FIELDS:
                assert _equal(getattr(got, f), getattr(want, f)), (stat, a.dtype, b.dtype, f)
            assert got.thresholds.__dict__ == want.thresholds.__dict__
    assert verdicts == {True, False}  # both verdicts were compared


def test_what_it_does_not_compute_is_polygraphys_own():
    """Integer and boolean outputs, and infinities compared equal, go to Polygraphy's method:
    the same results, whatever this class would have computed."""
    from polygraphy.comparator import SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.simple import QuietSimpleCompareFunc

    inf = np.array([np.inf, 1.0, 2.0], np.float32)
    cases = [
        ({}, np.array([1, 2, 3], np.int64), np.array([1, 2, 5], np.int64)),
        ({}, np.array([True, False]), np.array([True, True])),
        ({"infinities_compare_equal": True}, inf, inf + np.float32(1e-3)),
    ]
    for extra, a, b in cases:
        args = {"atol": 1e-3, "rtol": 0.0, "check_error_stat": "max", **extra}
        ref, cand = (IterationResult({"o": x}, runner_name=n) for x, n in ((a, "r"), (b, "c")))
        with quiet_polygraphy():
            want = SimpleCompareFunc(**args)(ref, cand)["o"]
            got = QuietSimpleCompareFunc(**args)(ref, cand)["o"]
        assert bool(got) == bool(want)
        for f in FIELDS:
            assert _equal(getattr(got, f), getattr(want, f)), (a.dtype, extra, f)
    # matching infinities compared equal: an error of 0 there, where this class's own
    # arithmetic (inf - inf) would have made a NaN: Polygraphy's method ran
    assert got.max_absdiff == pytest.approx(1e-3, rel=1e-3)


def test_it_computes_no_statistics_for_the_log():
    """What the class is for: Polygraphy's log line of the errors' statistics is not made."""
    from polygraphy.comparator import util as comp_util
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.simple import QuietSimpleCompareFunc

    calls = []
    original = comp_util.str_output_stats
    comp_util.str_output_stats = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        a = np.arange(12, dtype=np.float32)
        ref, cand = (IterationResult({"o": x}, runner_name=n) for x, n in ((a, "r"), (a + 1, "c")))
        with quiet_polygraphy():
            QuietSimpleCompareFunc(atol=1e-3, rtol=0.0, check_error_stat="max")(ref, cand)
        assert calls == []
        with quiet_polygraphy():
            from polygraphy.comparator import SimpleCompareFunc

            SimpleCompareFunc(atol=1e-3, rtol=0.0, check_error_stat="max")(ref, cand)
        assert calls  # the probe sees Polygraphy's own
    finally:
        comp_util.str_output_stats = original
