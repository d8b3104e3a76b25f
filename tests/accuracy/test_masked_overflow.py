"""One rule for an intermediate that turns inf where FP32 is finite while every output holds
(`accuracy.masked_overflow`): `build`, `report` and `tune` judge it alike, on every sample,
in a tensor of the graph or in a boundary Cast the conversion adds (issue #42)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import F, model, node
from trtbuild import tuning
from trtbuild.cli import main
from trtbuild.front import run_front
from trtbuild.policy import load_policy

_CONSTS = {
    "k": np.array(1e3, np.float32),
    "lo": np.array(0, np.float32),
    "hi": np.array(6, np.float32),
}


def _masked_model(path: Path) -> Path:
    """y = Clip(x * 1e3, 0, 6) + x: where x > 65.5, x * 1e3 is inf in FP16 and Clip hides it."""
    m = model(
        [
            node("Mul", ["x", "k"], "big", "/scale"),
            node("Clip", ["big", "lo", "hi"], "c", "/clip"),
            node("Add", ["c", "x"], "y", "/add"),
        ],
        [("x", F, [1, 64])],
        [("y", F, [1, 64])],
        _CONSTS,
    )
    onnx.save(m, path)
    return path


def _policy(tmp_path: Path, *, rule: str | None = None, data: str, extra: str = "") -> Path:
    _masked_model(tmp_path / "masked.onnx")
    text = (
        "version: 1\nmodel: masked.onnx\n"
        f"inputs:\n  x: {{shape: [1, 64], data: {data}}}\n{extra}"
        "accuracy:\n  samples: 3\n  tolerances:\n    default: {atol: 0.1, rtol: 0.01}\n"
    )
    if rule is not None:
        text += f"  masked_overflow: {rule}\n"
    path = tmp_path / f"masked_{rule or 'default'}.yaml"
    path.write_text(text)
    return path


def _later_sample_only(tmp_path: Path) -> str:
    """Three samples; only the third reaches x * 1e3 > 65504 (the first two stay below 60)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 60.0, (3, 1, 64)).astype(np.float32)
    x[2, 0, 5] = 90.0
    np.savez(tmp_path / "x.npz", x=x)
    return "{file: x.npz}"


def _build(policy: Path, out: Path, capsys) -> tuple[int, str, dict]:
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    text = capsys.readouterr().out
    return code, text, json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("rule", [None, "fail", "warn"])
def test_a_masked_overflow_fails_build_by_default_and_passes_with_warn(tmp_path, capsys, rule):
    policy = _policy(tmp_path, rule=rule, data="{distribution: uniform, low: 0.0, high: 100.0}")
    code, text, report = _build(policy, tmp_path / "out", capsys)
    verdict = text.splitlines()[0]
    said = rule or "fail"
    assert f"(accuracy.masked_overflow: {said})" in verdict
    assert "masked overflow at /scale (Mul)" in verdict
    assert report["masked_overflow"]["rule"] == said
    (found,) = report["masked_overflow"]["found"]
    assert found["node"] == "/scale" and found["nonfinite"] > 0
    assert all(o["passed"] for o in report["outputs"].values())  # the outputs hide it
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert (
        "masked overflow" in junit
        and "masked overflow" in (tmp_path / "out" / "report.md").read_text()
    )
    if said == "fail":
        assert code == 1 and verdict.startswith("FAILED") and not report["passed"]
        assert 'failures="1"' in junit
    else:
        assert code == 0 and verdict.startswith("PASSED") and report["passed"]
        assert 'failures="0"' in junit and "only warned" in verdict


@pytest.mark.parametrize("rule", [None, "fail", "warn"])
def test_tune_agrees_with_build_on_the_same_candidate(tmp_path, capsys, rule):
    """The policy as given (no pin) is tune's first candidate: tune's verdict on it is build's."""
    policy = _policy(tmp_path, rule=rule, data="{distribution: uniform, low: 0.0, high: 100.0}")
    code, _, report = _build(policy, tmp_path / "out", capsys)
    front = run_front(load_policy(policy))
    outcome = tuning.evaluate(front, front.policy.precision)
    assert outcome.passed == report["passed"] == (code == 0) == (rule == "warn")
    if rule != "warn":
        assert "(intermediate)" in outcome.failing


