"""Fusions that make the graph look the way TensorRT builds it.

Why fuse LayerNorm: TensorRT maps ONNX `LayerNormalization` (opset 17+) to one
normalization layer that accumulates in FP32, while the decomposed form older
exporters write runs as separate elementwise and reduce layers, where the
variance `Pow` overflows in FP16. Why fold BatchNorm: TensorRT folds it into
the Conv anyway, so precision rules and range analysis should see the Conv
with folded weights, as the engine will.

Both passes are exact up to float rounding, keep the first node's name (a
policy written against original names keeps matching), record every change,
and leave anything they cannot rewrite exactly as it was, saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtbuild.graph import subgraphs
from trtbuild.graph.analysis import mapped
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.model_io import infer_shapes, opset_of
from trtbuild.graph.norms import NormUnit, norm_units
from trtbuild.graph.optypes import DEQUANTIZE, QDQ_OPS, QUANTIZE
from trtbuild.graph.qdq import INTEGER_BOUNDS, quantize
from trtbuild.graph.seethrough import SeenThrough, see_through
from trtbuild.graph.view import GraphView, constant
from trtbuild.passes.basic import PassRecord, copied, drop_unused_initializers

LAYERNORM_OPSET = 17


def fuse_layernorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Replace each decomposed trailing-axis LayerNorm by one `LayerNormalization` node."""
    record = PassRecord("fuse_layernorm", details={"fused": [], "not_fused": []})
    model = infer_shapes(model)
    view = GraphView(model)
    seen = see_through(view)  # a quantized graph's units are found in its float graph
    inner = seen.view if seen is not None else view
    units = [u for u in norm_units(inner) if u.kind == "layernorm" and _main(inner, u.nodes)]
    if view.body_of:
        record.details["subgraphs"] = (
            "not searched: units inside control-flow bodies stay as exported"
        )
    if not units:
        return _uninferred(model), record
    too_old = opset_of(model) < LAYERNORM_OPSET
    replaced: dict[int, onnx.NodeProto] = {}
    removed: set[int] = set()
    taken = _values(view)
    for unit in units:
        plan = _plan(inner, unit)
        if seen is not None and not isinstance(plan, str):
            plan = _quantized_plan(view, seen, unit, plan)
        if seen is not None:
            unit = mapped(unit, seen.back)
        if isinstance(plan, str) or too_old:
            why = (
                plan
                if isinstance(plan, str)
                else (
                    f"opset {opset_of(model)} has no LayerNormalization; "
                    f"set passes.opset: {LAYERNORM_OPSET} (or --opset {LAYERNORM_OPSET})"
                )
            )
            record.details["not_fused"].append(_named(view, unit, why))
            continue
        node, inits = plan
        _named_apart([node], inits, taken)
        model.graph.initializer.extend(inits)
        replaced[max(unit.nodes)] = node
        removed.update(unit.nodes)
        record.details["fused"].append(
            {**_named(view, unit), "axis": _attr(node, "axis"), "epsilon": _attr(node, "epsilon")}
        )
    record.changed = len(record.details["fused"])
    if record.changed:
        nodes = [
            replaced.get(i, view.nodes[i]) for i in view.top if i not in removed or i in replaced
        ]
        nodes = _without_dangling_qdq(view, nodes)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        drop_unused_initializers(model)
    return _uninferred(model), record


