"""Small hand-built graphs for unit tests (real ONNX models, run by real runtimes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from numpy.typing import ArrayLike
from onnx import TensorProto, helper, numpy_helper

# the console script of the environment the tests run in (a venv or not)
TRTBUILD = str(Path(sys.executable).parent / "trtbuild")


def plain_session(m: onnx.ModelProto | str | Path):
    """An ONNX Runtime CPU session with every graph optimisation off: each op (Q/DQ
    included) as its definition says, the independent run tests compare against."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = m.SerializeToString() if isinstance(m, onnx.ModelProto) else str(m)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def model(
    nodes, inputs, outputs, inits=(), opset: int = 17, domains: dict | None = None
) -> onnx.ModelProto:
    """A checked, shape-inferred model; `domains`: other opsets it imports ({domain: version})."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    m = helper.make_model(graph, opset_imports=opsets)
    m.ir_version = 8
    onnx.checker.check_model(m)
    return onnx.shape_inference.infer_shapes(m)


def sparse_tensor(values, indices, dims, dtype=np.float32) -> onnx.SparseTensorProto:
    """A sparse tensor named "w" of `dtype`: `indices` positions in the flattened tensor
    ([NNZ]) or coordinates ([NNZ, rank])."""
    return helper.make_sparse_tensor(
        numpy_helper.from_array(np.asarray(values, dtype), "w"),
        numpy_helper.from_array(np.asarray(indices, np.int64), "w_indices"),
        dims,
    )


def node(op, ins, outs, name, **attrs):
    return helper.make_node(op, ins, outs if isinstance(outs, list) else [outs], name=name, **attrs)


F, H, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def bare_policy(tmp_path: Path, m: onnx.ModelProto) -> Path:
    """`p.yaml` over `m` (saved as `m.onnx`): no rules, no engine, every default."""
    onnx.save(m, tmp_path / "m.onnx")
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    return path


def identity_policy(tmp_path: Path, dims: list, input_yaml: str, extra: str = "") -> Path:
    """`p.yaml` over an Identity on input `x` of `dims` (saved as `m.onnx`): `input_yaml` is
    the body of `inputs.x` (flow style, one line), `extra` more top-level YAML."""
    m = model([node("Identity", ["x"], "y", "id")], [("x", F, dims)], [("y", F, dims)])
    onnx.save(m, tmp_path / "m.onnx")
    path = tmp_path / "p.yaml"
    path.write_text(f"version: 1\nmodel: m.onnx\ninputs:\n  x: {input_yaml}\n{extra}")
    return path


def dtypes(m: onnx.ModelProto) -> dict[str, int]:
    m = onnx.shape_inference.infer_shapes(m)
    out = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in (*m.graph.input, *m.graph.value_info, *m.graph.output)
    }
    out.update({t.name: t.data_type for t in m.graph.initializer})
    return out


def as_stored(a: ArrayLike, low: str = "fp16") -> np.ndarray:
    """`a` rounded to `low` (fp16 | bf16) and read back as FP32: what storing a tensor in the
    low precision does, the value a test expects after each store."""
    import ml_dtypes

    kind = np.float16 if low == "fp16" else ml_dtypes.bfloat16
    return np.asarray(a, np.float32).astype(kind).astype(np.float32)


def read_log(path: Path) -> list[dict]:
    """The rows of a tune log (`*.log.jsonl`), one trial each, in the order they ran."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: `[0]` the state, `[16]` the nice
    value. Split at the last ")", since a command name may hold spaces and parentheses.
    Raises OSError where the process is gone (its reaped entry is removed)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


# -- control flow ------------------------------------------------------------------


def if_on_sign(
    then: onnx.GraphProto,
    other: onnx.GraphProto,
    y_shape: list,
    inits: dict | None = None,
    domains: dict | None = None,
) -> onnx.ModelProto:
    """y = If(sum(x) > 0) then `then` else `other`, x of shape [1, 4]: the branches read x
    (and `inits`, the outer weights) from outside; `domains` as `model`'s."""
    return model(
        [
            node("ReduceSum", ["x"], "s", "sum", keepdims=0),
            node("Greater", ["s", "zero"], "c", "positive"),
            node("If", ["c"], "y", "branch", then_branch=then, else_branch=other),
        ],
        [("x", F, [1, 4])],
        [("y", F, y_shape)],
        {"zero": np.array(0.0, np.float32), **(inits or {})},
        domains=domains,
    )


