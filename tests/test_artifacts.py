"""The build's artifacts: the layer audit that proves each FP32 node an FP32 layer."""

from __future__ import annotations

import json

import numpy as np
import onnx

from tests.helpers import F, model, needs_rtx, node
from trtbuild.cli import main


@needs_rtx
def test_the_layer_audit_misses_no_node_that_computes_nothing(tmp_path, capsys):
    """A Swin's FP32 Pad by 0 was warned "the layer audit found no layer named after" it:
    TensorRT's parser makes such a Pad an identity of its own name. A node that computes
    nothing is never missed; the compute nodes around it are still checked."""
    m = model(
        [
            node("Relu", ["x"], "a", "relu"),
            node("Pad", ["a", "pads"], "b", "pad"),
            node("Sigmoid", ["b"], "y", "sig"),
        ],
        [("x", F, [1, 4, 8, 8])],
        [("y", F, [1, 4, 8, 8])],
        {"pads": np.zeros(8, np.int64)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nprecision:\n  rules:\n"
        '    - {id: all, match: {name: ".*"}, precision: fp32}\n'
        "build: {backend: tensorrt-rtx}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    built = json.loads((out / "build.json").read_text())
    assert "pad" not in {layer["name"] for layer in built["layers"]}  # the parser dropped it
    audit = built["layer_audit"]
    assert audit["not_in_network"] == [] and audit["fp32_nodes_checked"] == 2, audit
    assert "layer audit found no layer" not in capsys.readouterr().err
