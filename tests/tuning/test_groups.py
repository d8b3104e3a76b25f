"""What `tune` moves together, and the reason a range pin gives."""

from __future__ import annotations

import numpy as np
import onnx

from tests.helpers import F, model, node
from trtbuild.cli import main
from trtbuild.policy import load_policy


def _gain_then_tanh(tmp_path):
    """x in [0, 100) times 1000 (past FP16's 65504), a Relu (the same values), then a Tanh
    (its values within 1)."""
    m = model(
        [
            node("Mul", ["x", "k"], "big", "gain"),
            node("Relu", ["big"], "kept", "rect"),
            node("Tanh", ["kept"], "y", "squash"),
        ],
        [("x", F, [1, 64])],
        [("y", F, [1, 64])],
        {"k": np.float32(1000.0)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\n"
        "inputs:\n  x: {data: {distribution: uniform, low: 0.0, high: 100.0}}\n"
        "precision: {default: fp16, rules: []}\nbuild: {backend: none}\n"
        "accuracy: {samples: 1, tolerances: {default: {atol: 1e-2, rtol: 0}}}\n"
    )
    return policy


def test_a_group_that_only_reads_a_value_past_the_range_says_so(tmp_path, capsys):
    """The Tanh makes nothing past 1 but reads the Relu's 1e5, which FP16 would store as
    inf: its group's peak is that value, `read` names it, and the tuned policy's reason says
    "reads ... from kept", where the gain's and the Relu's say "reaches" (each makes the
    value; the Relu reads it too). Range
    analysis pins both, so the answer keeps nothing in FP16, and `tune` does not blame the
    tolerances for it (the values leave FP16's range)."""
    from trtbuild.front import run_front
    from trtbuild.tuning.groups import groups

    policy = _gain_then_tanh(tmp_path)
    found = {g.names[0]: g for g in groups(run_front(load_policy(policy)), "nodes")}
    assert found["gain"].peak == found["rect"].peak == found["squash"].peak > 65504
    assert [found[n].read for n in ("gain", "rect", "squash")] == ["", "", "kept"]

    tuned = tmp_path / "t.yaml"
    assert main(["tune", "--policy", str(policy), "-o", str(tuned)]) == 0
    text = tuned.read_text()
    peak = f"|x| = {found['gain'].peak:.4g}"
    assert f"# node gain: reaches {peak} on the reference data (FP16 max 65504)" in text
    assert f"# node rect: reaches {peak} on the reference data (FP16 max 65504)" in text
    assert f"# node squash: reads {peak} from kept on the reference data (FP16 max" in text
    said = capsys.readouterr()
    assert "passes (emulated-fp16, storage emulation): 0.0% FP16" in said.out
    assert "tighter than" not in said.err


def test_range_analysis_pins_what_the_low_precision_turns_inf_not_what_it_rounds_down():
    """A peak of 65510 is stored in FP16 as 65504, finite: the judge finds no overflow there,
    so range analysis does not pin it (it did from 65504 on, then spent an evaluation
    unpinning it); from 65520 FP16 rounds to inf."""
    from trtbuild.tuning.groups import Group, beyond_range

    made = [Group("node", (k,), (f"n{k}",), 1.0, peak) for k, peak in enumerate((65510.0, 65520.0))]
    assert beyond_range(made, "fp16") == [1]


def test_a_pin_selects_its_node_not_one_named_as_it_plus_a_newline(tmp_path):
    """ONNX names are any string: `/n/Add` and `/n/Add\n` are two nodes. Rules match by
    `re.search`, whose `$` also matches before a trailing newline, so the pin `^/n/Add$` of
    the group `node /n/Add` pinned both (the log named one node, the policy pinned two). It
    ends with `\\Z` there; elsewhere it stays `$`, as users write it."""
    import trtbuild
    from trtbuild.tuning import name_regex

    assert name_regex(("/n/Add",), ["/n/Add", "/n/Add\n"]) == r"^/n/Add\Z"
    assert name_regex(("/n/Add", "/m"), ["/n/Add", "/m", "/n/Add\n"]) == r"^(?:/n/Add|/m)\Z"
    assert name_regex(("/n/Add",), ["/n/Add", "/n/Sub"]) == "^/n/Add$"
    nodes = [
        node("Add", ["x", "c"], "a", "/n/Add"),
        node("Sub", ["a", "c"], "s", "/n/Sub"),
        node("Add", ["x", "d"], "a2", "/n/Add\n"),  # rounds by 1/128 at most: needs no pin
        node("Sub", ["a2", "d"], "s2", "/n/Sub2"),
        node("Add", ["s", "s2"], "y", "/out"),
    ]
    weights = {"c": np.array(4096, np.float32), "d": np.array(16, np.float32)}
    onnx.save(
        model(nodes, [("x", F, [1, 256])], [("y", F, [1, 256])], weights), tmp_path / "m.onnx"
    )
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nbuild: {backend: none}\ninputs: {x: {shape: [1, 256]}}\n"
        "accuracy: {samples: 2, tolerances: {default: {atol: 0.1, rtol: 0}}}\n"
    )
    result = trtbuild.tune(policy, quiet=True)
    assert result.passed and sorted(p.group for p in result.pins) == ["node /n/Add", "node /n/Sub"]
    checked = trtbuild.check(result.policy, quiet=True)
    fp32 = {d.name for d in checked.nodes if d.precision == "fp32"}
    assert fp32 == {"/n/Add", "/n/Sub"}, fp32
