"""Real TensorRT-RTX builds on the CPU (no GPU needed to build)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
import pytest

from tests.helpers import needs_rtx
from trtbuild.engine.backends import resolve_backend
from trtbuild.engine.child import build_engine
from trtbuild.errors import BackendError
from trtbuild.graph.model_io import save_model
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import BuildSpec, Match, Passes, Precision, Rule
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert

rtx = needs_rtx  # one marker for every test that builds with TensorRT-RTX


@rtx
def test_rtx_builds_mixed_engine_with_pinned_layers_fp32(nafnet_path, tmp_path):
    prepared = prepare(onnx.load(nafnet_path), Passes(opset=17)).model
    pins = Precision(rules=(Rule("ln", Match(name="/norm[0-9]+/"), "fp32"),))
    converted = convert(assign(prepared, pins))
    save_model(converted.model, tmp_path / "mixed.onnx")
    result = build_engine(tmp_path / "mixed.onnx", "tensorrt-rtx", BuildSpec(workspace=1 << 30))
    assert len(result.engine) > 10_000
    layers = {layer["name"]: layer["outputs"] for layer in result.layers}
    assert layers["/blocks.0/norm1/Pow"] == ["fp32"]
    assert layers["/intro/Conv"] == ["fp16"]
    assert result.memory["weights_bytes"] > 0


@rtx
def test_unknown_compute_capability_is_a_usage_error(nafnet_path, tmp_path):
    from trtbuild.errors import UsageError

    save_model(onnx.load(nafnet_path), tmp_path / "m.onnx")
    with pytest.raises(UsageError, match="not a TensorRT-RTX target"):
        build_engine(tmp_path / "m.onnx", "tensorrt-rtx", BuildSpec(compute_capabilities=("9.0",)))


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="full TensorRT is installed"
)
def test_missing_backend_is_exit_3():
    with pytest.raises(BackendError) as info:
        resolve_backend("tensorrt")
    assert info.value.exit_code == 3


def test_without_a_cuda_driver_there_is_no_gpu_and_no_name():
    """This machine has no CUDA driver: every name of it fails to load, so neither the
    device count nor the name is asked (on a GPU machine both come from the one driver)."""
    import ctypes

    from trtbuild.engine.backends import CUDA_DRIVERS, gpu_available, gpu_name

    for lib in CUDA_DRIVERS:
        try:
            ctypes.CDLL(lib)
        except OSError:
            continue
        pytest.skip(f"{lib} loads here: a CUDA driver is installed")
    assert gpu_available() is False and gpu_name() is None


@rtx
def test_an_opset_6_graph_the_parser_refuses_says_to_upgrade_it(tmp_path):
    """A Max of opset 6 (PyTorch's early exports, the ONNX backend tests'): ONNX Runtime runs
    it, TensorRT's parser refuses "Pre-opset 7 broadcasting" (exit 3); the hint said to
    check the op is supported, where the fix is the policy's opset."""
    from tests.helpers import F, model, node

    old = model([node("Max", ["a", "b"], "y", "max")], [("a", F, [3, 4]), ("b", F, [3, 4])],
                [("y", F, [3, 4])], opset=6)  # fmt: skip
    save_model(old, tmp_path / "m.onnx")
    with pytest.raises(BackendError) as info:
        build_engine(tmp_path / "m.onnx", "tensorrt-rtx", BuildSpec(workspace=1 << 28))
    assert "Pre-opset 7" in info.value.message and "`passes: {opset: 17}`" in info.value.hint
    upgraded = prepare(old, Passes(opset=17)).model
    save_model(upgraded, tmp_path / "m17.onnx")
    assert build_engine(tmp_path / "m17.onnx", "tensorrt-rtx", BuildSpec(workspace=1 << 28)).engine


def _attention_model(path) -> None:
    """One ONNX `Attention` (opset 23, as torch.onnx writes scaled_dot_product_attention
    there): FP32 query, key and value (an all-FP32 variant's, a pinned one's), a boolean
    mask. TensorRT-RTX 1.7 has no fused kernel for it."""
    from onnx import TensorProto, helper

    dims = [1, 4, 8, 16]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in "qkvy"]
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, 8, 8])
    attention = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], name="attn")
    graph = helper.make_graph([attention], "g", [*io[:3], mask], io[3:])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    save_model(m, path)


