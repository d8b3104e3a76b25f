"""Where a non-finite value must be summed: each claim checked on a real ONNX Runtime run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.helpers import F, model, node
from trtbuild.graph.propagation import PROPAGATES, unobserved


def _chain(op: str, shape=(1, 1, 4, 4), **attrs):
    """x -> Mul(x, 2) = a -> op -> y; `a` is what may turn non-finite."""
    ins = ["a"]
    inits = {"two": np.float32(2.0)}
    if op == "Conv":
        ins.append("w")
        inits["w"] = np.zeros((1, 1, 1, 1), np.float32)  # a zero weight: inf * 0 is NaN
    if op == "GroupNormalization":  # opset 21's: a scale and a bias per channel
        ins += ["s", "b"]
        inits.update(s=np.zeros(1, np.float32), b=np.zeros(1, np.float32))
    return model(
        [node("Mul", ["x", "two"], "a", "mul"), node(op, ins, "y", "op", **attrs)],
        [("x", F, [1, 1, 4, 4])],
        [("y", F, list(shape))],
        inits,
        opset=21 if op == "GroupNormalization" else 17,
    )


def _reaches_output(m, value: float) -> bool:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 3, 3] = value  # the last position: the one a strided window skips
    (y,) = sess.run(None, {"x": x})
    return not np.isfinite(y).all()


PASSING = [
    ("Neg", {}, (1, 1, 4, 4)),
    ("Sqrt", {}, (1, 1, 4, 4)),
    ("Transpose", {"perm": [0, 1, 3, 2]}, (1, 1, 4, 4)),
    ("GlobalAveragePool", {}, (1, 1, 1, 1)),
    ("Conv", {"pads": [0, 0, 0, 0]}, (1, 1, 4, 4)),
    ("GroupNormalization", {"num_groups": 1}, (1, 1, 4, 4)),  # a zero scale too
]


@pytest.mark.parametrize(("op", "attrs", "shape"), PASSING)
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_an_op_said_to_pass_a_non_finite_value_on_does(op, attrs, shape, value):
    """Where the table lets `a` go unsummed, ONNX Runtime's output shows its inf or NaN
    (through a zero weight too)."""
    m = _chain(op, shape, **attrs)
    assert unobserved(m, {"a"}, sinks={"y"}) == set()
    assert _reaches_output(m, value)


@pytest.mark.parametrize(
    ("op", "attrs", "shape", "hidden"),
    [
        ("Relu", {}, (1, 1, 4, 4), -np.inf),  # -> 0
        ("Sigmoid", {}, (1, 1, 4, 4), np.inf),  # -> 1
        ("Conv", {"strides": [2, 2]}, (1, 1, 2, 2), np.nan),  # a position no window reads
    ],
)
def test_an_op_that_can_hide_a_non_finite_value_gets_its_input_summed(op, attrs, shape, hidden):
    m = _chain(op, shape, **attrs)
    assert unobserved(m, {"a"}, sinks={"y"}) == {"a"}
    assert not _reaches_output(m, hidden)


def test_a_masking_op_gets_its_input_summed_and_a_chain_one_sum():
    """x -> Mul = a -> Add = b -> Clip = c -> Mul = d (output): the Clip hides an inf in b
    (and so in a), so b is summed; a reaches b through the Add; c and d reach the output."""
    m = model(
        [
            node("Mul", ["x", "k"], "a", "m1"),
            node("Add", ["a", "k"], "b", "add"),
            node("Clip", ["b", "lo", "hi"], "c", "clip"),
            node("Mul", ["c", "k"], "d", "m2"),
        ],
        [("x", F, [4])],
        [("d", F, [4])],
        {"k": np.float32(3.0), "lo": np.float32(0.0), "hi": np.float32(6.0)},
    )
    assert unobserved(m, {"a", "b", "c", "d"}, sinks={"d"}) == {"b"}
    assert unobserved(m, {"a", "b", "c", "d"}, sinks=set()) == {"b", "d"}


def test_an_empty_reader_output_observes_nothing():
    m = _chain("Neg")  # as if the reference's y held no value
    assert unobserved(m, {"a"}, sinks={"y"}, shapes={"y": (0, 4)}) == {"a"}


def test_every_op_in_the_table_is_a_real_onnx_op():
    import onnx

    for op in PROPAGATES:
        assert onnx.defs.has(op), op
