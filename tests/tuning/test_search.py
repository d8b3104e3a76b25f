"""The search's pins and the reasons it gives them, on real judging (no mocks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from tests.helpers import F, model, node


def _chain(tmp_path, scope: str = ""):
    """y = x * c0 * ... * c11, each c = 1 + k/3000 (FP16 cannot hold it), atol 1e-4: every
    Mul's rounding is needed in FP32, and a full search pins all twelve. `scope`: a name
    scope the Muls share (`blk/`: `/blk/mul0`, ...)."""
    nodes, weights, t = [], {}, "x"
    for k in range(12):
        weights[f"c{k}"] = np.array(1 + (k + 1) / 3000, np.float32)
        nodes.append(node("Mul", [t, f"c{k}"], f"m{k}", f"/{scope}mul{k}"))
        t = f"m{k}"
    nodes.append(node("Identity", [t], "y", "/out"))
    onnx.save(model(nodes, [("x", F, [1, 64])], [("y", F, [1, 64])], weights), tmp_path / "c.onnx")
    policy = tmp_path / "c.yaml"
    policy.write_text(
        "version: 1\nmodel: c.onnx\nbuild: {backend: none}\nprecision: {rules: []}\n"
        "inputs: {x: {shape: [1, 64], data: {distribution: uniform, low: 1, high: 2}}}\n"
        "accuracy: {samples: 1, tolerances: {default: {atol: 1e-4, rtol: 0}}}\n"
    )
    return policy


def test_a_pin_the_budget_left_unchecked_says_so_not_another_runs_error(tmp_path):
    """Out of budget after the bisection, every one of twelve pins gave the error of the run
    with eleven of them (itself pinned there): only the one that run left out is explained
    by it; the rest are kept unchecked, and said so."""
    import trtbuild

    result = trtbuild.tune(_chain(tmp_path), budget=8, quiet=True)
    assert result.passed and result.budget_exhausted and len(result.pins) == 12
    kept = [p for p in result.pins if p.reason == "kept (not re-checked within the budget)"]
    measured = [p for p in result.pins if p not in kept]
    assert len(kept) == 11 and len(measured) == 1, [p.reason for p in result.pins]
    assert "fail atol 0.0001" in measured[0].reason
    full = trtbuild.tune(_chain(tmp_path), budget=40, quiet=True)
    assert all(p.reason.startswith("without it: ") for p in full.pins)
    alone = next(p for p in full.pins if p.group == measured[0].group)
    assert alone.reason == "without it: " + measured[0].reason  # the same run, measured once


def _masked_square(tmp_path, rules: str = "[]", samples: int = 3):
    """y = sum of ((x + c) - c), c = 4096 ... 512 (each branch rounds x by up to c/2048), and
    v = Min(x * x, 100): on sample 2 only, x = 255.95, whose square (65510) FP32 holds and
    FP16 does not (x rounds to 256: 65536 is inf), and the Min masks it in v. Range analysis
    (65510 < 65520) leaves /sq/Mul in FP16: only the judge's overflow on sample 2 names it."""
    nodes, weights, outs = [], {"cap": np.array(100, np.float32)}, []
    for k, c in enumerate((4096, 2048, 1024, 512)):
        weights[f"c{k}"] = np.array(c, np.float32)
        nodes += [
            node("Add", ["x", f"c{k}"], f"a{k}", f"/br{k}/Add"),
            node("Sub", [f"a{k}", f"c{k}"], f"s{k}", f"/br{k}/Sub"),
        ]
        outs.append(f"s{k}")
    nodes += [
        node("Sum", outs, "y", "/sum/Sum"),
        node("Mul", ["x", "x"], "sq", "/sq/Mul"),
        node("Min", ["sq", "cap"], "v", "/sq/Min"),
    ]
    m = model(nodes, [("x", F, [1, 256])], [("y", F, [1, 256]), ("v", F, [1, 256])], weights)
    onnx.save(m, tmp_path / "m.onnx")
    x = np.random.default_rng(0).uniform(0, 1, (samples, 1, 256)).astype(np.float32)
    x[2, 0, 7] = 255.95
    np.savez(tmp_path / "d.npz", x=x)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: m.onnx\nbuild: {{backend: none}}\nprecision: {{rules: {rules}}}\n"
        "inputs: {x: {shape: [1, 256], data: {file: d.npz}}}\n"
        f"accuracy: {{samples: {samples}, tolerances: {{default: {{atol: 0.1, rtol: 0}}}}}}\n"
    )
    return policy


