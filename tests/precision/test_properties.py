"""Property tests: precision assignment on random graphs keeps the model valid.

Whatever the graph and whatever the rules, the mixed model must pass
`onnx.checker`, keep the graph's input and output dtypes, leave integer
tensors alone, run in ONNX Runtime, and its FP16-storage emulation must run too.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from trtbuild.accuracy.emulate import emulate
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Match, Passes, Precision, Rule
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert

F = TensorProto.FLOAT
UNARY = ("Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Exp")
BINARY = ("Add", "Mul", "Sub")
OPS = (*UNARY, *BINARY, "MatMul", "ReduceMean", "Softmax", "LayerNormalization", "Reshape", "Cast")


@st.composite
def graphs(draw) -> onnx.ModelProto:
    """A random DAG over [2, 8] and [2, 1] float tensors, with an int64 shape path."""
    nodes, inits = [], []
    pool = [("x", (2, 8))]
    n = draw(st.integers(2, 14))
    for i in range(n):
        op = draw(st.sampled_from(OPS))
        name, out = f"n{i}_{op}", f"t{i}"
        a, shape = draw(st.sampled_from(pool))
        if op in UNARY:
            nodes.append(helper.make_node(op, [a], [out], name=name))
        elif op in BINARY:
            b, shape_b = draw(st.sampled_from(pool))
            shape = (2, 8) if (2, 8) in (shape, shape_b) else (2, 1)
            nodes.append(helper.make_node(op, [a, b], [out], name=name))
        elif op == "MatMul":
            k = shape[1]
            w = f"w{i}"
            inits.append(numpy_helper.from_array(np.full((k, 8), 0.1, np.float32), w))
            nodes.append(helper.make_node(op, [a, w], [out], name=name))
            shape = (2, 8)
        elif op == "ReduceMean":
            nodes.append(helper.make_node(op, [a], [out], name=name, axes=[-1], keepdims=1))
            shape = (2, 1)
        elif op == "Softmax":
            nodes.append(helper.make_node(op, [a], [out], name=name, axis=-1))
        elif op == "LayerNormalization":
            g = f"g{i}"
            inits.append(numpy_helper.from_array(np.ones(shape[1], np.float32), g))
            nodes.append(helper.make_node(op, [a, g], [out], name=name, axis=-1))
        elif op == "Reshape":  # through an int64 shape computed in the graph
            nodes.append(helper.make_node("Shape", [a], [f"s{i}"], name=f"{name}_shape"))
            nodes.append(helper.make_node(op, [a, f"s{i}"], [out], name=name))
        else:  # a Cast the exporter wrote: FLOAT -> FLOAT
            nodes.append(helper.make_node(op, [a], [out], name=name, to=F))
        pool.append((out, shape))
    produced = pool[1:]
    k = draw(st.integers(1, min(3, len(produced))))
    outputs = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=k, unique=True))
    graph = helper.make_graph(
        nodes,
        "random",
        [helper.make_tensor_value_info("x", F, [2, 8])],
        [helper.make_tensor_value_info(t, F, list(s)) for t, s in outputs],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


@st.composite
def precisions(draw, names: list[str]) -> Precision:
    rules = []
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["op", "name", "softmax", "final", "layernorm"]))
        if kind == "op":
            match = Match(op=tuple(draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=3))))
        elif kind == "name":
            match = Match(name="^" + draw(st.sampled_from(names)) + "$")
        elif kind == "softmax":
            match = Match(pattern="softmax")
        elif kind == "final":
            match = Match(pattern="final_reductions", last=draw(st.integers(1, 3)))
        else:
            match = Match(pattern="layernorm")
        rules.append(Rule(f"r{i}", match, draw(st.sampled_from(["fp32", "fp16", "bf16"]))))
    return Precision(default=draw(st.sampled_from(["fp16", "fp32", "bf16"])), rules=tuple(rules))


def _io(m: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(v.name, v.type.tensor_type.elem_type) for v in (*m.graph.input, *m.graph.output)]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_mixed_model_is_valid_keeps_io_and_runs(data):
    source = data.draw(graphs())
    prepared = prepare(source, Passes()).model
    names = [n.name for n in prepared.graph.node]
    precision = data.draw(precisions(names))
    mixed = convert(assign(prepared, precision)).model

    onnx.checker.check_model(mixed, full_check=True)
    assert _io(mixed) == _io(prepared)
    inferred = onnx.shape_inference.infer_shapes(mixed)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    for n in inferred.graph.node:
        if n.op_type == "Shape":  # integer tensors never change type
            assert types.get(n.output[0], TensorProto.INT64) == TensorProto.INT64

    x = {"x": np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}
    want = ort.InferenceSession(prepared.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = want.run(None, x)
    emulated = emulate(mixed)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(
        emulated.SerializeToString(), options, providers=["CPUExecutionProvider"]
    ).run(None, x)
    assert [g.shape for g in got] == [r.shape for r in ref]
    assert all(g.dtype == np.float32 for g in got)
    if "bf16" not in (precision.default, *(r.precision for r in precision.rules)):
        session = ort.InferenceSession(
            mixed.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        assert [o.shape for o in session.run(None, x)] == [r.shape for r in ref]