@rtx
def test_an_attention_with_no_fused_kernel_builds_split_by_default(tmp_path):
    """The parser leaves an ONNX Attention whole, and where TensorRT has no fused kernel
    for it the build fails (every FP32 one in TensorRT-RTX 1.7: the default all-FP32
    variant of any opset-23 transformer failed `build`). `build.decomposable_attention`
    (default true) lets TensorRT split it; false fails, the hint naming the field."""
    _attention_model(tmp_path / "m.onnx")
    assert build_engine(tmp_path / "m.onnx", "tensorrt-rtx", BuildSpec(workspace=1 << 28)).engine
    whole = BuildSpec(workspace=1 << 28, decomposable_attention=False)
    with pytest.raises(BackendError) as info:
        build_engine(tmp_path / "m.onnx", "tensorrt-rtx", whole)
    assert "`build: {decomposable_attention: true}`" in info.value.hint


def test_an_attention_with_no_fused_kernel_is_told_the_policys_fix():
    from trtbuild.engine.backends import _build_fix

    said = [("ERROR", "MyelinCheckException: Attention operation was not supported by a "
                      "dedicated kernel.  (See https://docs.nvidia.com/...)")]  # fmt: skip
    whole = BuildSpec(decomposable_attention=False)
    assert "`build: {decomposable_attention: true}`" in _build_fix(said, whole)
    chosen = _build_fix(said, BuildSpec())  # already true: nothing to say
    assert chosen.startswith("TensorRT said: ") and "decomposable_attention" not in chosen


