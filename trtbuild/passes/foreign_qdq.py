"""Other runtimes' Q/DQ made ONNX's: ONNX Runtime's (`com.microsoft`) and TensorRT's FP8.

Why a pass of its own: ONNX Runtime's `quantize_static` writes its own Q/DQ where the
model's opset has no ONNX Q/DQ of the type asked (INT4 weights below opset 21) or where
asked to (`UseQDQContribOps`); ModelOpt's torch FP8 quantizers export TensorRT's
(`trt::TRT_FP8QuantizeLinear`), which ONNX Runtime does not have (exit 2, "give the model
as exported", to a model as exported). The same computations: TensorRT's parser reads
ONNX's as its own. Left as they were, no Q/DQ of them was seen: `check` said 100% FP16, the
DQs were not kept in front of the ops they feed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.optypes import QUANTIZE
from trtbuild.graph.qdq import FOREIGN_FORMATS, foreign_qdq
from trtbuild.graph.subgraphs import free_name
from trtbuild.passes.basic import PassRecord, copied


def standard_qdq(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Other runtimes' `QuantizeLinear`/`DequantizeLinear` made ONNX's (`FOREIGN_QDQ`), at
    the opset their types need (`prepare` upgrades to it first).

    A TensorRT FP8 Q gets the zero point that makes ONNX's quantize to E4M3 (zero, of its
    scale's shape) and its output is declared E4M3 (torch.onnx types it uint8), as
    ModelOpt's own FP8 exporter makes them; a TensorRT FP8 DQ reads that output, or an FP8
    weight stored as uint8 bytes (typed E4M3 then, the bytes kept).
    """
    record = PassRecord("standard_qdq")
    if not any(foreign_qdq(n) for n in subgraphs.all_nodes(model)):
        return model, record
    model = copied(model)  # passes never change their input
    typing = _Fp8Typing(model)
    for _, graph in subgraphs.walk(model.graph):
        for node in graph.node:
            op = foreign_qdq(node)
            if op is None:
                continue
            kind = FOREIGN_FORMATS.get(node.domain)
            node.domain, node.op_type = "", op
            record.changed += 1
            if kind is not None:
                typing.converted(graph, node, kind)
    typing.finish()
    used = {n.domain for n in subgraphs.all_nodes(model)}
    kept = [o for o in model.opset_import if o.domain in used or o.domain in DEFAULT_DOMAINS]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model, record


class _Fp8Typing:
    """The types a TensorRT FP8 Q/DQ leaves to its ONNX form: each Q's zero point and
    output type, each DQ's input checked (and a uint8 weight typed E4M3) once every Q is
    converted."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.taken = {n.name for n in subgraphs.all_nodes(model)}
        for _, graph in subgraphs.walk(model.graph):
            self.taken.update(subgraphs.defined_in(graph))
        self.retyped: dict[str, int] = {}  # each Q's output -> its quantized type
        self.dqs: list[tuple[onnx.NodeProto, int]] = []
        self.tensors = subgraphs.held_tensors(model)  # a change to one is the model's
        self._inferred: dict[str, list[int] | None] | None = None

    def converted(self, graph: onnx.GraphProto, node: onnx.NodeProto, kind: int) -> None:
        if node.op_type != QUANTIZE:
            self.dqs.append((node, kind))
            return
        if len(node.input) < 3:  # ONNX's Q quantizes to its zero point's type
            zero = free_name(f"{node.name or node.output[0]}/zero_point", self.taken)
            self.taken.add(zero)
            dims = self._scale_dims(node)
            raw = bytes(int(np.prod(dims)))
            graph.initializer.append(helper.make_tensor(zero, kind, dims, raw, raw=True))
            node.input.append(zero)
        self.retyped[node.output[0]] = kind

    def finish(self) -> None:
        """Each DQ's input: a converted Q's output, or an FP8 weight stored as uint8; the
        Q outputs declared in their type."""
        for node, kind in self.dqs:
            x = node.input[0]
            if x in self.retyped:
                continue
            held = self.tensors.get(x)
            if held is None or held.data_type not in (onnx.TensorProto.UINT8, kind):
                raise UsageError(
                    f"TensorRT's FP8 DequantizeLinear {node.name} reads {x}, which is neither "
                    "the output of an FP8 QuantizeLinear nor an FP8 weight",
                    hint="export the model with ModelOpt's FP8 exporter (native ONNX Q/DQ)",
                )
            if held.data_type == onnx.TensorProto.UINT8:  # the E4M3 bits, as bytes
                raw = held.raw_data or bytes(np.asarray(held.int32_data, np.uint8))
                held.ClearField("int32_data")
                held.data_type, held.raw_data = kind, raw
        for _, graph in subgraphs.walk(self.model.graph):
            for vi in (*graph.value_info, *graph.output):
                typed = vi.type.tensor_type
                typed.elem_type = self.retyped.get(vi.name, typed.elem_type)

    def _scale_dims(self, node: onnx.NodeProto) -> list[int]:
        """The dims of the Q's scale: a weight's or a `Constant`'s, else inferred; a scale
        of unknown rank is refused (a scalar zero point would not fit a per-channel one)."""
        scale = node.input[1]
        held = self.tensors.get(scale)
        if held is not None:
            return list(held.dims)
        if self._inferred is None:
            from trtbuild.graph.model_io import infer_shapes

            self._inferred = _shapes_of(infer_shapes(self.model))
        dims = self._inferred.get(scale)
        if dims is None:
            raise UsageError(
                f"TensorRT's FP8 QuantizeLinear {node.name}: the shape of its scale {scale} "
                "is not known, and ONNX's QuantizeLinear needs a zero point of that shape",
                hint="export the model with ModelOpt's FP8 exporter (native ONNX Q/DQ), or "
                "give the scale as a weight",
            )
        return dims


def _shapes_of(model: onnx.ModelProto) -> dict[str, list[int] | None]:
    """Each value's dims where every one is a number (None where any is not)."""
    found: dict[str, list[int] | None] = {}
    for _, graph in subgraphs.walk(model.graph):
        for vi in (*graph.value_info, *graph.input, *graph.output):
            t = vi.type.tensor_type
            if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
                found[vi.name] = [d.dim_value for d in t.shape.dim]
    return found
