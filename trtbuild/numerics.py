"""Numeric facts every stage shares: the low-precision ranges and what a sentinel is.

Why one module at the bottom: the converter warns about weights beyond FP16,
the guards pin their consumers, the reference measures ranges, the judge and
`tune` decide what an overflow is. If each kept its own 65504 or its own idea
of a sentinel, two stages could disagree about the same tensor.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: numpy.typing is no import a start-up pays for
    from numpy.typing import DTypeLike

FP16_MAX = 65504.0
BF16_MAX = 3.3895313892515355e38
LOW_MAX = {"fp16": FP16_MAX, "bf16": BF16_MAX}
# The smallest normal value of each low type (BF16 has FP32's exponent): below it a value
# keeps only a few bits, or none (a Q/DQ scale there stays FP32)
FP16_TINY = 2.0**-14
BF16_TINY = 2.0**-126
LOW_TINY = {"fp16": FP16_TINY, "bf16": BF16_TINY}
# One step at 1.0 in each low type (machine epsilon); storing a value rounds it by at most
# half a step, relatively
LOW_EPS = {"fp16": 2.0**-10, "bf16": 2.0**-7}
# The largest integer up to which each low type holds every integer exactly (2048 in FP16,
# 256 in BF16): a shape's dimension or an index past it rounds
LOW_WHOLE = {low: int(2 / eps) for low, eps in LOW_EPS.items()}
# A periodic op's argument (sin, cos) whose storage alone moves the result by more than this
# (in radians: 1% of the output's amplitude) needs FP32. From LOW_PHASE_MAX on (a power of
# two), the low type's half step passes it: FP16 rounds |x| in [32, 64) by up to 1/64 and
# in [16, 32) by at most 1/128; BF16 passes it from 4 on
PHASE_ERROR = 0.01
LOW_PHASE_MAX = {
    low: 2.0 ** math.ceil(math.log2(PHASE_ERROR * 2 / eps)) for low, eps in LOW_EPS.items()
}


# The smallest |x| each low type rounds to infinity: half a step past its largest value
# (round to nearest even), 65520 for FP16
def _half_step_past(top: float, eps: float) -> float:
    """Half a step past a float type's largest value `top` (`eps`: its machine epsilon)."""
    return top + eps * 2.0 ** (math.frexp(top)[1] - 1) / 2


LOW_INF_AT = {low: _half_step_past(top, LOW_EPS[low]) for low, top in LOW_MAX.items()}


def inf_at(dtype: DTypeLike) -> float:
    """The smallest |x| a numpy float type rounds to infinity, as `LOW_INF_AT` (65520 for
    float16): what a value of that type can be fed or stored as without turning inf."""
    info = np.finfo(dtype)
    return _half_step_past(float(info.max), float(info.eps))


def not_held(values: np.ndarray, dtype: DTypeLike) -> np.ndarray:
    """Where numbers `values` are no values of the numeric type `dtype`: a float type's inf
    (from `inf_at` on; below, a value rounds to the largest), an integer type's fraction or
    value past its limits, a boolean's anything but 0 and 1. Why one test: a file's values,
    a uniform range, a normal draw and image pixels are each checked before they are fed
    (numpy's cast wraps or overflows without a word)."""
    want, values = np.dtype(dtype), np.asarray(values)
    if want.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            return ~np.isfinite(values.astype(want))
    if want.kind == "b":
        return (values != 0) & (values != 1)
    info = np.iinfo(want)
    whole = values == np.floor(values) if values.dtype.kind == "f" else True
    return ~(whole & (values >= info.min) & (values <= info.max))


def holds(dtype: DTypeLike) -> str:
    """What `not_held` lets through, as messages say it: `±65504`, `0 to 255`, `0 or 1`."""
    want = np.dtype(dtype)
    if want.kind == "f":
        return f"±{float(np.finfo(want).max):g}"
    if want.kind == "b":
        return "0 or 1"
    return f"{np.iinfo(want).min} to {np.iinfo(want).max}"


