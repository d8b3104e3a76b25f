"""Sizes in bytes, read and written one way everywhere (policies, reports, cache, budget)."""

from __future__ import annotations

import re

from trtbuild.errors import UsageError

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE_UNITS.update({"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30})


def parse_size(text: str) -> int:
    m = re.match(r"^(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?$", text.strip())
    if not m:  # the schema's pattern already rejected this; keep the message anyway
        raise UsageError(f"bad size {text!r}", hint="write e.g. 4GiB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or ""])


def fmt_bytes(n: float | None) -> str:
    """One byte format everywhere: binary units with three significant digits."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1000 or unit == "GiB":  # 1000-1023 would print as 1e+03 at three digits
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} GiB"
