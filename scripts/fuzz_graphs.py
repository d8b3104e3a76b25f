"""Random valid graphs, each under a random policy, run through trtbuild: any exit other than
0, 1 or 2 (an internal error, 70) is a bug, printed once per kind with the last lines of its
traceback, the graph and policy that caused it kept in `--cases` (default `fuzz-cases/`).

Why: `fuzz_files.py` damages real files; this builds graphs that are valid but put ops
next to each other as no test does (a Cast round trip into a LayerNormalization, a Where
over a Resize, a BF16 default with an FP32 pattern rule), under policies a user could
write. Each exit 2 is printed once per kind of message too: it must say the input's own
fault (an FP32 default given to `tune`, a reference already inf), which only reading them
tells.

Each graph: 3 to 18 nodes over a [1, 4, 8, 8] float input `x`, each node drawn from the
kinds of `KINDS` (unary and binary ops, Conv, reductions, Softmax, Instance-, Batch- and
LayerNormalization, Pow, Sqrt, Div, Clip, Where, Concat and Split, Transpose, MatMul,
Resize and pooling, Pad and Slice, Gather, Cast round trips, Expand), reading any earlier
tensor; one or two outputs. Its policy: zero to three rules by name, op or pattern, in
FP32, FP16 or BF16, a random default and passes. `--quantized` quantizes each graph with
ONNX Runtime's `quantize_static` (QDQ, symmetric INT8, per tensor or per channel; half
judged against the float graph as `accuracy.reference_model`); `--dynamic` makes the
height dynamic, with a min/opt/max profile.

Usage: python scripts/fuzz_graphs.py [--runs N] [--seed S] [--command check|convert|build|tune]
       [--quantized] [--dynamic] [--cases DIR]
Needs: the project installed (`make install`).
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import shutil
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from fuzz_files import _run
from onnx import TensorProto, helper, numpy_helper

SHAPE = [1, 4, 8, 8]
DYNAMIC_SHAPE = [1, 4, "h", 8]
PROFILE = "inputs:\n  x: {min: [1, 4, 4, 8], opt: [1, 4, 8, 8], max: [1, 4, 16, 8]}\n"
UNARY = ("Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Erf", "Softplus", "Sin", "Floor")
BINARY = ("Add", "Mul", "Sub", "Max", "Min")
PATTERNS = (
    "layernorm",
    "layernorm_after_attention",
    "attention",
    "softmax",
    "final_reductions",
    "shape_arithmetic",
    "periodic_arguments",
)
PASSES = (
    "",
    "passes: {fold_batchnorm: true}\n",
    "passes: {fuse_layernorm: true}\n",
    "passes: {opset: 21}\n",
)


class Graph:
    """A graph being drawn: its nodes, weights and the tensors a next node may read."""

    def __init__(self, rng: random.Random, dynamic: bool):
        self.rng, self.dynamic = rng, dynamic
        self.values = np.random.default_rng(rng.randrange(2**32))
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.pool = ["x"]
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def weight(self, array: np.ndarray) -> str:
        name = self.fresh("w")
        self.weights.append(numpy_helper.from_array(array, name))
        return name

    def normal(self, shape: list[int], offset: float = 0.0) -> str:
        draw = self.values.standard_normal(shape).astype(np.float32) * 0.5
        return self.weight(draw + np.float32(offset))

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> str:
        names = [self.fresh("t") for _ in range(outputs)]
        node = helper.make_node(op_type, inputs, names, name=self.fresh(f"{op_type}_"), **attrs)
        self.nodes.append(node)
        return self.rng.choice(names)

    def model(self) -> onnx.ModelProto:
        picked = self.rng.sample(self.pool[1:], k=min(len(self.pool) - 1, self.rng.randint(1, 2)))
        dims = DYNAMIC_SHAPE if self.dynamic else SHAPE
        graph = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, dims) for o in picked],
            self.weights,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _positive(g: Graph, a: str, floor: float) -> str:
    return g.op("Add", [g.op("Abs", [a]), g.weight(np.array([floor], np.float32))])


def _split(g: Graph, a: str, b: str) -> str:
    joined = g.op("Concat", [a, b], axis=1)
    return g.op("Split", [joined, g.weight(np.array([4, 4], np.int64))], outputs=2, axis=1)


def _resized(g: Graph, a: str) -> str:
    up = g.op("Resize", [a, "", g.weight(np.array([1, 1, 2, 2], np.float32))], mode="linear")
    pool = g.rng.choice(["MaxPool", "AveragePool"])
    return g.op(pool, [up], kernel_shape=[2, 2], strides=[2, 2])


def _padded(g: Graph, a: str) -> str:
    pads = g.weight(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    padded = g.op("Pad", [a, pads], mode=g.rng.choice(["constant", "reflect", "edge"]))
    ends = [g.weight(np.array(v, np.int64)) for v in ([1, 1], [-1, -1], [2, 3])]
    return g.op("Slice", [padded, *ends])


def _transposed(g: Graph, a: str) -> str:
    once = g.op("Transpose", [a], perm=[0, 1, 3, 2])
    # a dynamic height may not become the width: transposed back, the shape is the input's
    return g.op("Transpose", [once], perm=[0, 1, 3, 2]) if g.dynamic else once


def _reduced(g: Graph, a: str) -> str:
    op = g.rng.choice(["ReduceMean", "ReduceMax", "ReduceSum", "ReduceL2"])
    return g.op("Add", [a, g.op(op, [a], axes=[2, 3], keepdims=1)])


def _cast_back(g: Graph, a: str) -> str:
    through = g.rng.choice([TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT32])
    return g.op("Cast", [g.op("Cast", [a], to=through)], to=TensorProto.FLOAT)


# Each kind: the graph, two earlier tensors (`a` and `b`), and the tensor it makes, of
# the input's shape (so any later node reads it).
KINDS: dict[str, Callable[[Graph, str, str], str]] = {
    "unary": lambda g, a, b: g.op(g.rng.choice(UNARY), [a]),
    "binary": lambda g, a, b: g.op(g.rng.choice(BINARY), [a, b]),
    "div": lambda g, a, b: g.op("Div", [a, _positive(g, b, 1.0)]),
    "conv": lambda g, a, b: g.op("Conv", [a, g.normal([4, 4, 3, 3]), g.normal([4])], pads=[1] * 4),
    "reduce": lambda g, a, b: _reduced(g, a),
    "softmax": lambda g, a, b: g.op("Softmax", [a], axis=g.rng.choice([1, -1])),
    "instancenorm": lambda g, a, b: g.op(
        "InstanceNormalization", [a, g.normal([4], 1.0), g.normal([4])]
    ),
    "batchnorm": lambda g, a, b: g.op(
        "BatchNormalization",
        [
            a,
            g.normal([4], 1.0),
            g.normal([4]),
            g.normal([4]),
            g.weight(np.full(4, 0.8, np.float32)),
        ],
    ),
    "layernorm": lambda g, a, b: g.op(
        "LayerNormalization", [a, g.normal([8], 1.0), g.normal([8])], axis=-1, epsilon=1e-5
    ),
    "pow": lambda g, a, b: g.op("Pow", [a, g.weight(np.array([2.0], np.float32))]),
    "sqrt": lambda g, a, b: g.op("Sqrt", [_positive(g, a, 1e-3)]),
    "clip": lambda g, a, b: g.op(
        "Clip", [a, g.weight(np.array(-1.0, np.float32)), g.weight(np.array(1.0, np.float32))]
    ),
    "where": lambda g, a, b: g.op("Where", [g.op("Greater", [a, b]), a, b]),
    "concat-split": _split,
    "transpose": lambda g, a, b: _transposed(g, a),
    "matmul": lambda g, a, b: g.op("MatMul", [a, g.normal([8, 8])]),
    "resize-pool": lambda g, a, b: _resized(g, a),
    "pad-slice": lambda g, a, b: _padded(g, a),
    "gather": lambda g, a, b: g.op(
        "Gather", [a, g.weight(np.array([3, 2, 1, 0], np.int64))], axis=1
    ),
    "cast": lambda g, a, b: _cast_back(g, a),
    "expand": lambda g, a, b: g.op(
        "Expand", [g.op("ReduceMean", [a], axes=[1], keepdims=1), g.op("Shape", [a])]
    ),
    "bias": lambda g, a, b: g.op("Add", [a, g.normal([1, 4, 1, 8] if g.dynamic else SHAPE)]),
}


def random_graph(rng: random.Random, dynamic: bool) -> onnx.ModelProto:
    g = Graph(rng, dynamic)
    for _ in range(rng.randint(3, 18)):
        kind = rng.choice(sorted(KINDS))
        g.pool.append(KINDS[kind](g, rng.choice(g.pool), rng.choice(g.pool)))
    return g.model()


def random_policy(
    model: onnx.ModelProto, rng: random.Random, reference: bool, dynamic: bool
) -> str:
    """A policy of zero to three rules over `model`'s names, ops and the patterns."""
    names = [n.name for n in model.graph.node]
    ops = sorted({n.op_type for n in model.graph.node})
    rules = []
    for i in range(rng.randint(0, 3)):
        draw = rng.random()
        if draw < 0.4:
            match = f"{{name: '^{re.escape(rng.choice(names))}$'}}"
        elif draw < 0.7:
            match = f"{{op: {rng.choice(ops)}}}"
        else:
            match = f"{{pattern: {rng.choice(PATTERNS)}}}"
        precision = rng.choice(["fp32", "fp16", "bf16"])
        rules.append(f"    - {{id: r{i}, match: {match}, precision: {precision}}}\n")
    return (
        "version: 1\nmodel: m.onnx\n"
        + (PROFILE if dynamic else "")
        + rng.choice(PASSES)
        + f"precision:\n  default: {rng.choice(['fp16', 'fp16', 'bf16', 'fp32'])}\n"
        + ("  rules:\n" + "".join(rules) if rules else "  rules: []\n")
        + "build: {backend: none}\naccuracy:\n  samples: 1\n"
        + ("  reference_model: f.onnx\n" if reference else "")
        + "  tolerances: {default: {atol: 1.0, rtol: 1.0}}\n"
    )


