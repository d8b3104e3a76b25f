"""The build pipeline, top to bottom: the front half (prepare → reference → assign →
convert, `front`), the engines, the judgement (`evaluation`), the artifacts (`artifacts`).

Each stage is a function of values: `run_front` returns a frozen `Front`, the
judge a `Report`, and nothing is changed after it is built. Artifacts are staged
and moved into place only when the run finished (`artifacts.staged_output`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trtbuild.accuracy.report import Report
from trtbuild.accuracy.sessions import EMULATED
from trtbuild.artifacts import (
    BUILD_FILES,
    REPORT_FILES,
    build_record,
    earlier_build,
    own_build,
    staged_output,
    write_reports,
)
from trtbuild.cache import Cache
from trtbuild.errors import EXIT_ACCURACY, EXIT_OK, fields_located
from trtbuild.evaluation import evaluate_all
from trtbuild.front import Front, baselines, run_front
from trtbuild.fsutil import write_bytes
from trtbuild.graph.model_io import save_model
from trtbuild.policy.model import Policy
from trtbuild.precision.convert import Converted
from trtbuild.precision.validate import MixedCheck, blamed_on_model, start_mixed_check


@dataclass
class BuildOutcome:
    exit_code: int
    report: Report
    out_dir: Path


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

    front = run_front(policy, cache=cache, verbose=verbose)  # the user's errors (2) first,
    backend = resolve_backend(backend or policy.build.backend)  # then the machine's (3)
    # ORT's load runs beside the build
    build_spec = policy.build
    data = front.converted.model.SerializeToString()  # once: the check's and mixed.onnx's
    with blamed_on_model(policy.model):
        check = start_mixed_check(
            front.converted.model,
            cache,
            build_spec.ort_check_timeout,
            build_spec.ort_check,
            front.digest,
            data=data,
        )
    with _joined(check), staged_output(out_dir, BUILD_FILES) as stage:
        save_model(front.prepared.model, stage / "prepared.onnx")
        save_model(front.converted.model, stage / "mixed.onnx", data)
        del data  # not held while the engines build
        base_models = baselines(front, engines=True)
        engines, unbuilt = build_engines(front, stage, backend, base_models)
        plans = {k: e.engine for k, e in engines.items()} if gpu_available() else {}
        t = time.perf_counter()
        report = evaluate_all(
            front, engines=plans, backend=backend, verbose=verbose, base_models=base_models
        )
        timings = {"accuracy": time.perf_counter() - t}
        loaded = check.result()  # joined before anything is published
        said = unbuilt + report.warnings + loaded
        record = build_record(front, backend, engines, said, timings)
        report = replace(report, build=record, warnings=list(record.warnings))  # the same list
        write_reports(stage, report)
    return BuildOutcome(EXIT_OK if report.passed else EXIT_ACCURACY, report, out_dir)


@contextmanager
def _joined(check: MixedCheck) -> Iterator[None]:
    """The mixed model's check stops with the build, whichever way the build ends."""
    try:
        yield
    finally:
        check.cancel()


def build_engines(
    front: Front, stage: Path, backend: str, base_models: dict[str, Converted]
) -> tuple[dict[str, Any], list[str]]:
    """The policy's engine (written as engine.plan) and, with `build.variants`, all-FP16/FP32;
    with a warning for each variant TensorRT refused (the policy's engine is what `build`
    makes: a baseline without its engine is judged in the emulation). Each shape input's
    values in their profile are those fed at the points judged (`accuracy.shape_values`)."""
    from trtbuild.accuracy.shape_values import engine_values
    from trtbuild.engine.child import build_engines

    policy = front.policy
    if backend == "none":
        return {}, []
    values = engine_values(policy, front.view, front.shapes, front.analysis.shape_inputs())
    variants = ("fp16", "fp32") if policy.build.variants else ()
    # in the staging folder, not the system's temporary one (a read-only root's container
    # has none: exit 70), removed before it is published; one child builds them all
    with tempfile.TemporaryDirectory(prefix=".variants-", dir=stage) as tmp:
        paths = [stage / "mixed.onnx"]
        for variant in variants:
            paths.append(Path(tmp) / f"{variant}.onnx")
            save_model(base_models[variant].model, paths[-1])
        with fields_located(policy.where_of):  # the engine names a field, not the file
            built = build_engines(
                paths, backend, policy.build, policy.inputs, len(variants), shape_values=values
            )
    found = dict(zip(("policy", *variants), built, strict=True))
    engines = {k: e for k, e in found.items() if not isinstance(e, Exception)}
    unbuilt = [
        f"the all-{k.upper()} variant's engine did not build "
        f"({'; '.join(x for x in (e.message, e.hint) if x)}): its baseline is "
        f"judged without it; `build.variants: false` builds the policy's engine alone"
        for k, e in found.items()
        if isinstance(e, Exception)
    ]
    write_bytes(stage / "engine.plan", engines["policy"].engine)
    return engines, unbuilt


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

    built = own_build(out_dir, policy)  # before the work: the folder may be another build's
    front = run_front(policy, cache=cache, verbose=verbose)
    backend = built.backend if built else "none"
    plans: dict[str, bytes] = {}
    unrun = []
    if engine is not None and gpu_available():
        # the engine's own build.json says which TensorRT made it; else the policy's backend
        own = earlier_build(engine.resolve().parent, policy)
        backend = own.backend if own else resolve_backend(policy.build.backend)
        plans["policy"] = engine.read_bytes()
    elif engine is not None:
        unrun.append(
            f"engine {engine} is not run: no GPU is visible here, so the verdict is the "
            f"{EMULATED} one; report on a machine with a GPU to judge the engine itself"
        )
    with staged_output(out_dir, REPORT_FILES) as stage:
        report = evaluate_all(front, engines=plans, backend=backend, verbose=verbose)
        report = replace(report, warnings=unrun + report.warnings, build=built)
        write_reports(stage, report, owns_build=False)
    return BuildOutcome(EXIT_OK if report.passed else EXIT_ACCURACY, report, out_dir)
