"""The front half of the pipeline: load, prepare, the FP32 reference, assign, convert.

`run_front` returns one frozen `Front`: every later stage (the judge, the
engines, `check`'s table, `tune`'s trials) reads it and none changes it. With a
cache, the prepared graph, the reference and the mixed model come from it when
their inputs are unchanged (`trtbuild.cache` says what the keys cover).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import onnx

from trtbuild import words
from trtbuild.accuracy import data as data_mod
from trtbuild.accuracy import shape_values
from trtbuild.accuracy.images import Decoded
from trtbuild.accuracy.points import ShapePoint, shape_points
from trtbuild.cache import Cache, code_fingerprint, feeds_digest
from trtbuild.cache import key as cache_key
from trtbuild.errors import UsageError, fields_located
from trtbuild.graph.analysis import Analysis
from trtbuild.graph.model_io import (
    fed_inputs,
    key_digest,
    load_model,
    read_model,
)
from trtbuild.graph.optypes import UNHANDED_TYPES
from trtbuild.graph.view import GraphView, constant
from trtbuild.numerics import has_kernels, oldest_capability
from trtbuild.passes.prepare import Prepared, prepare
from trtbuild.policy.model import Policy
from trtbuild.policy.specs import Passes, Precision
from trtbuild.precision.assign import Assignment, assign
from trtbuild.precision.convert import Converted, convert
from trtbuild.precision.rules import MatchContext, may_read_ranges

if TYPE_CHECKING:  # the reference's module is imported where one runs: `convert` runs none
    from trtbuild.accuracy.reference import ReferenceMeasures, ReferenceTensors


@dataclass(frozen=True)
class ShapeRun:
    """One point of the input space: its feeds, where their data comes from, its reference."""

    point: ShapePoint
    feeds: list[data_mod.Feed]  # none where `run_front` drew none (`draw=False`)
    measures: ReferenceMeasures | None
    reference: ReferenceTensors | None
    data: Mapping[str, data_mod.InputData] = field(default_factory=dict)  # per input


@dataclass(frozen=True)
class Front:
    """What the front half of the pipeline produced; shared by build, report, check, convert.

    Frozen: built once by `run_front`, read by every later stage, changed by none.

    `shapes` holds every point the policy is judged at, the primary one (`shape`
    or `opt`, else the first judged) first; `feeds` and `reference` are the
    primary's, and `measures` joins every point's (a range rule or an at-risk sum
    that leaves FP16 at any shape counts). `skipped` names the points the policy
    says not to judge, so every verdict can say so.
    """

    policy: Policy
    prepared: Prepared
    view: GraphView  # the one index over the prepared graph
    measures: ReferenceMeasures | None  # None only where no command step needs the reference
    assignment: Assignment
    converted: Converted
    analysis: Analysis  # the structural findings over `view`, found once, shared by assignments
    shapes: tuple[ShapeRun, ...]  # the points judged, the primary one first
    timings: Mapping[str, float] = field(default_factory=dict)  # seconds per stage
    cache_hits: Mapping[str, str] = field(default_factory=dict)  # prepared/reference: hit|miss|off
    skipped: tuple[ShapePoint, ...] = ()  # points the policy says not to judge, and why
    # the prepared graph's cache key ("" without a cache): the mixed model's origin
    digest: str = ""

    @property
    def feeds(self) -> list[data_mod.Feed]:
        return self.shapes[0].feeds

    @property
    def reference(self) -> ReferenceTensors | None:
        """With its tensors; only for run_front(reference="tensors")."""
        return self.shapes[0].reference

    @property
    def warnings(self) -> list[str]:
        return self.assignment.warnings + self.converted.warnings

    @property
    def quantized(self) -> bool:
        """Does the judged model hold QuantizeLinear/DequantizeLinear nodes? The words
        against `accuracy.reference_model` follow from it (`breakdown.split_words`): a model
        converted to FP16 elsewhere has no quantization to be "before"."""
        return bool(self.analysis.qdq().nodes)


def needs_reference(policy: Policy, analysis: Analysis) -> bool:
    """Range rules read the FP32 reference; without them `convert` need not run it. A range
    rule whose other keys select no node of this graph reads nothing (the periodic guard
    on a model without Sin or Cos: most models' `convert` runs no reference)."""
    ctx = MatchContext(analysis)
    return any(may_read_ranges(r, ctx) for r in policy.precision.all_rules())


# How much of the FP32 reference a command reads: nothing, its measures (peaks, internals:
# `check`, range rules) or its tensors too (the judge). Each level reads its own cache entry.
ReferenceLevel = Literal["none", "measures", "tensors"]


REFERENCE_LEVELS: tuple[str, ...] = get_args(ReferenceLevel)


def run_front(
    policy: Policy,
    *,
    reference: ReferenceLevel = "tensors",
    cache: Cache | None = None,
    verbose: bool = False,
    draw: bool = True,
    on_prepare: Callable[[], object] | None = None,
) -> Front:
    """Load, prepare, run the FP32 reference (as far as asked or needed), assign and convert.

    With a `cache`, the prepared graph and the reference come from it when their
    inputs are unchanged (`trtbuild.cache` says what the keys cover). `draw=False`
    (with `reference="none"`): no feeds are drawn (each point's `feeds` is empty, where
    its data comes from is still said and the user's files still checked), for a
    caller that runs nothing (`convert`). `on_prepare`: as `prepared_graph`'s.
    """
    if reference not in REFERENCE_LEVELS:
        raise ValueError(f"reference must be one of {REFERENCE_LEVELS}, not {reference!r}")
    if not draw and reference != "none":
        raise ValueError('draw=False draws no feeds: the reference needs them (reference="none")')
    cache = cache if cache is not None else Cache(enabled=False)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    budget = policy.accuracy.budget().bytes  # bounds constant folding too
    with fields_located(policy.where_of):  # a pass names its field, not the file
        prepared, digest = prepared_graph(
            policy.model, policy.passes, cache, verbose, budget, on_prepare
        )
    view = GraphView(prepared.model)
    analysis = Analysis(view)  # its findings shared by every later assignment (tune's trials)
    _check_inputs(policy, prepared, analysis)
    reference, draw = _what_runs(policy, prepared, analysis, reference, draw)
    timings["prepare"] = time.perf_counter() - t

    t = time.perf_counter()
    shapes, skipped = _shape_runs(policy, prepared, analysis, cache, digest, reference, draw)
    measures = _measures(policy, view, shapes)
    if reference != "none":
        timings["reference"] = time.perf_counter() - t

    t = time.perf_counter()
    ranges = measures.ranges if measures is not None else None
    assignment = _bf16_has_kernels(policy, assign(view, policy.precision, ranges, analysis))
    converted = _converted(assignment, cache, digest)
    timings["assign_convert"] = time.perf_counter() - t
    return Front(
        policy,
        prepared,
        view,
        measures,
        assignment,
        converted,
        analysis,
        tuple(shapes),
        timings,
        _hits(cache, reference),
        skipped,
        digest or "",
    )


def _measures(policy: Policy, view: GraphView, shapes: list[ShapeRun]) -> ReferenceMeasures | None:
    """Every point's measures as one (each checked finite: a non-finite FP32 reference is
    the model's own problem, exit 2)."""
    for run in shapes:
        if run.measures is not None:
            from trtbuild.accuracy.reference import check_finite

            check_finite(view, run.measures, str(policy.model))
    return join_measures([r.measures for r in shapes if r.measures is not None])


def _check_inputs(policy: Policy, prepared: Prepared, analysis: Analysis) -> None:
    """What TensorRT would refuse (its Q/DQ rules) and a reference model that does not fit:
    exit 2 naming the field, before anything runs."""
    _bound_by_tensorrt(policy, prepared.model)
    _tolerances_fit(policy, analysis)
    _ops_one_runtime_lacks(policy, analysis)
    check_quantized(policy, analysis)
    shape_values.check_lengths(policy, analysis.view)
    original = policy.accuracy.reference_model
    if original is not None:
        from trtbuild.accuracy.reference import check_reference_model

        check_reference_model(
            prepared.model, original, policy.where_of("accuracy", "reference_model")
        )


def _bf16_has_kernels(policy: Policy, assignment: Assignment) -> Assignment:
    """`assignment`, or exit 2 where nodes run BF16 and a `build.compute_capabilities` entry
    is below BF16's oldest (`numerics.MIN_CAPABILITY`), naming the field, as FP8 below its
    own is (`check_quantized`).

    Why before any build: TensorRT-RTX refused it only at the end of `build`, after the
    judge ("Cannot compile for target(s) sm75, because the model contains HW-specific
    datatypes: b16", exit 3), and `check`, `convert` and `tune` said nothing.
    """
    old = [c for c in policy.build.compute_capabilities if not has_kernels(c, "bf16")]
    count = sum(d.precision == "bf16" for d in assignment.decisions)
    if old and count:
        raise UsageError(
            f"{', '.join(old)} has no BF16 kernels (BF16 needs "
            f"{oldest_capability('bf16')} or newer), and the policy runs {count} node(s) in BF16",
            where=policy.where_of("build", "compute_capabilities"),
            hint=f"build only for {oldest_capability('bf16')} and newer, or use fp16 where BF16 "
            "is chosen (precision.default, the rules' precision)",
            field=("build", "compute_capabilities"),
        )
    return assignment


def check_quantized(policy: Policy, analysis: Analysis) -> None:
    """A quantized model TensorRT would refuse is exit 2 here, naming the node and the fix.

    Why before any work: TensorRT says "Non-zero zero point is not supported" only
    at the end of a build (exit 3), after the reference, the judge and a verdict
    that passed; ONNX Runtime runs the same model without a word.
    """
    from trtbuild.graph.qdq import violations

    qdq = analysis.qdq()
    if not qdq:
        return
    found = violations(qdq, policy.build.compute_capabilities)
    if not found:
        return
    kinds: dict[tuple[str, str], list] = {}  # every kind of problem said at once, in order
    for v in sorted(found, key=lambda v: ORDER.index(v.field)):
        kinds.setdefault((v.field, v.fix), []).append(v)
    said = []
    for group in kinds.values():
        more = f" (and {len(group) - 1} more Q/DQ node(s))" if len(group) > 1 else ""
        said.append(f"Q/DQ node {group[0].node}: {group[0].problem}{more}")
    capability = found[0].field == "compute capability" and len(kinds) == 1  # the policy's
    at = ("build", "compute_capabilities") if capability else ()
    raise UsageError(
        "; ".join(said),
        where=policy.where_of(*at) if at else str(policy.model),
        hint="; ".join(dict.fromkeys(fix for _, fix in kinds)),
        field=at,
    )


def _tolerances_fit(policy: Policy, analysis: Analysis) -> None:
    """Exit 2 for a tolerance of an output the model does not have, for `compare: indices`
    without `top_k` on a float output, for a `top_k_axis` the output does not have, and for
    `top_k` on a scalar or a boolean output (no axis to rank along; no ranking at all).

    Why: a misspelt output's tolerance was never read, so the output was judged by the
    default one without a word; and Polygraphy's `IndicesCompareFunc` takes the values it
    is given as indices: a float output's logits were compared for equality.
    """
    view = analysis.view
    outputs = list(view.outputs)
    given = dict(policy.accuracy.output_tolerances)
    for name in given:
        if name not in outputs:
            raise UsageError(
                f"{words.field('accuracy', 'tolerances', 'outputs', name)}: the model has no output {name!r} (its "
                f"outputs: {', '.join(outputs)})",
                where=policy.where_of("accuracy", "tolerances", "outputs", name),
                hint="name one of the model's outputs",
            )
    dims = {  # None where the model does not say (no shape at all), () for a scalar
        o.name: tuple(d.dim_value or None for d in o.type.tensor_type.shape.dim)
        if o.type.tensor_type.HasField("shape")
        else None
        for o in view.graph.output
    }
    bools = {
        o.name for o in view.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.BOOL
    }
    for name in outputs:
        at = ("accuracy", "tolerances", *(("outputs", name) if name in given else ("default",)))
        tol = policy.accuracy.tolerance(name)
        if tol.top_k and name in bools:  # Polygraphy's top k negates it: a traceback, exit 70
            raise UsageError(
                f"{words.field(*at)}: top_k ranks the boolean output {name!r}, whose values "
                "tie everywhere (True or False): its top k are no choice the model made",
                where=policy.where_of(*at, "top_k"),
                hint=_by_values(name),
            )
        _indices_fit(policy, at, name, tol, view, dims.get(name))


def _indices_fit(
    policy: Policy, at: tuple[str, ...], name: str, tol: Any, view: Any, dims: tuple | None
) -> None:
    """One output's `compare: indices`: `top_k` on a float output, its axis one it has, an
    `index_tolerance` that leaves something to compare (`at`: the tolerance that says so;
    `dims`: the output's, None where unknown)."""
    key = words.field(*at)
    rank = None if dims is None else len(dims)
    if tol.top_k and rank == 0:  # a traceback (exit 70) where its top k were taken
        raise UsageError(
            f"{key}: top_k ranks the output {name!r} along an axis, and it is a scalar "
            "(rank 0): it has none",
            where=policy.where_of(*at, "top_k"),
            hint=_by_values(name),
        )
    _tolerance_leaves_some(policy, at, name, tol, dims)
    if tol.top_k and rank and not -rank <= tol.ranked_axis < rank:
        raise UsageError(
            f"{key}: top_k_axis {tol.ranked_axis} is not an axis of the output {name!r} "
            f"(rank {rank})",
            where=policy.where_of(*at, "top_k_axis"),
            hint=f"give an axis from {-rank} to {rank - 1} (the classes' axis)",
        )
    if tol.compare == "indices" and tol.top_k is None and view.is_float(name):
        raise UsageError(
            f"{key}: compare: indices on the float output {name!r} compares its values as "
            "indices (Polygraphy's IndicesCompareFunc takes indices)",
            where=policy.where_of(*at, "compare"),
            hint="add top_k (its k largest values along the last axis, or top_k_axis, as "
            "indices), or judge the integer output of an ArgMax or TopK",
        )


def _tolerance_leaves_some(
    policy: Policy, at: tuple[str, ...], name: str, tol: Any, dims: tuple | None
) -> None:
    """Exit 2 for a `compare: indices` that compares nothing of the output's declared dims
    (`checks.compares_nothing`; the judge asks again of the dims the data gives)."""
    from trtbuild.accuracy.checks import compares_nothing

    if dims is None or (found := compares_nothing(tol, dims)) is None:
        return
    key, reason, hint = found
    raise UsageError(
        f"{words.field(*at)}: {reason.format(name=repr(name))}",
        where=policy.where_of(*at, key),
        hint=hint.format(name=repr(name)) + _own_tolerance(at, name),
    )


def _by_values(name: str) -> str:
    """The fix where `top_k` ranks an output that has nothing to rank."""
    return (
        f"judge {name!r} by atol/rtol (remove compare: indices and top_k from its "
        "tolerance), or give it a tolerance of its own under outputs:"
    )


def _own_tolerance(at: tuple[str, ...], name: str) -> str:
    """`; or give NAME a tolerance of its own`, where the default tolerance is at fault."""
    if at[-1] != "default":
        return ""
    return f"; or give {name!r} a tolerance of its own under accuracy.tolerances.outputs"


def _bound_by_tensorrt(policy: Policy, model: onnx.ModelProto) -> None:
    """Exit 2 for a graph input or output no engine binds: strings, sequences, maps,
    optionals; and for a model without outputs.

    Why: a TensorRT engine binds tensors of numbers only; such an input (a text
    normalizer's words, scikit-learn's maps) ended in a traceback where the data for it
    was drawn, such an output (a classifier's label strings) where it was compared.
    """
    if not model.graph.output:  # ONNX Runtime refused the session: a traceback, exit 70
        raise UsageError(
            "the model has no graph outputs: nothing it computes can be judged, and an engine "
            "of it would answer nothing",
            where=str(policy.model),
            hint="export the model with the outputs the deployment reads (graph.output)",
        )
    for end, vi in _ends(model):
        kind = vi.type.WhichOneof("value")
        if kind == "tensor_type" and vi.type.tensor_type.elem_type != onnx.TensorProto.STRING:
            continue
        strings = kind == "tensor_type"
        what = "a string tensor" if strings else UNBOUND.get(kind, f"a {kind}")
        if end == "input":
            hint = "give the model from where its inputs are numbers (tokenize, decode or "
            hint += "split them before it), as the engine will be fed"
        else:
            done = "map indices to labels after it" if strings else "stack them"
            hint = f"give the model up to where its outputs are tensors of numbers ({done}), "
            hint += "as the engine will answer"
        raise UsageError(
            f"the model's {end} '{vi.name}' is {what}: a TensorRT engine binds tensors of "
            "numbers only",
            where=str(policy.model),
            hint=hint,
        )


def _ends(model: onnx.ModelProto) -> list[tuple[str, onnx.ValueInfoProto]]:
    """The graph's fed inputs and its outputs, each with what it is ("input", "output")."""
    return [("input", vi) for vi in fed_inputs(model)] + [
        ("output", vi) for vi in model.graph.output
    ]


def _what_runs(
    policy: Policy, prepared: Prepared, analysis: Analysis, reference: str, draw: bool
) -> tuple[str, bool]:
    """(reference, draw) as asked, or with the measures where a range rule needs them; and
    where data is drawn and values read (through ONNX Runtime's Python API), ends of a type
    it has no array of refused (`_judged_ends`)."""
    if reference == "none" and needs_reference(policy, analysis):
        reference, draw = "measures", True
    if draw:
        _judged_ends(policy, prepared.model)
    return reference, draw


def _judged_ends(policy: Policy, model: onnx.ModelProto) -> None:
    """Exit 2 for a graph input or output of a type ONNX Runtime's Python API has no array
    of (BF16, INT4): its data cannot be drawn for the reference, nor its values compared
    (was exit 70). A TensorRT engine binds it, and `convert`, which judges nothing, writes
    its mixed model; trtbuild cannot judge it."""
    for end, vi in _ends(model):
        kind = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if kind not in UNHANDED_TYPES:
            continue
        name = onnx.TensorProto.DataType.Name(kind)
        plain = "FP32 (or FP16)" if kind == onnx.TensorProto.BFLOAT16 else "INT8 (or FP32)"
        raise UsageError(
            f"the model's {end} '{vi.name}' is {name}: trtbuild judges through ONNX Runtime's "
            f"Python API, which takes and hands out no {name} array",
            where=str(policy.model),
            hint=f"give the model with {plain} inputs and outputs, cast to {name} inside it",
        )


# What each kind of ONNX type that is no tensor is called in a message.
UNBOUND = {
    "sequence_type": "a sequence",
    "map_type": "a map",
    "optional_type": "an optional",
    "sparse_tensor_type": "a sparse tensor",
}


def _ops_one_runtime_lacks(policy: Policy, analysis: Analysis) -> None:
    """Exit 2 for ops one of the two runtimes does not run. TensorRT's parser: ONNX
    Runtime's dynamic or QOperator quantization (ConvInteger, QLinearConv, ...), its own
    fused ops (`SkipLayerNormalization`, `BiasGelu`, ... of its transformer optimizer) and
    ONNX-ML's (`LinearRegressor`, `TreeEnsembleClassifier`, `ZipMap`, ... of skl2onnx).
    ONNX Runtime: ModelOpt's TensorRT ops of NVFP4, MXFP8 and a torch export's INT4
    weights (TensorRT's FP8 Q/DQ are made ONNX's in `prepare`). Neither, as the judge
    needs it: random draws (StyleGAN2's noise injection exported as `randn_like`).

    Why before any work: ONNX Runtime runs the first kind, so `check` passed (and a
    LayerNorm rule matched nothing the optimizer had fused); TensorRT's parser refused them
    only at the build (exit 3), after the reference and the judge had run. The second kind
    ONNX Runtime refused at the reference's run, as a plugin's, told to give the model "as
    exported": it was. Random draws passed `check`, then failed every verdict as if FP16
    had (`tune` pinned every node).
    """
    for what, tail, fix, refused in _lacking():
        found = [n for n in analysis.view.nodes if refused(n)]
        if found:
            named = sorted({f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in found})
            raise UsageError(
                f"{len(found)} node(s) of {what} ({', '.join(named)}; the first: "
                f"{found[0].name}), {tail}",
                where=str(policy.model),
                hint=fix,
            )


def _lacking() -> tuple[tuple[str, str, str, Callable[[onnx.NodeProto], bool]], ...]:
    """Each kind of op `_ops_one_runtime_lacks` refuses: (what, why, the fix, the test)."""
    from trtbuild.graph import optypes
    from trtbuild.graph import qdq as q

    tensorrt = "which TensorRT does not run"
    return (
        (
            "ONNX Runtime's dynamic, QOperator or weight-only quantization",
            tensorrt,
            q.INTEGER_FIX,
            q.integer,
        ),
        ("ONNX Runtime's own ops", tensorrt, optypes.RUNTIME_ONLY_FIX, optypes.runtime_only),
        ("ONNX-ML's classic ML ops", tensorrt, optypes.CLASSIC_ML_FIX, optypes.classic_ml),
        (
            "ModelOpt's NVFP4, MXFP8 or INT4 quantization as TensorRT ops",
            "which ONNX Runtime has no kernel for: neither the quantized graph's reference "
            "nor its FP16 emulation can run",
            q.TENSORRT_QUANTIZATION_FIX,
            q.tensorrt_quantization,
        ),
        (
            "random numbers drawn in the graph",
            "whose values differ from run to run and between ONNX Runtime's generator and "
            "TensorRT's: no FP32 reference can judge what they reach",
            optypes.RANDOM_FIX,
            optypes.random,
        ),
    )


# The order problems are said in: what the user fixes by re-quantizing first.
ORDER = ("zero point", "format", "scale", "block_size", "compute capability")


def _shape_runs(
    policy: Policy,
    prepared: Prepared,
    analysis: Analysis,
    cache: Cache,
    digest: str | None,
    reference: ReferenceLevel,
    draw: bool,
) -> tuple[list[ShapeRun], tuple[ShapePoint, ...]]:
    """Every point judged, one after another (peak memory is one point's), and those skipped.
    Where data is drawn, the values of each input TensorRT takes for a shape tensor are
    checked known (`accuracy.shape_values`): what the engine's profile will hold."""
    points = shape_points(policy, prepared.model)
    skipped = tuple(p for p in points if p.skip is not None)
    if len(skipped) == len(points):
        raise UsageError(
            "accuracy.shapes: every point is skipped, so nothing would be judged",
            where=policy.where_of("accuracy", "shapes"),
            hint="judge at least one point: remove a skip",
        )
    decoded = Decoded()  # each image decoded once, every point fit from its original
    judged = [p for p in points if p.skip is None]
    data_mod.check_points(policy, prepared.model, judged, decoded)  # headers: nothing read
    originals: dict[Path, Any] = {}  # the reference model's session, made once for every point
    original = policy.accuracy.reference_model  # its bytes hashed once, not once a point
    known = key_digest(original) if digest and original and reference != "none" else None
    decides = analysis.shape_inputs() if draw else {}
    run = _PointRun(policy, prepared, analysis.view, cache, digest, reference, draw, known, decides)
    runs = [run(point, decoded, originals) for point in judged]
    shape_values.check_known(policy, runs, decides)
    return runs, skipped


@dataclass(frozen=True)
class _PointRun:
    """What every point's FP32 run reads alike: the policy, the graph, the cache."""

    policy: Policy
    prepared: Prepared
    view: GraphView
    cache: Cache
    digest: str | None
    reference: ReferenceLevel
    draw: bool  # the feeds drawn (`run_front`'s `draw`)
    original: str | None = None  # `accuracy.reference_model`'s digest, where a key is made
    # the inputs TensorRT takes for shape tensors, checked given data before the reference
    shape_inputs: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, point: ShapePoint, decoded: Decoded, originals: dict[Path, Any]) -> ShapeRun:
        policy, prepared = self.policy, self.prepared
        disagree = _shared_dims_disagree(policy, point, prepared.model)
        if disagree is not None:
            raise disagree
        made = data_mod.point_feeds(policy, prepared.model, point, decoded, self.draw)
        feeds = made.feeds
        shape_values.check_given(policy, point, made.data, self.shape_inputs)
        if self.reference == "none":
            return ShapeRun(point, feeds, None, None, made.data)
        try:
            measures, ref = _reference(self, feeds)
        except Exception as exc:
            if not type(exc).__module__.startswith("onnxruntime"):
                raise
            raise _cannot_run(policy, point, exc, self.view) from None
        original = policy.accuracy.reference_model
        if ref is not None and original is not None:
            ref = _against_original(self, original, ref, feeds, originals, point)
        return ShapeRun(point, feeds, measures, ref, made.data)


