"""Write the assignment into the graph: a strongly typed mixed-precision ONNX model.

TensorRT 11 (and TensorRT-RTX) take precision from the tensor types alone, so
this is where a policy takes effect. Invariants, each of which a naive
converter breaks:
- a value keeps the type its producer computes it in; a `Cast` is inserted only
  where a consumer needs another type, once per (tensor, type);
- FP32 results reach graph outputs in FP32; graph input/output dtypes are kept;
- integer, bool and shape tensors never change type;
- weights are converted, never clamped; one that overflows FP16 is reported.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtbuild.graph.optypes import (
    DTYPE_NAME,
    FLOAT_TYPES,
    FLOAT_WHEN_ABSENT,
    PRECISION_DTYPE,
    TYPE_ATTRIBUTES,
    OpTypes,
    as_float_type,
)
from trtbuild.graph.subgraphs import all_nodes, bodies, new_name, node_reads
from trtbuild.graph.view import GraphView
from trtbuild.numerics import FP16_MAX, LOW_INF_AT
from trtbuild.precision.assign import Assignment
from trtbuild.precision.quantized import read_around

if TYPE_CHECKING:
    from trtbuild.graph.qdq import QdqNode

_FIXED = {
    "tensor(float)": TensorProto.FLOAT,
    "tensor(float16)": TensorProto.FLOAT16,
    "tensor(bfloat16)": TensorProto.BFLOAT16,
}
_BODY_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


@dataclass
class CastRecord:
    node: str
    tensor: str  # the tensor's name in the source (prepared) graph
    to: str  # fp16 | bf16 | fp32


@dataclass
class Converted:
    model: onnx.ModelProto
    casts: list[CastRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class _Names:
    """Every value and node name of the converted model: the source's, in every graph, and
    each one made here, so that a name made here is new.

    Why one registry: a made name (`face__fp16`, `trtbuild/cast_fp32/face`) may be the
    source's already, as in a model trtbuild converted once that `prepare` made compute in
    FP32 again. A second value of one name breaks single assignment (onnx.checker refuses
    it), a second node of one name ONNX Runtime refuses: exit 70.
    """

    def __init__(self, view: GraphView):
        self.taken = {*view.producer, *view.consumers, *view.initializers, *view.dtype}
        self.taken.update(view.inputs)
        self.nodes = {n.name for n in view.nodes}

    def fresh(self, base: str) -> str:
        """`base`, or `base` with underscores appended until no value has that name."""
        return new_name(base, self.taken)

    def node(self, base: str) -> str:
        """`base`, or `base` with underscores appended until no node has that name."""
        return new_name(base, self.nodes)


class _Rewriter:
    """Rewrites one graph (the main graph, or a body with `parent` the rewriter around it).

    A value is owned by the rewriter of the graph that defines it: a body that
    reads an outer value in another type asks the owner for the cast, which
    the owner emits before the control node (once, outside any loop).
    """

    def __init__(
        self,
        assignment: Assignment,
        members: list[int] | None = None,
        graph: onnx.GraphProto | None = None,
        parent: _Rewriter | None = None,
    ):
        self.a = assignment
        self.view: GraphView = assignment.view
        self.graph = graph if graph is not None else self.view.graph
        self.members = members if members is not None else self.view.top
        self.parent = parent
        self.root: _Rewriter = parent.root if parent is not None else self
        self.nodes: list[onnx.NodeProto] = []
        inputs = [i.name for i in self.graph.input if i.name] if parent else self.view.inputs
        self.actual: dict[str, str] = {n: n for n in inputs}  # source name -> new name
        self.dtype: dict[str, int] = {n: self.view.dtype[n] for n in inputs if n in self.view.dtype}
        self.cast_cache: dict[tuple[str, int], str] = {}
        self.origin: dict[str, str] = {}  # new name -> source name
        self.casts: list[CastRecord] = []
        self.init_uses: dict[str, list[tuple[onnx.NodeProto, int, int]]] = defaultdict(list)
        # the root's: (weight, type) -> the name of its copy in that type that a body reads
        # (named here: a body is copied into its control node before the weights are made)
        self.body_weights: dict[tuple[str, int], str] = {}
        self.graph_outputs = set(self.view.outputs) if parent is None else set()
        self.scales: _Scales | None = None  # the root's, where the model is quantized
        self.plans: dict[tuple, _Planned] = {}  # the root's: `_plan`'s, by what a plan reads
        self.names = parent.names if parent is not None else _Names(self.view)

    def owner(self, tensor: str) -> _Rewriter:
        """The rewriter of the graph that defines `tensor` (this one, or one around it)."""
        rw: _Rewriter | None = self
        while rw is not None:
            if tensor in rw.actual:
                return rw
            rw = rw.parent
        return self

    def current(self, tensor: str) -> int | None:
        if tensor in self.view.initializers:
            return self.view.dtype.get(tensor)
        rw = self.owner(tensor)
        return rw.dtype.get(rw.actual.get(tensor, tensor), self.view.dtype.get(tensor))

    def cast(self, src: str, to: int, source_name: str) -> str:
        key = (src, to)
        if key not in self.cast_cache:
            dst = self.names.fresh(f"{source_name}__{DTYPE_NAME[to]}")
            name = self.names.node(f"trtbuild/cast_{DTYPE_NAME[to]}/{source_name.lstrip('/')}")
            self.nodes.append(helper.make_node("Cast", [src], [dst], name=name, to=to))
            self.casts.append(CastRecord(name, source_name, DTYPE_NAME[to]))
            self.cast_cache[key] = dst
            self.dtype[dst] = to
            self.origin[dst] = source_name
        return self.cast_cache[key]

    def run(self) -> tuple[list[onnx.NodeProto], list[CastRecord]]:
        for i in self.members:
            node = self.view.nodes[i]
            if self.root.scales is not None and _emit_qdq(self, i):  # a Q/DQ: `quantized`'s
                continue
            new = onnx.NodeProto()
            new.CopyFrom(node)
            want_in, out = _plan(self, i)
            self._inputs(_bypass(self, i, node, want_in), new, want_in)  # dequantize: true
            for attr in new.attribute if i in self.view.body_of else ():  # those with a body
                if attr.type == onnx.AttributeProto.GRAPH:
                    attr.g.CopyFrom(_rewrite_body(self, i, attr.name))
            _fix_attributes(new, out)
            post = self._outputs(node, new, out)
            self.nodes.append(new)
            self.nodes.extend(post)
        return self.nodes, self.casts

    def _inputs(self, node: onnx.NodeProto, new: onnx.NodeProto, want_in: list) -> None:
        for k, t in enumerate(node.input):
            if not t:
                continue
            if t in self.view.initializers:
                _read_weight(self, new, k, t, want_in[k])
                continue
            owner = self if t in self.actual else self.owner(t)
            src = owner.actual.get(t, t)
            cur = owner.dtype.get(src, self.view.dtype.get(t))
            if want_in[k] is not None and cur is not None and cur != want_in[k]:
                new.input[k] = owner.cast(src, want_in[k], t)
            else:
                new.input[k] = src

    def _outputs(self, node: onnx.NodeProto, new: onnx.NodeProto, out: list) -> list:
        """Record each output's type; a main-graph output computed in another type is cast back."""
        post = []
        for k, o in enumerate(node.output):
            if not o:
                continue
            d = out[k] if out[k] is not None else self.view.dtype.get(o)
            exported = self.view.dtype.get(o)
            if o in self.graph_outputs and d is not None and exported is not None and d != exported:
                internal = self.names.fresh(f"{o}__{DTYPE_NAME[d]}")
                new.output[k] = internal
                self.actual[o], self.dtype[internal] = internal, d
                self.origin[internal] = o  # declared: shaped as the output, typed `d`
                name = self.names.node(f"trtbuild/cast_{DTYPE_NAME[exported]}/{o.lstrip('/')}")
                post.append(helper.make_node("Cast", [internal], [o], name=name, to=exported))
                self.casts.append(CastRecord(name, o, DTYPE_NAME[exported]))
                self.cast_cache[(internal, exported)] = o
                self.dtype[o] = exported
            else:
                self.actual[o] = o
                if d is not None:
                    self.dtype[o] = d
        return post


