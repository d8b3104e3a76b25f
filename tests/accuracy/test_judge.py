"""The judge's divergence: sentinels are not data, NaN always diverges, overflow is caught.

Each case is walked twice: against the reference's tensor (`build`'s
divergence) and from the reference's measures alone (`tune`'s overflow-only
walk); both must find the same overflow.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.helpers import I64, F, H, model, node
from trtbuild.accuracy.judge import decided, divergence
from trtbuild.accuracy.reference import ReferenceMeasures
from trtbuild.cli import main
from trtbuild.numerics import measure_peak, sentinels
from trtbuild.results import FlippedDecision, PointResult

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


def test_a_decision_reached_through_integer_nodes_is_named_with_the_divergence():
    """The first divergence names the decision whose indices it reads through integer-only
    nodes (`j`, a graph output too), not one it reaches through a float (`kf`) or a Shape;
    where nothing diverged, a failing output that is a decision's indices names it."""
    m = model(
        [node("ArgMin", ["x"], "i", "argmin", axis=1, keepdims=1),
         node("Squeeze", ["i", "axis"], "j", "squeeze"),
         node("Gather", ["codes", "j"], "y", "lookup", axis=0),
         node("ArgMax", ["x"], "k", "argmax", axis=1, keepdims=0),
         node("Cast", ["k"], "kf", "to_float", to=onnx.TensorProto.FLOAT),
         node("Mul", ["kf", "half"], "z", "scale"),
         node("Shape", ["k"], "ks", "shape"),
         node("Expand", ["half", "ks"], "e", "expand")],
        [("x", F, [4, 3])],
        [("y", F, [4, 2]), ("j", onnx.TensorProto.INT64, [4]), ("k", onnx.TensorProto.INT64, [4]),
         ("z", F, [4]), ("e", F, [4])],
        {"axis": np.array([1]), "codes": np.ones((3, 2), np.float32),
         "half": np.array([0.5], np.float32)},
    )  # fmt: skip
    flipped = {"i": {"node": "argmin", "op": "ArgMin", "tensor": "i", "differ": 1, "of": 4},
               "k": {"node": "argmax", "op": "ArgMax", "tensor": "k", "differ": 2, "of": 4}}  # fmt: skip

    def at(name: str) -> dict:
        return {"node": name, "op": "?", "tensor": "?", "reason": "error 50.00%"}

    named = decided(at("lookup"), flipped, m)
    assert named["decision"] == flipped["i"], named
    assert named["reason"].startswith("error 50.00%; it reads the indices argmin (ArgMin) chose")
    assert decided(at("scale"), flipped, m) == at("scale")  # through a float: not its choice
    assert decided(at("expand"), flipped, m) == at("expand")  # a shape holds no index's value
    alone = decided(None, flipped, m, failing=["z", "k"])
    assert alone["node"] == "argmax" and alone["reason"].startswith("2 of 4 indices differ")
    for failing in (["k", "j"], ["j", "k"]):  # the earliest in the graph, whatever the order
        assert decided(None, flipped, m, failing=failing)["node"] == "argmin"
    assert decided(None, flipped, m, failing=["z"]) is None
    assert decided(None, flipped, m, failing=["y"])["node"] == "argmin"  # y's Gather reads j


