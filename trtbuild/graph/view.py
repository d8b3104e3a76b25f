"""A read-only index over an ONNX graph: producers, consumers, dtypes.

Why: rules, patterns, assignment and conversion all ask the same questions
("who produces this tensor", "is it float"); answering them from one index
keeps each stage a plain function of values.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import cached_property
from typing import Any

import onnx
from onnx import numpy_helper

from trtbuild.graph.model_io import opset_of
from trtbuild.graph.optypes import FLOAT_TYPES, OpTypes, op_types


class GraphView:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.nodes = list(model.graph.node)
        self.opset = opset_of(model)
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.inputs = [i.name for i in model.graph.input if i.name not in self.initializers]
        self.outputs = [o.name for o in model.graph.output]
        self.dtype: dict[str, int] = {}
        self.shape: dict[str, onnx.TypeProto] = {}
        for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
            if vi.type.HasField("tensor_type"):
                self.dtype[vi.name] = vi.type.tensor_type.elem_type
                self.shape[vi.name] = vi.type
        for t in model.graph.initializer:
            self.dtype[t.name] = t.data_type
        self._memo: dict[str, Any] = {}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            for out in node.output:
                if out:
                    self.producer[out] = i
            for inp in node.input:
                if inp:
                    self.consumers[inp].append(i)

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """A structural finding (normalization units, attention blocks) computed once per view.

        Why: several rules, `layernorm_after_attention` and `tune` all ask for the
        same units of the same read-only graph.
        """
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

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