class _Scales:
    """Each Q/DQ's scale as an initializer in the node's type, one value per group.

    Why new initializers and not the converted weight: a group's members may
    compute in two types (a Q after an FP16 op, its DQ before an FP32 pin), and
    both must hold the same value (`quantized.group_value`); the FP32 one then
    holds the FP16-rounded value. The exported scale is never changed in place.
    """

    def __init__(self, assignment: Assignment, fresh: Callable[[str], str]):
        self.a = assignment
        self.fresh = fresh  # `_Names.fresh`: a scale's copy is a value of the model too
        self.qdq = assignment.qdq  # the index the assignment read (one per analysis)
        self.tensors: list[onnx.TensorProto] = []
        self.names: dict[tuple, str] = {}  # (tensor, type, what makes its value) -> name
        self.q_clones: dict[tuple[str, int], str] = {}  # (Q output, type) -> its clone's
        self.regridded: set[str] = set()  # weights a Q read, now read as `on_grid` copies

    def precisions(self, i: int) -> tuple[str, ...]:
        return self.a.dq_precisions.get(i) or (self.a.precision_of(i) or "fp32",)

    def unused_dropped(
        self, initializers: list[onnx.TensorProto], nodes: list[onnx.NodeProto]
    ) -> list[onnx.TensorProto]:
        """Without the exported scales that every Q/DQ now reads in its own type."""
        replaced = {n.scale for n in self.qdq.nodes.values()} - set(self.names.values())
        replaced |= self.regridded
        # a control-flow node's bodies read outer values too
        read = {t for node in nodes for t in node_reads(node)} | set(self.a.view.outputs)
        return [t for t in initializers if t.name not in replaced or t.name in read]

    def dequantized(self, dq: int, dtype: int) -> str:
        """The float initializer of a weight DQ `dq`'s output, in `dtype` (made once)."""
        node = self.qdq.nodes[dq]
        # one copy per weight and dequantization: a tied INT8 weight two DQs read with
        # their own scales is two float weights (one key by the weight alone gave the
        # second reader the first's values)
        key = (node.quantized, dtype, b"dequantized", *_dequantization(node))
        if key not in self.names:
            from trtbuild.graph.qdq import dequantize

            q = numpy_helper.to_array(self.a.view.initializers[node.quantized])
            value = dequantize(q, node.scale_value, node.zero_value, node.axis, node.block_size)
            name = self.fresh(f"{node.quantized}__dequantized_{DTYPE_NAME[dtype]}")
            self.tensors.append(_tensor(value, dtype, name))
            self.names[key] = name
        return self.names[key]

    def on_grid(self, i: int, dtype: int) -> str | None:
        """The weight a constant weight's Q `i` reads where its scale is held rounded
        (`group_value`): the codes the exported scale gives, each times the rounded scale,
        in `dtype`. None where the scale is held as exported (or the Q reads no weight).

        Why: quantized anew at the rounded scale, a weight near a rounding boundary takes
        the next code; one FP8 step is an eighth of its value, so ModelOpt's FP8 GFPGAN's
        weight DQs differed from the quantized graph's by 11% of their range, named as the
        first divergence, for a scale FP16 moved by 0.03%. On the rounded grid each weight
        quantizes back to its exported code, and Q and DQ still hold one scale.
        """
        from trtbuild.graph.qdq import dequantize, quantize
        from trtbuild.precision.quantized import group_value

        node = self.qdq.nodes[i]
        weight = self.a.view.initializers.get(node.float_tensor)
        if weight is None or node.is_dq or node.scale_value is None:
            return None
        group = self.qdq.group_of[i]
        types = {PRECISION_DTYPE[p] for m in group.members for p in self.precisions(m)}
        held = group_value(self.qdq, i, types)
        if held is None or np.array_equal(held, node.scale_value.astype(np.float32)):
            return None
        key = (node.float_tensor, dtype, held.tobytes() + b"on_grid", *_dequantization(node))
        if key not in self.names:
            zero = None if node.zero_value is None else node.zero_value.astype(np.float64)
            values = numpy_helper.to_array(weight)
            how = (zero, node.axis, node.block_size)
            codes = quantize(values, node.scale_value, node.format, *how)
            name = self.fresh(f"{node.float_tensor}__on_grid_{DTYPE_NAME[dtype]}")
            self.tensors.append(_tensor(dequantize(codes, held, *how), dtype, name))
            self.names[key] = name
            self.regridded.add(node.float_tensor)
        return self.names[key]

    def tensor(self, i: int, dtype: int) -> str:
        from trtbuild.precision.quantized import group_value

        node = self.qdq.nodes[i]
        group = self.qdq.group_of[i]
        types = {PRECISION_DTYPE[p] for m in group.members for p in self.precisions(m)}
        value = group_value(self.qdq, i, types)
        if value is None:
            return node.scale  # not a constant: `check` refuses it before any work
        key = (node.scale, dtype, value.tobytes())
        if key not in self.names:
            same = self.a.view.dtype.get(node.scale) == dtype and np.array_equal(
                value, node.scale_value
            )
            name = node.scale if same and node.scale in self.a.view.initializers else None
            if name is None:
                name = self.fresh(f"{node.scale}__{DTYPE_NAME[dtype]}")
                self.tensors.append(_tensor(value, dtype, name))
            self.names[key] = name
        return self.names[key]


