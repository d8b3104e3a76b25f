"""LayerNorm fusion and BatchNorm folding on every export variant, and on PP-OCRv4."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tests.helpers import F, model, node
from trtbuild.graph.model_io import opset_of
from trtbuild.passes import fuse
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes

RNG = np.random.default_rng(0)
W = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
B = RNG.uniform(-1, 1, 8).astype(np.float32)
CONSTS = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32), "w": W, "b": B}


def _run(m: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def assert_same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, shape=(2, 4, 8)):
    """Outputs agree to 1e-5 of their magnitude (the passes are exact up to rounding)."""
    feed = {before.graph.input[0].name: RNG.normal(3, 20, shape).astype(np.float32)}
    for a, b in zip(_run(before, feed), _run(after, feed)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


def _stats(axes, square="pow", axes_input=False):
    """mean, x - mean, square, mean of squares, + eps, sqrt; as PyTorch < 17 and Paddle export."""
    red = (
        (lambda i, o, n: node("ReduceMean", [i, "axes"], o, n))
        if axes_input
        else (lambda i, o, n: node("ReduceMean", [i], o, n, axes=axes))
    )
    sq = (
        node("Pow", ["d", "two"], "sq", "pow")
        if square == "pow"
        else node("Mul", ["d", "d"], "sq", "square")
    )
    return [
        red("x", "m", "mean"),
        node("Sub", ["x", "m"], "d", "sub"),
        sq,
        red("sq", "v", "var"),
        node("Add", ["v", "eps"], "ve", "add_eps"),
        node("Sqrt", ["ve"], "s", "sqrt"),
    ]


def _ln(variant: str, opset: int = 17, axes=(-1,)) -> onnx.ModelProto:
    consts = dict(CONSTS)
    if variant == "pow_div_affine":
        nodes = [
            *_stats(list(axes)),
            node("Div", ["d", "s"], "n", "div"),
            node("Mul", ["n", "w"], "g", "gamma"),
            node("Add", ["g", "b"], "y", "beta"),
        ]
    elif variant == "mul_reciprocal_no_affine":
        nodes = [
            *_stats(list(axes), "mul"),
            node("Reciprocal", ["s"], "r", "recip"),
            node("Mul", ["d", "r"], "y", "norm"),
        ]
    elif variant == "weight_first_scale_only":
        nodes = [
            *_stats(list(axes)),
            node("Div", ["d", "s"], "n", "div"),
            node("Mul", ["w", "n"], "y", "gamma"),
        ]
    elif variant == "axes_input_opset18":
        consts["axes"] = np.array(list(axes), np.int64)
        nodes = [
            *_stats(None, axes_input=True),
            node("Div", ["d", "s"], "n", "div"),
            node("Mul", ["n", "w"], "g", "gamma"),
            node("Add", ["g", "b"], "y", "beta"),
        ]
    elif variant.startswith("tf2onnx"):  # x * k + (beta - mean * k), k = w / std
        gamma = variant != "tf2onnx_no_gamma"  # Keras' LayerNormalization(scale=False): k = 1/std
        nodes = [
            *_stats(list(axes), "mul"),
            node("Reciprocal", ["s"], "r" if gamma else "k", "rsqrt"),
            *([node("Mul", ["r", "w"], "k", "gamma")] if gamma else []),
            node("Mul", ["x", "k"], "xk", "mul_x"),
            node("Mul", ["m", "k"], "mk", "mul_mean"),
        ]
        if variant != "tf2onnx_no_beta":
            nodes += [node("Sub", ["b", "mk"], "c", "beta"), node("Add", ["xk", "c"], "y", "out")]
        else:
            nodes += [node("Sub", ["xk", "mk"], "y", "out")]
    elif variant == "torch_var_two_means":  # x - x.mean(d) over sqrt(x.var(d) + eps): Restormer
        nodes = [
            *_stats(list(axes), "mul"),
            node("ReduceMean", ["x"], "m0", "mean0", axes=list(axes)),
            node("Sub", ["x", "m0"], "d0", "sub0"),
            node("Div", ["d0", "s"], "n", "div"),
            node("Mul", ["n", "w"], "g", "gamma"),
            node("Add", ["g", "b"], "y", "beta"),
        ]
    elif variant == "torch_function_centred_twice":  # NAFNet's and KBNet's LayerNormFunction
        nodes = [  # (x - mu).pow(2) and (x - mu) / std: two Sub(x, mu), traced unmerged
            *_stats(list(axes)),
            node("Sub", ["x", "m"], "d2", "sub2"),
            node("Div", ["d2", "s"], "n", "div"),
            node("Mul", ["n", "w"], "g", "gamma"),
            node("Add", ["g", "b"], "y", "beta"),
        ]
    elif variant == "centred_twice_divided_first":  # the same, re-sorted (onnxsim): the
        stats = _stats(list(axes))  # Sub the Div reads comes before the one squared
        nodes = [
            stats[0],
            node("Sub", ["x", "m"], "d2", "sub2"),
            *stats[1:],
            node("Div", ["d2", "s"], "n", "div"),
            node("Mul", ["n", "w"], "g", "gamma"),
            node("Add", ["g", "b"], "y", "beta"),
        ]
    elif variant == "torch_rsqrt":  # (x - mean) * torch.rsqrt(var + eps), legacy torch.onnx
        consts["one"] = np.array(1.0, np.float32)
        nodes = [
            *_stats(list(axes)),
            node("Div", ["one", "s"], "r", "rsqrt"),
            node("Mul", ["r", "d"], "n", "norm"),
            node("Mul", ["w", "n"], "g", "gamma"),
            node("Add", ["g", "b"], "y", "beta"),
        ]
    else:
        raise ValueError(variant)
    inner = int(np.prod([(2, 4, 8)[a] for a in axes]))
    if inner != 8:
        consts["w"] = RNG.uniform(0.5, 1.5, (4, 8)).astype(np.float32)
        consts["b"] = RNG.uniform(-1, 1, (4, 8)).astype(np.float32)
    return model(nodes, [("x", F, [2, 4, 8])], [("y", F, [2, 4, 8])], consts, opset=opset)


VARIANTS = [
    "pow_div_affine",
    "mul_reciprocal_no_affine",
    "weight_first_scale_only",
    "axes_input_opset18",
    "tf2onnx",
    "tf2onnx_no_beta",
    "tf2onnx_no_gamma",
    "torch_var_two_means",
    "torch_function_centred_twice",
    "centred_twice_divided_first",
    "torch_rsqrt",
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_decomposed_variant_fuses_to_one_node_with_the_first_name(variant):
    source = _ln(variant, opset=18 if variant == "axes_input_opset18" else 17)
    fused, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    onnx.checker.check_model(fused, full_check=True)
    first = "mean0" if variant == "torch_var_two_means" else "mean"  # the numerator's mean
    assert [(n.op_type, n.name) for n in fused.graph.node] == [("LayerNormalization", first)]
    assert record.changed == 1 and record.details["fused"][0]["name"] == first
    assert_same_outputs(source, fused)
    again, rec2 = fuse.fuse_layernorm(fused)
    assert rec2.changed == 0 and again.graph.node[0] == fused.graph.node[0]


def test_the_passes_leave_their_input_as_it_was_and_give_no_stale_shapes():
    """Each pass changes its own copy (its inference's, or a copy it makes), never the
    model it is given; `fuse_layernorm` gives back no value info it inferred (its own
    copy's are cleared in place, changed or not)."""
    variant = VARIANTS[0]
    for source, run in ((_ln(variant), fuse.fuse_layernorm), (_conv_bn(), fuse.fold_batchnorm)):
        before = source.SerializeToString()
        changed, record = run(source)
        assert record.changed == 1 and source.SerializeToString() == before
        assert changed is not source
    fused, _ = fuse.fuse_layernorm(_ln(variant))
    assert not fused.graph.value_info
    assert not fuse.fuse_layernorm(fused)[0].graph.value_info  # nothing left to fuse


def test_two_trailing_axes_fuse_with_axis_minus_two():
    source = _ln("pow_div_affine", axes=(-2, -1))
    fused, _ = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    (ln,) = fused.graph.node
    assert helper.get_attribute_value(ln.attribute[0]) == -2 or any(
        a.name == "axis" and a.i == -2 for a in ln.attribute
    )
    assert_same_outputs(source, fused)


def test_weights_as_constant_nodes_fuse_after_lifting():
    source = _ln("pow_div_affine", opset=12)
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in source.graph.initializer]
    del source.graph.initializer[:]
    nodes = [*consts, *source.graph.node]
    del source.graph.node[:]
    source.graph.node.extend(nodes)
    prepared = prepare(onnx.ModelProto.FromString(source.SerializeToString()), Passes(opset=17))
    assert [n.op_type for n in prepared.model.graph.node] == ["LayerNormalization"]
    assert opset_of(prepared.model) == 17
    assert_same_outputs(source, prepared.model)


def test_a_layernorm_read_as_exported_takes_its_epsilon_from_a_constant_node():
    """Called on a graph `prepare` has not lifted (torch.onnx's `Constant` nodes): the unit is
    found, and the fused node's epsilon is the `Constant`'s."""
    source = _ln("torch_rsqrt")
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in source.graph.initializer]
    del source.graph.initializer[:]
    nodes = [*consts, *source.graph.node]
    del source.graph.node[:]
    source.graph.node.extend(nodes)
    fused, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert record.changed == 1
    assert record.details["fused"][0]["epsilon"] == pytest.approx(1e-5)
    assert_same_outputs(source, fused)


