"""Quantized (Q/DQ) structure of a graph: pairs, formats, scales, zero points, DQ-fed ops.

Why one module: TensorRT 11 and TensorRT-RTX take INT8/FP8 only as explicit
`QuantizeLinear`/`DequantizeLinear` pairs, and every stage asks the same
questions of them: `check` (TensorRT's rules, the inventory), assignment (a DQ
follows the op it feeds; Q/DQ are never pinned), conversion (a scale's type is
the op's float precision; one scale value per pair), the shares (INT8 and FP8
compute beside FP16/FP32), `tune` (Q/DQ are no candidates) and the passes that
see through a Q→DQ pair. Answering them from one read-only index keeps them
consistent. Nothing here changes the graph.

Vocabulary:
- a *Q/DQ node*: a `QuantizeLinear` or `DequantizeLinear`;
- a *group* (a "pair"): one Q and every DQ that reads its output (an
  activation's quantization), or one DQ of a constant (a weight's). TensorRT
  takes one scale for the whole group, so a group keeps one scale value;
- *DQ-fed*: a node with an input produced directly by a DQ;
- a *quantized op*: a Conv/ConvTranspose/MatMul/Gemm whose data and weight
  inputs are both DQ outputs: TensorRT fuses the DQs into an INT8 (FP8) kernel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, numpy_helper

from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.optypes import DEQUANTIZE, LOW_DTYPES, QDQ_OPS, QUANTIZE
from trtbuild.graph.subgraphs import held_tensors
from trtbuild.graph.view import GraphView, constant
from trtbuild.numerics import LOW_MAX, LOW_TINY, has_kernels, oldest_capability

# The ops TensorRT fuses with the DQs in front of them into one quantized kernel; the
# residual Add after a quantized Conv is fused too when one of its inputs is DQ-fed.
FUSED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
RESIDUAL_OPS = frozenset({"Add"})
# Ops that only move a DQ's values (PyTorch's `x @ W.T` exports DQ -> Transpose -> MatMul):
# TensorRT propagates the DQ through them into the op behind, so they must compute in that
# op's precision, or a Cast between them would stand between the DQ and its op.
LAYOUT_OPS = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
FORMATS = {
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.FLOAT8E4M3FN: "fp8",
    TensorProto.FLOAT8E5M2: "fp8e5m2",
    TensorProto.INT4: "int4",
    TensorProto.UINT4: "uint4",
    TensorProto.INT16: "int16",
    TensorProto.UINT16: "uint16",
    TensorProto.INT32: "int32",
}
# The quantized types TensorRT takes in a Q/DQ pair (INT4: weight-only DQs)
TENSORRT_FORMATS = frozenset({"int8", "fp8", "int4"})
# Classes of quantized compute in the shares, beside fp16/bf16/fp32
COMPUTE_CLASSES = ("int8", "fp8")
# DequantizeLinear takes FP16/BF16 scales from this opset on (a quantized graph is upgraded)
SCALE_OPSET = 19
# Q/DQ of these types are ONNX's from opset 21 on (before it, ONNX Runtime writes its own,
# `com.microsoft` ones, which `prepare` makes ONNX's)
WIDE_TYPES = frozenset({TensorProto.INT4, TensorProto.UINT4, TensorProto.INT16, TensorProto.UINT16})
WIDE_OPSET = 21
# Q/DQ that other runtimes write, each as the ONNX op it computes: ONNX Runtime's own
# (`com.microsoft`: INT4 weights below opset 21, or `UseQDQContribOps`) and TensorRT's FP8
# ones (`trt`: ModelOpt's torch quantizers through `torch.onnx.export`). `prepare` makes
# them ONNX's (`standard_qdq`).
FOREIGN_QDQ = {
    ("com.microsoft", "QuantizeLinear"): "QuantizeLinear",
    ("com.microsoft", "DequantizeLinear"): "DequantizeLinear",
    ("trt", "TRT_FP8QuantizeLinear"): "QuantizeLinear",
    ("trt", "TRT_FP8DequantizeLinear"): "DequantizeLinear",
}
# The quantized type of a domain whose Q takes no zero point (TensorRT's FP8 Q: E4M3), which
# ONNX's Q reads from its zero point's type
FOREIGN_FORMATS = {"trt": TensorProto.FLOAT8E4M3FN}
# ModelOpt's other TensorRT ops of quantization: NVFP4 and MXFP8 (dynamic block quantization
# of activations, FP4 weights) and a torch export's INT4 weights before ModelOpt's ONNX
# exporter. TensorRT runs them; ONNX Runtime has no kernel for any, so the quantized graph
# can be neither the reference nor emulated.
TENSORRT_QUANTIZATION = frozenset(
    {"TRT_FP4DynamicQuantize", "TRT_FP4QDQ", "TRT_MXFP8DynamicQuantize"}
    | {"TRT_MXFP8DequantizeLinear", "TRT_INT4QuantizeLinear", "TRT_INT4DequantizeLinear"}
    | {"QuantizeLinear", "DequantizeLinear"}
)
TENSORRT_QUANTIZATION_FIX = (
    "judge the model before quantization (the float ops' precision is the same decision), "
    "or quantize to INT8 or FP8 Q/DQ, which trtbuild judges: ModelOpt's mtq.INT8_DEFAULT_CFG "
    "or FP8_DEFAULT_CFG before torch.onnx.export, or python -m modelopt.onnx.quantization "
    "--quantize_mode int8|fp8 (int4: INT4 weights as ONNX DequantizeLinear) on the FP32 model"
)


# The formats `quantize` computes on a constant: the integers' saturation bounds, and the FP8
# types' (ml_dtypes, which onnx's numpy_helper reads them as) with their largest value
INTEGER_BOUNDS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                  "uint16": (0, 65535), "int32": (-(2**31), 2**31 - 1),
                  "int4": (-8, 7), "uint4": (0, 15)}  # fmt: skip
FLOAT8_TYPES = {"fp8": ("float8_e4m3fn", 448.0), "fp8e5m2": ("float8_e5m2", 57344.0)}


# ONNX Runtime's other quantized formats: dynamic quantization (integer ops fed by a
# DynamicQuantizeLinear) and the QOperator format (QLinear* ops, standard or com.microsoft).
# TensorRT's ONNX parser runs none of them ("UNSUPPORTED_NODE"); it takes Q/DQ pairs.
INTEGER_OPS = frozenset(
    {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul"}
    | {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat"}
    | {"QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSoftmax", "QLinearWhere"}
    | {"QLinearReduceMean", "QGemm", "QAttention", "DynamicQuantizeMatMul"}
    | {"MatMulIntegerToFloat", "DynamicQuantizeLSTM", "QEmbedLayerNormalization"}
    | {"MulInteger", "ReduceSumInteger", "MatMulInteger16", "QOrderedMatMul"}
    | {"QOrderedLayerNormalization", "QOrderedGelu", "QOrderedAttention"}
    | {"QOrderedLongformerAttention"}
    # weight-only: its INT4/INT8 block-quantized MatMul and Gather (onnxruntime-genai's LLMs)
    | {"MatMulNBits", "MatMulBnb4", "GatherBlockQuantized"}
)
INTEGER_FIX = (
    "quantize the FP32 model with Q/DQ nodes, which TensorRT runs: ModelOpt (python -m "
    "modelopt.onnx.quantization; --quantize_mode int4 for INT4 weights, block-quantized "
    "DequantizeLinear), or ONNX Runtime's quantize_static(..., "
    "quant_format=QuantFormat.QDQ); or give the FP32 model"
)


def integer(node: NodeProto) -> bool:
    """Whether a node is of ONNX Runtime's dynamic, QOperator or weight-only quantization
    (`INTEGER_OPS`)."""
    return node.op_type in INTEGER_OPS


def foreign_qdq(node: NodeProto) -> str | None:
    """The ONNX op (`QuantizeLinear`, `DequantizeLinear`) another runtime's Q/DQ computes."""
    return FOREIGN_QDQ.get((node.domain, node.op_type))


