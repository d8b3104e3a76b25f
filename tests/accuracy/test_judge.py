"""The judge's divergence: sentinels are not data, NaN always diverges, overflow is caught.

Each case is walked twice: against the reference's tensor (`build`'s
divergence) and from the reference's measures alone (`tune`'s overflow-only
walk); both must find the same overflow.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest

from tests.helpers import F, model, node
from trtbuild.accuracy.judge import divergence
from trtbuild.accuracy.reference import ReferenceMeasures
from trtbuild.cli import main
from trtbuild.numerics import measure_peak, sentinels

MIN = float(np.finfo(np.float32).min)  # Hugging Face's mask value, -3.4e38


def _measures(r: np.ndarray) -> ReferenceMeasures:
    peak, plain = measure_peak(r)
    return ReferenceMeasures(
        order=[("t", "n", "Add")],
        ranges={"t": peak},
        sentinel_tensors=frozenset({"t"}) if sentinels(r).any() else frozenset(),
        internals={},
        first_peaks={"t": peak},
        sizes={"t": r.nbytes},
        shapes={"t": r.shape},
        special={} if plain else {"t": r},
    )


def _diverges(r, e) -> tuple[dict | None, dict]:
    r, e = np.asarray(r, np.float32), np.asarray(e, np.float32)
    with np.errstate(all="ignore"):
        first, curve, overflow = divergence(_measures(r), {"t": e}, {"t": r}, threshold=0.05)
        _, no_curve, alone = divergence(_measures(r), {"t": e}, None, threshold=0.05)
    assert no_curve == [] and overflow == alone  # the overflow-only walk agrees
    return first, curve[0]


def test_a_sentinel_that_becomes_inf_of_the_same_sign_is_not_a_divergence():
    first, point = _diverges([MIN, 0.5, 1.0], [-np.inf, 0.5, 1.0])
    assert first is None and point["nonfinite"] == 0
    assert point["ref_max_abs"] == 1.0  # the scale is the data's, not the sentinel's


def test_nan_where_the_reference_holds_a_sentinel_is_a_divergence():
    first, point = _diverges([MIN, 0.5, 1.0], [np.nan, 0.5, 1.0])
    assert first is not None and "NaN" in first["reason"] and point["nonfinite"] == 1


def test_nan_where_the_reference_is_data_is_a_divergence():
    first, _ = _diverges([0.0, 0.5, 1.0], [np.nan, 0.5, 1.0])  # 0 x -inf in FP16
    assert first is not None and "1 NaN" in first["reason"]


def test_inf_of_the_opposite_sign_is_a_divergence():
    first, _ = _diverges([MIN, 0.5, 1.0], [np.inf, 0.5, 1.0])
    assert first is not None


def test_an_ordinary_value_near_fp16_max_that_overflows_is_still_caught():
    first, point = _diverges([70000.0, 1.0], [np.inf, 1.0])  # data, not a sentinel
    assert first is not None and "inf" in first["reason"] and point["nonfinite"] == 1


def test_the_error_skips_values_the_reference_itself_holds_as_inf():
    _, clean = _diverges([0.0, 1.0], [0.25, 1.0])
    _, beside_inf = _diverges([np.inf, 0.0, 1.0], [np.inf, 0.25, 1.0])  # inf in both: no error
    assert clean["rel_error"] == beside_inf["rel_error"] == 0.25
    assert clean["nonfinite"] == beside_inf["nonfinite"] == 0


def test_a_scalar_tensor_is_measured_too():
    _, point = _diverges(np.float32(2.0), np.float32(2.5))
    assert point["rel_error"] == 0.25


@pytest.mark.parametrize("e", [[np.inf, 1.0], [np.nan, 1.0], [-np.inf, np.nan]])
def test_the_overflow_only_walk_reports_the_same_point(e):
    r = np.asarray([3.0, 1.0], np.float32)
    with np.errstate(all="ignore"):
        _, _, overflow = divergence(_measures(r), {"t": np.asarray(e, np.float32)}, None, 0.05)
    assert overflow is not None and overflow["nonfinite"] == int(np.count_nonzero(~np.isfinite(e)))
    assert overflow["ref_max_abs"] == 3.0 and overflow["node"] == "n"


@pytest.mark.parametrize("seed", range(12))
def test_the_blockwise_difference_is_the_exact_float64_maximum(seed):
    """Large tensors take |e - r| in float32 blocks first; the maximum must stay exact."""
    from trtbuild.accuracy.judge import _BLOCK, _max_abs_diff

    rng = np.random.default_rng(seed)
    n = int(rng.integers(_BLOCK + 1, 3 * _BLOCK))
    r = rng.normal(size=n).astype(np.float32) * float(rng.choice([1e-3, 1.0, 1e4]))
    noise = rng.normal(size=n).astype(np.float32) * float(rng.choice([1e-7, 1e-3, 1.0]))
    e = (r + noise).astype(np.float16 if seed % 3 == 0 else np.float32)
    want = float(np.abs(np.subtract(e, r, dtype=np.float64)).max())
    assert _max_abs_diff(r, e) == want
    with np.errstate(all="ignore"):
        e[n // 2] = np.inf if seed % 2 else np.nan
    assert not np.isfinite(_max_abs_diff(r, e))


@pytest.mark.parametrize("n", [7, (1 << 20) + 7])  # the whole-tensor path and the block path
def test_the_difference_without_an_abs_pass_keeps_every_edge(n):
    """max |d| taken as max(max d, -min d): +0.0 where every difference is -0.0 (as |d|
    gives), the largest negative difference, and NaN or inf where a value is not finite."""
    from trtbuild.accuracy.judge import _max_abs_diff

    zeros = np.zeros(n, np.float32)
    got = _max_abs_diff(zeros, -zeros)  # (-0.0) - (+0.0) = -0.0 everywhere
    assert got == 0.0 and np.copysign(1.0, got) == 1.0
    e = zeros.copy()
    e[n // 3], e[n // 2] = -3.5, 2.0
    assert _max_abs_diff(zeros, e) == 3.5
    e[1] = np.nan
    assert np.isnan(_max_abs_diff(zeros, e))
    e[1] = -np.inf
    assert _max_abs_diff(zeros, e) == np.inf


def test_a_decision_whose_indices_differ_diverges_by_any_index():
    """Indices (an ArgMin's) are not a range: one flipped of 40 (2.5%, under the 5% threshold
    of a float tensor's range) is a divergence, named."""
    r = np.arange(40, dtype=np.int64) % 7
    e = r.copy()
    e[5] += 1
    measures = replace(_measures(r.astype(np.float32)), ranges={}, first_peaks={}, special={})
    first, curve, _ = divergence(measures, {"t": e}, {"t": r}, 0.05)
    assert first["reason"].startswith("1 of 40 indices differ from FP32's (2.50%)"), first
    assert curve[0]["differ"] == 1 and curve[0]["rel_error"] == 0.025
    assert divergence(measures, {"t": r.copy()}, {"t": r}, 0.05)[0] is None


def test_a_codebook_lookup_fp16_flips_is_named_at_its_argmin(tmp_path, capsys):
    """A VQ model's nearest code: |x|^2 + |c|^2 - 2 x.c, whose terms FP16 stores to 0.5 (~882)
    where the codes near x are 0.02 apart, flips in FP16. Far codes spread the distances to
    ~900, so no float tensor is off by 5% of its range: the ArgMin is the first divergence."""
    rng = np.random.default_rng(0)
    near = 10.5 + rng.normal(0, 0.05, (16, 8))
    codes = np.concatenate([near, rng.normal(0, 1, (16, 8))]).astype(np.float32)
    m = model(
        [node("Mul", ["x", "x"], "xx", "square"),
         node("ReduceSum", ["xx", "one"], "x2", "x_norm", keepdims=1),
         node("MatMul", ["x", "codes_t"], "xc", "dot"),
         node("Mul", ["xc", "two"], "xc2", "twice"),
         node("Sub", ["x2", "xc2"], "part", "sub"),
         node("Add", ["part", "c2"], "dist", "distance"),
         node("ArgMin", ["dist"], "idx", "argmin", axis=1, keepdims=0),
         node("Gather", ["codes", "idx"], "y", "lookup", axis=0)],
        [("x", F, [16, 8])],
        [("y", F, [16, 8])],
        {"one": np.array([1]), "codes_t": codes.T.copy(), "two": np.array(2.0, np.float32),
         "c2": (codes**2).sum(1)[None, :], "codes": codes},
    )  # fmt: skip
    onnx.save(m, tmp_path / "vq.onnx")
    np.savez(tmp_path / "x.npz", x=(10.5 + rng.normal(0, 0.05, (2, 16, 8))).astype(np.float32))
    policy = tmp_path / "vq.yaml"
    policy.write_text(
        "version: 1\nmodel: vq.onnx\ninputs:\n  x:\n    shape: [16, 8]\n"
        "    data: {file: x.npz}\naccuracy:\n  samples: 2\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 1
    first = json.loads((out / "report.json").read_text())["first_divergence"]
    assert first["node"] == "argmin" and "indices differ from FP32's" in first["reason"], first
