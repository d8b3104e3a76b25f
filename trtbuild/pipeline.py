"""The build pipeline, top to bottom: prepare → assign → convert → build → report.

Every stage is a function of values. Artifacts are staged in a hidden directory
next to the output directory and moved into place only when the run finished
(an accuracy failure is a finished run: its report is the point), so an
interrupted or failed build leaves the previous artifacts intact.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from trtbuild import __version__
from trtbuild.accuracy import data as data_mod
from trtbuild.accuracy import evaluate as ev
from trtbuild.accuracy.emulate import emulate
from trtbuild.errors import EXIT_ACCURACY, EXIT_OK, UsageError
from trtbuild.fsutil import sha256_file, write_bytes, write_json, write_text
from trtbuild.graph.model_io import load_model, save_model
from trtbuild.graph.prepare import Prepared, prepare
from trtbuild.policy.model import Policy, Precision
from trtbuild.precision.assign import Assignment, assign
from trtbuild.precision.convert import FP16_MAX, Converted, convert

REPORT_FILES = (
    "report.json",
    "report.md",
    "report.html",
    "junit.xml",
    "reference_outputs.json",
    "evaluated_outputs.json",
)
BUILD_FILES = ("prepared.onnx", "mixed.onnx", "engine.plan", "build.json", *REPORT_FILES)


@dataclass
class Stages:
    """What the front half of the pipeline produced; shared by build, report, check, convert."""

    policy: Policy
    prepared: Prepared
    feeds: list[data_mod.Feed]
    assignment: Assignment
    converted: Converted
    reference_fn: Callable[[], ev.ReferenceTensors] = field(repr=False)
    timings: dict[str, float] = field(default_factory=dict)
    baselines: dict[str, Converted] = field(default_factory=dict)

    @property
    def reference(self) -> ev.ReferenceTensors:
        """Every FP32 reference tensor: one marked run per feed, on first use, then cached."""
        return self.reference_fn()

    @property
    def ranges(self) -> dict[str, float]:
        return self.reference.ranges

    @property
    def warnings(self) -> list[str]:
        return self.assignment.warnings + self.converted.warnings


def run_front(policy: Policy, *, need_feeds: bool = True) -> Stages:
    """Load, prepare and assign; range rules trigger one FP32 run of the reference data."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    source = load_model(policy.model)
    prepared = prepare(source, policy.passes, source=str(policy.model))
    timings["prepare"] = time.perf_counter() - t

    feeds = data_mod.make_feeds(policy, prepared.model) if need_feeds else []
    reference = functools.cache(lambda: ev.reference_tensors(prepared.model, feeds))

    t = time.perf_counter()
    ranges = (lambda: reference().ranges) if need_feeds else None
    assignment = assign(prepared.model, policy.precision, ranges)
    converted = convert(assignment)
    timings["assign_convert"] = time.perf_counter() - t
    return Stages(policy, prepared, feeds, assignment, converted, reference, timings)


def baseline(stages: Stages, default: str) -> Converted:
    """The same prepared graph with no rules: all-FP16 (what the policy buys) or all-FP32.

    Cached on `stages`: build compiles the FP16 variant and evaluation judges it.
    """
    if default not in stages.baselines:
        stages.baselines[default] = convert(
            assign(stages.prepared.model, Precision(default=default))
        )
    return stages.baselines[default]


