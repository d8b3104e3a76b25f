"""The build pipeline, top to bottom: prepare → assign → convert → build → report.

Every stage is a function of values. Artifacts are staged in a hidden directory
next to the output directory and moved into place only when the run finished
(an accuracy failure is a finished run: its report is the point), so an
interrupted or failed build leaves the previous artifacts intact.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

import onnx

from trtbuild import __version__
from trtbuild.accuracy import data as data_mod
from trtbuild.accuracy import evaluate as ev
from trtbuild.accuracy import risk
from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.evaluate import EMULATED, trt_runner
from trtbuild.accuracy.judge import Candidate, Verdict, judge_all
from trtbuild.accuracy.reference import (
    ReferenceMeasures,
    ReferenceTensors,
    check_finite,
    run_reference,
)
from trtbuild.accuracy.report import Report, ShapeVerdict
from trtbuild.cache import Cache, code_fingerprint, feeds_digest, model_digest
from trtbuild.cache import key as cache_key
from trtbuild.errors import EXIT_ACCURACY, EXIT_OK, UsageError
from trtbuild.fsutil import sha256_file, write_bytes, write_json, write_text
from trtbuild.graph.model_io import load_model, save_model
from trtbuild.graph.optypes import computes
from trtbuild.graph.view import GraphView
from trtbuild.numerics import LOW_MAX
from trtbuild.passes.prepare import Prepared, prepare
from trtbuild.policy.model import MemoryBudget, Passes, Policy, Precision
from trtbuild.precision.assign import Assignment, assign
from trtbuild.precision.convert import Converted, convert
from trtbuild.precision.validate import validate_mixed

REPORT_FILES = (
    "report.json",
    "report.md",
    "report.html",
    "junit.xml",
    "reference_outputs.json",
    "evaluated_outputs.json",
)
BUILD_FILES = ("prepared.onnx", "mixed.onnx", "engine.plan", "build.json", *REPORT_FILES)


@dataclass(frozen=True)
class ShapeRun:
    """One point of the input space (`data.ShapePoint`): its feeds and its FP32 reference."""

    point: data_mod.ShapePoint
    feeds: list[data_mod.Feed]
    measures: ReferenceMeasures | None
    reference: ReferenceTensors | None


@dataclass
class Stages:
    """What the front half of the pipeline produced; shared by build, report, check, convert.

    `shapes` holds every point the policy is judged at, the primary one (`shape`
    or `opt`) first; `feeds` and `reference` are the primary's, and `measures`
    joins every point's (a range rule or an at-risk sum that leaves FP16 at any
    shape counts).
    """

    policy: Policy
    prepared: Prepared
    view: GraphView  # the one index over the prepared graph
    feeds: list[data_mod.Feed]
    measures: ReferenceMeasures | None  # None only where no command step needs the reference
    reference: ReferenceTensors | None  # with its tensors; only for run_front(reference="tensors")
    assignment: Assignment
    converted: Converted
    shapes: list[ShapeRun] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    baselines: dict[str, Converted] = field(default_factory=dict)
    cache_hits: dict[str, str] = field(default_factory=dict)  # prepared/reference: hit|miss|off

    @property
    def warnings(self) -> list[str]:
        return self.assignment.warnings + self.converted.warnings


def needs_reference(policy: Policy) -> bool:
    """Range rules read the FP32 reference; without them `convert` need not run it."""
    return any(r.match.max_abs_above is not None for r in policy.precision.all_rules())


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
) -> Stages:
    """Load, prepare, run the FP32 reference (as far as asked or needed), assign and convert.

    With a `cache`, the prepared graph and the reference come from it when their
    inputs are unchanged (`trtbuild.cache` says what the keys cover).
    """
    if reference not in REFERENCE_LEVELS:
        raise ValueError(f"reference must be one of {REFERENCE_LEVELS}, not {reference!r}")
    if reference == "none" and needs_reference(policy):
        reference = "measures"
    cache = cache if cache is not None else Cache(enabled=False)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    prepared, digest = prepared_graph(policy.model, policy.passes, cache, verbose)
    view = GraphView(prepared.model)
    timings["prepare"] = time.perf_counter() - t

    t = time.perf_counter()
    shapes = [
        _shape_run(policy, prepared, view, point, cache, digest, reference)
        for point in data_mod.shape_points(policy, prepared.model)
    ]
    for run in shapes:
        if run.measures is not None:
            check_finite(view, run.measures, str(policy.model))
    measures = join_measures([r.measures for r in shapes if r.measures is not None])
    if reference != "none":
        timings["reference"] = time.perf_counter() - t

    t = time.perf_counter()
    assignment = assign(view, policy.precision, measures.ranges if measures is not None else None)
    converted = _converted(assignment, cache, digest)
    timings["assign_convert"] = time.perf_counter() - t
    primary = shapes[0]
    stages = Stages(
        policy, prepared, view, primary.feeds, measures, primary.reference, assignment, converted
    )
    stages.shapes, stages.timings = shapes, timings
    stages.cache_hits = _hits(cache, reference)
    return stages


def _shape_run(
    policy: Policy,
    prepared: Prepared,
    view: GraphView,
    point: data_mod.ShapePoint,
    cache: Cache,
    digest: str | None,
    reference: ReferenceLevel,
) -> ShapeRun:
    feeds = data_mod.make_feeds(policy, prepared.model, point)
    if reference == "none":
        return ShapeRun(point, feeds, None, None)
    budget = policy.accuracy.budget()
    try:
        measures, ref = _reference(prepared, feeds, view, cache, digest, reference, budget)
    except Exception as exc:
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        raise _cannot_run(policy, point, exc) from None
    return ShapeRun(point, feeds, measures, ref)


def _cannot_run(policy: Policy, point: data_mod.ShapePoint, exc: Exception) -> UsageError:
    """ONNX Runtime refused to run the FP32 model on the policy's data: the user's input.

    Why exit 2 and not a bug: a shape the model cannot take (720 rows where it
    halves five times) fails inside a node, as Polygraphy's `run` would.
    """
    import re

    text = str(exc)
    node = re.search(r"Name:'([^']*)'", text)
    said = re.search(r"Status Message: (.*)", text)
    where = f" in node {node.group(1)}" if node else ""
    return UsageError(
        f"the FP32 model cannot run at {point.label}{where}: "
        f"{(said.group(1) if said else text).strip()[:300]}",
        where=str(policy.path),
        hint="choose input shapes (inputs.*.shape, min/opt/max, accuracy.shapes) or data the "
        "model takes",
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
    model: Path, passes: Passes, cache: Cache, verbose: bool = False
) -> tuple[Prepared, str | None]:
    """The prepared graph and its cache key, from the cache when model, passes and code match."""
    digest = None
    if cache.enabled:
        try:
            source_digest = model_digest(model)
        except Exception:  # unreadable or not ONNX: load_model says so, in its words
            source_digest = None
        if source_digest is not None:
            digest = cache_key("prepared", code_fingerprint(), source_digest, repr(passes))
            cached = cache.get("prepared", digest)
            if cached is not None:
                return cached, digest
    prepared = prepare(load_model(model), passes, source=str(model), verbose=verbose)
    if digest is not None:
        cache.put("prepared", digest, prepared)
    return prepared, digest


def _converted(assignment: Assignment, cache: Cache, digest: str | None) -> Converted:
    """The mixed model, from the cache when the prepared graph and every node's precision
    match: the conversion reads nothing else (rule ids only label the report)."""
    precisions = ",".join(str(d.precision) for d in assignment.decisions)
    key = cache_key("converted", digest, precisions) if digest else None
    if key is not None:
        cached = cache.get("converted", key)
        if cached is not None:
            return cached
    converted = convert(assignment)
    if key is not None:
        cache.put("converted", key, converted)
    return converted


def _reference(
    prepared: Prepared,
    feeds: list,
    view: GraphView,
    cache: Cache,
    digest: str | None,
    level: ReferenceLevel,
    budget: MemoryBudget,
) -> tuple[ReferenceMeasures, ReferenceTensors | None]:
    """The FP32 reference to `level`, from the cache when the prepared graph and feeds match.

    The measures have an entry of their own, always written; the outputs of
    every feed (`tensors`) another, written only by a command that reads them
    and only while small against the cap (`Cache.put`): `check` writes no tensors.
    """
    key = cache_key("reference", digest, feeds_digest(feeds)) if digest else None
    if key is not None:
        measures = cache.get("measures", key)
        if measures is not None and level == "measures":
            return measures, None
        outputs = cache.get("reference", key) if measures is not None else None
        if outputs is not None:
            return measures, ReferenceTensors(measures, outputs)
    ref = run_reference(prepared.model, feeds, view, budget=budget)
    if key is not None:
        cache.put("measures", key, ref.measures)
        if level == "tensors":
            cache.put("reference", key, ref.run_results)
    return ref.measures, ref if level == "tensors" else None


def baseline(stages: Stages, default: str) -> Converted:
    """The same prepared graph with no rules: all-FP16 (what the policy buys) or all-FP32.

    Remembered on `stages`: build compiles the FP16 variant and evaluation judges it.
    """
    if default not in stages.baselines:
        stages.baselines[default] = convert(
            assign(stages.view, Precision(default=default, guards=()))
        )
    return stages.baselines[default]


def report_warnings(stages: Stages) -> list[str]:
    """Every warning `check` prints and the report lists: the rules', the conversion's, the
    FP16 boundaries' and what control flow leaves unmeasured."""
    return stages.warnings + boundary_warnings(stages) + body_warnings(stages)


