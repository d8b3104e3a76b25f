"""The graph inputs TensorRT takes for shape tensors: integers whose values decide shapes.

Why found from the graph: TensorRT's builder needs the values of each such input (a
Resize's `sizes`, a Reshape's `shape`, TopK's `K`) in the optimization profile, and
stops at the end of the build without them; `check` runs no TensorRT, yet should refuse
what `build` would. So this finds them as TensorRT's ONNX parser does: an int32 or int64
input of rank 0 or 1 whose values reach an operand that is a shape (`SHAPE_OPERANDS`),
directly or through ops that compute on shapes (`SHAPE_CARRIERS`). The build asks
TensorRT itself (`is_shape_tensor` once the network is parsed); both tables were read off
TensorRT-RTX 1.7's parser (tests/engine/test_shape_inputs.py compares them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto

from trtbuild.errors import UsageError
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.view import GraphView

# Each op's inputs that TensorRT reads as shape tensors, by index, with their ONNX names.
# Not NonMaxSuppression's max_output_boxes_per_class nor Trilu's k: the parser reads those
# as data (an input feeding them alone is no shape tensor).
SHAPE_OPERANDS: dict[str, dict[int, str]] = {
    "Reshape": {1: "shape"},
    "Expand": {1: "shape"},
    "Tile": {1: "repeats"},
    "ConstantOfShape": {0: "input"},
    "Range": {0: "start", 1: "limit", 2: "delta"},
    "Resize": {3: "sizes"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
    "TopK": {1: "K"},
    "Pad": {1: "pads", 3: "axes"},
    "OneHot": {1: "depth"},
    "Split": {1: "split"},
    "CumSum": {1: "axis"},
}
# Ops whose inputs are shape tensors where their output is one: TensorRT computes a shape
# from shapes, on the host (`Concat` of a batch and a length, `Gather` of one dim, `Add`)
SHAPE_CARRIERS = frozenset(
    {
        *("Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Concat"),
        *("Gather", "Slice", "Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Sum"),
        *("Neg", "Abs", "Sign", "Where", "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax"),
        *("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or"),
    }
)
# The shape operands TensorRT-RTX 1.7 builds with whatever length its input has (the
# length is the data's rank there, known once the profile is): every other one it needs
# of a fixed length (`unfixed_lengths`)
LENGTH_FREE = frozenset({("Tile", 1), ("Split", 1)})
# The dtypes a shape tensor may have (`IOptimizationProfile.set_shape_input`)
SHAPE_DTYPES = frozenset({TensorProto.INT32, TensorProto.INT64})


def shape_inputs(view: GraphView) -> dict[str, str]:
    """Each graph input TensorRT takes for a shape tensor, with the operand its values
    decide (`its values decide the sizes of Resize node up`), the first in the graph's
    order where several."""
    found: dict[str, str] = {}
    for name, _, what in _operands_reached(view, {n for n in view.inputs if is_candidate(view, n)}):
        found.setdefault(name, what)
    return {n: found[n] for n in view.inputs if n in found}  # the model's input order


def unfixed_lengths(view: GraphView) -> dict[str, str]:
    """Each shape input whose length the model leaves dynamic (`[N]`) and whose values reach
    an operand TensorRT needs of a fixed length, with what they decide there.

    Why refused from the graph: TensorRT-RTX 1.7's parser refuses such a node as if its op
    were unsupported (Reshape, Expand, Resize, Slice, Pad, ConstantOfShape, OneHot), fails
    the build (CumSum, Range) or dies (TopK, SIGSEGV), whatever the profile says; only
    Tile's repeats and Split's split build (`LENGTH_FREE`), and an operand whose length the
    graph fixes on the way (a `Gather` of one entry) is fine. Measured with real builds in
    tests/engine/test_shape_inputs.py."""
    dynamic = {n for n in view.inputs if is_candidate(view, n) and not _fixed_length(view, n)}
    found: dict[str, str] = {}
    for name, (node, k, tensor), what in _operands_reached(view, dynamic):
        if (node.op_type, k) not in LENGTH_FREE and not _fixed_length(view, tensor):
            found.setdefault(name, what)
    return {n: found[n] for n in view.inputs if n in found}


def _operands_reached(
    view: GraphView, candidates: set[str]
) -> Iterator[tuple[str, tuple[onnx.NodeProto, int, str], str]]:
    """Each candidate input whose values reach a shape operand, the operand (its node, index
    and tensor) and what the values decide there, in the graph's order."""
    if not candidates:
        return
    for node in view.nodes:
        operands = SHAPE_OPERANDS.get(node.op_type)
        if operands is None or node.domain not in DEFAULT_DOMAINS:
            continue
        for k, role in operands.items():
            if k < len(node.input) and node.input[k]:
                named = node.name or "(unnamed)"
                what = f"its values decide the {role} of {node.op_type} node {named}"
                for name in sorted(_inputs_behind(view, node.input[k], candidates)):
                    yield name, (node, k, node.input[k]), what