def test_a_codebook_lookup_fp16_flips_is_named_at_its_gather_with_the_argmin(tmp_path):
    """A VQ model's nearest code among 256 (CodeFormer's lookup): FP16's error in
    |x|^2 + |c|^2 - 2 x.c flips some near-tied choices, and the Gather of the other code is
    off by whole values; the first divergence says the ArgMin chose it."""
    rng = np.random.default_rng(0)
    codes = rng.normal(0, 1, (256, 8)).astype(np.float32)
    m = model(
        [node("Mul", ["x", "x"], "xx", "square"),
         node("ReduceSum", ["xx", "one"], "x2", "x_norm", keepdims=1),
         node("MatMul", ["x", "codes_t"], "xc", "dot"),
         node("Mul", ["xc", "two"], "xc2", "twice"),
         node("Sub", ["x2", "xc2"], "part", "sub"),
         node("Add", ["part", "c2"], "dist", "distance"),
         node("ArgMin", ["dist"], "idx", "argmin", axis=1, keepdims=0),
         node("Gather", ["codes", "idx"], "y", "lookup", axis=0)],
        [("x", F, [1024, 8])],
        [("y", F, [1024, 8])],
        {"one": np.array([1]), "codes_t": codes.T.copy(), "two": np.array(2.0, np.float32),
         "c2": (codes**2).sum(1)[None, :], "codes": codes},
    )  # fmt: skip
    report = _built(tmp_path, m, rng.normal(0, 1, (1, 1024, 8)).astype(np.float32))
    first = report["first_divergence"]
    assert first["node"] == "lookup" and first["decision"]["node"] == "argmin", first
    assert "it reads the indices argmin (ArgMin) chose" in first["reason"], first
    point = PointResult.from_json(report["shapes"][0])  # the library's result, hashable
    assert point.first_divergence.decision == FlippedDecision(
        "argmin", "ArgMin", "idx", *_counts(first)
    )
    assert hash(point.first_divergence)


def _counts(first: dict) -> tuple[int, int]:
    return first["decision"]["differ"], first["decision"]["of"]


def test_a_classifier_whose_argmax_output_fails_names_it(tmp_path):
    """An ArgMax graph output that FP16 flips, with no float tensor past the threshold: the
    verdict's first divergence is the ArgMax, with how many indices differ."""
    rng = np.random.default_rng(1)
    m = model(
        [node("MatMul", ["x", "w"], "logits", "fc"),
         node("ArgMax", ["logits"], "cls", "argmax", axis=1, keepdims=0)],
        [("x", F, [4096, 64])],
        [("cls", onnx.TensorProto.INT64, [4096])],
        {"w": rng.normal(0, 1, (64, 32)).astype(np.float32)},
    )  # fmt: skip
    first = _built(tmp_path, m, rng.normal(0, 1, (1, 4096, 64)).astype(np.float32))
    first = first["first_divergence"]
    assert first["node"] == "argmax" and "indices differ from FP32's" in first["reason"], first