def test_an_overflow_judged_only_once_the_outputs_hold_is_pinned_not_called_stuck(tmp_path):
    """Every trial of the growing failed y on sample 0 and never reached sample 2, where
    /sq/Mul overflows (masked by the Min): with every suspect of y pinned, that overflow
    alone fails. The search pinned /sq/Mul then, instead of stopping as stuck and writing a
    policy `build` fails by that masked overflow."""
    import trtbuild

    result = trtbuild.tune(_masked_square(tmp_path), quiet=True)
    assert result.passed, [p.reason for p in result.pins]
    assert any(p.group == "node /sq/Mul" for p in result.pins), [p.group for p in result.pins]
    built = trtbuild.build(result.policy, tmp_path / "out", "none", quiet=True)
    assert built.passed and built.exit_code == 0


def test_an_overflow_a_policy_rule_keeps_low_pins_nothing_upstream(tmp_path):
    """y = x * 2 * 40000 / 40000, the policy's rule keeping /b/Mul (up to 8e4) in FP16: its
    inf is its own, whatever is pinned upstream. The search pinned /a/Mul for it (with that
    inf as its reason, though the pin changed nothing); it stops at the first trial now, and
    says the rule is what fails it."""
    import trtbuild
    from trtbuild import tuning

    nodes = [
        node("Mul", ["x", "two"], "a", "/a/Mul"),
        node("Mul", ["a", "big"], "b", "/b/Mul"),
        node("Div", ["b", "big"], "y", "/c/Div"),
    ]
    weights = {"two": np.array(2, np.float32), "big": np.array(40000, np.float32)}
    onnx.save(
        model(nodes, [("x", F, [1, 256])], [("y", F, [1, 256])], weights), tmp_path / "m.onnx"
    )
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nbuild: {backend: none}\ninputs: {x: {shape: [1, 256]}}\n"
        "precision: {rules: [{id: keep-low, match: {name: ^/b/Mul$}, precision: fp16}]}\n"
        "accuracy: {samples: 2, tolerances: {default: {atol: 0.01, rtol: 0.01}}}\n"
    )
    result = trtbuild.tune(policy, quiet=True)
    assert not result.passed and result.evaluations == 1
    assert [p.group for p in result.pins] == ["node /c/Div"]  # range analysis's own
    said = tuning.stuck_warning(result.search, 0)
    assert said.startswith("the policy's rule keep-low keeps /b/Mul (Mul) in FP16"), said


def _branches(tmp_path, cs, rules: str) -> Path:
    """y = sum of ((x + c) - c) over `cs`: each branch rounds x by up to c / 2048 in FP16."""
    nodes, weights, outs = [], {}, []
    for k, c in enumerate(cs):
        weights[f"c{k}"] = np.array(c, np.float32)
        nodes += [
            node("Add", ["x", f"c{k}"], f"a{k}", f"/br{k}/Add"),
            node("Sub", [f"a{k}", f"c{k}"], f"s{k}", f"/br{k}/Sub"),
        ]
        outs.append(f"s{k}")
    nodes.append(node("Sum", outs, "y", "/sum/Sum"))
    m = model(nodes, [("x", F, [1, 256])], [("y", F, [1, 256])], weights)
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: m.onnx\nbuild: {{backend: none}}\nprecision: {{rules: {rules}}}\n"
        "inputs: {x: {shape: [1, 256]}}\n"
        "accuracy: {samples: 2, tolerances: {default: {atol: 0.1, rtol: 0}}}\n"
    )
    return policy


def test_a_stuck_search_names_the_rule_that_keeps_a_node_on_the_failing_path_low(tmp_path):
    """The policy's rule keeps /br0/Add (x + 4096, rounded by up to 1) in FP16: every other
    group pinned still fails y. The warning said "FP16 storage is not what fails it"; with
    that rule saying fp32 the search passes, so it names the rule and the node instead."""
    import trtbuild
    from trtbuild import tuning

    keep = "[{id: keep-low, match: {name: ^/br0/Add$}, precision: fp16}]"
    result = trtbuild.tune(_branches(tmp_path, (4096, 2048, 512, 8), keep), quiet=True)
    assert not result.passed and not result.budget_exhausted
    assert result.search.kept_low == {"keep-low": ["/br0/Add"]}
    said = tuning.stuck_warning(result.search, 0)
    assert "is not what fails it" not in said, said
    assert "the policy's rule keep-low keeps 1 node(s) there in FP16 (/br0/Add)" in said
    fp32 = keep.replace("fp16", "fp32")
    assert trtbuild.tune(_branches(tmp_path, (4096, 2048, 512, 8), fp32), quiet=True).passed


def test_pins_of_a_stuck_search_do_not_blame_a_budget_that_did_not_run_out(tmp_path):
    """Every suspect pinned and still failing: the search stopped after a few evaluations of
    its 100, yet each pin said "kept (not re-checked within the budget)", sending the user
    to raise a budget that changes nothing. Each says why it is there instead."""
    import trtbuild

    keep = "[{id: keep-low, match: {name: ^/br0/Add$}, precision: fp16}]"
    result = trtbuild.tune(_branches(tmp_path, (4096, 2048, 512, 8), keep), quiet=True)
    assert not result.passed and not result.budget_exhausted and result.evaluations < 100
    reasons = [p.reason for p in result.pins]
    assert reasons and not any("budget" in r for r in reasons), reasons
    assert all(
        r.startswith("pinned with every suspect of the failing outputs; with all") for r in reasons
    )


