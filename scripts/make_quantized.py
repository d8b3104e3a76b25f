#!/usr/bin/env python3
"""Quantize example models to INT8 Q/DQ graphs with ONNX Runtime, deterministically.

Why: TensorRT takes INT8 only as explicit QuantizeLinear/DequantizeLinear pairs,
and users bring models quantized by ONNX Runtime's `quantize_static` or NVIDIA
ModelOpt. These are made the way such a user would make them, with the settings
TensorRT accepts (symmetric activations and weights, per-channel weights, QDQ
format), from the float models `scripts/make_models.py` writes, and are written
next to them (`nafnet_tiny.onnx` -> `nafnet_tiny_int8.onnx`). The calibration
data is drawn from a fixed seed with the distributions the example policies use.

Usage: python scripts/make_quantized.py [--out models] [names...]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import onnx

# float model -> (input name -> (shape, distribution)), the example policies' data
QUANTIZED = {
    "nafnet_tiny": {"input": ([1, 3, 64, 64], "uniform")},
    "transformer_tiny": {"tokens": ([1, 16, 32], "normal")},
    "bert_tiny": {
        "input_ids": ([1, 16], ("ids", 100)),  # int64 token ids in [0, 100)
        "token_type_ids": ([1, 16], ("ids", 2)),
        "attention_mask": ([1, 16], ("ids", 2)),
    },
}
CALIBRATION_SAMPLES = 8


class SeededReader:
    """A calibration reader that yields the same samples on every run (seed 0)."""

    def __init__(self, inputs: dict, samples: int = CALIBRATION_SAMPLES, seed: int = 0):
        rng = np.random.default_rng(seed)
        self._feeds = [
            {name: _draw(rng, shape, dist) for name, (shape, dist) in inputs.items()}
            for _ in range(samples)
        ]
        self._iter = iter(self._feeds)

    def get_next(self) -> dict | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = iter(self._feeds)


def _draw(rng: np.random.Generator, shape: list[int], dist) -> np.ndarray:
    if dist == "uniform":
        return rng.uniform(0.0, 1.0, size=shape).astype(np.float32)
    if dist == "normal":
        return rng.normal(0.0, 1.0, size=shape).astype(np.float32)
    return rng.integers(0, dist[1], size=shape, dtype=np.int64)  # ("ids", count)


def quantize(src: Path, dst: Path, inputs: dict, symmetric: bool = True) -> None:
    """Write `src` quantized to INT8 Q/DQ at `dst` (atomically: a temporary name, then rename).

    `symmetric=False` is ONNX Runtime's default (asymmetric UINT8 activations,
    non-zero zero points, INT32 biases), which TensorRT refuses: the tests use it for
    the refusal. Otherwise biases stay float (`QuantizeBias: False`): TensorRT takes no
    INT32 DQ.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    # an INT32 bias DQ is refused by TensorRT (INT8/FP8/INT4 only)
    extra = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}
    extra = extra if symmetric else {}
    tmp = dst.with_suffix(".onnx.tmp")
    quantize_static(
        str(src),
        str(tmp),
        SeededReader(inputs),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
        extra_options=extra,
    )
    onnx.checker.check_model(onnx.load(str(tmp)))
    tmp.replace(dst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models", help="the models folder (default: models)")
    parser.add_argument(
        "names", nargs="*", help=f"float models to quantize (default: {list(QUANTIZED)})"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    # ONNX Runtime's quantizer advises pre-processing on the root logger for every model;
    # these models are quantized as they are on purpose, and `make models` says only what it wrote
    logging.getLogger().setLevel(logging.ERROR)
    for name in args.names or QUANTIZED:
        if name not in QUANTIZED:
            print(
                f"make_quantized: unknown model {name!r}; choose from {list(QUANTIZED)}",
                file=sys.stderr,
            )
            return 2
        src = out / f"{name}.onnx"
        if not src.is_file():
            print(
                f"make_quantized: {src} is missing; run scripts/make_models.py --out {out} first",
                file=sys.stderr,
            )
            return 2
        dst = out / f"{name}_int8.onnx"
        quantize(src, dst, QUANTIZED[name])
        print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
