#!/usr/bin/env python3
"""Generate the project's example models deterministically (they are not committed).

Why generated: the failure modes users reported (NAFNet's LayerNorm variance
overflowing FP16, GFPGAN's last reduction turning into inf) are reproduced by
small graphs whose weights are scaled to hit them, written the way PyTorch
exports them below opset 17, so every stage of trtbuild is exercised on a model
that really breaks in FP16.

Usage: python scripts/make_models.py [--out models] [--size 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Tiny helper that names nodes the way torch.onnx does (`/scope/Op`, `/scope/Op_1`)."""

    def __init__(self, seed: int = 0):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self._names: dict[str, int] = {}

    def _unique(self, base: str) -> str:
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array, dtype=np.float32), name))
        return name

    def ints(self, name: str, values: list[int]) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def const(self, scope: str, value: float) -> str:
        """A scalar from a `Constant` node, as PyTorch exports exponents and epsilons."""
        name = self._unique(f"{scope}/Constant")
        out = f"{name}_output_0"
        tensor = numpy_helper.from_array(np.array(value, dtype=np.float32))
        self.nodes.append(helper.make_node("Constant", [], [out], name=name, value=tensor))
        return out

    def op(self, scope: str, op: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list:
        name = self._unique(f"{scope}/{op}")
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(
        self,
        scope: str,
        x: str,
        cin: int,
        cout: int,
        k: int = 1,
        groups: int = 1,
        std: float | None = None,
    ) -> str:
        fan_in = cin // groups * k * k
        std = (1.0 / np.sqrt(fan_in)) if std is None else std
        w = self.rng.normal(0.0, std, size=(cout, cin // groups, k, k))
        b = self.rng.normal(0.0, 0.01, size=(cout,))
        wn = self.init(f"{scope.strip('/').replace('/', '.')}.weight", w)
        bn = self.init(f"{scope.strip('/').replace('/', '.')}.bias", b)
        return self.op(
            scope, "Conv", [x, wn, bn], kernel_shape=[k, k], pads=[k // 2] * 4, group=groups
        )

    def linear(self, scope: str, x: str, cin: int, cout: int, std: float | None = None) -> str:
        """nn.Linear as exported: MatMul by the transposed weight, then Add(bias)."""
        std = (1.0 / np.sqrt(cin)) if std is None else std
        key = scope.strip("/").replace("/", ".")
        w = self.init(f"{key}.weight", self.rng.normal(0.0, std, size=(cin, cout)))
        b = self.init(f"{key}.bias", self.rng.normal(0.0, 0.01, size=(cout,)))
        return self.op(scope, "Add", [self.op(scope, "MatMul", [x, w]), b])

    def layernorm(self, scope: str, x: str, c: int, axis: int = -1) -> str:
        """LayerNorm decomposed as torch.onnx writes it below opset 17."""
        mu = self.op(scope, "ReduceMean", [x], axes=[axis], keepdims=1)
        d = self.op(scope, "Sub", [x, mu])
        sq = self.op(scope, "Pow", [d, self.const(scope, 2.0)])
        var = self.op(scope, "ReduceMean", [sq], axes=[axis], keepdims=1)
        ve = self.op(scope, "Add", [var, self.const(scope, 1e-5)])
        std = self.op(scope, "Sqrt", [ve])
        y = self.op(scope, "Div", [d, std])
        key = scope.strip("/").replace("/", ".")
        w = self.init(f"{key}.weight", 1.0 + 0.1 * self.rng.standard_normal((c,)))
        b = self.init(f"{key}.bias", 0.1 * self.rng.standard_normal((c,)))
        return self.op(scope, "Add", [self.op(scope, "Mul", [y, w]), b])

    def layernorm2d(self, scope: str, x: str, c: int) -> str:
        """NAFNet's LayerNorm2d over the channel axis, decomposed as exported at opset 13."""
        mu = self.op(scope, "ReduceMean", [x], axes=[1], keepdims=1)
        d = self.op(scope, "Sub", [x, mu])
        sq = self.op(scope, "Pow", [d, self.const(scope, 2.0)])
        var = self.op(scope, "ReduceMean", [sq], axes=[1], keepdims=1)
        ve = self.op(scope, "Add", [var, self.const(scope, 1e-6)])
        std = self.op(scope, "Sqrt", [ve])
        y = self.op(scope, "Div", [d, std])
        key = scope.strip("/").replace("/", ".")
        w = self.init(f"{key}.weight", 1.0 + 0.1 * self.rng.standard_normal((1, c, 1, 1)))
        b = self.init(f"{key}.bias", 0.1 * self.rng.standard_normal((1, c, 1, 1)))
        return self.op(scope, "Add", [self.op(scope, "Mul", [y, w]), b])

    def model(self, inputs: dict, outputs: dict, opset: int, name: str) -> onnx.ModelProto:
        """The checked model; `inputs` name -> shape (float) or (shape, elem_type),
        `outputs` name -> (tensor, shape).

        Each output gets an `Identity` named `/out/{name}`, as exporters name them.
        """
        for out, (tensor, _) in outputs.items():
            self.nodes.append(helper.make_node("Identity", [tensor], [out], name=f"/out/{out}"))
        typed = {
            n: s if isinstance(s, tuple) else (s, TensorProto.FLOAT) for n, s in inputs.items()
        }
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(n, t, s) for n, (s, t) in typed.items()],
            [
                helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                for n, (_, s) in outputs.items()
            ],
            self.inits,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="trtbuild-examples"
        )
        model.ir_version = 8
        onnx.checker.check_model(model)
        return onnx.shape_inference.infer_shapes(model)


def simple_gate(g: GraphBuilder, scope: str, x: str) -> str:
    a, b = g.op(scope, "Split", [x], n_out=2, axis=1)
    return g.op(scope, "Mul", [a, b])


def naf_block(g: GraphBuilder, scope: str, inp: str, c: int) -> str:
    x = g.layernorm2d(f"{scope}/norm1", inp, c)
    x = g.conv(f"{scope}/conv1", x, c, 2 * c)
    x = g.conv(f"{scope}/conv2", x, 2 * c, 2 * c, k=3, groups=2 * c)
    x = simple_gate(g, f"{scope}/sg", x)
    # Simplified channel attention: global pooling -> 1x1 conv -> scale.
    pooled = g.op(f"{scope}/sca", "GlobalAveragePool", [x])
    att = g.conv(f"{scope}/sca/conv", pooled, c, c)
    x = g.op(f"{scope}/sca", "Mul", [x, att])
    x = g.conv(f"{scope}/conv3", x, c, c)
    y = g.op(scope, "Add", [inp, x])
    x = g.layernorm2d(f"{scope}/norm2", y, c)
    x = g.conv(f"{scope}/conv4", x, c, 2 * c)
    x = simple_gate(g, f"{scope}/sg_1", x)
    x = g.conv(f"{scope}/conv5", x, c, c)
    return g.op(scope, "Add", [y, x])


def nafnet_tiny(size: int = 64, width: int = 16, blocks: int = 2) -> onnx.ModelProto:
    """NAFNet-style restoration net whose LayerNorm variance overflows FP16.

    The intro convolution's weights are scaled (std 100) so features reach the
    thousands, as in the reported NAFNet case: the squared deviations inside
    each LayerNorm2d pass 65504. The `total` output sums the absolute features
    over the whole image, far above 65504, as GFPGAN's last reduction does.
    """
    g = GraphBuilder(seed=0)
    x = g.conv("/intro", "input", 3, width, k=3, std=100.0)
    for i in range(blocks):
        x = naf_block(g, f"/blocks.{i}", x, width)
    restored = g.op("/ending", "Add", [g.conv("/ending", x, width, 3, k=3, std=1e-3), "input"])
    total = g.op("/head", "ReduceSum", [g.op("/head", "Abs", [x])], keepdims=0)
    return g.model(
        {"input": [1, 3, size, size]},
        {"restored": (restored, [1, 3, size, size]), "total": (total, [])},
        opset=13,
        name="nafnet_tiny",
    )


def gfpgan_tiny(
    size: int = 32, width: int = 8, stages: int = 14, std: float = 6.0, dynamic: bool = False
) -> onnx.ModelProto:
    """GFPGAN-style generator: fifteen reductions, and only the last overflows FP16.

    Each of the 14 stages re-centres its features by a style statistic (a
    spatial ReduceMean or ReduceMax, values in the tens), as modulated
    generators do; none of them leaves the FP16 range. The 15th reduction, the
    feature energy (ReduceSumSquare over the whole map), reaches about 1e6:
    in FP16 it is inf, as the reported face model's last reduction was on the
    GPU.

    The decoder then upsamples 4x to 128x128 and normalises with instance-norm
    statistics (decomposed as exported; the LayerNorm fusion turns them into a
    `LayerNormalization` over axes 2-3). Their sums run over 16384 values and
    pass 65504, yet no stored tensor does: the face passes when a kernel sums
    in FP32 (`storage`) and fails when it keeps the sums in FP16 (`strict`).
    """
    g = GraphBuilder(seed=1)
    x = g.conv("/encoder", "input", 3, width, k=3, std=std)
    for i in range(stages):
        scope = f"/stage.{i}"
        stat = "ReduceMean" if i % 2 == 0 else "ReduceMax"
        s = g.op(scope, stat, [x], axes=[2, 3], keepdims=1)
        h = g.conv(scope, g.op(scope, "Sub", [x, s]), width, width, k=3, std=0.05)
        x = g.op(scope, "Add", [x, g.op(scope, "LeakyRelu", [h], alpha=0.2)])
    up = g.op("/decoder", "Resize", [x, "", g.init("decoder.scales", [1, 1, 4, 4])], mode="nearest")
    mu = g.op("/decoder/norm", "ReduceMean", [up], axes=[2, 3], keepdims=1)
    d = g.op("/decoder/norm", "Sub", [up, mu])
    sq = g.op("/decoder/norm", "Pow", [d, g.const("/decoder/norm", 2.0)])
    var = g.op("/decoder/norm", "ReduceMean", [sq], axes=[2, 3], keepdims=1)
    std = g.op(
        "/decoder/norm",
        "Sqrt",
        [g.op("/decoder/norm", "Add", [var, g.const("/decoder/norm", 1e-5)])],
    )
    normed = g.op("/decoder/norm", "Div", [d, std])
    face = g.conv("/to_rgb", normed, width, 3, std=0.05)
    energy = g.op("/energy", "ReduceSumSquare", [x], keepdims=0)
    big = 4 * size
    side, out = ([1, 3, "height", "width"], [1, 3, "out_h", "out_w"]) if dynamic else (None, None)
    return g.model(
        {"input": side or [1, 3, size, size]},
        {"face": (face, out or [1, 3, big, big]), "energy": (energy, [])},
        opset=13,
        name="gfpgan_dynamic" if dynamic else "gfpgan_tiny",
    )


def gfpgan_dynamic() -> onnx.ModelProto:
    """The GFPGAN-style generator with a dynamic height and width and smaller features.

    Its final reduction (the feature energy) sums squares over the whole map, so it
    grows with H x W: 4.5e3 at 32x32, 2.3e4 at 64x64 (both fit FP16) and 4.2e5 at
    256x256. Judged at `opt` alone, all-FP16 passes; the engine built for the
    profile returns inf at `max`.
    """
    return gfpgan_tiny(std=0.1, dynamic=True)


def _heads(g: GraphBuilder, scope: str, x: str, seq: int, heads: int, dh: int, perm) -> str:
    shape = g.ints(f"{scope.strip('/').replace('/', '.')}.shape", [1, seq, heads, dh])
    return g.op(scope, "Transpose", [g.op(scope, "Reshape", [x, shape])], perm=perm)


def attention_block(
    g: GraphBuilder, scope: str, x: str, seq: int, dim: int, heads: int, mask: str | None = None
) -> str:
    dh = dim // heads
    q = _heads(
        g, f"{scope}/q", g.linear(f"{scope}/q_proj", x, dim, dim), seq, heads, dh, [0, 2, 1, 3]
    )
    k = _heads(
        g, f"{scope}/k", g.linear(f"{scope}/k_proj", x, dim, dim), seq, heads, dh, [0, 2, 3, 1]
    )
    v = _heads(
        g, f"{scope}/v", g.linear(f"{scope}/v_proj", x, dim, dim), seq, heads, dh, [0, 2, 1, 3]
    )
    scores = g.op(scope, "Div", [g.op(scope, "MatMul", [q, k]), g.const(scope, float(np.sqrt(dh)))])
    if mask is not None:
        scores = g.op(scope, "Add", [scores, mask])
    p = g.op(scope, "Softmax", [scores], axis=-1)
    o = g.op(scope, "Transpose", [g.op(scope, "MatMul", [p, v])], perm=[0, 2, 1, 3])
    o = g.op(scope, "Reshape", [o, g.ints(f"{scope.strip('/')}.merge", [1, seq, dim])])
    out = g.linear(f"{scope}/out_proj", o, dim, dim)
    return out


def gelu(g: GraphBuilder, scope: str, x: str) -> str:
    """GELU as torch.onnx writes it below opset 20: x * 0.5 * (1 + erf(x / sqrt 2))."""
    e = g.op(scope, "Erf", [g.op(scope, "Div", [x, g.const(scope, float(np.sqrt(2.0)))])])
    y = g.op(scope, "Mul", [x, g.op(scope, "Add", [e, g.const(scope, 1.0)])])
    return g.op(scope, "Mul", [y, g.const(scope, 0.5)])


def transformer_tiny(
    seq: int = 16, dim: int = 32, heads: int = 2, layers: int = 2, outlier: float = 100.0
) -> onnx.ModelProto:
    """Pre-LN transformer encoder whose attention writes an outlier feature.

    As in large transformers, one channel of each attention output projection
    is scaled up (`outlier`), so the residual stream after the first attention
    carries values in the thousands. Every LayerNorm fed by it squares them
    past 65504 in FP16; the first LayerNorm, before any attention, is safe.
    """
    g = GraphBuilder(seed=2)
    x = g.linear("/embed", "tokens", dim, dim)
    for i in range(layers):
        scope = f"/layers.{i}"
        h = g.layernorm(f"{scope}/norm1", x, dim)
        a = attention_block(g, f"{scope}/attn", h, seq, dim, heads)
        if outlier and i == 0:
            w = next(t for t in g.inits if t.name == f"{scope.strip('/')}.attn.out_proj.weight")
            arr = numpy_helper.to_array(w).copy()
            arr[:, 0] *= outlier * np.sqrt(dim)
            w.CopyFrom(numpy_helper.from_array(arr, w.name))
        x = g.op(scope, "Add", [x, a])
        h = g.layernorm(f"{scope}/norm2", x, dim)
        h = g.linear(
            f"{scope}/fc2",
            gelu(g, f"{scope}/act", g.linear(f"{scope}/fc1", h, dim, 4 * dim)),
            4 * dim,
            dim,
        )
        x = g.op(scope, "Add", [x, h])
    x = g.layernorm("/norm", x, dim)
    logits = g.linear("/head", x, dim, 8)
    return g.model(
        {"tokens": [1, seq, dim]},
        {"logits": (logits, [1, seq, 8])},
        opset=13,
        name="transformer_tiny",
    )


def bert_tiny(seq: int = 16, dim: int = 32, heads: int = 2, layers: int = 2) -> onnx.ModelProto:
    """A BERT encoder laid out as `transformers` exports it (opset 17).

    int64 `input_ids`, `token_type_ids` and `attention_mask`; word, position and
    token-type embeddings gathered and summed; fused `LayerNormalization`
    (post-LN); the extended attention mask `(1 - mask) * finfo(float32).min`
    as `Unsqueeze -> Cast -> Sub(1, .) -> Mul(min)`, added to the scores; Erf
    GELU; a Tanh pooler on the first token. The -3.4e38 constant is inf in
    FP16, and `0 * -inf` is NaN at every unmasked position.
    """
    vocab = 100
    g = GraphBuilder(seed=3)
    emb = {
        "word": g.init("embeddings.word_embeddings.weight", g.rng.normal(0, 0.5, (vocab, dim))),
        "pos": g.init("embeddings.position_embeddings.weight", g.rng.normal(0, 0.5, (64, dim))),
        "type": g.init("embeddings.token_type_embeddings.weight", g.rng.normal(0, 0.5, (2, dim))),
    }
    ids = g.ints("embeddings.position_ids", [list(range(seq))])
    x = g.op("/embeddings/word_embeddings", "Gather", [emb["word"], "input_ids"])
    t = g.op("/embeddings/token_type_embeddings", "Gather", [emb["type"], "token_type_ids"])
    p = g.op("/embeddings/position_embeddings", "Gather", [emb["pos"], ids])
    x = g.op("/embeddings", "Add", [g.op("/embeddings", "Add", [x, t]), p])
    x = _fused_ln(g, "/embeddings/LayerNorm", x, dim)
    m = g.op("/mask", "Unsqueeze", ["attention_mask", g.ints("mask.axes", [1, 2])])
    m = g.op("/mask", "Cast", [m], to=TensorProto.FLOAT)
    m = g.op("/mask", "Sub", [g.const("/mask", 1.0), m])
    mask = g.op("/mask", "Mul", [m, g.const("/mask", float(np.finfo(np.float32).min))])
    for i in range(layers):
        scope = f"/encoder/layer.{i}"
        a = attention_block(g, f"{scope}/attention", x, seq, dim, heads, mask=mask)
        x = _fused_ln(g, f"{scope}/attention/output/LayerNorm", g.op(scope, "Add", [a, x]), dim)
        h = gelu(
            g, f"{scope}/intermediate", g.linear(f"{scope}/intermediate/dense", x, dim, 4 * dim)
        )
        h = g.linear(f"{scope}/output/dense", h, 4 * dim, dim)
        x = _fused_ln(g, f"{scope}/output/LayerNorm", g.op(scope, "Add", [h, x]), dim)
    first = g.op("/pooler", "Gather", [x, g.ints("pooler.index", 0)], axis=1)
    pooled = g.op("/pooler", "Tanh", [g.linear("/pooler/dense", first, dim, dim)])
    int_in = ([1, seq], TensorProto.INT64)
    return g.model(
        {"input_ids": int_in, "token_type_ids": int_in, "attention_mask": int_in},
        {"last_hidden_state": (x, [1, seq, dim]), "pooler_output": (pooled, [1, dim])},
        opset=17,
        name="bert_tiny",
    )


def _fused_ln(g: GraphBuilder, scope: str, x: str, c: int) -> str:
    key = scope.strip("/").replace("/", ".")
    w = g.init(f"{key}.weight", 1.0 + 0.1 * g.rng.standard_normal((c,)))
    b = g.init(f"{key}.bias", 0.1 * g.rng.standard_normal((c,)))
    return g.op(scope, "LayerNormalization", [x, w, b], axis=-1, epsilon=1e-12)


def _keras_layernorm(g: GraphBuilder, scope: str, x: str, c: int, transposed: bool) -> str:
    """Keras LayerNormalization as tf2onnx writes it: `moments` by GlobalAveragePool (between
    transposes where its optimizer moved the axis), SquaredDifference as Sub and Mul,
    `batchnorm/Rsqrt` as Sqrt and Reciprocal, then x * k + (beta - mean * k)."""
    key = scope.strip("/").replace("/", ".")

    def mean(t: str, tag: str) -> str:
        name = f"{scope}/moments/{tag}"
        if not transposed:
            return g.op(name, "GlobalAveragePool", [t])
        there = g.op(name, "Transpose", [t], perm=[1, 0, 2])  # [S, B, H]: still the last axis
        return g.op(name, "Transpose", [g.op(name, "GlobalAveragePool", [there])], perm=[1, 0, 2])

    m = mean(x, "mean")
    d = g.op(f"{scope}/moments/SquaredDifference", "Sub", [x, m])
    var = mean(g.op(f"{scope}/moments/SquaredDifference", "Mul", [d, d]), "variance")
    ve = g.op(f"{scope}/batchnorm/add", "Add", [var, g.init(f"{key}.epsilon", np.array(1e-3))])
    k = g.op(
        f"{scope}/batchnorm/Rsqrt", "Reciprocal", [g.op(f"{scope}/batchnorm/Rsqrt", "Sqrt", [ve])]
    )
    gamma = g.init(f"{key}.gamma", 1.0 + 0.1 * g.rng.standard_normal((c,)))
    beta = g.init(f"{key}.beta", 0.1 * g.rng.standard_normal((c,)))
    k = g.op(f"{scope}/batchnorm/mul", "Mul", [k, gamma])
    xk = g.op(f"{scope}/batchnorm/mul_1", "Mul", [x, k])
    mk = g.op(f"{scope}/batchnorm/mul_2", "Mul", [m, k])
    c2 = g.op(f"{scope}/batchnorm/sub", "Sub", [beta, mk])
    return g.op(f"{scope}/batchnorm/add_1", "Add", [xk, c2])


def _einsum_dense(g: GraphBuilder, scope: str, x: str, cin: int, cout: int) -> str:
    """Keras' EinsumDense as tf2onnx writes it: Einsum by the kernel, then Add(bias)."""
    key = scope.strip("/").replace("/", ".")
    w = g.init(f"{key}.kernel", g.rng.normal(0.0, 1.0 / np.sqrt(cin), (cin, cout)))
    b = g.init(f"{key}.bias", g.rng.normal(0.0, 0.01, (cout,)))
    return g.op(scope, "Add", [g.op(scope, "Einsum", [x, w], equation="bsh,hd->bsd"), b])


def _keras_attention(g: GraphBuilder, scope: str, x: str, seq: int, dim: int, heads: int) -> str:
    """Keras MultiHeadAttention through tf2onnx: Einsum projections, reshapes and squeezes
    between the score MatMul and the Softmax, a reshape after it."""
    dh = dim // heads
    shape = g.ints(f"{scope.strip('/').replace('/', '.')}.heads", [1, seq, heads, dh])

    def split(name: str, perm: list[int]) -> str:
        t = _einsum_dense(g, f"{scope}/{name}", x, dim, dim)
        return g.op(
            f"{scope}/{name}",
            "Transpose",
            [g.op(f"{scope}/{name}", "Reshape", [t, shape])],
            perm=perm,
        )

    q, k, v = split("query", [0, 2, 1, 3]), split("key", [0, 2, 3, 1]), split("value", [0, 2, 1, 3])
    scores = g.op(f"{scope}/einsum", "MatMul", [q, k])
    flat = g.ints(f"{scope.strip('/').replace('/', '.')}.flat", [1, 1, heads, seq, seq])
    scores = g.op(f"{scope}/einsum", "Reshape", [scores, flat])
    scores = g.op(
        f"{scope}/Mul", "Mul", [scores, g.init(f"{scope.strip('/')}.scale", np.array(dh**-0.5))]
    )
    scores = g.op(f"{scope}/einsum", "Squeeze", [scores, g.ints(f"{scope.strip('/')}.sq", [0])])
    probs = g.op(f"{scope}/softmax", "Softmax", [scores], axis=-1)
    probs = g.op(
        f"{scope}/softmax",
        "Reshape",
        [probs, g.ints(f"{scope.strip('/')}.p", [1, heads, seq, seq])],
    )
    ctx = g.op(f"{scope}/einsum_1", "MatMul", [probs, v])
    ctx = g.op(f"{scope}/einsum_1", "Transpose", [ctx], perm=[0, 2, 1, 3])
    ctx = g.op(
        f"{scope}/einsum_1", "Reshape", [ctx, g.ints(f"{scope.strip('/')}.o", [1, seq, dim])]
    )
    return _einsum_dense(g, f"{scope}/attention_output", ctx, dim, dim)


def keras_bert(seq: int = 16, dim: int = 32, heads: int = 2, layers: int = 2) -> onnx.ModelProto:
    """A Keras BERT-style encoder and classifier as tf2onnx converts it (opset 13).

    Its LayerNorms are the batch-norm form with `GlobalAveragePool` means (the
    second of each layer between transposes), its attention has Einsum
    projections and reshapes/squeezes around the Softmax, and a classifier head
    ends in a Softmax over two classes that is no attention.
    """
    g = GraphBuilder(seed=11)
    x = g.op(
        "/embeddings",
        "Add",
        ["embeddings", g.init("position", g.rng.normal(0, 0.5, (1, seq, dim)))],
    )
    x = _keras_layernorm(g, "/embeddings/layer_norm", x, dim, transposed=False)
    for i in range(layers):
        scope = f"/encoder/layer_{i}"
        a = _keras_attention(g, f"{scope}/self_attention", x, seq, dim, heads)
        x = _keras_layernorm(
            g,
            f"{scope}/self_attention_layer_norm",
            g.op(scope, "Add", [a, x]),
            dim,
            transposed=False,
        )
        h = g.op(
            f"{scope}/intermediate",
            "Relu",
            [_einsum_dense(g, f"{scope}/intermediate", x, dim, 2 * dim)],
        )
        h = _einsum_dense(g, f"{scope}/output", h, 2 * dim, dim)
        x = _keras_layernorm(
            g, f"{scope}/output_layer_norm", g.op(scope, "Add", [h, x]), dim, transposed=True
        )
    first = g.op("/pooler", "Gather", [x, g.ints("pooler.index", 0)], axis=1)
    logits = g.linear("/classifier", first, dim, 2)
    probs = g.op("/classifier", "Softmax", [logits], axis=-1)
    return g.model(
        {"embeddings": [1, seq, dim]},
        {"probabilities": (probs, [1, 2]), "sequence_output": (x, [1, seq, dim])},
        opset=13,
        name="keras_bert",
    )


def legacy_detector() -> onnx.ModelProto:
    """A detector exported as before IR version 4: every weight also listed as a graph input,
    and the input declared at the tracer's placeholder shape [10, 3, 32, 32].

    Its runtime makes the dims dynamic when it loads it; a policy does the same with
    `passes.override_input_shapes`. Halving twice and upsampling back, it runs only
    where height and width are multiples of 4.
    """
    rng = np.random.default_rng(7)
    weights = {
        "conv1.w": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "conv1.b": rng.normal(0, 0.1, (8,)).astype(np.float32),
        "conv2.w": rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32),
        "conv2.b": rng.normal(0, 0.1, (4,)).astype(np.float32),
        "up.scales": np.array([1, 1, 4, 4], np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["input", "conv1.w", "conv1.b"], ["c1"], "conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], "pool1", kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], "conv2"),
        helper.make_node("Upsample", ["c2", "up.scales"], ["u"], "up", mode="nearest"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c3"], "skip"),
        helper.make_node("Add", ["u", "c3"], ["a"], "merge"),
        helper.make_node("Sigmoid", ["a"], ["scores"], "scores"),
    ]
    inits = [
        helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel()) for k, v in weights.items()
    ]
    listed = [
        helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in weights.items()
    ]
    graph = helper.make_graph(
        nodes,
        "legacy_detector",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [10, 3, 32, 32]), *listed],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [10, 4, 32, 32])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    return model


