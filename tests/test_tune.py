"""`trtbuild tune` finds the smallest FP32 set that meets the tolerances, and writes it down."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import ROOT
from tests.helpers import needs_rtx, read_log, run_tune, strict_tolerances, without_rules
from trtbuild.cli import main
from trtbuild.policy import load_policy


def _pinned_names(tuned) -> list[str]:
    return [r.match.name for r in load_policy(tuned).precision.rules]


@needs_rtx
def test_nafnet_from_no_rules_pins_only_norm_units_and_the_final_reduction(
    tmp_path, models_dir, capsys
):
    policy = without_rules("nafnet", tmp_path, models_dir)
    tuned = tmp_path / "out" / "tuned.yaml"
    assert run_tune(policy, tuned) == 0
    text = tuned.read_text()
    names = _pinned_names(tuned)
    assert sorted(names) == [
        r"^/blocks\.0/norm1/",
        r"^/blocks\.0/norm2/",
        r"^/blocks\.1/norm1/",
        r"^/blocks\.1/norm2/",
        r"^/head/ReduceSum$",
    ]
    # each tuned rule says, in a comment, the measured error or range that made it necessary
    rules = [x for x in text.splitlines() if x.strip().startswith("- {id: tuned-")]
    assert len(rules) == 5  # as a person writes them: no option at its default
    assert "dequantize" not in text
    for line in rules:
        comment = text.splitlines()[text.splitlines().index(line) - 1]
        assert comment.strip().startswith("#")
        assert "non-finite" in comment or "fail" in comment or "inf in FP16" in comment
    # every pin here is a range the reference leaves: known without a trial, one evaluation
    assert "after 1 evaluation(s)" in text
    # the tuned policy is a policy: it builds and passes, with the model path re-based
    assert main(["build", "--policy", str(tuned), "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["passed"] and report["precision"]["fp16_share"] > 0.42
    log = read_log(tmp_path / "out" / "tuned.log.jsonl")
    assert log[0]["action"].startswith("start") and log[-1]["step"] == len(log)
    err = capsys.readouterr().err
    assert "tune [" in err  # the progress bar


def _trials(log) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in read_log(log)]


@pytest.mark.parametrize("jobs", ["2", "3"])
def test_same_seed_same_policy_whatever_the_jobs(jobs, tmp_path, models_dir):
    """Parallel workers judge ahead (the next doublings, both halves, the next removals), but
    a verdict becomes a trial only when the one-job search asks for it."""
    policy = strict_tolerances(without_rules("nafnet", tmp_path, models_dir))
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert run_tune(policy, a, "--seed", "7", "--budget", "30", "--jobs", "1") == 0
    assert run_tune(policy, b, "--seed", "7", "--budget", "30", "--jobs", jobs) == 0
    assert a.read_text() == b.read_text()
    trials = _trials(tmp_path / "a.log.jsonl")
    assert trials == _trials(tmp_path / "b.log.jsonl")
    steps = {t["action"].split(":")[0].split(" ")[0] for t in trials}
    assert {"grow", "bisect", "unpin"} <= steps  # every step that judges ahead was taken


def test_points_judged_in_parallel_give_the_same_trials(example_policy, tmp_path):
    """With workers, one pin set is judged at its min, opt and max points at once; the
    merged verdict is what one job records (the failure at max names its point)."""
    policy = example_policy("denoiser", rules="[]")
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert run_tune(policy, a, "--jobs", "1") == 0
    assert run_tune(policy, b, "--jobs", "2") == 0
    assert a.read_text() == b.read_text()
    assert _trials(tmp_path / "a.log.jsonl") == _trials(tmp_path / "b.log.jsonl")
    assert "reaches |x|" in a.read_text()  # the energy past 65504 at 1000 frames


@pytest.mark.parametrize(
    ("cores", "jobs"), [(1, 1), (2, 1), (3, 1), (4, 2), (7, 3), (8, 4), (64, 4)]
)
def test_jobs_default_to_one_per_two_usable_cores_up_to_four(monkeypatch, cores, jobs):
    from trtbuild import tuning

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert tuning.default_jobs() == jobs


def test_streaming_gru_enhancer_is_tuned_in_a_few_evaluations(tmp_path, models_dir):
    """The benchmark's recurrent model: the power spectrum is inf in FP16 (three pins known
    from the ranges, never re-judged) and the dB normalisation amplifies FP16's rounding
    (25 dB of SNR where 40 are asked). The error map ranks the normalisation's subtraction
    and the dB scaling first: a passing policy in four evaluations where halving every
    group took twenty. The five single-node pins are the feature extraction's: one rule for
    its scope, judged once more, is what a person would write."""
    text = (ROOT / "benchmarks" / "policies" / "gru_enhancer.yaml").read_text()
    policy = tmp_path / "gru.yaml"
    policy.write_text(text.replace("../../models/", f"{models_dir}/"))
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(policy, tuned) == 0
    assert _pinned_names(tuned) == [r"^/feat/"]
    assert "5 pins inside it merged" in tuned.read_text()
    log = read_log(tmp_path / "tuned.log.jsonl")
    assert len(log) <= 5 and log[-1]["step"] == len(log)
    assert log[-1]["action"] == "merge into scope /feat/" and log[-1]["passed"]
    assert not any(t["action"].startswith("unpin node /feat/Log") for t in log)
    assert main(["build", "--policy", str(tuned), "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["passed"] and set(report["outputs"]) >= {"enhanced", "h0_out", "cache3_out"}


def test_gfpgan_pins_exactly_the_last_reduction(tmp_path, models_dir):
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(without_rules("gfpgan", tmp_path, models_dir), tuned) == 0
    assert _pinned_names(tuned) == [r"^/energy/ReduceSumSquare$"]


def test_policy_rules_are_kept_first_and_unchanged(tmp_path, write_policy):
    rules = "    - id: mine\n      match: {name: '^/intro/Conv$'}\n      precision: fp32\n"
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(write_policy(rules=rules), tuned, "--objective", "flops") == 0
    loaded = load_policy(tuned).precision.rules
    assert loaded[0].id == "mine" and loaded[0].match.name == "^/intro/Conv$"
    assert all(r.id.startswith("tuned-") for r in loaded[1:])
    assert "/intro/Conv" not in "".join(r.match.name for r in loaded[1:])


def test_a_rule_that_matches_no_node_is_said_as_check_says_it(tmp_path, write_policy, capsys):
    """`check` and `build` warn of a rule of the policy that matches no node (a typo in a
    name); `tune` searched around it in silence."""
    rules = "    - id: typo\n      match: {name: '^/intro/Cnov$'}\n      precision: fp32\n"
    assert run_tune(write_policy(rules=rules), tmp_path / "tuned.yaml", "--budget", "2") in (0, 1)
    assert "rule 'typo' matches no node" in capsys.readouterr().err


def test_a_range_rule_is_matched_on_the_reference_in_every_trial(tmp_path, write_policy):
    """`max_abs_above` reads the FP32 reference's peaks, which tune has: its rule holds in
    every trial as in `build`."""
    rules = "    - id: big\n      match: {max_abs_above: 65504}\n      precision: fp32\n"
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(write_policy(rules=rules), tuned) == 0
    loaded = load_policy(tuned).precision.rules
    assert loaded[0].id == "big" and loaded[0].match.max_abs_above == 65504


def test_budget_exhausted_is_exit_1_and_says_so(tmp_path, models_dir):
    policy = strict_tolerances(without_rules("nafnet", tmp_path, models_dir))
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(policy, tuned, "--budget", "1") == 1  # the start fails, nothing left to try
    assert "DOES NOT PASS" in tuned.read_text()
    assert len(read_log(tmp_path / "tuned.log.jsonl")) == 1


def test_a_budget_that_ends_mid_search_keeps_the_shortest_passing_run_found(
    tmp_path, models_dir, capsys
):
    """Out of evaluations while halving back, the search pins what it knows passes: a policy
    that passes, not minimal, and says the budget ran out."""
    policy = strict_tolerances(without_rules("nafnet", tmp_path, models_dir))
    full = tmp_path / "full.yaml"
    assert run_tune(policy, full) == 0  # every tolerance exact: most groups end up pinned
    rows = read_log(tmp_path / "full.log.jsonl")
    grown = next(r["step"] for r in rows if r["action"].startswith("grow") and r["passed"])
    assert rows[grown]["action"].startswith("bisect")  # halving back after the doubling passed
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(policy, tuned, "--budget", str(grown + 1)) == 0
    cut = read_log(tmp_path / "tuned.log.jsonl")
    assert [r["action"] for r in cut] == [r["action"] for r in rows[: grown + 1]]
    assert "passes" in tuned.read_text().splitlines()[1]
    assert "ran out before the search ended, so a smaller pin set" in capsys.readouterr().err
    enough = tmp_path / "enough.yaml"  # the full search's own count: it ends on its last one
    assert run_tune(policy, enough, "--budget", str(len(rows))) == 0
    assert "ran out" not in capsys.readouterr().err and "exhausted" not in enough.read_text()
    assert _pinned_names(enough) == _pinned_names(full)


@pytest.mark.parametrize("args", [["--budget", "0"], ["--objective", "speed"]])
def test_bad_arguments_are_exit_2(tmp_path, write_policy, args):
    assert run_tune(write_policy(), tmp_path / "t.yaml", *args) == 2
    assert not (tmp_path / "t.yaml").exists()


def test_a_policy_already_fp32_is_exit_2(tmp_path, write_policy, capsys):
    text = write_policy().read_text().replace("default: fp16", "default: fp32")
    policy = tmp_path / "fp32.yaml"
    policy.write_text(text)
    assert run_tune(policy, tmp_path / "t.yaml") == 2
    line = text.splitlines().index("  default: fp32") + 1
    assert f"{policy.resolve()}:{line}: precision.default: " in capsys.readouterr().err


@needs_rtx
def test_ppocrv4_tuned_policy_passes_with_95_percent_fp16(tmp_path, models_dir, real_model):
    tuned = tmp_path / "tuned.yaml"
    policy = without_rules("ppocrv4_rec", tmp_path, models_dir, real_model)
    assert run_tune(policy, tuned) == 0
    assert main(["build", "--policy", str(tuned), "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["passed"] and report["precision"]["fp16_share"] >= 0.95


@needs_rtx
def test_bert_from_no_rules_pins_no_attention_block_for_the_mask_sentinel(example_policy, tmp_path):
    """-3.4e38 becoming -inf in FP16 is not an overflow: tune must not pin attention for it."""
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(example_policy("bert", rules="[]"), tuned) == 0
    log = read_log(tmp_path / "tuned.log.jsonl")
    assert not any("attention block" in g for t in log for g in t["pinned_groups"])
    assert "guards: true" in tuned.read_text()  # the tuned policy keeps the guards
    assert "emulation storage" in tuned.read_text().splitlines()[2]
    assert main(["build", "--policy", str(tuned), "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["precision"]["rule_hits"]["guard:weight-range"] == 1


def test_ppocrv4_det_pins_no_squeeze_excitation_block_for_sums_only_a_kernel_would_store(
    example_policy, tmp_path
):
    """The real detector's SE blocks average 160x160 maps: at risk, but no stored overflow.
    On rendered text the example's own pins (tuned from `rules: []`, none an SE pool) are
    what it needs: tune adds nothing."""
    policy = example_policy("ppocrv4_det")
    tuned = tmp_path / "det.yaml"
    assert run_tune(policy, tuned, "--budget", "20") == 0
    assert _pinned_names(tuned) == _pinned_names(policy) and len(_pinned_names(policy)) == 24
    assert not any("GlobalAveragePool" in name for name in _pinned_names(tuned))


def test_a_pin_no_overflow_names_is_found_first_by_the_error_map(tmp_path, real_model):
    """The real detector on a real photo, judged by its mean error (the benchmark's case):
    nothing overflows, and one early convolution is what the output cannot do without.
    The error map of the failing start names it first; removing it again is the start."""
    text = (ROOT / "benchmarks" / "policies" / "ppocrv4_det_photo.yaml").read_text()
    photos = real_model("photo_text").parent
    text = text.replace("../../models/ppocrv4_det.onnx", str(real_model("ppocrv4_det")))
    policy = tmp_path / "photo.yaml"
    policy.write_text(text.replace("../../models/photos/text", str(photos)))
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(policy, tuned, "--objective", "flops") == 0
    assert _pinned_names(tuned) == [r"^p2o\.Conv\.1$"]
    log = read_log(tmp_path / "tuned.log.jsonl")
    # one emulated run's error map ranks the convolution whose error jumps first among 277
    # groups: no halving of all of them (that took 12 evaluations), and no set judged twice
    assert [t["action"] for t in log] == ["start: policy rules only", "grow: pin node p2o.Conv.1"]
    assert not [t for t in log if "ranking" in t]  # the map ranks: no run of each group alone


def test_ppocrv4_det_lists_its_squeeze_excitation_pools_at_risk(example_policy, capsys):
    assert main(["check", "--policy", str(example_policy("ppocrv4_det")), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["at_risk"]
    # four at opt (640x640); at the profile's max (960x960) a fifth pool's sum leaves FP16 too
    assert len(found) == 5 and {r["op"] for r in found} == {"GlobalAveragePool"}
    assert all(r["quantity"] == "sum behind the mean" and r["peak"] > 65504 for r in found)


def test_a_trial_opens_one_session_a_run_kind_and_never_reruns_the_reference(
    tmp_path, models_dir, monkeypatch
):
    """A trial's candidate fits one segment here: one session hands out every tensor of the
    first feed, one only the outputs of the second; the FP32 reference runs neither in the
    front half again nor beside the trial (tune walks only the overflow)."""
    import onnxruntime

    from trtbuild import front, tuning

    stages = front.run_front(load_policy(without_rules("nafnet", tmp_path, models_dir)))
    opened = []

    class Counting(onnxruntime.InferenceSession):  # a real session, counted
        def __init__(self, *args, **kwargs):
            opened.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Counting)
    from trtbuild.accuracy import reference  # `front` imports it where a reference runs

    monkeypatch.setattr(reference, "run_reference", lambda *a, **k: pytest.fail("reran"))
    outcome = tuning.evaluate(stages, stages.policy.precision)
    assert not outcome.passed and "total" in outcome.failing  # judged for real: FP16 overflows
    assert len(opened) == 2


def test_tune_pins_the_running_sum_inside_a_loop_body(tmp_path, models_dir, capsys):
    policy = without_rules("loop_sum", tmp_path, models_dir)
    tuned = tmp_path / "tuned.yaml"
    assert run_tune(policy, tuned) == 0
    assert _pinned_names(tuned) == ["^running_sum/body/accumulate$"]
    assert "pinned node running_sum/body/accumulate" in capsys.readouterr().out


@needs_rtx
def test_a_quantized_model_is_tuned_on_its_float_ops_only(
    tmp_path, models_dir, quantized_dir, capsys
):
    from trtbuild.front import run_front
    from trtbuild.graph.qdq import QdqGraph

    int8 = lambda stem: quantized_dir / f"{stem}_int8.onnx"  # noqa: E731
    policy = without_rules("nafnet", tmp_path, models_dir, real_model=int8)
    tuned = tmp_path / "out" / "tuned.yaml"
    assert run_tune(policy, tuned) == 0
    said = capsys.readouterr().out  # the INT8 share, as `convert` says it, in both places
    front = run_front(load_policy(tuned), reference="none")
    share = front.assignment.summary().share_text()
    assert "INT8" in share and f"passes (emulated-fp16, storage emulation): {share}, " in said
    assert f"passes with {share} (of compute nodes)" in tuned.read_text()
    qdq = QdqGraph(front.view)
    names = {front.view.nodes[i].name for i in qdq.nodes}
    hits = front.assignment.rule_hits
    assert any(k.startswith("tuned-") and n for k, n in hits.items())
    for i, d in enumerate(front.assignment.decisions):  # no Q/DQ pinned by a tuned rule
        if d.rule.startswith("tuned-"):
            assert front.view.nodes[i].name not in names
    assert all(front.assignment.decisions[i].rule == "qdq" for i in qdq.nodes)
    assert "pinned by tune" not in tuned.read_text()  # every pin says its measured reason
    out = tmp_path / "b"
    code = main(["build", "--policy", str(tuned), "--backend", "tensorrt-rtx", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert (out / "engine.plan").stat().st_size > 0


def test_a_tuned_quantized_policy_keeps_its_reference_model(tmp_path, quantized_dir):
    """`accuracy.reference_model` is re-based like `model` when the tuned policy is written
    elsewhere: it names the same model before quantization."""
    (tmp_path / "policies").mkdir()
    source = tmp_path / "policies" / "q.yaml"
    source.write_text(
        f"version: 1\nmodel: {quantized_dir / 'nafnet_tiny_int8.onnx'}\n"
        "inputs:\n  input: {shape: [1, 3, 64, 64]}\n"
        "precision: {default: fp16}\n"
        "accuracy:\n  samples: 1\n  reference_model: ../models/nafnet_tiny.onnx\n"
        "  tolerances: {default: {atol: 1, rtol: 1}}\n"
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "nafnet_tiny.onnx").write_bytes(
        (quantized_dir / "nafnet_tiny.onnx").read_bytes()
    )
    out = tmp_path / "elsewhere" / "deeper" / "tuned.yaml"
    out.parent.mkdir(parents=True)
    assert main(["tune", "--policy", str(source), "-o", str(out)]) == 0
    tuned = load_policy(out)
    assert tuned.accuracy.reference_model == (tmp_path / "models" / "nafnet_tiny.onnx").resolve()


def test_a_quantized_model_whose_quantization_fails_is_told_so(
    tmp_path, quantized_dir, caplog, capsys
):
    """Judged against its FP32 model at a tolerance INT8 cannot meet, every group pinned
    still fails: `tune` said DOES NOT PASS and not why (a ModelOpt INT8 ResNet-18 did so
    after 8 evaluations), then said why, still after pinning every group (an INT8 ViT: 8
    evaluations, a policy 0% FP16). The quantization alone is judged from the reference's
    runs first: the policy is judged once, nothing searched, and the warning says the fix."""
    source = tmp_path / "q.yaml"
    source.write_text(
        f"version: 1\nmodel: {quantized_dir / 'nafnet_tiny_int8.onnx'}\n"
        "inputs:\n  input: {shape: [1, 3, 64, 64]}\n"
        "precision: {default: fp16}\n"
        f"accuracy:\n  samples: 1\n  reference_model: {quantized_dir / 'nafnet_tiny.onnx'}\n"
        "  tolerances: {default: {atol: 1e-6, rtol: 0}}\n"
    )
    with caplog.at_level("WARNING", logger="trtbuild"):
        assert main(["tune", "--policy", str(source), "-o", str(tmp_path / "t.yaml")]) == 1
    said = [r.getMessage() for r in caplog.records if "quantization alone" in r.getMessage()]
    assert len(said) == 1 and "fails the tolerances against the reference model (at " in said[0]
    assert "searched nothing" in said[0] and "`dequantize: true`" in said[0]
    assert "rules, 1 evaluation(s)" in capsys.readouterr().out  # the start (range analysis) only


def test_a_policy_with_dequantize_rules_is_searched_not_said_hopeless(
    tmp_path, quantized_dir, caplog, capsys
):
    """The graph's own run measures the quantization as given; the policy's `dequantize:
    true` rules change what stays quantized, so it proves nothing about the policy: the
    search runs (it judged the policy once and said no pin could fix it)."""
    source = tmp_path / "q.yaml"
    source.write_text(
        f"version: 1\nmodel: {quantized_dir / 'nafnet_tiny_int8.onnx'}\n"
        "inputs:\n  input: {shape: [1, 3, 64, 64]}\n"
        "precision:\n  default: fp16\n  rules:\n"
        "    - {id: out, match: {name: '^/ending/'}, precision: fp16, dequantize: true}\n"
        f"accuracy:\n  samples: 1\n  reference_model: {quantized_dir / 'nafnet_tiny.onnx'}\n"
        "  tolerances: {default: {atol: 1e-6, rtol: 0}}\n"
    )
    args = ["tune", "--policy", str(source), "-o", str(tmp_path / "t.yaml"), "--budget", "4"]
    with caplog.at_level("WARNING", logger="trtbuild"):
        assert main(args) == 1
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "searched nothing" not in said
    assert "rules, 1 evaluation(s)" not in capsys.readouterr().out  # it searched


def test_an_output_that_fails_only_once_another_passes_is_grown_too(tmp_path):
    """Two outputs, `(x + 1000) - 1000` each (FP16 rounds x to 0.5 there), each fed 0.3 on
    one sample of two: the first trial fails on `a` (its sample first), pinning `a`'s
    suspects then fails on `b`. The search stopped there (DOES NOT PASS, saying FP16 was
    not what failed it, found by the review); it grows `b`'s suspects next."""
    import numpy as np
    import onnx

    from tests.helpers import F, model, node

    nodes = []
    for t in "ab":
        nodes += [node("Add", [f"x{t}", "k"], f"s{t}", f"add_{t}"),
                  node("Sub", [f"s{t}", "k"], t, f"sub_{t}")]  # fmt: skip
    m = model(nodes, [("xa", F, [1, 4]), ("xb", F, [1, 4])], [("a", F, [1, 4]), ("b", F, [1, 4])],
              {"k": np.float32(1000.0)})  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    xa = np.zeros((2, 1, 4), np.float32)
    xb = np.zeros((2, 1, 4), np.float32)
    xa[0], xb[1] = 0.3, 0.3
    np.savez(tmp_path / "d.npz", xa=xa, xb=xb)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\n"
        "inputs: {xa: {data: {file: d.npz}}, xb: {data: {file: d.npz}}}\n"
        "precision: {default: fp16}\nbuild: {backend: none}\n"
        "accuracy: {samples: 2, tolerances: {default: {atol: 1e-3, rtol: 0}}}\n"
    )
    tuned = tmp_path / "t.yaml"
    assert main(["tune", "--policy", str(policy), "-o", str(tuned)]) == 0
    pinned = " ".join(_pinned_names(tuned))
    assert "add_a" in pinned and "add_b" in pinned


