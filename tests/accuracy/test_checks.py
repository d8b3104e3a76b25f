"""Task metrics by Polygraphy's compare functions: every check given must hold, and only those.

Real models, real ONNX Runtime runs: NAFNet's restored image for PSNR, the real
PP-OCRv4 recognizer's character probabilities for cosine similarity and top-k.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import NAFNET_POLICY, PINS
from trtbuild.cli import main


def _report(tmp_path, text: str, name: str) -> dict:
    policy = tmp_path / f"{name}.yaml"
    policy.write_text(text)
    out = tmp_path / name
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    report = json.loads((out / "report.json").read_text())
    assert code == (0 if report["passed"] else 1)
    return report


def _nafnet(nafnet_path, restored: str) -> str:
    text = NAFNET_POLICY.format(model=nafnet_path, rules=PINS, backend="none")
    return text + f"    outputs:\n      restored: {restored}\n"


def test_psnr_fails_where_atol_passes_and_the_reverse(tmp_path, nafnet_path):
    loose = _report(tmp_path, _nafnet(nafnet_path, "{atol: 1.0, rtol: 0}"), "loose")
    assert loose["outputs"]["restored"]["passed"]
    psnr = loose["outputs"]["restored"]["psnr"]
    assert 40 < psnr < 120  # Polygraphy's PSNR, shown without a threshold too

    strict_psnr = _report(
        tmp_path, _nafnet(nafnet_path, f"{{atol: 1.0, rtol: 0, psnr_threshold: {psnr + 10}}}"), "p"
    )
    out = strict_psnr["outputs"]["restored"]
    assert not out["passed"] and out["checks"]["simple"]["passed"]
    assert not out["checks"]["psnr"]["passed"] and out["checks"]["psnr"]["threshold"] == psnr + 10

    tight = _report(tmp_path, _nafnet(nafnet_path, "{atol: 1e-7, rtol: 0}"), "tight")
    assert not tight["outputs"]["restored"]["passed"]
    text = NAFNET_POLICY.format(model=nafnet_path, rules=PINS, backend="none").replace(
        "default: {atol: 1e-2, rtol: 1e-2, check_error_stat: median}",
        f"default: {{psnr_threshold: {psnr - 10}}}\n    outputs: {{total: {{rtol: 1e-2}}}}",
    )
    out = _report(tmp_path, text, "q")["outputs"]["restored"]
    assert out["passed"] and list(out["checks"]) == ["psnr"]  # no atol check was asked for


def test_quantile_is_polygraphys(tmp_path, nafnet_path):
    text = _nafnet(
        nafnet_path, "{atol: 1e-3, rtol: 0, check_error_stat: quantile, error_quantile: 0.5}"
    )
    report = _report(tmp_path, text, "quantile")
    out = report["outputs"]["restored"]
    assert out["checks"]["simple"]["passed"] == (out["median_abs"] <= 1e-3)


def test_cosine_and_top_k_on_the_real_recognizer(example_policy, tmp_path):
    tol = "{cosine_similarity_threshold: 0.999, compare: indices, top_k: 3, index_tolerance: 1}"
    policy = example_policy(
        "ppocrv4_rec",
        replace={
            "default: {atol: 1e-3, rtol: 1e-2, check_error_stat: median}": f"default: {tol}",
            "    max: [4, 3, 48, 640]": "    max: [1, 3, 48, 320]",
            "    min: [1, 3, 48, 64]": "    min: [1, 3, 48, 320]",
        },
    )
    out = tmp_path / "rec"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 0
    report = json.loads((out / "report.json").read_text())
    (name, result), *_ = report["outputs"].items()
    assert set(result["checks"]) == {"cosine", "indices"} and result["passed"]
    assert result["checks"]["cosine"]["value"] >= 0.999 == result["checks"]["cosine"]["threshold"]
    assert result["checks"]["indices"]["top_k"] == 3

    strict = example_policy(
        "ppocrv4_rec",
        replace={
            "default: {atol: 1e-3, rtol: 1e-2, check_error_stat: median}": (
                "default: {cosine_similarity_threshold: 1.0}"
            ),
            "    max: [4, 3, 48, 640]": "    max: [1, 3, 48, 320]",
            "    min: [1, 3, 48, 64]": "    min: [1, 3, 48, 320]",
        },
    )
    code = main(
        ["build", "--policy", str(strict), "--out", str(tmp_path / "s"), "--backend", "none"]
    )
    assert code == 1 and name


def test_the_verdicts_are_the_same_with_and_without_polygraphys_log():
    """Without --verbose each compare function is called itself (no statistics computed for
    a log nobody sees); with it, through Polygraphy's Comparator: the same verdicts."""
    import numpy as np
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.checks import run_checks
    from trtbuild.policy.specs import Tolerance

    rng = np.random.default_rng(0)
    refs, outs = [], []
    for _ in range(3):
        image, logits = rng.random((1, 3, 8, 8), np.float32), rng.random((2, 10), np.float32)
        refs.append(IterationResult({"image": image, "logits": logits}, runner_name="ref"))
        noisy = {"image": image + 0.01 * rng.standard_normal(image.shape, np.float32)}
        noisy["logits"] = logits[:, ::-1].copy()  # the top index moves: indices fail
        outs.append(IterationResult(noisy, runner_name="cand"))
    tol = {
        "image": Tolerance(atol=1e-3, rtol=0.0, psnr_threshold=30.0, snr_threshold=20.0),
        "logits": Tolerance(compare="indices", top_k=1, index_tolerance=0),
    }
    quiet = run_checks(refs, outs, "cand", tol, verbose=False)
    loud = run_checks(refs, outs, "cand", tol, verbose=True)
    assert quiet == loud
    assert not quiet["image"]["simple"]["passed"] and not quiet["logits"]["indices"]["passed"]
    assert {"psnr", "snr", "shown"} <= set(quiet["image"])