def _against_original(
    run: _PointRun,
    path: Path,
    ref: ReferenceTensors,
    feeds: list,
    sessions: dict[Path, Any],
    point: ShapePoint,
) -> ReferenceTensors:
    """`ref` against `path`, `accuracy.reference_model` (`against_reference_model`), its
    outputs from the cache when the prepared graph (whose key holds the code and the
    versions that run it), the reference model's bytes, the feeds and the outputs match.

    Why cached: the model before quantization runs whole at every point, every build; a
    nightly job rebuilding an unchanged policy would run it again for nothing. Stored
    only where the file still has the bytes the key was made of: its session reads the
    file by path (where it keeps external data), and a model replaced meanwhile (an export
    rewriting it) stored its outputs under the other's key.
    """
    from trtbuild.accuracy.reference import ReferenceTensors, against_reference_model

    key = None
    if run.original is not None:  # (unreadable: `against_reference_model` says why)
        outputs = ",".join(ref.measures.outputs)
        key = cache_key("reference-model", run.digest, run.original, feeds_digest(feeds), outputs)
        cached = run.cache.get("reference", key)
        if cached is not None:
            return ReferenceTensors(ref.measures, cached, ref.run_results, path)
    at = (point.label, run.policy.where_of("accuracy", "reference_model"))
    made = against_reference_model(ref, path, feeds, sessions, at)
    if key is not None and key_digest(path) == run.original:  # still the file it named
        run.cache.put("reference", key, made.run_results)
    return made


