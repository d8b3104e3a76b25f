"""Small hand-built graphs for unit tests (real ONNX models, run by real runtimes)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return onnx.shape_inference.infer_shapes(m)


def node(op, ins, outs, name, **attrs):
    return helper.make_node(op, ins, outs if isinstance(outs, list) else [outs], name=name, **attrs)


F, H, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def dtypes(m: onnx.ModelProto) -> dict[str, int]:
    m = onnx.shape_inference.infer_shapes(m)
    out = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in (*m.graph.input, *m.graph.value_info, *m.graph.output)
    }
    out.update({t.name: t.data_type for t in m.graph.initializer})
    return out
