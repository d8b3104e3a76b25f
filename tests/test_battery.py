"""The hardening battery: bad input never crashes and nothing is half-written.

Every case runs the real CLI (`main(argv)`, as a Makefile would) and must:
exit with its documented code, print no traceback, name what to fix in one
`trtbuild: error:` line, and leave the working folder exactly as it was
(no output directory, no staging folder, no temporary file).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import NAFNET_POLICY, PINS, ROOT
from tests.helpers import F, if_on_sign, model, needs_rtx, node
from trtbuild.cli import main


@dataclass(frozen=True)
class Ctx:
    tmp: Path
    nafnet: Path

    def policy(self, text: str, name: str = "policy.yaml") -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)

    def nafnet_policy(self, rules: str = PINS, **replace: str) -> str:
        text = NAFNET_POLICY.format(model=self.nafnet, rules=rules, backend="none")
        for old, new in replace.items():
            assert old.replace("_", " ") in text or old in text, old
            text = text.replace(old.replace("_", " ") if old not in text else old, new)
        return self.policy(text)

    def model_policy(self, m: onnx.ModelProto, extra: str = "") -> str:
        onnx.save(m, self.tmp / "m.onnx")
        return self.policy(f"version: 1\nmodel: m.onnx\nbuild: {{backend: none}}\n{extra}")

    def build(self, policy: str) -> list[str]:
        return ["build", "--policy", policy, "--out", str(self.tmp / "out")]


def _without_outputs() -> onnx.ModelProto:
    """A node and no graph output: ONNX Runtime refused its session (a traceback, exit 70)."""
    graph = helper.make_graph(
        [node("Relu", ["x"], "y", "relu")], "g", [helper.make_tensor_value_info("x", F, [1, 4])], []
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _relu(shape=(1, 4)) -> onnx.ModelProto:
    return model(
        [node("Relu", ["x"], "y", "relu")], [("x", F, list(shape))], [("y", F, list(shape))]
    )


def _image_identity(ctx: Ctx) -> onnx.ModelProto:
    """An identity over [1, 3, h, w] and an image folder beside the policy."""
    from PIL import Image

    (ctx.tmp / "images").mkdir(exist_ok=True)
    Image.new("RGB", (10, 6), (200, 100, 50)).save(ctx.tmp / "images" / "a.png")
    dims = [1, 3, "h", "w"]
    return model([node("Identity", ["x"], "y", "id")], [("x", F, dims)], [("y", F, dims)])


def _dynamic_relu() -> onnx.ModelProto:
    return model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, "n"])], [("y", F, [1, "n"])])


def _with_weight(value: float, scale: float = 1.0) -> onnx.ModelProto:
    """y = (x + w) * scale: a NaN w (a broken checkpoint) or a scale that overflows FP32."""
    inits = {"w": np.full((1, 4), value, np.float32), "s": np.array(scale, np.float32)}
    return model(
        [node("Add", ["x", "w"], "a", "add_w"), node("Mul", ["a", "s"], "y", "scale")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        inits,
    )


def _broken_record(c: Ctx) -> list[str]:
    """`report` into a folder whose build.json lacks what its Engines section reads."""
    import json

    policy = c.nafnet_policy()
    out = c.tmp / "out"
    out.mkdir()
    engine = {"backend": "tensorrt-rtx", "version": "1.0", "engine_bytes": 1}  # no build_seconds
    record = {"policy": str(Path(policy).resolve()), "backend": "tensorrt-rtx"}
    (out / "build.json").write_text(json.dumps({**record, "engines": {"policy": engine}}))
    return ["report", "--policy", policy, "--out", str(out)]


def _halving() -> onnx.ModelProto:
    """Pool by 2, upsample back, add the input: only even heights and widths run."""
    return model(
        [
            node("MaxPool", ["x"], "p", "pool", kernel_shape=[2, 2], strides=[2, 2]),
            node("Resize", ["p", "", "scales"], "u", "up", mode="nearest"),
            node("Add", ["x", "u"], "y", "merge"),
        ],
        [("x", F, [1, 1, "h", "w"])],
        [("y", F, [1, 1, "h", "w"])],
        {"scales": np.array([1, 1, 2, 2], np.float32)},
    )


def _dynamic() -> onnx.ModelProto:
    return model(
        [node("Relu", ["x"], "y", "relu")], [("x", F, ["batch", 4])], [("y", F, ["batch", 4])]
    )


def _if_model(then_type: int = F) -> onnx.ModelProto:
    """An If on the input's sign; `then_type` other than float declares its branches apart."""
    cast = [helper.make_node("Cast", ["r"], ["t"], name="then_cast", to=then_type)]
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="then_relu"), *cast],
        "then",
        [],
        [helper.make_tensor_value_info("t", then_type, [1, 4])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, [1, 4])],
    )
    return if_on_sign(then, other, [1, 4])