def test_early_stop_never_accepts_a_candidate_that_fails_at_any_point(example_policy):
    """A candidate is judged at the point likeliest to fail first (the last to fail, else the
    largest; before any failure the cheapest) and stopped at its first failing point; a pass before the verification may
    leave out points. Every failure the search recorded is the verdict of judging every
    point, every pass holds at the points it names, and the answer was judged at all of
    them and passes there."""
    from trtbuild import front, tuning

    strict = {"{atol: 1e-2, rtol: 1e-2}": "{atol: 2e-3, rtol: 0, check_error_stat: max}"}
    policy = load_policy(example_policy("denoiser", rules="[]", replace=strict))
    stages = front.run_front(policy, reference="tensors")
    result = tuning.tune(stages, budget=30)
    assert result.passed
    points = {run.point.name for run in stages.shapes}
    failed = [t for t in result.trials if not t.passed]
    assert failed and any(len(t.points) < len(points) for t in failed)  # stopped early
    names = [n.name for n in stages.view.nodes]

    def every_precision(t):
        return tuning.candidate_precision(policy.precision, result.groups, list(t.pinned), names)

    for t in result.trials:
        every = tuning.evaluate(stages, every_precision(t))
        if t.passed:  # at the points it was walked through
            named = [k for k, run in enumerate(stages.shapes) if run.point.name in t.points]
            assert tuning.evaluate(stages, every_precision(t), tuple(named)).passed, t.action
        else:  # the walk stopped at the first point that fails, the only one it names
            assert not every.passed, t.action
            assert {k.split(":")[0] for k in t.failing} == {f"at {t.points[-1]}"}
    answer = next(t for t in reversed(result.trials) if t.pinned == tuple(result.pinned))
    assert answer.passed and set(answer.points) == points
    assert tuning.evaluate(stages, result.policy).passed


