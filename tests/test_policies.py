"""Every example policy, built for real: the mixed model is valid and TensorRT-RTX keeps each pin.

Why end to end: the patterns are only worth something if the nodes they pin
reach the engine as FP32 layers. The parsed network names each layer after its
ONNX node, so the build's layer audit can prove it without a GPU.
"""

from __future__ import annotations

import json
import re

import onnx
import pytest

from tests.conftest import FETCHED, ROOT, local_data
from tests.helpers import needs_rtx
from trtbuild.cli import main
from trtbuild.precision.validate import validate_mixed

POLICIES = sorted((ROOT / "policies").glob("*.yaml"))


def _localise(policy, tmp_path, models_dir, real_model):
    """The committed policy with its model pointing at this test session's copy."""
    text = policy.read_text()
    stem = re.search(r"^model: \.\./models/(\w+)\.onnx", text, re.M).group(1)
    path = real_model(stem) if stem in FETCHED else models_dir / f"{stem}.onnx"
    local = tmp_path / policy.name
    text = text.replace(f"../models/{stem}.onnx", str(path))
    # a quantized model's reference_model: the session's float model beside it
    text = re.sub(r"\.\./models/(\w+)\.onnx", lambda m: str(models_dir / f"{m[1]}.onnx"), text)
    local.write_text(local_data(text))
    return local


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.stem)
@needs_rtx
def test_policy_builds_and_every_pinned_node_is_an_fp32_layer(
    policy, tmp_path, quantized_dir, real_model, capsys
):
    """`quantized_dir`: the session's models with the INT8 ones `make models` writes."""
    local = _localise(policy, tmp_path, quantized_dir, real_model)
    out = tmp_path / "out"
    code = main(["build", "--policy", str(local), "--out", str(out), "--backend", "tensorrt-rtx"])
    assert code == 0, (out / "report.md").read_text() if (out / "report.md").exists() else code

    # onnx.checker's full check and an ONNX Runtime session (which has no CPU kernel for
    # some BF16 ops: the model is valid, the execution provider is not)
    validate_mixed(onnx.load(out / "mixed.onnx"))

    build = json.loads((out / "build.json").read_text())
    report = json.loads((out / "report.json").read_text())
    audit = build["layer_audit"]
    assert audit["ok"], audit["mismatched"]
    assert audit["not_in_network"] == []
    capsys.readouterr()
    assert main(["check", "--policy", str(local), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["nodes"]
    fp32 = [r["node"] for r in rows if r["precision"] == "fp32"]  # data movement included
    assert audit["fp32_nodes_checked"] == len(fp32) >= report["precision"]["fp32_nodes"]
    hits = report["precision"]["rule_hits"]
    if any(v for k, v in hits.items() if not k.startswith("guard:")):
        assert report["precision"]["fp32_nodes"] > 0
    assert report["passed"]


@needs_rtx
def test_silero_vad_pins_reach_the_engine_by_their_names_inside_the_branches(
    example_policy, tmp_path
):
    """A rule naming a node of the 16 kHz branch (the LSTM, and the data movement around it
    inside the shape-check Ifs that stay control flow) reaches TensorRT-RTX as FP32 layers."""
    rule = "[{id: rnn, match: {name: '^If_0/then_branch/.*/decoder/'}, precision: fp32}]"
    policy = example_policy("silero_vad", rules=rule)
    out = tmp_path / "out"
    assert (
        main(["build", "--policy", str(policy), "-o", str(out), "--backend", "tensorrt-rtx"]) == 0
    )
    audit = json.loads((out / "build.json").read_text())["layer_audit"]
    report = json.loads((out / "report.json").read_text())
    pinned = [p["node"] for p in report["precision"]["pinned"]]
    assert any("/decoder/rnn/LSTM" in n for n in pinned)
    assert audit["ok"] and audit["not_in_network"] == []
    assert audit["fp32_nodes_checked"] >= len(pinned) > 0


@needs_rtx
def test_silero_vad_if_on_its_sample_rate_does_not_build_with_tensorrt_rtx(
    example_policy, tmp_path, capsys
):
    """Why the Silero policies freeze `sr` (README, Control flow): TensorRT-RTX stops on the
    unfrozen If. When this test fails, TensorRT-RTX builds it, and the freeze can go."""
    sr = "  sr:\n    shape: []\n    data: {distribution: uniform, low: 16000, high: 16001}\n"
    policy = example_policy(
        "silero_vad",
        replace={"passes:\n": f"{sr}passes: {{}}\n", "  freeze_inputs: {sr: 16000}\n": ""},
    )
    out = tmp_path / "out"
    code = main(["build", "--policy", str(policy), "-o", str(out), "--backend", "tensorrt-rtx"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "tensorrt-rtx engine build failed" in err and "graphScope.cpp" in err


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.stem)
def test_example_data_exercises_the_model(policy, tmp_path, quantized_dir, real_model, capsys):
    """No example policy is judged on data its model does not answer: an output constant or
    nearly so at a point (`evaluation.flat_outputs`) is a pass that proves nothing (#42).
    `quantized_dir`: the session's models with the INT8 ones `make models` writes."""
    local = _localise(policy, tmp_path, quantized_dir, real_model)
    assert main(["check", "--policy", str(local), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    flat = [w for w in warnings if w.startswith("data does not exercise the model")]
    assert not flat, flat
