"""A MODNet-style portrait matting network, generated for `bench_tune.py --models modnet`.

Why generated and why this shape: the repository ships no real matting network
(its weights would be a download), and `tune` over a profile of image sizes is
where users wait: every candidate is judged at 256², 512² and 1024² on a real
photo. The graph follows MODNet's three branches as exported by torch.onnx
(`/scope/Op` names): a strided encoder with instance norms and ReLUs, a
low-resolution semantic branch with a squeeze-excitation gate, a
high-resolution detail branch, and a fusion branch that ends in a sharp
sigmoid (a matte is mostly 0 or 1, so its logits are large and FP16's rounding
of them moves the edges). The context branch sums half-resolution features over
the whole map and divides by its size, as the example model does: the sum is
inf in FP16 at 1024², not at 512². Weights are seeded: the same bytes every run.

Usage: python benchmarks/modnet.py OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from make_models import GraphBuilder  # noqa: E402


def _conv(
    g: GraphBuilder,
    scope: str,
    x: str,
    cin: int,
    cout: int,
    k: int,
    stride: int = 1,
    gain: float = 1.0,
) -> str:
    """nn.Conv2d with padding k // 2, He-initialised (times `gain`)."""
    w = g.rng.normal(0.0, gain * np.sqrt(2.0 / (cin * k * k)), size=(cout, cin, k, k))
    key = scope.strip("/").replace("/", ".")
    wn = g.init(f"{key}.weight", w)
    bn = g.init(f"{key}.bias", g.rng.normal(0.0, 0.05, size=(cout,)))
    return g.op(
        scope, "Conv", [x, wn, bn], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride]
    )


def _ibnorm(g: GraphBuilder, scope: str, x: str, c: int) -> str:
    """MODNet's IBNorm, here an affine instance norm over every channel."""
    key = scope.strip("/").replace("/", ".")
    scale = g.init(f"{key}.weight", 1.0 + 0.1 * g.rng.standard_normal((c,)))
    bias = g.init(f"{key}.bias", 0.1 * g.rng.standard_normal((c,)))
    return g.op(scope, "InstanceNormalization", [x, scale, bias], epsilon=1e-5)


def _block(
    g: GraphBuilder, scope: str, x: str, cin: int, cout: int, k: int = 3, stride: int = 1
) -> str:
    """Conv2dIBNormRelu: convolution, norm, ReLU."""
    return g.op(
        scope, "Relu", [_ibnorm(g, f"{scope}/norm", _conv(g, scope, x, cin, cout, k, stride), cout)]
    )


def _resize(g: GraphBuilder, scope: str, x: str, factor: float) -> str:
    scales = g.init(f"{scope.strip('/').replace('/', '.')}.scales", [1, 1, factor, factor])
    return g.op(scope, "Resize", [x, "", scales], mode="linear")


def _context(g: GraphBuilder, scope: str, x: str, c: int) -> str:
    """A global context gate from the mean over the map: `x.sum((2, 3)) / h / w`."""
    total = g.op(scope, "ReduceSum", [x, g.ints(f"{scope.strip('/')}.axes", [2, 3])], keepdims=1)
    shape = g.op(f"{scope}/count", "Shape", [x])
    for axis in (2, 3):
        index = g.ints(f"{scope.strip('/')}.axis{axis}", [axis])
        side = g.op(f"{scope}/count", "Gather", [shape, index], axis=0)
        side = g.op(f"{scope}/count", "Cast", [side], to=TensorProto.FLOAT)
        total = g.op(scope, "Div", [total, side])
    gate = g.op(scope, "Sigmoid", [_conv(g, f"{scope}/fc", total, c, c, 1)])
    return g.op(scope, "Mul", [x, gate])


