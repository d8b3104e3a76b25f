"""The FP32 reference: one ONNX Runtime run per feed, every float tensor marked.

An explicit stage (not a lazy property): `build`, `report`, `check` and `tune`
call `run_reference` once, and every judgement, range rule, boundary warning
and at-risk entry reads the same values.

What one pass gives (the peaks and internals, with the tensors' order, are the
`ReferenceMeasures`, cached on their own):
- the graph outputs of every feed, as Polygraphy `RunResults` (the comparator's
  reference);
- the first feed's every tensor (the first divergence compares against them);
- each tensor's data peak over all feeds (range rules, boundary warnings,
  `tune`'s range analysis), sentinels aside;
- the internal quantities of every op a kernel could overflow (`risk`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from trtbuild.accuracy import risk
from trtbuild.accuracy.data import Feed
from trtbuild.accuracy.evaluate import REFERENCE, marked_session, quiet_polygraphy, run_marked
from trtbuild.accuracy.progress import SampleProgress
from trtbuild.graph.view import GraphView
from trtbuild.numerics import data_peak, sentinels


@dataclass(frozen=True)
class ReferenceMeasures:
    """What the FP32 run measured, without its tensors.

    Everything `check`, range rules, boundary warnings and `at_risk` read, kept
    apart from the tensors so that a warm `check` reads a megabyte from the cache
    on a 10k-node model, not the first feed's every tensor (24 MB there).
    """

    order: list[tuple[str, str, str]]  # (tensor, node, op) of float node outputs, topological
    ranges: dict[str, float]  # tensor -> largest |value| that is data, over all feeds
    sentinel_tensors: frozenset[str]  # tensors holding values >= SENTINEL_ABS
    internals: dict[str, tuple[str, dict[str, float]]]  # node -> (op, {quantity: peak})
    outputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReferenceTensors:
    """The measures and the tensors the judge compares against; read-only."""

    measures: ReferenceMeasures
    first: dict[str, np.ndarray]  # every marked tensor of the first feed
    run_results: Any = field(repr=False, default=None)  # graph outputs of every feed


def float_node_outputs(view: GraphView) -> list[tuple[str, str, str]]:
    """(tensor, node, op) for every float tensor a node produces, in topological order."""
    return [(t, n.name, n.op_type) for i, n in enumerate(view.nodes) for t in view.float_outputs(i)]


def run_reference(
    reference: onnx.ModelProto, feeds: list[Feed], view: GraphView | None = None
) -> ReferenceTensors:
    """Run the FP32 graph once per feed and measure everything later stages need."""
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    view = view if view is not None else GraphView(reference)
    order = float_node_outputs(view)
    outputs = [o.name for o in reference.graph.output]
    sess = marked_session(reference, list(dict.fromkeys([t for t, _, _ in order] + outputs)))
    watched = risk.candidates(view)
    first: dict[str, np.ndarray] = {}
    ranges: dict[str, float] = {}
    held: set[str] = set()
    internals: dict[str, tuple[str, dict[str, float]]] = {}
    iterations = []
    ticker = SampleProgress("FP32 reference", len(feeds))
    with quiet_polygraphy():
        for k, feed in enumerate(feeds):
            values = {**feed, **run_marked(sess, feed)}
            if k == 0:
                first = values
            iterations.append(
                IterationResult({o: values[o] for o in outputs}, runner_name=REFERENCE)
            )
            _update_ranges(values, ranges, held)
            for i in watched:
                node = view.nodes[i]
                peaks = internals.setdefault(node.name, (node.op_type, {}))[1]
                for q, v in risk.measure(view, i, values).items():
                    peaks[q] = max(peaks.get(q, 0.0), v)
            ticker.tick(k + 1)
    ticker.done()
    results = RunResults()
    results.append((REFERENCE, iterations))
    measures = ReferenceMeasures(order, ranges, frozenset(held), internals, outputs)
    return ReferenceTensors(measures, first, results)


def _update_ranges(values: dict[str, np.ndarray], ranges: dict[str, float], held: set) -> None:
    for name, v in values.items():
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.floating) and v.size:
            ranges[name] = max(ranges.get(name, 0.0), data_peak(v))
            if name not in held and sentinels(v).any():
                held.add(name)