def loop_sum(steps: int = 64, width: int = 32) -> onnx.ModelProto:
    """A Loop whose running sum leaves FP16 after about 40 of its 64 iterations.

    Each iteration adds a projection of the input (about 1600 a feature) to a
    carried sum, which reaches about 100k, past FP16's 65504, and is the
    output (FP32). In FP16 the body's `Add` turns inf, and the output with it;
    pinned to FP32, the projection and the input's scaling stay FP16.
    """
    rng = np.random.default_rng(11)
    w = rng.uniform(0.5, 1.5, (width, width)).astype(np.float32) / width
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "proj.w"], ["step"], "project"),
            helper.make_node("Add", ["sum_in", "step"], ["sum_out"], "accumulate"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], "keep_going"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("sum_in", TensorProto.FLOAT, [1, width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("sum_out", TensorProto.FLOAT, [1, width]),
        ],
    )
    nodes = [
        helper.make_node("Mul", ["input", "in.scale"], ["x"], "scale_in"),
        helper.make_node("Loop", ["steps", "go", "zeros"], ["output"], "running_sum", body=body),
    ]
    inits = [
        numpy_helper.from_array(np.array(steps, np.int64), "steps"),
        numpy_helper.from_array(np.array(True), "go"),
        numpy_helper.from_array(np.zeros((1, width), np.float32), "zeros"),
        numpy_helper.from_array(w, "proj.w"),
        numpy_helper.from_array(np.array(3200.0, np.float32), "in.scale"),
    ]
    graph = helper.make_graph(
        nodes,
        "loop_sum",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _instance_norm(g: GraphBuilder, scope: str, x: str, c: int) -> str:
    """nn.InstanceNorm2d(affine=True) as torch.onnx exports it: one InstanceNormalization."""
    key = scope.strip("/").replace("/", ".")
    scale = g.init(f"{key}.weight", 1.0 + 0.1 * g.rng.standard_normal((c,)))
    bias = g.init(f"{key}.bias", 0.1 * g.rng.standard_normal((c,)))
    return g.op(scope, "InstanceNormalization", [x, scale, bias], epsilon=1e-5)


def _spatial_mean(g: GraphBuilder, scope: str, x: str, total: str) -> str:
    """`total` over H, then over W, both read from the shape of `x` (as `s / h / w` exports)."""
    shape = g.op(f"{scope}/count", "Shape", [x])
    for axis in (2, 3):
        index = g.ints(f"{scope.strip('/')}.axis{axis}", [axis])
        side = g.op(f"{scope}/count", "Gather", [shape, index], axis=0)
        total = g.op(
            scope, "Div", [total, g.op(f"{scope}/count", "Cast", [side], to=TensorProto.FLOAT)]
        )
    return total


def matting_dynamic(width: int = 8) -> onnx.ModelProto:
    """MODNet-style portrait matting with a dynamic H x W: instance norms and a global context.

    The context branch sums the half-resolution features over the whole map and
    divides by its height and width (`x.sum((2, 3)) / h / w`, as exported), so the sum
    grows with the image: on a photo about 6e3 at 256x256, 2.6e4 at 512x512 (both
    fit FP16) and 1.0e5 at 1024x1024, inf in FP16, and the matte turns NaN. A
    policy judged at 512x512 alone passes; the engine built for a profile up to
    1024x1024 does not.
    """
    g = GraphBuilder(seed=3)
    x = g.conv("/enc.0", "input", 3, width, k=3)
    x = g.op("/enc.0", "Relu", [_instance_norm(g, "/enc.0/norm", x, width)])
    x = g.op("/down", "AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = g.conv("/enc.1", x, width, width, k=3)
    x = g.op("/enc.1", "Relu", [_instance_norm(g, "/enc.1/norm", x, width)])
    total = g.op("/context", "ReduceSum", [x, g.ints("context.axes", [2, 3])], keepdims=1)
    mean = _spatial_mean(g, "/context", x, total)
    gate = g.op("/context", "Sigmoid", [g.conv("/context/fc", mean, width, width)])
    x = g.op("/context", "Mul", [x, gate])
    x = g.conv("/dec", x, width, 1, k=3)
    up = g.op("/dec", "Resize", [x, "", g.init("dec.scales", [1, 1, 2, 2])], mode="linear")
    matte = g.op("/dec", "Sigmoid", [up])
    return g.model(
        {"input": [1, 3, "height", "width"]},
        {"matte": (matte, [1, 1, "height", "width"])},
        opset=13,
        name="matting_dynamic",
    )


def denoiser_dynamic(bins: int = 161, hidden: int = 32, std: float = 1.6) -> onnx.ModelProto:
    """A speech enhancer's mask estimator over a spectrogram [1, frames, bins], frames dynamic.

    Each hidden channel is normalised by its energy over the whole utterance (a
    ReduceSum over time, as streaming-free enhancers do): on the generated
    utterance's 299 frames the largest energy fits FP16; repeated to 1000 frames
    it is past 65504, inf in FP16, and the mask falls back to its bias.
    """
    g = GraphBuilder(seed=4)
    h = g.op("/enc", "Relu", [g.linear("/enc", "spec", bins, hidden, std=std)])
    energy = g.op(
        "/norm", "ReduceSum", [g.op("/norm", "Mul", [h, h]), g.ints("norm.axes", [1])], keepdims=1
    )
    shape = g.op("/norm/count", "Shape", ["spec"])
    frames = g.op("/norm/count", "Gather", [shape, g.ints("norm.time", [1])], axis=0)
    count = g.op("/norm/count", "Cast", [frames], to=TensorProto.FLOAT)
    rms = g.op(
        "/norm",
        "Sqrt",
        [g.op("/norm", "Add", [g.op("/norm", "Div", [energy, count]), g.const("/norm", 1e-5)])],
    )
    mask = g.op(
        "/mask", "Sigmoid", [g.linear("/mask", g.op("/norm", "Div", [h, rms]), hidden, bins)]
    )
    enhanced = g.op("/out", "Mul", ["spec", mask])
    return g.model(
        {"spec": [1, "frames", bins]},
        {"enhanced": (enhanced, [1, "frames", bins])},
        opset=13,
        name="denoiser_dynamic",
    )


MODELS = {
    "nafnet_tiny": nafnet_tiny,
    "gfpgan_tiny": gfpgan_tiny,
    "gfpgan_dynamic": gfpgan_dynamic,
    "legacy_detector": legacy_detector,
    "keras_bert": keras_bert,
    "transformer_tiny": transformer_tiny,
    "bert_tiny": bert_tiny,
    "loop_sum": loop_sum,
    "matting_dynamic": matting_dynamic,
    "denoiser_dynamic": denoiser_dynamic,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models", help="output directory (default: models)")
    parser.add_argument(
        "names", nargs="*", help=f"models to write (default: all of {list(MODELS)})"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names or MODELS:
        if name not in MODELS:
            print(
                f"make_models: unknown model {name!r}; choose from {list(MODELS)}", file=sys.stderr
            )
            return 2
        path = out / f"{name}.onnx"
        tmp = path.with_suffix(".onnx.tmp")
        onnx.save(MODELS[name](), tmp)
        tmp.replace(path)
        print(f"wrote {path}")
    return 0


def gru_enhancer(bins: int = 257, hidden: int = 256, spread: float = 0.5) -> onnx.ModelProto:
    """A streaming speech enhancer (one frame a call), with its caches as inputs and outputs.

    Causal convolutions over [previous frame, this frame] (each layer's input
    is its cache for the next call), two GRUs with their hidden states, a
    sigmoid mask on the magnitude frame. The features are the frame's power in
    dB normalised by the training set's statistics: the power (~1e6) is inf in
    FP16, and the normalisation subtracts ~60 dB from values that spread by
    `spread` dB, so FP16's rounding of the dB values (1/64 dB at 60) is
    amplified a hundredfold: all-FP16 meets 25 dB of SNR, not 40.
    """
    g = GraphBuilder(seed=7)
    power = g.op("/feat", "Mul", ["frame", "frame"])
    power = g.op("/feat", "Add", [power, g.const("/feat", 1e-10)])
    db = g.op("/feat", "Mul", [g.op("/feat", "Log", [power]), g.const("/feat", 10 / np.log(10))])
    mean = g.init("feat.mean", 60.0 + 0.3 * g.rng.standard_normal((bins,)))
    std = g.init("feat.std", spread * (1 + 0.1 * g.rng.standard_normal((bins,))))
    x = g.op("/feat", "Div", [g.op("/feat", "Sub", [db, mean]), std])
    x = g.op("/feat", "Reshape", [x, g.ints("feat.shape", [1, 1, 1, bins])])
    inputs, outputs = {"frame": [1, 1, bins]}, {}
    chans, freq = [1, 16, 32, 32, 64], bins
    for k in range(4):  # causal in time (kernel 2 over [cache, frame]), stride 2 in frequency
        s = f"/enc{k}"
        inputs[f"cache{k}_in"] = [1, chans[k], 1, freq]
        outputs[f"cache{k}_out"] = (g.op(s, "Identity", [x]), [1, chans[k], 1, freq])
        both = g.op(s, "Concat", [f"cache{k}_in", x], axis=2)
        w = g.rng.normal(0.0, 1 / np.sqrt(chans[k] * 6), (chans[k + 1], chans[k], 2, 3))
        b = g.rng.normal(0.0, 0.01, (chans[k + 1],))
        conv = [both, g.init(f"enc{k}.weight", w), g.init(f"enc{k}.bias", b)]
        y = g.op(s, "Conv", conv, kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 0, 1])
        x, freq = g.op(s, "Elu", [y]), (freq - 1) // 2 + 1
    x = g.op("/gru", "Reshape", [x, g.ints("gru.shape", [1, 1, chans[-1] * freq])])
    x = skip = g.op("/gru", "Relu", [g.linear("/gru/fc", x, chans[-1] * freq, hidden)])
    for k in range(2):
        std = 1 / np.sqrt(hidden)
        w = g.init(f"gru{k}.W", g.rng.normal(0.0, std, (1, 3 * hidden, hidden)))
        r = g.init(f"gru{k}.R", g.rng.normal(0.0, std, (1, 3 * hidden, hidden)))
        b = g.init(f"gru{k}.B", g.rng.normal(0.0, 0.1, (1, 6 * hidden)))
        y, h = g.op(
            f"/gru{k}", "GRU", [x, w, r, b, "", f"h{k}_in"], n_out=2, hidden_size=hidden,
            linear_before_reset=1,
        )  # fmt: skip
        x = g.op(f"/gru{k}", "Squeeze", [y, g.ints(f"gru{k}.axes", [1])])
        inputs[f"h{k}_in"] = [1, 1, hidden]
        outputs[f"h{k}_out"] = (h, [1, 1, hidden])
    x = g.op("/dec", "Concat", [x, skip], axis=-1)
    x = g.op("/dec", "Relu", [g.linear("/dec/fc0", x, 2 * hidden, hidden)])
    mask = g.op("/mask", "Sigmoid", [g.linear("/mask", x, hidden, bins)])
    enhanced = (g.op("/out", "Mul", ["frame", mask]), [1, 1, bins])
    return g.model(inputs, {"enhanced": enhanced, **outputs}, opset=17, name="gru_enhancer")


MODELS["gru_enhancer"] = gru_enhancer


if __name__ == "__main__":
    sys.exit(main())
