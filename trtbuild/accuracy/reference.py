"""The FP32 reference: every float tensor of every feed measured, segment by segment.

An explicit stage (not a lazy property): `build`, `report`, `check` and `tune`
call `run_reference` once, and every judgement, range rule, boundary warning
and at-risk entry reads the same values.

What one pass keeps (the measures are cached on their own; the outputs beside
them only while they are small):
- each tensor's data peak over all feeds (range rules, boundary warnings,
  `tune`'s range analysis), sentinels aside, and its peak on the first feed
  (the scale of the divergence);
- the internal quantities of every op a kernel could overflow (`risk`);
- the first feed's sizes and shapes (the judge cuts its runs by them) and, of
  the few tensors that hold a NaN, an inf or a sentinel there, the values, so
  that a candidate's overflow is told apart from the reference's own;
- the graph outputs of every feed, as Polygraphy `RunResults` (the comparator's
  reference).
The intermediates themselves are dropped as soon as they are measured (a
`SegmentRunner` holds what `accuracy.memory_budget` allows); the judge runs
the reference again beside a candidate where it compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from trtbuild.accuracy import risk
from trtbuild.accuracy.data import Feed
from trtbuild.accuracy.probes import probe
from trtbuild.accuracy.progress import SampleProgress
from trtbuild.accuracy.sessions import REFERENCE, quiet_polygraphy
from trtbuild.accuracy.stream import Plan, SegmentRunner, estimate_sizes, plan_by_budget
from trtbuild.errors import UsageError, surroundings_error
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.model_io import fed_inputs
from trtbuild.graph.optypes import DECISIONS, LOW_DTYPES
from trtbuild.graph.view import GraphView
from trtbuild.numerics import FP16_MAX, measure_peak
from trtbuild.policy.specs import MemoryBudget


@dataclass(frozen=True)
class ReferenceMeasures:
    """What the FP32 run measured, without its tensors.

    Everything `check`, range rules, boundary warnings, `at_risk` and an
    overflow-only judgement read: a megabyte or so, whatever the input size.
    """

    order: list[tuple[str, str, str]]  # (tensor, node, op) of float node outputs, topological
    ranges: dict[str, float]  # tensor -> largest |value| that is data, over all feeds
    sentinel_tensors: frozenset[str]  # tensors holding values >= SENTINEL_ABS
    internals: dict[str, tuple[str, dict[str, float]]]  # node -> (op, {quantity: peak})
    outputs: list[str] = field(default_factory=list)
    first_peaks: dict[str, float] = field(default_factory=dict)  # data peak on the first feed
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each tensor, first feed
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # first feed
    special: dict[str, np.ndarray] = field(default_factory=dict)  # first feed, NaN/inf/sentinel
    nonfinite: dict[str, str] = field(default_factory=dict)  # tensor -> "NaN" | "inf", any feed
    bodies: frozenset[str] = frozenset()  # tensors inside control-flow bodies: peaks only
    # graph output -> standard deviation of its data values over every feed (is it constant?)
    output_std: dict[str, float] = field(default_factory=dict)
    # integer (and boolean) graph output -> its largest |value| (`ranges` holds the floats')
    output_peak: dict[str, float] = field(default_factory=dict)
    # (tensor, node, op) of the indices decision ops choose (`decision_outputs`)
    decisions: list[tuple[str, str, str]] = field(default_factory=list)
    # graph outputs with no element on any feed (a detector's boxes where it found nothing)
    output_empty: frozenset[str] = frozenset()
    # tensor -> feed -> how many of its values are >= SENTINEL_ABS (+inf included), <=
    # -SENTINEL_ABS (-inf included), NaN and ±inf, on each feed where it holds any: what a
    # later feed's candidate may hold of each where FP32 keeps no values (`judge._beyond`)
    beyond: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    # tensor -> feed after the first -> its data peak there, where past FP16's largest
    # value: what an overflow on that feed is said with (`first_peaks` is the first feed's)
    later_peaks: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReferenceTensors:
    """The measures and the graph outputs of every feed the judge compares against."""

    measures: ReferenceMeasures
    run_results: Any = field(repr=False, default=None)  # graph outputs of every feed
    # with `accuracy.reference_model`, `run_results` are that model's outputs; these are the
    # graph's own FP32 outputs (the quantized graph's, as the reference ran them), and
    # `original` names the model
    graph_results: Any = field(repr=False, default=None)
    original: Path | None = None

    @property
    def quantized(self) -> ReferenceTensors | None:
        """The graph's own FP32 run as a reference (the FP16 part is judged against it)."""
        if self.graph_results is None:
            return None
        return ReferenceTensors(self.measures, self.graph_results)

    def samples(self, index: Sequence[int]) -> ReferenceTensors:
        """The runs of the samples `index` alone, in that order: what `judge_all(samples=
        index)` compares their feeds with (the measures stay those of every feed)."""
        return ReferenceTensors(
            self.measures,
            _some(self.run_results, index),
            _some(self.graph_results, index),
            self.original,
        )


