"""A read-only index over an ONNX graph: producers, consumers, dtypes.

Why: rules, patterns, assignment and conversion all ask the same questions
("who produces this tensor", "is it float"); answering them from one index
keeps each stage a plain function of values.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property

import numpy as np
import onnx
from onnx import numpy_helper

from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.model_io import fed_inputs, opset_of
from trtbuild.graph.optypes import FLOAT_TYPES, SEQUENCE_OPS, OpTypes, op_types


class GraphView:
    """Every node of the model, bodies of control flow included, in one list.

    A body's nodes come right before the `If`/`Loop`/`Scan` that holds them (it
    hands out what they make, and reads their outputs), so producers still come
    first. `scope[i]`: "" in the main graph, `If_0/then_branch` in a body;
    `parent[i]`: the control node around it; `top`: the main graph's nodes.
    """

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.nodes: list[onnx.NodeProto] = []
        self.scope: list[str] = []
        self.parent: list[int | None] = []
        self.body_of: dict[int, list[tuple[str, onnx.GraphProto, list[int]]]] = {}
        self.opset = opset_of(model)
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.dtype: dict[str, int] = {}
        self.shape: dict[str, onnx.TypeProto] = {}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        self.top: list[int] = self._index(model.graph, "", None)
        self.inputs = [i.name for i in fed_inputs(model)]
        self.outputs = [o.name for o in model.graph.output]

    def _index(self, graph: onnx.GraphProto, scope: str, parent: int | None) -> list[int]:
        """Index one graph's nodes (bodies first, recursively); returns their indices."""
        dtype, shape = self.dtype, self.shape
        for vi in (*graph.input, *graph.value_info, *graph.output):  # ~10k: each field read once
            t, name = vi.type, vi.name
            if t.HasField("tensor_type"):  # the first declaration holds
                if name not in dtype:
                    dtype[name] = t.tensor_type.elem_type
                if name not in shape:
                    shape[name] = t
        for t in graph.initializer:
            self.initializers[t.name] = t
            self.dtype[t.name] = t.data_type
        mine = []
        for node in graph.node:
            # indexed first: their nodes come before this one (no attribute: no body)
            held = subgraphs.bodies(node) if node.attribute else ()
            inner = [(a, b, self._index(b, f"{node.name}/{a}", None)) for a, b in held]
            i = self._add(node, scope, parent)
            for _, body, members in inner:
                for k in members:  # indexed before their control node had an index
                    self.parent[k] = i
                for o in body.output:
                    self.consumers[o.name].append(i)
            if inner:
                self.body_of[i] = inner
            mine.append(i)
        return mine

    def _add(self, node: onnx.NodeProto, scope: str, parent: int | None) -> int:
        i = len(self.nodes)
        self.nodes.append(node)
        self.scope.append(scope)
        self.parent.append(parent)
        producer, consumers = self.producer, self.consumers  # read once: ~10k nodes
        for out in node.output:
            if out:
                producer[out] = i
        for inp in node.input:
            if inp:
                consumers[inp].append(i)
        return i

    def is_float(self, tensor: str) -> bool:
        return self.dtype.get(tensor) in FLOAT_TYPES

    def types(self, index: int) -> OpTypes:
        node = self.nodes[index]
        domain = node.domain if node.domain != "ai.onnx" else ""
        opset = self.opset
        if domain:
            opset = next((i.version for i in self.model.opset_import if i.domain == domain), 1)
        return op_types(node.op_type, domain, opset)

    def float_inputs(self, index: int) -> list[str]:
        return [t for t in self.nodes[index].input if t and self.is_float(t)]

    def float_outputs(self, index: int) -> list[str]:
        return [t for t in self.nodes[index].output if t and self.is_float(t)]

    def predecessors(self, index: int) -> list[int]:
        return [self.producer[t] for t in self.nodes[index].input if t in self.producer]

    def successors(self, index: int) -> list[int]:
        return [c for t in self.nodes[index].output for c in self.consumers.get(t, [])]

    @cached_property
    def reaches_output(self) -> list[bool]:
        """For each node: does any of its outputs flow (transitively) to a graph output."""
        flags = [False] * len(self.nodes)
        outs = set(self.outputs)
        for i in range(len(self.nodes) - 1, -1, -1):
            node = self.nodes[i]
            flags[i] = any(o in outs for o in node.output) or any(
                flags[s] for s in self.successors(i)
            )
        return flags

    def initializer_array(self, name: str):
        return numpy_helper.to_array(self.initializers[name])

    def inside(self, index: int) -> list[int]:
        """Every node inside control node `index`'s bodies, nested bodies included."""
        found = []
        for _, _, members in self.body_of.get(index, []):
            for k in members:
                found.extend(self.inside(k))
                found.append(k)
        return sorted(found)


def in_sequences(view: GraphView, index: int) -> bool:
    """Whether node `index` is a sequence op or inside a SequenceMap's body (whose inputs
    and outputs are a sequence's elements): it runs FP32 (`assign`), and the FP32
    reference measures nothing in such a body (`probes`)."""
    k: int | None = index
    while k is not None:
        node = view.nodes[k]
        if node.op_type in SEQUENCE_OPS and node.domain in DEFAULT_DOMAINS:
            return True
        k = view.parent[k]
    return False


def constant(view: GraphView, tensor: str) -> np.ndarray | None:
    """The value of a weight or of a `Constant` node's output; None for any other tensor.

    Why both: `prepare` lifts `Constant`s into weights, but a graph is also read as
    exported, where torch.onnx writes a DQ's scale or a norm's epsilon as a `Constant`.
    """
    if not tensor:
        return None
    if tensor in view.initializers:
        return view.initializer_array(tensor)
    p = view.producer.get(tensor)
    if p is not None and view.nodes[p].op_type == "Constant":
        for attr in view.nodes[p].attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
    return None