def test_channel_axis_layernorm2d_is_kept_and_says_why(nafnet_path):
    prepared = prepare(onnx.load(nafnet_path), Passes(opset=17))
    record = next(r for r in prepared.records if r.name == "fuse_layernorm")
    assert record.changed == 0 and len(record.details["not_fused"]) == 4
    assert "trailing axes only" in record.details["not_fused"][0]["why"]
    assert not [n for n in prepared.model.graph.node if n.op_type == "LayerNormalization"]


def test_below_opset_17_nothing_fuses_and_the_record_says_which_opset_to_ask_for():
    source = _ln("pow_div_affine", opset=13)
    out, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert len(out.graph.node) == len(source.graph.node)
    assert "passes.opset: 17" in record.details["not_fused"][0]["why"]


def test_an_intermediate_used_outside_the_unit_blocks_fusion():
    source = _ln("pow_div_affine")
    source.graph.output.append(helper.make_tensor_value_info("v", F, [2, 4, 1]))
    out, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert record.changed == 0 and "'v' is used outside" in record.details["not_fused"][0]["why"]
    assert len(out.graph.node) == len(source.graph.node)


def test_a_bias_free_layernorm_is_no_layernormalization_and_stays():
    """x / std (Restormer's bias-free form) is not (x - mean) / std: fusing it would centre x."""
    source = _ln("pow_div_affine")
    div = next(n for n in source.graph.node if n.op_type == "Div")
    div.input[0] = "x"
    out, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert record.changed == 0 and out.graph.node[:] == source.graph.node[:]


