"""Structural patterns on generated graphs in the variants real exporters write."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers import F, H, model, node
from trtbuild.graph import reductions
from trtbuild.graph.norms import norm_units
from trtbuild.graph.view import GraphView
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes

ONE = {
    "one": np.ones(8, np.float32),
    "two": np.array(2.0, np.float32),
    "eps": np.array(1e-5, np.float32),
}


def _units(m) -> list[list[str]]:
    view = GraphView(m)
    return [[view.nodes[i].name for i in unit.nodes] for unit in norm_units(view)]


def _layernorm_nodes() -> list:
    """A LayerNorm over the last axis of `x` as exporters decompose it, to `n` (no affine)."""
    return [
        node("ReduceMean", ["x"], "m", "mean", axes=[-1]),
        node("Sub", ["x", "m"], "d", "sub"),
        node("Pow", ["d", "two"], "sq", "pow"),
        node("ReduceMean", ["sq"], "v", "var", axes=[-1]),
        node("Add", ["v", "eps"], "ve", "add"),
        node("Sqrt", ["ve"], "s", "sqrt"),
        node("Div", ["d", "s"], "n", "div"),
    ]


def test_decomposed_layernorm_pow_div_affine():
    m = model(
        [
            *_layernorm_nodes(),
            node("Mul", ["n", "one"], "g", "gamma"),
            node("Add", ["g", "one"], "y", "beta"),
        ],
        [("x", F, [2, 8])],
        [("y", F, [2, 8])],
        ONE,
    )
    assert _units(m) == [["mean", "sub", "pow", "var", "add", "sqrt", "div", "gamma", "beta"]]


def test_decomposed_layernorm_mul_square_reciprocal_no_affine():
    m = model(
        [
            node("ReduceMean", ["x"], "m", "mean", axes=[-1]),
            node("Sub", ["x", "m"], "d", "sub"),
            node("Mul", ["d", "d"], "sq", "square"),
            node("ReduceMean", ["sq"], "v", "var", axes=[-1]),
            node("Add", ["v", "eps"], "ve", "add"),
            node("Sqrt", ["ve"], "s", "sqrt"),
            node("Reciprocal", ["s"], "r", "recip"),
            node("Mul", ["d", "r"], "y", "scale"),
        ],
        [("x", F, [2, 8])],
        [("y", F, [2, 8])],
        ONE,
    )
    assert _units(m) == [["mean", "sub", "square", "var", "add", "sqrt", "recip", "scale"]]


def test_bias_free_layernorm_dividing_x_itself_is_one_unit():
    """Restormer's BiasFree_LayerNorm: x / sqrt(var(x) + eps) * w, the variance centred."""
    nodes = [*_layernorm_nodes()[:-1], node("Div", ["x", "s"], "n", "div")]
    m = model(
        [*nodes, node("Mul", ["n", "one"], "y", "weight")],
        [("x", F, [2, 8])],
        [("y", F, [2, 8])],
        ONE,
    )
    (unit,) = norm_units(GraphView(m))
    assert unit.kind == "biasfree-layernorm" and unit.output == "y"
    assert _units(m) == [["mean", "sub", "pow", "var", "add", "sqrt", "div", "weight"]]


