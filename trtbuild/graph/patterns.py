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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtbuild.graph.view import GraphView

Finder = Callable[["GraphView", "int | None"], dict[int, str]]


@dataclass(frozen=True)
class Pattern:
    description: str
    find: Finder


def _layernorm(view: GraphView, last: int | None) -> dict[int, str]:
    from trtbuild.graph.norms import norm_units

    return {i: unit.reason for unit in norm_units(view) for i in unit.nodes}


def _layernorm_after_attention(view: GraphView, last: int | None) -> dict[int, str]:
    from trtbuild.graph.attention import norms_after_attention

    return norms_after_attention(view)


def _attention(view: GraphView, last: int | None) -> dict[int, str]:
    from trtbuild.graph.attention import attention_units

    return {i: unit.reason for unit in attention_units(view) for i in unit.nodes}


def _softmax(view: GraphView, last: int | None) -> dict[int, str]:
    return {
        i: n.op_type for i, n in enumerate(view.nodes) if n.op_type in ("Softmax", "LogSoftmax")
    }


def _final_reductions(view: GraphView, last: int | None) -> dict[int, str]:
    from trtbuild.graph.reductions import final_reductions

    return final_reductions(view, last)


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
}


def find(pattern: str, view: GraphView, last: int | None = None) -> dict[int, str]:
    """Node index -> reason for every node of `pattern` (a name the schema has validated)."""
    return PATTERNS[pattern].find(view, last)