def _some(results: Any, index: Sequence[int]) -> Any:
    """Polygraphy `RunResults` holding each runner's iterations `index` only (None stays)."""
    if results is None:
        return None
    from polygraphy.comparator import RunResults

    some = RunResults()
    for runner, iterations in results.items():
        some.append((runner, [iterations[j] for j in index]))
    return some


def float_node_outputs(view: GraphView) -> list[tuple[str, str, str]]:
    """(tensor, node, op) for every float tensor a node produces, in topological order."""
    return [(t, n.name, n.op_type) for i, n in enumerate(view.nodes) for t in view.float_outputs(i)]


def decision_outputs(view: GraphView) -> list[tuple[str, str, str]]:
    """(tensor, node, op) for the indices each decision op of the main graph chooses
    (`DECISIONS`), compared with FP32's to say where a divergence was decided."""
    found = []
    for i, n in enumerate(view.nodes):
        k = DECISIONS.get(n.op_type) if n.domain in DEFAULT_DOMAINS else None
        if k is not None and not view.scope[i] and len(n.output) > k and n.output[k]:
            found.append((n.output[k], n.name, n.op_type))
    return found


def body_tensors(view: GraphView, order: list[tuple[str, str, str]]) -> set[str]:
    """The float tensors made inside control-flow bodies (measured by their peaks only)."""
    return {t for t, _, _ in order if t in view.producer and view.scope[view.producer[t]]}


def reference_plan(
    model: onnx.ModelProto,
    order: list[tuple[str, str, str]],
    sizes: dict[str, int],
    budget: MemoryBudget,
) -> Plan:
    """The reference's cuts: every float node output and graph output marked (`model` probed:
    its bodies' peaks are graph outputs)."""
    marked = {t for t, _, _ in order} | {o.name for o in model.graph.output}
    return plan_by_budget(model, marked, sizes, budget)