def test_a_scope_merging_pins_the_budget_left_unchecked_still_says_so(tmp_path):
    """The same twelve pins in one name scope, merged into `^/blk/` at no cost: the scope's
    comment said only "selects exactly the 12 nodes of the 12 pins inside it", as if they
    were established; 11 of them were never re-checked, and it says so."""
    import trtbuild

    result = trtbuild.tune(_chain(tmp_path, "blk/"), budget=8, quiet=True)
    assert result.passed and result.budget_exhausted
    (pin,) = result.pins
    assert pin.group.startswith("scope ^/blk/"), pin.group
    assert pin.reason.startswith("selects exactly the 12 nodes of the 12 pins inside it")
    assert pin.reason.endswith("; 11 of them kept (not re-checked within the budget)"), pin.reason


def test_a_budget_cut_before_any_pin_was_measured_does_not_blame_the_tolerances(tmp_path):
    """With a budget of 8 the twelve pins stand unmeasured (0% FP16): the warning said the
    tolerances are likely tighter than FP16 allows ("more budget rarely keeps more in FP16")
    beside the budget's own ("raise budget"). Only the full search, whose every pin's removal
    failed a tolerance, says so."""
    import trtbuild
    from trtbuild import tuning

    cut = trtbuild.tune(_chain(tmp_path), budget=8, quiet=True)
    assert cut.passed and cut.budget_exhausted and cut.low_precision_share < tuning.output.FEW_LOW
    assert tuning.tight_warning(cut.search) is None
    full = trtbuild.tune(_chain(tmp_path), budget=40, quiet=True)
    assert not full.budget_exhausted
    assert tuning.tight_warning(full.search).startswith("tune kept only 0.0% of the model in FP16")


def test_pins_made_by_an_overflow_do_not_blame_the_tolerances(tmp_path):
    """The policy's rule keeps the branches FP32 (18% FP16 left); the one pin is the masked
    overflow of /sq/Mul on sample 2 (9.1% FP16). No tolerance allows an inf: the warning that
    the tolerances are likely too tight, said even with atol 1000, is not said."""
    import trtbuild
    from trtbuild import tuning

    rules = "[{id: branches, match: {name: ^/(br|sum)}, precision: fp32}]"
    result = trtbuild.tune(_masked_square(tmp_path, rules), quiet=True)
    assert result.passed and [p.group for p in result.pins] == ["node /sq/Mul"]
    assert result.low_precision_share < tuning.output.FEW_LOW
    assert tuning.tight_warning(result.search) is None


def test_an_overflow_the_rule_keeps_low_from_a_rounded_input_names_the_rule(tmp_path):
    """v = Min(Relu(x)^2, 100), the policy's rule keeping the square in FP16; on sample 1
    x = 255.95, whose square FP32 holds (65510) and FP16 does not (256^2 is inf). The search
    pins /pre/Relu upstream, which cannot end it (the FP16 square reads 256 either way): that
    pin said the inf as the reason it was needed, and the warning said FP16 storage is not
    what fails it. The pin says it did not end the overflow, and the warning names the rule."""
    import trtbuild
    from trtbuild import tuning

    nodes = [
        node("Relu", ["x"], "r", "/pre/Relu"),
        node("Mul", ["r", "r"], "sq", "/sq/Mul"),
        node("Min", ["sq", "cap"], "v", "/sq/Min"),
    ]
    m = model(nodes, [("x", F, [1, 256])], [("v", F, [1, 256])], {"cap": np.float32(100)})
    onnx.save(m, tmp_path / "m.onnx")
    x = np.random.default_rng(0).uniform(0, 1, (2, 1, 256)).astype(np.float32)
    x[1, 0, 7] = 255.95
    np.savez(tmp_path / "d.npz", x=x)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nbuild: {backend: none}\n"
        "precision: {rules: [{id: keep-low, match: {name: ^/sq/Mul$}, precision: fp16}]}\n"
        "inputs: {x: {shape: [1, 256], data: {file: d.npz}}}\n"
        "accuracy: {samples: 2, tolerances: {default: {atol: 0.1, rtol: 0}}}\n"
    )
    result = trtbuild.tune(policy, quiet=True)
    assert not result.passed
    (pin,) = result.pins
    assert pin.reason.startswith("pinned upstream of an overflow it did not end: /sq/Mul"), pin
    said = tuning.stuck_warning(result.search, 0)
    assert "is not what fails it" not in said, said
    assert "the policy's rule keep-low keeps 1 node(s) there in FP16 (/sq/Mul)" in said