def _loop_model(out_type: int = F) -> onnx.ModelProto:
    """A Loop doubling its carried value; `out_type` other than float hands it back in another."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
            helper.make_node("Add", ["acc_in", "acc_in"], ["acc"], name="double"),
            helper.make_node("Cast", ["acc"], ["acc_out"], name="hand_back", to=out_type),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", F, [1, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", out_type, [1, 4]),
        ],
    )
    return model(
        [node("Loop", ["n", "go", "x"], "y", "repeat", body=body)],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"n": np.array(3, np.int64), "go": np.array(True)},
    )


def _external(ctx: Ctx, keep_data: bool) -> str:
    m = _relu((1, 4))
    m.graph.node[0].op_type = "Add"
    m.graph.node[0].input.append("w")
    m.graph.initializer.append(numpy_helper.from_array(np.ones((1, 4), np.float32), "w"))
    onnx.save(
        m,
        str(ctx.tmp / "m.onnx"),
        save_as_external_data=True,
        location="m.data",
        size_threshold=0,
    )
    if not keep_data:
        (ctx.tmp / "m.data").unlink()
    return ctx.policy("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")


def _npz(ctx: Ctx, **arrays) -> str:
    np.savez(ctx.tmp / "data.npz", **arrays)
    return "data.npz"


def _file_input(ctx: Ctx, x: np.ndarray) -> str:
    """An `inputs:` section feeding input x from an .npz holding `x`."""
    return "inputs: {x: {data: {file: " + _npz(ctx, x=x) + "}}}\n"


# (id, argv builder, exit code, message fragment)
CASES = [
    # -- the policy file ---------------------------------------------------------
    (
        "yaml-unclosed",
        lambda c: c.build(c.policy("version: 1\nmodel: [unclosed\n")),
        2,
        "while parsing a flow sequence on line 2",
    ),
    (
        "yaml-tab-indent",
        lambda c: c.build(c.policy("version: 1\n\tmodel: m.onnx\n")),
        2,
        "malformed YAML",
    ),
    ("yaml-a-list", lambda c: c.build(c.policy("- version: 1\n")), 2, "mapping"),
    ("yaml-empty", lambda c: c.build(c.policy("")), 2, "policy.yaml"),
    (
        "not-utf8",
        lambda c: c.build(
            c.policy("x") and _write_bytes(c.tmp / "policy.yaml", b"\xff\xfe\x00bad")
        ),
        2,
        "cannot read policy",
    ),
    ("policy-missing", lambda c: c.build(str(c.tmp / "nope.yaml")), 2, "policy file not found"),
    ("policy-is-a-folder", lambda c: c.build(str(_mkdir(c.tmp / "folder.yaml"))), 2, "folder.yaml"),
    (
        "misspelt-top-key",
        lambda c: c.build(c.policy("version: 1\nmodle: m.onnx\n")),
        2,
        "did you mean 'model'",
    ),
    (
        "misspelt-match-key",
        lambda c: c.build(
            c.nafnet_policy(rules="    - {id: a, match: {patern: layernorm}, precision: fp32}\n")
        ),
        2,
        "did you mean 'pattern'",
    ),
    (
        "unknown-pattern",
        lambda c: c.build(
            c.nafnet_policy(rules="    - {id: a, match: {pattern: layernrom}, precision: fp32}\n")
        ),
        2,
        "did you mean 'layernorm'",
    ),
    (
        "unknown-precision",
        lambda c: c.build(c.policy("version: 1\nmodel: m.onnx\nprecision: {default: fp8}\n")),
        2,
        "precision.default",
    ),
    (
        "invalid-regex",
        lambda c: c.build(
            c.nafnet_policy(rules="    - {id: a, match: {name: '(['}, precision: fp32}\n")
        ),
        2,
        "invalid regular expression",
    ),
    (
        "wrong-type-samples",
        lambda c: c.build(c.nafnet_policy(**{"samples: 2": "samples: two"})),
        2,
        "must be an integer",
    ),
    (
        "wrong-type-rules",
        lambda c: c.build(c.policy("version: 1\nmodel: m.onnx\nprecision: {rules: pow}\n")),
        2,
        "precision.rules",
    ),
    (
        "rule-without-id",
        lambda c: c.build(c.nafnet_policy(rules="    - {match: {op: Pow}, precision: fp32}\n")),
        2,
        "'id'",
    ),
    (
        "duplicate-rule-id",
        lambda c: c.build(
            c.nafnet_policy(
                rules="    - {id: a, match: {op: Pow}, precision: fp32}\n    - {id: a, match: {op: Add}, precision: fp32}\n"
            )
        ),
        2,
        "duplicate rule id 'a'",
    ),
    ("version-2", lambda c: c.build(c.policy("version: 2\nmodel: m.onnx\n")), 2, "must be 1"),
    (
        "no-model-key",
        lambda c: c.build(c.policy("version: 1\n")),
        2,
        "missing required key 'model'",
    ),
    ("negative-atol", lambda c: c.build(c.nafnet_policy(**{"atol: 1e-2": "atol: -1"})), 2, "atol"),
    (
        "bad-workspace",
        lambda c: c.build(c.policy("version: 1\nmodel: m.onnx\nbuild: {workspace: lots}\n")),
        2,
        "write e.g. 4GiB",
    ),
    (
        "bad-memory-budget",
        lambda c: c.build(c.nafnet_policy(**{"samples: 2": "samples: 2\n  memory_budget: lots"})),
        2,
        "write e.g. 4GiB",
    ),
    (
        "memory-budget-below-one-step",
        lambda c: c.build(c.nafnet_policy(**{"samples: 2": "samples: 2\n  memory_budget: 512KiB"})),
        2,
        "one step may take half the budget of 512 KiB",
    ),
    (
        "nan-weights",
        lambda c: c.build(c.model_policy(_with_weight(float("nan")))),
        2,
        "output 'y' holds NaN on the reference data; it first appears in tensor 'a' (node add_w, Add); its weight w holds NaN",
    ),
    (
        "inf-reference",
        lambda c: c.build(c.model_policy(_with_weight(1.0, 3e38))),
        2,
        "output 'y' holds inf on the reference data; it first appears in tensor 'y' (node scale, Mul)",
    ),
    (
        "report-over-a-broken-build-record",
        _broken_record,
        2,
        "engines.policy.build_seconds is missing; it is not a record this trtbuild wrote",
    ),
    (
        "a-shape-the-model-cannot-run",
        lambda c: c.build(c.model_policy(_halving(), "inputs: {x: {shape: [1, 1, 5, 6]}}\n")),
        2,
        "the FP32 model cannot run at shape [1, 1, 5, 6] in node merge",
    ),
    (
        "override-names-an-unknown-input",
        lambda c: c.build(
            c.nafnet_policy(
                **{"passes: {opset: 17}": "passes: {override_input_shapes: {image: [1, 3, 8, 8]}}"}
            )
        ),
        2,
        "passes.override_input_shapes.image: the model has no input 'image'",
    ),
    (
        "named-shape-outside-the-profile",
        lambda c: c.build(
            c.model_policy(
                _dynamic(),
                "inputs: {x: {min: [1, 4], opt: [2, 4], max: [4, 4]}}\n"
                "accuracy: {shapes: {huge: {x: [8, 4]}}}\n",
            )
        ),
        2,
        "accuracy.shapes.huge.x: [8, 4] is outside the optimization profile [1, 4] .. [4, 4]",
    ),
    (
        "quantile-without-error-quantile",
        lambda c: c.build(
            c.nafnet_policy(**{"check_error_stat: median": "check_error_stat: quantile"})
        ),
        2,
        "check_error_stat: quantile needs error_quantile",
    ),
    (
        "low-above-high",
        lambda c: c.build(c.nafnet_policy(**{"low: 0.0, high: 1.0": "low: 2.0, high: 1.0"})),
        2,
        "low must not exceed high",
    ),
    (
        "bad-compute-capability",
        lambda c: c.build(
            c.policy("version: 1\nmodel: m.onnx\nbuild: {compute_capabilities: [sm89]}\n")
        ),
        2,
        "compute_capabilities",
    ),
    # -- the model ---------------------------------------------------------------
    (
        "model-missing",
        lambda c: c.build(c.policy("version: 1\nmodel: missing.onnx\n")),
        2,
        "model file not found",
    ),
    ("model-truncated", lambda c: c.build(_truncated(c)), 2, "not a readable ONNX model"),
    ("model-empty-file", lambda c: c.build(_empty_file(c)), 2, "m.onnx"),
    ("model-is-text", lambda c: c.build(_text_model(c)), 2, "not a readable ONNX model"),
    (
        "model-without-nodes",
        lambda c: c.build(c.model_policy(model([], [("x", F, [1])], [("x", F, [1])]))),
        2,
        "no nodes",
    ),
    (
        "model-without-outputs",
        lambda c: c.build(c.model_policy(_without_outputs())),
        2,
        "the model has no graph outputs",
    ),
    (
        "model-if-branches-typed-apart",
        lambda c: c.build(c.model_policy(_if_model(TensorProto.DOUBLE))),
        2,
        "node 'branch' (If) cannot be typed consistently: its then_branch output 0",
    ),
    (
        "model-loop-carried-typed-apart",
        lambda c: c.build(c.model_policy(_loop_model(TensorProto.DOUBLE))),
        2,
        "node 'repeat' (Loop) cannot be typed consistently: its body takes carried value 0",
    ),
    ("external-data-missing", lambda c: c.build(_external(c, keep_data=False)), 2, "m.data"),
    # -- inputs and data ---------------------------------------------------------
    (
        "input-name-unknown",
        lambda c: c.build(c.model_policy(_relu(), "inputs: {image: {shape: [1, 4]}}\n")),
        2,
        "the model has no input 'image'",
    ),
    (
        "shape-rank-mismatch",
        lambda c: c.build(c.model_policy(_relu(), "inputs: {x: {shape: [1, 4, 1]}}\n")),
        2,
        "rank 3 does not fit",
    ),
    (
        "shape-dim-mismatch",
        lambda c: c.build(c.model_policy(_relu(), "inputs: {x: {shape: [1, 5]}}\n")),
        2,
        "does not fit the model's [1, 4]",
    ),
    ("dynamic-without-shape", lambda c: c.build(c.model_policy(_dynamic())), 2, "dynamic shape"),
    (
        "profile-incomplete",
        lambda c: c.build(c.model_policy(_dynamic(), "inputs: {x: {min: [1, 4], opt: [2, 4]}}\n")),
        2,
        "needs min, opt and max",
    ),
    (
        "profile-out-of-order",
        lambda c: c.build(
            c.model_policy(_dynamic(), "inputs: {x: {min: [4, 4], opt: [2, 4], max: [8, 4]}}\n")
        ),
        2,
        "min <= opt <= max",
    ),
    (
        "npz-missing",
        lambda c: c.build(c.model_policy(_relu(), "inputs: {x: {data: {file: nope.npz}}}\n")),
        2,
        "data file not found",
    ),
    (
        "npz-wrong-key",
        lambda c: c.build(
            c.model_policy(
                _relu(), f"inputs: {{x: {{data: {{file: {_npz(c, y=np.ones((1, 4)))}}}}}}}\n"
            )
        ),
        2,
        "has no array 'x'",
    ),
    (
        "npz-wrong-shape",
        lambda c: c.build(
            c.model_policy(
                _relu(), f"inputs: {{x: {{data: {{file: {_npz(c, x=np.ones((3, 3)))}}}}}}}\n"
            )
        ),
        2,
        "has 3 on axis 0 where the model's input has 1",
    ),
    # -- every point of the input space, whatever the data (#33) -------------------
    (
        "point-outside-profile-with-images",
        lambda c: c.build(
            c.model_policy(
                _image_identity(c),
                "inputs: {x: {min: [1, 3, 4, 4], opt: [1, 3, 8, 8], max: [1, 3, 16, 16], "
                "data: {images: images}}}\naccuracy: {shapes: {huge: {x: [1, 3, 32, 32]}}}\n",
            )
        ),
        2,
        "accuracy.shapes.huge.x: [1, 3, 32, 32] is outside the optimization profile",
    ),
    (
        "point-without-data-that-cannot-be-derived",
        lambda c: c.build(
            c.model_policy(
                _dynamic_relu(),
                f"inputs: {{x: {{min: [1, 2], opt: [1, 4], max: [1, 8], "
                f"data: {{file: {_npz(c, x=np.ones((1, 4), np.float32))}, derive: none}}}}}}\n",
            )
        ),
        2,
        "give the point its own data (accuracy.shapes.min.data.file), skip it",
    ),
    # -- backends and commands ---------------------------------------------------
    (
        "backend-not-installed",
        lambda c: [*c.build(c.nafnet_policy()), "--backend", "tensorrt"],
        3,
        "tensorrt",
    ),
    ("unknown-command", lambda c: ["frobnicate"], 2, "invalid choice"),
    (
        "prepare-missing-model",
        lambda c: ["prepare", str(c.tmp / "none.onnx"), "-o", str(c.tmp / "out.onnx")],
        2,
        "model file not found",
    ),
    (
        "prepare-opset-out-of-range",
        lambda c: ["prepare", str(c.nafnet), "-o", str(c.tmp / "out.onnx"), "--opset", "-3"],
        2,
        "--opset must be between 7 and 99",
    ),
    (
        "report-missing-engine",
        lambda c: [
            "report",
            "--policy",
            c.nafnet_policy(),
            "--engine",
            str(c.tmp / "e.plan"),
            "--out",
            str(c.tmp / "out"),
        ],
        2,
        "engine file not found",
    ),
    (
        "out-is-a-file",
        lambda c: ["build", "--policy", c.nafnet_policy(), "--out", str(_touch(c.tmp / "taken"))],
        2,
        "taken",
    ),
    # -- inputs that would silently change meaning (#15) -----------------------------
    (
        "duplicate-precision-block",
        lambda c: c.build(
            c.policy(Path(c.nafnet_policy()).read_text() + "precision:\n  rules: []\n")
        ),
        2,
        "duplicate key 'precision' (first given on line",
    ),
    (
        "duplicate-nested-key",
        lambda c: c.build(c.nafnet_policy(**{"rtol: 1e-2": "rtol: 1e-2, atol: 5"})),
        2,
        "accuracy.tolerances.default.atol: duplicate key 'atol'",
    ),
    (
        "nan-tolerance",
        lambda c: c.build(c.nafnet_policy(**{"atol: 1e-2": "atol: .nan"})),
        2,
        "finite",
    ),
    (
        "inf-tolerances",
        lambda c: c.build(c.nafnet_policy(**{"atol: 1e-2, rtol: 1e-2": "atol: .inf, rtol: .inf"})),
        2,
        "must be a finite number, got inf",
    ),
    (
        "nan-divergence-threshold",
        lambda c: c.build(
            c.nafnet_policy(**{"samples: 2": "samples: 2\n  divergence_threshold: .nan"})
        ),
        2,
        "accuracy.divergence_threshold: must be a finite number",
    ),
    (
        "negative-tolerance",
        lambda c: c.build(c.nafnet_policy(**{"atol: 1e-2": "atol: -1"})),
        2,
        "must be at least 0",
    ),
    (
        "samples-absurd",
        lambda c: c.build(c.nafnet_policy(**{"samples: 2": "samples: 100000000"})),
        2,
        "accuracy.samples: must be at most 10000",
    ),
    (
        "samples-beyond-memory",
        lambda c: c.build(
            c.model_policy(_relu((1, 3, 4096, 4096)), "accuracy: {samples: 10000}\n")
        ),
        2,
        "lower accuracy.samples to at most",
    ),
    (
        "yaml-alias-bomb",
        lambda c: c.build(c.policy(_ALIAS_BOMB)),
        2,
        "expands to more than 100000 YAML nodes",
    ),
    (
        "model-is-a-folder",
        lambda c: c.build(c.policy(f"version: 1\nmodel: {_mkdir(c.tmp / 'm.onnx').name}\n")),
        2,
        "is a folder, not an ONNX file",
    ),
    (
        "npz-integers-for-a-float-input",
        lambda c: c.build(c.model_policy(_relu(), _file_input(c, np.ones((1, 4), np.int64)))),
        2,
        "holds int64 values; the model's input 'x' takes float32",
    ),
    (
        "npz-holds-nan",
        lambda c: c.build(
            c.model_policy(_relu(), _file_input(c, np.array([[[0, 1, np.nan, 2]]], np.float32)))
        ),
        2,
        "first at index [0, 0, 2]",
    ),
    (
        "reserved-guard-rule-id",
        lambda c: c.build(
            c.nafnet_policy(rules="    - {id: 'guard:mine', match: {op: Pow}, precision: fp32}\n")
        ),
        2,
        "reserved for the built-in guards",
    ),
    (
        "unknown-guard",
        lambda c: c.build(
            c.nafnet_policy(**{"default: fp16": "default: fp16\n  guards: [weights]"})
        ),
        2,
        "did you mean 'weight-range'",
    ),
    (
        "emulation-misspelt",
        lambda c: c.build(c.nafnet_policy(**{"samples: 2": "samples: 2\n  emulation: strikt"})),
        2,
        "did you mean 'strict'",
    ),
    (
        "tune-would-overwrite-its-input",
        lambda c: ["tune", "--policy", (p := c.nafnet_policy()), "-o", p],
        2,
        "pass --force to replace it",
    ),
]

# Each level names the previous one ten times: 10**6 nodes from a few hundred bytes.
_ALIAS_BOMB = "version: 1\nmodel: m.onnx\na: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcde", "bcdef")
)


def _write_bytes(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _touch(path: Path) -> Path:
    path.write_text("a file, not a folder")
    return path


def _truncated(c: Ctx) -> str:
    (c.tmp / "m.onnx").write_bytes(c.nafnet.read_bytes()[:300])
    return c.policy("version: 1\nmodel: m.onnx\n")


def _empty_file(c: Ctx) -> str:
    (c.tmp / "m.onnx").write_bytes(b"")
    return c.policy("version: 1\nmodel: m.onnx\n")


def _text_model(c: Ctx) -> str:
    (c.tmp / "m.onnx").write_text("this is not a model\n" * 10)
    return c.policy("version: 1\nmodel: m.onnx\n")


def _snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize(
    ("argv", "code", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(argv, code, message, tmp_path, nafnet_path, capsys):
    if code == 3 and importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("full TensorRT is installed here")
    work = tmp_path / "work"
    work.mkdir()
    args = argv(Ctx(work, nafnet_path))
    capsys.readouterr()
    before = _snapshot(work)
    assert main(args) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("trtbuild: error:")]
    assert len(lines) == 1, err
    assert message in lines[0], err
    assert _snapshot(work) == before, "the failed command left files behind or changed some"


def test_names_empty_and_duplicate_are_given_unique_names(tmp_path, capsys):
    m = model(
        [
            node("Relu", ["x"], "a", ""),
            node("Neg", ["a"], "b", "dup"),
            node("Relu", ["b"], "y", "dup"),
        ],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
    )
    ctx = Ctx(tmp_path, Path())
    policy = ctx.model_policy(
        m, "precision: {rules: [{id: last, match: {name: '^dup__2$'}, precision: fp32}]}\n"
    )
    assert main(["check", "--policy", policy, "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)["nodes"]
    names = [r["node"] for r in rows]
    assert len(set(names)) == 3 and "dup" in names and "Relu__0" in names
    assert [r["rule"] for r in rows if r["node"] == "dup__2"] == ["last"]


def test_external_data_model_builds(tmp_path):
    ctx = Ctx(tmp_path, Path())
    assert main(ctx.build(_external(ctx, keep_data=True))) == 0
    assert (tmp_path / "out" / "report.json").is_file()


@pytest.mark.parametrize("make", [_if_model, _loop_model], ids=["if", "loop"])
def test_control_flow_that_types_consistently_builds(tmp_path, make):
    ctx = Ctx(tmp_path, Path())
    args = ctx.build(ctx.model_policy(make()))
    assert main(args) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["passed"]


@needs_rtx
@pytest.mark.parametrize(
    "sent, code, said", [(signal.SIGINT, 130, b"interrupted"), (signal.SIGTERM, 143, b"terminated")]
)
def test_ctrl_c_mid_build_keeps_previous_artifacts(tmp_path, models_dir, sent, code, said):
    """SIGINT while the engines build: exit 130, the last good build untouched, nothing partial.
    SIGTERM (`timeout`, `docker stop`) alike, exit 143: it had killed the command where it
    stood, a staging folder left beside the output."""
    text = (ROOT / "policies" / "transformer.yaml").read_text()
    policy = tmp_path / "transformer.yaml"
    policy.write_text(
        text.replace("../models/", f"{models_dir}/").replace(
            "backend: auto", "backend: tensorrt-rtx"
        )
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "trtbuild", "build", "--policy", str(policy), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=600)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    # as a terminal starts it: a test run started in the background (`make test &`) has
    # SIGINT ignored, and a child would inherit that
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    builder = None  # the child TensorRT builds in (`engine.child`): interrupted there
    while builder is None:
        assert proc.poll() is None, "the build ended before its engine build began"
        assert time.monotonic() < deadline
        builder = _engine_child(proc.pid)
        time.sleep(0.005)
    time.sleep(0.5)  # into TensorRT's build itself, past the child's imports
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code, err.decode()
    assert said in err and b"Traceback" not in err
    assert not Path(f"/proc/{builder}").exists()  # reaped, not left building
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _engine_child(pid: int) -> int | None:
    """The pid of `pid`'s child that builds an engine (Linux's /proc), None before it starts."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"trtbuild.engine.child" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
    return None