@dataclass
class _Tally:
    """The running measures of one reference pass (one object, passed explicitly)."""

    ranges: dict[str, float] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)
    internals: dict[str, tuple[str, dict[str, float]]] = field(default_factory=dict)
    first_peaks: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    special: dict[str, np.ndarray] = field(default_factory=dict)
    nonfinite: dict[str, str] = field(default_factory=dict)
    moments: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # n, mean, M2
    int_peaks: dict[str, float] = field(default_factory=dict)  # an integer output's max |value|
    beyond: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    later_peaks: dict[str, dict[int, float]] = field(default_factory=dict)

    def spread(self, outputs: dict[str, np.ndarray]) -> None:
        """Each graph output's count, mean and sum of squared deviations, feed after feed
        (Chan's pairwise update, float64), over its data values (NaN, inf, sentinels aside);
        an integer (or boolean) output's peak too, which `values` measures of floats only."""
        for name, v in outputs.items():
            v = np.asarray(v)
            if not (np.issubdtype(v.dtype, np.number) or v.dtype == bool):
                continue
            if not v.size:  # counted as no value: an output empty on every feed is constant
                self.moments.setdefault(name, (0, 0.0, 0.0))
                continue
            if not np.issubdtype(v.dtype, np.floating):
                peak = float(np.abs(v.astype(np.float64, copy=False)).max())
                self.int_peaks[name] = max(self.int_peaks.get(name, 0.0), peak)
            if np.issubdtype(v.dtype, np.floating) and not measure_peak(v)[1]:
                with np.errstate(invalid="ignore"):
                    v = v[np.isfinite(v) & (np.abs(v) < 1e30)]
                if not v.size:
                    continue
            n, mean = v.size, float(np.mean(v, dtype=np.float64))
            m2 = float(np.var(v, dtype=np.float64)) * n
            n0, mean0, m20 = self.moments.get(name, (0, 0.0, 0.0))
            total = n0 + n
            delta = mean - mean0
            self.moments[name] = (
                total,
                mean0 + delta * n / total,
                m20 + m2 + delta * delta * n0 * n / total,
            )

    def output_empty(self) -> frozenset[str]:
        """The outputs no feed gave an element of (counted, never updated: `spread`)."""
        return frozenset(k for k, (n, _, _) in self.moments.items() if not n)

    def output_std(self) -> dict[str, float]:
        return {
            k: float(np.sqrt(max(m2, 0.0) / n)) if n else 0.0
            for k, (n, _, m2) in self.moments.items()
        }

    def values(self, values: dict[str, np.ndarray], feed: int) -> None:
        """Peaks (and, on the first feed, sizes and special values) of new tensors."""
        first = feed == 0
        for name, v in values.items():
            v = np.asarray(v)
            if first:
                self.sizes[name], self.shapes[name] = int(v.nbytes), tuple(v.shape)
            if not (np.issubdtype(v.dtype, np.floating) and v.size):
                continue
            peak, plain = measure_peak(v)
            self.ranges[name] = max(self.ranges.get(name, 0.0), peak)
            if first:
                self.first_peaks[name] = peak
                if not plain:
                    self.special[name] = v.copy()
            elif peak > FP16_MAX:
                self.later_peaks.setdefault(name, {})[feed] = peak
            if not plain:
                self._not_data(name, v, feed)

    def _not_data(self, name: str, v: np.ndarray, feed: int) -> None:
        """A tensor with a value that is not data: a sentinel, an inf or a NaN."""
        self.beyond.setdefault(name, {})[feed] = beyond_counts(v)
        with np.errstate(invalid="ignore"):
            if name not in self.held and np.any(np.abs(v) >= 1e30):
                self.held.add(name)
        if self.nonfinite.get(name) != "NaN":
            if np.isnan(v).any():
                self.nonfinite[name] = "NaN"
            elif np.isinf(v).any():
                self.nonfinite[name] = "inf"

    def risks(self, view: GraphView, nodes: list[int], values: dict[str, np.ndarray]) -> None:
        for i in nodes:
            node = view.nodes[i]
            peaks = self.internals.setdefault(node.name, (node.op_type, {}))[1]
            for q, v in risk.measure(view, i, values).items():
                peaks[q] = max(peaks.get(q, 0.0), v)


def run_reference(
    reference: onnx.ModelProto,
    feeds: list[Feed],
    view: GraphView | None,
    *,
    budget: MemoryBudget,
) -> ReferenceTensors:
    """Run the FP32 graph segment by segment on every feed and measure what later stages need."""
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    view = view if view is not None else GraphView(reference)
    order, decisions = float_node_outputs(view), decision_outputs(view)
    outputs = [o.name for o in reference.graph.output]
    probed = probe(reference, body_tensors(view, order))
    sizes = estimate_sizes(probed.model, feeds[0]) if feeds else {}
    plan = reference_plan(probed.model, [*order, *decisions], sizes, budget)
    watched = set(risk.candidates(view))
    runner = SegmentRunner(probed.model, plan) if plan is not None else None
    tally, iterations = _Tally(), []
    ticker = SampleProgress("FP32 reference", len(feeds))
    with quiet_polygraphy():
        for k, feed in enumerate(feeds):
            tally.values(feed, k)
            outs = {o: np.asarray(feed[o]) for o in outputs if o in feed}
            for seg, values in zip(plan.segments, runner.run(feed)):
                tally.values({t: values[t] for t in seg.marked if t not in probed.tensor_of}, k)
                tally.values(probed.peaks(values), k)
                tally.risks(
                    view, [view.top[i] for i in seg.nodes if view.top[i] in watched], values
                )
                outs.update({o: values[o] for o in outputs if o in values})
                del values
            tally.spread(outs)
            iterations.append(IterationResult(outs, runner_name=REFERENCE))
            ticker.tick(k + 1)
    ticker.done()
    results = RunResults()
    results.append((REFERENCE, iterations))
    measures = ReferenceMeasures(
        order,
        tally.ranges,
        frozenset(tally.held),
        tally.internals,
        outputs,
        tally.first_peaks,
        tally.sizes,
        tally.shapes,
        tally.special,
        tally.nonfinite,
        frozenset(probed.tensor_of.values()),
        tally.output_std(),
        tally.int_peaks,
        decisions,
        tally.output_empty(),
        tally.beyond,
        tally.later_peaks,
    )
    return ReferenceTensors(measures, results)


