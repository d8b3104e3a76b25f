"""What `tune` says of its answer: the low-share warning and when it is not said."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import F, model, node
from trtbuild.cli import main
from trtbuild.policy.specs import Precision
from trtbuild.tuning.output import FEW_LOW, tight_warning
from trtbuild.tuning.search import SearchResult, Trial


def _result(passed: bool, low: float, start: float) -> SearchResult:
    """A search whose one pin's removal failed a tolerance (`tight_warning` needs one)."""
    first = Trial(1, "start: range analysis", (), passed, start, {}, {}, 0.0)
    needed = {0: "without it: y: sample(s) 0 fail atol 0.001, rtol 0 on the elemwise"}
    return SearchResult(Precision(), [], [0], needed, "", [first], passed=passed, low_share=low)


def test_an_answer_that_keeps_little_blames_the_tolerances():
    said = tight_warning(_result(True, FEW_LOW / 2, 1.0))
    assert said is not None and said.startswith("tune kept only 5.0% of the model in FP16")


@pytest.mark.parametrize(
    ("passed", "low", "start"),
    [
        (False, 0.0, 1.0),  # no answer: the budget or the model, not this
        (True, FEW_LOW, 1.0),  # keeps enough
        (True, 0.0, FEW_LOW / 2),  # range analysis alone left that little: the values
    ],
)
def test_not_said_where_the_tolerances_are_not_the_cause(passed, low, start):
    assert tight_warning(_result(passed, low, start)) is None


def test_a_search_stuck_with_every_suspect_pinned_says_what_fails_instead():
    """Said only where the search ended failing with its budget left (every suspect pinned
    still fails); the quantization named where the model has quantized ops."""
    from dataclasses import replace

    from trtbuild.tuning.output import stuck_warning

    stuck = replace(_result(False, 0.0, 1.0), pinned=[0])
    assert stuck_warning(replace(stuck, passed=True), 3) is None
    assert stuck_warning(replace(stuck, exhausted=True), 3) is None  # the budget: its own
    quantized, plain = stuck_warning(stuck, 3), stuck_warning(stuck, 0)
    assert quantized is not None and plain is not None
    assert "FP16 storage is not what fails it" in quantized
    assert "3 quantized op(s)" in quantized and "`dequantize: true`" in quantized
    assert "quantized" not in plain and "the policy's own rules" in plain
    # nothing the search may move (the user's own rules force every node there): it pinned
    # no group, and said "pinned every group ... storage is not what fails it"
    nothing = stuck_warning(replace(stuck, pinned=[]), 0)
    assert nothing is not None and "pinned every group" not in nothing
    assert nothing.startswith("tune found no group it may pin on the failing outputs' paths")


def test_the_log_is_strict_json_where_an_error_is_infinite(tmp_path):
    """A trial whose output turned inf (or whose shape is not FP32's) writes "inf", as
    report.json does: `Infinity` is no JSON a strict reader (jq, a browser) takes."""
    import json

    from trtbuild.tuning.output import write_log

    trial = Trial(
        1, "start: policy rules only", (), False, 1.0, {"y": "inf"}, {"y": float("inf")}, 0.1
    )
    write_log(tmp_path / "t.jsonl", SearchResult(Precision(), [], [], {}, "", [trial]))
    (line,) = (tmp_path / "t.jsonl").read_text().splitlines()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(c))["max_abs"] == {"y": "inf"}


def test_on_flat_data_the_data_is_named_not_the_tolerances():
    """A classifier's top-5 on random weights (tied logits): the tolerances were blamed,
    while the data does not exercise the model (its own warning, said before)."""
    said = tight_warning(_result(True, FEW_LOW / 2, 1.0), flat=True)
    assert said is not None and "on data that does not exercise the model" in said, said
    assert "give real data before loosening the tolerances" in said
    assert "likely tighter" not in said


def test_a_model_alone_failing_is_said_in_the_words_of_whether_it_is_quantized():
    """A model with no Q/DQ judged against a reference model was told "the quantization alone
    ... fails" and to re-quantize it."""
    from dataclasses import replace

    from trtbuild.accuracy.breakdown import PLAIN_WORDS
    from trtbuild.tuning.output import stuck_warning

    hopeless = replace(_result(False, 0.0, 1.0), quantization_fails=["at opt: y"])
    quantized, plain = stuck_warning(hopeless, 3), stuck_warning(hopeless, 0, PLAIN_WORDS)
    assert quantized is not None and plain is not None
    assert quantized.startswith("the quantization alone (the quantized graph in FP32) fails")
    assert plain.startswith(
        "the model alone (before trtbuild's precision) fails the tolerances against the "
        "reference model (at opt: y): no FP32 pin can fix that"
    )
    assert "convert the model again" in plain and "quantiz" not in plain