def _dequantization(node: QdqNode) -> tuple:
    """What makes a Q/DQ's values of its tensor (scale, zero point, axis, block size): a copy
    made for one is another Q/DQ's only where all of it is the same (a tied weight two DQs
    read with their own scales is two copies)."""
    made = [
        b"" if v is None else v.dtype.str.encode() + v.tobytes()
        for v in (node.scale_value, node.zero_value)
    ]
    return (*made, node.axis, node.block_size)


def _read_weight(rw: _Rewriter, new: onnx.NodeProto, k: int, t: str, want: int | None) -> None:
    """Input `k` of `new` reads weight `t` (a `dequantize: true` op, the float weight behind
    its Q): its use recorded for `_initializers`, which makes the weight in each type its
    uses want; a body reads its copy by the name `_body_weight` gives."""
    new.input[k] = t
    if want is None:
        return
    rw.root.init_uses[t].append((new, k, want))
    if rw.parent is not None and want != rw.view.dtype.get(t):
        new.input[k] = _body_weight(rw, t, want)


def _body_weight(rw: _Rewriter, t: str, dtype: int) -> str:
    """The name of weight `t`'s copy in `dtype` that a body reads: `_initializers` makes the
    copy under it, or renames it in the bodies where it converts `t` in place (a body's
    nodes are copies by then: the uses it patches are not the body's)."""
    key = (t, dtype)
    if key not in rw.root.body_weights:
        rw.root.body_weights[key] = rw.names.fresh(f"{t}__{DTYPE_NAME[dtype]}")
    return rw.root.body_weights[key]


