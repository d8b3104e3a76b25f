"""What the terminal says of a report."""

from __future__ import annotations

import numpy as np

from trtbuild.accuracy.breakdown import ErrorSplit
from trtbuild.accuracy.render import at_risk_lines, split_lines
from trtbuild.accuracy.sessions import OutputMetrics


def test_ops_at_risk_are_named_once_each_by_their_worst_quantity_and_the_rest_counted():
    """Two quantities of one op among the worst three named it twice and counted the rest
    by ops: four ops read as "a, a, b, +1 more"."""
    rows = [
        {"node": "a", "quantity": "sum", "peak": 9e5},
        {"node": "a", "quantity": "sum of squares", "peak": 8e5},
        {"node": "b", "quantity": "sum", "peak": 7e5},
        {"node": "c", "quantity": "sum", "peak": 6e5},
        {"node": "d", "quantity": "sum", "peak": 5e5},
    ]
    said = at_risk_lines(rows, "storage")
    assert "4 FP16 op(s)" in said
    assert said.endswith(": a (sum 9e+05), b (sum 7e+05), c (sum 6e+05), +1 more")


def test_an_op_at_risk_that_is_also_the_failure_is_not_called_not_failed():
    rows = [
        {"node": "a", "quantity": "sum", "peak": 9e5},
        {"node": "b", "quantity": "sum", "peak": 7e5},
    ]
    said = at_risk_lines(rows, "storage", failed_at="b")
    assert said.startswith("at risk (the storage emulation assumes FP32 inside kernels): 2 FP16")
    assert said.endswith(": b (sum 7e+05; the first divergence above), a (sum 9e+05)")
    last = at_risk_lines(
        [*rows, *({"node": n, "quantity": "sum", "peak": 1e5} for n in "cde")], "storage", "e"
    )
    assert (
        ": e (sum 1e+05; the first divergence above), a (sum 9e+05), b (sum 7e+05), +2 more" in last
    )
    elsewhere = at_risk_lines(rows, "storage", failed_at="c")  # failed where no risk is
    assert elsewhere.startswith("at risk (not failed; the storage emulation assumes FP32")
    assert "first divergence" not in elsewhere


def test_under_strict_the_line_says_which_sums_the_verdict_stored_itself():
    said = at_risk_lines([{"node": "a", "quantity": "sum", "peak": 9e5}], "strict")
    assert said.startswith("at risk (not failed; the strict emulation stores the sums behind")
    assert "assumes FP32 inside other kernels" in said
    assert "at risk (not failed; measured on the FP32 reference)" in at_risk_lines(
        [{"node": "a", "quantity": "sum", "peak": 9e5}], None
    )


def test_the_pinned_count_is_of_compute_nodes_as_the_shares_are(tmp_path, capsys):
    """`rules: []` with shape arithmetic: the guard pins the Cast of a dimension to FP32,
    which computes nothing. The line said `100.0% FP16, 1 node(s) pinned to FP32`; it counts
    compute nodes, as the share does, and report.json still lists the Cast."""
    import json

    import numpy as np

    from tests.helpers import F, model, node

    m = model(
        [node("Shape", ["x"], "s", "/shape"), node("Gather", ["s", "i"], "n", "/width", axis=0),
         node("Cast", ["n"], "nf", "/width_f", to=F), node("Mul", ["x", "nf"], "y", "/scale")],
        [("x", F, [1, "w"])],
        [("y", F, [1, "w"])],
        {"i": np.array(1, np.int64)},
    )  # fmt: skip
    assert _built(tmp_path, m, "inputs: {x: {min: [1, 4], opt: [1, 8], max: [1, 16]}}\n") == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(": 100.0% FP16, 0 node(s) pinned to FP32"), line
    pinned = json.loads((tmp_path / "o" / "report.json").read_text())["precision"]["pinned"]
    assert [(p["node"], p["rule"]) for p in pinned] == [("/width_f", "guard:shape-arithmetic")]
    assert "0 compute node(s) pinned by rules" in (tmp_path / "o" / "report.md").read_text()