def _built(tmp_path, m: onnx.ModelProto, x: np.ndarray, accuracy: str = "") -> dict:
    """report.json of `build --backend none` of `m` on one sample `x` (its input `x`), which
    must fail; `accuracy`: more lines of its `accuracy:` section."""
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=x)
    policy = tmp_path / "m.yaml"
    policy.write_text(
        f"version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: {list(x.shape[1:])}\n"
        "    data: {file: x.npz}\naccuracy:\n  samples: 1\n" + accuracy
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 1
    return json.loads((out / "report.json").read_text())


def _thresholded() -> tuple[onnx.ModelProto, np.ndarray]:
    """`x` scaled, then `NonZero(y > 0.1)` and the values it picks: FP16 rounds 0.1 and the
    values near it to its steps (6.1e-5 apart there), so it chooses otherwise near 0.1."""
    m = model(
        [node("Mul", ["x", "one"], "y", "scale"),
         node("Greater", ["y", "limit"], "above", "greater"),
         node("NonZero", ["above"], "idx", "nonzero"),
         node("Transpose", ["idx"], "at", "transpose", perm=[1, 0]),
         node("GatherND", ["y", "at"], "vals", "pick")],
        [("x", F, [64, 64])],
        [("idx", I64, [2, "n"]), ("vals", F, ["n"])],
        {"one": np.array(1.0, np.float32), "limit": np.array(0.1, np.float32)},
    )  # fmt: skip
    x = np.linspace(0.09, 0.11, 64 * 64, dtype=np.float32).reshape(1, 64, 64)
    return m, x


def test_an_output_whose_count_fp16_changes_fails_with_both_shapes_and_names_the_nonzero(
    tmp_path,
):
    """A count the data decides (a `NonZero`'s) differs from FP32's: each output fails with
    both shapes (Polygraphy will not compare them; no figure was measured, so each is inf),
    and the first divergence names the `NonZero` with both counts; the HTML report draws."""
    m, x = _thresholded()
    report = _built(tmp_path, m, x)
    idx = report["shapes"][0]["outputs"]["idx"]
    assert not idx["passed"] and idx["max_abs"] == "inf", idx
    (differ,) = idx["shape_mismatch"]
    assert differ["reference"][0] == 2 and differ["candidate"][1] != differ["reference"][1]
    first = report["first_divergence"]
    assert first["node"] == "nonzero" and first["decision"]["chosen"] == differ["candidate"][1]
    assert first["decision"]["of"] == differ["reference"][1], first
    want = f"{differ['candidate'][1]} indices where FP32 chose {differ['reference'][1]}"
    assert first["reason"].startswith(want), first
    point = PointResult.from_json(report["shapes"][0])
    assert point.outputs["vals"].shape_mismatch[0]["candidate"] == [differ["candidate"][1]]
    assert "<img" in (tmp_path / "out" / "report.html").read_text()  # its histograms drew
    assert "**FAIL**: shape [2, " in (tmp_path / "out" / "report.md").read_text()
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert "shape [2, " in junit and "no sample to measure: max_abs=inf" in junit, junit


def test_a_count_the_quantization_alone_changes_is_said_in_the_split(tmp_path, capsys):
    """Against the model before quantization: a Q/DQ of `y` (steps of 1/64) moves values
    across 0.1 by itself, and the split says the quantized graph's shape, not a bare FAIL."""
    m, x = _thresholded()
    onnx.save(m, tmp_path / "original.onnx")
    q = onnx.helper
    m.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(1 / 64, np.float32), "qs"),
                                onnx.numpy_helper.from_array(np.array(0, np.int8), "qz")])  # fmt: skip
    nodes = list(m.graph.node)
    nodes[1].input[0] = "yd"  # the Greater reads the quantized y
    nodes[1:1] = [q.make_node("QuantizeLinear", ["y", "qs", "qz"], ["yq"], name="q"),
                  q.make_node("DequantizeLinear", ["yq", "qs", "qz"], ["yd"], name="dq")]  # fmt: skip
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    report = _built(tmp_path, m, x, "  reference_model: original.onnx\n")
    alone = report["reference_model"]["outputs"]["idx"]["quantized_vs_original"]
    assert alone["shape_mismatch"] and not alone["passed"], alone
    said = capsys.readouterr().out
    assert "idx: quantization alone shape [2, " in said, said
    assert "where the original model's is [2, " in said, said
    md = (tmp_path / "out" / "report.md").read_text()
    row = next(x for x in md.splitlines() if x.startswith("| `idx` | quantization alone"))
    assert "**FAIL**: shape [2, " in row and "where the original model's is" in row, row


def test_the_samples_whose_shapes_agree_give_the_figures_and_say_so(tmp_path, capsys):
    """Two samples, the first far from the threshold (the same count as FP32's), the second
    at it: the figures are the first sample's, and the line and junit.xml say so."""
    m, x = _thresholded()
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.concatenate([x + 0.5, x]))
    policy = tmp_path / "m.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [64, 64]\n"
        "    data: {file: x.npz}\naccuracy:\n  samples: 2\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if "idx: FAIL" in x)
    assert "(sample 1: a count the data decides); figures where the shapes agree: max_abs=" in line
    assert "figures where the shapes agree: max_abs=" in (out / "junit.xml").read_text()


def test_the_verdict_line_gives_both_shapes(tmp_path, capsys):
    m, x = _thresholded()
    _built(tmp_path, m, x)
    said = capsys.readouterr().out
    assert "idx: FAIL  shape [2, " in said and "where FP32's is [2, " in said, said
    line = next(x for x in said.splitlines() if "idx: FAIL" in x)
    assert "max_abs" not in line, line  # its one sample has another shape: no figure to give


