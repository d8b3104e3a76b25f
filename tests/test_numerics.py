"""A tensor's data peak: the same number on the quick path and the masked one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtbuild.numerics import LOW_EPS, LOW_INF_AT, LOW_MAX, LOW_TINY, data_peak, finite_peak

MIN = float(np.finfo(np.float32).min)  # Hugging Face's mask value, -3.4e38


def test_data_peak_leaves_sentinels_and_nan_out():
    assert data_peak(np.array([MIN, 3.0, -7.0, np.nan], np.float32)) == 7.0


@pytest.mark.parametrize(
    ("values", "peak"),
    [
        ([-7.0, 3.0], 7.0),  # all data: the two reductions
        ([-7.0, 3.0, np.inf], 7.0),  # the masked copy
        ([np.nan], 0.0),
        ([-0.0], 0.0),
        ([], 0.0),
    ],
)
def test_data_peak_is_the_largest_finite_magnitude(values, peak):
    got = data_peak(np.array(values, np.float32))
    assert got == peak and not np.signbit(got)  # -0.0 would print as a peak of "-0.0"


def test_data_peak_is_exact_in_the_tensors_own_dtype():
    values = np.array([1.0, -65504.0], np.float16)
    assert data_peak(values) == data_peak(values.astype(np.float64)) == 65504.0


def test_the_low_ranges_are_the_types_own():
    import ml_dtypes

    for low, kind in (("fp16", np.float16), ("bf16", ml_dtypes.bfloat16)):
        info = ml_dtypes.finfo(kind)
        assert (LOW_TINY[low], LOW_MAX[low]) == (float(info.smallest_normal), float(info.max))
        assert LOW_EPS[low] == float(info.eps)
        inf_at = np.float32(LOW_INF_AT[low])  # an FP32 tensor's value, stored in the low type
        with np.errstate(over="ignore"):
            assert np.isinf(inf_at.astype(kind))
            assert np.isfinite(np.nextafter(inf_at, np.float32(0)).astype(kind))


@pytest.mark.parametrize(
    "values",
    [
        np.array([1.5, -3.25, 2.0], dtype=np.float32),
        np.array([1.0, np.inf, -7.0]),  # a non-finite value is no peak
        np.array([np.nan, -2.0, 0.5], dtype=np.float16),
        np.array([np.inf, -np.inf, np.nan]),  # none finite
        np.array([-0.0]),
        np.array([], dtype=np.float32),
        np.array([[3, -9], [4, 1]], dtype=np.int64),
        np.array([1e30, -2e30], dtype=np.float32),  # sentinels are values here
    ],
)
def test_finite_peak_is_the_largest_finite_magnitude(values):
    """Two reductions where every value is finite; the same answer as the mask's."""
    finite = np.abs(values)[np.isfinite(np.abs(values))]
    want = float(finite.max()) if finite.size else 0.0
    got = finite_peak(values)
    assert got == want and isinstance(got, float) and math.copysign(1, got) == 1
