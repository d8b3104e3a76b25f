"""The mixed model is checked before any command says it wrote it.

Why: a mixed graph that `onnx.checker` refuses, or that ONNX Runtime will not
load (a weight stored in FP16 behind an input still declared FP32), is a
trtbuild bug however it arose; it must never be written as if it were done.
"""

from __future__ import annotations

import onnx


class InvalidMixedModel(RuntimeError):
    """The converted graph fails a check: a bug in trtbuild (exit 70, with its traceback)."""


def validate_mixed(model: onnx.ModelProto) -> None:
    """`onnx.checker` (full check, with strict shape inference), then an ONNX Runtime session.

    A session that fails only for want of a CPU kernel for a type (ONNX Runtime has
    no BF16 `ReduceMean`) is no fault of the model: TensorRT builds it.
    """
    import onnxruntime as ort

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # the checker's own ValidationError and inference errors
        raise InvalidMixedModel(f"the mixed model fails onnx.checker (full check): {exc}") from exc
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime's own exception types
        if type(exc).__name__ == "NotImplemented":
            return  # no CPU kernel for a type (BF16 ReduceMean): the model is valid, the EP is not
        raise InvalidMixedModel(f"the mixed model does not load in ONNX Runtime: {exc}") from exc