@pytest.mark.parametrize(
    ("ref", "got", "axis", "want"),
    [  # NonMaxSuppression's rows (batch, class, box); NonZero's columns
        ([[0, 0, 3], [0, 0, 5]], [[0, 0, 3], [0, 0, 5], [0, 0, 9]], 0, (1, 2, 3)),
        ([[0, 0, 3], [0, 0, 5]], [[0, 0, 5], [0, 0, 3]], 0, (0, 2, 2)),  # the order alone
        ([[0, 1], [4, 2]], [[0, 1], [4, 3]], 1, (2, 2, 2)),  # (1, 2) became (1, 3)
        (np.zeros((0, 3)), [[0, 0, 1]], 0, (1, 0, 1)),
    ],
)
def test_a_selection_counts_the_tuples_chosen_by_one_side_only(ref, got, axis, want):
    from trtbuild.accuracy.judge import _selected

    differ, counts = _selected(np.asarray(ref, np.int64), np.asarray(got, np.int64), axis)
    assert (differ, counts["of"], counts["chosen"]) == want


def test_a_non_max_suppression_that_keeps_fewer_boxes_is_named_with_both_counts(tmp_path):
    """200 disjoint boxes scored across the 0.1 threshold (0.0999 to 0.1001): FP16 rounds
    the scores, keeps other boxes than FP32 (its rows: batch, class, box) and the first
    divergence names the `NonMaxSuppression`, with both counts."""
    n = 200
    m = model(
        [node("Mul", ["s", "one"], "scores", "scale"),
         node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "limit"], "sel", "nms")],
        [("boxes", F, [1, n, 4]), ("s", F, [1, 1, n])],
        [("sel", I64, ["k", 3])],
        {"one": np.array(1.0, np.float32), "most": np.array([n], np.int64),
         "iou": np.array([0.5], np.float32), "limit": np.array([0.1], np.float32)},
    )  # fmt: skip
    corner = np.arange(n, dtype=np.float32)[:, None] * 10
    boxes = np.concatenate([corner, corner, corner + 5, corner + 5], 1)[None, None]
    scores = np.linspace(0.0999, 0.1001, n, dtype=np.float32).reshape(1, 1, 1, n)
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", boxes=boxes, s=scores)
    policy = tmp_path / "m.yaml"
    policy.write_text(
        f"version: 1\nmodel: m.onnx\ninputs:\n  boxes:\n    shape: [1, {n}, 4]\n"
        f"    data: {{file: x.npz}}\n  s:\n    shape: [1, 1, {n}]\n    data: {{file: x.npz}}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 1
    report = json.loads((out / "report.json").read_text())
    (differ,) = report["outputs"]["sel"]["shape_mismatch"]
    decision = report["first_divergence"]["decision"]
    assert decision["node"] == "nms" and decision["of"] == differ["reference"][0], decision
    assert decision["chosen"] == differ["candidate"][0] != decision["of"], decision


def test_a_later_sample_judged_alone_is_named_by_its_own_number(tmp_path):
    """`tune` judges the sample likeliest to fail alone (`samples=[2]`): its failure, and
    the statistic that failed it (`worst`), name sample 2, not the first of the list."""
    from trtbuild.accuracy.judge import Candidate, judge_all
    from trtbuild.front import run_front
    from trtbuild.policy import load_policy
    from trtbuild.precision.assign import assign
    from trtbuild.precision.convert import convert

    m = model([node("Mul", ["x", "k"], "y", "scale")], [("x", F, [1, 4])], [("y", F, [1, 4])],
              {"k": np.array(1.0001, np.float32)})  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    x = np.array([[[0.0] * 4], [[0.0] * 4], [[1000.3] * 4]], np.float32)  # FP16 rounds 1000.4
    np.savez(tmp_path / "x.npz", x=x)
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 4], data: {file: x.npz}}\n"
        "accuracy:\n  samples: 3\n  tolerances: {default: {atol: 1e-3, rtol: 1e-5}}\n"
    )
    front = run_front(load_policy(tmp_path / "p.yaml"))
    run = front.shapes[0]
    mixed = convert(assign(front.view, front.policy.precision)).model
    (verdict,) = judge_all(
        run.reference.samples([2]), front.prepared.model, [Candidate(mixed)], [run.feeds[2]],
        front.policy.accuracy, detail="overflow", progress=False, samples=[2],
    )  # fmt: skip
    y = verdict.outputs["y"]
    assert y.failed_samples == [2] and y.checks["simple"]["worst"]["sample"] == 2, y.checks