def body_warnings(stages: Stages) -> list[str]:
    """What is not measured inside control-flow bodies (ONNX Runtime hands out no body tensor)."""
    view = stages.view
    inside = [
        i
        for i, n in enumerate(view.nodes)
        if view.scope[i] and view.float_outputs(i) and computes(n.op_type)
    ]
    if not inside:
        return []  # data movement only (shape checks): nothing computes there
    controls = list(dict.fromkeys(view.nodes[view.parent[i]].name for i in inside))
    shown = ", ".join(controls[:3]) + (f", +{len(controls) - 3} more" if len(controls) > 3 else "")
    text = (
        f"{len(inside)} compute node(s) run inside the control flow of {shown}: each of their tensors "
        "is measured by its peak only (an overflow there is found and named; the divergence is "
        "measured at the control node's outputs)"
    )
    blind = risk.unmeasured(view, stages.converted.model)
    if blind:
        text += (
            f"; the internal sums of {len(blind)} low-precision op(s) there are not measured "
            f"({', '.join(blind[:3])}): pin them to be safe on any kernel"
        )
    return [text]


def boundary_warnings(stages: Stages) -> list[str]:
    """Casts to FP16 or BF16 whose source values leave that range on the reference data."""
    if stages.measures is None:
        return []
    found = []
    for cast in stages.converted.casts:
        if cast.to in LOW_MAX:
            peak = stages.measures.ranges.get(cast.tensor, 0.0)  # sentinels are not data
            if peak > LOW_MAX[cast.to]:
                found.append(
                    f"boundary {cast.tensor} is cast to {cast.to.upper()} but reaches {peak:.4g} on "
                    f"the reference data ({cast.to.upper()} max {LOW_MAX[cast.to]:.6g}): pin its "
                    "consumers too"
                )
    return found