def tensorrt_quantization(node: NodeProto) -> bool:
    """Whether a node is one of ModelOpt's TensorRT ops of quantization that no ONNX
    Runtime kernel runs (`TENSORRT_QUANTIZATION`)."""
    return node.domain == "trt" and node.op_type in TENSORRT_QUANTIZATION


@dataclass(frozen=True)
class Requantized:
    """A DequantizeLinear of an activation (it reads a QuantizeLinear's output): what the
    Q quantizes, and the step its values move by."""

    quantize: str  # the Q's name
    maker: str  # the node that makes the Q's input (up through Casts); "" for a graph input
    maker_low: bool  # that node computes in FP16/BF16 (not pinned, not a Q/DQ)
    scale: np.ndarray | None  # the DQ's scale, where a constant
    integer: bool  # the Q's grid is an integer type's: its steps are the scale, evenly


def requantized(model: onnx.ModelProto, dq_name: str) -> Requantized | None:
    """The main graph's DequantizeLinear `dq_name` as `Requantized`; None where there is no
    such node, or it reads a weight, not a QuantizeLinear's output.

    Why: a DQ's values move in whole steps only, so an error FP16 gave the Q's input shows
    at the DQ as whole steps; what a rule can keep in FP32 is the Q's input's maker (a Q/DQ
    is never pinned)."""
    nodes, graph = model.graph.node, model.graph
    dq = next((n for n in nodes if n.name == dq_name and n.op_type == DEQUANTIZE), None)
    made = {o: n for n in nodes for o in n.output if o}
    q = made.get(dq.input[0]) if dq is not None and dq.input else None
    if q is None or q.op_type != QUANTIZE or q.domain not in DEFAULT_DOMAINS:
        return None
    source = q.input[0]
    while source in made and made[source].op_type == "Cast":
        source = made[source].input[0]
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)}
    maker = made.get(source)
    low = maker is not None and not is_qdq(maker.op_type) and types.get(source) in LOW_DTYPES
    grid = TensorProto.DataType.Name(types.get(q.output[0], TensorProto.UINT8))
    return Requantized(
        q.name,
        maker.name if maker else "",
        low,
        _scale(model, dq),
        grid.startswith(("INT", "UINT")),
    )