def _uninferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, the pass's own copy (`infer_shapes` made it), without the value infos that
    copy was inferred with: cleared where they are, not copied again (a 108 MB ConvNeXt's
    weights, 0.06 s)."""
    del model.graph.value_info[:]
    return model


def _main(view: GraphView, nodes) -> bool:
    """Are all these nodes in the main graph (fusions do not rewrite bodies)?"""
    return all(not view.scope[i] for i in nodes)


def _named(view: GraphView, unit: NormUnit, why: str | None = None) -> dict:
    out = {
        "name": view.nodes[unit.nodes[0]].name,
        "nodes": [view.nodes[i].name for i in unit.nodes],
    }
    if why:
        out["why"] = why
    return out


def _attr(node: onnx.NodeProto, name: str):
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def _plan(view: GraphView, unit: NormUnit) -> tuple[onnx.NodeProto, list[onnx.TensorProto]] | str:
    """The fused node and its new initializers, or why the unit cannot be fused exactly."""
    mean_axes, var_axes = unit.axes
    if not unit.keepdims:
        return "ReduceMean without keepdims"
    if mean_axes is None or var_axes is None:
        return "ReduceMean axes are not constant"
    rank = _rank(view, unit.x)
    if rank is None and any(a >= 0 for a in (*mean_axes, *var_axes)):
        return "input rank unknown"
    neg = sorted({a - rank if a >= 0 else a for a in mean_axes}) if rank else sorted(mean_axes)
    neg_var = sorted({a - rank if a >= 0 else a for a in var_axes}) if rank else sorted(var_axes)
    if neg != neg_var:
        return f"mean over axes {list(mean_axes)} but variance over {list(var_axes)}"
    k = len(neg)
    if neg != list(range(-k, 0)):
        where = f" of rank {rank}" if rank else ""
        return (
            f"normalizes axes {list(mean_axes)}{where}; LayerNormalization normalizes trailing "
            "axes only (kept as a normalization unit)"
        )
    for i in unit.nodes:  # every intermediate value must stay inside the unit
        for out in view.nodes[i].output:
            if out == unit.output:
                continue
            if out in view.outputs or any(c not in unit.nodes for c in view.consumers.get(out, [])):
                return f"intermediate {out!r} is used outside the unit"
    dtype = view.dtype.get(unit.x)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype) if dtype else np.dtype(np.float32)
    norm_shape = _tail(view, unit.x, k)
    if lifted := _lifts_rank(view, unit, k, rank):
        return lifted
    scale = _broadcast(view, unit.scale, k, norm_shape)
    bias = _broadcast(view, unit.bias, k, norm_shape)
    if isinstance(scale, str) or isinstance(bias, str):
        return scale if isinstance(scale, str) else bias
    if norm_shape is None:
        shapes = [a.shape for a in (scale, bias) if a is not None]
        if not shapes:
            return "normalized dimensions unknown and no weights to take them from"
        norm_shape = shapes[0]
    name = view.nodes[unit.nodes[0]].name
    scale_arr = np.ones(norm_shape, np_dtype) if scale is None else scale.astype(np_dtype)
    inits = [numpy_helper.from_array(scale_arr, f"{name}.scale")]
    inputs = [unit.x, inits[0].name]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.astype(np_dtype), f"{name}.bias"))
        inputs.append(inits[1].name)
    eps = float(constant(view, unit.epsilon).ravel()[0])  # a weight, or a Constant as exported
    node = helper.make_node(
        "LayerNormalization", inputs, [unit.output], name=name, axis=-k, epsilon=eps
    )
    return node, inits


def _quantized_plan(
    view: GraphView, seen: SeenThrough, unit: NormUnit, plan: tuple
) -> tuple[onnx.NodeProto, list[onnx.TensorProto]] | str:
    """The fused node of a unit found in the float graph, reading what the quantized graph's
    nodes read; or why not: a Q→DQ pair between two of its nodes quantizes an intermediate
    (ONNX Runtime's `quantize_static` quantizes the variance, the Div, the Mul), and one
    LayerNormalization would drop it. The unit stays whole and decomposed (a `layernorm`
    rule still pins it as one). Its weights' DQs are exact: their values become its scale
    and bias."""
    node, inits = plan
    members = {seen.back[i] for i in unit.nodes}
    for i in sorted(members):
        for t in view.nodes[i].input:
            dq = view.producer.get(t)
            if t not in seen.alias or dq is None:
                continue
            q = view.producer.get(view.nodes[dq].input[0])
            source = view.producer.get(seen.alias[t])
            if source in members and q is not None:
                return (
                    f"Q/DQ pair {view.nodes[q].name} quantizes its intermediate "
                    f"{seen.alias[t]!r} between {view.nodes[source].name} and "
                    f"{view.nodes[i].name}; one LayerNormalization would drop that quantization "
                    "(kept as a decomposed unit; quantize without Q/DQ inside normalizations, "
                    "as ModelOpt does, to have it fused)"
                )
    read = sorted(  # the input as the quantized graph's nodes read it (a DQ's output, or x)
        {t for i in members for t in view.nodes[i].input if seen.alias.get(t, t) == node.input[0]}
    )
    if len(read) > 1:  # some read x and some its Q/DQ: one input would change the others' math
        return (
            f"its nodes read both {' and '.join(repr(t) for t in read)} (the same tensor with "
            "and without its Q/DQ pair); one LayerNormalization reads one of them (kept as a "
            "decomposed unit)"
        )
    fused = onnx.NodeProto()
    fused.CopyFrom(node)
    if read:
        fused.input[0] = read[0]
    return fused, inits


def _without_dangling_qdq(view: GraphView, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` without the Q/DQ nodes a rewrite left unread (a fused unit's weight DQs, its
    epsilon's pair, a folded Conv's old weight DQ), followed upstream. A Q/DQ that nothing
    read before the rewrite is not the rewrite's to remove."""
    was_read = {
        id(view.nodes[i])
        for i in view.top
        if view.nodes[i].op_type in QDQ_OPS
        and any(view.consumers.get(o) or o in view.outputs for o in view.nodes[i].output)
    }
    outputs = set(view.outputs)
    while True:
        read = {t for n in nodes for t in subgraphs.node_reads(n)} | outputs
        gone = {
            id(n) for n in nodes if id(n) in was_read and not any(o in read for o in n.output if o)
        }
        if not gone:
            return nodes
        nodes = [n for n in nodes if id(n) not in gone]


def _rank(view: GraphView, tensor: str | None) -> int | None:
    t = view.shape.get(tensor or "")
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    return len(t.tensor_type.shape.dim)


def _tail(view: GraphView, tensor: str | None, k: int) -> tuple[int, ...] | None:
    t = view.shape.get(tensor or "")
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim[-k:]
    if len(dims) != k or not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


def _lifts_rank(view: GraphView, unit: NormUnit, k: int, rank: int | None) -> str:
    """Why the unit's output has a higher rank than x (a gamma of [1, 1, 8] on x of [2, 8]
    makes [1, 2, 8]; LayerNormalization hands out x's rank), or "" where it has not. The
    fused op made the Transpose after it read a tensor of another rank: exit 70."""
    for name in (unit.scale, unit.bias):
        ndim = view.initializer_array(name).ndim if name is not None else 0
        if ndim > k and (rank is None or ndim > rank):
            return f"weight {name!r} of rank {ndim} broadcasts x{f' of rank {rank}' if rank else ''} to its rank"
    return ""


def _broadcast(view: GraphView, name: str | None, k: int, shape) -> np.ndarray | str | None:
    """The weight as an array of the normalized shape, or why it does not fit it."""
    if name is None:
        return None
    arr = view.initializer_array(name)
    while arr.ndim > k and arr.shape[0] == 1:
        arr = arr.reshape(arr.shape[1:])
    if arr.ndim > k:
        return f"weight {name!r} of shape {list(arr.shape)} varies outside the normalized axes"
    if shape is None:
        return arr if arr.ndim == k else "normalized dimensions unknown"
    try:
        return np.broadcast_to(arr, shape).copy()
    except ValueError:
        return f"weight {name!r} of shape {list(arr.shape)} does not fit {list(shape)}"


# -- BatchNormalization -> Conv ---------------------------------------------------


def _values(view: GraphView) -> set[str]:
    """Every value name of the graph: what a value the passes make must not be named."""
    return {*view.producer, *view.consumers, *view.initializers, *view.dtype, *view.inputs}


def _named_apart(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], taken: set[str]):
    """The values a fusion made (its weights, the outputs of its nodes but the last, which
    writes the value it replaces) under names no value has (`taken`, which takes them):
    a model holding a weight `ln.scale` got a second one of that name (exit 70)."""
    made = [t.name for t in inits] + [o for n in nodes[:-1] for o in n.output if o]
    renamed = {name: subgraphs.new_name(name, taken) for name in made}
    for t in inits:
        t.name = renamed[t.name]
    for n in nodes:
        n.input[:] = [renamed.get(x, x) for x in n.input]
        n.output[:] = [renamed.get(x, x) for x in n.output]