def test_a_variance_reshaped_onto_other_rows_is_no_layernorm_and_stays():
    """A Reshape between a kept variance ([2, 4, 1]) and its epsilon ([2, 1, 4]) divides each
    row by other rows' deviations: no unit, nothing fused, the outputs as they were."""
    source = model(
        [*_stats([-1]), node("Div", ["d", "s"], "y", "div")],
        [("x", F, [2, 4, 4])],
        [("y", F, [2, 4, 4])],
        {**CONSTS, "rows": np.array([2, 1, 4])},
    )
    add = next(n for n in source.graph.node if n.name == "add_eps")
    add.input[0] = "vr"
    source.graph.node.insert(4, node("Reshape", ["v", "rows"], "vr", "reshape"))
    del source.graph.value_info[:]
    out, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert record.changed == 0 and out.graph.node[:] == source.graph.node[:]
    assert_same_outputs(source, out, shape=(2, 4, 4))


def _conv_bn(extra_consumer: bool = False) -> onnx.ModelProto:
    c = 4
    inits = {
        "cw": RNG.normal(0, 0.5, (c, 3, 3, 3)).astype(np.float32),
        "cb": RNG.normal(0, 0.1, c).astype(np.float32),
        "g": RNG.uniform(0.5, 2, c).astype(np.float32),
        "be": RNG.normal(0, 1, c).astype(np.float32),
        "mu": RNG.normal(0, 1, c).astype(np.float32),
        "var": RNG.uniform(0.1, 3, c).astype(np.float32),
    }
    nodes = [
        node("Conv", ["x", "cw", "cb"], "c", "conv", pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c", "g", "be", "mu", "var"], "y", "bn", epsilon=1e-3),
    ]
    outputs = [("y", F, [1, c, 8, 8])]
    if extra_consumer:
        nodes.append(node("Relu", ["c"], "r", "relu"))
        outputs.append(("r", F, [1, c, 8, 8]))
    return model(nodes, [("x", F, [1, 3, 8, 8])], outputs, inits)


def test_batchnorm_folds_into_conv_exactly_and_conv_keeps_its_name():
    source = _conv_bn()
    folded, record = fuse.fold_batchnorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert [(n.op_type, n.name, n.output[0]) for n in folded.graph.node] == [("Conv", "conv", "y")]
    assert record.details["folded"] == [{"name": "conv", "batchnorm": "bn"}]
    assert {t.name for t in folded.graph.initializer} == {
        "conv.weight_bnfolded",
        "conv.bias_bnfolded",
    }
    assert_same_outputs(source, folded, shape=(1, 3, 8, 8))
    assert fuse.fold_batchnorm(folded)[1].changed == 0


def test_batchnorm_after_a_shared_conv_output_stays():
    source = _conv_bn(extra_consumer=True)
    out, record = fuse.fold_batchnorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert record.changed == 0 and "used elsewhere" in record.details["not_folded"][0]["why"]
    assert [n.op_type for n in out.graph.node] == ["Conv", "BatchNormalization", "Relu"]


def test_ppocrv4_all_five_layernorms_fuse_with_outputs_unchanged(real_model):
    path = real_model("ppocrv4_rec")
    source = onnx.load(path)
    original_names = {n.name for n in source.graph.node if n.name}
    prepared = prepare(onnx.load(path), Passes(opset=17))
    m = prepared.model
    assert opset_of(m) == 17
    records = {r.name: r for r in prepared.records}
    assert (
        records["fuse_layernorm"].changed == 5
        and not records["fuse_layernorm"].details["not_fused"]
    )
    assert records["fold_batchnorm"].changed == 6
    assert sum(n.op_type == "LayerNormalization" for n in m.graph.node) == 5
    assert not [n for n in m.graph.node if n.op_type in ("Pow", "Sqrt", "BatchNormalization")]
    # every name traceable: kept, or named after the node the opset converter expanded
    assert {n.name.split("/opset/")[0] for n in m.graph.node} <= original_names
    onnx.checker.check_model(m)
    feed = {"x": RNG.uniform(-1, 1, (1, 3, 48, 160)).astype(np.float32)}
    (before,), (after,) = _run(source, feed), _run(m, feed)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5 * float(np.abs(before).max()))
    again = prepare(m, Passes(opset=17))
    assert all(r.changed == 0 for r in again.records if r.name != "fold_constants")
    assert [n.name for n in again.model.graph.node] == [n.name for n in m.graph.node]
    assert numpy_helper.to_array(m.graph.initializer[0]).size > 0


