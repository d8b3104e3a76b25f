"""The structural findings over one graph, each found once: an explicit object, not a view's.

Why an object of its own: rules, patterns and `tune`'s groups ask for the same
normalization units, attention blocks and weight peaks of the same read-only
graph, and `tune` asks again on every trial. The `GraphView` stays an index;
whoever wants the findings shared holds one `Analysis` and passes it (`Front`
keeps the one its stages and `tune`'s trials share).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from trtbuild.graph.view import GraphView

T = TypeVar("T")


class Analysis:
    """Lazily found, then kept: each finding the first time a rule or a pattern asks for it."""

    def __init__(self, view: GraphView):
        self.view = view
        self._found: dict[str, Any] = {}

    def _once(self, name: str, find: Callable[[], T]) -> T:
        if name not in self._found:
            self._found[name] = find()
        return self._found[name]

    def norm_units(self) -> tuple:
        """Every normalization unit (`graph.norms.norm_units`)."""
        from trtbuild.graph.norms import norm_units

        return self._once("norm_units", lambda: norm_units(self.view))

    def attention_units(self) -> tuple:
        """Every attention block (`graph.attention.attention_units`)."""
        from trtbuild.graph.attention import attention_units

        return self._once("attention_units", lambda: attention_units(self.view))

    def qdq(self):
        """The Q/DQ index (`graph.qdq.QdqGraph`): pairs, formats, scales, DQ-fed ops."""
        from trtbuild.graph.qdq import QdqGraph

        return self._once("qdq", lambda: QdqGraph(self.view))

    def weight_peaks(self) -> dict[str, float]:
        """Largest finite |value| of every float initializer."""
        return self._once("weight_peaks", lambda: _weight_peaks(self.view))


def _weight_peaks(view: GraphView) -> dict[str, float]:
    """In the weight's own dtype, with no copy unless it holds a non-finite value: a
    10k-node model has thousands of weights and this runs on every `check`."""
    import numpy as np

    peaks = {}
    for name in view.initializers:
        if view.is_float(name):
            arr = view.initializer_array(name)
            peak = float(np.max(np.abs(arr))) if arr.size else 0.0
            if not np.isfinite(peak):
                finite = arr[np.isfinite(arr)]
                peak = float(np.max(np.abs(finite))) if finite.size else 0.0
            peaks[name] = peak
    return peaks