def fold_batchnorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Fold inference-mode BatchNormalization into the Conv that feeds it."""
    record = PassRecord("fold_batchnorm", details={"folded": [], "not_folded": []})
    if not any(n.op_type == "BatchNormalization" for n in model.graph.node):
        return model, record  # the common case: no index over the graph to build
    model = copied(model)  # passes never change their input
    view = GraphView(model)
    removed: set[int] = set()
    replaced: dict[int, onnx.NodeProto] = {}
    taken = _values(view)
    for i in view.top:  # bodies are not searched: a BatchNorm there stays as exported
        bn = view.nodes[i]
        if bn.op_type != "BatchNormalization" or bn.domain not in DEFAULT_DOMAINS:
            continue
        conv_index = view.producer.get(bn.input[0])
        plan = _fold_plan(view, conv_index, i)
        if isinstance(plan, str):
            record.details["not_folded"].append({"name": bn.name, "why": plan})
            continue
        conv, inits = plan
        _named_apart(list(conv) if isinstance(conv, tuple) else [conv], inits, taken)
        model.graph.initializer.extend(inits)
        replaced[conv_index] = conv
        removed.add(i)
        name = conv[-1].name if isinstance(conv, tuple) else conv.name
        record.details["folded"].append({"name": name, "batchnorm": bn.name})
    record.changed = len(record.details["folded"])
    if record.changed:
        nodes = [
            n
            for i in view.top
            if i not in removed or i in replaced
            for n in _as_nodes(replaced.get(i, view.nodes[i]))
        ]
        nodes = _without_dangling_qdq(view, nodes)  # an old weight DQ no Conv reads now
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        drop_unused_initializers(model)
    return model, record


def _fold_plan(view: GraphView, conv_index: int | None, bn_index: int):
    bn = view.nodes[bn_index]
    if conv_index is not None and view.nodes[conv_index].op_type == DEQUANTIZE:
        return _behind_pair(view, conv_index)
    if conv_index is None or view.nodes[conv_index].op_type != "Conv":
        return "not fed by a Conv"
    conv = view.nodes[conv_index]
    if len([o for o in bn.output if o]) != 1:
        return "training-mode BatchNormalization"
    if conv.output[0] in view.outputs or len(view.consumers.get(conv.output[0], [])) != 1:
        return f"the Conv output {conv.output[0]!r} is used elsewhere"
    weight_dq = _weight_dq(view, conv)
    params = [*conv.input[1 if weight_dq is None else 2 :], *bn.input[1:]]
    missing = [t for t in params if t and t not in view.initializers]
    if missing:
        return f"{missing[0]!r} is not a constant"
    if weight_dq is not None:
        return _fold_quantized(view, conv, bn, weight_dq)
    w = view.initializer_array(conv.input[1])
    b = view.initializer_array(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    s, fold_bias = _bn_affine(view, bn)
    w2 = (w.astype(np.float64) * s.reshape(-1, *[1] * (w.ndim - 1))).astype(w.dtype)
    b2 = fold_bias(b).astype(w.dtype)
    inits = [
        numpy_helper.from_array(w2, f"{conv.name}.weight_bnfolded"),
        numpy_helper.from_array(b2, f"{conv.name}.bias_bnfolded"),
    ]
    folded = onnx.NodeProto()
    folded.CopyFrom(conv)
    del folded.input[:]
    folded.input.extend([conv.input[0], inits[0].name, inits[1].name])
    folded.output[0] = bn.output[0]
    return folded, inits


def _as_nodes(node: onnx.NodeProto | tuple) -> tuple[onnx.NodeProto, ...]:
    return node if isinstance(node, tuple) else (node,)


def _bn_affine(view: GraphView, bn: onnx.NodeProto) -> tuple[np.ndarray, Callable]:
    """BatchNorm as y = x * s + ... per channel (float64): `s`, and the folded bias of a
    Conv bias `b` (None: no bias), ((b - mean) * s + beta)."""
    gamma, beta, mean, var = (view.initializer_array(t).astype(np.float64) for t in bn.input[1:5])
    eps = next((helper.get_attribute_value(a) for a in bn.attribute if a.name == "epsilon"), 1e-5)
    s = gamma / np.sqrt(var + eps)

    def fold_bias(b: np.ndarray | None) -> np.ndarray:
        return ((b.astype(np.float64) if b is not None else 0.0) - mean) * s + beta

    return s, fold_bias


def _behind_pair(view: GraphView, dq: int) -> str:
    """Why a BatchNorm behind a Q→DQ pair stays: folding would drop the pair's quantization."""
    q = view.producer.get(view.nodes[dq].input[0])
    conv = view.producer.get(view.nodes[q].input[0]) if q is not None else None
    if q is None or conv is None or view.nodes[conv].op_type != "Conv":
        return "not fed by a Conv"
    return (
        f"Q/DQ pair {view.nodes[q].name} quantizes the output of Conv {view.nodes[conv].name} "
        "before the BatchNormalization; folding would drop that quantization (fold BatchNorm "
        "before quantizing, as ONNX Runtime's quant_pre_process and ModelOpt do)"
    )