# -- the cache: trouble with it degrades to no cache, with one warning, never a failure ----


def _corrupt_every_entry(folder: Path) -> None:
    entries = [p for p in folder.rglob("*") if p.is_file()]
    assert entries, "the warm-up run cached nothing"
    for path in entries:
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # truncated


def _read_only(folder: Path) -> Path:
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root ignores modes: a folder no one may create
        return Path("/sys/trtbuild-cache")
    return folder


@pytest.mark.parametrize("trouble", ["corrupt entry", "read-only folder", "folder is a file"])
def test_cache_trouble_warns_once_and_changes_nothing(
    trouble, tmp_path, write_policy, capsys, monkeypatch
):
    policy = str(write_policy())
    assert main(["check", "--policy", policy, "--json", "--no-cache"]) == 0
    expected = capsys.readouterr().out
    folder = tmp_path / "cache"
    if trouble == "corrupt entry":
        monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(folder))
        assert main(["check", "--policy", policy, "--json"]) == 0  # warm up
        capsys.readouterr()
        _corrupt_every_entry(folder)
        warned = "dropped a corrupt cache entry"
    elif trouble == "read-only folder":
        folder, warned = _read_only(folder), "cache off for this run"
    else:
        folder.write_text("not a folder")
        warned = "is a file, not a folder"
    monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(folder))
    try:
        started = time.monotonic()
        code = main(["check", "--policy", policy, "--json"])
        out, err = capsys.readouterr()
        assert code == 0 and out == expected, err
        assert err.count("trtbuild: warning:") == 1 and warned in err, err
        assert "Traceback" not in err and time.monotonic() - started < 30
        if trouble == "corrupt entry":  # rewritten: the next run hits, silently
            assert main(["check", "--policy", policy, "--json"]) == 0
            out, err = capsys.readouterr()
            assert out == expected and "warning" not in err
    finally:
        if folder.is_dir():
            folder.chmod(0o755)


