"""How a masked overflow is said: the node, the rule that decided, the line per point.

Why one module: an intermediate that turns inf where FP32 is finite while every output
holds is named by the judge's failure, the verdict line, the report, JUnit, `check`'s
warnings and the nightly's flags and messages. Each says it in its own sentence, but
the pieces (which node, which rule) are worded here once, so they read alike
everywhere. Plain text only: no import of the judge's machinery.
"""

from __future__ import annotations

from typing import Any

RULE_KEY = "accuracy.masked_overflow"  # the policy key that rules on a masked overflow


def overflow_node(o: dict[str, Any]) -> str:
    """`/mul (Mul)`: the node of an overflow (`Verdict.overflow`)."""
    return f"{o['node']} ({o['op']})"


def overflow_text(o: dict[str, Any]) -> str:
    """`/mul (Mul), tensor t, sample 2: 3 non-finite value(s) where FP32 is finite (...)`;
    samples counted from 0, as `failed_samples` counts them."""
    where = f", sample {o['sample']}" if o.get("sample", 0) else ""
    cast = f" (a boundary Cast of `{o['source']}`)" if o.get("source") else ""
    return (
        f"{overflow_node(o)}{cast}, tensor {o['tensor']}{where}: {o['nonfinite']} "
        f"non-finite value(s) where FP32 is finite ({peak_said(o)})"
    )


def peak_said(o: dict[str, Any]) -> str:
    """`FP32 peak |x| = 6.551e+04`, `... over the point's samples = ...` where the overflow's
    own sample's peak was not kept (`peak_over`): the figure that explains it."""
    over = " over the point's samples" if o.get("peak_over") == "samples" else ""
    return f"FP32 peak |x|{over} = {o['ref_max_abs']:.4g}"


def rule_said(rule: str) -> str:
    """`(accuracy.masked_overflow: fail)`: the rule that decided, as a message names it."""
    return f"({RULE_KEY}: {rule})"


def masked_at(label: str, o: dict[str, Any]) -> str:
    """`masked overflow at <point>: <overflow_text>; every output holds`: one point's line."""
    return f"masked overflow at {label}: {overflow_text(o)}; every output holds"
