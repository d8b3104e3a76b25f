"""The structural findings over one graph, each found once: an explicit object, not a view's.

Why an object of its own: rules, patterns and `tune`'s groups ask for the same
normalization units, attention blocks and weight peaks of the same read-only
graph, and `tune` asks again on every trial. The `GraphView` stays an index;
whoever wants the findings shared holds one `Analysis` and passes it (`Front`
keeps the one its stages and `tune`'s trials share).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from onnx import TensorProto, helper

from trtbuild.graph.view import GraphView

T = TypeVar("T")
U = TypeVar("U")


class Analysis:
    """Lazily found, then kept: each finding the first time a rule or a pattern asks for it."""

    def __init__(self, view: GraphView):
        self.view = view
        self._found: dict[str, Any] = {}

    def _once(self, name: str, find: Callable[[], T]) -> T:
        if name not in self._found:
            self._found[name] = find()
        return self._found[name]

    def see_through(self) -> tuple[Analysis, tuple[int, ...] | None]:
        """The analysis of the float graph under this one's Q→DQ pairs
        (`graph.seethrough`) and each of its nodes' index here; (self, None) where the
        graph has no Q/DQ node. The structural findings below are made there and mapped
        back, so a quantized model's units are its float original's."""

        def find() -> tuple[Analysis, tuple[int, ...] | None]:
            from trtbuild.graph.seethrough import see_through

            seen = see_through(self.view, self.qdq())
            return (self, None) if seen is None else (Analysis(seen.view), seen.back)

        return self._once("see_through", find)

    def norm_units(self) -> tuple:
        """Every normalization unit (`graph.norms.norm_units`), seen through Q/DQ."""
        from trtbuild.graph.norms import norm_units

        inner, back = self.see_through()
        if back is None:
            return self._once("norm_units", lambda: norm_units(self.view))
        return self._once("norm_units", lambda: tuple(mapped(u, back) for u in inner.norm_units()))

    def attention_units(self) -> tuple:
        """Every attention block (`graph.attention.attention_units`), seen through Q/DQ."""
        from trtbuild.graph.attention import attention_units

        inner, back = self.see_through()
        if back is None:
            return self._once("attention_units", lambda: attention_units(self.view))
        return self._once(
            "attention_units", lambda: tuple(mapped(u, back) for u in inner.attention_units())
        )

    def periodic(self) -> dict[int, tuple[int, ...]]:
        """Each periodic op and each node computing their arguments -> the periodic ops it
        serves (`graph.periodic.periodic_walk`): the pattern and its range rule's anchors
        both read it."""
        from trtbuild.graph.periodic import periodic_walk

        def find() -> dict[int, tuple[int, ...]]:
            units = {i for unit in self.norm_units() for i in unit.nodes}
            return periodic_walk(self.view, units)

        return self._once("periodic", find)

    def qdq(self):
        """The Q/DQ index (`graph.qdq.QdqGraph`): pairs, formats, scales, DQ-fed ops."""
        from trtbuild.graph.qdq import QdqGraph

        return self._once("qdq", lambda: QdqGraph(self.view))

    def shape_inputs(self) -> dict[str, str]:
        """The inputs TensorRT takes for shape tensors, each with what its values decide
        (`graph.shape_inputs`)."""
        from trtbuild.graph.shape_inputs import shape_inputs

        return self._once("shape_inputs", lambda: shape_inputs(self.view))

    def weight_peaks(self) -> dict[str, float]:
        """Largest finite |value| of every float initializer."""
        return self._once("weight_peaks", lambda: _weight_peaks(self.view))

    def dequantized_peaks(self) -> dict[int, float]:
        """Largest finite |value| of each DequantizeLinear of a constant that may pass the
        narrowest low type's range, by the DQ's index (`_dequantized_peaks`): what an FP16
        DQ stores, measured as `weight_peaks` measures a float weight."""
        return self._once("dequantized_peaks", lambda: _dequantized_peaks(self.qdq()))


def mapped(unit: U, back: tuple[int, ...]) -> U:
    """A unit found in the float graph, its node indices (`nodes`, an attention block's
    `output`) those of the quantized graph; its tensor names are the float graph's, which the
    quantized graph holds too (a Q's input, a DQ's output)."""
    changes: dict[str, Any] = {"nodes": tuple(back[i] for i in unit.nodes)}
    if isinstance(getattr(unit, "output", None), int):
        changes["output"] = back[unit.output]
    return replace(unit, **changes)


def _weight_peaks(view: GraphView) -> dict[str, float]:
    """In the weight's own dtype, a batch of small weights at a time: a 10k-node model has
    thousands of weights and this runs on every `check` and `convert`, where one numpy call
    per weight costs more than its arithmetic. A batch holding a non-finite value is
    measured weight by weight (`numerics.finite_peak`)."""
    from trtbuild.numerics import finite_peak

    peaks: dict[str, float] = {}
    batches: dict[int, list[tuple[str, bytes]]] = {}  # data type -> small weights' raw bytes
    for name, t in view.initializers.items():
        if not view.is_float(name):
            continue
        if t.data_type in _RAW and t.raw_data and len(t.raw_data) <= _BATCH_BYTES:
            batches.setdefault(t.data_type, []).append((name, t.raw_data))
        else:
            peaks[name] = finite_peak(view.initializer_array(name))
    for data_type, weights in batches.items():
        dtype = helper.tensor_dtype_to_np_dtype(data_type).newbyteorder("<")  # as raw_data is
        for batch in _batched(weights):
            peaks.update(_batch_peaks(batch, dtype, view))
    return peaks


# Float types stored as plain little-endian numbers in `raw_data`, and how many bytes of
# small weights are measured at once (a bound on the copy a batch makes).
_RAW = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16})
_BATCH_BYTES = 4 << 20


def _batched(weights: list[tuple[str, bytes]]) -> list[list[tuple[str, bytes]]]:
    batches: list[list[tuple[str, bytes]]] = []
    batch: list[tuple[str, bytes]] = []
    size = 0
    for name, raw in weights:
        if batch and size + len(raw) > _BATCH_BYTES:
            batches.append(batch)
            batch, size = [], 0
        batch.append((name, raw))
        size += len(raw)
    return [*batches, batch] if batch else batches


def _batch_peaks(batch: list[tuple[str, bytes]], dtype: Any, view: GraphView) -> dict[str, float]:
    """Each weight's largest |value| from one array of the batch (`np.maximum.reduceat`)."""
    import numpy as np

    from trtbuild.numerics import finite_peak

    flat = np.abs(np.frombuffer(b"".join(raw for _, raw in batch), dtype=dtype))
    sizes = np.array([len(raw) // dtype.itemsize for _, raw in batch])
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    found = np.maximum.reduceat(flat, starts)
    peaks = {}
    for (name, _), peak in zip(batch, found.tolist()):  # every segment holds a value: no
        if math.isfinite(peak):  # empty raw_data is batched
            peaks[name] = float(peak)
        else:
            peaks[name] = finite_peak(view.initializer_array(name))
    return peaks


def _dequantized_peaks(qdq: Any) -> dict[int, float]:
    """Each DQ of a constant (its integer or FP8 codes, or a float constant behind its own Q)
    whose values reach `numerics.LOW_INF_AT` of the narrowest low type somewhere: their
    largest finite |value|, as DequantizeLinear computes them.

    Why: a DQ computes in the precision of what it feeds, so an FP16 DQ whose scale FP16
    holds still stores |code - zero point| x scale from 65520 on as inf: a quantized -1e6
    attention mask (scale 7874) turned inf, where the same constant as a float weight is
    pinned by guard:weight-range. Why a bound first: where the widest scale times the
    widest code its format holds stays below that (every weight of an ordinary model), no
    code is read; only the rest are dequantized. A DQ of an activation is left out: only the
    reference data shows its values.
    """
    from trtbuild.numerics import LOW_INF_AT

    below = min(LOW_INF_AT.values())
    peaks = {}
    for i, n in qdq.nodes.items():
        if n.is_dq and n.scale_value is not None:
            peak = _dequantized_peak(qdq, n, below)
            if peak >= below:
                peaks[i] = peak
    return peaks


def _dequantized_peak(qdq: Any, n: Any, below: float) -> float:
    """`_dequantized_peaks`' figure for one DQ `n`; 0.0 where it reads no constant or its
    bound stays `below`. A float constant behind a Q whose codes `qdq.quantize` does not
    compute (a format it has no bounds for) counts as itself, within what its codes reach."""
    import numpy as np

    from trtbuild.graph.qdq import FLOAT8_TYPES, INTEGER_BOUNDS, dequantize, quantize
    from trtbuild.numerics import finite_peak

    view, group = qdq.view, qdq.group_of[n.index]
    q = qdq.nodes[group.q] if group.q is not None else None
    source = n.quantized if q is None else q.float_tensor
    if source not in view.initializers:
        return 0.0
    low, high = INTEGER_BOUNDS.get(n.format, (0.0, FLOAT8_TYPES.get(n.format, ("", math.inf))[1]))
    with np.errstate(invalid="ignore"):
        reach = float(np.max(np.abs(n.scale_value))) * (high - low)
    if reach < below:  # False for NaN: a scale no type holds is read as it is
        return 0.0
    stored = view.initializer_array(source)
    if q is not None:
        computed = q.format in INTEGER_BOUNDS or q.format in FLOAT8_TYPES
        if q.scale_value is None or not computed:
            return min(finite_peak(stored), reach)
        stored = quantize(stored, q.scale_value, q.format, q.zero_value, q.axis, q.block_size)
    return finite_peak(dequantize(stored, n.scale_value, n.zero_value, n.axis, n.block_size))