def size_cone(view: GraphView) -> tuple[list[str], set[str]]:
    """The inputs of rank 0 or 1 (int32, int64) whose values reach a shape operand through
    any computation, floats included (a length halved in float for a Slice's end): what
    decides a size, whether or not TensorRT's parser takes it for a shape tensor (a float
    on the way makes it data to the parser, computed on the device); and every value on
    the way back from a shape operand (the cone): only there is arithmetic on such an
    input a size's (a padding mask made from the same lengths is data)."""
    from trtbuild.graph.optypes import SHAPE_READERS

    candidates = {n for n in view.inputs if is_candidate(view, n)}
    if not candidates:
        return [], set()
    found: set[str] = set()
    cone: set[str] = set()
    for node in view.nodes:
        operands = SHAPE_OPERANDS.get(node.op_type)
        if operands is None or node.domain not in DEFAULT_DOMAINS:
            continue
        todo = [node.input[k] for k in operands if k < len(node.input) and node.input[k]]
        seen: set[str] = set()
        while todo:
            t = todo.pop()
            if t in seen or t in view.initializers:
                continue
            seen.add(t)
            cone.add(t)
            found.update({t} & candidates)
            k = view.producer.get(t)
            if k is not None and view.nodes[k].op_type not in SHAPE_READERS:  # not its values
                todo.extend(i for i in view.nodes[k].input if i)
    return [n for n in view.inputs if n in found], cone


def _fixed_length(view: GraphView, tensor: str) -> bool:
    """Whether the graph fixes `tensor`'s dims (a scalar, or `[4]`): what TensorRT's parser
    needs of a shape operand. A tensor the graph gives no shape is not fixed."""
    if tensor in view.initializers:
        return True
    declared = view.shape.get(tensor)
    if declared is None or not declared.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in declared.tensor_type.shape.dim)


def is_candidate(view: GraphView, name: str) -> bool:
    """An input TensorRT could take for a shape tensor: int32 or int64, of rank 0 or 1."""
    declared = view.shape.get(name)
    if view.dtype.get(name) not in SHAPE_DTYPES or declared is None:
        return False
    return declared.tensor_type.HasField("shape") and len(declared.tensor_type.shape.dim) <= 1


def _inputs_behind(view: GraphView, tensor: str, candidates: set[str]) -> set[str]:
    """The candidate inputs whose values reach `tensor` through shape carriers alone."""
    found, seen, todo = set(), set(), [tensor]
    while todo:
        t = todo.pop()
        if t in seen or view.is_float(t):
            continue
        seen.add(t)
        if t in candidates:
            found.add(t)
        k = view.producer.get(t)
        node = view.nodes[k] if k is not None else None
        if node is not None and node.op_type in SHAPE_CARRIERS:
            todo.extend(i for i in node.input if i and i not in view.initializers)
    return found


@dataclass(frozen=True)
class ShapeValues:
    """The values one shape input takes at the optimization profile's min, opt and max, or
    why they are not known (a refusal: the `UsageError`'s message, where and hint).

    Why values and a refusal in one: the build asks TensorRT which inputs are shape
    tensors only once the network is parsed, in its child process; the parent works out
    both for every input that could be one, and the child sets the values of those
    TensorRT names, or raises the refusal (`engine.backends`)."""

    name: str
    min: tuple[int, ...] = ()
    opt: tuple[int, ...] = ()
    max: tuple[int, ...] = ()
    refused: tuple[str, str | None, str | None] | None = None
    # each point judged (its name, `opt=min` where merged): the values fed there, each once
    points: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """build.json's record of what the engine's profile was given (`engines.VARIANT.
        shape_inputs.NAME`), and the values each point fed, which lie between min and max:
        the values the engine is known to have been judged at."""
        points = {name: [list(v) for v in values] for name, values in self.points}
        return {
            "min": list(self.min),
            "opt": list(self.opt),
            "max": list(self.max),
            "points": points,
        }

    def error(self) -> UsageError:
        """The refusal, as the error the CLI says (exit 2)."""
        message, where, hint = self.refused or (f"no values of {self.name}", None, None)
        return UsageError(message, where=where, hint=hint)