def _shared_dims_disagree(
    policy: Policy, point: ShapePoint, model: onnx.ModelProto
) -> UsageError | None:
    """A point at which inputs sharing a named dim (the model's `dim_param`: a BERT's
    `input_ids` and `attention_mask` both `[batch, sequence]`) are given two sizes: that,
    naming both inputs, the dim and the field, before anything runs.

    Why before the reference, and not only where ONNX Runtime refuses the point: TensorRT's
    parser names the dims so and holds them to one size (a profile whose ranges for the
    name do not overlap fails the build; an engine refuses a run that gives two), so no
    engine runs such a point, whatever ONNX Runtime's broadcasting makes of it (a TrOCR
    judged at an image batch of 2 and a token batch of 1 passed). Dims that are not one
    size are given two names (`passes.override_input_shapes`).
    """
    from trtbuild.accuracy.points import model_inputs

    seen: dict[str, tuple[str, int, int]] = {}
    for name, _, dims in model_inputs(model):
        for axis, dim in enumerate(dims):
            if not isinstance(dim, str) or name not in point.shapes:
                continue
            size = point.shapes[name][axis]
            first = seen.setdefault(dim, (name, axis, size))
            if first[2] == size:
                continue
            other, other_axis, other_size = first
            at = _point_field(point, name)
            return UsageError(
                f"no engine runs {point.label}: {other} (dim {other_axis}) and {name} (dim "
                f"{axis}) share the model's dim '{dim}', given {other_size} and {size} there "
                "(TensorRT holds the inputs of one dim name to one size)",
                where=policy.where_of(*at),
                hint=f"give every input the same size for '{dim}' at each point "
                "(min, opt, max, accuracy.shapes), or, where the two are not one size, name "
                "them apart (passes.override_input_shapes)",
            )
    return None