@pytest.mark.parametrize("walk", ["on_failure", "always"])
def test_an_overflow_on_a_later_sample_only_is_found(tmp_path, capsys, walk):
    """The lean run sums every sample, not only the first, whatever walks the first."""
    policy = _policy(tmp_path, data=_later_sample_only(tmp_path))
    policy.write_text(policy.read_text() + f"  walk: {walk}\n")
    code, text, report = _build(policy, tmp_path / "out", capsys)
    assert code == 1, text
    (found,) = report["masked_overflow"]["found"]
    assert found["sample"] == 2 and found["node"] == "/scale"  # from 0, as failed_samples
    assert "sample 2" in text
    # said with that sample's FP32 peak (90 * 1e3), not the first sample's (below 6e4)
    assert found["ref_max_abs"] == 9e4
    assert "FP32 peak |x| = 9e+04" in text


@pytest.mark.parametrize("walk", ["on_failure", "always"])
def test_an_overflow_on_a_later_sample_says_a_peak_that_holds_that_sample(tmp_path, capsys, walk):
    """Sample 2's x * 1e3 reaches 9e4 (inf in FP16); the first sample's peak is below 6e4,
    which did not explain the inf. A later sample's peak past FP16's range is kept
    (`later_peaks`): said as that sample's own, no `peak_over`."""
    policy = _policy(tmp_path, data=_later_sample_only(tmp_path))
    policy.write_text(policy.read_text() + f"  walk: {walk}\n")
    code, text, report = _build(policy, tmp_path / "out", capsys)
    assert code == 1, text
    (found,) = report["masked_overflow"]["found"]
    assert found["sample"] == 2 and found["ref_max_abs"] == pytest.approx(9e4)
    assert "peak_over" not in found
    assert "FP32 peak |x| = 9e+04" in text, text


def test_an_overflow_in_a_boundary_cast_is_found(tmp_path, capsys):
    """x * 1e3 is pinned to FP32, so the Mul itself holds 9e4; the Cast to FP16 the conversion
    adds before the FP16 Clip turns it inf, and Clip hides it."""
    pin = (
        "precision:\n  default: fp16\n  rules:\n    - id: scale-fp32\n"
        "      match: {name: /scale}\n      precision: fp32\n"
    )
    policy = _policy(tmp_path, data="{distribution: uniform, low: 0.0, high: 100.0}", extra=pin)
    code, text, report = _build(policy, tmp_path / "out", capsys)
    assert code == 1, text
    (found,) = report["masked_overflow"]["found"]
    assert found["op"] == "Cast" and found["source"] == "big", found
    assert "boundary Cast of `big`" in text


@pytest.mark.parametrize("rule", ["fail", "warn"])
def test_check_says_beforehand_what_the_rule_will_make_of_it(tmp_path, capsys, rule):
    """`check` reads the same rule: a tensor stored in FP16 that passes 65504 on the reference
    data is named with what `build` and `tune` will do about it."""
    policy = _policy(tmp_path, rule=rule, data="{distribution: uniform, low: 0.0, high: 100.0}")
    assert main(["check", "--policy", str(policy)]) == 0
    err = capsys.readouterr().err
    did = "fails the policy" if rule == "fail" else "is only warned"
    assert "/scale (Mul) reaches" in err and f"{did} (accuracy.masked_overflow: {rule})" in err