def test_a_failing_outputs_inf_is_traced_to_where_it_begins_past_the_first_divergence(
    tmp_path, capsys
):
    """A Phi's FP8 logits were all inf, from a Softmax's NaN, and the verdict named only its
    first divergence, a weight's DQ 6% off before it: report.json's `overflow` alone held the
    Softmax. Here `/tiny` (x * 1e-7, subnormal in FP16) diverges first and `/big` (x * 300
    * 300) turns inf: both are named, in the terminal and report.md."""
    import json

    import numpy as np

    from tests.helpers import F, model, node

    m = model(
        [node("Mul", ["x", "t"], "a", "/tiny"), node("Mul", ["x", "h"], "b1", "/mid"),
         node("Mul", ["b1", "h"], "b", "/big"), node("Add", ["a", "b"], "y", "/sum")],
        [("x", F, [1, 64])],
        [("y", F, [1, 64])],
        {"t": np.array(1e-7, np.float32), "h": np.array(300.0, np.float32)},
    )  # fmt: skip
    data = "{distribution: uniform, low: 1, high: 2}"
    tail = f"precision: {{guards: false}}\ninputs: {{x: {{shape: [1, 64], data: {data}}}}}\n"
    assert _built(tmp_path, m, tail) == 1
    out = capsys.readouterr().out
    assert "first divergence at /tiny " in out, out
    assert "non-finite values begin at /big (Mul), tensor b: 64 non-finite" in out, out
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["overflow"]["node"] == "/big"
    assert "Non-finite values begin at `/big (Mul)" in (tmp_path / "o" / "report.md").read_text()


def test_a_point_failed_by_a_masked_overflow_alone_is_not_called_pass(tmp_path, capsys):
    """A Phi's padded attention failed at max by a masked overflow (`accuracy.masked_overflow:
    fail`) with every output holding: the verdict said `FAILED at opt, max` and then
    `at max ...: pass`. Here the sum of x * 1000 passes FP16's range at max only, and a
    `Min` with 1 hides it."""
    import numpy as np

    from tests.helpers import F, model, node

    m = model(
        [node("Mul", ["x", "k"], "a", "/scale"),
         node("ReduceSum", ["a"], "s", "/sum", keepdims=1),
         node("Min", ["s", "one"], "c", "/clip"), node("Mul", ["x", "c"], "y", "/out")],
        [("x", F, [1, "n"])],
        [("y", F, [1, "n"])],
        {"k": np.array(1000.0, np.float32), "one": np.array(1.0, np.float32)},
    )  # fmt: skip
    tail = "precision: {guards: false}\ninputs: {x: {min: [1, 1], opt: [1, 16], max: [1, 1000]}}\n"
    assert _built(tmp_path, m, tail) == 1
    out = capsys.readouterr().out
    assert "FAILED at max [1, 1000]" in out, out
    assert "  at max [1, 1000]: FAIL" in out and "  at max [1, 1000]: pass" not in out, out
    assert "masked overflow at max [1, 1000]: /sum (ReduceSum)" in out, out


def test_the_line_names_the_policys_low_precision():
    """A BF16 policy's ops at risk are BF16 ops, beyond BF16's range: FP16 said of them read
    as if the policy computed in FP16."""
    said = at_risk_lines([{"node": "a", "quantity": "sum", "peak": 9e38}], "strict", low="BF16")
    assert "stores the sums behind means and LayerNorms in BF16 itself" in said
    assert (
        "1 BF16 op(s) whose internal quantities leave BF16 if a kernel keeps them in BF16" in said
    )
    assert "FP16" not in said
    assert at_risk_lines([], "storage", low="BF16") == (
        "at risk: none (no BF16 op's internal sums or squares leave the BF16 range)"
    )