def _point_field(point: ShapePoint, name: str | None = None) -> tuple[str, ...]:
    """Where the policy gives `point`: `inputs.NAME.min` (or `inputs` where no input is
    named), or a named point's own `accuracy.shapes.NAME`."""
    which = point.name.split("=")[0]
    if which in ("min", "opt", "max", "shape"):
        return ("inputs", name, which) if name else ("inputs",)
    return ("accuracy", "shapes", which)


def _cannot_run(policy: Policy, point: ShapePoint, exc: Exception, view: GraphView) -> UsageError:
    """ONNX Runtime refused to run the FP32 model on the policy's data: the user's input.

    Why exit 2 and not a bug: a shape the model cannot take (720 rows where it
    halves five times) fails inside a node, as Polygraphy's `run` would. The refusals
    no shape or data mends are said as what they are (`_not_by_data`), and a size the
    export wrote into the graph as what it is (`_baked`).
    """
    import re

    text = str(exc)
    found = _not_by_data(policy, text, view.opset)
    if found is not None:
        return found
    node = re.search(r"Name:'([^']*)'", text)
    said = re.search(r"Status Message: (.*)", text)
    where = f" in node {node.group(1)}" if node else ""
    baked = _baked(view, node.group(1)) if node else ""
    return UsageError(
        f"the FP32 model cannot run at {point.label}{where}: "
        + (baked or (said.group(1) if said else text).strip()[:300]),
        where=policy.where_of(*_point_field(point)),  # a named point: its own line
        hint=(
            "re-export the model with that dim dynamic (torch.onnx.export's dynamic_axes, "
            "or dynamic_shapes for dynamo), or give only the sizes it was exported at"
            if baked
            else "choose input shapes (inputs.*.shape, min/opt/max, accuracy.shapes) or data "
            "the model takes"
        ),
    )


