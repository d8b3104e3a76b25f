"""Real TensorRT-RTX builds on the CPU (no GPU needed to build)."""

from __future__ import annotations

import importlib.util

import onnx
import pytest

from tests.helpers import needs_rtx
from trtbuild.engine.backends import build_engine, resolve_backend
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