def test_an_answer_failing_where_no_trial_failed_is_searched_again_walking_it(example_policy):
    """A pass before the verification leaves out the points larger than every point some
    trial failed at. When the answer then fails at one of them, the search starts again
    walking it too, and its answer passes everywhere. Here the search is told a trial
    failed at the smallest point, where all-FP16 passes (it fails at the larger two)."""
    from trtbuild import front, tuning
    from trtbuild.tuning.search import Search, _grown

    strict = {"{atol: 1e-2, rtol: 1e-2}": "{atol: 2e-3, rtol: 0, check_error_stat: max}"}
    policy = load_policy(example_policy("denoiser", rules="[]", replace=strict))
    stages = front.run_front(policy, reference="tensors")
    search = Search(stages, budget=30, objective="nodes", seed=0, jobs=1)
    smallest = min(range(len(stages.shapes)), key=lambda k: search.walk.sizes[k])
    search.walk.last_failed[smallest] = 0  # as if a trial had failed there
    assert _grown(search)
    first, verify = search.trials[:2]
    assert first.passed and first.points == (stages.shapes[smallest].point.name,)
    assert verify.action == "verify: every point" and not verify.passed
    assert len(search.trials) > 2  # searched again from the range analysis's pins
    answer = next(t for t in reversed(search.trials) if t.pinned == tuple(sorted(search.pinned)))
    assert answer.passed and set(answer.points) == {run.point.name for run in stages.shapes}
    assert tuning.evaluate(stages, search.precision(search.pinned)).passed