def _emit_qdq(rw: _Rewriter, i: int) -> bool:
    """A Q in its input's precision; a DQ in its consumers', cloned for each other one.

    A DQ clone's output is registered as the cast of the DQ's output to its type,
    so a consumer that needs that type reads the clone, never a Cast. A Q whose
    DQs compute in two types is cloned too, one Q per type (its input cast in
    front of it): TensorRT-RTX's Myelin refuses one Q feeding DQs of two scale
    types ("Invalid binary pointwise types"), and builds a chain per type.
    Returns False where node `i` is no Q/DQ (or the model has none).
    """
    scales = rw.root.scales
    if scales is None or not scales.qdq.is_qdq(i):
        return False
    if i in rw.a.dead_qdq:
        return True  # every op it fed reads around it (`dequantize: true`)
    node = rw.view.nodes[i]
    if not scales.qdq.nodes[i].is_dq:
        _emit_q(rw, i, scales)
        return True
    main = None
    for k, prec in enumerate(scales.precisions(i)):
        d = PRECISION_DTYPE[prec]
        new = onnx.NodeProto()
        new.CopyFrom(node)
        rw._inputs(node, new, [None] * len(node.input))
        new.input[0] = scales.q_clones.get((node.input[0], d), new.input[0])
        new.input[1] = scales.tensor(i, d)
        _drop_output_dtype(new)
        if k == 0:
            rw.nodes.append(new)
            rw.nodes.extend(rw._outputs(node, new, [d]))
            main = rw.actual[node.output[0]]
            continue
        out = rw.names.fresh(f"{node.output[0]}__{DTYPE_NAME[d]}")
        new.output[0], new.name = out, rw.names.node(f"{node.name}/trtbuild_{prec}")
        rw.nodes.append(new)
        rw.dtype[out], rw.origin[out] = d, node.output[0]
        rw.cast_cache[(main, d)] = out
    return True


def _drop_output_dtype(dq: onnx.NodeProto) -> None:
    """A DQ's opset-23 `output_dtype` left out: its output then is its scale's type, the
    one the conversion gives it. (Set to FLOAT16, ONNX Runtime 1.32 refused the model:
    "Type (tensor(float)) of output arg (InsertedPrecisionFreeCast_...)".)"""
    kept = [a for a in dq.attribute if a.name != "output_dtype"]
    if len(kept) != len(dq.attribute):
        del dq.attribute[:]
        dq.attribute.extend(kept)


def _emit_q(rw: _Rewriter, i: int, scales: _Scales) -> None:
    node = rw.view.nodes[i]
    own = PRECISION_DTYPE[scales.precisions(i)[0]]
    group = scales.qdq.group_of[i]
    types = {PRECISION_DTYPE[p] for dq in group.dqs for p in scales.precisions(dq)}
    for d in [own, *sorted(types - {own} if len(types) > 1 else ())]:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        grid = scales.on_grid(i, d)  # a main-graph weight, which a body reads by its name
        rw._inputs(node, new, [None if grid else d] + [None] * (len(node.input) - 1))
        new.input[0] = grid or new.input[0]
        new.input[1] = scales.tensor(i, d)
        if d == own:
            rw.nodes.append(new)
            rw.nodes.extend(rw._outputs(node, new, [None] * len(node.output)))
            continue
        out = rw.names.fresh(f"{node.output[0]}__{DTYPE_NAME[d]}")
        new.output[0], new.name = out, rw.names.node(f"{node.name}/trtbuild_{DTYPE_NAME[d]}")
        rw.nodes.append(new)
        rw.dtype[out] = rw.view.dtype.get(node.output[0], TensorProto.INT8)
        scales.q_clones[(node.output[0], d)] = out


