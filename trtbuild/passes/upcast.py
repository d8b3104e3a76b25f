"""Make a model that computes in FP16 or BF16 compute in FP32, its interface kept.

Why: trtbuild judges FP16 against the FP32 computation of the network, and the policy
decides what runs in FP16. A model exported in half precision (`model.half()`,
onnxconverter-common's output) or quantized by ModelOpt with its default
`--high_precision_dtype fp16` has no FP32 computation to judge against: its own run
overflowed where the policy would keep FP32 ("the FP32 reference holds inf"), and a rule
could not make an FP16 op FP32. Its weights are FP16 values, exact in FP32, so the FP32
network is the one its weights define; the policy then chooses again, node by node.

What changes: every FP16/BF16 weight, constant and Q/DQ scale becomes FP32, every
`Cast` (or `dtype`) to FP16/BF16 casts to FP32, and bodies' declared types follow. The
graph's own inputs and outputs keep their declared types: an FP16 input is cast to FP32
where it enters, an FP16 output is cast from FP32 where it leaves, so the engine's
bindings are the model's.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtbuild.graph import subgraphs
from trtbuild.graph.optypes import LOW_DTYPES as LOW_TYPES
from trtbuild.passes.basic import PassRecord, copied

FLOAT = onnx.TensorProto.FLOAT
_TYPE_ATTRIBUTES = frozenset({"to", "dtype"})  # an element type, in the default domain's ops


def upcast_low_precision(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """`model` computing in FP32 where it computed in FP16 or BF16; the record counts the
    weights, constants and casts changed, and names the low types found."""
    record = PassRecord("upcast")
    if not _computes_low(model):
        return model, record
    model = copied(model)  # passes never change their input
    found: set[str] = set()
    record.changed += _upcast_tensors(model.graph.initializer, found)
    for scope, graph in subgraphs.walk(model.graph):
        record.changed += _upcast_nodes(graph, found)
        if scope:  # a body's declared inputs and outputs are the model's inside
            record.changed += _upcast_declared([*graph.input, *graph.output], found)
    del model.graph.value_info[:]  # inferred again, FP32 now
    record.changed += _keep_interface(model)
    record.details = {"from": "/".join(sorted(found))}
    return model, record


def _computes_low(model: onnx.ModelProto) -> bool:
    """Whether any weight, constant, cast or declared value of the model is FP16/BF16."""
    if any(t.data_type in LOW_TYPES for t in model.graph.initializer):
        return True
    for scope, graph in subgraphs.walk(model.graph):
        declared = [*graph.value_info, *graph.input, *graph.output]
        if any(v.type.tensor_type.elem_type in LOW_TYPES for v in declared):
            return True
        if scope and any(t.data_type in LOW_TYPES for t in graph.initializer):
            return True
        for node in graph.node:
            if any(_low_attribute(node, a) for a in node.attribute):
                return True
    return False


def _low_attribute(node: onnx.NodeProto, a: onnx.AttributeProto) -> bool:
    if a.type == onnx.AttributeProto.TENSOR:
        return a.t.data_type in LOW_TYPES
    default_domain = node.domain in ("", "ai.onnx")
    return default_domain and a.name in _TYPE_ATTRIBUTES and a.i in LOW_TYPES


def _upcast_tensors(tensors, found: set[str]) -> int:
    """Each FP16/BF16 tensor of `tensors` as FP32, in place (the same values: exact)."""
    changed = 0
    for k, t in enumerate(tensors):
        if t.data_type not in LOW_TYPES:
            continue
        found.add(LOW_TYPES[t.data_type])
        wide = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
        tensors[k].CopyFrom(wide)
        changed += 1
    return changed


def _upcast_nodes(graph: onnx.GraphProto, found: set[str]) -> int:
    """A body's weights, each node's FP16/BF16 tensor attribute (a `Constant`'s value,
    `ConstantOfShape`'s) and element type attribute (`Cast`'s `to`, a `dtype`) as FP32."""
    changed = _upcast_tensors(graph.initializer, found) if graph.initializer else 0
    for node in graph.node:
        for a in node.attribute:
            if not _low_attribute(node, a):
                continue
            if a.type == onnx.AttributeProto.TENSOR:
                changed += _upcast_tensors([a.t], found)
            else:
                found.add(LOW_TYPES[a.i])
                a.i = FLOAT
                changed += 1
    return changed


def _upcast_declared(values, found: set[str]) -> int:
    changed = 0
    for v in values:
        tensor = v.type.tensor_type
        if tensor.elem_type in LOW_TYPES:
            found.add(LOW_TYPES[tensor.elem_type])
            tensor.elem_type = FLOAT
            changed += 1
    return changed


def _keep_interface(model: onnx.ModelProto) -> int:
    """A Cast to FP32 behind each FP16/BF16 graph input, and one back in front of each such
    output: the graph inside computes in FP32, its bindings stay the model's."""
    graph = model.graph
    casts: list[onnx.NodeProto] = []
    for value in graph.input:
        low = value.type.tensor_type.elem_type
        if low in LOW_TYPES:
            wide = f"{value.name}/upcast"
            _rename_reads(graph, value.name, wide)
            casts.append(_cast(value.name, wide, FLOAT))
    ends: list[onnx.NodeProto] = []
    inputs = {i.name for i in graph.input}
    for value in graph.output:
        low = value.type.tensor_type.elem_type
        if low in LOW_TYPES and value.name not in inputs:  # an input handed out stays it
            wide = f"{value.name}/fp32"
            _rename_made(graph, value.name, wide)
            ends.append(_cast(wide, value.name, low))
    nodes = [*casts, *graph.node, *ends]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(casts) + len(ends)


def _cast(source: str, target: str, to: int) -> onnx.NodeProto:
    return onnx.helper.make_node("Cast", [source], [target], name=f"{target}/cast", to=to)


def _rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of `old` (bodies' outer reads included, where no body defines it) as `new`."""
    for scope, g in subgraphs.walk(graph):
        if scope and old in subgraphs.defined_in(g):
            continue
        for node in g.node:
            node.input[:] = [new if t == old else t for t in node.input]
        for out in g.output if scope else []:
            if out.name == old:  # a body handing the outer value straight out
                out.name = new


def _rename_made(graph: onnx.GraphProto, old: str, new: str) -> None:
    """The value `old` the main graph makes, a node's output or a weight (and every read of
    it), as `new`."""
    for node in graph.node:
        node.output[:] = [new if t == old else t for t in node.output]
    for t in graph.initializer:
        if t.name == old:
            t.name = new
    _rename_reads(graph, old, new)
