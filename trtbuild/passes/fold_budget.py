"""Which constants are too large to fold, known before any of them is computed.

Why: onnx-graphsurgeon folds by running every constant subgraph in one ONNX
Runtime session, and its `size_threshold` skips only outputs whose static shape
is known oversized; an oversized intermediate on the way to them is computed
all the same. A 182-byte model whose `ConstantOfShape([1000, 1000, 1000])` feeds a
reduction took 4.1 GB in `trtbuild prepare`. So the size of every output a fold
would compute is read first, from shape inference (with data propagation, so
shapes computed from constants are known), and a node whose output would
exceed the memory budget is excluded from the fold (its readers stay unfolded
with it); the model keeps computing it at run time, as it was exported to.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from trtbuild.graph import subgraphs
from trtbuild.graph.model_io import infer_shapes
from trtbuild.graph.optypes import (
    NOT_TENSOR_OPS,  # onnx-graphsurgeon's fold holds arrays only
    SHAPE_READERS,
)
from trtbuild.sizes import fmt_bytes

# Ops whose output can be far larger than their inputs: when shape inference cannot
# tell their output's size, the fold cannot be bounded, so they are not folded.
GROWING_OPS = frozenset(
    {"ConstantOfShape", "Expand", "Tile", "Range", "Resize", "Upsample", "Pad", "OneHot"}
    | {"RandomNormal", "RandomUniform", "EyeLike", "Col2Im", "ScatterND"}
)


def oversized(model: onnx.ModelProto, budget: int) -> list[dict[str, str]]:
    """`{"name", "why"}` for every node a fold must not compute: its output exceeds `budget`
    bytes, or it is a growing op whose output size is unknown before folding.

    Only nodes a fold would compute are looked at: those whose inputs are all
    constants (or shapes already static), in the main graph and in bodies.
    """
    inferred = infer_shapes(model, anew=True)
    found: list[dict[str, str]] = []
    _scan(inferred.graph, set(), budget, found)
    return found


def _scan(graph: onnx.GraphProto, outer: set[str], budget: int, found: list) -> None:
    shapes = {vi.name: vi.type for vi in (*graph.value_info, *graph.output, *graph.input)}
    constant = outer | {t.name for t in graph.initializer} | {""}
    for node in graph.node:
        if _computed_by_fold(node, constant, shapes):
            why = _too_large(node, shapes, budget)
            if why is None:
                constant.update(node.output)
            else:
                found.append({"name": node.name, "why": why})
        for _, body in subgraphs.bodies(node):
            _scan(body, constant, budget, found)


def _computed_by_fold(node: onnx.NodeProto, constant: set[str], shapes: dict) -> bool:
    if node.op_type in SHAPE_READERS:  # folded from a static shape, whatever the input's values
        return node.input[0] in constant or _nbytes(shapes.get(node.input[0])) is not None
    return all(t in constant for t in subgraphs.node_reads(node))


def _too_large(node: onnx.NodeProto, shapes: dict, budget: int) -> str | None:
    for out in node.output:
        if not out:
            continue
        kind = shapes.get(out)
        if node.op_type in NOT_TENSOR_OPS or (
            kind is not None and not kind.HasField("tensor_type")
        ):
            return f"left unfolded: {out!r} ({node.op_type}) is not a tensor (a sequence?)"
        size = _nbytes(kind)
        if size is None and node.op_type in GROWING_OPS:
            return (
                f"left unfolded: the size of {out!r} ({node.op_type}) is not known before "
                f"computing it, so folding it could exceed the memory budget of {fmt_bytes(budget)}"
            )
        if size is not None and size > budget:
            return (
                f"left unfolded: {out!r} would take {fmt_bytes(size)} "
                f"({_describe(shapes[out])}), over the memory budget of {fmt_bytes(budget)} "
                "(accuracy.memory_budget)"
            )
    return None


def _nbytes(value_type: onnx.TypeProto | None) -> int | None:
    """Bytes of a tensor whose type and every dim are known; None otherwise."""
    if value_type is None or not value_type.HasField("tensor_type"):
        return None
    tensor = value_type.tensor_type
    if not tensor.elem_type or not tensor.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if any(d is None for d in dims):
        return None
    if tensor.elem_type == onnx.TensorProto.STRING:
        return None
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
    return math.prod(dims) * itemsize


def _describe(value_type: onnx.TypeProto) -> str:
    tensor = value_type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    return f"{dtype} {[d.dim_value for d in tensor.shape.dim]}"