def beyond_counts(v: np.ndarray) -> tuple[int, ...]:
    """How many values of `v` are sentinels (or inf) of each sign, >= SENTINEL_ABS or
    <= -SENTINEL_ABS, then NaN, then ±inf: a sentinel kept as FP16's inf of its sign counts
    alike on both sides, an overflow one more (`ReferenceMeasures.beyond`)."""
    from trtbuild.numerics import SENTINEL_ABS

    v = np.asarray(v)
    with np.errstate(invalid="ignore"):
        pos, neg = v >= SENTINEL_ABS, v <= -SENTINEL_ABS
    floats = v.dtype.kind == "f"
    nan = int(np.count_nonzero(np.isnan(v))) if floats else 0
    inf = int(np.count_nonzero(np.isinf(v))) if floats else 0
    return int(np.count_nonzero(pos)), int(np.count_nonzero(neg)), nan, inf


def check_finite(view: GraphView, measures: ReferenceMeasures, where: str) -> None:
    """Refuse a reference whose graph output holds NaN or inf: FP16 cannot be judged against it.

    Names the output, the first tensor upstream where the value appears (in the
    graph's order), its node, and a NaN or inf weight that node reads, if any.
    Sentinels elsewhere (a Hugging Face mask's -inf) are not refused: only an
    output that carries one is.
    """
    for output in measures.outputs:
        kind = measures.nonfinite.get(output)
        if kind is None:
            continue
        upstream = _ancestors(view, output)
        first = next(
            (
                t
                for t, _, _ in measures.order
                if t in upstream and measures.nonfinite.get(t) == kind
            ),
            output,
        )
        node = view.nodes[view.producer[first]] if first in view.producer else None
        said = f" (node {node.name}, {node.op_type})" if node is not None else ""
        weight = _bad_weight(view, node) if node is not None else None
        cause = f"; its weight {weight} holds {kind}" if weight else ""
        hint = (
            "fix the model (a broken checkpoint's weights?) or the inputs: FP16 is judged "
            "against a finite FP32 reference"
        )
        narrow = _narrowing(node) if node is not None else ""
        if narrow:
            cause = f"; the model casts it to {narrow} there, past that type's range"
            hint = "keep that value in FP32: export the output (or cast) as FP32"
        raise UsageError(
            f"the FP32 reference of output '{output}' holds {kind} on the reference data; it "
            f"first appears in tensor '{first}'{said}{cause}",
            where=where,
            hint=hint,
        )


def _narrowing(node: onnx.NodeProto) -> str:
    """The 16-bit float type (`FP16`) a Cast node casts to, else "": where the model itself
    stores a value in FP16 (an FP16 output of a model exported in half precision)."""
    if node.op_type != "Cast":
        return ""
    to = next((a.i for a in node.attribute if a.name == "to"), None)
    return LOW_DTYPES[to].upper() if to in LOW_DTYPES else ""


def _ancestors(view: GraphView, tensor: str) -> set[str]:
    seen, stack = {tensor}, [tensor]
    while stack:
        i = view.producer.get(stack.pop())
        if i is None:
            continue
        for t in view.nodes[i].input:
            if t and t not in seen:
                seen.add(t)
                stack.append(t)
    return seen


