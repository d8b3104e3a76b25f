"""Passes for control flow: inputs frozen to one value, and `If`s whose condition is constant.

Why: TensorRT imports both branches of an `If` for the shapes of its profile.
An export that branches on a value its deployment fixes (Silero VAD picks its
8 kHz or 16 kHz model by the `sr` input) cannot build, since the branch not
taken is invalid at the other's input length; and TensorRT-RTX stopped with an
internal assertion (`graphScope.cpp:471`) on Silero VAD's 16 kHz branch until its
shape check whose condition folds to a constant was inlined. An engine serves one such
value, so the policy says which (`passes.freeze_inputs`) and the branch taken
replaces the `If`. onnx-graphsurgeon's own flattening leaves readers of the
`If`'s outputs dangling, so it is done here.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtbuild import words
from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.passes.basic import PassRecord, copied, inputs_named


def freeze_inputs(
    model: onnx.ModelProto, values: tuple[tuple[str, object], ...]
) -> tuple[onnx.ModelProto, PassRecord]:
    """Each named input becomes an initializer holding its value (in the input's dtype)."""
    record = PassRecord("freeze_inputs")
    if not values:
        return model, record
    inputs_named(model, [name for name, _ in values], "passes.freeze_inputs")
    model = copied(model)
    given = dict(values)
    kept = []
    for vi in model.graph.input:
        if vi.name not in given:
            kept.append(vi)
            continue
        model.graph.initializer.append(_constant(vi, given[vi.name]))
        record.changed += 1
    del model.graph.input[:]
    model.graph.input.extend(kept)
    record.details["inputs"] = {n: list(v) if isinstance(v, tuple) else v for n, v in values}
    return model, record


def _constant(vi: onnx.ValueInfoProto, value: object) -> onnx.TensorProto:
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    _held(vi.name, value, dtype)
    array = np.asarray(value, dtype=dtype)
    dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    if all(d > 0 for d in dims) and int(np.prod(dims)) == array.size:
        array = array.reshape(dims)
    elif dims and array.ndim == 0:
        raise UsageError(
            f"{words.field('passes', 'freeze_inputs', vi.name)}: the input has shape "
            f"{[d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim]}; "
            "a single number fits only a scalar input",
            hint="give the value as a list with one number per element",
        )
    return numpy_helper.from_array(array, vi.name)


def _whole_within(v: object, low: int, high: int) -> bool:
    """Whether `v` is a whole number in [low, high], read exactly (a Python int as it is)."""
    if isinstance(v, (int, np.integer)):
        return low <= int(v) <= high
    f = float(v)  # a number: `_held` made an array of them first
    return f.is_integer() and low <= int(f) <= high


def _held(name: str, value: object, dtype: np.dtype) -> None:
    """Exit 2 for a value the input's type cannot hold: numpy's cast would make it inf,
    truncate or wrap it, or raise (an int32 `4294967297` was a traceback, exit 70; an FP16
    70000 turned inf, and `sr: 16000.5` became 16000, without a word)."""
    if dtype.kind not in "fiub":
        return
    try:
        bad, holds = _not_held(value, dtype)
    except (TypeError, ValueError):
        return  # not numbers: said where the array is made
    if bad.any():
        first = np.asarray(value, dtype=object)[bad].ravel()[0]
        shown = f"{first:.15g}" if isinstance(first, float) else str(first)
        raise UsageError(
            f"{shown} is not a value the input '{name}' holds: it takes {holds}",
            hint="give the value the deployment feeds, in the input's type",
            field=("passes", "freeze_inputs", name),  # the caller adds the file and line
        )


def _not_held(value: object, dtype: np.dtype) -> tuple[np.ndarray, str]:
    """Which of `value`'s numbers `dtype` cannot hold, and what it holds. Integers are read
    as Python's whole numbers: float64 makes 2**63 int64's largest value."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        exact = np.asarray(value, dtype=object)
        within = np.vectorize(lambda v: _whole_within(v, info.min, info.max), otypes=[bool])
        return ~within(exact), f"{dtype} integers ({info.min} to {info.max})"
    exact = np.asarray(value, dtype=object)
    if dtype.kind == "b":  # compared as they are: 10**400 is no boolean either
        return np.vectorize(
            lambda v: float(v) not in (0.0, 1.0) if _finite(v) else True, otypes=[bool]
        )(exact), "booleans (0 or 1)"
    held = np.vectorize(
        lambda v: _finite(v) and bool(np.isfinite(dtype.type(float(v)))), otypes=[bool]
    )
    with np.errstate(over="ignore"):
        bad = ~held(exact)
    return bad, f"finite {dtype} values (at most {float(np.finfo(dtype).max):g})"


def _finite(v: object) -> bool:
    """Whether `v` is a number float64 holds (an integer of 400 digits is not)."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def inline_constant_ifs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Replace each `If` whose condition is a constant by the nodes of the branch it takes.

    The branch's nodes keep their qualified names (`If_0/then_branch/Conv_3`), so
    rules that name them still match; its outputs reach the `If`'s readers
    through an `Identity` named after the `If`.
    """
    record = PassRecord("inline_constant_ifs", details={"inlined": []})
    if not any(n.op_type == "If" for n in subgraphs.all_nodes(model)):
        return model, record
    model = copied(model)
    constants = {t.name: t for t in model.graph.initializer}
    _inline(model.graph, constants, record)
    record.changed = len(record.details["inlined"])
    return model, record


def _inline(graph: onnx.GraphProto, constants: dict, record: PassRecord) -> None:
    constants = {**constants, **{t.name: t for t in graph.initializer}}
    constants.update({n.output[0]: n.attribute[0].t for n in graph.node if _plain_constant(n)})
    nodes = []
    for node in graph.node:
        taken = _taken_branch(node, constants)
        if taken is None:
            for _, body in subgraphs.bodies(node):
                _inline(body, constants, record)
            nodes.append(node)
            continue
        attr, branch = taken
        _inline(branch, constants, record)
        nodes.extend(branch.node)
        graph.initializer.extend(branch.initializer)
        for k, (out, made) in enumerate(zip(node.output, branch.output)):
            if out:
                name = f"{node.name}/output_{k}"
                nodes.append(helper.make_node("Identity", [made.name], [out], name=name))
        record.details["inlined"].append({"name": node.name, "branch": attr})
    del graph.node[:]
    graph.node.extend(nodes)


def _plain_constant(node: onnx.NodeProto) -> bool:
    return (
        node.op_type == "Constant"
        and len(node.attribute) == 1
        and node.attribute[0].name == "value"
    )


def _taken_branch(node: onnx.NodeProto, constants: dict) -> tuple[str, onnx.GraphProto] | None:
    if node.op_type != "If" or node.domain not in DEFAULT_DOMAINS:
        return None
    cond = constants.get(node.input[0])
    if cond is None:
        return None
    value = numpy_helper.to_array(cond)
    if value.size != 1:
        return None
    attr = "then_branch" if bool(value.reshape(())) else "else_branch"
    return attr, dict(subgraphs.bodies(node))[attr]