# Ops whose second input is the shape they make: a constant there is a size the export
# wrote into the graph (TorchScript traces `x.view(1, 50, 8)` with the 50 it saw).
_SHAPE_MAKERS = {"Reshape": "reshapes", "Expand": "expands"}


def _baked(view: GraphView, name: str) -> str:
    """The node named `name` made a shape from a constant, said ("" where it did not)."""
    found = [view.nodes[i] for i in view.top if view.nodes[i].name == name]
    if not found or found[0].op_type not in _SHAPE_MAKERS or len(found[0].input) < 2:
        return ""
    shape = constant(view, found[0].input[1])
    if shape is None or shape.size == 0 or (shape <= 0).any():  # -1 or 0: a dim it infers
        return ""
    return (
        f"it {_SHAPE_MAKERS[found[0].op_type]} to the constant shape {shape.tolist()}, a size "
        "the export wrote into the graph: the model runs only at inputs that fit it"
    )


def _not_by_data(policy: Policy, text: str, opset: int) -> UsageError | None:
    """ONNX Runtime's refusal `text`, where no shape or data mends it: a kernel it cannot
    make from a node's attributes (an exporter's invalid `perm`); an op it does not
    have (a plugin's); a model of an opset older than it runs (`opset`, the prepared
    graph's: PyTorch's opset-6 conversions); an op it has no kernel for of the types the
    node reads (a GlobalAveragePool of doubles). None for any other refusal."""
    import re

    from trtbuild.policy.specs import OPSET_FIX, OPSET_RANGE

    init = re.search(r"Exception during initialization: (.*)", text) or re.search(
        r"(Node \([^)]*\) Op \([^)]*\) \[TypeInferenceError\] Invalid attribute .*)", text
    )  # the second: its attributes against the rank the model declares, at the session's start
    if init:  # a kernel made from its attributes and weights: no shape is known yet
        return UsageError(
            f"ONNX Runtime cannot load the model: {init.group(1).strip()[:300]}",
            where=str(policy.model),
            hint="a node's attributes or weights are invalid whatever the input shapes "
            "(an exporter's fault): re-export the model (another opset or exporter version), "
            "or mend the node whose op it names",
        )
    unknown = re.search(r"(\S+)\(-?\d+\) is not a registered function/op", text)
    if unknown:
        return UsageError(
            f"ONNX Runtime has no op {unknown.group(1)} (a TensorRT plugin, or another "
            "runtime's custom op?): trtbuild runs the FP32 reference and the FP16 emulation "
            "in ONNX Runtime, so this model cannot be judged",
            where=str(policy.model),
            hint="give the model as exported, before its nodes were replaced by plugin or "
            "custom ops",
        )
    kernel = re.search(r"Could not find an implementation for (\S+)\((\d+)\)", text)
    if kernel is None:
        return None
    op, version = kernel.groups()
    oldest = OPSET_RANGE[0]  # ONNX Runtime's kernels start there
    if opset < oldest:
        return UsageError(
            f"ONNX Runtime has no kernel for {op} as opset {version} defines it "
            f"(it runs opset {oldest} and later): the model is of opset {opset}",
            where=policy.where_of("passes", "opset"),
            hint=f"{OPSET_FIX} (onnx's version converter; the engine is built from the "
            "upgraded graph)",
        )
    node = re.search(r"node with name '([^']*)'", text)
    return UsageError(
        f"ONNX Runtime has no kernel for {op}({version}) of the types node "
        f"{node.group(1) if node else '?'!r} reads: trtbuild runs the FP32 reference and the "
        "FP16 emulation in ONNX Runtime, so this model cannot be judged",
        where=str(policy.model),
        hint="compute that node in float32 in the model (ONNX Runtime's CPU kernels cover "
        "float32 for nearly every float op; double, float16 and integers for fewer)",
    )