def test_an_overflow_in_the_cast_of_a_graph_input_is_found(tmp_path, capsys):
    """y = 2 Clip(x, 0, 6), x up to 1e5: the input stays FP32 (`io: keep`) and the Cast to
    FP16 before the Clip turns it inf, which the Clip hides (6 either way)."""
    consts = {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    m = model(
        [node("Clip", ["x", "lo", "hi"], "c", "/clip"), node("Add", ["c", "c"], "y", "/add")],
        [("x", F, [1, 64])],
        [("y", F, [1, 64])],
        consts,
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        "  x: {shape: [1, 64], data: {distribution: uniform, low: 0.0, high: 100000.0}}\n"
    )
    code, text, report = _build(policy, tmp_path / "out", capsys)
    assert code == 1, text
    (found,) = report["masked_overflow"]["found"]
    assert found["op"] == "Cast" and found["source"] == "x" and found["nonfinite"] > 0


@pytest.mark.parametrize("walk", ["on_failure", "always"])
def test_an_overflow_on_a_later_sample_is_found_where_the_data_decides_its_shape(
    tmp_path, capsys, walk
):
    """x > 0.5 picks 5 values on the first sample and 6 on the second (a NonZero's count),
    and only the second's x * 6e4 passes 65504: the overflow is judged there, although the
    tensor's shape is not the first sample's."""
    consts = {"thr": np.array(0.5, np.float32), "k": np.array(6e4, np.float32)}
    m = model(
        [
            node("Greater", ["x", "thr"], "mask", "/gt"),
            node("NonZero", ["mask"], "nz", "/nonzero"),
            node("Transpose", ["nz"], "idx", "/tr", perm=[1, 0]),
            node("GatherND", ["x", "idx"], "picked", "/gather"),
            node("Mul", ["picked", "k"], "big", "/scale"),
            node("Clip", ["big", "lo", "hi"], "c", "/clip"),
            node("ReduceSum", ["c"], "s", "/sum"),
            node("Add", ["x", "s"], "y", "/add"),
        ],
        [("x", F, [1, 16])],
        [("y", F, [1, 16])],
        {**_CONSTS, **consts},
    )
    onnx.save(m, tmp_path / "masked.onnx")
    x = np.full((2, 1, 16), 0.1, np.float32)
    x[0, 0, :5] = [0.6, 0.7, 0.8, 0.9, 1.0]  # 6e4 at most: finite in FP16
    x[1, 0, :6] = [0.6, 0.7, 0.8, 0.9, 1.0, 1.5]  # 9e4: inf in FP16, hidden by the Clip
    np.savez(tmp_path / "x.npz", x=x)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: masked.onnx\ninputs:\n  x: {shape: [1, 16], data: {file: x.npz}}\n"
        "accuracy:\n  samples: 2\n  tolerances:\n    default: {atol: 0.01, rtol: 0.01}\n"
        f"  walk: {walk}\n"
    )
    code, text, report = _build(policy, tmp_path / "out", capsys)
    assert code == 1, text
    (found,) = report["masked_overflow"]["found"]
    assert found["sample"] == 1 and found["node"] == "/scale", found


@pytest.mark.parametrize(("x", "turns_inf"), [(40.0, False), (50.0, True)])
def test_check_warns_of_what_turns_inf_and_build_agrees(tmp_path, capsys, x, turns_inf):
    """FP16 rounds a value below 65520 to 65504, not to inf: `check` said a sum of 65512
    would 'turn inf' and fail the policy (accuracy.masked_overflow: fail), and `build`
    passed it. The warning and the verdict now meet at 65520, where storing gives inf."""
    m = model(
        [
            node("Add", ["x", "c"], "big", "/shift"),  # 65472 + x: 65512 or 65522
            node("Clip", ["big", "lo", "hi"], "clipped", "/clip"),
            node("Add", ["clipped", "x"], "y", "/add"),
        ],
        [("x", F, [1, 8])],
        [("y", F, [1, 8])],
        {**_CONSTS, "c": np.array(65472, np.float32)},  # FP16 holds 65472, 40 and 50 exactly
    )
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.full((1, 1, 8), x, np.float32))
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 8], data: {file: x.npz}}\n"
        "accuracy:\n  samples: 1\n  tolerances:\n    default: {atol: 0.1, rtol: 0.01}\n"
    )
    assert main(["check", "--policy", str(policy)]) == 0
    warned = "/shift (Add) reaches" in capsys.readouterr().err
    code, _, report = _build(policy, tmp_path / "out", capsys)
    assert warned is turns_inf and (code == 1) is turns_inf
    assert bool(report["masked_overflow"]["found"]) is turns_inf