def test_dynamo_torch_var_layernorm_is_one_unit():
    """torch.onnx's dynamo export of Restormer's LayerNorm: x - x.mean(-1) over the variance
    taken by a second mean over axis 2 (the same axis of a rank-3 x), without keepdims, then
    reshaped back and expanded to x's shape before epsilon; a Shape of it aside."""
    m = model(
        [node("ReduceMean", ["x", "last"], "m", "mean"),
         node("ReduceMean", ["x", "two_axis"], "m2", "mean_again"),
         node("Sub", ["x", "m2"], "d2", "centred_again"),
         node("Mul", ["d2", "d2"], "sq", "square"),
         node("ReduceMean", ["sq", "two_axis"], "v", "var", keepdims=0),
         node("Shape", ["v"], "vs", "var_shape"),
         node("Reshape", ["v", "kept"], "vk", "reshape"),
         node("Expand", ["vk", "full"], "vx", "expand"),
         node("Sub", ["x", "m"], "d", "centred"),
         node("Add", ["vx", "eps"], "ve", "add"),
         node("Sqrt", ["ve"], "s", "sqrt"),
         node("Div", ["d", "s"], "y", "div")],
        [("x", F, [2, 4, 8])],
        [("y", F, [2, 4, 8]), ("vs", onnx.TensorProto.INT64, [2])],
        {**ONE, "last": np.array([-1]), "two_axis": np.array([2]), "kept": np.array([2, 4, 1]),
         "full": np.array([2, 4, 8])},
        opset=18,
    )  # fmt: skip
    assert _units(m) == [
        ["mean", "centred", "mean_again", "centred_again", "square", "var", "reshape", "expand",
         "add", "sqrt", "div"]
    ]  # fmt: skip


def test_a_second_mean_without_keepdims_centres_nothing_and_makes_no_unit():
    """x [4, 4, 4] minus its mean over the last axis taken without keepdims ([4, 4]) broadcasts
    along the wrong axis: that variance is no LayerNorm's."""
    m = model(
        [node("ReduceMean", ["x"], "m", "mean", axes=[-1]),
         node("ReduceMean", ["x"], "m2", "mean_again", axes=[-1], keepdims=0),
         node("Sub", ["x", "m2"], "d2", "centred_again"),
         node("Mul", ["d2", "d2"], "sq", "square"),
         node("ReduceMean", ["sq"], "v", "var", axes=[-1]),
         node("Add", ["v", "eps"], "ve", "add"),
         node("Sqrt", ["ve"], "s", "sqrt"),
         node("Sub", ["x", "m"], "d", "centred"),
         node("Div", ["d", "s"], "y", "div")],
        [("x", F, [4, 4, 4])],
        [("y", F, [4, 4, 4])],
        ONE,
    )  # fmt: skip
    assert _units(m) == []


def test_rmsnorm_and_fused_norms():
    m = model(
        [
            node("Pow", ["x", "two"], "sq", "pow"),
            node("ReduceMean", ["sq"], "v", "var", axes=[-1]),
            node("Add", ["v", "eps"], "ve", "add"),
            node("Sqrt", ["ve"], "s", "sqrt"),
            node("Div", ["x", "s"], "n", "div"),
            node("Mul", ["n", "one"], "r", "weight"),
            node("LayerNormalization", ["r", "one", "one"], "y", "ln"),
        ],
        [("x", F, [2, 8])],
        [("y", F, [2, 8])],
        ONE,
    )
    assert _units(m) == [["ln"], ["pow", "var", "add", "sqrt", "div", "weight"]]


def _constants(values: dict[str, np.ndarray]) -> list:
    """`Constant` nodes holding `values`, as the legacy torch.onnx exporter writes them."""
    return [
        node("Constant", [], k, f"const_{k}", value=numpy_helper.from_array(v, k))
        for k, v in values.items()
    ]


def _rsqrt_tail(x: str, std: str, scaled: str, x_first: bool = True, op: str = "Div") -> list:
    """`x * torch.rsqrt(·)` as the legacy torch.onnx exporter writes it: Div(1, std) (or
    Reciprocal(std), as some write it), then Mul."""
    operands = [x, "r"] if x_first else ["r", x]
    inverse = ["one", std] if op == "Div" else [std]
    return [node(op, inverse, "r", "rsqrt"), node("Mul", operands, scaled, "scale")]


def _hf_rmsnorm_stats(x: str) -> list:
    return [
        node("Pow", [x, "two"], "sq", "pow"),
        node("ReduceMean", ["sq"], "v", "var", axes=[-1]),
        node("Add", ["v", "eps"], "ve", "add"),
        node("Sqrt", ["ve"], "s", "sqrt"),
    ]