def join_measures(all_measures: list[ReferenceMeasures]) -> ReferenceMeasures | None:
    """The first point's measures with every point's peaks: ranges and internals at their
    largest over all shapes, sentinel tensors of any shape."""
    if len(all_measures) <= 1:
        return all_measures[0] if all_measures else None
    ranges: dict[str, float] = {}
    internals: dict[str, tuple[str, dict[str, float]]] = {}
    for m in all_measures:
        for t, v in m.ranges.items():
            ranges[t] = max(ranges.get(t, 0.0), v)
        for node, (op, peaks) in m.internals.items():
            mine = internals.setdefault(node, (op, {}))[1]
            for q, v in peaks.items():
                mine[q] = max(mine.get(q, 0.0), v)
    held = frozenset().union(*(m.sentinel_tensors for m in all_measures))
    return replace(all_measures[0], ranges=ranges, internals=internals, sentinel_tensors=held)


def _hits(cache: Cache, reference: ReferenceLevel) -> dict[str, str]:
    """`build.json`'s `cache`: hit, miss or off for each entry the run needed."""
    hits = {"prepared": cache.hits.get("prepared", "off")}
    if reference != "none":  # a hit when every entry the level reads was one
        kinds = ("measures", "reference") if reference == "tensors" else ("measures",)
        seen = [cache.hits[k] for k in kinds if k in cache.hits]
        hits["reference"] = (
            "hit"
            if seen == ["hit"] * len(kinds)
            else ("off" if "off" in seen or not seen else "miss")
        )
    hits["converted"] = cache.hits.get("converted", "off")
    return hits