def test_a_sample_judged_alone_gets_the_verdict_it_gets_among_the_others(example_policy):
    """NAFNet with its overflows pinned, judged on the largest error with a tolerance
    between its samples' errors: each sample judged alone (`judge_units`, as `tune` walks
    them) passes or fails as it does judged with all of them, and a failure names its
    own sample; the samples but one, at once, name theirs."""
    from trtbuild import front, tuning
    from trtbuild.tuning.groups import beyond_range
    from trtbuild.tuning.pool import judge_units
    from trtbuild.tuning.search import Search

    def judged(atol: str):
        largest = {
            "default: {atol: 1e-2, rtol: 1e-2, check_error_stat: median}": (
                f"default: {{atol: {atol}, rtol: 0, check_error_stat: max}}\n"
                "    outputs: {total: {atol: 1e9, rtol: 0}}"  # judged on its image alone
            )
        }
        policy = load_policy(example_policy("nafnet", rules="[]", replace=largest))
        stages = front.run_front(policy, reference="tensors")
        search = Search(stages, budget=10, objective="nodes", seed=0, jobs=1)
        return stages, search.precision(beyond_range(search.groups, search.low))

    stages, pins = judged("1")
    count = len(stages.shapes[0].feeds)
    errors = [judge_units(stages, pins, [(0, (j,))])[0].worst["restored"] for j in range(count)]
    assert count >= 3 and len(set(errors)) == count
    between = sorted(errors)[count // 2 - 1 : count // 2 + 1]
    stages, pins = judged(f"{sum(between) / 2:.6g}")

    def named(outcome) -> set[int]:  # the samples its failures name, every output's
        found = re.findall(r"sample\(s\) ([\d, ]+) fail", " ".join(outcome.failing.values()))
        return {int(j) for said in found for j in said.split(", ")}

    failing = named(tuning.evaluate(stages, pins))  # all samples at once, as `build` judges
    assert 0 < len(failing) < count
    for j in range(count):
        (alone,) = judge_units(stages, pins, [(0, (j,))], stop=True)
        assert alone.passed == (j not in failing) and named(alone) == failing & {j}
        assert alone.failed_on == (None if alone.passed else j)
    (others,) = judge_units(stages, pins, [(0, tuple(range(1, count)))])
    assert named(others) == failing - {0} and others.passed == (failing <= {0})
    for j in range(count):  # all FP16: each sample overflows, walked as its own feed
        (alone,) = judge_units(stages, stages.policy.precision, [(0, (j,))])
        assert alone.overflow["sample"] == j and alone.failed_on == j


def test_a_provisional_pass_leaves_out_only_points_larger_than_every_failing_one():
    """Until a trial fails every point is walked, the cheapest first; then the points no
    larger than the largest that failed (a smaller one costs little), the last to fail
    first, then the largest; and every point again once the search verifies."""
    from trtbuild.tuning.search import PointWalk

    walk = PointWalk([64, 16, 256, 16], samples=[2, 3, 1, 1])
    walk.full = False
    assert walk.walking() == [1, 3, 0, 2] and not walk.provisional()
    walk.last_failed = {1: 4}
    assert walk.walking() == [1, 3] and walk.provisional()
    walk.last_failed = {1: 4, 0: 7}
    assert walk.walking() == [0, 1, 3]
    walk.full = True
    assert walk.walking() == [0, 1, 2, 3] and not walk.provisional()
    # at each point the sample a trial last failed on there alone, then the others
    walk.lead = {1: 2}
    assert walk.units() == [(0, (0,)), (0, (1,)), (1, (2,)), (1, (0, 1)), (2, (0,)), (3, (0,))]


def test_single_node_pins_are_offered_as_their_scope_where_it_splits_no_unit():
    """A scope holding two or more single-node pins is offered as one rule when what it adds
    costs at most half of them; a scope that would split a unit is not offered."""
    from trtbuild.policy.specs import Precision
    from trtbuild.tuning.groups import Group, candidate_precision, scopes

    def group(kind, *names):
        return Group(kind, tuple(range(len(names))), names, float(len(names)), 0.0)

    groups_ = [
        group("node", "/enc0/Conv"),
        group("node", "/enc0/Relu"),
        group("node", "/enc0/Add"),  # not pinned: the scope adds it
        group("normalization unit", "/enc1/norm/Sub", "/dec/norm/Div"),  # spans two scopes
        group("node", "/enc1/Conv"),
        group("node", "/dec/Conv"),
        group("node", "/enc1/Relu"),  # /enc1/ holds two single pins: only the unit stops it
    ]
    offered = scopes(groups_, pinned=[0, 1, 3, 4, 5, 6])
    assert [s.prefix for s in offered] == ["/enc0/"]
    (scope,) = offered
    assert scope.members == (0, 1) and scope.covered == (0, 1, 2) and scope.extra == 1.0
    merged = scope.group(groups_)
    assert merged.regex == "^/enc0/" and merged.label == "scope ^/enc0/ (3 nodes)"
    names = [n for g in groups_ for n in g.names]
    pinned = [len(groups_)]  # the merged scope, after the groups
    rules = candidate_precision(Precision(default="fp16"), [*groups_, merged], pinned, names).rules
    assert [r.match.name for r in rules] == ["^/enc0/"]
    # a scope adding more than half of what it replaces is not offered
    assert scopes([*groups_, group("node", "/enc0/Mul")], pinned=[0, 1]) == []


def test_an_answer_with_almost_nothing_low_says_the_tolerance_is_the_cause(tmp_path, capsys):
    """Every element exact on a product FP16 rounds: the answer keeps it FP32, and `tune`
    says the tolerance is the likely cause, not a budget (which it did not run out of)."""
    import numpy as np
    import onnx

    from tests.helpers import F, model, node

    m = model(
        [node("Mul", ["x", "w"], "a", "mul"), node("Add", ["a", "w"], "y", "add")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"w": np.array([[1.0001, 3.0007, 0.3333, 7.77]], np.float32)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 4]}\nprecision: {default: fp16}\n"
        "accuracy:\n  tolerances:\n    default: {atol: 0.0, rtol: 0.0, check_error_stat: max}\n"
    )
    assert run_tune(policy, tmp_path / "t.yaml") == 0
    err = capsys.readouterr().err
    assert "tune kept only 0.0% of the model in FP16: the tolerances are likely tighter" in err
    assert "more --budget rarely keeps more in FP16" in err and "ran out before" not in err


