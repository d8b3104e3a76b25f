"""Pipeline behaviour a Makefile relies on: staging, report-only, data sources."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import onnx
import pytest

from tests.helpers import F, model, needs_rtx, node
from trtbuild.cli import main


def test_report_without_rebuilding_keeps_build_artifacts(write_policy, tmp_path):
    out = tmp_path / "out"
    policy = str(write_policy())
    assert main(["build", "--policy", policy, "--out", str(out)]) == 0
    mixed_before = (out / "mixed.onnx").stat().st_mtime_ns
    (out / "report.json").unlink()
    assert main(["report", "--policy", policy, "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["evaluator"] == "emulated-fp16"
    assert (out / "mixed.onnx").stat().st_mtime_ns == mixed_before


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx")
@needs_rtx
def test_report_names_an_engine_it_cannot_run_without_a_gpu(write_policy, tmp_path, capsys):
    from trtbuild.engine.backends import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible: the engine runs")
    out = tmp_path / "out"
    policy = str(write_policy(backend="tensorrt-rtx"))
    assert main(["build", "--policy", policy, "--out", str(out)]) == 0
    capsys.readouterr()
    argv = ["report", "--policy", policy, "--out", str(out), "--engine", str(out / "engine.plan")]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["evaluator"] == "emulated-fp16"
    assert "engine.plan is not run: no GPU" in report["warnings"][0]
    assert "is not run: no GPU" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_rtx") is None, reason="needs tensorrt-rtx")
@needs_rtx
def test_failed_rebuild_leaves_previous_artifacts_intact(write_policy, tmp_path):
    out = tmp_path / "out"
    assert main(["build", "--policy", str(write_policy()), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # Fails inside the engine build, after prepared/mixed models were staged.
    text = write_policy(backend="tensorrt-rtx").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace("variants: false", 'variants: false\n  compute_capabilities: ["9.0"]')
    )
    assert main(["build", "--policy", str(bad), "--out", str(out)]) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _dynamic_model(tmp_path):
    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, ["n", 4])], [("y", F, ["n", 4])])
    path = tmp_path / "dyn.onnx"
    onnx.save(m, path)
    return path


def test_dynamic_input_without_shape_is_exit_2(tmp_path, capsys):
    path = _dynamic_model(tmp_path)
    policy = tmp_path / "p.yaml"
    policy.write_text(f"version: 1\nmodel: {path}\nbuild: {{backend: none}}\n")
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "dynamic shape" in err and "inputs.x" in err


def test_npz_samples_feed_the_comparison(tmp_path):
    path = _dynamic_model(tmp_path)
    samples = np.random.default_rng(0).normal(size=(3, 2, 4)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=samples)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: {path}\n"
        "inputs: {x: {min: [1, 4], opt: [2, 4], max: [8, 4], data: {file: data.npz}}}\n"
        "build: {backend: none}\naccuracy: {samples: 10}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["samples"] == 3  # as many as the file holds


def test_npz_missing_key_names_the_field(tmp_path, capsys):
    path = _dynamic_model(tmp_path)
    np.savez(tmp_path / "data.npz", other=np.zeros((2, 4), np.float32))
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: {path}\ninputs: {{x: {{shape: [2, 4], data: {{file: data.npz}}}}}}\n"
    )
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "inputs.x.data.file" in err and "keys found: other" in err


def test_a_loop_fails_unpinned_naming_the_node_in_its_body_and_passes_pinned(
    example_policy, tmp_path, capsys
):
    """The running sum inside the Loop overflows FP16 after ~40 iterations: the failure says
    where (a body node, by its qualified name); the example policy's pin fixes it."""
    unpinned = example_policy("loop_sum", rules="[]")
    assert (
        main(["build", "--policy", str(unpinned), "-o", str(tmp_path / "u"), "--backend", "none"])
        == 1
    )
    out = capsys.readouterr().out
    assert "first divergence at running_sum/body/accumulate (turns inf where FP32 is finite" in out
    report = json.loads((tmp_path / "u" / "report.json").read_text())
    assert report["first_divergence"]["node"] == "running_sum/body/accumulate"
    pinned = example_policy("loop_sum")
    assert (
        main(["build", "--policy", str(pinned), "-o", str(tmp_path / "p"), "--backend", "none"])
        == 0
    )
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    assert report["precision"]["pinned"] == [
        {"node": "running_sum/body/accumulate", "op": "Add", "rule": "running-sum"}
    ]
    capsys.readouterr()
    assert main(["check", "--policy", str(pinned), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert rows["running_sum/body/accumulate"]["rule"] == "running-sum"
    assert rows["running_sum/body/project"]["precision"] == "fp16"
    assert rows["running_sum"]["rule"] == "control-flow"


@needs_rtx
def test_yolov8_builds_with_tensorrt_rtx_over_a_dynamic_profile(real_model, tmp_path):
    """YOLOv8n as exported (anchors made from its feature maps' shapes, Range in FP32): the
    policy's engine and its all-FP16/FP32 variants build. Before, each Cast of a width was
    made FP16 and cast back for its Range, which TensorRT-RTX refused (exit 3)."""
    policy = tmp_path / "yolo.yaml"
    policy.write_text(
        f"version: 1\nmodel: {real_model('yolov8n')}\n"
        "inputs:\n  images: {min: [1, 3, 320, 320], opt: [1, 3, 320, 320], max: [1, 3, 640, 640]}\n"
        "accuracy:\n  samples: 1\n"
        "  tolerances:\n    default: {atol: 0.5, rtol: 0.01, check_error_stat: median}\n"
        "build: {backend: tensorrt-rtx}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    built = json.loads((out / "build.json").read_text())
    assert (out / "engine.plan").stat().st_size > 1_000_000
    assert set(built["engines"]) >= {"policy", "fp16", "fp32"}


@needs_rtx
def test_a_variant_tensorrt_refuses_is_a_warning_and_the_policys_engine_is_built(tmp_path, capsys):
    """The all-FP16 variant of a resize by the input's size (its scale computed in FP16,
    which TensorRT-RTX refuses in a shape computation) failed the whole build (exit 3),
    though the policy's engine, its shape arithmetic in FP32, builds."""
    from tests.helpers import resize_by_shape

    onnx.save(resize_by_shape(), tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {min: [1, 3, 64, 64], opt: [1, 3, 100, 150], "
        'max: [1, 3, 128, 192]}\nbuild: {compute_capabilities: ["8.9"]}\n'
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(tmp_path / "p.yaml"), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: the all-FP16 variant's engine did not build (" in err, err
    assert "\\n" not in err  # TensorRT's lines joined, not escaped
    record = json.loads((out / "build.json").read_text())
    assert set(record["engines"]) == {"policy", "fp32"} and (out / "engine.plan").stat().st_size
    assert any(w.startswith("the all-FP16 variant's engine") for w in record["warnings"])