def _scale(model: onnx.ModelProto, dq: NodeProto) -> np.ndarray | None:
    """A DQ's scale values where a weight or a Constant holds them."""
    tensor = held_tensors(model).get(dq.input[1]) if len(dq.input) > 1 else None
    return numpy_helper.to_array(tensor).astype(np.float64) if tensor is not None else None


def is_qdq(op_type: str) -> bool:
    """Is this op a QuantizeLinear or DequantizeLinear (never compute, never pinned)?"""
    return op_type in QDQ_OPS


@dataclass(frozen=True)
class QdqNode:
    """One Q or DQ: what it reads and writes, its scale and zero point (values where constant)."""

    index: int
    op: str  # QuantizeLinear | DequantizeLinear
    name: str
    float_tensor: str  # a Q's input, a DQ's output
    quantized: str  # a Q's output, a DQ's input
    scale: str
    zero_point: str | None
    format: str  # int8 | uint8 | fp8 | int4 | int32 | ... | unknown
    scale_value: np.ndarray | None  # None: not a constant
    zero_value: np.ndarray | None  # None: absent, or not a constant
    axis: int | None  # per-axis quantization's axis; None: per tensor
    block_size: int = 0  # blocked quantization (opset 21): one scale per block on `axis`

    @property
    def is_dq(self) -> bool:
        return self.op == DEQUANTIZE

    @property
    def symmetric(self) -> bool:
        """Zero point absent or all zeros (TensorRT refuses any other)."""
        return self.zero_value is None or not np.any(self.zero_value.astype(np.float32))