def _bad_weight(view: GraphView, node) -> str | None:
    for t in node.input:
        if t in view.initializers:
            w = view.initializer_array(t)
            if np.issubdtype(w.dtype, np.floating) and not np.isfinite(w).all():
                return t
    return None


# The label of the quantized graph's own FP32 outputs where a reference model is judged against.
QUANTIZED_FP32 = "onnxrt-fp32-quantized"


# an input or output of another element type than the original's: the model's own I/O types
# were changed (ModelOpt's --direct_io_types gives an INT8 input where the first Q was, and
# FP16 outputs), so "name the model it was made from" misled: it was.
IO_TYPES_FIX = (
    "a quantizer changed the model's input/output types (ModelOpt: --direct_io_types), or it "
    "was exported in another precision (model.half()): quantize the original again without "
    "that, or name a reference model of the same types"
)


def check_reference_model(model: onnx.ModelProto, path: Path, where: str) -> None:
    """Exit 2 unless the reference model takes the same inputs and gives the same outputs
    (names, element types, and every dim both declare as a number) as `model`.

    Why before anything runs: the judge feeds both the same tensors and compares their
    outputs by name; a mismatch found later would be a traceback from ONNX Runtime.
    """
    from trtbuild.graph.model_io import check_model_file

    field = "accuracy.reference_model"
    fix = "name the unquantized model the quantized one was made from (same inputs and outputs)"
    check_model_file(path, what="reference model", field=field)
    try:
        original = onnx.load(str(path), load_external_data=False)  # the graph's I/O only
    except Exception as exc:
        raise UsageError(
            f"{field}: {path} is not a readable ONNX model ({type(exc).__name__})",
            where=where,
            hint=fix,
        ) from None
    for kind in ("input", "output"):
        mine, theirs = _io(model, kind), _io(original, kind)
        if set(mine) != set(theirs):
            raise UsageError(
                f"{field}: {path.name} has {kind}s {sorted(theirs)}, the model {sorted(mine)}",
                where=where,
                hint=fix,
            )
        for name, (dtype, dims) in mine.items():
            other_dtype, other_dims = theirs[name]
            if dtype != other_dtype or not _dims_agree(dims, other_dims):
                raise UsageError(
                    f"{field}: {kind} '{name}' is {_io_text(other_dtype, other_dims)} in "
                    f"{path.name} but {_io_text(dtype, dims)} in the model",
                    where=where,
                    hint=fix if dtype == other_dtype else IO_TYPES_FIX,
                )