@pytest.mark.parametrize("size", ["abc", "-5", ".nan", "1e40"])
def test_cache_size_that_is_no_size_is_a_usage_error(size, write_policy, capsys, monkeypatch):
    monkeypatch.setenv("TRTBUILD_CACHE_MAX_MB", size)
    assert main(["check", "--policy", str(write_policy())]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("trtbuild: error:") == 1 and "TRTBUILD_CACHE_MAX_MB" in err, err


# -- #34 trust boundaries: the surroundings (publication, out folders, special files) -------
# (one block; the cases run as `test_bad_input`'s do, and a folder's symlinks are not followed)


def _foreign_home(c: Ctx) -> str:
    home = _mkdir(c.tmp / "home")
    for name in (".bashrc", "engine.plan", "report.json"):
        (home / name).write_text("the user's")
    return str(home)


def _artifact_is_a_folder(c: Ctx) -> str:
    out = _mkdir(c.tmp / "out")
    (out / ".trtbuild-output").write_text("{}")  # an earlier build's folder
    _mkdir(out / "junit.xml")
    (out / "junit.xml" / "mine.txt").write_text("kept")
    return str(out)


def _symlink_loop(c: Ctx) -> str:
    (c.tmp / "loop").symlink_to(c.tmp / "pool")
    (c.tmp / "pool").symlink_to(c.tmp / "loop")
    return str(c.tmp / "loop")


def _fifo(c: Ctx) -> str:
    os.mkfifo(c.tmp / "m.onnx")
    return c.policy("version: 1\nmodel: m.onnx\n")


SURROUNDINGS = [
    (
        "out-holds-the-users-files",
        lambda c: ["build", "--policy", c.nafnet_policy(), "--out", _foreign_home(c)],
        "did not write (.bashrc); publishing into it would replace engine.plan, report.json",
    ),
    (
        "report-out-holds-the-users-files",
        lambda c: ["report", "--policy", c.nafnet_policy(), "--out", _foreign_home(c)],
        "holds files trtbuild did not write",
    ),
    (
        "nightly-out-holds-the-users-files",
        lambda c: (
            ["nightly", "--policies", str(_mkdir(c.tmp / "policies")), "--out", _foreign_home(c)]
        ),
        "holds files trtbuild did not write",
    ),
    (
        "out-is-the-root",
        lambda c: ["build", "--policy", c.nafnet_policy(), "--out", "/"],
        "the root folder cannot be an output folder",
    ),
    (
        "artifact-is-a-folder",
        lambda c: ["build", "--policy", c.nafnet_policy(), "--out", _artifact_is_a_folder(c)],
        "junit.xml: is a folder where trtbuild writes a file",
    ),
    (
        "convert-output-is-a-folder",
        lambda c: ["convert", "--policy", c.nafnet_policy(), "-o", str(_mkdir(c.tmp / "m"))],
        "is a folder where a file goes",
    ),
    (
        "out-is-a-symlink-loop",
        lambda c: ["build", "--policy", c.nafnet_policy(), "--out", _symlink_loop(c)],
        "a symlink loop",
    ),
    ("model-is-a-fifo", lambda c: c.build(_fifo(c)), "is not a regular file (a FIFO"),
    (
        "prepare-model-is-a-device",
        lambda c: ["prepare", "/dev/zero", "-o", str(c.tmp / "x.onnx")],
        "is a character device, not an ONNX file",
    ),
    (
        "control-characters-in-a-key",
        lambda c: c.build(c.policy('version: 1\nmodel: m.onnx\n"\\e]0;pwned\\a\\e[2J": 1\n')),
        "unknown key '\\x1b]0;pwned\\x07\\x1b[2J'",
    ),
    (
        "an-array-wording",
        lambda c: c.build(c.policy("version: 1\nmodel: m.onnx\nprecision: {rules: pow}\n")),
        "must be an array",
    ),
]


def _lsnapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.lstat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize(
    ("argv", "message"), [c[1:] for c in SURROUNDINGS], ids=[c[0] for c in SURROUNDINGS]
)
def test_bad_surroundings(argv, message, tmp_path, nafnet_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    args = argv(Ctx(work, nafnet_path))
    capsys.readouterr()
    before = _lsnapshot(work)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "\x1b" not in err and "\x07" not in err
    lines = [line for line in err.splitlines() if line.startswith("trtbuild: error:")]
    assert len(lines) == 1 and len(err.splitlines()) == 1, err
    assert message in lines[0], err
    assert _lsnapshot(work) == before, "the failed command left files behind or changed some"
    assert [p.name for p in tmp_path.iterdir()] == ["work"]


# -- end of the #34 surroundings block ------------------------------------------------------
