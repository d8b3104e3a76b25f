"""Peaks of tensors inside bodies, handed out by their control node, for reference and candidate."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from tests.helpers import if_model, scan8_sum, scan_model
from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.probes import probe
from trtbuild.accuracy.reference import body_tensors, float_node_outputs
from trtbuild.graph.view import GraphView
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes, Precision
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert


def _body_tensors(m: onnx.ModelProto) -> set[str]:
    view = GraphView(m)
    return body_tensors(view, float_node_outputs(view))


def _peaks(m: onnx.ModelProto, feed: dict, tensors: set[str] | None = None) -> dict[str, float]:
    """Peaks of `tensors` (the body's float tensors by default), as the judge reads them."""
    probed = probe(m, tensors if tensors is not None else _body_tensors(m))
    session = ort.InferenceSession(
        probed.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return {
        t: float(v) for t, v in probed.peaks(dict(zip(names, session.run(names, feed)))).items()
    }


def test_a_loop_hands_out_each_body_tensor_s_peak_over_its_iterations():
    m = prepare(scan_model(steps=5, gain=1.0), Passes()).model
    x = np.arange(20, dtype=np.float32).reshape(5, 4) - 6
    peaks = _peaks(m, {"x": x})
    assert peaks["acc_out"] == np.abs(np.cumsum(x, axis=0)).max()
    assert peaks["doubled"] == np.abs(2 * x).max()


def test_the_branch_not_taken_has_no_peak():
    m = prepare(if_model(), Passes()).model
    peaks = _peaks(m, {"x": np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)})  # then_branch
    assert peaks["then_out"] == 8.0
    assert "else_out" not in peaks


def test_a_body_tensor_that_overflows_fp16_has_a_non_finite_peak(models_dir):
    prepared = prepare(onnx.load(models_dir / "loop_sum.onnx"), Passes()).model
    emulated = emulate(convert(assign(GraphView(prepared), Precision(default="fp16"))).model)
    feed = {"input": np.random.default_rng(0).uniform(0, 1, (1, 32)).astype(np.float32)}
    tensors = _body_tensors(prepared)  # the judge probes a candidate for the reference's tensors
    reference, candidate = _peaks(prepared, feed), _peaks(emulated, feed, tensors)
    assert 65504 < reference["sum_out"] < 2e5
    assert np.isinf(candidate["sum_out"])
    assert np.isfinite(candidate["step"])


def test_a_model_without_control_flow_is_returned_as_is(nafnet_path):
    m = onnx.load(nafnet_path)
    assert probe(m, {"anything"}).model is m


def test_an_opset_8_scan_is_not_probed_and_its_carried_values_are_counted_after_sequence_lens():
    """Scan-8 takes `sequence_lens` first and carries every value with a batch axis: its
    scalar peaks were inserted as carried values, ONNX Runtime refused the graph, and
    `check` said the model "cannot run" (a false exit 2 on ONNX's scan_sum node test)."""

    from tests.helpers import plain_session
    from trtbuild.graph import subgraphs

    m = scan8_sum()
    assert subgraphs.carried(m.graph.node[0]) == (1, 1, 0, 0)
    probed = probe(m, {"sum_out"})
    feed = {"initial": np.zeros((1, 2), np.float32), "x": np.ones((1, 3, 2), np.float32)}
    assert [y.tolist() for y in plain_session(probed.model).run(None, feed)] == [[[3.0, 3.0]]]