def _weight_dq(view: GraphView, conv: onnx.NodeProto) -> int | None:
    """The DequantizeLinear that gives a Conv its weight, where one does."""
    p = view.producer.get(conv.input[1]) if len(conv.input) > 1 else None
    return p if p is not None and view.nodes[p].op_type == DEQUANTIZE else None


@dataclass(frozen=True)
class _QuantizedWeight:
    """A Conv weight behind a DQ: INT8 integers stored (ONNX Runtime's form), or a float
    constant behind a Q (ModelOpt's), with its scale (per output channel, or one)."""

    values: np.ndarray
    scale: np.ndarray
    stored: bool


def _quantized_weight(view: GraphView, dq: onnx.NodeProto) -> _QuantizedWeight | str:
    """The weight a DQ gives a Conv, or why it cannot be folded into exactly."""
    ins = list(dq.input) + [""] * (3 - len(dq.input))
    if not all(t in view.initializers for t in ins[1:] if t):
        return f"the scale or zero point of the weight DQ {dq.name} is not a constant"
    zero = view.initializer_array(ins[2]) if ins[2] else None
    if zero is None or zero.dtype != np.int8 or np.any(zero):
        return f"the weight DQ {dq.name} is not symmetric INT8"
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    block = next((a.i for a in dq.attribute if a.name == "block_size"), 0)
    scale = view.initializer_array(ins[1])
    if block > 0 or scale.ndim > 1:  # each block's channels share a scale, not each channel
        return (
            f"the weight DQ {dq.name} is block-quantized (block_size {block}, scale of shape "
            f"{list(scale.shape)}): its scales are not one per output channel"
        )
    q = view.producer.get(ins[0])
    if ins[0] in view.initializers:
        values, stored = view.initializer_array(ins[0]), True
    elif q is not None and view.nodes[q].op_type == QUANTIZE:
        src = view.nodes[q].input[0]
        if src not in view.initializers or list(view.nodes[q].input[1:]) != ins[1:]:
            return f"the weight's Q {view.nodes[q].name} does not quantize a constant as its DQ"
        values, stored = view.initializer_array(src), False
    else:
        return f"the weight DQ {dq.name} reads neither INT8 constants nor a Q of a constant"
    if scale.size > 1 and axis % values.ndim != 0:
        return f"the weight DQ {dq.name} is per-channel on axis {axis}, not the output channels"
    return _QuantizedWeight(values, scale, stored)


