"""The emulation must reproduce FP16 overflow that ONNX Runtime's CPU FP16 hides."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from tests.helpers import F, H, as_stored, model, node
from trtbuild.accuracy.emulate import emulate
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes, Precision
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert


def _run(m: onnx.ModelProto, feed, optimize: bool = False):
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        m.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    ).run(None, feed)


def _all_fp16(m: onnx.ModelProto) -> onnx.ModelProto:
    return convert(assign(m, Precision(default="fp16"))).model


def test_final_reduction_above_fp16_range_becomes_inf():
    m = model(
        [node("ReduceSum", ["x"], "y", "sum", keepdims=0)], [("x", F, [1000])], [("y", F, [])]
    )
    feed = {"x": np.full(1000, 100.0, np.float32)}  # sum 1e5 > 65504
    (y,) = _run(emulate(_all_fp16(m)), feed)
    assert np.isinf(y)


def test_decomposed_layernorm_variance_overflow_zeroes_output(nafnet_path):
    prepared = prepare(onnx.load(nafnet_path), Passes(opset=17)).model
    feed = {"input": np.random.default_rng(0).uniform(0, 1, (1, 3, 64, 64)).astype(np.float32)}
    mixed = _all_fp16(prepared)
    restored_ref, total_ref = _run(prepared, feed, optimize=True)
    restored, total = _run(emulate(mixed), feed)
    assert np.isfinite(total_ref) and np.isinf(total)
    assert np.abs(restored - restored_ref).max() > 1e-2


@pytest.mark.parametrize("saved", [[], ["", ""], ["mu", "inv_std"]])
def test_fused_layernorm_in_fp16_overflows_under_strict_only(saved):
    """A fused FP16 LayerNormalization whose squares pass 65504: strict collapses, storage not,
    whether the node names its optional Mean and InvStdDev outputs or leaves them empty."""
    ln = helper.make_node(
        "LayerNormalization", ["x", "g", "b"], ["y", *saved], "ln", axis=-1, epsilon=1e-5
    )
    m = model(
        [ln],
        [("x", F, [2, 16])],
        [("y", F, [2, 16])],
        {"g": np.ones(16, np.float32), "b": np.zeros(16, np.float32)},
    )
    x = np.random.default_rng(1).normal(0, 1000, (2, 16)).astype(np.float32)
    (ref,) = _run(m, {"x": x}, optimize=True)
    (strict,) = _run(emulate(_all_fp16(m), "strict"), {"x": x})
    (storage,) = _run(emulate(_all_fp16(m), "storage"), {"x": x})
    assert np.isfinite(ref).all()
    assert np.abs(strict - ref).max() > 0.5  # d² > 65504 overflows: variance inf, output collapses
    assert np.abs(storage - ref).max() < 1e-2  # FP32 inside the kernel, output rounded once


MEAN_CASES = [
    ("ReduceMean", {"axes": [2, 3], "keepdims": 1}, 17),
    ("GlobalAveragePool", {}, 17),
    ("ReduceMean", {"keepdims": 1}, 18),  # axes as an input at opset 18
    # noop_with_empty_axes matters only where the axes are empty: these are not
    ("ReduceMean", {"keepdims": 1, "noop_with_empty_axes": 1}, 18),
]


def _mean_model(op, attrs, opset):
    inputs = ["x", "axes"] if opset >= 18 else ["x"]
    inits = {"axes": np.array([2, 3], np.int64)} if opset >= 18 else {}
    return model(
        [node(op, inputs, "y", "mean", **attrs)],
        [("x", F, [1, 2, 64, 64])],
        [("y", F, [1, 2, 1, 1])],
        inits,
        opset=opset,
    )


@pytest.mark.parametrize(("op", "attrs", "opset"), MEAN_CASES)
def test_strict_stores_the_sum_behind_a_mean_and_overflows(op, attrs, opset):
    """A mean of 100s over 64x64 is 100, but its sum (409600) is stored in FP16 first."""
    m = _mean_model(op, attrs, opset)
    x = {"x": np.full((1, 2, 64, 64), 100.0, np.float32)}
    assert np.allclose(_run(m, x)[0], 100.0)
    assert np.isinf(_run(emulate(_all_fp16(m), "strict"), x)[0]).all()
    small = {"x": np.full((1, 2, 64, 64), 1.0, np.float32)}  # sum 4096: fine in FP16
    assert np.allclose(_run(emulate(_all_fp16(m), "strict"), small)[0], 1.0)


@pytest.mark.parametrize(("op", "attrs", "opset"), MEAN_CASES)
def test_storage_keeps_the_sum_behind_a_mean_in_fp32(op, attrs, opset):
    m = _mean_model(op, attrs, opset)
    x = {"x": np.full((1, 2, 64, 64), 100.0, np.float32)}
    assert np.allclose(_run(emulate(_all_fp16(m), "storage"), x)[0], 100.0)


def _ln(x, axes, g, b, eps=1e-5):
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


RNG = np.random.default_rng(7)
X4 = RNG.normal(0, 3, (1, 4, 8, 8)).astype(np.float32)
X2 = RNG.normal(0, 3, (6, 16)).astype(np.float32)
W = RNG.normal(0, 0.5, (16, 8)).astype(np.float32)
WS = as_stored(W)  # the weight as FP16 stores it: what MatMul and Gemm multiply by
K = RNG.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32)
G4 = (1 + 0.1 * RNG.standard_normal(4)).astype(np.float32)
B4 = (0.1 * RNG.standard_normal(4)).astype(np.float32)
G16 = (1 + 0.1 * RNG.standard_normal(16)).astype(np.float32)
B16 = (0.1 * RNG.standard_normal(16)).astype(np.float32)


def _conv(x, k):
    """3x3 convolution, stride 1, padding 1 (NCHW), in FP32."""
    n, _, h, w = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, k.shape[0], h, w), np.float32)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", p[:, :, i : i + h, j : j + w], k[:, :, i, j])
    return out


# op, node, input, initializers, output shape, FP32 numpy of the op on FP16-stored inputs
STORAGE_CASES = {
    "ReduceMean": (
        node("ReduceMean", ["x"], "y", "op", axes=[2, 3], keepdims=1),
        X4,
        {},
        [1, 4, 1, 1],
        lambda x, w: x.mean(axis=(2, 3), keepdims=True),
    ),
    "ReduceSum": (
        node("ReduceSum", ["x", "axes"], "y", "op", keepdims=0),
        X4,
        {"axes": np.array([1], np.int64)},
        [1, 8, 8],
        lambda x, w: x.sum(axis=1),
    ),
    "GlobalAveragePool": (
        node("GlobalAveragePool", ["x"], "y", "op"),
        X4,
        {},
        [1, 4, 1, 1],
        lambda x, w: x.mean(axis=(2, 3), keepdims=True),
    ),
    "LayerNormalization": (
        node("LayerNormalization", ["x", "g", "b"], "y", "op", axis=-1, epsilon=1e-5),
        X2,
        {"g": G16, "b": B16},
        [6, 16],
        lambda x, w: _ln(x, -1, as_stored(G16), as_stored(B16)),
    ),
    "InstanceNormalization": (
        node("InstanceNormalization", ["x", "g", "b"], "y", "op", epsilon=1e-5),
        X4,
        {"g": G4, "b": B4},
        [1, 4, 8, 8],
        lambda x, w: _ln(x, (2, 3), as_stored(G4)[:, None, None], as_stored(B4)[:, None, None]),
    ),
    "Softmax": (
        node("Softmax", ["x"], "y", "op", axis=-1),
        X2,
        {},
        [6, 16],
        lambda x, w: (
            np.exp(x - x.max(-1, keepdims=True))
            / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
        ),
    ),
    "MatMul": (node("MatMul", ["x", "w"], "y", "op"), X2, {"w": W}, [6, 8], lambda x, w: x @ WS),
    "Gemm": (node("Gemm", ["x", "w"], "y", "op"), X2, {"w": W}, [6, 8], lambda x, w: x @ WS),
    "Conv": (
        node("Conv", ["x", "k"], "y", "op", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        X4,
        {"k": K},
        [1, 4, 8, 8],
        lambda x, w: _conv(x, as_stored(K)),
    ),
}


@pytest.mark.parametrize("op", list(STORAGE_CASES))
def test_storage_rounds_each_op_output_once(op):
    """Under `storage` an FP16 op is FP32 arithmetic on FP16-stored inputs, rounded once."""
    n, x, inits, out_shape, numpy_op = STORAGE_CASES[op]
    m = model([n], [("x", F, list(x.shape))], [("y", F, out_shape)], inits)
    (emu,) = _run(emulate(_all_fp16(m), "storage"), {"x": x})
    expected = as_stored(numpy_op(as_stored(x).astype(np.float64), None))
    # ONNX Runtime's FP32 sums may differ from numpy's float64 in the last FP32 bits, which
    # can move the FP16 rounding by one step at most: allow one FP16 ulp, nothing more.
    ulp = np.spacing(np.abs(expected).astype(np.float16)).astype(np.float32)
    assert emu.shape == expected.shape
    assert np.array_equal(emu, as_stored(emu)), "every output value is stored in FP16"
    assert np.all(np.abs(emu - expected) <= ulp + 1e-7), np.abs(emu - expected).max()
    assert np.mean(emu == expected) >= 0.95  # rounded once: almost every value is bit-identical


def test_ops_that_only_move_stored_values_are_not_rounded_again():
    """Reshape, Relu and nearest Resize of stored FP16 values are stored values: no rounding
    pair after them, and every value as if each output were rounded; a linear Resize is."""
    m = model(
        [
            node("Mul", ["x", "w"], "a", "scale"),
            node("Reshape", ["a", "shape"], "b", "flat"),
            node("Relu", ["b"], "c", "relu"),
            node("Reshape", ["c", "back"], "d", "unflat"),
            node("Resize", ["d", "", "scales"], "near", "near", mode="nearest"),
            node("Resize", ["d", "", "scales"], "lin", "lin", mode="linear"),
        ],
        [("x", F, [1, 1, 4, 4])],
        [("near", F, [1, 1, 8, 8]), ("lin", F, [1, 1, 8, 8])],
        {
            "w": np.full((1, 1, 4, 4), 1.0 / 3.0, np.float32),
            "shape": np.array([16], np.int64),
            "back": np.array([1, 1, 4, 4], np.int64),
            "scales": np.array([1, 1, 2, 2], np.float32),
        },
    )
    em = emulate(_all_fp16(m))
    rounded = {n.input[0] for n in em.graph.node if n.name.endswith("/store")}
    made = {o: n.name for n in em.graph.node for o in n.output}
    assert {made.get(t) for t in rounded} >= {"scale", "lin"}
    assert not {made.get(t) for t in rounded} & {"flat", "relu", "unflat", "near"}
    x = np.random.default_rng(0).normal(0, 100, (1, 1, 4, 4)).astype(np.float32)
    near, lin = _run(em, {"x": x})
    w = as_stored(1.0 / 3.0)  # the stored weight
    d = np.maximum(as_stored(as_stored(x) * w), 0)  # FP32 math, stored
    assert np.array_equal(near, d.repeat(2, axis=2).repeat(2, axis=3))
    assert np.array_equal(lin, as_stored(lin))  # rounded once


@pytest.mark.parametrize(
    ("opset", "clip", "rounded"),
    [
        (17, lambda: node("Clip", ["a", "lo", "hi"], "y", "clip"), False),  # bounds are FP16
        (10, lambda: node("Clip", ["a"], "y", "clip", min=0.1, max=0.7), True),  # FP32 bounds
        (17, lambda: node("Clip", ["a", "lo"], "y", "clip"), True),  # max: FLT_MAX, not inf
        (10, lambda: node("Pad", ["a"], "y", "clip", pads=[0, 1, 0, 1], value=0.1), True),
    ],
)
def test_a_value_an_attribute_or_a_default_bound_brings_is_rounded(opset, clip, rounded):
    """Values from an attribute (opset-10 Clip, Pad) or a missing Clip bound are not stored
    values: the output is rounded, and every value it holds is an FP16 value."""
    width = 6 if clip().op_type == "Pad" else 4
    m = model(
        [node("Mul", ["x", "w"], "a", "scale"), clip()],
        [("x", F, [1, 4])],
        [("y", F, [1, width])],
        {"w": np.full((1, 4), 1.0 / 3.0, np.float32), "lo": np.float32(0.1)}
        | ({"hi": np.float32(0.7)} if opset > 10 else {}),
        opset=opset,
    )
    em = emulate(_all_fp16(m))
    made = {o: n.name for n in em.graph.node for o in n.output}
    stored = {made.get(n.input[0]) for n in em.graph.node if n.name.endswith("/store")}
    assert ("clip" in stored) == rounded
    (y,) = _run(em, {"x": np.array([[0.0, 1.0, 2.0, 1e5]], np.float32)})
    assert np.array_equal(y, as_stored(y))


def test_names_the_emulation_makes_are_new_where_the_model_holds_them_already():
    # The Mul's output `a` is rounded by nodes `emu/a/store` and `emu/a/load` into values
    # `a__emu2` (the raw output) and `a__emu3`; the model has a node and a value of those
    # names already. Before, ONNX Runtime refused the emulated model's second node of one
    # name, and onnx its second value.
    m = model(
        [
            node("Cast", ["x"], "xa", "c", to=H),
            node("Mul", ["xa", "w"], "a", "mul"),
            node("Cast", ["a"], "y", "emu/a/store", to=F),
            node("Relu", ["y"], "a__emu2", "relu"),
        ],
        [("x", F, [4])],
        [("y", F, [4]), ("a__emu2", F, [4])],
        {"w": np.full(4, 3.0, np.float16)},
    )
    emulated = emulate(m)
    names = [n.name for n in emulated.graph.node]
    made = [o for n in emulated.graph.node for o in n.output]
    assert len(names) == len(set(names)) and len(made) == len(set(made)), (names, made)
    x = np.array([1.0001, 2.0, 2e4, -3.0], np.float32)
    y, r = _run(emulated, {"x": x})
    assert np.array_equal(y, as_stored(as_stored(x) * 3)) and np.array_equal(r, np.maximum(y, 0))


def test_an_fp16_graph_outputs_emulated_value_takes_a_name_the_model_does_not_hold():
    # `y` is an FP16 output: the emulation computes it as `y__emu_out` (FP32) and casts it to
    # the declared type; the model's own `y__emu_out` (an intermediate) made a second value.
    m = model(
        [
            node("Relu", ["x"], "y__emu_out", "relu"),
            node("Cast", ["y__emu_out"], "h", "c", to=H),
            node("Mul", ["h", "w"], "y", "mul"),
        ],
        [("x", F, [4])],
        [("y", H, [4])],
        {"w": np.full(4, 2.0, np.float16)},
    )
    emulated = emulate(m)
    made = [o for n in emulated.graph.node for o in n.output]
    assert len(made) == len(set(made)), made
    (y,) = _run(emulated, {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)})
    assert y.dtype == np.float16 and np.array_equal(y, np.array([2.0, 0.0, 6.0, 1.0], np.float16))


def test_an_fp16_input_that_is_also_an_output_is_handed_out_as_given(tmp_path, capsys):
    """An FP16 model whose graph output is its input itself (no node between): the
    emulation renamed every read of `x` for the output's cast back to FP16, its own input
    cast included, and made a second `x`; ONNX Runtime refused the emulated model
    ("Duplicate definition of name (x)") and `build` was exit 70. The input is handed out as
    given, and the model is judged."""
    from onnx import TensorProto, helper

    from tests.helpers import plain_session
    from trtbuild.cli import main

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["b", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["b", 4])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y, x]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mixed = convert(assign(m, Precision()))
    given = np.array([[-1.5, 0.1, 2049.0, 3.3]], np.float16)
    got = plain_session(emulate(mixed.model)).run(None, {"x": given})
    np.testing.assert_array_equal(got[1], given)
    np.testing.assert_array_equal(got[0], np.maximum(given, 0))
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {min: [1, 4], opt: [2, 4], max: [4, 4]}\n"
    )
    argv = [
        "build",
        "--policy",
        str(tmp_path / "p.yaml"),
        "--out",
        str(tmp_path / "o"),
        "--backend",
        "none",
    ]
    assert main(argv) == 0, capsys.readouterr().err


def test_strict_keeps_a_mean_over_empty_axes_its_input():
    """noop_with_empty_axes with empty axes hands the input out: so does its stored sum."""
    m = model(
        [node("ReduceMean", ["x", "axes"], "y", "mean", noop_with_empty_axes=1)],
        [("x", F, [1, 2, 8, 8])],
        [("y", F, [1, 2, 8, 8])],
        {"axes": np.array([], np.int64)},
        opset=18,
    )
    x = np.random.default_rng(0).uniform(0, 100, (1, 2, 8, 8)).astype(np.float32)
    (y,) = _run(emulate(_all_fp16(m), "strict"), {"x": x})
    assert np.array_equal(y, as_stored(x))


def test_strict_takes_the_mean_of_an_empty_tensor():
    """The rows a NonZero kept, where it kept none: [0, 3] reduced to [0, 1] is empty, not an
    integer division by zero."""
    m = model(
        [node("ReduceMean", ["x"], "y", "mean", axes=[1], keepdims=1)],
        [("x", F, ["n", 3])],
        [("y", F, ["n", 1])],
    )
    (y,) = _run(emulate(_all_fp16(m), "strict"), {"x": np.zeros((0, 3), np.float32)})
    assert y.shape == (0, 1)


def test_an_op_typed_by_its_attribute_is_made_in_fp32_and_rounded_as_stored():
    """convert writes FP16 into EyeLike's `dtype` (MelWeightMatrix's and the windows'
    `output_datatype`); the emulation kept it, and ONNX Runtime has no FP16 EyeLike kernel:
    the judge's session failed to load, exit 70 (ONNX's eyelike node tests)."""
    m = model(
        [node("EyeLike", ["x"], "eye", "eye", k=1, dtype=F), node("Add", ["eye", "x"], "y", "add")],
        [("x", F, [4, 5])],
        [("y", F, [4, 5])],
        opset=22,
    )
    mixed = _all_fp16(m)
    assert {a.i for n in mixed.graph.node if n.op_type == "EyeLike" for a in n.attribute} >= {H}
    x = np.linspace(-3, 3, 20, dtype=np.float32).reshape(4, 5)
    (y,) = _run(emulate(mixed), {"x": x})
    want = as_stored(np.eye(4, 5, k=1, dtype=np.float32) + as_stored(x))
    np.testing.assert_array_equal(y, want)
