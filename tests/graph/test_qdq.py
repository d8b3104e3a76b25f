"""The Q/DQ index on ONNX Runtime INT8 models made by the project's script."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from trtbuild.graph.analysis import Analysis
from trtbuild.graph.qdq import QdqGraph, fp8_capable, holds
from trtbuild.graph.view import GraphView


def _qdq(path) -> QdqGraph:
    return Analysis(GraphView(onnx.load(path))).qdq()


def test_inventory_of_the_int8_cnn(quantized_dir):
    q = _qdq(quantized_dir / "nafnet_tiny_int8.onnx")
    inv = q.inventory()
    assert inv["quantized_ops"] == {"int8": 14}  # every Conv of nafnet_tiny
    assert inv["dq_fed"]["Conv"] == 14
    assert set(inv["pairs"]) == {"int8"}
    assert all(n.symmetric for n in q.nodes.values())
    weights = [n for n in q.nodes.values() if n.is_dq and n.axis is not None]
    assert weights and all(n.scale_value.size > 1 for n in weights)  # per-channel


def test_groups_join_a_q_with_its_dqs(quantized_dir):
    q = _qdq(quantized_dir / "transformer_tiny_int8.onnx")
    assert q.inventory()["quantized_ops"] == {"int8": 18}  # every MatMul
    for g in q.groups:
        if g.q is not None:
            assert g.dqs, "ONNX Runtime's Q always feeds a DQ"
            assert all(q.nodes[d].quantized == q.nodes[g.q].quantized for d in g.dqs)
        else:
            assert len(g.dqs) == 1 and q.nodes[g.dqs[0]].quantized in q.view.initializers
    assert sorted(m for g in q.groups for m in g.members) == sorted(q.nodes)


def test_asymmetric_zero_points_are_seen(quantized_dir):
    q = _qdq(quantized_dir / "nafnet_tiny_asym.onnx")
    assert any(not n.symmetric for n in q.nodes.values())
    assert "uint8" in q.inventory()["pairs"]  # ONNX Runtime's default asymmetric activations


def test_float_model_has_none(nafnet_path):
    q = _qdq(nafnet_path)
    assert not q and q.inventory()["pairs"] == {} and q.quantized_ops == {}


def test_holds_refuses_what_fp16_cannot_keep():
    assert holds(np.array([0.02, 1.0]), TensorProto.FLOAT16)
    assert not holds(np.array([3e-10]), TensorProto.FLOAT16)  # 0 in FP16
    assert not holds(np.array([1e-6]), TensorProto.FLOAT16)  # subnormal
    assert not holds(np.array([7e4]), TensorProto.FLOAT16)
    assert holds(np.array([3e-10]), TensorProto.FLOAT)
    assert not holds(None, TensorProto.FLOAT)  # not a constant


def test_fp8_needs_ada():
    assert fp8_capable("8.9") and fp8_capable("12.0")
    assert not fp8_capable("8.6") and not fp8_capable("7.5")
