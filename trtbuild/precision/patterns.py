"""Structural patterns and graph measures used by match keys.

Why structure, not names: users know their failures by shape ("the LayerNorm",
"the last reduction"), and names differ across exporters and versions. Each
finder returns node index -> reason; a unit (every node of a decomposed
LayerNorm) is matched as a whole so it is never split across precisions.
"""

from __future__ import annotations

from trtbuild.errors import UsageError
from trtbuild.graph.attention import attention_units, norms_after_attention
from trtbuild.graph.norms import norm_units
from trtbuild.graph.reductions import final_reductions
from trtbuild.graph.view import GraphView


def find(pattern: str, view: GraphView, last: int | None = None) -> dict[int, str]:
    if pattern == "attention":
        return {i: unit.reason for unit in attention_units(view) for i in unit.nodes}
    if pattern == "layernorm_after_attention":
        return norms_after_attention(view)
    if pattern == "layernorm":
        return {i: unit.reason for unit in norm_units(view) for i in unit.nodes}
    if pattern == "softmax":
        return {
            i: f"{n.op_type}"
            for i, n in enumerate(view.nodes)
            if n.op_type in ("Softmax", "LogSoftmax")
        }
    if pattern == "final_reductions":
        return final_reductions(view, last)
    raise UsageError(f"unknown pattern '{pattern}'")
