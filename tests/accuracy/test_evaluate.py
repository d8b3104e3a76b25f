"""The engine runner: Polygraphy's TrtRunner bound to the right TensorRT, no flag left behind."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import needs_rtx
from trtbuild.errors import BackendError
from trtbuild.policy.model import BuildSpec


@needs_rtx
def test_rtx_runner_binds_tensorrt_rtx_and_gives_polygraphys_flag_back(tmp_path):
    from polygraphy import config as pg_config

    from trtbuild.accuracy.evaluate import trt_runner
    from trtbuild.engine.backends import build_engine

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "relu.onnx")
    engine = build_engine(tmp_path / "relu.onnx", "tensorrt-rtx", BuildSpec()).engine

    was = pg_config.USE_TENSORRT_RTX
    runner = trt_runner(engine, "tensorrt-rtx")
    assert pg_config.USE_TENSORRT_RTX is was  # nothing process-wide left flipped
    from polygraphy.backend.trt import runner as pg_runner

    assert pg_runner.trt.__name__ == "tensorrt_rtx"  # the engine's own runtime
    assert runner.rtx and runner.runner.name == "tensorrt"
    # the other flavour cannot share this process: one clear error, not a wrong runtime
    with pytest.raises(BackendError, match="process of its own"):
        trt_runner(engine, "tensorrt")