RMS_NODES = ["pow", "var", "add", "sqrt", "rsqrt", "scale", "weight"]
RSQRT = {"two": ONE["two"], "eps": ONE["eps"], "one": np.array(1.0, np.float32)}
W8 = np.ones(8, np.float32)


@pytest.mark.parametrize("as_constants", [False, True], ids=["weights", "constant-nodes"])
@pytest.mark.parametrize("one_shape", [(), (1,)], ids=["scalar-one", "shape-1-one"])
@pytest.mark.parametrize("x_first", [True, False], ids=["mul-x-r", "mul-r-x"])
def test_hf_rmsnorm_with_rsqrt_as_div_of_one_is_one_unit(as_constants, one_shape, x_first):
    """T5LayerNorm/LlamaRMSNorm, `w * (x * torch.rsqrt(x.pow(2).mean(-1) + eps))`: the legacy
    exporter's rsqrt is Sqrt, then Div(1, ·); 2, eps and 1 as weights or `Constant` nodes."""
    consts = {**RSQRT, "one": np.ones(one_shape, np.float32)}
    nodes = [
        *_hf_rmsnorm_stats("x"),
        *_rsqrt_tail("x", "s", "n", x_first),
        node("Mul", ["w", "n"], "y", "weight"),
    ]
    if as_constants:
        nodes, consts = [*_constants(consts), *nodes], {}
    m = model(nodes, [("x", F, [2, 8])], [("y", F, [2, 8])], {**consts, "w": W8})
    assert _units(m) == [RMS_NODES]
    (unit,) = norm_units(GraphView(m))
    assert (unit.kind, unit.x, unit.output, unit.scale) == ("rmsnorm", "x", "y", "w")


def test_a_division_of_two_by_the_deviation_is_no_rmsnorm():
    """Only a numerator of 1 makes the Div an inverse: x * 2 / rms is no unit."""
    nodes = [*_hf_rmsnorm_stats("x"), *_rsqrt_tail("x", "s", "y")]
    m = model(nodes, [("x", F, [2, 8])], [("y", F, [2, 8])], {**RSQRT, "one": np.float32(2.0)})
    assert _units(m) == []


@pytest.mark.parametrize("inverse", ["Div", "Reciprocal"])
def test_hf_rmsnorm_of_an_fp16_export_takes_in_its_casts(inverse):
    """An FP16 LlamaRMSNorm/T5LayerNorm export: x cast to FP32 for the square, cast again (the
    exporter's type promotion) for `x * rsqrt`, cast back to FP16 before the weight. Every
    Cast is the unit's: it is pinned whole, from x."""
    nodes = [
        node("Cast", ["x"], "xf", "to_float", to=F),
        node("Cast", ["x"], "xf2", "to_float_again", to=F),
        *_hf_rmsnorm_stats("xf"),
        *_rsqrt_tail("xf2", "s", "n", op=inverse),
        node("Cast", ["n"], "nh", "back", to=H),
        node("Mul", ["w", "nh"], "y", "weight"),
    ]
    inits = {**RSQRT, "w": np.ones(8, np.float16)}
    m = model(nodes, [("x", H, [2, 8])], [("y", H, [2, 8])], inits)
    assert _units(m) == [["to_float", "to_float_again", *RMS_NODES[:-1], "back", "weight"]]
    (unit,) = norm_units(GraphView(m))
    assert (unit.x, unit.output) == ("x", "y")


def test_hf_rmsnorm_leaves_out_a_cast_the_residual_reads_too():
    """An FP32 LlamaRMSNorm export: the exporter merges the residual's read of x into the
    norm's float Cast, so that Cast is not the unit's (the unit starts after it); the Cast
    back, alone between the scaling and the weight, is."""
    nodes = [
        node("Cast", ["x"], "xf", "to_float", to=F),
        *_hf_rmsnorm_stats("xf"),
        *_rsqrt_tail("xf", "s", "n"),
        node("Cast", ["n"], "nf", "back", to=F),
        node("Mul", ["w", "nf"], "h", "weight"),
        node("Add", ["xf", "h"], "y", "residual"),
    ]
    inits = {**RSQRT, "w": W8}
    m = model(nodes, [("x", F, [2, 8])], [("y", F, [2, 8])], inits)
    assert _units(m) == [[*RMS_NODES[:-1], "back", "weight"]]
    (unit,) = norm_units(GraphView(m))
    assert (unit.x, unit.output) == ("xf", "h")