def _bypass(rw: _Rewriter, i: int, node: onnx.NodeProto, want_in: list) -> onnx.NodeProto:
    """A `dequantize: true` op's inputs read around its DQs: the tensor in front of the
    activation's Q, and each quantized weight dequantized once into a float initializer of
    the type the op needs (computed as DequantizeLinear does: (q - zero point) x scale).
    Where the op reads a DQ through a layout chain (DQ -> Transpose -> MatMul), the chain's
    first op reads around it."""
    scales = rw.root.scales
    if scales is None or scales.qdq.layout.get(i, i) not in rw.a.dequantized:
        return node
    bypassed = onnx.NodeProto()
    bypassed.CopyFrom(node)
    for k, t in enumerate(node.input):
        dq = rw.view.producer.get(t) if t else None
        if dq is None or dq not in scales.qdq.nodes or not scales.qdq.nodes[dq].is_dq:
            continue
        if not read_around(rw.view, scales.qdq, dq):
            continue  # a DQ of a graph input or a moved Q: read as it is
        q = rw.view.producer.get(scales.qdq.nodes[dq].quantized)
        if q is not None and q in scales.qdq.nodes:
            bypassed.input[k] = scales.qdq.nodes[q].float_tensor
        else:
            bypassed.input[k] = scales.dequantized(dq, want_in[k] or TensorProto.FLOAT)
    return bypassed


def _main_var(types: OpTypes, exported_out: list[int | None]) -> str | None:
    """The type variable of the node's first float output, where it is one (`T`)."""
    for k, d in enumerate(exported_out):
        if d is not None and types.is_var(types.output_var(k)):
            return types.output_var(k)
    return None


def _exported(dtype: dict[str, int], names) -> list[int | None]:
    """Each value's exported type where it is a float (None: an integer, or no value)."""
    return [d if t and (d := dtype.get(t)) in FLOAT_TYPES else None for t in names]


_Planned = tuple[list[int | None], list[int | None]]  # read only: nodes alike share one


def _plan(rw: _Rewriter, i: int) -> _Planned:
    """Desired dtype of each input and resulting dtype of each output (None: untouched).

    Why remembered (for this conversion only): a plan is a function of the op, its
    precision and the exported types of its inputs and outputs, except where it reads
    a value's current type (`_planned`'s `alike` False); a transformer's layers repeat
    a few dozen such plans over ~10k nodes.
    """
    node = rw.view.nodes[i]
    as_exported_in = _exported(rw.view.dtype, node.input)
    as_exported_out = _exported(rw.view.dtype, node.output)
    prec = rw.a.precision_of(i)
    key = (node.op_type, node.domain, prec, tuple(as_exported_in), tuple(as_exported_out))
    found = rw.root.plans.get(key)
    if found is None:
        found, alike = _planned(rw, i, prec, as_exported_in, as_exported_out)
        if alike:
            rw.root.plans[key] = found
    return found


def _planned(
    rw: _Rewriter,
    i: int,
    prec: str | None,
    as_exported_in: list[int | None],
    as_exported_out: list[int | None],
) -> tuple[_Planned, bool]:
    """`_plan`'s plan, and whether every node alike (`_plan`'s key) has the same one."""
    view, node = rw.view, rw.view.nodes[i]
    types = view.types(i)
    if not types.known or any(a.type in _BODY_TYPES for a in node.attribute):
        return (as_exported_in, as_exported_out), False
    if node.op_type == "BitCast":  # its bits as exported, in and out (assign's `_BITCAST`)
        return (as_exported_in, as_exported_out), True
    target = PRECISION_DTYPE[prec] if prec is not None else None
    main = _main_var(types, as_exported_out) if target is not None else None

    groups: dict[str, list[int]] = defaultdict(list)
    for k, d in enumerate(as_exported_in):
        if d is not None:
            groups[types.input_var(k) or ""].append(k)
    want_in: list[int | None] = [None] * len(node.input)
    resolved: dict[str, int] = {}
    alike = True  # nothing read but the key's
    for var, idxs in groups.items():
        if var in _FIXED:
            d = _FIXED[var]
        elif node.op_type == "Cast":
            d = None  # a Cast takes any type; never cast its input
        elif target is not None and types.allows(var, target):
            d = target  # main var, or a secondary float var that can follow it (Pow's exponent)
        else:
            current = {rw.current(node.input[k]) for k in idxs}
            only = next(iter(current)) if len(current) == 1 else None
            d = only if only is not None and types.allows(var, only) else TensorProto.FLOAT
            alike = False
        if d is not None:
            resolved[var] = d
        for k in idxs:
            want_in[k] = d if d is not None else rw.current(node.input[k])
        alike = alike and d is not None
    out: list[int | None] = [None] * len(node.output)
    inferred: dict[str, int] | None = None
    for k, exported in enumerate(as_exported_out):
        if exported is None:
            continue
        var = types.output_var(k)
        if node.op_type == "Cast" or var == main:
            out[k] = target if target is not None else exported
        elif var in _FIXED:
            out[k] = _FIXED[var]
        elif var in resolved:
            out[k] = resolved[var]
        else:  # bound by no input it is given: what the op's own inference makes it
            if inferred is None:
                inferred, alike = _inferred(view, node, want_in), False
            out[k] = inferred.get(node.output[k], exported)
    return (want_in, out), alike


