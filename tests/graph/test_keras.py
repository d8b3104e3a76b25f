"""tf2onnx's Keras forms: GlobalAveragePool LayerNorms (between transposes too) and attention
with Einsum projections and reshapes/squeezes around the Softmax, recognised as whole units."""

from __future__ import annotations

import json

import onnx
import pytest

from tests.conftest import ROOT
from tests.helpers import needs_rtx
from trtbuild.cli import main
from trtbuild.graph.analysis import Analysis
from trtbuild.graph.attention import attention_units, norms_after_attention
from trtbuild.graph.model_io import infer_shapes
from trtbuild.graph.norms import norm_units
from trtbuild.graph.view import GraphView
from trtbuild.passes.fuse import fuse_layernorm


@pytest.fixture(scope="module")
def keras(models_dir) -> GraphView:
    return GraphView(infer_shapes(onnx.load(models_dir / "keras_bert.onnx")))


def _scope(view: GraphView, i: int) -> str:
    return view.nodes[i].name.split("/moments")[0].split("/batchnorm")[0]


def test_every_layernorm_is_one_whole_unit(keras):
    units = norm_units(keras)
    assert len(units) == 5 and {u.axes for u in units} == {((2,), (2,))}
    for unit in units:
        scope = _scope(keras, unit.nodes[0])
        everything = {i for i, n in enumerate(keras.nodes) if n.name.startswith(scope + "/")}
        assert set(unit.nodes) == everything, scope  # transposes, pools, rsqrt and affine


def test_attention_blocks_and_not_the_classifier(keras):
    blocks = attention_units(keras)
    assert len(blocks) == 2 and all(b.kind == "self-attention" for b in blocks)
    names = {keras.nodes[i].name for b in blocks for i in b.nodes}
    assert "/encoder/layer_0/self_attention/einsum/Squeeze" in names
    assert not any("classifier" in n or "Einsum" in n for n in names)


def test_layernorm_after_attention_is_each_layers_first(keras):
    found = Analysis(keras)
    after = norms_after_attention(keras, found.attention_units(), found.norm_units())
    pinned = {_scope(keras, i) for i in after}
    assert pinned == {
        "/encoder/layer_0/self_attention_layer_norm",
        "/encoder/layer_1/self_attention_layer_norm",
    }


def test_fuse_layernorm_fuses_the_pooled_forms(models_dir):
    from trtbuild.passes.opset import upgrade_opset

    model, _ = upgrade_opset(onnx.load(models_dir / "keras_bert.onnx"), 17)
    fused, record = fuse_layernorm(infer_shapes(model))
    assert record.changed == 5
    assert sum(n.op_type == "LayerNormalization" for n in fused.graph.node) == 5
    assert not any(n.op_type == "GlobalAveragePool" for n in fused.graph.node)


@needs_rtx
def test_the_example_policy_builds_with_its_pins_audited(example_policy, tmp_path):
    out = tmp_path / "out"
    assert main(["build", "--policy", str(example_policy("keras_bert")), "--out", str(out)]) == 0
    built = json.loads((out / "build.json").read_text())
    audit = built["layer_audit"]
    assert audit["ok"] and audit["fp32_nodes_checked"] == 2 and not audit["not_in_network"]
    report = json.loads((out / "report.json").read_text())
    assert {p["rule"] for p in report["precision"]["pinned"]} == {"ln-after-attention"}
    assert (ROOT / "policies" / "keras_bert.yaml").exists()
