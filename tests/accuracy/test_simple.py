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
    """Half, float and double, each side its own type, each once with only numbers and once
    with the specials: zeros in the second output (divided by), infinities of both signs
    on both sides and against a number, a NaN on either side, ties; an empty output; a
    pair within every tolerance."""
    rng = np.random.default_rng(0)
    found = []
    for dt0 in (np.float16, np.float32, np.float64):
        for dt1 in (np.float16, np.float32, np.float64):
            a = rng.normal(size=(3, 41)).astype(dt0)
            b = (a.astype(np.float64) + rng.normal(0, 1e-2, a.shape)).astype(dt1)
            b[2, :10] = a[2, :10]  # ties: an error of exactly 0
            found.append((a.copy(), b.copy()))  # numbers only: every statistic a number
            b[0, :5], b[0, 5] = 0.0, -0.0  # zeros to divide by
            found.append((a.copy(), b.copy()))
            a[1, 0], b[1, 0] = np.inf, np.inf
            a[1, 1], b[1, 1] = -np.inf, 3.0
            a[1, 4], b[1, 5] = 7.0, -np.inf
            found.append((a.copy(), b.copy()))
            a[1, 2], b[2, 3] = np.nan, np.nan
            found.append((a, b))
            found.append((a[:, :0], b[:, :0]))
    clean = rng.normal(size=(5, 7)).astype(np.float32)
    found.append((clean, clean + np.float32(1e-4)))  # within every tolerance below
    for spoiled in (np.nan, np.inf):  # within every tolerance but at one element: a NaN
        near = clean + np.float32(1e-4)  # error there, or an inf one whose relative is NaN
        near[2, 3] = spoiled
        found.append((clean, near))
    ints = rng.integers(0, 4, (6, 6))
    found.append((ints.astype(np.float32), (ints + (ints == 2)).astype(np.float32)))
    return found


def _random_pairs(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded random pairs of every scale, a share of their values special (zeros, both
    infinities, a NaN, FP16's largest, subnormals), half the time with small errors only."""
    rng = np.random.default_rng(1)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-8, 65504.0, 7e4, 1e-30, 5e-324]
    types = (np.float16, np.float32, np.float64)
    found = []
    for _ in range(n):
        a = rng.normal(0, 10 ** rng.uniform(-4, 3), size=(4, 9))
        b = a * (1 + rng.normal(0, 10 ** rng.uniform(-5, -1), a.shape))
        for x in (a, b) if rng.random() < 0.5 else ():
            mask = rng.random(x.shape) < 0.2
            x[mask] = rng.choice(specials, size=int(mask.sum()))
        with np.errstate(all="ignore"):
            found.append((a.astype(rng.choice(types)), b.astype(rng.choice(types))))
    return found


def _equal(x, y) -> bool:
    if x is None or y is None:
        return x is y
    return (math.isnan(x) and math.isnan(y)) or x == y


def _compare(cls, a: np.ndarray, b: np.ndarray, **args):
    from polygraphy.comparator.struct import IterationResult

    ref, cand = (IterationResult({"o": x}, runner_name=n) for x, n in ((a, "r"), (b, "c")))
    with quiet_polygraphy():
        return cls(**args)(ref, cand)["o"]


@pytest.mark.parametrize("stat", ["max", "mean", "median", "quantile", "elemwise"])
def test_every_field_and_verdict_is_polygraphys(stat):
    """The cases above and 120 random ones, at three tolerances: the same result, field by
    field, and the outputs compared left as they were (Polygraphy copies the second before
    it adds to its zeros)."""
    from polygraphy.comparator import SimpleCompareFunc

    from trtbuild.accuracy.simple import QuietSimpleCompareFunc

    verdicts, numbers = set(), 0
    for a, b in _pairs() + _random_pairs(120):
        kept = (a.copy(), b.copy())
        for atol, rtol in ((1e-2, 0.0), (0.0, 1e-1), (5e-3, 5e-2)):
            args = {"atol": atol, "rtol": rtol, "check_error_stat": stat, "error_quantile": 0.9}
            want = _compare(SimpleCompareFunc, a, b, **args)
            got = _compare(QuietSimpleCompareFunc, a, b, **args)
            assert type(got) is type(want) and bool(got) == bool(want)
            verdicts.add(bool(want))
            for f in FIELDS:
                assert _equal(getattr(got, f), getattr(want, f)), (stat, a.dtype, b.dtype, f)
            assert got.thresholds.__dict__ == want.thresholds.__dict__
            numbers += all(math.isfinite(getattr(want, f) or 0.0) for f in FIELDS)
        np.testing.assert_array_equal(a, kept[0])
        np.testing.assert_array_equal(b, kept[1])
    assert verdicts == {True, False}  # both verdicts were compared
    assert numbers > 150  # many of them on numbers, not on NaNs alike


def test_a_judge_without_verbose_compares_with_the_quiet_class(monkeypatch):
    """`checks._simple` takes the quiet class unless verbose, when Polygraphy's own runs
    (its log shown): the same results either way (`test_checks`)."""
    from polygraphy.comparator import SimpleCompareFunc
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy import checks
    from trtbuild.accuracy.simple import QuietSimpleCompareFunc
    from trtbuild.policy.specs import Tolerance

    used = []
    compare = checks._Pair.compare

    def spied(self, names, func, *args, **kwargs):
        used.append(type(func))
        return compare(self, names, func, *args, **kwargs)

    monkeypatch.setattr(checks._Pair, "compare", spied)
    y = np.arange(4, dtype=np.float32)
    for verbose in (False, True):
        ref = [IterationResult({"y": y}, runner_name="r")]
        out = [IterationResult({"y": y + 1}, runner_name="c")]
        checks.run_checks(ref, out, "c", {"y": Tolerance(atol=1e-3, rtol=0.0)}, verbose)
    simple = [t for t in used if issubclass(t, SimpleCompareFunc)]
    assert simple == [QuietSimpleCompareFunc, SimpleCompareFunc]


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


def test_it_computes_no_statistics_for_the_log(monkeypatch):
    """What the class is for: Polygraphy's log line of the errors' statistics is not made."""
    from polygraphy.comparator import SimpleCompareFunc
    from polygraphy.comparator import util as comp_util

    from trtbuild.accuracy.simple import QuietSimpleCompareFunc

    calls = []
    original = comp_util.str_output_stats
    monkeypatch.setattr(
        comp_util, "str_output_stats", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    a = np.arange(12, dtype=np.float32)
    _compare(QuietSimpleCompareFunc, a, a + 1, atol=1e-3, rtol=0.0, check_error_stat="max")
    assert calls == []
    _compare(SimpleCompareFunc, a, a + 1, atol=1e-3, rtol=0.0, check_error_stat="max")
    assert calls  # the probe sees Polygraphy's own
