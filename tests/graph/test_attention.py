"""Attention blocks and the normalizations they feed, on generated and real graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.helpers import F, model, node
from trtbuild.graph import patterns, reductions
from trtbuild.graph.analysis import Analysis
from trtbuild.graph.attention import attention_units
from trtbuild.graph.norms import norm_units
from trtbuild.graph.view import GraphView
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes


def _view(path, opset: int | None = None) -> GraphView:
    """The graph as rules see it: after the passes (at the model's own opset by default)."""
    return GraphView(prepare(onnx.load(path), Passes(opset=opset)).model)


def _names(view: GraphView, found: dict[int, str]) -> set[str]:
    return {view.nodes[i].name for i in found}


def _unit_heads(view: GraphView, found: dict[int, str]) -> set[str]:
    """The first node of every normalization unit that `found` pins."""
    return {view.nodes[u.nodes[0]].name for u in norm_units(view) if u.nodes[0] in found}


def test_nafnet_channel_attention_and_the_norms_it_feeds(nafnet_path):
    view = _view(nafnet_path)
    units = attention_units(view)
    assert [(u.kind, view.nodes[u.output].name) for u in units] == [
        ("channel-attention", "/blocks.0/sca/Mul"),
        ("channel-attention", "/blocks.1/sca/Mul"),
    ]
    assert [view.nodes[i].op_type for i in units[0].nodes] == ["GlobalAveragePool", "Conv", "Mul"]
    after = patterns.find("layernorm_after_attention", Analysis(view))
    # norm1 of block 0 sees the intro conv only; the others are reached through
    # conv3 and the residual adds, with no other normalization between.
    assert _unit_heads(view, after) == {
        "/blocks.0/norm2/ReduceMean",
        "/blocks.1/norm1/ReduceMean",
        "/blocks.1/norm2/ReduceMean",
    }
    # pinned as whole units: every node of each unit, nothing else
    assert len(after) == 3 * 9  # ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add
    assert "fed by attention at /blocks.0/sca/Mul" in after[next(iter(after))]


@pytest.mark.parametrize("opset", [None, 17], ids=["decomposed", "fused"])
def test_transformer_self_attention_and_layernorms_after_it(models_dir, opset):
    view = _view(models_dir / "transformer_tiny.onnx", opset)
    units = attention_units(view)
    assert [u.kind for u in units] == ["self-attention", "self-attention"]
    core = {view.nodes[i].name for i in units[0].nodes}
    assert core == {
        "/layers.0/attn/MatMul",
        "/layers.0/attn/Div",
        "/layers.0/attn/Softmax",
        "/layers.0/attn/MatMul_1",
    }
    assert _names(view, patterns.find("attention", Analysis(view))) == core | {
        n.replace("layers.0", "layers.1") for n in core
    }
    after = patterns.find("layernorm_after_attention", Analysis(view))
    assert _unit_heads(view, after) == {
        "/layers.0/norm2/ReduceMean",
        "/layers.1/norm1/ReduceMean",
        "/layers.1/norm2/ReduceMean",
        "/norm/ReduceMean",
    }


def test_gfpgan_has_fifteen_reductions_and_only_the_last_is_final(models_dir):
    view = _view(models_dir / "gfpgan_tiny.onnx", 17)
    found = [n.name for n in view.nodes if n.op_type in reductions.REDUCTIONS]
    assert len(found) == 15
    assert _names(view, patterns.find("final_reductions", Analysis(view))) == {
        "/energy/ReduceSumSquare"
    }
    assert _names(view, patterns.find("final_reductions", Analysis(view), last=1)) == {
        "/energy/ReduceSumSquare"
    }
    # a statistic subtracted from its own input is not a channel-attention gate
    assert attention_units(view) == ()
    assert patterns.find("layernorm_after_attention", Analysis(view)) == {}


def test_ppocrv4_attention_and_layernorms_after_it(real_model):
    view = _view(real_model("ppocrv4_rec"), 17)
    units = attention_units(view)
    kinds = sorted(u.kind for u in units)
    assert kinds == ["channel-attention"] * 2 + ["self-attention"] * 2  # 2 SE blocks, 2 SVTR
    softmax = _names(view, patterns.find("softmax", Analysis(view)))
    assert len(softmax) == 3
    in_attention = _names(view, patterns.find("attention", Analysis(view)))
    # the classifier's softmax after a weight MatMul is not attention
    assert len(softmax & in_attention) == 2
    lns = [u for u in norm_units(view) if u.kind == "LayerNormalization"]
    after = patterns.find("layernorm_after_attention", Analysis(view))
    assert len(lns) == 5
    # the first LayerNorm of the SVTR neck comes before any self-attention
    assert [u.nodes[0] in after for u in lns] == [False, True, True, True, True]


def _se_block(pool: str) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    pool_node = (
        node("GlobalAveragePool", ["x"], "p", "pool")
        if pool == "gap"
        else node("ReduceMean", ["x"], "p", "pool", axes=[2, 3], keepdims=1)
    )
    return model(
        [
            pool_node,
            node("Conv", ["p", "w1"], "a", "fc1"),
            node("Relu", ["a"], "r", "relu"),
            node("Conv", ["r", "w2"], "b", "fc2"),
            node("HardSigmoid", ["b"], "s", "gate"),
            node("Mul", ["x", "s"], "y", "excite"),
        ],
        [("x", F, [1, 8, 4, 4])],
        [("y", F, [1, 8, 4, 4])],
        {
            "w1": rng.normal(size=(2, 8, 1, 1)).astype(np.float32),
            "w2": rng.normal(size=(8, 2, 1, 1)).astype(np.float32),
        },
    )


@pytest.mark.parametrize("pool", ["gap", "reducemean"])
def test_squeeze_excitation_is_channel_attention(pool):
    view = GraphView(_se_block(pool))
    [unit] = attention_units(view)
    assert unit.kind == "channel-attention"
    assert [view.nodes[i].name for i in unit.nodes] == [
        "pool",
        "fc1",
        "relu",
        "fc2",
        "gate",
        "excite",
    ]


def _attention_then_norms(between: str) -> onnx.ModelProto:
    """x → self-attention → [LayerNorm a] → Relu → LayerNorm b."""
    two, eps = np.array(2.0, np.float32), np.array(1e-5, np.float32)

    def ln(tag: str, x: str) -> list[onnx.NodeProto]:
        return [
            node("ReduceMean", [x], f"{tag}m", f"{tag}/mean", axes=[-1]),
            node("Sub", [x, f"{tag}m"], f"{tag}d", f"{tag}/sub"),
            node("Pow", [f"{tag}d", "two"], f"{tag}q", f"{tag}/pow"),
            node("ReduceMean", [f"{tag}q"], f"{tag}v", f"{tag}/var", axes=[-1]),
            node("Add", [f"{tag}v", "eps"], f"{tag}e", f"{tag}/add"),
            node("Sqrt", [f"{tag}e"], f"{tag}s", f"{tag}/sqrt"),
            node("Div", [f"{tag}d", f"{tag}s"], f"{tag}y", f"{tag}/div"),
        ]

    nodes = [
        node("Transpose", ["x"], "kt", "kt", perm=[0, 2, 1]),
        node("MatMul", ["x", "kt"], "s", "qk"),
        node("Softmax", ["s"], "p", "softmax", axis=-1),
        node("MatMul", ["p", "x"], "o", "pv"),
    ]
    src = "o"
    if between == "norm":
        nodes += ln("a", "o")
        src = "ay"
    nodes += [node("Relu", [src], "r", "relu"), *ln("b", "r")]
    return model(nodes, [("x", F, [1, 4, 8])], [("by", F, [1, 4, 8])], {"two": two, "eps": eps})


def test_a_norm_in_between_ends_the_path():
    view = GraphView(_attention_then_norms("norm"))
    assert _unit_heads(view, patterns.find("layernorm_after_attention", Analysis(view))) == {
        "a/mean"
    }
    view = GraphView(_attention_then_norms("none"))
    assert _unit_heads(view, patterns.find("layernorm_after_attention", Analysis(view))) == {
        "b/mean"
    }


def test_an_hf_rmsnorm_the_residual_stream_carries_attention_into_is_found_whole():
    """A Llama layer's post-attention RMSNorm as the legacy torch.onnx exporter writes it:
    the residual sum through the norm's Cast to float (which the next residual reads too),
    then x * rsqrt(mean(x²) + eps) with rsqrt as Sqrt and Div(1, ·), the Cast back, the
    weight."""
    nodes = [
        node("Transpose", ["x"], "kt", "kt", perm=[0, 2, 1]),
        node("MatMul", ["x", "kt"], "s", "qk"),
        node("Softmax", ["s"], "p", "softmax", axis=-1),
        node("MatMul", ["p", "x"], "o", "pv"),
        node("Add", ["x", "o"], "h", "residual"),
        node("Cast", ["h"], "hf", "to_float", to=F),
        node("Pow", ["hf", "two"], "sq", "pow"),
        node("ReduceMean", ["sq"], "v", "var", axes=[-1]),
        node("Add", ["v", "eps"], "ve", "add"),
        node("Sqrt", ["ve"], "sd", "sqrt"),
        node("Div", ["one", "sd"], "r", "rsqrt"),
        node("Mul", ["hf", "r"], "n", "scale"),
        node("Cast", ["n"], "nf", "back", to=F),
        node("Mul", ["w", "nf"], "normed", "weight"),
        node("Add", ["hf", "normed"], "y", "next_residual"),
    ]
    consts = {"two": 2.0, "eps": 1e-6, "one": 1.0}
    inits = {k: np.array(v, np.float32) for k, v in consts.items()}
    inits["w"] = np.ones(8, np.float32)
    view = GraphView(model(nodes, [("x", F, [1, 4, 8])], [("y", F, [1, 4, 8])], inits))
    unit = {"pow", "var", "add", "sqrt", "rsqrt", "scale", "back", "weight"}
    assert _names(view, patterns.find("layernorm_after_attention", Analysis(view))) == unit


def test_soft_capped_attention_is_a_block_and_its_post_norm_follows_it():
    """Gemma 2's attention caps its logits, `50 * tanh(scores / 50)`, before the mask and
    Softmax, and its post-attention RMSNorm reads the output projection directly."""
    nodes = [
        node("Transpose", ["x"], "kt", "kt", perm=[0, 2, 1]),
        node("MatMul", ["x", "kt"], "s", "qk"),
        node("Div", ["s", "cap"], "sd", "cap_div"),
        node("Tanh", ["sd"], "st", "cap_tanh"),
        node("Mul", ["st", "cap"], "sc", "cap_mul"),
        node("Softmax", ["sc"], "p", "softmax", axis=-1),
        node("MatMul", ["p", "x"], "o", "pv"),
        node("MatMul", ["o", "wo"], "proj", "o_proj"),
        node("Pow", ["proj", "two"], "sq", "pow"),
        node("ReduceMean", ["sq"], "v", "var", axes=[-1]),
        node("Add", ["v", "eps"], "ve", "add"),
        node("Sqrt", ["ve"], "sd2", "sqrt"),
        node("Div", ["one", "sd2"], "r", "rsqrt"),
        node("Mul", ["proj", "r"], "y", "scale"),
    ]
    consts = {"two": 2.0, "eps": 1e-6, "one": 1.0, "cap": 50.0}
    inits = {k: np.array(v, np.float32) for k, v in consts.items()}
    inits["wo"] = np.eye(8, dtype=np.float32)
    view = GraphView(model(nodes, [("x", F, [1, 4, 8])], [("y", F, [1, 4, 8])], inits))
    units = attention_units(view)
    assert [u.kind for u in units] == ["self-attention"]
    assert {"cap_div", "cap_tanh", "cap_mul"} <= {view.nodes[i].name for i in units[0].nodes}
    after = patterns.find("layernorm_after_attention", Analysis(view))
    assert _names(view, after) == {"pow", "var", "add", "sqrt", "rsqrt", "scale"}


def test_fused_attention_op_is_a_block():
    nodes = [
        node("Attention", ["q", "k", "v"], "o", "attn"),
        node("LayerNormalization", ["o", "g"], "y", "ln", axis=-1),
    ]
    m = model(
        nodes,
        [("q", F, [1, 2, 4, 8]), ("k", F, [1, 2, 4, 8]), ("v", F, [1, 2, 4, 8])],
        [("y", F, [1, 2, 4, 8])],
        {"g": np.ones(8, np.float32)},
        opset=23,
    )
    view = GraphView(m)
    assert [u.kind for u in attention_units(view)] == ["Attention"]
    assert _names(view, patterns.find("layernorm_after_attention", Analysis(view))) == {"ln"}


# model -> pattern -> (nodes matched, their op types), after the passes at opset 17.
EVERY_PATTERN = {
    "nafnet_tiny": {
        "layernorm": (36, {"ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div", "Mul"}),
        "layernorm_after_attention": (
            27,
            {"ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div", "Mul"},
        ),
        "attention": (6, {"GlobalAveragePool", "Conv", "Mul"}),
        "softmax": (0, set()),
        "final_reductions": (1, {"ReduceSum"}),
    },
    "gfpgan_tiny": {
        "layernorm": (1, {"LayerNormalization"}),  # the decoder's fused instance-norm statistics
        "layernorm_after_attention": (0, set()),
        "attention": (0, set()),
        "softmax": (0, set()),
        "final_reductions": (1, {"ReduceSumSquare"}),
    },
    "transformer_tiny": {
        "layernorm": (5, {"LayerNormalization"}),
        "layernorm_after_attention": (4, {"LayerNormalization"}),
        "attention": (8, {"MatMul", "Div", "Softmax"}),
        "softmax": (2, {"Softmax"}),
        "final_reductions": (0, set()),  # fused LayerNorms are not Reduce* nodes
    },
    "bert_tiny": {
        "layernorm": (5, {"LayerNormalization"}),
        "layernorm_after_attention": (2, {"LayerNormalization"}),  # post-LN: one per layer
        "attention": (10, {"MatMul", "Div", "Add", "Softmax"}),  # the mask Add included
        "softmax": (2, {"Softmax"}),
        "final_reductions": (0, set()),
    },
    "ppocrv4_rec": {
        "layernorm": (5, {"LayerNormalization"}),
        "layernorm_after_attention": (4, {"LayerNormalization"}),
        "attention": (
            22,
            {"GlobalAveragePool", "Conv", "Relu", "HardSigmoid", "Mul"}
            | {"MatMul", "Flatten", "Softmax", "Reshape"},
        ),
        "softmax": (3, {"Softmax"}),
        "final_reductions": (1, {"GlobalAveragePool"}),
    },
}


@pytest.mark.parametrize("name", sorted(EVERY_PATTERN))
def test_every_pattern_on_every_example_model(name, models_dir, real_model):
    path = real_model(name) if name == "ppocrv4_rec" else models_dir / f"{name}.onnx"
    view = _view(path, 17)
    for pattern, (count, ops) in EVERY_PATTERN[name].items():
        found = patterns.find(pattern, Analysis(view))
        assert (len(found), {view.nodes[i].op_type for i in found}) == (count, ops), pattern


def test_a_gate_on_features_computed_from_the_pooled_tensor_is_channel_attention():
    """KBNet's block: `x * x1 * sca`, the pooled tensor's channel gate multiplies convolutions
    of it, not the tensor itself: no block was found, and the norm after it was none."""
    rng = np.random.default_rng(0)
    weights = {f"w{k}": rng.normal(size=(8, 8, 1, 1)).astype(np.float32) for k in range(4)}
    weights |= {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32)}
    nodes = [
        node("GlobalAveragePool", ["x"], "p", "sca/pool"),
        node("Conv", ["p", "w0"], "g", "sca/conv"),
        node("Conv", ["x", "w1"], "f1", "conv11"),
        node("Conv", ["x", "w2"], "f2", "conv1"),
        node("Mul", ["f2", "f1"], "f", "mul"),
        node("Mul", ["f", "g"], "gated", "gate"),
        node("Conv", ["gated", "w3"], "c", "conv3"),
        node("Add", ["x", "c"], "r", "residual"),
        node("ReduceMean", ["r"], "m", "norm2/mean", axes=[1]),
        node("Sub", ["r", "m"], "d", "norm2/sub"),
        node("Pow", ["d", "two"], "sq", "norm2/pow"),
        node("ReduceMean", ["sq"], "v", "norm2/var", axes=[1]),
        node("Add", ["v", "eps"], "ve", "norm2/eps"),
        node("Sqrt", ["ve"], "s", "norm2/sqrt"),
        node("Div", ["d", "s"], "y", "norm2/div"),
    ]
    view = GraphView(model(nodes, [("x", F, [1, 8, 4, 4])], [("y", F, [1, 8, 4, 4])], weights))
    [unit] = attention_units(view)
    assert (unit.kind, view.nodes[unit.output].name) == ("channel-attention", "gate")
    after = patterns.find("layernorm_after_attention", Analysis(view))
    assert _unit_heads(view, after) == {"norm2/mean"}