@contextlib.contextmanager
def staged_output(out_dir: Path, owns: tuple[str, ...]) -> Iterator[Path]:
    """A staging directory whose files replace `out_dir`'s artifacts only on success.

    `owns` names the files the command is responsible for: those it did not
    produce this time are removed (a stale engine next to a new report would
    lie); files it does not own are left alone.
    """
    out_dir = out_dir.resolve()
    for folder in (out_dir, *out_dir.parents):
        if folder.exists() and not folder.is_dir():
            raise UsageError(
                "the output folder is a file",
                where=str(folder),
                hint="pass --out a folder, or move the file away",
            )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        yield staging
        out_dir.mkdir(parents=True, exist_ok=True)
        produced = {p.name for p in staging.iterdir()}
        for name in owns:
            if name not in produced and (out_dir / name).exists():
                (out_dir / name).unlink()
        for name in sorted(produced):
            os.replace(staging / name, out_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class BuildOutcome:
    exit_code: int
    report: Report
    out_dir: Path


def evaluate_all(
    stages: Stages,
    *,
    engines: dict[str, bytes],
    backend: str,
    verbose: bool = False,
) -> Report:
    """Judge the policy and the all-FP16 baseline (and, with `fp32_check`, all-FP32).

    `engines` maps variant ("policy", "fp16", "fp32") to a plan; where a GPU runs
    it, its outputs are judged, otherwise the emulation's. The divergence and
    the at-risk list always come from the emulation.
    """
    policy, reference = stages.policy, stages.reference
    if reference is None:
        raise ValueError('evaluate_all needs the reference tensors; run_front(reference="tensors")')

    variants = [
        ("policy", stages.converted, EMULATED),
        ("fp16", baseline(stages, "fp16"), EMULATED),
    ]
    if policy.accuracy.fp32_check:
        variants.append(("fp32", baseline(stages, "fp32"), "onnxrt-fp32-graph"))
    candidates = _candidates(variants, engines, backend, policy.accuracy.emulation)
    per_shape, firsts = [], []
    for run in stages.shapes:  # every point of the input space, the primary first
        if run.reference is None:
            raise ValueError("evaluate_all needs every shape's reference tensors")
        model, spec = stages.prepared.model, policy.accuracy
        verdicts = judge_all(run.reference, model, candidates, run.feeds, spec, verbose=verbose)
        per_shape.append(ShapeVerdict(run.point.name, run.point.shapes, verdicts[0], verdicts[1]))
        firsts = firsts or verdicts
    main, base = firsts[0], firsts[1]  # the baseline's at_risk: what FP16 would risk
    fp32 = firsts[2] if len(firsts) > 2 else None
    return Report(
        policy=str(policy.path),
        model=str(policy.model),
        samples=len(stages.feeds),
        emulation=policy.accuracy.emulation,
        divergence_threshold=policy.accuracy.divergence_threshold,
        precision=stages.assignment.summary(),
        main=main,
        fp16=base,
        fp32=fp32,
        shapes=per_shape,
        warnings=report_warnings(stages),
        backend=backend,
        version=__version__,
    )


def _candidates(
    variants: list[tuple[str, Converted, str]],
    engines: dict[str, bytes],
    backend: str,
    emulation: str,
) -> list[Candidate]:
    """Each variant emulated once, for every shape it is judged at (and its engine, if built)."""
    return [
        Candidate(
            mixed.model,
            label,
            trt_runner(engines[v], backend) if v in engines else None,
            emulate(mixed.model, emulation),
        )
        for v, mixed, label in variants
    ]


def versions(backend: str) -> dict[str, Any]:
    import onnxruntime

    from trtbuild.engine.backends import backend_version

    out = {
        "trtbuild": __version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
    }
    try:
        import polygraphy

        out["polygraphy"] = polygraphy.__version__
    except ImportError:
        pass
    if backend != "none":
        out[backend] = backend_version(backend)
    return out


def build(
    policy: Policy,
    out_dir: Path,
    backend: str | None = None,
    verbose: bool = False,
    *,
    cache: Cache | None = None,
) -> BuildOutcome:
    """`trtbuild build`: prepare, reference, assign, convert, build engines, judge, write."""
    from trtbuild.engine.backends import gpu_available, resolve_backend

    stages = run_front(policy, cache=cache, verbose=verbose)  # the user's errors (2) first,
    backend = resolve_backend(backend or policy.build.backend)  # then the machine's (3)
    validate_mixed(stages.converted.model)  # before anything is staged
    with staged_output(out_dir, BUILD_FILES) as stage:
        save_model(stages.prepared.model, stage / "prepared.onnx")
        save_model(stages.converted.model, stage / "mixed.onnx")
        engines = build_engines(stages, stage, backend)
        plans = {k: e.engine for k, e in engines.items()} if gpu_available() else {}
        t = time.perf_counter()
        report = evaluate_all(stages, engines=plans, backend=backend, verbose=verbose)
        stages.timings["accuracy"] = time.perf_counter() - t
        report.build = build_record(stages, backend, engines, report.warnings)
        report.warnings += engine_warnings(report.build)
        write_reports(stage, report)
    return BuildOutcome(EXIT_OK if report.passed else EXIT_ACCURACY, report, out_dir)


def build_engines(stages: Stages, stage: Path, backend: str) -> dict[str, Any]:
    """The policy's engine (written as engine.plan) and, with `build.variants`, all-FP16/FP32."""
    from trtbuild.engine.backends import build_engine

    policy = stages.policy
    if backend == "none":
        return {}
    result = build_engine(stage / "mixed.onnx", backend, policy.build, policy.inputs)
    write_bytes(stage / "engine.plan", result.engine)
    engines = {"policy": result}
    if policy.build.variants:
        for variant in ("fp16", "fp32"):
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{variant}.onnx"
                save_model(baseline(stages, variant).model, path)
                engines[variant] = build_engine(path, backend, policy.build, policy.inputs)
    return engines


def build_record(
    stages: Stages, backend: str, engines: dict[str, Any], warnings: list[str]
) -> dict[str, Any]:
    """`build.json`: what was built from what, with which versions, and what it costs."""
    policy = stages.policy
    layers = engines["policy"].layers if "policy" in engines else []
    return {
        "policy": str(policy.path),
        "model": str(policy.model),
        "backend": backend,
        "versions": versions(backend),
        "hashes": {"model": sha256_file(policy.model), "policy": sha256_file(policy.path)},
        "passes": stages.prepared.records_json(),
        "timings_seconds": {k: round(v, 3) for k, v in stages.timings.items()},
        "cache": stages.cache_hits,
        "casts": len(stages.converted.casts),
        "engines": {k: v.summary() for k, v in engines.items()},
        "layer_audit": audit_layers(stages, layers) if layers else None,
        "layers": layers,
        "warnings": warnings,
    }


# What TensorRT's builder says about precision is the user's business, not only build.json's.
PRECISION_WORDS = ("fp16", "fp32", "precision", "layernorm", "overflow", "subnormal")


def engine_warnings(record: dict[str, Any]) -> list[str]:
    """The policy engine builder's warnings about precision, and an audit that could not
    check a pinned node."""
    engine = (record.get("engines") or {}).get("policy") or {}  # the variants are baselines
    found = [
        f"TensorRT: {w}"
        for w in engine.get("builder_warnings", [])
        if any(word in w.lower() for word in PRECISION_WORDS)
    ]
    audit = record.get("layer_audit") or {}
    missing = audit.get("not_in_network") or []
    if missing:
        shown = ", ".join(missing[:3]) + (f", +{len(missing) - 3} more" if len(missing) > 3 else "")
        found.append(
            f"the layer audit found no layer named after {len(missing)} FP32 node(s) ({shown}); "
            "their precision in the engine is unchecked"
        )
    return list(dict.fromkeys(found))


def write_reports(stage: Path, report: Report, *, owns_build: bool = True) -> None:
    """report.json, report.md, report.html, junit.xml and both runs' RunResults.

    `report.build` feeds the renderers' Engines section; it is written as
    build.json only by the command that owns it (`build`, not `report`).
    """
    from trtbuild.accuracy import render, report_html

    write_results(report.main, stage)
    if report.build is not None and owns_build:
        write_json(stage / "build.json", report.build)
    write_json(stage / "report.json", report.to_json())
    write_text(stage / "report.md", render.markdown(report))
    write_text(stage / "report.html", report_html.html(report))
    write_text(stage / "junit.xml", render.junit(report))


def write_results(main: Verdict, stage: Path) -> None:
    """Both runs as Polygraphy RunResults JSON (`polygraphy run --load-outputs` reads them)."""
    from polygraphy.comparator import RunResults

    from trtbuild.fsutil import atomic_path

    for runner, file in (
        (ev.REFERENCE, "reference_outputs.json"),
        (main.evaluator, "evaluated_outputs.json"),
    ):
        single = RunResults()
        single.append((runner, main.run_results[runner]))
        with atomic_path(stage / file) as tmp, ev.quiet_polygraphy():
            single.save(str(tmp))


def audit_layers(stages: Stages, layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Proof from the parsed network that every FP32 node is an FP32 layer in TensorRT."""
    by_name = {layer["name"]: layer for layer in layers}
    checked, mismatched, missing = 0, [], []
    for node, decision in zip(stages.view.nodes, stages.assignment.decisions):
        if decision.precision != "fp32":
            continue
        layer = by_name.get(node.name)
        if layer is None:
            missing.append(node.name)
            continue
        checked += 1
        if any(d not in ("fp32",) for d in layer["outputs"] if d in ("fp16", "bf16", "fp32")):
            mismatched.append({"node": node.name, "outputs": layer["outputs"]})
    return {
        "fp32_nodes_checked": checked,
        "mismatched": mismatched,
        "not_in_network": missing,
        "ok": not mismatched,
    }


def report_only(
    policy: Policy,
    out_dir: Path,
    engine: Path | None = None,
    verbose: bool = False,
    *,
    cache: Cache | None = None,
) -> BuildOutcome:
    """`trtbuild report`: the accuracy report without rebuilding.

    The engine facts of an earlier `build` into the same folder (`build.json`)
    are kept in the report, so it says what was built, not `backend: none`.
    """
    from trtbuild.engine.backends import gpu_available, resolve_backend

    stages = run_front(policy, cache=cache, verbose=verbose)
    built = _earlier_build(out_dir, policy)
    backend = built.get("backend", "none") if built else "none"
    plans: dict[str, bytes] = {}
    unrun = []
    if engine is not None and gpu_available():
        # the engine's own build.json says which TensorRT made it; else the policy's backend
        own = _earlier_build(engine.resolve().parent, policy)
        backend = own["backend"] if own else resolve_backend(policy.build.backend)
        plans["policy"] = engine.read_bytes()
    elif engine is not None:
        unrun.append(
            f"engine {engine} is not run: no GPU is visible here, so the verdict is the "
            f"{EMULATED} one; report on a machine with a GPU to judge the engine itself"
        )
    with staged_output(out_dir, REPORT_FILES) as stage:
        report = evaluate_all(stages, engines=plans, backend=backend, verbose=verbose)
        report.warnings = unrun + report.warnings
        report.build = built
        write_reports(stage, report, owns_build=False)
    return BuildOutcome(EXIT_OK if report.passed else EXIT_ACCURACY, report, out_dir)


def _earlier_build(out_dir: Path, policy: Policy) -> dict[str, Any] | None:
    """build.json of an earlier build of the same policy in `out_dir`, if it is readable."""
    import json

    path = out_dir / "build.json"
    try:
        built = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(built, dict) or built.get("policy") != str(policy.path):
        return None
    _check_record(built, path)
    return built


# What the report's Engines section reads of each engine in build.json.
ENGINE_KEYS = ("backend", "version", "engine_bytes", "build_seconds")


def _check_record(built: dict[str, Any], path: Path) -> None:
    """Refuse, with exit 2, a build.json of this policy that the report could not read."""
    engines = built.get("engines")
    problems = [] if isinstance(engines, dict) else ["engines is not a mapping"]
    for variant, engine in (engines or {}).items() if isinstance(engines, dict) else ():
        missing = [k for k in ENGINE_KEYS if not isinstance(engine, dict) or k not in engine]
        problems += [f"engines.{variant}.{k} is missing" for k in missing]
    if problems:
        raise UsageError(
            f"{problems[0]}; it is not a record this trtbuild wrote",
            where=str(path),
            hint="build again (trtbuild build) or remove the file",
        )
