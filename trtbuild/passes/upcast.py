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

import functools

import numpy as np
import onnx
from onnx import numpy_helper

from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.optypes import LOW_DTYPES
from trtbuild.passes.basic import PassRecord, copied, rename_values

FLOAT = onnx.TensorProto.FLOAT
# Attributes of the default domain's ops that name an element type (a custom op's are its
# own, so only these; a tensor attribute's type is its data's, in any domain). BitCast's
# `to` reinterprets bits: never a float to widen.
_TYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_datatype", "stash_type", "softmax_precision"})
_REINTERPRETS = frozenset({"BitCast"})


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
        del graph.value_info[:]  # inferred again (a body's too), FP32 now
    record.changed += _keep_interface(model, found)
    record.details = {"from": "/".join(sorted(found))}
    return model, record


def _computes_low(model: onnx.ModelProto) -> bool:
    """Whether any weight, constant, cast, type attribute or body declaration of the model
    is FP16/BF16, or a node other than a Cast reads or makes one of its FP16/BF16 inputs or
    outputs (an FP32 model that only takes FP16 and casts it at once computes in FP32).

    Not `value_info`: a value is FP16 only where one of those makes it so, and reading
    10k declarations took most of this check's time on a 10k-node transformer (every
    `convert` asks it). Only nodes whose op may hold such an attribute are read.
    """
    return _graph_low(model.graph, inside=False) or bool(_low_interface(model))


def _graph_low(graph: onnx.GraphProto, inside: bool) -> bool:
    """`_computes_low` of one graph and the bodies in it (`inside`: a body, whose declared
    inputs and outputs count)."""
    if any(t.data_type in LOW_DTYPES for t in graph.initializer):
        return True
    declared = (*graph.input, *graph.output) if inside else ()
    if any(_tensor_of(v.type).elem_type in LOW_DTYPES for v in declared):
        return True
    for node in graph.node:
        holds_type, holds_bodies = _may_hold(node.domain, node.op_type)
        if holds_type and any(_low_attribute(node, a) for a in node.attribute):
            return True
        if holds_bodies and any(_graph_low(body, True) for _, body in subgraphs.bodies(node)):
            return True
    return False


@functools.cache
def _may_hold(domain: str, op_type: str) -> tuple[bool, bool]:
    """Whether a node of this op may hold a float type in an attribute (a tensor, or an
    element type: `_TYPE_ATTRIBUTES`), and bodies (`subgraphs.may_hold_bodies`), in one
    lookup: every node of the model asks. Any op of another domain may (its attributes
    are its own); the default domain's by their schema, which onnx.checker holds them to."""
    bodies = subgraphs.may_hold_bodies(domain, op_type)
    if domain not in DEFAULT_DOMAINS:
        return True, bodies
    try:
        schema = onnx.defs.get_schema(op_type)
    except onnx.defs.SchemaError:
        return True, bodies
    tensor = onnx.defs.OpSchema.AttrType.TENSOR  # sparse ones are dense by now (`dense_weights`)
    attributes = schema.attributes.items()
    return any(a.type == tensor or name in _TYPE_ATTRIBUTES for name, a in attributes), bodies


def _low_interface(model: onnx.ModelProto) -> set[int]:
    """The FP16/BF16 types of the graph inputs a node other than a Cast reads and of the
    graph outputs such a node makes: where the interface's type is computed in."""
    graph = model.graph
    low = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    low = {name: t for name, t in low.items() if t in LOW_DTYPES}
    if not low:
        return set()
    used: set[int] = set()
    for node in subgraphs.all_nodes(model):
        if node.op_type != "Cast":
            used.update(low[t] for t in [*node.input, *node.output] if t in low)
    return used


def _low_attribute(node: onnx.NodeProto, a: onnx.AttributeProto) -> bool:
    if a.type == onnx.AttributeProto.TENSOR:
        return a.t.data_type in LOW_DTYPES
    default_domain = node.domain in DEFAULT_DOMAINS and node.op_type not in _REINTERPRETS
    return default_domain and a.name in _TYPE_ATTRIBUTES and a.i in LOW_DTYPES


def _upcast_tensors(tensors, found: set[str]) -> int:
    """Each FP16/BF16 tensor of `tensors` as FP32, in place (the same values: exact)."""
    changed = 0
    for k, t in enumerate(tensors):
        if t.data_type not in LOW_DTYPES:
            continue
        found.add(LOW_DTYPES[t.data_type])
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
                found.add(LOW_DTYPES[a.i])
                a.i = FLOAT
                changed += 1
    return changed


def _tensor_of(kind: onnx.TypeProto) -> onnx.TypeProto.Tensor:
    """The tensor type a value's type holds: its own, a sequence's or an optional's elements'."""
    while not kind.HasField("tensor_type"):
        if kind.HasField("sequence_type"):
            kind = kind.sequence_type.elem_type
        elif kind.HasField("optional_type"):
            kind = kind.optional_type.elem_type
        else:
            break
    return kind.tensor_type


def _upcast_declared(values, found: set[str]) -> int:
    """Each declared value of FP16/BF16 elements (a sequence's too) with FP32 elements."""
    changed = 0
    for v in values:
        tensor = _tensor_of(v.type)
        if tensor.elem_type in LOW_DTYPES:
            found.add(LOW_DTYPES[tensor.elem_type])
            tensor.elem_type = FLOAT
            changed += 1
    return changed


def _keep_interface(model: onnx.ModelProto, found: set[str]) -> int:
    """A Cast to FP32 behind each FP16/BF16 graph input, and one back in front of each such
    output: the graph inside computes in FP32, its bindings stay the model's. The types it
    finds computed in go to `found`.

    How: every value of the interface is renamed inside (`rename_values`: reads, makers,
    weights, bodies), its declaration keeps the name the engine binds, and the Cast joins
    the two; an input handed straight out stays the input."""
    graph = model.graph
    found.update(LOW_DTYPES[t] for t in _low_interface(model))
    inputs = [v for v in graph.input if v.type.tensor_type.elem_type in LOW_DTYPES]
    taken = {v.name for v in graph.input}
    outputs = [
        v
        for v in graph.output
        if v.type.tensor_type.elem_type in LOW_DTYPES and v.name not in taken
    ]
    names = {v.name: f"{v.name}/upcast" for v in inputs}
    names.update({v.name: f"{v.name}/fp32" for v in outputs})
    if not names:
        return 0
    rename_values(graph, names)
    back = {new: old for old, new in names.items()}
    for v in (*graph.input, *graph.output):  # the bindings keep their names
        v.name = back.get(v.name, v.name)
    casts = [_cast(v.name, names[v.name], FLOAT) for v in inputs]
    ends = [_cast(names[v.name], v.name, v.type.tensor_type.elem_type) for v in outputs]
    nodes = [*casts, *graph.node, *ends]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(names)


def _cast(source: str, target: str, to: int) -> onnx.NodeProto:
    return onnx.helper.make_node("Cast", [source], [target], name=f"{target}/cast", to=to)