def test_an_overflow_in_a_cast_the_conversion_added_pins_a_reader_of_its_value(tmp_path):
    """The emulation's first non-finite value may be a Cast the conversion added (a value
    narrowed for a low reader): no node of the graph has its name, and the search ended
    in a KeyError (exit 70). The readers of its source come first, then upstream."""
    import numpy as np

    from tests.helpers import F, bare_policy, model, node
    from trtbuild import front
    from trtbuild.tuning.search import Search, _overflowing_group

    m = model(
        [
            node("Mul", ["x", "gain"], "big", "scale"),
            node("Sigmoid", ["big"], "y", "reader"),
        ],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"gain": np.float32(2.0)},
    )
    stages = front.run_front(load_policy(bare_policy(tmp_path, m)), reference="tensors")
    search = Search(stages, budget=5, objective="nodes", seed=0, jobs=1)
    group = {name: k for k, g in enumerate(search.groups) for name in g.names}
    cast = {"node": "trtbuild/cast_fp16/big", "op": "Cast", "source": "big", "sample": 0}
    assert _overflowing_group(search, cast) == group["reader"]
    search.pinned = [group["reader"]]  # its reader pinned: the maker, upstream
    assert _overflowing_group(search, cast) == group["scale"]
    # a Cast in front of a graph output, whose source no node of the graph reads: its maker
    search.pinned = []
    out = {"node": "trtbuild/cast_fp16/y", "op": "Cast", "source": "y", "sample": 0}
    assert _overflowing_group(search, out) == group["reader"]
    search.pinned = sorted(group.values())
    assert _overflowing_group(search, cast) is None