def prepared_graph(
    model: Path,
    passes: Passes,
    cache: Cache,
    verbose: bool = False,
    budget: int | None = None,
    on_prepare: Callable[[], object] | None = None,
) -> tuple[Prepared, str | None]:
    """The prepared graph and its cache key, from the cache when model, passes, the folding
    budget (`prepare`'s `budget`, in the key: it decides what is folded) and code match.

    `on_prepare` is called where the graph is made anew, before the model is loaded:
    `convert` starts its check's children then, their imports beside the passes (an
    unreadable model kills them unused).
    """
    digest = None
    # the key's bytes are the model's (a FIFO or a device: None, and `load_model` says so),
    # read with or without a cache: `load_model` parses and checks them as they are
    raw = read_model(model)
    source_digest = key_digest(model, raw) if raw is not None and cache.enabled else None
    if source_digest is not None:  # (unreadable or not ONNX: load_model says so)
        digest = cache_key(
            "prepared", code_fingerprint(), source_digest, repr(passes), repr(budget)
        )
        cached = cache.get("prepared", digest)
        if cached is not None:
            return cached, digest
    if on_prepare is not None:
        on_prepare()
    loaded = load_model(model, raw=raw)
    del raw  # parsed: not held through the passes
    prepared = prepare(loaded, passes, source=str(model), verbose=verbose, budget=budget)
    if digest is not None:
        cache.put("prepared", digest, prepared)
    return prepared, digest