def _inferred(view: GraphView, node: onnx.NodeProto, want_in: list[int | None]) -> dict[str, int]:
    """The element type of each output ONNX's inference gives `node` on its planned inputs
    (none where it cannot say).

    Why: an output whose type variable no input given binds is typed by the op's inference
    function, not by its schema's constraints: LinearAttention's `present_state` (`S`)
    follows the query where no `past_state` is given, and a LayerNormalization's `Mean`
    (`U`) is its `stash_type` whatever `X` is. Kept as exported, an FP16 LinearAttention
    declared an FP32 state its inference makes FP16, and the full check failed (exit 70).
    """
    from onnx import shape_inference

    given = {}
    for k, t in enumerate(node.input):
        dtype = want_in[k] if want_in[k] is not None else view.dtype.get(t)
        if t and dtype is not None:
            given[t] = helper.make_tensor_type_proto(dtype, None)
    try:
        schema = onnx.defs.get_schema(node.op_type, view.opset, node.domain)
        found = shape_inference.infer_node_outputs(schema, node, given)
    except Exception:  # onnx raises several kinds; the exported types stand
        return {}
    return {n: tp.tensor_type.elem_type for n, tp in found.items() if tp.HasField("tensor_type")}


# -- emission --------------------------------------------------------------


def _rewrite_body(rw: _Rewriter, i: int, attr: str) -> onnx.GraphProto:
    """One body of control node `i`, rewritten, its inputs and outputs in their exported types.

    Why exported types: a Loop's carried values keep one type across
    iterations and an If's branches one type between them only if every
    body hands out what it was declared to; a body that computes its last
    node in FP16 casts it back inside the body.
    """
    graph, members = next((g, m) for a, g, m in rw.view.body_of[i] if a == attr)
    sub = _Rewriter(rw.a, members, graph, rw)
    sub.run()
    control = rw.view.nodes[i]
    scope = f"{control.name}/{attr}"
    outputs = [_seal(sub, vi, control, k, scope) for k, vi in enumerate(graph.output)]
    rw.root.casts.extend(sub.casts)
    body = helper.make_graph(
        sub.nodes,
        graph.name,
        list(graph.input),
        outputs,
        doc_string=graph.doc_string,
        value_info=_value_info(rw.view, sub, graph),
    )
    return body


def _seal(rw: _Rewriter, vi: onnx.ValueInfoProto, control: onnx.NodeProto, k: int, scope: str):
    """A body output in its declared type (the control node's, where the body's is unset)."""
    want = vi.type.tensor_type.elem_type or rw.view.dtype.get(_bound(control, k), 0)
    owner = rw.owner(vi.name)
    src = owner.actual.get(vi.name, vi.name)
    cur = owner.dtype.get(src, rw.view.dtype.get(vi.name))
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    if want in FLOAT_TYPES and cur in FLOAT_TYPES and cur != want:
        dst = rw.names.fresh(f"{scope}/{vi.name}__{DTYPE_NAME[want]}")
        name = rw.names.node(f"trtbuild/cast_{DTYPE_NAME[want]}/{scope}/{vi.name.lstrip('/')}")
        rw.nodes.append(helper.make_node("Cast", [src], [dst], name=name, to=want))
        rw.casts.append(CastRecord(name, vi.name, DTYPE_NAME[want]))
        src = dst
    out.name = src
    if want and not out.type.tensor_type.elem_type:
        out.type.tensor_type.elem_type = want
    return out


def _fix_attributes(new: onnx.NodeProto, out: list[int | None]) -> None:
    """The attribute that names the output's float type (a Cast's `to`, an EyeLike's
    `dtype`, `TYPE_ATTRIBUTES`) and a ConstantOfShape's value in the type the node now
    computes in. (An EyeLike with `dtype` FLOAT made FP16 made a model onnx.checker
    refused: exit 70.)"""
    named = TYPE_ATTRIBUTES.get(new.op_type)
    if (named is None and new.op_type not in FLOAT_WHEN_ABSENT) or not out or not out[0]:
        return  # nothing else carries a float type in an attribute
    absent = FLOAT_WHEN_ABSENT.get(new.op_type)
    if absent and out[0] != TensorProto.FLOAT and all(a.name != absent for a in new.attribute):
        zero = np.zeros(1, helper.tensor_dtype_to_np_dtype(out[0]))
        typed = numpy_helper.from_array(zero) if absent == "value" else out[0]
        new.attribute.append(helper.make_attribute(absent, typed))  # FLOAT's default, retyped
        return
    for attr in new.attribute:
        if attr.name == named and attr.i in FLOAT_TYPES:
            attr.i = out[0]
        retype = attr.t.data_type in FLOAT_TYPES and attr.t.data_type != out[0]
        if new.op_type == "ConstantOfShape" and attr.name == "value" and retype:
            value = numpy_helper.to_array(attr.t).astype(np.float32)
            attr.t.CopyFrom(_tensor(value, out[0], attr.t.name))