def boundary_warnings(stages: Stages) -> list[str]:
    """Casts to FP16 whose source values leave the FP16 range on the reference data."""
    found = []
    for cast in stages.converted.casts:
        if cast.to == "fp16":
            peak = stages.ranges.get(cast.tensor, 0.0)
            if peak > FP16_MAX:
                found.append(
                    f"boundary {cast.tensor} is cast to FP16 but reaches {peak:.4g} on the reference "
                    "data (FP16 max 65504): pin its consumers too"
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
class Outcome:
    exit_code: int
    report: dict[str, Any]
    out_dir: Path


def evaluate_all(
    stages: Stages,
    *,
    evaluator: str,
    engine: bytes | None,
    fp16_engine: bytes | None,
    backend: str,
    fp32_engine: bytes | None = None,
    verbose: bool = False,
) -> tuple[dict[str, Any], ev.Evaluation, ev.Evaluation]:
    """Policy and all-FP16 baseline, same evaluator; divergence always from the emulation.

    With `accuracy.fp32_check`, the all-FP32 graph is judged too: on a GPU that
    separates what the backend itself changes from what FP16 changes.
    """
    policy = stages.policy
    threshold = policy.accuracy.divergence_threshold
    reference = stages.reference  # one marked FP32 pass per feed serves every judgement

    def runner(model: onnx.ModelProto, plan: bytes | None, label: str):
        """The engine on a GPU, else ONNX Runtime on `model`; and the evaluator's label."""
        if evaluator == "tensorrt" and plan is not None:
            return ev.trt_runner(plan, backend, name="tensorrt"), "tensorrt"
        return ev.onnxrt_runner(model, name=label, optimize=False), label

    def judge(converted: Converted, plan: bytes | None):
        """One evaluation and its first divergence; the emulated model is built once."""
        emulated = emulate(converted.model)
        run, used = runner(emulated, plan, "emulated-fp16")
        result = ev.judge(reference, run, stages.feeds, policy.accuracy, used, verbose)
        first, curve = ev.divergence(reference, emulated, stages.feeds[0], threshold)
        return result, used, first, curve

    main, used, first, curve = judge(stages.converted, engine)
    base, base_used, base_first, base_curve = judge(baseline(stages, "fp16"), fp16_engine)
    baselines: dict[str, Any] = {
        "fp16": {
            "passed": base.passed,
            "evaluator": base_used,
            "outputs": base.outputs_json(),
            "first_divergence": base_first,
            "error_curve": base_curve,
        }
    }
    if policy.accuracy.fp32_check:
        run, fp32_used = runner(baseline(stages, "fp32").model, fp32_engine, "onnxrt-fp32-graph")
        checked = ev.judge(reference, run, stages.feeds, policy.accuracy, fp32_used, verbose)
        baselines["fp32"] = {
            "passed": checked.passed,
            "evaluator": fp32_used,
            "outputs": checked.outputs_json(),
        }

    report = {
        "passed": main.passed,
        "evaluator": used,
        "divergence_evaluator": "emulated-fp16",
        "policy": str(policy.path),
        "model": str(policy.model),
        "samples": len(stages.feeds),
        "outputs": main.outputs_json(),
        "precision": stages.assignment.summary(policy.precision.rules),
        "baselines": baselines,
        "first_divergence": first,
        "error_curve": curve,
        "divergence_threshold": threshold,
        "warnings": stages.warnings + boundary_warnings(stages),
        "trtbuild_version": __version__,
    }
    return report, main, base


def versions(backend: str) -> dict[str, Any]:
    import onnxruntime

    from trtbuild.build.backends import backend_version

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
    policy: Policy, out_dir: Path, backend: str | None = None, verbose: bool = False
) -> Outcome:
    from trtbuild.accuracy import render, report_html
    from trtbuild.build.backends import build_engine, gpu_available, resolve_backend

    backend = resolve_backend(backend or policy.build.backend)
    stages = run_front(policy)
    with staged_output(out_dir, BUILD_FILES) as stage:
        save_model(stages.prepared.model, stage / "prepared.onnx")
        save_model(stages.converted.model, stage / "mixed.onnx")

        engines: dict[str, Any] = {}
        audit = None
        if backend != "none":
            result = build_engine(stage / "mixed.onnx", backend, policy.build, policy.inputs)
            write_bytes(stage / "engine.plan", result.engine)
            engines["policy"] = result
            audit = audit_layers(stages, result.layers)
            if policy.build.variants:
                for variant in ("fp16", "fp32"):
                    with tempfile.TemporaryDirectory() as tmp:
                        path = Path(tmp) / f"{variant}.onnx"
                        save_model(baseline(stages, variant).model, path)
                        engines[variant] = build_engine(path, backend, policy.build, policy.inputs)

        evaluator = "tensorrt" if backend != "none" and gpu_available() else "emulated-fp16"
        t = time.perf_counter()
        report, main, base = evaluate_all(
            stages,
            evaluator=evaluator,
            backend=backend,
            verbose=verbose,
            engine=engines["policy"].engine if "policy" in engines else None,
            fp16_engine=engines["fp16"].engine if "fp16" in engines else None,
            fp32_engine=engines["fp32"].engine if "fp32" in engines else None,
        )
        stages.timings["accuracy"] = time.perf_counter() - t
        report["backend"] = backend
        write_results(main, stage)

        build_info = {
            "policy": str(policy.path),
            "model": str(policy.model),
            "backend": backend,
            "versions": versions(backend),
            "hashes": {"model": sha256_file(policy.model), "policy": sha256_file(policy.path)},
            "passes": stages.prepared.records_json(),
            "timings_seconds": {k: round(v, 3) for k, v in stages.timings.items()},
            "casts": len(stages.converted.casts),
            "engines": {k: v.summary() for k, v in engines.items()},
            "layer_audit": audit,
            "layers": engines["policy"].layers if "policy" in engines else [],
            "warnings": report["warnings"],
        }
        write_json(stage / "build.json", build_info)
        write_json(stage / "report.json", report)
        write_text(stage / "report.md", render.markdown(report, build_info))
        write_text(stage / "report.html", report_html.html(report, build_info, main, base))
        write_text(stage / "junit.xml", render.junit(report))
    code = EXIT_OK if report["passed"] else EXIT_ACCURACY
    return Outcome(code, report, out_dir)


def write_results(main: ev.Evaluation, stage: Path) -> None:
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
    for node, decision in zip(stages.assignment.view.nodes, stages.assignment.decisions):
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
    policy: Policy, out_dir: Path, engine: Path | None = None, verbose: bool = False
) -> Outcome:
    """`trtbuild report`: the accuracy report without rebuilding."""
    from trtbuild.accuracy import render, report_html
    from trtbuild.build.backends import gpu_available, resolve_backend

    stages = run_front(policy)
    evaluator, backend, plan = "emulated-fp16", "none", None
    if engine is not None and gpu_available():
        backend = resolve_backend(policy.build.backend)
        evaluator, plan = "tensorrt", engine.read_bytes()
    with staged_output(out_dir, REPORT_FILES) as stage:
        report, main, base = evaluate_all(
            stages,
            evaluator=evaluator,
            engine=plan,
            fp16_engine=None,
            backend=backend,
            verbose=verbose,
        )
        report["backend"] = backend
        write_results(main, stage)
        write_json(stage / "report.json", report)
        write_text(stage / "report.md", render.markdown(report, None))
        write_text(stage / "report.html", report_html.html(report, None, main, base))
        write_text(stage / "junit.xml", render.junit(report))
    return Outcome(EXIT_OK if report["passed"] else EXIT_ACCURACY, report, out_dir)
