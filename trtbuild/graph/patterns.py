"""The pattern registry: the structural units a `match: {pattern: ...}` names.

Why structure, not names: users know their failures by shape ("the LayerNorm",
"the last reduction"), and names differ across exporters and versions. Each
finder returns node index -> reason; a unit (every node of a decomposed
LayerNorm) is matched as a whole so it is never split across precisions.

Written once: the policy schema lists these names and descriptions, the
precision rules call `find`. The finders import the analysis lazily, so the
schema (and `trtbuild schema`, `--help`) does not pay for onnx.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx import NodeProto

    from trtbuild.graph.analysis import Analysis
    from trtbuild.graph.view import GraphView

Finder = Callable[["Analysis", "int | None"], dict[int, str]]


@dataclass(frozen=True)
class Pattern:
    description: str
    find: Finder
    # node -> the tensors a range rule reads beside the node's own (None: its own alone)
    anchors: Callable[[Analysis], dict[int, tuple[str, ...]]] | None = None


def _layernorm(analysis: Analysis, last: int | None) -> dict[int, str]:
    return {i: unit.reason for unit in analysis.norm_units() for i in unit.nodes}


def _layernorm_after_attention(analysis: Analysis, last: int | None) -> dict[int, str]:
    from trtbuild.graph.attention import norms_after_attention

    inner, back = analysis.see_through()  # the flow is followed in the float graph
    found = norms_after_attention(inner.view, inner.attention_units(), inner.norm_units())
    return _back(found, back)


def _attention(analysis: Analysis, last: int | None) -> dict[int, str]:
    return {i: unit.reason for unit in analysis.attention_units() for i in unit.nodes}


def _softmax(analysis: Analysis, last: int | None) -> dict[int, str]:
    nodes = analysis.view.nodes
    return {i: n.op_type for i, n in enumerate(nodes) if n.op_type in ("Softmax", "LogSoftmax")}


def _final_reductions(analysis: Analysis, last: int | None) -> dict[int, str]:
    from trtbuild.graph.reductions import final_reductions

    inner, back = analysis.see_through()
    return _back(final_reductions(inner.view, last), back)


def _periodic_arguments(analysis: Analysis, last: int | None) -> dict[int, str]:
    """Each periodic op and the nodes that compute its argument (`Analysis.periodic`)."""
    nodes = analysis.view.nodes
    return {
        k: f"{nodes[k].op_type}: periodic in its argument"
        if ps == (k,)
        else f"computes the argument of {nodes[ps[0]].op_type} {nodes[ps[0]].name}"
        for k, ps in analysis.periodic().items()
    }


def _periodic_anchors(analysis: Analysis) -> dict[int, tuple[str, ...]]:
    """Each node of `_periodic_arguments` -> the arguments it computes (the float inputs of
    every periodic op it serves): a rounding anywhere in the chain reaches an argument at
    that argument's scale, so a range rule judges the chain by the arguments' peaks too."""
    view = analysis.view
    return {
        k: tuple(t for p in ps for t in view.float_inputs(p))
        for k, ps in analysis.periodic().items()
    }


# Ops whose output is data the size of a shape, not arithmetic on it (a fill, a draw)
FILLS = frozenset(
    {"ConstantOfShape", "EyeLike", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
)
# Ops that spread their first input over a shape their second gives: from a shape, a fill
SPREADS = frozenset({"Expand", "Tile"})
# The float weights shape arithmetic reads are constants of a formula (200, 0.5, [1, 1]);
# a larger one (an embedding table, a cls token) makes the model's data
SHAPE_WEIGHT_MAX = 16


def _shape_arithmetic(analysis: Analysis, last: int | None) -> dict[int, str]:
    """Each node with a float output computed from shapes alone: `Shape`/`Size` outputs,
    small float weights (`SHAPE_WEIGHT_MAX`), integer weights and what is computed from
    them only (a resize's scale `200 / max(H, W)`, a `1 / sqrt(d)` of a head's width,
    anchors from a feature map's size). Not the model's data made to a shape's size: a fill
    (`ConstantOfShape`), a weight spread over a shape (`Expand` of a cls token to the
    batch, `Tile` of queries), a lookup in a table by positions the length cuts (an
    embedding's `Gather`), a control node's outputs.

    Why: these are TensorRT's shape tensors, computed where the engine binds its shapes;
    FP16 holds integers exactly only up to 2048, so a size or a scale made low changes an
    output's shape (199 rows where FP32 makes 200), and TensorRT-RTX refuses FP16 in a
    shape computation ("Input 0's element type (float) differs from input 1's element type
    (half)"). They are scalars, short vectors and position ranges: FP32 costs little.
    """
    from trtbuild.graph.optypes import SHAPE_READERS
    from trtbuild.graph.shape_inputs import size_cone

    view = analysis.view
    # a value computed from shapes alone -> what it reads: a Shape node, or an input
    # TensorRT takes for a shape tensor (a length fed as int64 and halved in float)
    sizes, cone = size_cone(view)
    source = {n: f"shape input {n}" for n in sizes}
    # values of a size input count as a shape's only on their way to a shape operand
    valued = set(sizes)
    found: dict[int, str] = {}
    for i, node in enumerate(view.nodes):  # a valid graph is sorted: inputs are seen first
        if node.op_type in SHAPE_READERS:
            source.update((o, f"Shape node {node.name}") for o in node.output if o)
            continue
        ins = [t for t in node.input if t]
        if not _computes_shapes(view, node, ins, source):
            continue
        if any(t in valued for t in ins):
            outs = [o for o in node.output if o]
            if not all(o in cone for o in outs):
                continue
            valued.update(outs)
        shape = next(source[t] for t in ins if t in source)
        source.update((o, shape) for o in node.output if o)
        if view.float_outputs(i):
            found[i] = f"computes from shapes alone ({shape}): a shape computation"
    return found


def _computes_shapes(view: GraphView, node: NodeProto, ins: list[str], source: dict) -> bool:
    """Whether `node` computes from shapes alone: each input a shape's value or a constant
    of a formula, one at least a shape's, and no fill, spread or control flow."""
    from trtbuild.graph.subgraphs import CONTROL_FLOW

    op = node.op_type
    if op in FILLS or op in CONTROL_FLOW or not any(t in source for t in ins):
        return False
    if op in SPREADS and len(ins) > 1 and ins[1] in source:  # spread to a shape's size
        return False
    for t in (t for t in ins if t not in source):  # the rest: a formula's constants only
        weight = view.initializers.get(t)
        if weight is None or (view.is_float(t) and math.prod(weight.dims) > SHAPE_WEIGHT_MAX):
            return False
    return True


def _back(found: dict[int, str], back: tuple[int, ...] | None) -> dict[int, str]:
    """Findings in the float graph (`Analysis.see_through`) as indices of the graph itself."""
    return found if back is None else {back[i]: why for i, why in found.items()}


PATTERNS: dict[str, Pattern] = {
    "layernorm": Pattern(
        "normalization units, fused or decomposed on any axis (LayerNorm, RMSNorm, "
        "InstanceNorm), each as a whole",
        _layernorm,
    ),
    "layernorm_after_attention": Pattern(
        "normalization units fed by an attention block or a channel-attention gate",
        _layernorm_after_attention,
    ),
    "attention": Pattern(
        "self-attention blocks (Q·Kᵀ, softmax, ·V) and squeeze-excitation gates", _attention
    ),
    "softmax": Pattern("Softmax and LogSoftmax nodes", _softmax),
    "final_reductions": Pattern(
        "the reductions nearest the outputs (`last: N` keeps the last N)", _final_reductions
    ),
    "shape_arithmetic": Pattern(
        "float arithmetic on shapes alone (Shape and Size outputs, a formula's constants): "
        "a resize's scale from the input's size, anchors from a feature map's",
        _shape_arithmetic,
    ),
    "periodic_arguments": Pattern(
        "Sin, Cos and Tan nodes and the arithmetic and data movement upstream that compute "
        "their argument (a timestep or position embedding, Fourier features of coordinates)",
        _periodic_arguments,
        _periodic_anchors,
    ),
}


def find(pattern: str, analysis: Analysis, last: int | None = None) -> dict[int, str]:
    """Node index -> reason for every node of `pattern` (a name the schema has validated)."""
    return PATTERNS[pattern].find(analysis, last)


def anchors(pattern: str | None, analysis: Analysis) -> dict[int, tuple[str, ...]]:
    """Node index -> the tensors `max_abs_above` reads beside the node's own, where a rule
    names `pattern` (none for most patterns: a node is judged by its own tensors)."""
    found = PATTERNS[pattern].anchors if pattern is not None else None
    return found(analysis) if found is not None else {}