def _converted(assignment: Assignment, cache: Cache, digest: str | None) -> Converted:
    """The mixed model, from the cache when the prepared graph and every node's precision
    match: the conversion reads nothing else (rule ids only label the report)."""
    precisions = ",".join(str(d.precision) for d in assignment.decisions)
    precisions += "|dequantized:" + ",".join(map(str, sorted(assignment.dequantized)))
    key = cache_key("converted", digest, precisions) if digest else None
    if key is not None:
        cached = cache.get("converted", key)
        if cached is not None:
            return cached
    converted = convert(assignment)
    if key is not None:
        cache.put("converted", key, converted)
    return converted


def _reference(run: _PointRun, feeds: list) -> tuple[ReferenceMeasures, ReferenceTensors | None]:
    """The FP32 reference to `run.reference`'s level, from the cache when the prepared
    graph and feeds match.

    The measures have an entry of their own, always written; the outputs of
    every feed (`tensors`) another, written only by a command that reads them
    and only while small against the cap (`Cache.put`): `check` writes no tensors.
    """
    from trtbuild.accuracy.reference import ReferenceTensors, run_reference

    cache, digest, level = run.cache, run.digest, run.reference
    key = cache_key("reference", digest, feeds_digest(feeds)) if digest else None
    if key is not None:
        measures = cache.get("measures", key)
        if measures is not None and level == "measures":
            return measures, None
        outputs = cache.get("reference", key) if measures is not None else None
        if outputs is not None:
            return measures, ReferenceTensors(measures, outputs)
    ref = run_reference(run.prepared.model, feeds, run.view, budget=run.policy.accuracy.budget())
    if key is not None:
        cache.put("measures", key, ref.measures)
        if level == "tensors":
            cache.put("reference", key, ref.run_results)
    return ref.measures, ref if level == "tensors" else None


def baseline(front: Front, default: str) -> Converted:
    """The same prepared graph with no rules: all-FP16 (what the policy buys) or all-FP32."""
    return convert(assign(front.view, Precision(default=default, guards=()), None, front.analysis))


def baselines(front: Front, *, engines: bool = False) -> dict[str, Converted]:
    """The baselines a build needs, each converted once: all-FP16 always, all-FP32 where the
    policy checks it or builds it as an engine variant (`engines`)."""
    accuracy, build = front.policy.accuracy, front.policy.build
    wanted = ["fp16"] + (["fp32"] if accuracy.fp32_check or (engines and build.variants) else [])
    return {v: baseline(front, v) for v in wanted}


def kept_quantization(front: Front) -> Converted | None:
    """The quantized graph as the policy keeps it: its `dequantize: true` rules applied (the
    ops they decide read the float values), everything in FP32; None where no rule takes an
    op out (the graph as given is that one).

    Why: with such rules the policy's error against `accuracy.reference_model` is the
    quantization it keeps plus its low precision's storage; measured against the graph as
    given, an op a rule took out of INT8 showed its whole INT8 error as the FP16 part. Each
    rule kept in its place with FP32 as its precision decides the same nodes (first match
    wins, whatever the precision); where the ops taken out still differ, None.
    """
    if not front.assignment.dequantized:
        return None
    rules = tuple(replace(r, precision="fp32") for r in front.policy.precision.rules)
    precision = replace(front.policy.precision, default="fp32", rules=rules, guards=())
    ranges = front.measures.ranges if front.measures is not None else None
    kept = assign(front.view, precision, ranges, front.analysis)
    return convert(kept) if kept.dequantized == front.assignment.dequantized else None