def _ln_then(after: onnx.NodeProto, out_dims: list[int], **weights) -> onnx.ModelProto:
    """A decomposed LayerNorm of x [2, 8] (`_stats`, then gamma and beta), `after` reading it."""
    consts = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    consts |= {"gamma": np.full(8, 1.5, np.float32), "beta": np.zeros(8, np.float32)}
    nodes = [*_stats([-1]), node("Div", ["d", "s"], "n", "div")]
    nodes += [node("Mul", ["n", "gamma"], "g", "scale"), node("Add", ["g", "beta"], "y", "shift")]
    return model([*nodes, after], [("x", F, [2, 8])], [("out", F, out_dims)], consts | weights)


def test_a_weight_that_lifts_the_rank_blocks_fusion():
    """x [2, 8] times a gamma of [1, 1, 8] is [1, 2, 8]; a LayerNormalization hands out x's
    rank, so the Transpose after it (a perm of 3) read a tensor of rank 2: exit 70."""
    post = node("Transpose", ["y"], "out", "post", perm=[0, 2, 1])
    source = _ln_then(post, [1, 8, 2], gamma=np.full((1, 1, 8), 1.5, np.float32))
    out, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert record.changed == 0, record.details
    assert "'gamma' of rank 3 broadcasts x of rank 2" in record.details["not_fused"][0]["why"]
    onnx.checker.check_model(out, full_check=True)