def test_a_policy_whose_dequantize_rules_are_not_enough_is_told_more_may_need_to_be():
    """With `dequantize: true` rules in the policy, the stuck warning named writing such
    rules."""
    from trtbuild.accuracy.breakdown import QUANTIZED_WORDS
    from trtbuild.tuning.output import stuck_warning

    stuck = _result(False, 0.0, 1.0)
    said = stuck_warning(stuck, 3, QUANTIZED_WORDS, dequantized=4)
    assert said is not None and "rules take 4 op(s) out of it; more may need to be" in said
    assert "a rule with `dequantize: true` takes" not in said
    assert "a rule with `dequantize: true` takes" in (stuck_warning(stuck, 3) or "")


def test_pins_go_into_a_rules_list_that_another_key_of_precision_follows(tmp_path):
    """A block rule list followed by `default:` in `precision`: the list's end mark is that
    key's start, so the pins were written after `default: fp16`, and `tune` stopped on the
    malformed YAML of its own answer (exit 2) for a valid policy."""
    import numpy as np
    import onnx

    from tests.helpers import F, model, node, run_tune
    from trtbuild.cli import main
    from trtbuild.policy import load_policy

    m = model(
        [node("Mul", ["x", "a"], "h", "m1"), node("Mul", ["h", "a"], "y", "m2")],
        [("x", F, [1, 8])],
        [("y", F, [1, 8])],
        {"a": np.float32(300)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\n"
        "inputs:\n  x: {shape: [1, 8], data: {distribution: uniform, low: 0.5, high: 1.0}}\n"
        "precision:\n  rules:\n    - id: mine\n      match: {name: ^m1$}\n      precision: fp32\n"
        "  default: fp16\nbuild: {backend: none}\n"
    )
    tuned = tmp_path / "out" / "tuned.yaml"
    assert run_tune(policy, tuned) == 0
    rules = load_policy(tuned).precision.rules
    assert [r.id for r in rules] == ["mine", "tuned-1"] and rules[1].match.name == "^m2$"
    assert tuned.read_text().rstrip().endswith("  default: fp16\nbuild: {backend: none}")
    assert main(["build", "--policy", str(tuned), "--out", str(tmp_path / "b")]) == 0


def _dynamic_chain(folder: Path) -> Path:
    """y = x * c0 * ... * c5 (FP16 cannot hold any c), judged at three points (a dynamic
    batch): the search's passes are provisional, so one evaluation is kept for the check
    of an answer at every point."""
    nodes, weights, t = [], {}, "x"
    for k in range(6):
        weights[f"c{k}"] = np.array(1 + (k + 1) / 3000, np.float32)
        nodes.append(node("Mul", [t, f"c{k}"], f"m{k}", f"/mul{k}"))
        t = f"m{k}"
    nodes.append(node("Identity", [t], "y", "/out"))
    io = ([("x", F, ["n", 64])], [("y", F, ["n", 64])])
    onnx.save(model(nodes, *io, weights), folder / "c.onnx")
    policy = folder / "c.yaml"
    policy.write_text(
        "version: 1\nmodel: c.onnx\nbuild: {backend: none}\nprecision: {rules: []}\n"
        "inputs: {x: {min: [1, 64], opt: [2, 64], max: [4, 64], "
        "data: {distribution: uniform, low: 1, high: 2}}}\n"
        "accuracy: {samples: 1, tolerances: {default: {atol: 1e-4, rtol: 0}}}\n"
    )
    return policy


def test_a_budget_that_ran_out_says_what_it_spent_and_what_it_kept(tmp_path, capsys):
    """`--budget 2` said the budget of 2 evaluations ran out, after 1 (the other was kept
    for the every-point check of an answer the search never reached)."""
    tuned = tmp_path / "t.yaml"
    argv = ["tune", "--policy", str(_dynamic_chain(tmp_path)), "-o", str(tuned)]
    assert main([*argv, "--budget", "2", "--jobs", "1"]) == 1
    said = capsys.readouterr()
    assert "1 evaluation(s)" in said.out
    assert (
        "tune's budget of 2 evaluations ran out before the search ended (1 spent searching; "
        "the last one is kept to judge a passing answer at every point, and the search "
        "reached none), so a passing pin set may exist"
    ) in said.err