def _io(model: onnx.ModelProto, kind: str) -> dict[str, tuple[int, list[int | str | None]]]:
    """name -> (element type, dims: a number, a symbol or None) of the graph's inputs/outputs."""
    values = fed_inputs(model) if kind == "input" else model.graph.output
    out = {}
    for vi in values:
        t = vi.type.tensor_type
        dims = (
            [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
            if t.HasField("shape")
            else None
        )
        out[vi.name] = (t.elem_type, dims)
    return out


def _dims_agree(a: list | None, b: list | None) -> bool:
    """Unknown ranks agree with anything; a symbolic dim with any dim; numbers must be equal."""
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    return all(not isinstance(x, int) or not isinstance(y, int) or x == y for x, y in zip(a, b))


def _io_text(dtype: int, dims: list | None) -> str:
    shown = (
        "?" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
    )
    return f"{onnx.TensorProto.DataType.Name(dtype).lower()} {shown}"


def _fixed_dims_fit(session: Any, path: Path, feed: Feed, at: tuple[str, str] | None) -> None:
    """Exit 2 where the reference model fixes a dim of an input that the point gives
    another size, naming the input, the dim and both sizes.

    Why: a model quantized and then given dynamic axes (or exported again with them) is
    judged at a batch its original, exported with batch 1, cannot take; ONNX Runtime's
    refusal was told as a model that was not the original.
    """
    label, where = at if at is not None else ("", str(path))
    for i in session.get_inputs():
        given = np.shape(feed[i.name]) if i.name in feed else None
        if given is None or len(given) != len(i.shape):
            continue
        for axis, (dim, size) in enumerate(zip(i.shape, given)):
            if isinstance(dim, int) and dim != size:
                raise UsageError(
                    f"accuracy.reference_model: {path.name} fixes dim {axis} of input "
                    f"'{i.name}' at {dim}, and the point {label or 'judged'} gives it {size}",
                    where=where,
                    hint=f"export {path.name} with that dim dynamic, as the model has it, or "
                    f"judge only points where it is {dim} (inputs.{i.name}: min/opt/max)",
                )


def against_reference_model(
    reference: ReferenceTensors,
    path: Path,
    feeds: list[Feed],
    sessions: dict[Path, Any] | None = None,
    at: tuple[str, str] | None = None,
) -> ReferenceTensors:
    """`reference` with the reference model's outputs as what the judge compares against,
    the graph's own FP32 outputs kept beside them (`graph_results`). `sessions` keeps the
    reference model's session for the next point of the run (it takes any shape). `at`:
    the point's label and where the policy names the reference model, for its errors.

    The reference model runs whole (only its outputs are kept) in an ONNX Runtime session
    with optimizations off, as the reference itself runs; the measures (peaks, internals,
    the walk) stay the graph's: tensor by tensor only the graph itself can be followed.
    """
    from polygraphy.comparator import RunResults

    from trtbuild.accuracy.sessions import lean_session

    outputs = reference.measures.outputs
    try:
        sessions = {} if sessions is None else sessions
        if path not in sessions:  # a path: external data is found beside it
            sessions[path] = lean_session(str(path))
        session = sessions[path]
        _fixed_dims_fit(session, path, feeds[0] if feeds else {}, at)
        iterations = session_runs(session, outputs, feeds)
    except Exception as exc:
        if not type(exc).__module__.startswith("onnxruntime") or surroundings_error(exc):
            raise  # not ONNX Runtime's refusal of the model: memory refused is the machine's
        raise UsageError(
            f"accuracy.reference_model: ONNX Runtime cannot run {path.name} on the policy's data: "
            f"{str(exc).strip()[:300]}",
            where=str(path),
            hint="name the unquantized model the quantized one was made from (same inputs and "
            "outputs)",
        ) from None
    _reference_finite(iterations, path, at)
    results = RunResults()
    results.append((REFERENCE, iterations))
    return ReferenceTensors(reference.measures, results, reference.run_results, path)


def session_runs(session: Any, outputs: list[str], feeds: list[Feed]) -> list:
    """`outputs` of a whole-model `session` on each of `feeds` (the inputs it takes), as
    the reference's iterations (runner `REFERENCE`): the reference model's, and the graph's
    as the policy keeps it (`breakdown.kept_runs`)."""
    from polygraphy.comparator.struct import IterationResult

    from trtbuild.accuracy.sessions import run_session

    names = [i.name for i in session.get_inputs()]
    iterations = []
    with quiet_polygraphy():
        for k, feed in enumerate(feeds):
            values = run_session(
                session, outputs, {n: feed[n] for n in names}, shrink=k == len(feeds) - 1
            )
            iterations.append(IterationResult(dict(zip(outputs, values)), runner_name=REFERENCE))
    return iterations


def _reference_finite(iterations: list, path: Path, at: tuple[str, str] | None) -> None:
    """Exit 2 where the reference model's output holds NaN or inf on the policy's data, as
    the graph's own FP32 run is refused (`check_finite`): nothing can be judged against it."""
    label, where = at if at is not None else ("", str(path))
    for k, iteration in enumerate(iterations):
        for name, value in iteration.items():
            value = np.asarray(value)
            if value.dtype.kind != "f" or np.isfinite(value).all():
                continue
            kind = "NaN" if np.isnan(value).any() else "inf"
            raise UsageError(
                f"accuracy.reference_model: output '{name}' of {path.name} holds {kind} on "
                f"sample {k} of the policy's data{f' at {label}' if label else ''}: FP16 is "
                "judged against a finite reference",
                where=where,
                hint=f"fix {path.name} or the inputs (its data: inputs.NAME.data), or name the "
                "model it was made from",
            )
