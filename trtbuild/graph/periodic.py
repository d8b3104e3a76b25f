"""What computes the argument of a periodic op (`Sin`, `Cos`, `Tan`).

Why a walk of its own: a sine's error is its argument's absolute error, and FP16
stores an argument of 1000 to a quarter of a radian. A timestep embedding
`sin(t · freq)`, a rotary embedding `cos(positions @ inv_freq)` and Fourier
features `sin(2π · x @ B)` are computed by a chain of arithmetic whose every
rounding reaches the argument; `patterns.periodic_arguments` names that chain and
`guard:periodic-range` keeps it in FP32 where the argument passes the bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtbuild.graph.optypes import DATA_MOVEMENT, SHAPE_READERS
from trtbuild.graph.subgraphs import CONTROL_FLOW

if TYPE_CHECKING:
    from trtbuild.graph.view import GraphView

# Periodic ops: their output error is the absolute error of their argument, which FP16
# stores to |x| * 2^-11 (sin(1000) there is off by up to 0.25)
PERIODIC = frozenset({"Sin", "Cos", "Tan"})
# Where the walk ends, the node included, unless what feeds it is computed from the graph's
# inputs alone: a matrix product's inputs are otherwise what the model computed before (a
# hidden state projected to Fourier features is the model's, not the argument's)
PRODUCTS = frozenset({"MatMul", "Gemm", "Einsum"})
# What computes a periodic op's argument (a timestep times frequencies, positions times
# inverse frequencies, a phase accumulated by `CumSum` and interpolated by `Resize`):
# arithmetic that carries every upstream rounding into it
ARGUMENT = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Cast", "CastLike", "CumSum", "Resize"})
# Ops that place their float inputs' values, no arithmetic: an in-place write of a slice
# (torch's `x[..., 0] = x[..., 0] / w` exports a `ScatterND`), a choice between two values
PLACES = frozenset({"ScatterND", "ScatterElements", "Where"})
# Ops that make a value from no data of the model: a constant, a range of positions
MADE_FROM_NOTHING = frozenset({"Constant", "ConstantOfShape", "Range"})
# What the walk follows up from a periodic op
WALKED = ARGUMENT | PRODUCTS | DATA_MOVEMENT | PLACES


def from_inputs(view: GraphView) -> set[int]:
    """The main graph's nodes computed from the graph's inputs, weights and shapes alone:
    by `WALKED`'s ops, `MADE_FROM_NOTHING`'s, a shape reader (whatever it reads), or any op
    with no float input (logic on integers: a mask of a shape's dims), but no control node
    (its bodies may read the model's values from the outer graph).

    Why: past a matrix product, such a value is the argument's own: its rounding reaches
    the argument scaled by the product (SAM's point coordinates, within 1, are rounded by
    FP16 to 2^-12 and moved the argument `2π · x @ B` by tenths of a radian). Integer
    logic on what the model computed from floats is not: an `ArgMax` has a float input
    and is none of these ops, so nothing after it counts.
    """
    made = set(view.inputs) | set(view.initializers)
    found = set()
    ops = WALKED | MADE_FROM_NOTHING
    for i in view.top:  # a valid graph is sorted: every input seen first
        node = view.nodes[i]
        if node.op_type in CONTROL_FLOW:
            continue
        fits = node.op_type in ops or not view.float_inputs(i)
        if node.op_type in SHAPE_READERS or (fits and all(t in made for t in node.input if t)):
            found.add(i)
            made.update(t for t in node.output if t)
    return found


def periodic_walk(view: GraphView, units: set[int]) -> dict[int, tuple[int, ...]]:
    """Each periodic op, and each node upstream whose every use is to compute periodic ops'
    arguments, -> those periodic ops (every one it serves: a value feeding several
    frequency bands serves each, and is judged by the largest of their arguments).

    The walk follows `WALKED`'s ops up to graph inputs, weights, a matrix product
    (`PRODUCTS`: included; what fed it only where computed from the inputs alone,
    `from_inputs`), a normalization unit (`units`, never split) and any other op. A value
    used elsewhere too (a residual stream, a Snake activation's input, a graph output) is
    the model's, not the argument's; a value only a shape reader reads is no use.
    """
    nodes = view.nodes
    serves = {i: (i,) for i, n in enumerate(nodes) if n.op_type in PERIODIC}
    if not serves:
        return {}
    outputs = {o.name for o in view.graph.output}
    coords = from_inputs(view)
    shaped: set[int] = set()  # nodes whose values only a shape reader reads: no use
    for k in range(len(nodes) - 1, -1, -1):  # a valid graph is sorted: every use seen first
        if k in serves or k in units or nodes[k].op_type not in WALKED:
            continue
        read = [c for t in view.float_outputs(k) for c in view.consumers.get(t, ())]
        uses = [c for c in read if nodes[c].op_type not in SHAPE_READERS and c not in shaped]
        if any(t in outputs for t in nodes[k].output):
            continue
        if not uses:
            shaped.update([k] if read else [])
        elif all(c in serves and (nodes[c].op_type not in PRODUCTS or k in coords) for c in uses):
            serves[k] = tuple(sorted({p for c in uses for p in serves[c]}))
    return serves
