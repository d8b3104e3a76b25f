"""How a message says what it counts: a few of many things named, a share in percent.

Why one function each: warnings name a few nodes and count the rest; each wrote its own
slice, and one named three of four ops without saying a fourth was there. A share was
written with `:.1%` everywhere, and 99.95% FP16 (a guard's node kept FP32) read
"100.0% FP16".
"""

from __future__ import annotations

from collections.abc import Sequence


def first_few(items: Sequence[str], most: int = 3) -> str:
    """`a, b, c, +2 more`: the first `most` of `items`, then how many more there are."""
    shown = ", ".join(items[:most])
    return shown + (f", +{len(items) - most} more" if len(items) > most else "")


def percent(share: float) -> str:
    """`share` (0 to 1) in percent to a tenth, `43.1%`; never `100.0%` or `0.0%` unless it
    is all or nothing: `>99.9%`, `<0.1%`."""
    text = f"{share:.1%}"
    if 0 < share < 1 and text in ("100.0%", "0.0%"):
        return ">99.9%" if share > 0.5 else "<0.1%"
    return text


def field(*parts: str | int) -> str:
    """A policy field's path as messages write it, `inputs.x.data`: a key holding a dot (an
    ONNX name like `input.1`) quoted, `inputs."input.1".data`, so the path reads one way;
    a list index as `[k]`."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
            continue
        key = f'"{part}"' if "." in part or not part else part
        text += f".{key}" if text else key
    return text