@dataclass(frozen=True)
class QdqGroup:
    """A Q and the DQs that read its output, or one DQ of a constant: one scale value."""

    q: int | None
    dqs: tuple[int, ...]
    format: str

    @property
    def members(self) -> tuple[int, ...]:
        return ((self.q,) if self.q is not None else ()) + self.dqs


class QdqGraph:
    """The Q/DQ index over one `GraphView` (`Analysis.qdq()` keeps one per graph)."""

    def __init__(self, view: GraphView):
        self.view = view
        self.nodes: dict[int, QdqNode] = {}
        for i, node in enumerate(view.nodes):
            if node.op_type in QDQ_OPS and node.domain in DEFAULT_DOMAINS and len(node.input) >= 2:
                self.nodes[i] = _qdq_node(view, i)

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def is_qdq(self, index: int) -> bool:
        return index in self.nodes

    def dq_inputs(self, index: int) -> list[int]:
        """The DQs that produce an input of node `index` (in input order), directly or
        through a layout chain (`layout`: DQ -> Transpose -> MatMul)."""
        found = (self.dq_behind(t) for t in self.view.nodes[index].input)
        return [p for p in found if p is not None]

    @cached_property
    def layout(self) -> dict[int, int]:
        """Layout op -> the op behind it (`layout_chains`)."""
        return layout_chains(self.view, self.nodes)

    def fed_by(self, dq: int) -> list[int]:
        """The ops DQ `dq` feeds: its readers, each layout chain replaced by the op behind it."""
        readers = self.view.consumers.get(self.nodes[dq].float_tensor, [])
        return list(dict.fromkeys(self.layout.get(c, c) for c in readers))

    def dq_behind(self, tensor: str) -> int | None:
        """The DQ that produces `tensor`, directly or through a layout chain (`layout`)."""
        p = self.view.producer.get(tensor) if tensor else None
        while p is not None and p in self.layout:
            p = self.view.producer.get(self.view.nodes[p].input[0])
        return p if p is not None and p in self.nodes and self.nodes[p].is_dq else None

    @cached_property
    def groups(self) -> tuple[QdqGroup, ...]:
        """Every group: each Q with its DQs, then each DQ no Q feeds."""
        found, taken = [], set()
        for i, n in self.nodes.items():
            if n.is_dq:
                continue
            dqs = tuple(
                c
                for c in self.view.consumers.get(n.quantized, [])
                if c in self.nodes and self.nodes[c].is_dq
            )
            taken.update(dqs)
            found.append(QdqGroup(i, dqs, n.format))
        found += [
            QdqGroup(None, (i,), n.format)
            for i, n in self.nodes.items()
            if n.is_dq and i not in taken
        ]
        return tuple(found)

    @cached_property
    def group_of(self) -> dict[int, QdqGroup]:
        return {m: g for g in self.groups for m in g.members}

    @cached_property
    def dq_fed(self) -> tuple[int, ...]:
        """Every node that is not itself a Q/DQ and reads a DQ's output directly, or through
        a layout chain (`layout`; the chain's own ops are not counted)."""
        if not self.nodes:  # no DQ: nothing is fed by one (most models; no walk of every node)
            return ()
        return tuple(
            i
            for i in range(len(self.view.nodes))
            if i not in self.nodes and i not in self.layout and self.dq_inputs(i)
        )

    @cached_property
    def quantized_ops(self) -> dict[int, str]:
        """Quantized compute: Conv/ConvTranspose/MatMul/Gemm whose data and weight inputs are
        DQ outputs, with the format of its data input's DQ (int8 or fp8)."""
        found = {}
        for i in self.dq_fed:
            node = self.view.nodes[i]
            if node.op_type not in FUSED_OPS or len(node.input) < 2:
                continue
            first, second = (self.dq_behind(t) for t in node.input[:2])
            if first is not None and second is not None:
                found[i] = self.nodes[first].format
        return found

    def inventory(self, quantized: Mapping[int, str] | None = None) -> dict[str, Any]:
        """What `check` prints and report.json records: groups per format, quantized ops
        per format (`quantized`: those an assignment keeps, `dequantize: true` rules'
        ops taken out; default every one), DQ-fed nodes per op type."""
        pairs = Counter(g.format for g in self.groups)
        ops = Counter((self.quantized_ops if quantized is None else quantized).values())
        fed = Counter(self.view.nodes[i].op_type for i in self.dq_fed)
        return {
            "q_nodes": sum(1 for n in self.nodes.values() if not n.is_dq),
            "dq_nodes": sum(1 for n in self.nodes.values() if n.is_dq),
            "pairs": dict(sorted(pairs.items())),
            "quantized_ops": dict(sorted(ops.items())),
            "dq_fed": dict(sorted(fed.items())),
        }

    def group_scale(self, group: QdqGroup) -> np.ndarray | None:
        """Every scale value of the group's members, in one flat array (None where any is
        not a constant): what a type must hold for the whole group to take it. ONNX
        Runtime and ModelOpt give a Q and its DQs one scale; a model that requantizes
        (a Q and its DQ with two scales) has both here."""
        values = [self.nodes[m].scale_value for m in group.members]
        if any(v is None for v in values):
            return None
        return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values])


