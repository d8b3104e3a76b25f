"""What the judge's callers are told beside the verdict."""

from __future__ import annotations

import onnx
from onnx import helper

from tests.helpers import F, if_on_sign, node, scan8_sum


def test_a_body_warning_counts_every_unmeasured_op_it_does_not_name(tmp_path):
    """Five ReduceMeans chained inside an If's branch, four of them FP16 (the last makes the
    branch's output, kept FP32): three named, the fourth counted. The message said "4
    op(s)" and named three."""
    from trtbuild.evaluation import body_warnings
    from trtbuild.front import run_front
    from trtbuild.policy import load_policy

    means = [node("ReduceMean", [f"m{k}"], f"m{k + 1}", f"mean{k}", axes=[-1]) for k in range(5)]
    then = helper.make_graph(
        [node("Identity", ["x"], "m0", "take"), *means],
        "then",
        [],
        [helper.make_tensor_value_info("m5", F, [1, 1])],
    )
    other = helper.make_graph(
        [node("ReduceMax", ["x"], "o", "max", axes=[-1])],
        "else",
        [],
        [helper.make_tensor_value_info("o", F, [1, 1])],
    )
    onnx.save(if_on_sign(then, other, [1, 1]), tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 4]}\n")
    (said,) = body_warnings(run_front(load_policy(tmp_path / "p.yaml"), reference="none"))
    assert "the internal sums of 4 low-precision op(s) there are not measured" in said
    assert ", +1 more): pin them" in said


def test_integer_inputs_one_value_everywhere_are_said_and_a_range_of_two_is_not(tmp_path):
    """An embedding's ids given no data draw from the default [0, 1): 0 in every sample, said
    with the fix, by `check` (its warnings) too; ids drawn from [0, 2) (the policy's range)
    are not, nor the user's own file of zeros, nor a range of one value the policy writes
    (token type ids), nor a float input, nor a range of two made in code."""
    from dataclasses import replace

    import numpy as np

    from tests.helpers import model
    from trtbuild.evaluation import constant_inputs, report_warnings
    from trtbuild.front import run_front
    from trtbuild.policy import load_policy
    from trtbuild.policy.specs import DataSpec

    m = model(
        [node("Gather", ["table", "ids"], "e", "embed"), node("Add", ["e", "x"], "y", "add")],
        [("ids", onnx.TensorProto.INT64, [1, 4]), ("x", F, [1, 4, 3])],
        [("y", F, [1, 4, 3])],
        {"table": np.arange(6, dtype=np.float32).reshape(2, 3)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    base = "version: 1\nmodel: m.onnx\naccuracy: {samples: 3}\ninputs:\n  x: {shape: [1, 4, 3]}\n"
    np.savez(tmp_path / "ids.npz", ids=np.zeros((3, 1, 4), np.int64))  # the user's own zeros
    cases = [
        ("{shape: [1, 4]}", True),
        ("{shape: [1, 4], data: {high: 2}}", False),
        ("{shape: [1, 4], data: {file: ids.npz}}", False),
        ("{shape: [1, 4], data: {low: 0, high: 1}}", False),  # one value, written on purpose
    ]
    for ids, said in cases:
        (tmp_path / "p.yaml").write_text(base + f"  ids: {ids}\n")
        found = constant_inputs(run_front(load_policy(tmp_path / "p.yaml"), reference="measures"))
        assert bool(found) == said, found
        if said:
            assert "(ids is 0, in every sample" in found[0] and "{low: 0, high: 2}" in found[0]
            assert " x " not in found[0]
            front = run_front(load_policy(tmp_path / "p.yaml"), reference="measures")
            assert found[0] in report_warnings(front)  # what check prints and reports list
    # a range made in code is no file's key (`range_given` stays False): the data decides
    policy = load_policy(tmp_path / "p.yaml")
    ranged = [replace(s, data=DataSpec(high=2.0)) if s.name == "ids" else s for s in policy.inputs]
    front = run_front(replace(policy, inputs=tuple(ranged)), reference="measures")
    assert constant_inputs(front) == []


def test_the_body_warning_says_an_opset_8_scan_hands_out_no_peaks(tmp_path):
    """An opset-8 Scan's body hands out no peaks (`accuracy.probes`): the warning said its
    tensors were measured by their peaks."""
    import numpy as np

    import trtbuild

    m = scan8_sum()
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(
        tmp_path / "d.npz", initial=np.zeros((1, 2), np.float32), x=np.ones((1, 3, 2), np.float32)
    )
    data = {"data": {"file": "d.npz"}}
    policy = trtbuild.Policy.from_dict(
        {"version": 1, "model": "m.onnx", "inputs": {"initial": data, "x": data}},
        base_dir=tmp_path,
    )
    (said,) = [w for w in trtbuild.check(policy, quiet=True).warnings if "control flow" in w]
    assert "inside the opset-8 Scan scan not even that" in said