# What Polygraphy's simple compare adds to a zero of the reference before dividing by it
# (its own constant, local to its method): the relative error every figure divides by.
RELATIVE_EPSILON = 2.220446049250313e-16

# Hugging Face exports write masks as `(1 - mask) * finfo(float32).min`: -3.4e38
# is a sentinel meaning "never attend", not data. A value this large carries no
# magnitude information; only its sign does.
SENTINEL_ABS = 1e30

# The oldest compute capability with TensorRT kernels of each format that needs one: FP8
# from Ada (SM89), BF16 from Ampere (SM80); the others run everywhere TensorRT does.
MIN_CAPABILITY = {"fp8": (8, 9), "bf16": (8, 0)}


def oldest_capability(fmt: str) -> str:
    """`MIN_CAPABILITY[fmt]` as policies write it ("8.9"), for messages."""
    major, minor = MIN_CAPABILITY[fmt]
    return f"{major}.{minor}"


def has_kernels(capability: str, fmt: str) -> bool:
    """Does a compute capability ("8.9") have kernels of `fmt` ("fp8", "bf16", ...)?"""
    major, _, minor = capability.partition(".")
    try:
        return (int(major), int(minor or 0)) >= MIN_CAPABILITY.get(fmt, (0, 0))
    except ValueError:
        return False


def sentinels(values: np.ndarray) -> np.ndarray:
    """Boolean mask of the sentinel positions of an FP32 reference tensor."""
    with np.errstate(invalid="ignore"):
        return np.abs(values) >= SENTINEL_ABS


def finite_peak(values: np.ndarray) -> float:
    """Largest finite |value|, sentinels included (an internal sum is never a sentinel).

    Why two reductions first: where every value is finite (almost always), the peak is
    max(max, -min), with no copy of the array; only a non-finite one needs the mask
    (16M float64 values: 0.01 s instead of 0.05 s; the reference's risk measures take
    several peaks of each normalization's tensors).
    """
    a = np.asarray(values)
    if not a.size:
        return 0.0
    peak = _extreme(a)
    if math.isfinite(peak):
        return peak
    a = np.abs(a)
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


def measure_peak(values: np.ndarray) -> tuple[float, bool]:
    """(`data_peak`, whether every value is data: finite and no sentinel), in one pass.

    Why both: a tensor whose every value is data needs no element-wise reference
    to tell where a candidate overflows; the reference keeps only the others.
    """
    a = np.asarray(values)
    if not a.size:
        return 0.0, True
    peak = _extreme(a)
    if peak < SENTINEL_ABS:  # False for NaN and inf
        return peak, True
    a = np.abs(a.astype(np.float64))
    with np.errstate(invalid="ignore"):
        a = a[np.isfinite(a) & (a < SENTINEL_ABS)]
    return (float(a.max()) if a.size else 0.0), False


def _extreme(a: np.ndarray) -> float:
    """max |value| of a non-empty array from two reductions and no copy: NaN where any
    value is NaN, inf where one is infinite (the callers' cue for their masked copy)."""
    with np.errstate(invalid="ignore"):
        return abs(max(float(a.max()), -float(a.min())))  # abs: -0.0


def data_peak(values: np.ndarray) -> float:
    """Largest finite |value| that is data (sentinels and NaN aside); 0 for an empty tensor.

    Two reductions in the tensor's own dtype when every value is data (the usual
    case: the reference measures every tensor of every feed); the masked copy
    only when a NaN, an inf or a sentinel is there. Either way the same number:
    |x| and the widening to float are exact.
    """
    return measure_peak(values)[0]


def sentinel_kept(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Where `out` keeps a sentinel of `ref`: same sign, still beyond the sentinel threshold.

    Why this is not a divergence: -3.4e38 becomes -inf in FP16, and both mean
    "masked"; Softmax gives the same zero for either. A NaN, or an inf of the
    opposite sign, is a real divergence and stays one.
    """
    with np.errstate(invalid="ignore"):
        return (
            sentinels(ref)
            & (np.sign(out) == np.sign(ref))
            & (np.abs(out) >= SENTINEL_ABS)
            & ~np.isnan(out)
        )