def holds(values: np.ndarray | None, dtype: int) -> bool:
    """Can `dtype` hold these scales as TensorRT needs them: finite, > 0, normal, in range?

    Why normal and not only non-zero: a subnormal FP16 scale keeps a few bits of
    precision and TensorRT's INT8 kernels take the scale's reciprocal, which
    overflows; a scale that leaves FP16's normal range stays FP32.
    """
    if values is None:
        return False
    return dtype == TensorProto.FLOAT or not np.any(unheld(values, dtype))


def unheld(values: np.ndarray, dtype: int) -> np.ndarray:
    """Which of the scales (flat) the low float `dtype` cannot hold (`holds`): not finite,
    below its smallest normal or beyond its largest (`numerics`)."""
    low = "bf16" if dtype == TensorProto.BFLOAT16 else "fp16"
    v = np.asarray(values, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(v) | (v < LOW_TINY[low]) | (v > LOW_MAX[low])


def along(values: np.ndarray, axis: int | None, rank: int) -> np.ndarray:
    """A per-tensor or per-axis scale or zero point (float64), broadcastable against data of
    `rank` dimensions: its one dimension on `axis` (None, one value or rank 0: a scalar)."""
    values = np.asarray(values, np.float64)
    if values.size == 1 or axis is None or rank == 0:
        return values.reshape(())
    shape = [1] * rank
    shape[axis % rank] = values.size
    return values.reshape(shape)


def dequantize(
    stored: np.ndarray,
    scale: np.ndarray,
    zero: np.ndarray | None = None,
    axis: int | None = None,
    block: int = 0,
) -> np.ndarray:
    """DequantizeLinear on a constant, as FP32: (stored - zero point) x scale, per tensor,
    per `axis`, or per `block` of that axis (opset 21's blocked quantization).

    Why one function: seeing through a weight's DQ (`seethrough`) and reading around it
    (`dequantize: true` in `convert`) must give the op the same values. Computed in float64,
    where the difference and the product of FP32-exact operands (INT8, INT16, INT4, FP8,
    any scale type) are exact, then rounded once to FP32: FP32 arithmetic's own result.
    """
    stored = np.asarray(stored)
    shape = stored.shape
    zero = 0 if zero is None else per_element(np.asarray(zero, np.float64), axis, block, shape)
    exact = (stored.astype(np.float64) - zero) * per_element(
        np.asarray(scale, np.float64), axis, block, shape
    )
    with np.errstate(over="ignore"):  # a sentinel (finfo.min) quantized and back may be inf
        return exact.astype(np.float32)


def quantize(
    values: np.ndarray,
    scale: np.ndarray,
    fmt: str,
    zero: np.ndarray | None = None,
    axis: int | None = None,
    block: int = 0,
) -> np.ndarray:
    """QuantizeLinear on a constant (`fmt` in `INTEGER_BOUNDS` or `FLOAT8_TYPES`), the stored
    values as float64: `values / scale` in FP32, as ONNX and ONNX Runtime divide (in
    float64, a ratio a hair past a tie rounded to the other code), then round half to even
    and saturate (ONNX's definition); FP8 rounds to its nearest value (ml_dtypes) after
    saturating to its largest. Per tensor, per `axis`, or per `block` of that axis."""
    values = np.asarray(values)
    shape = values.shape
    divisor = per_element(np.asarray(scale), axis, block, shape).astype(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = (values.astype(np.float32) / divisor).astype(np.float64)
    if fmt in FLOAT8_TYPES:
        import ml_dtypes

        kind, top = FLOAT8_TYPES[fmt]
        return np.clip(scaled, -top, top).astype(getattr(ml_dtypes, kind)).astype(np.float64)
    if fmt not in INTEGER_BOUNDS:
        raise ValueError(f"no QuantizeLinear of format {fmt!r} is computed here")
    low, high = INTEGER_BOUNDS[fmt]
    zero = 0 if zero is None else per_element(np.asarray(zero, np.float64), axis, block, shape)
    return np.clip(np.rint(scaled) + zero, low, high)


def per_element(
    param: np.ndarray, axis: int | None, block: int, shape: tuple[int, ...]
) -> np.ndarray:
    """A Q/DQ's scale or zero point made to broadcast against values of `shape`: one value,
    one per index of `axis`, or one per `block` of it repeated over the block's elements (a
    ragged last block cut to the dim)."""
    if block and axis is not None:
        axis %= len(shape)
        return np.repeat(param, block, axis).take(range(shape[axis]), axis)
    return along(param, axis, len(shape))


def fp8_capable(capability: str) -> bool:
    """Does a compute capability ("8.9") have FP8 kernels (`numerics.MIN_CAPABILITY`)?"""
    return has_kernels(capability, "fp8")


def layout_chains(view: GraphView, nodes: dict[int, QdqNode]) -> dict[int, int]:
    """Layout op -> the op behind it, for each chain of `LAYOUT_OPS` a DQ feeds that leads,
    one reader after the other, to an op TensorRT fuses with DQs (DQ -> Transpose ->
    MatMul). Such a chain is part of the DQ's path into its op: it computes as that op."""
    found: dict[int, int] = {}
    for n in nodes.values():
        if not n.is_dq:
            continue
        for c in view.consumers.get(n.float_tensor, []):
            chain, tensor = [], n.float_tensor
            while view.nodes[c].op_type in LAYOUT_OPS and view.nodes[c].input[0] == tensor:
                tensor = view.nodes[c].output[0]
                readers = view.consumers.get(tensor, [])
                if len(readers) != 1 or tensor in view.outputs:
                    chain = []
                    break
                chain.append(c)
                c = readers[0]
            if chain and view.nodes[c].op_type in FUSED_OPS | RESIDUAL_OPS:
                found.update(dict.fromkeys(chain, c))
    return found


def _qdq_node(view: GraphView, i: int) -> QdqNode:
    node = view.nodes[i]
    is_dq = node.op_type == DEQUANTIZE
    quantized = node.input[0] if is_dq else node.output[0]
    zero = node.input[2] if len(node.input) > 2 and node.input[2] else None
    fmt = view.dtype.get(quantized)
    if fmt is None and zero is not None:
        fmt = view.dtype.get(zero)
    if fmt is None and not is_dq:
        fmt = TensorProto.UINT8  # ONNX's default for a Q without a zero point
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    scale_value = constant(view, node.input[1])
    per_axis = scale_value is not None and scale_value.size > 1
    return QdqNode(
        index=i,
        op=node.op_type,
        name=node.name,
        float_tensor=node.output[0] if is_dq else node.input[0],
        quantized=quantized,
        scale=node.input[1],
        zero_point=zero,
        format=FORMATS.get(fmt, "unknown") if fmt is not None else "unknown",
        scale_value=scale_value,
        zero_value=constant(view, zero) if zero else None,
        axis=(axis if axis is not None else 1) if per_axis else None,
        block_size=next((a.i for a in node.attribute if a.name == "block_size"), 0),
    )


@dataclass(frozen=True)
class Violation:
    """A Q/DQ node TensorRT refuses: which node, what of it, and how to fix the model."""

    node: str
    field: str  # zero point | scale | format | compute capability
    problem: str
    fix: str


SYMMETRIC_FIX = (
    "re-quantize symmetrically: ONNX Runtime quantize_static(..., activation_type=QuantType.QInt8, "
    'weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": True, '
    '"WeightSymmetric": True}), or ModelOpt (python -m modelopt.onnx.quantization), whose '
    "zero points are 0"
)
FORMAT_FIX = {
    "uint8": SYMMETRIC_FIX,
    "int32": 'quantize without bias quantization: quantize_static(..., extra_options={"QuantizeBias": False})',
}


def violations(qdq: QdqGraph, capabilities: tuple[str, ...] = ()) -> list[Violation]:
    """TensorRT's rules for explicit quantization, checked node by node, first problem each.

    Zero points 0 (INT8 or FP8; UINT8 refused), scales constant, finite and > 0,
    a quantized type TensorRT takes, FP8 only where every compute capability has it.
    """
    found = []
    old = [c for c in capabilities if not fp8_capable(c)]
    for i, n in qdq.nodes.items():
        v = _violation(n, old, lambda i=i: _quantized_for(qdq, i)) or _scale_shape(qdq, n)
        if v is not None:
            found.append(v)
    return found


def _scale_shape(qdq: QdqGraph, n: QdqNode) -> Violation | None:
    """A weight's Q/DQ whose scale does not have the shape its `axis` and `block_size` give
    (blocked: the weight's shape with ceil(D / block_size) on `axis`; per axis: D values).

    Why: ModelOpt 0.47's `--quantize_mode int4 --calibration_method awq_clip` wrote a Gemm's
    (transB) weight blocked along its other axis; ONNX Runtime refused it only when the
    reference ran, and the message told the user to choose other input shapes.
    """
    weight = qdq.view.initializers.get(n.quantized if n.is_dq else n.float_tensor)
    if weight is None or n.scale_value is None or n.scale_value.size <= 1 or n.axis is None:
        return None  # (a scale of several values has an axis: `_qdq_node` gives ONNX's default)
    dims, scale, axis = list(weight.dims), list(np.shape(n.scale_value)), n.axis
    if not -len(dims) <= axis < len(dims):  # (no shape to say; not this check's to judge)
        return None
    need = list(dims) if n.block_size > 0 else [dims[axis]]
    if n.block_size > 0:
        need[axis] = -(-dims[axis] // n.block_size)
    if need == scale:
        return _ragged(qdq, n, dims, axis, weight.name)
    blocked = f" and block_size {n.block_size}" if n.block_size > 0 else ""
    return Violation(
        n.name,
        "scale",
        f"scale {n.scale} has shape {scale}, where axis {axis}{blocked} over the weight "
        f"{weight.name} of shape {dims} needs {need}: the quantizer wrote another axis's scales "
        "(ONNX Runtime refuses to run the node)",
        f"re-quantize with the op that reads it ({_quantized_for(qdq, n.index)}) left out "
        "(ModelOpt: --nodes_to_exclude with its name) or another method (ModelOpt INT4: "
        "--calibration_method rtn_dq)",
    )


def _ragged(qdq: QdqGraph, n: QdqNode, dims: list[int], axis: int, weight: str) -> Violation | None:
    """A blocked weight whose last block is cut short: ONNX and ONNX Runtime take it,
    TensorRT's parser refuses it at the build ("The quantization axis must divide into
    whole blocks"), after everything else, where `check` could have said so."""
    if n.block_size <= 0 or dims[axis] % n.block_size == 0:
        return None
    return Violation(
        n.name,
        "block_size",
        f"block_size {n.block_size} does not divide dim {axis} of the weight {weight} "
        f"(shape {dims}): its last block holds {dims[axis] % n.block_size}, and TensorRT takes "
        "whole blocks only",
        f"re-quantize with a block size that divides {dims[axis]}, or with the op that reads "
        f"it ({_quantized_for(qdq, n.index)}) left out",
    )


def _quantized_for(qdq: QdqGraph, i: int) -> str:
    """The ops that read what Q/DQ node `i`'s group quantizes, named for a fix, at most three:
    the ops its DQs feed and every other reader of the tensor its Q quantizes (ModelOpt
    quantizes a tensor for all its readers: `--nodes_to_exclude` with only the one its DQ
    feeds moved the pair to the other, a Qwen2's mask read by each layer's attention)."""
    group = qdq.group_of[i]
    ops = [c for dq in group.dqs for c in qdq.fed_by(dq)]
    if group.q is not None:
        ops += qdq.view.consumers.get(qdq.nodes[group.q].float_tensor, [])
    ops = [qdq.layout.get(c, c) for c in ops if c not in qdq.nodes]
    names = list(dict.fromkeys(qdq.view.nodes[c].name or qdq.view.nodes[c].op_type for c in ops))
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more if names else "no op reads it"


def _violation(n: QdqNode, old: list[str], readers: Callable[[], str]) -> Violation | None:
    if n.zero_point is not None and n.zero_value is None:
        return Violation(
            n.name, "zero point", f"zero point {n.zero_point} is not a constant", SYMMETRIC_FIX
        )
    if not n.symmetric:
        z = np.asarray(n.zero_value).astype(np.float64).ravel()
        nonzero = z[z != 0]
        return Violation(
            n.name,
            "zero point",
            f"zero point {n.zero_point} is {nonzero[0]:g} ({nonzero.size} of {z.size} non-zero): "
            'TensorRT takes only zero points of 0 ("Non-zero zero point is not supported")',
            SYMMETRIC_FIX,
        )
    if n.format not in TENSORRT_FORMATS:
        fix = FORMAT_FIX.get(n.format, "quantize to INT8 or FP8 (E4M3)")
        return Violation(
            n.name,
            "format",
            f"quantizes to {n.format.upper()}; TensorRT takes INT8, FP8 (E4M3) and INT4 weights",
            fix,
        )
    if n.scale_value is None:
        return Violation(
            n.name,
            "scale",
            f"scale {n.scale} is not a constant",
            "give the scale as an initializer (passes.fold_constants: true folds a computed one)",
        )
    s = np.asarray(n.scale_value, dtype=np.float64).ravel()
    bad = s[~np.isfinite(s) | (s <= 0)]
    if bad.size:
        empty = "re-calibrate: a zero scale is a channel whose calibration range is empty"
        endless = (
            f"re-quantize with the ops that read what scale {n.scale} quantizes left out "
            f"({readers()}): its calibration range is not finite (a mask's finfo.min, say; "
            "ModelOpt: --nodes_to_exclude with their names)"
        )
        return Violation(
            n.name,
            "scale",
            f"scale {n.scale} holds {bad[0]:g} ({bad.size} of {s.size}): TensorRT takes only finite scales > 0",
            endless if not np.isfinite(bad).all() else empty,
        )
    if n.format == "fp8" and old:
        return Violation(
            n.name,
            "compute capability",
            f"quantizes to FP8, which compute capability {', '.join(old)} has no kernels for "
            f"(FP8 needs {oldest_capability('fp8')} or newer)",
            f"build only for {oldest_capability('fp8')} and newer (build.compute_capabilities), "
            "or quantize to INT8",
        )
    return None
