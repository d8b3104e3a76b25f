"""The structural findings: weight peaks measured in batches, as one weight at a time would."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto, numpy_helper

from tests.helpers import F, model, node
from trtbuild.graph import analysis
from trtbuild.graph.analysis import Analysis
from trtbuild.graph.view import GraphView
from trtbuild.numerics import finite_peak


def _weights(**arrays) -> GraphView:
    """A model whose Sum reads every weight (each one an initializer of its own type)."""
    m = model([node("Sum", ["x"], "y", "sum")], [("x", F, [2])], [("y", F, [2])])
    for name, a in arrays.items():
        t = numpy_helper.from_array(a, name)
        if a.dtype == ml_dtypes.bfloat16:  # numpy_helper stores bf16 as its bits: say so
            t = numpy_helper.from_array(a.view(np.uint16), name)
            t.data_type = TensorProto.BFLOAT16
        m.graph.initializer.append(t)
    return GraphView(m)


def test_weight_peaks_in_batches_are_each_weights_own(monkeypatch):
    monkeypatch.setattr(analysis, "_BATCH_BYTES", 64)  # several batches, and weights beyond one
    rng = np.random.default_rng(0)
    arrays = {
        f"w{k}": rng.normal(0, 10 ** (k % 5), size=k + 1).astype(np.float32) for k in range(40)
    }
    arrays["half"] = np.array([-3.5, np.inf, 1.0], dtype=np.float16)
    arrays["nan"] = np.array([np.nan, -2.0, 1.0], dtype=np.float32)
    arrays["inf_only"] = np.array([np.inf, -np.inf], dtype=np.float32)
    arrays["wide"] = rng.normal(0, 1e6, size=100).astype(np.float64)  # not a float of FLOAT_TYPES
    arrays["bf16"] = np.array([1.0, -300.0], dtype=ml_dtypes.bfloat16)
    arrays["ints"] = np.arange(5, dtype=np.int64)  # no float: no peak
    view = _weights(**arrays)
    peaks = Analysis(view).weight_peaks()
    want = {n: finite_peak(view.initializer_array(n)) for n in arrays if n not in ("ints", "wide")}
    assert peaks == want
    assert peaks["half"] == 3.5 and peaks["nan"] == 2.0 and peaks["inf_only"] == 0.0
    assert peaks["bf16"] == 300.0