def test_samples_compared_at_once_leave_polygraphys_logger_and_warnings_as_they_were():
    """The samples' checks run on threads that enter Polygraphy's indent each on their own
    and warn where numpy does; nothing of the process is left changed behind them."""
    import warnings

    import numpy as np
    from polygraphy.comparator.struct import IterationResult
    from polygraphy.logger import G_LOGGER

    from trtbuild.accuracy.checks import run_checks
    from trtbuild.policy.specs import Tolerance

    rng = np.random.default_rng(1)
    refs = [IterationResult({"y": rng.random(50_000, np.float32)}, runner_name="r") for _ in "ab"]
    outs = [IterationResult({"y": r["y"] + np.float32(1.0)}, runner_name="c") for r in refs]
    for ref, out in zip(refs, outs):  # inf - inf and 0 / 0: numpy warns, unless told not to
        ref["y"][:2], out["y"][:2] = (np.inf, 0.0), (-np.inf, np.nan)
    severity, indent, filters = (
        G_LOGGER.module_severity,
        G_LOGGER.logging_indent,
        warnings.filters[:],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = run_checks(refs, outs, "c", {"y": Tolerance(atol=1e-3, rtol=0.0)}, False)
    assert found["y"]["simple"]["failed_samples"] == [0, 1]
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert (G_LOGGER.module_severity, G_LOGGER.logging_indent) == (severity, indent)
    assert warnings.filters == filters


def _cases() -> list[np.ndarray]:
    """Ties everywhere, both zeros, infinities, a NaN; half, float, double and integers
    (unsigned, and the smallest signed: where -x wraps, Polygraphy's answer stands)."""
    rng = np.random.default_rng(0)
    found = []
    for dt in (np.float16, np.float32, np.float64):
        found.append(rng.integers(0, 4, (3, 5, 7)).astype(dt))
        a = rng.normal(size=(4, 9)).astype(dt)
        a[0, 2], a[1, :], a[1, 3], a[2, 4] = np.inf, 0.0, -0.0, np.nan
        found += [a, np.array([-0.0, 0.0, -0.0], dt), np.full((2, 3), -np.inf, dt)]
    ints = [rng.integers(-5, 5, (4, 6)).astype(np.int64), np.array([[0, 3, 1]], np.uint8)]
    return [*found, *ints, np.array([[-128, 5, -128]], np.int8)]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_indices_are_polygraphys_top_k_exactly(k):
    """Where k is 1 one argmax stands for Polygraphy's stable sort of the whole axis: the
    same indices, dtype and shape on ties, both zeros and infinities; a NaN's row is
    Polygraphy's own (argmax would pick the NaN)."""
    from polygraphy.comparator import TopKPostprocessFunc
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.checks import top_indices

    for a in _cases():
        want = TopKPostprocessFunc(k=k)(IterationResult({"o": a.copy()}, runner_name="r"))["o"]
        got = top_indices(a, k)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_failing_sample_is_named_with_its_own_statistic():
    """The figures shown are over every sample: a median within atol (0 here) sat next to
    FAIL with nothing to say why; the failing sample's own median is what failed."""
    import numpy as np

    from trtbuild.accuracy.checks import describe, run_checks
    from trtbuild.policy.specs import Tolerance

    ref = np.ones((1, 64), np.float32)
    refs = [{"y": ref}] * 4
    outs = [{"y": ref}, {"y": ref + 0.3}, {"y": ref}, {"y": ref + 0.1}]
    tol = Tolerance(atol=0.05, rtol=0.05, check_error_stat="median")
    found = run_checks(refs, outs, "cand", {"y": tol}, verbose=False)["y"]["simple"]
    assert found["failed_samples"] == [1, 3]
    assert found["worst"]["sample"] == 1 and abs(found["worst"]["abs"] - 0.3) < 1e-6
    text = describe("simple", found, tol)
    # relative: over FP32's magnitude (0.3 / 1), as rtol judges it
    assert text == "atol 0.05, rtol 0.05 on the median (sample 1: 0.3, relative 0.3)", text
    passing = run_checks(refs, [{"y": ref}] * 4, "cand", {"y": tol}, verbose=False)["y"]
    assert "worst" not in passing["simple"]
    assert describe("simple", passing["simple"], tol) == "atol 0.05, rtol 0.05 on the median"


def test_an_integer_outputs_failing_sample_shows_no_nan_relative():
    """A k-NN's indices (int64, 0 among them) failing atol: Polygraphy's relative error of
    integers is 0/0 where an index is 0, and the line read "(sample 0: 3, relative nan)"."""
    import numpy as np

    from trtbuild.accuracy.checks import describe, run_checks
    from trtbuild.policy.specs import Tolerance

    ref = np.array([[0, 5, 0, 7]], np.int64)
    tol = Tolerance(atol=0.01, rtol=0.01, check_error_stat="elemwise")
    out = np.array([[0, 5, 3, 7]], np.int64)
    found = run_checks([{"k": ref}], [{"k": out}], "cand", {"k": tol}, verbose=False)["k"]
    assert found["simple"]["failed_samples"] == [0]
    assert (
        describe("simple", found["simple"], tol)
        == "atol 0.01, rtol 0.01 on the elemwise (sample 0: 3)"
    )


@pytest.mark.parametrize(("k", "axis"), [(1, 1), (2, 1), (1, 0)])
def test_top_indices_along_an_axis_are_polygraphys_k_and_axis(k, axis):
    """`top_k_axis`: Polygraphy's `TopKPostprocessFunc((k, axis))`; a segmentation's
    [B, C, H, W] logits rank their classes on axis 1 (the last was W)."""
    from polygraphy.comparator import TopKPostprocessFunc
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.checks import top_indices

    a = np.random.default_rng(k).standard_normal((2, 5, 3, 4)).astype(np.float32)
    want = TopKPostprocessFunc(k=(k, axis))(IterationResult({"o": a.copy()}, runner_name="r"))
    np.testing.assert_array_equal(top_indices(a, k, axis), want["o"])


def test_a_class_flipped_at_one_pixel_fails_top_1_on_the_class_axis():
    from trtbuild.accuracy.checks import describe, run_checks
    from trtbuild.policy.specs import Tolerance

    ref = np.zeros((1, 3, 2, 2), np.float32)
    ref[0, :, :, 1] = np.array([10.0, 11.0, 12.0])[:, None]  # column 1: class 2, the largest
    ref[0, :, :, 0] = np.array([1.0, 0.2, 0.5])[:, None]  # column 0: class 0
    out = ref.copy()
    out[0, 2, 1, 0] = 1.5  # class 2 at one pixel; along the last axis nothing moves
    tol = Tolerance(compare="indices", top_k=1, top_k_axis=1, simple=False)
    from polygraphy.comparator.struct import IterationResult

    refs = [IterationResult({"y": ref}, runner_name="ref")]
    outs = [IterationResult({"y": out}, runner_name="c")]
    found = run_checks(refs, outs, "c", {"y": tol}, False)["y"]["indices"]
    assert found["failed_samples"] == [0]
    assert describe("indices", found, tol) == "top-1 indices along axis 1 within 0 position(s)"


@pytest.mark.parametrize("stat", ["max", "mean", "median", "quantile", "elemwise"])
@pytest.mark.parametrize("verbose", [False, True])
def test_an_output_empty_on_both_sides_differs_nowhere(stat, verbose):
    """No box kept by either side's NMS on one sample: Polygraphy's mean of the empty error
    is NaN and its quantile inf, and that sample failed; nothing differs there. A box kept
    on the other sample is still judged."""
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.checks import run_checks
    from trtbuild.policy.specs import Tolerance

    empty = np.zeros((0, 4), np.float32)
    boxes = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    refs = [IterationResult({"b": x}, runner_name="r") for x in (empty, boxes)]
    for moved, failed in ((0.0, []), (0.5, [1])):
        outs = [IterationResult({"b": x}, runner_name="c") for x in (empty.copy(), boxes + moved)]
        tol = {"b": Tolerance(atol=1e-3, rtol=1e-3, check_error_stat=stat, error_quantile=0.5)}
        found = run_checks(refs, outs, "c", tol, verbose)["b"]["simple"]
        assert found["failed_samples"] == failed, (stat, verbose, found)


@pytest.mark.parametrize(
    "tol",
    [{"psnr_threshold": 30.0}, {"snr_threshold": 20.0}, {"cosine_similarity_threshold": 0.99}],
    ids=["psnr", "snr", "cosine"],
)
def test_a_metric_of_an_output_empty_on_both_sides_is_that_of_two_alike(tol):
    """Polygraphy's PSNR and SNR of an empty pair are NaN, which failed any threshold; two
    empty outputs are alike (infinite PSNR and SNR, cosine 1). A sample with an output
    that moved is still judged."""
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.checks import run_checks
    from trtbuild.policy.specs import Tolerance

    empty, y = np.zeros((0, 4), np.float32), np.linspace(-1, 1, 8, dtype=np.float32)
    refs = [IterationResult({"o": x}, runner_name="r") for x in (empty, y)]
    outs = [IterationResult({"o": x}, runner_name="c") for x in (empty.copy(), -y)]
    (check,) = {k: v for k, v in run_checks(refs, outs, "c", {"o": Tolerance(**tol)}, False)["o"].items() if k not in ("simple", "shown")}.values()  # fmt: skip
    assert check["failed_samples"] == [1], check


def test_a_metric_shown_beside_fail_is_the_failing_samples_nan_not_the_best_of_the_rest():
    """A T5 encoder's sample whose mask hid its only token gave NaN in FP16: its cosine was
    NaN and failed, while the line showed `cosine 1 (>= 0.999)`, the least of the other
    samples' (`min` skips a NaN that is not first)."""
    from trtbuild.accuracy.checks import describe, run_checks
    from trtbuild.policy.specs import Tolerance

    y = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    refs = [{"o": y}] * 4
    outs = [{"o": y}, {"o": y * 1.0001}, {"o": y}, {"o": np.full_like(y, np.nan)}]
    tol = Tolerance(cosine_similarity_threshold=0.999)
    found = run_checks(refs, outs, "c", {"o": tol}, verbose=False)["o"]["cosine"]
    assert found["failed_samples"] == [3] and np.isnan(found["value"]), found
    assert describe("cosine", found, tol) == "cosine nan (>= 0.999)"
    passing = run_checks(refs, outs[:3], "c", {"o": tol}, verbose=False)["o"]["cosine"]
    assert passing["failed_samples"] == [] and passing["value"] == 1.0, passing


def test_the_worst_failing_sample_named_is_a_nan_one_wherever_it_comes():
    from trtbuild.accuracy.checks import run_checks
    from trtbuild.policy.specs import Tolerance

    y = np.ones((1, 8), np.float32)
    refs = [{"y": y}] * 3
    outs = [{"y": y + 0.3}, {"y": np.full_like(y, np.nan)}, {"y": y + 0.2}]
    tol = Tolerance(atol=0.05, rtol=0.05)
    found = run_checks(refs, outs, "c", {"y": tol}, verbose=False)["y"]["simple"]
    assert found["failed_samples"] == [0, 1, 2] and found["worst"]["sample"] == 1, found


@pytest.mark.parametrize("verbose", [False, True])
def test_rtol_is_relative_to_the_fp32_reference(verbose):
    """Polygraphy's relative error divides by the second output ("a percentage of the second
    set of output values": `polygraphy run --trt --onnxrt` puts ONNX Runtime second). The
    reference went first, so rtol was relative to the candidate: an FP16 `(x + 1000) - 1000`
    gave 0.5 where FP32 gives 0.3, 67% off, and passed rtol 0.5 (0.2 / 0.5 = 40%); the
    other way round, 0.3 where FP32 gives 0.5 (40% off) failed it."""
    import numpy as np

    from trtbuild.accuracy.checks import run_checks
    from trtbuild.policy.specs import Tolerance

    tol = {"y": Tolerance(atol=1e-6, rtol=0.5)}
    for ref, got, passed in ((0.3, 0.5, False), (0.5, 0.3, True)):
        refs = [{"y": np.full((1, 4), ref, np.float32)}]
        outs = [{"y": np.full((1, 4), got, np.float32)}]
        found = run_checks(refs, outs, "cand", tol, verbose)["y"]["simple"]
        assert found["passed"] is passed, (ref, got, found)
        if not passed:
            assert found["worst"]["rel"] == pytest.approx(0.2 / 0.3, rel=1e-5)


def test_an_fp16_result_off_by_more_than_rtol_of_fp32s_fails_the_build(tmp_path):
    """The same through `build`: FP16's `(x + 1000) - 1000` is 0.5 where FP32's is 0.3
    (a step of FP16 at 1000 is 0.5), 67% of FP32's value: rtol 0.5 fails it, and the
    report's relative figure is that one."""
    import numpy as np
    import onnx

    from tests.helpers import F, model, node

    m = model(
        [node("Add", ["x", "c"], "y", "add"), node("Sub", ["y", "c"], "out", "sub")],
        [("x", F, [1, 4])],
        [("out", F, [1, 4])],
        {"c": np.array(1000, np.float32)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.full((1, 4), 0.3, np.float32))
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nbuild: {backend: none}\n"
        "inputs:\n  x: {shape: [1, 4], data: {file: d.npz}}\n"
        "accuracy:\n  samples: 1\n  tolerances:\n    default: {atol: 1e-6, rtol: 0.5}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 1
    report = json.loads((out / "report.json").read_text())
    y = report["outputs"]["out"]
    assert not report["passed"] and not y["passed"]
    assert y["checks"]["simple"]["worst"]["rel"] == pytest.approx(y["max_rel"], rel=1e-4)


@pytest.mark.parametrize(
    "tol",
    [
        {"check_error_stat": "quantile", "error_quantile": 0.5},
        {},  # an image-like mask: PSNR shown beside the default check
        {"snr_threshold": 20.0},
        {"cosine_similarity_threshold": 0.99},
    ],
    ids=["quantile", "psnr-shown", "snr", "cosine"],
)
@pytest.mark.parametrize("verbose", [False, True])
def test_a_boolean_mask_is_judged_as_zeros_and_ones(tol, verbose):
    """A [1, 1, H, W] mask (`y > 0.5`): Polygraphy's quantile, PSNR and SNR subtract, which
    numpy refuses for booleans (exit 70, the PSNR with no tolerance set). Judged as 0 and 1,
    the mask passes where it is FP32's and fails where pixels flipped."""
    from trtbuild.accuracy.checks import run_checks
    from trtbuild.policy.specs import Tolerance

    mask = np.arange(16).reshape(1, 1, 4, 4) % 3 == 0
    flipped = mask.copy()
    flipped[0, 0, :2] = ~flipped[0, 0, :2]  # half the pixels
    tolerance = {"m": Tolerance(atol=1e-3, rtol=1e-3, **tol)}
    for got, passed in ((mask.copy(), True), (flipped, False)):
        found = run_checks([{"m": mask}], [{"m": got}], "cand", tolerance, verbose)["m"]
        judged = {k: c["passed"] for k, c in found.items() if k != "shown"}
        assert all(judged.values()) is passed, (got, found)


def test_a_metric_and_its_threshold_are_shown_with_the_digits_that_tell_them_apart():
    """BEiT's logits judged at cosine 0.9999999: a sample at 0.99999 failed and the line said
    `cosine 1 (>= 1)`, value and threshold each rounded to four digits."""
    from trtbuild.accuracy.checks import describe, run_checks
    from trtbuild.policy.specs import Tolerance

    y = np.linspace(-1.0, 1.0, 64, dtype=np.float64)
    noisy = y + 0.004 * np.cos(np.arange(64))
    tol = Tolerance(cosine_similarity_threshold=0.9999999)
    found = run_checks([{"o": y}], [{"o": noisy}], "c", {"o": tol}, verbose=False)["o"]["cosine"]
    assert found["failed_samples"] == [0] and found["value"] < 0.9999999, found
    text = describe("cosine", found, tol)
    shown, threshold = text.removeprefix("cosine ").split(" (>= ")
    assert threshold == "0.9999999)", text
    assert float(shown) < 0.9999999, text
    loose = Tolerance(cosine_similarity_threshold=0.999)
    found = run_checks([{"o": y}], [{"o": noisy}], "c", {"o": loose}, verbose=False)["o"]["cosine"]
    assert describe("cosine", found, loose) == "cosine 1 (>= 0.999)"


def test_atol_and_rtol_bound_each_element_by_the_larger_not_their_sum():
    """Polygraphy fails an element only where it is past atol and past rtol x |ref|: FP32's
    1.0 with atol 0.1 and rtol 0.1 allows 0.1 of error, not 0.2 (policy.md said the sum).
    report.json's max_rel divides by FP32's value as the verdict does, also where it is 0."""
    from trtbuild.accuracy.checks import run_checks
    from trtbuild.accuracy.sessions import metrics
    from trtbuild.policy.specs import Tolerance

    tol = {"y": Tolerance(atol=0.1, rtol=0.1)}
    for got, passed in ((1.09, True), (1.15, False)):
        found = run_checks(
            [{"y": np.ones(4, np.float32)}], [{"y": np.full(4, got, np.float32)}], "c", tol, False
        )
        assert found["y"]["simple"]["passed"] is passed, got
    ref, out = np.array([0, 1, 1, 1], np.float32), np.array([1e-3, 1, 1, 1], np.float32)
    found = run_checks([{"y": ref}], [{"y": out}], "c", {"y": Tolerance(atol=0, rtol=1)}, False)
    assert metrics(ref, out)["max_rel"] == pytest.approx(found["y"]["simple"]["worst"]["rel"])


def test_an_empty_sample_of_indices_is_no_row_that_compares_nothing():
    """A detector's kept classes along its last axis, [1, 0] on one sample (nothing kept) and
    [1, 4] on another: the judge's check of the data's dims read the empty sample's rows of
    0 and refused index_tolerance 1 (exit 2); a row of 4 compares 3. A [1, 1] class on a
    sample compares nothing: exit 2, naming that shape."""
    from trtbuild.accuracy.checks import run_checks
    from trtbuild.errors import UsageError
    from trtbuild.policy.specs import Tolerance

    tol = {"c": Tolerance(compare="indices", index_tolerance=1)}
    empty, kept = np.zeros((1, 0), np.int64), np.arange(4, dtype=np.int64).reshape(1, 4)
    refs = [{"c": empty}, {"c": kept}]
    found = run_checks(refs, [{"c": empty.copy()}, {"c": kept.copy()}], "cand", tol, False)
    assert found["c"]["indices"]["passed"]
    one = [{"c": np.zeros((0, 1), np.int64)}, {"c": np.zeros((1, 1), np.int64)}]
    with pytest.raises(UsageError, match="at the output's shape \\[1, 1\\]"):
        run_checks(one, [dict(it) for it in one], "cand", tol, False)