def test_the_progress_line_counts_each_candidates_own_samples(tmp_path, capsys, monkeypatch):
    """Two candidates judged in turn on three samples: the line names the candidate, and
    its sample among three (not "4/6 samples")."""
    from trtbuild.accuracy import progress
    from trtbuild.accuracy.judge import Candidate, judge_all
    from trtbuild.front import run_front
    from trtbuild.policy import load_policy
    from trtbuild.precision.assign import assign
    from trtbuild.precision.convert import convert

    m = model([node("Mul", ["x", "k"], "y", "scale")], [("x", F, [1, 4])], [("y", F, [1, 4])],
              {"k": np.array(1.0001, np.float32)})  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 4]}\naccuracy: {samples: 3}\n"
    )
    front = run_front(load_policy(tmp_path / "p.yaml"))
    run = front.shapes[0]
    mixed = convert(assign(front.view, front.policy.precision)).model
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    capsys.readouterr()
    judge_all(
        run.reference, front.prepared.model, [Candidate(mixed), Candidate(front.prepared.model)],
        run.feeds, front.policy.accuracy, detail="overflow",
    )  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    assert "judging emulated-fp16: sample 1/3 of candidate 1/2" in lines, lines
    assert lines[-1] == "judging emulated-fp16: sample 3/3 of candidate 2/2", lines