def sequence_loop(item: str, dtype: int, count: str) -> list[onnx.NodeProto]:
    """Nodes making `s0` (an empty sequence of `dtype`), `s` (a Loop inserting the outer
    value `item` into it `count` times) and `y` (their concatenation on axis 0)."""
    body = helper.make_graph(
        [
            node("SequenceInsert", ["s_in", item], "s_out", "insert"),
            node("Identity", ["c"], "c2", "go"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_sequence_value_info("s_in", dtype, None),
        ],
        [
            helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
            helper.make_tensor_sequence_value_info("s_out", dtype, None),
        ],
    )
    return [
        node("SequenceEmpty", [], "s0", "empty", dtype=dtype),
        node("Loop", [count, "", "s0"], "s", "fill", body=body),
        node("ConcatFromSequence", ["s"], "y", "cat", axis=0),
    ]


def if_model(scale: float = 1.0) -> onnx.ModelProto:
    """y = If(sum(x) > 0) then Relu(x) * w * scale else Neg(x) * w: each branch reads the outer
    weight `w`; both name their products `p` (the naming pass must set them apart)."""
    vi = helper.make_tensor_value_info

    def branch(op: str, tag: str, k: float) -> onnx.GraphProto:
        return helper.make_graph(
            [
                node(op, ["x"], f"{tag}_a", f"{tag}_{op.lower()}"),
                node("Mul", [f"{tag}_a", "w"], "p", "mul"),
                node("Mul", ["p", f"k_{tag}"], f"{tag}_out", "scale"),
            ],
            tag,
            [],
            [vi(f"{tag}_out", F, [1, 4])],
            [numpy_helper.from_array(np.array(k, np.float32), f"k_{tag}")],
        )

    weight = {"w": np.full((1, 4), 2.0, np.float32)}
    return if_on_sign(branch("Relu", "then", scale), branch("Neg", "else", 1.0), [1, 4], weight)


def scan_model(steps: int = 8, width: int = 4, gain: float = 1.0) -> onnx.ModelProto:
    """A Scan over `steps` rows of x: a running sum (the state) and each row times 2 (scanned)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            node("Mul", ["row", "gain"], "scaled", "scale_row"),
            node("Add", ["acc_in", "scaled"], "acc_out", "accumulate"),
            node("Mul", ["row", "two"], "doubled", "double"),
        ],
        "body",
        [vi("acc_in", F, [width]), vi("row", F, [width])],
        [vi("acc_out", F, [width]), vi("doubled", F, [width])],
    )
    return model(
        [node("Scan", ["init", "x"], ["total", "rows"], "scan", body=body, num_scan_inputs=1)],
        [("x", F, [steps, width])],
        [("total", F, [width]), ("rows", F, [steps, width])],
        {
            "init": np.zeros(width, np.float32),
            "gain": np.array(gain, np.float32),
            "two": np.array(2.0, np.float32),
        },
    )


# -- a headless browser for the HTML pages --------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("CI must have Chromium for this test (.ci/run installs Debian's chromium)")
    pytest.skip("no Chromium on this machine (apt-get install chromium)")


def run_browser(browser: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def keep_screenshot(shot: Path) -> None:
    """Copy a browser screenshot to `TRTBUILD_SCREENSHOTS` (when set), for a person to look at."""
    folder = os.environ.get("TRTBUILD_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)


def pixels_near(img: np.ndarray, hex_color: str, tol: int = 40) -> int:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
    return int(np.count_nonzero(np.abs(img[..., :3].astype(int) - rgb).max(axis=-1) <= tol))


def _rtx_importable() -> bool:
    try:
        import tensorrt_rtx  # noqa: F401
    except Exception:  # not installed, or a stub package that raises on import
        return False
    return True


# Tests that build a real engine with TensorRT-RTX: skipped where it is absent, except under
# CI=true, where a missing backend must fail the run (.ci/run installs it).
needs_rtx = pytest.mark.skipif(
    not _rtx_importable() and not os.environ.get("CI"),
    reason="tensorrt-rtx is not installed (pip install -e '.[rtx]')",
)


# -- tune ------------------------------------------------------------------------------


def without_rules(name: str, tmp_path: Path, models_dir: Path, real_model=None) -> Path:
    """The example policy `name` with `rules: []` (its model and data where the tests keep
    them): what `tune` starts from."""
    from tests.conftest import ROOT, local_data

    text = (ROOT / "policies" / f"{name}.yaml").read_text()
    stem = re.search(r"\.\./models/(\w+)\.onnx", text).group(1)
    model = real_model(stem) if real_model else models_dir / f"{stem}.onnx"
    text = local_data(text.replace(f"../models/{stem}.onnx", str(model)))  # its data too
    start, end = text.index("  rules:"), text.index("build:")
    path = tmp_path / f"{name}-empty.yaml"
    path.write_text(text[:start] + "  rules: []\n" + text[end:])
    return path


def strict_tolerances(policy: Path) -> Path:
    """Every tolerance exact: most groups are needed, so the search grows, halves and shrinks."""
    strict = "{atol: 0.0, rtol: 0.0, check_error_stat: max}"
    text = policy.read_text()
    loose = "{atol: 1e-2, rtol: 1e-2, check_error_stat: median}"
    assert loose in text, "the example's tolerance changed: update strict_tolerances"
    policy.write_text(text.replace(loose, strict))
    return policy


def run_tune(policy: Path, out: Path, *extra: str) -> int:
    """`trtbuild tune --policy POLICY -o OUT [EXTRA...]`'s exit code."""
    from trtbuild.cli import main

    return main(["tune", "--policy", str(policy), "-o", str(out), *extra])


def fp8_qdq_conv(tensorrts: bool) -> onnx.ModelProto:
    """A Conv whose input and weight pass FP8 Q/DQ: TensorRT's (`trt::TRT_FP8QuantizeLinear`,
    as ModelOpt's torch quantizers export them through torch.onnx.export at opset 17: the
    scale a `Constant`, no zero point, the Q's output typed uint8), or ONNX's written by
    hand (an E4M3 zero point, opset 19): the oracle."""
    w = np.array([0.9, -0.35, 0.07], np.float32).reshape(1, 1, 3)
    nodes, inits, infos = [], [numpy_helper.from_array(w, "w")], []
    for value, scale in (("x", 0.004), ("w", 0.002)):
        q, dq, s = f"{value}_q", f"{value}_dq", f"{value}_s"
        nodes.append(helper.make_node("Constant", [], [s], name=f"{s}/c",
                                      value=numpy_helper.from_array(np.array(scale, np.float32))))  # fmt: skip
        if tensorrts:
            nodes.append(helper.make_node("TRT_FP8QuantizeLinear", [value, s], [q], name=f"{value}/q", domain="trt"))  # fmt: skip
            nodes.append(helper.make_node("TRT_FP8DequantizeLinear", [q, s], [dq], name=f"{value}/dq", domain="trt"))  # fmt: skip
            infos.append(helper.make_tensor_value_info(q, TensorProto.UINT8, None))
        else:
            z = f"{value}_z"
            inits.append(helper.make_tensor(z, TensorProto.FLOAT8E4M3FN, [], [0.0]))
            nodes.append(helper.make_node("QuantizeLinear", [value, s, z], [q], name=f"{value}/q"))
            nodes.append(helper.make_node("DequantizeLinear", [q, s, z], [dq], name=f"{value}/dq"))
    nodes.append(helper.make_node("Conv", ["x_dq", "w_dq"], ["y"], name="conv"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 1, 8])],
                              [helper.make_tensor_value_info("y", F, [1, 1, 6])], inits, value_info=infos)  # fmt: skip
    if tensorrts:
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("trt", 1)])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def resize_by_shape() -> onnx.ModelProto:
    """A Resize whose scale is computed from the input's size (`200 / max(H, W)`: Shape,
    Slice, Cast, ReduceMax, Div, Expand, Concat), as an export resizes to a longest side.
    In FP16 the scale at 100x150 rounds (1.3330 for 1.3333): 199 columns, not 200."""
    inits = [
        numpy_helper.from_array(np.array(200.0, np.float32), "target"),
        numpy_helper.from_array(np.array([1.0, 1.0], np.float32), "ones"),
        numpy_helper.from_array(np.array([2], np.int64), "i2"),
        numpy_helper.from_array(np.array([4], np.int64), "i4"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Slice", ["shp", "i2", "i4"], ["hw"], name="slice_hw"),
        helper.make_node("Cast", ["hw"], ["hwf"], to=F, name="cast_hw"),
        helper.make_node("ReduceMax", ["hwf"], ["mx"], keepdims=0, name="maxside"),
        helper.make_node("Div", ["target", "mx"], ["s"], name="scale_div"),
        helper.make_node("Expand", ["s", "i2"], ["ss"], name="expand_s"),
        helper.make_node("Concat", ["ones", "ss"], ["scales"], axis=0, name="scales_concat"),
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", name="resize"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, ["b", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", F, ["b", 3, "H", "W"])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def fourier_features(side: str = "side") -> list[onnx.NodeProto]:
    """SAM's prompt encoder: point coordinates `pts` normalised, `(x + 0.5) / side * 2 - 1`,
    then `emb`, the `sin` and `cos` of `2π · coords @ b` (weights `half`, `two`, `one`,
    `tau`, `b` and `side`, unless a node makes it, given by the caller)."""
    return [
        node("Add", ["pts", "half"], "shifted", "shift"),
        node("Div", ["shifted", side], "unit", "normalise"),
        node("Mul", ["unit", "two"], "twice", "twice"),
        node("Sub", ["twice", "one"], "coords", "centre"),
        node("MatMul", ["coords", "b"], "p", "project"),
        node("Mul", ["p", "tau"], "arg", "scale"),
        node("Sin", ["arg"], "s", "sin"),
        node("Cos", ["arg"], "c", "cos"),
        node("Concat", ["s", "c"], "emb", "concat", axis=-1),
    ]


def fourier_weights(b: np.ndarray) -> dict[str, np.ndarray]:
    """`fourier_features`' constants, with `b` its projection."""
    consts = {"half": 0.5, "two": 2.0, "one": 1.0, "tau": 2 * np.pi}
    return {**{k: np.array(v, np.float32) for k, v in consts.items()}, "b": b}


def scan8_sum() -> onnx.ModelProto:
    """ONNX's scan_sum node test: an opset-8 Scan (a batch axis, `sequence_lens` left out)
    summing the rows of `x` [1, 3, 2] onto `initial` [1, 2] into `y`."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "next"], ["sum_out"], name="add")],
        "body",
        [helper.make_tensor_value_info(n, f, [2]) for n in ("sum_in", "next")],
        [helper.make_tensor_value_info("sum_out", f, [2])],
    )
    scan = helper.make_node(
        "Scan", ["", "initial", "x"], ["y"], name="scan", body=body, num_scan_inputs=1
    )
    inputs = [
        helper.make_tensor_value_info("initial", f, [1, 2]),
        helper.make_tensor_value_info("x", f, [1, 3, 2]),
    ]
    output = helper.make_tensor_value_info("y", f, [1, 2])
    graph = helper.make_graph([scan], "g", inputs, [output])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 8
    return m


def interleaved(held, inside=None) -> list:
    """Two threads each inside `held()`: the first in is the first out while the second is
    still inside (two builds from one Policy). `inside()` is called by the second once the
    first has left; its results are returned, to be asserted in the test's own thread (an
    assert in a thread fails no test)."""
    import threading

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list = []

    def first() -> None:
        with held():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with held():
            second_in.set()
            first_out.wait(10)
            if inside is not None:
                seen.append(inside())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return seen
