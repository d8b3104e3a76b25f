"""How a message names a few of many things: the first ones said, the rest counted.

Why one function: warnings name a few nodes and count the rest; each wrote its own slice,
and one named three of four ops without saying a fourth was there.
"""

from __future__ import annotations

from collections.abc import Sequence


def first_few(items: Sequence[str], most: int = 3) -> str:
    """`a, b, c, +2 more`: the first `most` of `items`, then how many more there are."""
    shown = ", ".join(items[:most])
    return shown + (f", +{len(items) - most} more" if len(items) > most else "")