def _squeeze_excite(g: GraphBuilder, scope: str, x: str, c: int) -> str:
    pooled = g.op(scope, "GlobalAveragePool", [x])
    hidden = g.op(scope, "Relu", [_conv(g, f"{scope}/fc1", pooled, c, c // 4, 1)])
    return g.op(
        scope, "Mul", [x, g.op(scope, "Sigmoid", [_conv(g, f"{scope}/fc2", hidden, c // 4, c, 1)])]
    )


def modnet(width: int = 16, sharpness: float = 6.0) -> onnx.ModelProto:
    """The graph; `sharpness` scales the matte's logits (a sharper matte, larger logits)."""
    g = GraphBuilder(seed=46)
    w = width
    e0 = _block(g, "/backbone/enc0", "input", 3, w, stride=2)  # 1/2
    e0 = _context(g, "/backbone/context", e0, w)
    e1 = _block(g, "/backbone/enc1", e0, w, w * 2, stride=2)  # 1/4
    e2 = _block(g, "/backbone/enc2", e1, w * 2, w * 3, stride=2)  # 1/8
    e3 = _block(g, "/backbone/enc3", e2, w * 3, w * 4, stride=2)  # 1/16
    e4 = _block(g, "/backbone/enc4", e3, w * 4, w * 4, stride=2)  # 1/32
    # semantic branch: SE gate, up to 1/16 and 1/8
    s = _squeeze_excite(g, "/lr_branch/se", e4, w * 4)
    s = _block(g, "/lr_branch/conv_lr16x", _resize(g, "/lr_branch/up16", s, 2.0), w * 4, w * 3, k=5)
    s8 = _block(g, "/lr_branch/conv_lr8x", _resize(g, "/lr_branch/up8", s, 2.0), w * 3, w * 2, k=5)
    # detail branch at 1/2 and 1/4 of the image
    img2 = _resize(g, "/hr_branch/down2", "input", 0.5)
    h2 = _block(
        g, "/hr_branch/tohr_enc2x", g.op("/hr_branch", "Concat", [img2, e0], axis=1), w + 3, w
    )
    h4 = _block(g, "/hr_branch/conv_enc2x", h2, w, w, stride=2)
    up4 = _resize(g, "/hr_branch/up_lr4x", s8, 2.0)
    h4 = _block(
        g,
        "/hr_branch/conv_hr4x.0",
        g.op("/hr_branch", "Concat", [h4, e1, up4], axis=1),
        w + w * 2 + w * 2,
        w * 2,
    )
    h4 = _block(g, "/hr_branch/conv_hr4x.1", h4, w * 2, w * 2)
    h4 = _block(g, "/hr_branch/conv_hr4x.2", h4, w * 2, w)
    h2 = _block(
        g,
        "/hr_branch/conv_hr2x.0",
        g.op("/hr_branch", "Concat", [_resize(g, "/hr_branch/up_hr2x", h4, 2.0), h2], axis=1),
        w * 2,
        w,
    )
    h2 = _block(g, "/hr_branch/conv_hr2x.1", h2, w, w)
    # fusion: the semantic features up to 1/2, with the detail ones, then to full size
    f = _block(g, "/f_branch/conv_lr4x", _resize(g, "/f_branch/up4", s8, 4.0), w * 2, w, k=5)
    f = _block(g, "/f_branch/conv_f2x", g.op("/f_branch", "Concat", [f, h2], axis=1), w * 2, w)
    f = _resize(g, "/f_branch/up_full", f, 2.0)
    f = _block(
        g, "/f_branch/conv_f.0", g.op("/f_branch", "Concat", [f, "input"], axis=1), w + 3, w // 2
    )
    logits = _conv(g, "/f_branch/conv_f.1", f, w // 2, 1, 1, gain=sharpness)
    matte = g.op("/f_branch", "Sigmoid", [logits])
    return g.model(
        {"input": [1, 3, "height", "width"]},
        {"matte": (matte, [1, 1, "height", "width"])},
        opset=13,
        name="modnet_bench",
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.splitlines()[-1], file=sys.stderr)
        return 2
    onnx.save(modnet(), args[0])
    print(f"wrote {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