def test_a_count_fp16_changes_in_the_second_sample_is_named_there_by_every_trial(tmp_path, capsys):
    """Two `Mul`s before `NonZero(y > 0.1)`; the second sample sits at 0.1, the first far from
    it. Every failing trial (the later ones judge the sample that failed alone, first) names
    the second sample and both shapes, and so does the pin's reason."""
    import numpy as np
    import onnx

    from tests.helpers import I64, F, model, node

    m = model(
        [node("Mul", ["x", "one"], "y0", "scale0"),
         node("Mul", ["y0", "one"], "y", "scale"),
         node("Greater", ["y", "limit"], "above", "greater"),
         node("NonZero", ["above"], "idx", "nonzero")],
        [("x", F, [64, 64])], [("idx", I64, [2, "n"])],
        {"one": np.array(1.0, np.float32), "limit": np.array(0.1, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    near = np.linspace(0.09, 0.11, 64 * 64, dtype=np.float32).reshape(1, 64, 64)
    np.savez(tmp_path / "x.npz", x=np.concatenate([near + 0.5, near]))
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [64, 64]\n"
        "    data: {file: x.npz}\naccuracy:\n  samples: 2\n"
    )
    assert main(["tune", "--policy", str(policy), "-o", str(tmp_path / "t.yaml")]) == 0
    said = "(sample 1: a count the data decides)"
    assert "without it: idx: shape [2, " in capsys.readouterr().out
    log = read_log(tmp_path / "t.log.jsonl")
    failing = [t["failing"]["idx"] for t in log if not t["passed"]]
    assert len(failing) >= 2 and all(said in f for f in failing), failing


def test_integer_inputs_given_no_range_are_said_before_the_search(tmp_path, caplog):
    """`tune` says what `check` says of an integer input that is 0 everywhere (the default
    range), before it searches on such data."""
    import numpy as np
    import onnx

    from tests.helpers import model, node

    m = model(
        [node("Gather", ["table", "ids"], "e", "embed"), node("Add", ["e", "x"], "y", "add")],
        [("ids", onnx.TensorProto.INT64, [1, 4]), ("x", onnx.TensorProto.FLOAT, [1, 4, 3])],
        [("y", onnx.TensorProto.FLOAT, [1, 4, 3])],
        {"table": np.arange(6, dtype=np.float32).reshape(2, 3)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 4, 3]}\n  ids: {shape: [1, 4]}\n"
        "accuracy: {tolerances: {default: {atol: 1.0, rtol: 0}}}\n"
    )
    with caplog.at_level("WARNING", logger="trtbuild"):
        main(["tune", "--policy", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "t.yaml")])
    said = [
        r.getMessage() for r in caplog.records if "(ids is 0, in every sample" in r.getMessage()
    ]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