def _tensor(array: np.ndarray, dtype: int, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(as_float_type(array, dtype), name)


def _initializers(
    view: GraphView, rw: _Rewriter, peaks: dict[str, float]
) -> tuple[list[onnx.TensorProto], list[str]]:
    """Every weight in each type its consumers need (in place where one type serves all),
    and a warning for each one FP16 turns into inf (`peaks`: the analysis' finite peaks,
    measured once per graph, not once per conversion)."""
    initializers: list[onnx.TensorProto] = []
    renamed: dict[str, str] = {}  # a body's name for a weight's copy -> the weight's own
    halves = _Halves()
    halved: list[str] = []  # the weights converted to FP16, in the graph's order
    for t in view.graph.initializer:
        uses = rw.init_uses.get(t.name)
        if not uses:  # read by no converted input: kept as it is
            initializers.append(t)
            continue
        wanted = {d for _, _, d in uses}
        exported = t.data_type
        other_uses = len(view.consumers.get(t.name, [])) > len(uses) or t.name in rw.graph_outputs
        in_place = len(wanted) == 1 and exported not in wanted and not other_uses
        if not in_place:
            initializers.append(t)
        array = None
        for d in sorted(wanted - {exported}):
            named = rw.body_weights.get((t.name, d))  # a body reads the copy by this name
            name = t.name if in_place else named or rw.names.fresh(f"{t.name}__{DTYPE_NAME[d]}")
            if named and name != named:
                renamed[named] = name
            half = d == TensorProto.FLOAT16
            if half:
                halved.append(t.name)
            if half and _Halves.takes(t):
                initializers.append(halves.add(t, name))
            else:
                if array is None:  # read only: no copy where it is FP32 already
                    array = numpy_helper.to_array(t).astype(np.float32, copy=False)
                initializers.append(_tensor(array, d, name))
            for node, k, want in uses:
                if want == d:
                    node.input[k] = name
    halves.flush()
    _rename_in_bodies(rw.nodes, renamed)
    beyond = [n for n in halved if peaks.get(n, 0.0) >= LOW_INF_AT["fp16"]]
    return initializers, [_beyond_fp16(n, peaks[n]) for n in beyond]


def _rename_in_bodies(nodes: list[onnx.NodeProto], renamed: dict[str, str]) -> None:
    """Where a body reads a weight converted in place, its name for the copy becomes the
    weight's own (the bodies, copied into their control nodes, are renamed there)."""
    if not renamed:
        return
    for node in nodes:
        for _, body in bodies(node):
            for inner in body.node:
                inner.input[:] = [renamed.get(t, t) for t in inner.input]
            _rename_in_bodies(list(body.node), renamed)


def _beyond_fp16(name: str, peak: float) -> str:
    """The warning for a weight that FP16 turns into inf: said, not clamped."""
    return (
        f"weight {name} reaches {peak:.4g}, beyond FP16's {FP16_MAX:g}: it becomes "
        "inf in FP16 (precision.guards: true pins its consumers; or match: "
        f"{{initializer_abs_above: {FP16_MAX:g}}})"
    )


class _Halves:
    """Small FP32 weights converted to FP16 together, a few MiB at a time.

    Why: converting one weight (to numpy, `as_float_type`, back to a TensorProto) costs
    about 10 µs of Python around well under one of work, and a transformer with small
    weights has thousands (2,800 on the benchmark's 10k nodes: 31 ms alone, 10 ms
    together). Large weights take the general path, and a batch is converted as soon as
    it holds `CHUNK` bytes or more (at most `CHUNK + SMALL`).
    """

    SMALL = 1 << 16  # bytes of a weight batched
    CHUNK = 1 << 24  # bytes of FP32 converted at once

    def __init__(self) -> None:
        self.pending: list[tuple[onnx.TensorProto, onnx.TensorProto]] = []
        self.size = 0

    @staticmethod
    def takes(t: onnx.TensorProto) -> bool:
        """Stored as raw FP32 in the model (ONNX's raw data is little-endian), small, and
        not empty."""
        return (
            t.data_type == TensorProto.FLOAT
            and t.data_location != TensorProto.EXTERNAL
            and 0 < len(t.raw_data) <= _Halves.SMALL
            and len(t.raw_data) == 4 * math.prod(t.dims)
        )

    def add(self, t: onnx.TensorProto, name: str) -> onnx.TensorProto:
        """`t` in FP16 as `name`: its bytes are filled by `flush`."""
        out = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT16, dims=t.dims)
        self.pending.append((t, out))
        self.size += len(t.raw_data)
        if self.size >= self.CHUNK:
            self.flush()
        return out

    def flush(self) -> None:
        """Convert the pending weights at once, each one's bytes into its FP16 tensor."""
        if not self.pending:
            return
        flat = np.concatenate([np.frombuffer(t.raw_data, dtype="<f4") for t, _ in self.pending])
        half = as_float_type(flat, TensorProto.FLOAT16).astype("<f2", copy=False).tobytes()
        start = 0
        for t, out in self.pending:
            end = start + len(t.raw_data) // 2  # FP16: half the bytes
            out.raw_data = half[start:end]
            start = end
        self.pending, self.size = [], 0