def _built(tmp_path, m, tail: str) -> int:
    """`build --backend none` of model `m` under a policy of `tail` (its inputs, precision,
    accuracy), into tmp_path/o: its exit code."""
    import onnx

    from trtbuild.cli import main

    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n" + tail)
    return main(["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "o")])


def _metrics(passed: bool) -> OutputMetrics:
    return OutputMetrics(passed, 0.2, 0.1, 0.1, 0.2, 0.5, 0.02, 0.99, 0, 0.05, 0.05, "median")


def test_an_output_the_policy_passes_is_not_said_unfixable():
    """ "the quantization alone fails ... no FP32 pin can fix that" stood under a PASSED
    verdict whose `dequantize: true` rules had taken what lost most out of the quantization:
    an output the policy passes is said as passed, the unfixable line names only the others."""
    parts = {
        "policy_vs_original": {"a": _metrics(True), "b": _metrics(False)},
        "quantized_vs_original": {"a": _metrics(False), "b": _metrics(False)},
        "policy_vs_quantized": {"a": _metrics(True), "b": _metrics(True)},
    }
    said = split_lines(ErrorSplit("m.onnx", "emulated-fp16", parts))
    assert said[-2:] == [
        "  the quantization alone fails the tolerances on b: no FP32 pin can fix that (take the "
        "ops that lose most out of the quantization with `dequantize: true` rules, re-quantize, "
        "or loosen the tolerances)",
        "  the quantization alone fails the tolerances on a, which the policy passes "
        "(`dequantize: true` rules take ops out of the quantization)",
    ]
    parts["policy_vs_original"]["b"] = _metrics(True)  # a passing verdict: nothing unfixable
    said = split_lines(ErrorSplit("m.onnx", "emulated-fp16", parts))
    assert not any("no FP32 pin" in line for line in said)


def test_a_failing_baseline_without_a_first_divergence_names_what_fails(tmp_path, capsys):
    """The line said "all-FP16 baseline: FAILS" and nothing else where a tolerance tighter
    than FP16's rounding fails the output while no tensor's error reaches the divergence
    threshold: it names the failing output and why no divergence is named."""

    from tests.helpers import F, model, node

    m = model(
        [node("Mul", ["x", "k"], "y", "mul")],
        [("x", F, [1, 64])],
        [("y", F, [1, 64])],
        {"k": np.float32(1.001)},
    )
    tail = (
        'precision:\n  rules:\n    - {id: all, match: {name: ".*"}, precision: fp32}\n'
        "accuracy:\n  tolerances: {default: {atol: 1e-6, rtol: 0}}\n"
    )
    assert _built(tmp_path, m, tail) == 0
    said = capsys.readouterr().out.splitlines()
    baseline = next(line for line in said if line.startswith("all-FP16 baseline:"))
    assert baseline.startswith("all-FP16 baseline: FAILS on y (max_abs="), said
    assert baseline.endswith(
        "; no intermediate tensor's error reaches the divergence threshold (0.05 of its range)"
    )


def test_junit_holds_a_name_with_a_control_character_well_formed(tmp_path, models_dir):
    """A policy file named `x<ESC>y.yaml` (legal on Linux) made the night's `junit.xml` not
    well-formed: a CI that cannot parse it shows no test, the failing ones included."""
    import xml.etree.ElementTree as ET

    from tests.conftest import ROOT
    from trtbuild.cli import main

    policies, out = tmp_path / "policies", tmp_path / "out"
    policies.mkdir()
    loop = (ROOT / "policies" / "loop_sum.yaml").read_text()
    (policies / "x\x1by.yaml").write_text(loop.replace("../models/", f"{models_dir}/"))
    (policies / "bad.yaml").write_text("version: 1\nmodel: [oops\n")
    argv = ["nightly", "--policies", str(policies), "--out", str(out)]
    assert main([*argv, "--history", str(tmp_path / "h.sqlite"), "--backend", "none"]) == 1
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite.get("failures") == "1"
    names = sorted(c.get("name") for c in suite)
    assert names == ["bad @ cpu-emulation", "x\\x1by @ cpu-emulation"]