def _fold_quantized(view: GraphView, conv: onnx.NodeProto, bn: onnx.NodeProto, dq_index: int):
    """Fold a BatchNorm into a Conv whose weight is INT8 behind a DequantizeLinear, exactly:
    each output channel's scale is multiplied by |s| and each weight keeps its code (a
    channel with s < 0 negated, so every scale stays > 0 as TensorRT requires): stored
    integers are negated, a float weight behind a Q is multiplied by s and held to its
    code (`_folded_values`). The bias, float, folds as a float Conv's does. The Conv gets
    its own Q/DQ (the old ones may be shared)."""
    weight = _quantized_weight(view, view.nodes[dq_index])
    if isinstance(weight, str):
        return weight
    s, fold_bias = _bn_affine(view, bn)
    folded_scale = np.broadcast_to(weight.scale.astype(np.float64), s.shape) * np.abs(s)
    folded_scale = folded_scale.astype(weight.scale.dtype)
    if not np.all(np.isfinite(folded_scale) & (folded_scale > 0)):  # gamma 0, or underflow
        return (
            f"a channel's BatchNorm scale makes its folded weight scale {folded_scale.min():g} "
            f"in {conv.input[1]!r}: TensorRT takes only scales > 0 (the BatchNorm is kept)"
        )
    unnegated = _unnegatable(weight, s < 0)
    if unnegated:
        return f"a channel with a negative BatchNorm scale holds {unnegated} in {conv.input[1]!r}"
    values = _folded_values(weight, s, folded_scale)
    if values is None:
        return (
            f"the folded {conv.input[1]!r} does not quantize back to the codes its Q gave "
            "(the BatchNorm is kept)"
        )
    stem = f"{conv.name}.weight_bnfolded"
    nodes, inits = _folded_weight(values, weight.stored, folded_scale, stem)
    b = view.initializer_array(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    b2 = fold_bias(b).astype(np.float32)
    inits.append(numpy_helper.from_array(b2, f"{conv.name}.bias_bnfolded"))
    folded = onnx.NodeProto()
    folded.CopyFrom(conv)
    del folded.input[:]
    folded.input.extend([conv.input[0], stem, inits[-1].name])
    folded.output[0] = bn.output[0]
    return (*nodes, folded), inits


def _integers(weight: _QuantizedWeight) -> np.ndarray:
    """The weight's INT8 values (a float weight as its Q rounds and saturates it)."""
    if weight.stored:
        return weight.values
    return quantize(weight.values, weight.scale, "int8", axis=0)  # per output channel, or one


def _unnegatable(weight: _QuantizedWeight, negative: np.ndarray) -> str:
    """What, in the channels `negative`, has no negated code ("" where nothing): -128
    (128 saturates to 127), or a float weight its Q saturates at 127 (its negation
    saturates at -128, not -127)."""
    low, high = INTEGER_BOUNDS["int8"]
    if np.any(_integers(weight)[negative] <= low):
        return str(low)
    if not weight.stored and np.any(
        quantize(weight.values, weight.scale, "int16", axis=0)[negative] > high
    ):
        return f"a weight its Q saturates at {high}"
    return ""


# how far inside its code's rounding interval (in steps) a folded float weight is held: the
# FP32 products w * s and scale * |s| move a quotient by about 1e-5 of a step at code 127,
# which at a tie is the other code; this margin is clear of the division's own rounding
# (float32 as ONNX Runtime computes it, or float64)
_TIE_MARGIN = 1e-3


def _folded_values(
    weight: _QuantizedWeight, s: np.ndarray, new_scale: np.ndarray
) -> np.ndarray | None:
    """The folded weight to store: integers negated where s < 0, or a float weight times s
    whose new Q gives each value the code the exported Q gave it, negated where s < 0 (None
    where one does not). Why not w * s alone: rounded to FP32, a weight near a rounding tie
    took the next code (76 of 512 weights built near ties). A value outside its code's
    interval, or within `_TIE_MARGIN` of its edge, moves just inside it, and one its type
    rounds back out (FP16) a few ulps further: the float weight stays the one a `dequantize:
    true` op reads. One still off takes its code times the new scale."""
    per = (-1, *[1] * (weight.values.ndim - 1))
    flip = np.where(s < 0, -1, 1).reshape(per)
    if weight.stored:
        return (weight.values * flip).astype(np.int8)
    codes = _integers(weight) * flip
    step = new_scale.astype(np.float64).reshape(per)
    folded = (weight.values.astype(np.float64) * s.reshape(per)).astype(weight.values.dtype)
    exact = folded.astype(np.float64) / step
    bottom, top = INTEGER_BOUNDS["int8"]
    low = np.where(codes <= bottom, -np.inf, codes - 0.5 + _TIE_MARGIN)
    high = np.where(codes >= top, np.inf, codes + 0.5 - _TIE_MARGIN)
    inside = np.clip(exact, low, high)
    folded = np.where(inside == exact, folded, (inside * step).astype(folded.dtype))
    grid = (codes * step).astype(folded.dtype)
    for _ in range(4):  # an FP16 weight rounds back over the edge: a few ulps inward
        off = quantize(folded, new_scale, "int8", axis=0) != codes
        folded[off] = np.nextafter(folded[off], grid[off])
    off = quantize(folded, new_scale, "int8", axis=0) != codes
    folded[off] = grid[off]
    return None if np.any(quantize(folded, new_scale, "int8", axis=0) != codes) else folded


def _folded_weight(
    values: np.ndarray, stored: bool, new_scale: np.ndarray, stem: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The folded weight `values` (`_folded_values`) as (Q and) DQ nodes writing `stem`,
    each output channel's scale `new_scale` (its old scale times |s|, checked > 0 by the
    caller): stored integers behind a DQ, a float weight behind a Q and a DQ."""
    values = numpy_helper.from_array(values, f"{stem}_int8" if stored else f"{stem}_float")
    inits = [
        values,
        numpy_helper.from_array(new_scale, f"{stem}_scale"),
        numpy_helper.from_array(np.zeros(new_scale.shape, np.int8), f"{stem}_zero_point"),
    ]
    params = [inits[1].name, inits[2].name]
    nodes, quantized = [], values.name
    if not stored:
        quantized = f"{stem}_quantized"
        q = helper.make_node(QUANTIZE, [values.name, *params], [quantized], axis=0)
        q.name = f"{stem}_{QUANTIZE}"
        nodes.append(q)
    dq = helper.make_node(DEQUANTIZE, [quantized, *params], [stem], axis=0)
    dq.name = f"{stem}_{DEQUANTIZE}"
    return [*nodes, dq], inits