def _bound(control: onnx.NodeProto, k: int) -> str:
    """The control node's output that a body's output `k` becomes (Loop: after its condition)."""
    k = k - 1 if control.op_type == "Loop" else k
    return control.output[k] if 0 <= k < len(control.output) else ""


def _value_info(
    view: GraphView, rw: _Rewriter, graph: onnx.GraphProto | None = None
) -> list[onnx.ValueInfoProto]:
    """The inferred types, retyped where a value changed precision, and the casts' outputs."""
    copied = onnx.GraphProto()  # one copy made by protobuf, retyped in place: ~10k values
    copied.value_info.extend((graph if graph is not None else view.graph).value_info)
    dtype, outputs = rw.dtype, rw.graph_outputs
    value_info = []
    for vi in copied.value_info:
        d = dtype.get(vi.name)
        if d is not None and vi.name not in outputs:
            vi.type.tensor_type.elem_type = d
            value_info.append(vi)
    for made, src in rw.origin.items():
        if src in view.shape:
            new_vi = helper.make_value_info(made, onnx.TypeProto())
            new_vi.type.CopyFrom(view.shape[src])
            new_vi.type.tensor_type.elem_type = rw.dtype[made]
            value_info.append(new_vi)
    return value_info


def convert(assignment: Assignment) -> Converted:
    """Return the mixed-precision model for `assignment` (the source model is not modified)."""
    view = assignment.view
    rw = _Rewriter(assignment)
    rw.scales = _Scales(assignment, rw.names.fresh) if assignment.dq_precisions else None
    nodes, casts = rw.run()
    initializers, warnings = _initializers(view, rw, assignment.analysis.weight_peaks())
    if rw.scales is not None:
        initializers = rw.scales.unused_dropped(initializers, nodes) + rw.scales.tensors
    value_info = _value_info(view, rw)
    graph = view.graph
    model = onnx.ModelProto(  # made in place: `helper.make_model` copies the graph again
        ir_version=view.model.ir_version,
        producer_name="trtbuild",
        opset_import=view.model.opset_import,
        metadata_props=view.model.metadata_props,
    )
    new_graph = model.graph
    new_graph.name = graph.name
    if graph.doc_string:  # as `make_graph`: an empty one is not written
        new_graph.doc_string = graph.doc_string
    new_graph.node.extend(nodes)
    new_graph.input.extend(graph.input)
    new_graph.output.extend(graph.output)
    new_graph.initializer.extend(initializers)
    new_graph.value_info.extend(value_info)
    return Converted(model, casts, warnings + _fills_beyond_fp16(view, model))


def _fills_beyond_fp16(view: GraphView, model: onnx.ModelProto) -> list[str]:
    """The warning for a ConstantOfShape whose fill FP16 turns into inf (Hugging Face's
    `torch.full(..., finfo.min)` mask under a dynamic shape, which no fold makes a weight
    the weight warning would name)."""
    source = {n.name: n for n in view.nodes if n.op_type == "ConstantOfShape"}
    said = []
    for new in all_nodes(model):
        old = source.get(new.name) if new.op_type == "ConstantOfShape" else None
        if old is None:
            continue
        fill = {a.name: a.t for a in new.attribute}.get("value")
        was = {a.name: a.t for a in old.attribute}.get("value")
        if fill is None or was is None or fill.data_type != TensorProto.FLOAT16:
            continue
        before = float(numpy_helper.to_array(was).reshape(-1)[0])
        if math.isfinite(before) and abs(before) >= LOW_INF_AT["fp16"]:
            said.append(
                f"ConstantOfShape {new.name} fills {before:.4g}, beyond FP16's {FP16_MAX:g}: "
                "its FP16 fill is inf (pin its readers FP32 where inf changes what they compute)"
            )
    return said