def _rope_model(path) -> None:
    """One ONNX `RotaryEmbedding` (opset 23) whose cos and sin caches have a batch of 1, as
    torch.onnx's dynamo exporter writes a Llama's, before an input with a dynamic batch."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 8, 16])
    angle = np.arange(8)[:, None] * (1.0 / 10000 ** (np.arange(8) / 8))[None]
    caches = [numpy_helper.from_array(f(angle)[None].astype(np.float32), f.__name__)
              for f in (np.cos, np.sin)]  # fmt: skip
    rope = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], name="rope")
    m = helper.make_model(
        helper.make_graph([rope], "g", [x], [y], caches),
        opset_imports=[helper.make_opsetid("", 23)],
    )
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    save_model(m, path)


@rtx
def test_a_dynamic_dim_the_parser_refuses_is_told_to_be_made_static(tmp_path):
    """TensorRT-RTX's parser compares the cos cache's batch (1) with the input's (-1) and
    refuses the model (a Llama exported at opset 23: exit 3, told to check the op is
    supported). Where the policy holds that dim at one value, the hint names the override
    that makes it static, and the model so prepared builds."""
    from trtbuild.policy.specs import InputSpec

    _rope_model(tmp_path / "m.onnx")
    held = (InputSpec("x", min=(1, 2, 8, 16), opt=(1, 2, 8, 16), max=(1, 2, 8, 16)),)
    spec = BuildSpec(workspace=1 << 28)
    with pytest.raises(BackendError) as info:
        build_engine(tmp_path / "m.onnx", "tensorrt-rtx", spec, held)
    assert "cosCache" in info.value.message
    assert "CUDA driver version" not in info.value.message  # no driver: not why it refused
    assert '`passes: {override_input_shapes: {"x": [1, 2, 8, 16]}}`' in info.value.hint
    varied = (InputSpec("x", min=(1, 2, 8, 16), opt=(2, 2, 8, 16), max=(4, 2, 8, 16)),)
    with pytest.raises(BackendError) as info:  # a batch that varies: no static dim to offer
        build_engine(tmp_path / "m.onnx", "tensorrt-rtx", spec, varied)
    assert "override_input_shapes" not in info.value.hint
    static = prepare(
        onnx.load(tmp_path / "m.onnx"), Passes(override_input_shapes=(("x", (1, 2, 8, 16)),))
    )
    save_model(static.model, tmp_path / "static.onnx")
    assert build_engine(tmp_path / "static.onnx", "tensorrt-rtx", spec, held).engine


def test_a_parse_error_without_a_dynamic_dim_keeps_its_hint():
    from trtbuild.engine.backends import UNSUPPORTED_FIX, _parse_fix

    said = "In node 3 (importFoo): UNSUPPORTED_NODE: No importer registered for op: Foo"
    assert _parse_fix(said, None, (), None) == UNSUPPORTED_FIX
    assert _parse_fix("a tensor of 31 dims", None, (), None) == UNSUPPORTED_FIX


def test_the_dynamic_dim_in_a_parse_error_is_found_where_tensorrt_writes_it():
    from trtbuild.engine.backends import _DYNAMIC_DIM

    found = ["as input which is -1.", "dims (-1, 3)", "batch -1 but", "[-1,8]"]
    assert all(_DYNAMIC_DIM.search(s) for s in found)
    assert not any(_DYNAMIC_DIM.search(s) for s in ("x-1", "-10", "-1.5", "n-1 dims", "1e-1"))


def test_a_dim_the_override_names_fits_the_schema_and_stays_shared():
    """The model's dim name where it has one (inputs that share `seq-len` keep sharing it),
    else one made of the input's; either fits `override_input_shapes`' schema."""
    import re

    from trtbuild.engine.backends import _dim_name
    from trtbuild.policy.specs import DIM_NAME

    assert _dim_name(["b", "seq-len"], 1, "input_ids") == "seq_len"
    assert _dim_name(["b", "seq-len"], 1, "attention_mask") == "seq_len"
    assert _dim_name(["", ""], 0, "input.1") == "input_1_0"
    assert _dim_name([], 2, "入力") == "___2"
    assert _dim_name(["2d"], 0, "x") == "_2d"
    names = [_dim_name(d, 0, n) for d, n in ((["s"], "x"), ([], "9"), (["a" * 80], "x"))]
    assert all(re.fullmatch(DIM_NAME, n) for n in names)


@rtx
def test_a_static_shape_in_the_policy_holds_every_dim(tmp_path):
    """`shape:` holds a model's dynamic dim as min = max does, and a name is quoted: YAML
    would read `on` or `null` as no name."""
    from trtbuild.policy.specs import InputSpec

    _rope_model(tmp_path / "m.onnx")
    m = onnx.load(tmp_path / "m.onnx")
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "on"  # a dim YAML misreads
    save_model(m, tmp_path / "named.onnx")
    held = (InputSpec("x", shape=(1, 2, 8, 16)),)
    with pytest.raises(BackendError) as info:
        build_engine(tmp_path / "named.onnx", "tensorrt-rtx", BuildSpec(workspace=1 << 28), held)
    assert '{"x": [1, 2, 8, 16]}' in info.value.hint  # the named dim is held too: a number
    ranged = (InputSpec("x", min=(1, 2, 4, 16), opt=(1, 2, 8, 16), max=(1, 2, 8, 16)),)
    with pytest.raises(BackendError) as info:
        build_engine(tmp_path / "named.onnx", "tensorrt-rtx", BuildSpec(workspace=1 << 28), ranged)
    assert '{"x": [1, 2, "on", 16]}' in info.value.hint


def test_a_hint_that_cannot_be_worked_out_keeps_tensorrts_refusal(tmp_path):
    """The hint reads the model's dim names; where that fails the refusal stands as it was
    (exit 3 with TensorRT's words), never an error of the hint's own."""
    from trtbuild.engine.backends import UNSUPPORTED_FIX, _parse_fix
    from trtbuild.policy.specs import InputSpec

    held = (InputSpec("x", shape=(1, 4)),)
    gone = tmp_path / "moved.onnx"  # the model is no longer there to read
    assert _parse_fix("batch 1 but the input's is -1.", None, held, gone) == UNSUPPORTED_FIX


def test_a_backend_installed_that_does_not_import_is_said_so_not_missing(tmp_path):
    """Under `ulimit -v` TensorRT-RTX's libraries failed to map and `auto` said "no TensorRT
    backend is installed", whose fix (install it) does nothing. A package that raises on
    import stands for it here, in a process of its own (this one keeps the real one)."""
    import subprocess
    import sys

    broken = tmp_path / "site" / "tensorrt_rtx"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise OSError('failed to map segment from shared object')\n"
    )
    probe = (
        "from trtbuild.engine.backends import resolve_backend\n"
        "from trtbuild.errors import BackendError\n"
        "for asked in ('auto', 'tensorrt-rtx'):\n"
        "    try:\n        resolve_backend(asked)\n"
        "    except BackendError as exc:\n        print(exc)\n"
    )
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{Path(__file__).resolve().parents[2]}"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stderr
    for line in lines:
        assert "'tensorrt_rtx' is installed but does not import: failed to map segment" in line
        assert "ulimit -v" in line and "not installed" not in line


@rtx
def test_an_input_that_is_also_an_output_takes_its_profile(tmp_path, capsys):
    """A model whose graph output is its input itself (no node between, as a hand-made or
    converted graph has it): TensorRT's parser renames that input `__x`, and the build was
    exit 2 "inputs.__x: input '__x' has dynamic shape", an input the model does not have.
    The renamed input takes the policy's profile of `x`, and the engine builds."""
    from onnx import TensorProto, helper

    from trtbuild.cli import main

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y, x]
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx"
    )
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {min: [1, 4], opt: [2, 4], max: [4, 4]}\n"
    )
    out = tmp_path / "out"
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "tensorrt-rtx"])
    assert code == 0, capsys.readouterr().err
    assert (out / "engine.plan").stat().st_size > 1000