def quantized(model: onnx.ModelProto, rng: random.Random, folder: Path) -> onnx.ModelProto:
    """`model` by ONNX Runtime's `quantize_static`: QDQ, symmetric INT8, calibrated on four
    random inputs; the float model kept as `f.onnx` for `reference_model`."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            draw = np.random.default_rng(rng.randrange(2**32))
            self.feeds = iter(
                [{"x": draw.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)]
            )

        def get_next(self):
            return next(self.feeds, None)

    onnx.save(model, folder / "f.onnx")
    quantize_static(
        folder / "f.onnx",
        folder / "q.onnx",
        Reader(),
        quant_format=QuantFormat.QDQ,
        weight_type=QuantType.QInt8,
        activation_type=QuantType.QInt8,
        per_channel=rng.random() < 0.5,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
    )
    return onnx.load(folder / "q.onnx")


def _command(command: str, folder: Path) -> list[str]:
    return {
        "check": [],
        "convert": ["-o", str(folder / "c.onnx")],
        "build": ["--out", str(folder / "out")],
        "tune": ["-o", str(folder / "t.yaml"), "--budget", "6"],
    }[command]


def _said(code: object, err: str) -> str:
    """The line that says a failure: the error's (exit 2), or the traceback's last ones."""
    lines = [line for line in err.splitlines() if line.strip()]
    if code not in (0, 1, 2):
        return lines[-3] if len(lines) >= 3 else err[:80]
    return next((line for line in lines if "error:" in line), lines[-1] if lines else "")


def _kind(code: object, said: str) -> str:
    """What makes two failures one kind: the exit and the error's words, numbers aside."""
    return f"{code} " + re.sub(r"[0-9]+", "N", said)[:90]