def test_a_squeeze_excitation_with_silu_in_its_branch_is_gated_at_its_end():
    """EfficientNet's SE block: pool, conv, SiLU (`h * sigmoid(h)`), conv, sigmoid, `x * s`.
    The SiLU's Mul reads a value computed from the pooled tensor, which counted as a feature
    of x: the gate was taken there, half the block (3 nodes, not 6)."""
    rng = np.random.default_rng(0)
    weights = {
        "w0": rng.normal(size=(4, 8, 1, 1)).astype(np.float32),
        "w1": rng.normal(size=(8, 4, 1, 1)).astype(np.float32),
    }
    nodes = [
        node("GlobalAveragePool", ["x"], "p", "se/pool"),
        node("Conv", ["p", "w0"], "c0", "se/reduce"),
        node("Sigmoid", ["c0"], "s0", "se/silu_sig"),
        node("Mul", ["c0", "s0"], "a0", "se/silu_mul"),
        node("Conv", ["a0", "w1"], "c1", "se/expand"),
        node("Sigmoid", ["c1"], "s1", "se/gate_sig"),
        node("Mul", ["x", "s1"], "y", "se/gate"),
    ]
    view = GraphView(model(nodes, [("x", F, [1, 8, 4, 4])], [("y", F, [1, 8, 4, 4])], weights))
    [unit] = attention_units(view)
    assert view.nodes[unit.output].name == "se/gate" and len(unit.nodes) == 6


def test_features_of_x_are_found_on_their_shortest_path():
    """A depth-first walk met `no` first at the end of a long chain, past the hop limit,
    and never again on the short path: `f` did not derive from x."""
    from trtbuild.graph.attention import _MAX_HOPS, _derives

    nodes = [node("Relu", ["x"], "mo", "M"), node("Relu", ["mo"], "no", "N")]
    nodes.append(node("Relu", ["no"], "b", "short"))
    prev = "no"
    for k in range(_MAX_HOPS - 2):
        nodes.append(node("Relu", [prev], f"c{k}", f"chain{k}"))
        prev = f"c{k}"
    nodes.append(node("Add", ["b", prev], "f", "join"))
    view = GraphView(model(nodes, [("x", F, [1, 8, 4, 4])], [("f", F, [1, 8, 4, 4])]))
    assert _derives(view, "f", "x", pool=-1)