# Builds a 64 MiB MatMul under an address-space limit a little above what the process
# holds after a first build (MARGIN MiB more): what the command makes of the refusal
# TensorRT meets (its parse's bad_alloc, its build's OutOfMemory or bad_alloc).
_UNDER_LIMIT = """
import json, resource, sys
from pathlib import Path
from trtbuild.engine.backends import build_here
from trtbuild.errors import exit_code_for
from trtbuild.policy.specs import BuildSpec

folder, margin = Path(sys.argv[1]), int(sys.argv[2])
build_here(folder / "small.onnx", "tensorrt-rtx", BuildSpec())  # the libraries loaded
with open("/proc/self/status") as f:
    held = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (held + (margin << 20), resource.RLIM_INFINITY))
try:
    build_here(folder / "big.onnx", "tensorrt-rtx", BuildSpec())
    said = [0, "built"]
except Exception as exc:
    said = list(exit_code_for(exc))
print(json.dumps(said))
"""


@rtx
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmSize")
def test_memory_tensorrt_is_refused_is_exit_2_not_a_fault_of_tensorrts(tmp_path):
    """Under `ulimit -v` (a container's memory limit, a full machine) TensorRT-RTX fails
    the parse ('INTERNAL_ERROR: std::bad_alloc ... check the op is supported') or the
    build ('Error Code 2: OutOfMemory', 'std::bad_alloc'): that was exit 3, TensorRT's
    fault on the model. It is the machine's: exit 2, 'not enough memory' and the fix."""
    import json
    import subprocess
    import sys

    import numpy as np

    from tests.helpers import F, model, node

    relu = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    onnx.save(relu, tmp_path / "small.onnx")
    w = np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32)
    mm = model([node("MatMul", ["x", "w"], "y", "mm")], [("x", F, [1, 4096])], [("y", F, [1, 4096])], {"w": w})  # fmt: skip
    onnx.save(mm, tmp_path / "big.onnx")
    said = []
    # the parse's refusals, then the build's (TensorRT-RTX may deadlock where its own
    # OutOfMemory comes, between these: a try that hangs tells nothing and is left out)
    for margin in (32, 64, 96, 224, 256, 320):
        cmd = [sys.executable, "-c", _UNDER_LIMIT, str(tmp_path), str(margin)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            continue
        assert done.returncode == 0, done.stderr[-3000:]
        said.append(json.loads(done.stdout.splitlines()[-1]))
    refused = [message for code, message in said if code != 0]
    assert refused, said  # the smallest limits refuse
    for code, message in said:
        assert code in (0, 2), said
        assert code == 0 or message.startswith("not enough memory"), message