def fuzz(args: argparse.Namespace, folder: Path, cases: Path) -> int:
    """Each run: a random graph (quantized, dynamic) and policy, one command; every kind of
    exit 2 and internal error printed once, the internal errors' inputs kept."""
    rng, seen, internal, exits = random.Random(args.seed), set(), 0, Counter()
    policy = str(folder / "p.yaml")  # it names its models relative to itself
    for i in range(args.runs):
        model = random_graph(rng, args.dynamic)
        try:
            onnx.checker.check_model(model, full_check=True)
            model = quantized(model, rng, folder) if args.quantized else model
        except Exception:  # a graph the checker or the quantizer refuses: not trtbuild's
            continue
        onnx.save(model, folder / "m.onnx")
        text = random_policy(model, rng, args.quantized and rng.random() < 0.5, args.dynamic)
        (folder / "p.yaml").write_text(text)
        command = [args.command, "--policy", policy, "--no-cache", *_command(args.command, folder)]
        code, err = _run(command)
        exits[code] += 1
        said = _said(code, err)
        kind = _kind(code, said)
        if code in (0, 1) or kind in seen:
            continue
        seen.add(kind)
        if code == 2:
            print(f"run {i}: exit 2: {said}", flush=True)
            continue
        internal += 1
        cases.mkdir(parents=True, exist_ok=True)
        for name in ("m.onnx", "f.onnx") if args.quantized else ("m.onnx",):
            shutil.copy(folder / name, cases / f"case_{i}.{name}")
            text = text.replace(f" {name}", f" case_{i}.{name}")
        (cases / f"case_{i}.yaml").write_text(text)
        print(
            f"run {i}: exit {code}; kept {cases / f'case_{i}.yaml'}\n    {err[-600:]}", flush=True
        )
    print("exits: " + ", ".join(f"{code}: {n}" for code, n in sorted(exits.items(), key=str)))
    return internal


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--command", choices=["check", "convert", "build", "tune"], default="build")
    parser.add_argument("--quantized", action="store_true")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--cases", type=Path, default=Path("fuzz-cases"))
    args = parser.parse_args(argv)
    cases = args.cases.resolve()  # kept where they were asked for, not in the scratch folder
    warnings.simplefilter("ignore")  # the quantizer's notes on each random graph
    logging.getLogger().addHandler(logging.NullHandler())  # and its root-logger warnings
    with tempfile.TemporaryDirectory(prefix="trtbuild-fuzz-") as tmp:
        found = fuzz(args, Path(tmp), cases)
    print(f"{args.runs} runs, {found} kind(s) of internal error")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main_())
