"""Whether a quantized engine runs INT8 kernels: TensorRT's engine inspector, on a GPU only.

On this CPU-only machine the check must say "not checked: needs a GPU", never guess; the
reading of the inspector's layer information is tested on its documented JSON layout
(`IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import needs_rtx
from trtbuild.cli import main
from trtbuild.engine.backends import NEEDS_GPU, gpu_available, int8_layers

# The inspector's layer information as TensorRT writes it with ProfilingVerbosity.DETAILED
INFORMATION = {
    "Layers": [
        {
            "Name": "x_q + x_dq + w_dq + /conv1/Conv",
            "LayerType": "CaskConvolution",
            "Metadata": "[ONNX Layer: x_q]\x1e[ONNX Layer: w_dq]\x1e[ONNX Layer: /conv1/Conv]",
            "Inputs": [{"Name": "x", "Format/Datatype": "Int8 NC/32HW32"}],
            "Outputs": [{"Name": "c1", "Format/Datatype": "Half NC/8HW8"}],
            "Weights": {"Type": "Int8", "Count": 864},
            "TacticName": "sm89_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32",
        },
        {
            "Name": "/attn/MatMul",
            "LayerType": "gemm",
            "Inputs": [{"Format/Datatype": "Int8"}, {"Format/Datatype": "Int8"}],
            "Outputs": [{"Format/Datatype": "Float"}],
            "TacticName": "sm89_xmma_gemm_i8i8_i8i32_f32_tn",
        },
        {  # an Int8 input reformatted into a float kernel: not INT8 math
            "Name": "/conv2/Conv",
            "LayerType": "CaskConvolution",
            "Inputs": [{"Format/Datatype": "Int8"}],
            "Weights": {"Type": "Float"},
            "TacticName": "sm89_xmma_fprop_f32f32_f32f32_f32",
        },
        {"Name": "/relu", "LayerType": "PointWise", "Inputs": [{"Format/Datatype": "Half"}]},
    ]
}


def test_the_inspector_s_layers_say_which_quantized_ops_run_int8():
    ops = ["/conv1/Conv", "/attn/MatMul", "/conv2/Conv", "/conv3/Conv"]
    found = int8_layers(INFORMATION, ops)
    assert found["int8_layers"] == 2
    assert found["int8_ops"] == ["/conv1/Conv", "/attn/MatMul"]
    assert found["not_int8"] == ["/conv2/Conv", "/conv3/Conv"]  # float kernel; no layer at all


@needs_rtx
@pytest.mark.skipif(gpu_available(), reason="with a GPU the check runs (full TensorRT)")
def test_without_a_gpu_the_int8_kernels_are_said_not_checked(tmp_path, quantized_dir, capsys):
    policy = tmp_path / "q.yaml"
    policy.write_text(
        f"version: 1\nmodel: {quantized_dir / 'nafnet_tiny_int8.onnx'}\n"
        "inputs:\n  input: {shape: [1, 3, 64, 64]}\n"
        "precision: {default: fp16}\n"
        "build: {backend: tensorrt-rtx, variants: false}\n"
        "accuracy: {samples: 1, tolerances: {default: {atol: 1, rtol: 1}}}\n"
    )
    out = tmp_path / "out"
    main(["build", "--policy", str(policy), "--out", str(out)])
    check = json.loads((out / "build.json").read_text())["engines"]["policy"]["int8_kernels"]
    assert check["checked"] is False and check["why"] == NEEDS_GPU
    assert check["quantized_ops"] == 14 and "needs a GPU" in check["evaluator"]
    assert "INT8 kernels (policy" in (out / "report.md").read_text()


@needs_rtx
def test_a_float_model_has_no_int8_check(tmp_path, quantized_dir):
    policy = tmp_path / "f.yaml"
    policy.write_text(
        f"version: 1\nmodel: {quantized_dir / 'nafnet_tiny.onnx'}\n"
        "inputs:\n  input: {shape: [1, 3, 64, 64]}\n"
        "build: {backend: tensorrt-rtx, variants: false}\n"
        "accuracy: {samples: 1, tolerances: {default: {atol: 1e9, rtol: 1}}}\n"
    )
    out = tmp_path / "out"
    main(["build", "--policy", str(policy), "--out", str(out)])
    assert "int8_kernels" not in json.loads((out / "build.json").read_text())["engines"]["policy"]
