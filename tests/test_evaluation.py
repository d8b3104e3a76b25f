"""What the judge's callers are told beside the verdict."""

from __future__ import annotations

import onnx
from onnx import helper

from tests.helpers import F, if_on_sign, node


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