def test_the_weights_a_fusion_makes_take_names_no_value_has():
    """A model already holding `mean.scale` and `c.bias_bnfolded` (read by other ops) got a
    second weight of each name from the LayerNorm fusion and the BatchNorm fold (exit 70)."""
    rng = np.random.default_rng(0)
    post = node("Mul", ["y", "mean.scale"], "out", "post")
    source = _ln_then(post, [2, 8], **{"mean.scale": np.full(8, 3.0, np.float32)})
    out, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert record.changed == 1
    onnx.checker.check_model(out, full_check=True)
    x = {"x": rng.uniform(0, 1, (2, 8)).astype(np.float32)}
    run = [ort.InferenceSession(m.SerializeToString()).run(None, x)[0] for m in (source, out)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-5)
    bn = {k: rng.uniform(0.5, 1.5, 2).astype(np.float32) for k in ("s", "b", "mean", "var")}
    conv = model(
        [
            node("Conv", ["x", "w"], "cv", "c"),
            node("BatchNormalization", ["cv", "s", "b", "mean", "var"], "bn", "bn"),
            node("Add", ["bn", "c.bias_bnfolded"], "out", "post"),
        ],
        [("x", F, [1, 1, 4, 4])],
        [("out", F, [1, 2, 4, 4])],
        {
            "w": np.ones((2, 1, 1, 1), np.float32),
            "c.bias_bnfolded": np.ones((1, 2, 1, 1), np.float32),
            **bn,
        },
    )
    folded, record = fuse.fold_batchnorm(conv)
    assert record.changed == 1
    onnx.checker.check_model(folded, full_check=True)


def test_a_resorted_layernorm_beside_another_of_the_same_x_fuses_too():
    """x centred twice, the divided Sub first, and a second LayerNorm of x: the variance was
    looked up from the first Sub, whose fallback took the other unit's statistics, and the
    re-sorted unit was dropped."""
    consts = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    for k in ("", "2"):
        consts[f"w{k}"] = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
        consts[f"b{k}"] = RNG.uniform(-1, 1, 8).astype(np.float32)
    second = []
    for n in _stats([-1]):
        n = onnx.NodeProto.FromString(n.SerializeToString())
        n.name += "2"
        n.output[:] = [o + "2" for o in n.output]
        n.input[:] = [i if i in ("x", "two", "eps") else i + "2" for i in n.input]
        second.append(n)
    second += [node("Div", ["d2", "s2"], "n2", "div2"), node("Mul", ["n2", "w2"], "g2", "gamma2")]
    second.append(node("Add", ["g2", "b2"], "y2", "beta2"))
    stats = _stats([-1])
    nodes = [stats[0], node("Sub", ["x", "m"], "dd", "subdiv"), *stats[1:]]
    nodes += [node("Div", ["dd", "s"], "n", "div"), node("Mul", ["n", "w"], "g", "gamma")]
    nodes += [node("Add", ["g", "b"], "y", "beta"), *second]
    dims = [2, 4, 8]
    source = model(nodes, [("x", F, dims)], [("y", F, dims), ("y2", F, dims)], consts)
    fused, record = fuse.fuse_layernorm(onnx.ModelProto.FromString(source.SerializeToString()))
    assert sorted(d["name"] for d in record.details["fused"]) == ["mean", "mean2"], record.details
    assert_same_outputs(source, fused)