def _mask_policy(tmp_path: Path, fill: float, hot_sample: int) -> Path:
    """a = s + (mask + s), then Clip(a, -10, 10): the mask holds `fill` in its last column on
    every sample, so `mask + s` and `a` hold it too; one value of s, 3.5e4 on `hot_sample`
    alone, makes `a` 7e4 there, +inf in FP16 beside the mask's -inf, which the Clip hides."""
    nodes = [
        node("Add", ["mk", "s"], "mk2", "/mask_add"),
        node("Add", ["s", "mk2"], "a", "/add"),
        node("Clip", ["a", "lo", "hi"], "y", "/clip"),
    ]
    consts = {"lo": np.float32(-10), "hi": np.float32(10)}
    io = [("s", F, [1, 4, 4]), ("mk", F, [1, 4, 4])]
    onnx.save(model(nodes, io, [("y", F, [1, 4, 4])], consts), tmp_path / "m.onnx")
    s = np.random.default_rng(0).uniform(-1, 1, (3, 1, 4, 4)).astype(np.float32)
    s[hot_sample, 0, 1, 1] = 3.5e4
    mask = np.zeros((3, 1, 4, 4), np.float32)
    mask[:, 0, :, 3] = fill
    np.savez(tmp_path / "x.npz", s=s, mk=mask)
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  s: {data: {file: x.npz}}\n"
        "  mk: {data: {file: x.npz}}\naccuracy:\n  samples: 3\n"
        "  tolerances: {default: {atol: 0.01}}\n"
    )
    return path


@pytest.mark.parametrize("fill", [-np.inf, float(np.finfo(np.float32).min)], ids=["inf", "min"])
@pytest.mark.parametrize("hot_sample", [1, 2])
def test_an_overflow_beside_a_masks_sentinels_on_a_later_sample_is_found(
    tmp_path, capsys, fill, hot_sample
):
    """FP32's values of a later sample are not kept: a tensor holding an -inf mask was not
    judged there at all, and one holding a finfo.min mask by its NaNs alone, so the +inf of
    the overflow beside the mask's -inf passed (exit 0) on the second or third sample,
    where the same data failed on the first."""
    path = _mask_policy(tmp_path, fill, hot_sample)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 1
    said = capsys.readouterr().out
    assert "masked overflow at /add (Add) fails it" in said
    assert f"tensor a, sample {hot_sample}: 1 non-finite value(s)" in said
    front = run_front(load_policy(path))
    assert not tuning.evaluate(front, front.policy.precision).passed  # tune's verdict agrees


@pytest.mark.parametrize("fill", [-np.inf, float(np.finfo(np.float32).min)], ids=["inf", "min"])
def test_a_masks_sentinels_alone_on_later_samples_pass(tmp_path, capsys, fill):
    """No value past 65504 but the mask's: every sample holds as many -inf as FP32's."""
    path = _mask_policy(tmp_path, fill, 0)
    s = dict(np.load(tmp_path / "x.npz"))
    s["s"][0, 0, 1, 1] = 0.5
    np.savez(tmp_path / "x.npz", **s)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0


@pytest.mark.parametrize("hot", [0, 1])
def test_an_fp32_inf_does_not_excuse_both_a_nan_and_another_overflow(tmp_path, capsys, hot):
    """y = Cast(a / b < 5): 1e-8 / 0 is +inf in FP32 and 0 / 0 (NaN) in FP16 on both
    samples; 100 / 1e-3 is 1e5, inf in FP16, on sample `hot`. On a later sample, judged by
    counts, the FP32 inf was counted on its sign's side and excused the NaN as well, so the
    overflow beside it passed (exit 0), where on the first sample it failed."""
    from onnx import TensorProto

    m = model(
        [node("Div", ["a", "b"], "t", "/div"), node("Less", ["t", "five"], "lt", "/less"),
         node("Cast", ["lt"], "y", "/cast", to=TensorProto.FLOAT)],
        [("a", F, [1, 4]), ("b", F, [1, 4])],
        [("y", F, [1, 4])],
        {"five": np.array(5, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    a, b = np.ones((2, 1, 4), np.float32), np.ones((2, 1, 4), np.float32)
    a[:, 0, 0], b[:, 0, 0] = 1e-8, 0.0
    a[hot, 0, 1], b[hot, 0, 1] = 100.0, 1e-3
    np.savez(tmp_path / "x.npz", a=a, b=b)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  a: {data: {file: x.npz}}\n"
        "  b: {data: {file: x.npz}}\naccuracy:\n  samples: 2\n"
        "  tolerances:\n    default: {atol: 0.01}\n"
    )
    code, text, report = _build(policy, tmp_path / "out", capsys)
    assert code == 1, text
    assert [f["sample"] for f in report["masked_overflow"]["found"]] == [hot], report