def test_layernorm_with_rsqrt_as_div_of_one_is_one_unit():
    """`(x - mean) * torch.rsqrt(var + eps)` (CohereLayerNorm in transformers), then the
    weight and a bias."""
    nodes = [
        *_layernorm_nodes()[:-1],
        *_rsqrt_tail("d", "s", "n", x_first=False),
        node("Mul", ["w", "n"], "g", "gamma"),
        node("Add", ["g", "b"], "y", "beta"),
    ]
    inits = {**RSQRT, "w": W8, "b": W8}
    m = model(nodes, [("x", F, [2, 8])], [("y", F, [2, 8])], inits)
    (unit,) = norm_units(GraphView(m))
    assert (unit.kind, unit.x, unit.scale, unit.bias) == ("layernorm", "x", "w", "b")
    assert _units(m) == [
        ["mean", "sub", "pow", "var", "add", "sqrt", "rsqrt", "scale", "gamma", "beta"]
    ]


def test_nafnet_layernorm2d_units_found_whole(nafnet_path):
    prepared = prepare(onnx.load(nafnet_path), Passes(opset=17)).model
    units = _units(prepared)
    assert len(units) == 4 and all(len(u) == 9 for u in units)
    assert units[0][0] == "/blocks.0/norm1/ReduceMean" and units[0][-1] == "/blocks.0/norm1/Add_1"


def test_final_reductions_last_n_nearest_outputs():
    # three parallel reductions summed, then one more reduction right before the output
    nodes = [
        node("ReduceMax", ["x"], f"r{i}", f"branch{i}", axes=[1], keepdims=1) for i in range(3)
    ]
    nodes += [
        node("Sum", ["r0", "r1", "r2"], "s", "sum"),
        node("Relu", ["x"], "xr", "relu"),
        node("ReduceMean", ["xr"], "late", "late", axes=[1], keepdims=1),
        node("Add", ["s", "late"], "y", "add"),
    ]
    m = model(nodes, [("x", F, [2, 8])], [("y", F, [2, 1])])
    view = GraphView(m)
    every = {view.nodes[i].name for i in reductions.final_reductions(view, None)}
    assert every == {"branch0", "branch1", "branch2", "late"}
    assert {view.nodes[i].name for i in reductions.final_reductions(view, 1)} == {"late"}


def test_reductions_feeding_later_reductions_are_not_final():
    m = model(
        [
            node("ReduceMean", ["x"], "a", "first", axes=[1], keepdims=1),
            node("Mul", ["x", "a"], "b", "mul"),
            node("ReduceSum", ["b"], "y", "last", keepdims=0),
        ],
        [("x", F, [2, 8])],
        [("y", F, [])],
    )
    view = GraphView(m)
    assert {view.nodes[i].name for i in reductions.final_reductions(view, None)} == {"last"}


def test_periodic_arguments_never_split_a_normalization_unit():
    """`sin(LayerNorm(x) / 0.03)` decomposed: the scaling is the argument's; the unit is the
    model's and stays whole for the rules that pin units."""
    nodes = [
        *_layernorm_nodes(),
        node("Div", ["n", "c"], "arg", "scale"),
        node("Sin", ["arg"], "y", "sin"),
    ]
    inits = {**ONE, "c": np.array(0.03, np.float32)}
    del inits["one"]
    from trtbuild.graph.analysis import Analysis
    from trtbuild.graph.patterns import find

    view = GraphView(model(nodes, [("x", F, [2, 8])], [("y", F, [2, 8])], inits))
    found = {view.nodes[i].name for i in find("periodic_arguments", Analysis(view))}
    assert found == {"scale", "sin"}