def test_a_candidate_that_fails_on_a_later_sample_alone_is_walked_on_it(tmp_path, capsys):
    """Samples 0 and 1 hold in FP16, sample 2 overflows (40000 · 2): the walk ran on the
    first sample, which passes, and named no first divergence; it is walked on the sample
    it fails, named, and scaled by that sample's own peak (sample 0's is 2)."""
    m = model([node("Mul", ["x", "k"], "t", "scale"), node("Add", ["t", "z"], "y", "shift")],
              [("x", F, [1, 4])], [("y", F, [1, 4])],
              {"k": np.array(2.0, np.float32), "z": np.array(0.0, np.float32)})  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.array([[[1.0] * 4], [[1.0] * 4], [[4e4] * 4]], np.float32))
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 4], data: {file: x.npz}}\n"
        "accuracy:\n  samples: 3\n"
    )
    out = tmp_path / "out"
    argv = ["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(out), "--backend", "none"]
    assert main(argv) == 1
    found = json.loads((out / "report.json").read_text())
    first = found["first_divergence"]
    assert first["node"] == "scale" and first["sample"] == 2, first
    assert PointResult.from_json(found["shapes"][0]).first_divergence.sample == 2  # the library
    assert "FP32 peak |x| = 8e+04" in first["reason"], first
    printed = capsys.readouterr().out
    assert "first divergence at scale (4 non-finite" in printed
    said = [line for line in printed.splitlines() if "first divergence at scale" in line]
    assert len(said) == 2 and all(line.endswith(", on sample 2") for line in said), said
    assert ", on sample 2" in (out / "report.md").read_text()


def _requantizing(maker_type: int, grid: str) -> onnx.ModelProto:
    """x -> Relu (typed `maker_type`) -> Q (onto `grid`: int8 or fp8) -> DQ, a scale of 0.5."""
    import ml_dtypes

    zero = np.array(0, np.int8 if grid == "int8" else ml_dtypes.float8_e4m3fn)
    nodes = [
        node("Relu", ["x"], "r", "relu"),
        node("QuantizeLinear", ["r", "s", "z"], "q", "q"),
        node("DequantizeLinear", ["q", "s", "z"], "dq", "dq"),
    ]
    s = np.array(0.5, np.float16 if maker_type == H else np.float32)
    return model(
        nodes, [("x", maker_type, [4])], [("dq", maker_type, [4])], {"s": s, "z": zero}, opset=21
    )


def test_a_dequantizes_divergence_is_counted_in_steps_only_where_they_are_even():
    from trtbuild.accuracy.judge import in_steps

    first = {"node": "dq", "op": "DequantizeLinear", "tensor": "dq", "reason": "error 100%"}
    curve = [{"tensor": "dq", "rel_error": 1.0, "ref_max_abs": 1.0, "nonfinite": 0}]
    one = [{**curve[0], "rel_error": 0.5}]  # one step: what one rounding of relu's output makes
    said = in_steps(first, one, _requantizing(H, "int8"))["reason"]
    assert said.startswith(
        "error 100%: 1 quantization step of 0.5, where FP16's rounding of `relu`"
    )
    two = in_steps(first, curve, _requantizing(H, "int8"))["reason"]  # more: from further up
    assert two.endswith(
        "2 quantization steps of 0.5, where FP16's error in what `q` quantizes moved values "
        "across its rounding boundaries, by more steps than one rounding of `relu`'s output "
        "can: it came from further up"
    )
    fp8 = in_steps(first, curve, _requantizing(H, "fp8"))["reason"]
    assert fp8.startswith("error 100%: whole quantization steps, where")  # FP8's are uneven
    zero = [{**curve[0], "rel_error": "inf", "ref_max_abs": 0.0}]  # no nan steps
    assert "whole quantization steps" in in_steps(first, zero, _requantizing(H, "int8"))["reason"]
    pinned = in_steps(first, curve, _requantizing(F, "int8"))["reason"]
    assert pinned.endswith(
        ": 2 quantization steps of 0.5, where FP16's error in what `q` quantizes moved values across its rounding boundaries"
    )  # `relu` is FP32: no rule named
    for other in ({**first, "decision": {}}, {**first, "op": "Add"}, None):
        assert in_steps(other, curve, _requantizing(H, "int8")) == other
    broken = [{**curve[0], "nonfinite": 3}]  # an inf says more than steps
    assert in_steps(first, broken, _requantizing(H, "int8")) == first
    direct = _requantizing(H, "int8")
    direct.graph.node[1].input[0] = "x"  # a graph input's Q: read as given, FP32 the same
    assert in_steps(first, curve, direct) == first


def test_steps_are_counted_for_one_scale_only():
    from trtbuild.accuracy.judge import _step_count, _steps
    from trtbuild.graph.qdq import Requantized

    point = {"rel_error": 1.0, "ref_max_abs": 1.0}
    one = Requantized("q", "relu", True, np.array(0.25), True)
    assert _steps(_step_count(point, one), one) == "4 quantization steps of 0.25"
    per_axis = Requantized("q", "relu", True, np.array([0.5, 0.25]), True)
    assert _step_count(point, per_axis) is None
    assert _steps(_step_count(point, per_axis), per_axis) == "whole quantization steps"


def test_candidates_are_one_judgement_only_where_their_whole_graphs_are_alike():
    """Told apart without their large weights' data first, hashed whole where that leaves
    two alike: weights that differ only in their values are two candidates."""
    from onnx import TensorProto, helper, numpy_helper

    from trtbuild.accuracy.judge import Candidate, _identities

    def mixed(scale: float, op: str = "MatMul") -> onnx.ModelProto:
        w = numpy_helper.from_array(np.full((64, 64), scale, np.float32), "w")
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        graph = helper.make_graph([helper.make_node(op, ["x", "w"], ["y"])], "g", [x], [y], [w])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    a, same, other_data, other_op = mixed(1.0), mixed(1.0), mixed(2.0), mixed(1.0, "Add")
    ids = _identities([Candidate(m, "emulated-fp16") for m in (a, same, other_data, other_op)])
    assert ids[0] == ids[1] and len(set(ids)) == 3
    two = _identities([Candidate(a, "emulated-fp16"), Candidate(other_data, "emulated-fp16")])
    assert two[0] != two[1]  # two alike but for a weight's values: two judgements
    labelled = _identities([Candidate(a, "one"), Candidate(same, "two")])
    assert labelled[0] != labelled[1]  # one graph under two labels: two judgements


def test_a_suspect_on_the_first_sample_that_holds_leaves_the_failing_sample_walked(tmp_path):
    """A Mixtral of the dynamo exporter: its padding mask (`(1 - mask) · finfo.min`, -inf
    in FP16) made the first sample a suspect, so the walk ran there, where nothing
    overflows and nothing fails, and said "none: every intermediate tensor stays within
    the divergence threshold" of a policy failing on sample 1 by 44% of its range. The
    failing sample is walked too where the first found no overflow."""
    m = model(
        [node("Sub", ["one", "mask"], "pad", "invert"),
         node("Mul", ["pad", "low"], "bias", "to_bias"),
         node("Add", ["x", "bias"], "scores", "masked"),
         node("Softmax", ["scores"], "p", "softmax", axis=-1),
         node("Add", ["x", "big"], "t", "lift"),
         node("Sub", ["t", "big"], "y", "drop")],
        [("x", F, [1, 4]), ("mask", F, [1, 4])],
        [("p", F, [1, 4]), ("y", F, [1, 4])],
        {"one": np.array(1.0, np.float32), "low": np.array(MIN, np.float32),
         "big": np.array(1000.0, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    x = np.array([[[1.0, 2.0, 3.0, 4.0]], [[0.1, 0.3, 0.2, 0.4]], [[1.0, 2.0, 3.0, 4.0]]])
    mask = np.array([[[1.0, 1.0, 0.0, 0.0]]] * 3)
    np.savez(tmp_path / "x.npz", x=x.astype(np.float32), mask=mask.astype(np.float32))
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 4], data: {file: x.npz}}\n"
        "  mask: {shape: [1, 4], data: {file: x.npz}}\naccuracy:\n  samples: 3\n"
    )
    out = tmp_path / "out"
    argv = ["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(out), "--backend", "none"]
    assert main(argv) == 1
    found = json.loads((out / "report.json").read_text())
    assert found["outputs"]["y"]["failed_samples"] == [1], found["outputs"]
    assert found["outputs"]["p"]["passed"] and found["overflow"] is None, found
    first = found["first_divergence"]
    assert first is not None and first["node"] == "drop" and first["sample"] == 1, first


def test_a_later_feeds_nan_where_fp32_is_inf_is_no_overflow_as_on_the_first():
    """FP32 keeps no values of a later feed: a tensor it holds two +inf in there (a division
    by 0) is judged by counts. A NaN where FP32 is inf (0 / 0, the numerator under FP16's
    range) is not an overflow on the first feed (only values FP32 holds finite are), and
    is not one on a later feed; a third inf is."""
    from trtbuild.accuracy.judge import _beyond

    measures = ReferenceMeasures(
        [("t", "div", "Div")], {"t": 1.0}, frozenset(), {}, beyond={"t": {1: (2, 0, 0, 2)}}
    )
    inf = np.float32(np.inf)
    assert _beyond(measures, 1, "t", np.array([np.nan, np.nan, 1.0], np.float32)) is None
    assert _beyond(measures, 1, "t", np.array([inf, inf, 1.0], np.float32)) is None
    assert _beyond(measures, 1, "t", np.array([inf, inf, inf], np.float32))["nonfinite"] == 1
    assert _beyond(measures, 1, "t", np.array([np.nan, inf, -inf], np.float32))["nonfinite"] == 1
