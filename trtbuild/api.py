"""trtbuild as a library: the commands as functions that take values and return values.

Why: people who deploy models drive their exports from Python (a training repo's
export script, a notebook, a model-repository builder), as ModelOpt's AutoCast is
`convert_to_mixed_precision(...)` and Polygraphy is a library first. Each function
here is what its command does, less the printing: results are typed objects,
failures are exceptions under `TrtbuildError` carrying the CLI's exit code, nothing
is printed on stdout and nothing calls `sys.exit`. Warnings go to the `trtbuild`
logger (the CLI prints them as `trtbuild: warning:` lines).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.policy import Policy, load_policy

if TYPE_CHECKING:
    import onnx

    from trtbuild.accuracy.report import Report
    from trtbuild.cache import Cache
    from trtbuild.front import Front
    from trtbuild.precision.assign import PrecisionSummary

__all__ = [
    "BuildResult",
    "CheckResult",
    "NodeDecision",
    "OutputResult",
    "TuneResult",
    "build",
    "check",
    "convert",
    "convert_front",
    "load_policy",
    "open_cache",
    "tune",
]

log = logging.getLogger("trtbuild")


@dataclass(frozen=True)
class NodeDecision:
    """One node's precision and why: the rule that chose it and the reason in words."""

    name: str
    op: str
    precision: str  # fp16 | bf16 | fp32 | "-" (no float output: keeps its inputs' types)
    rule: str
    reason: str


@dataclass(frozen=True)
class CheckResult:
    """What `check` found: every node's precision, the ops at risk, the warnings, the points."""

    nodes: list[NodeDecision]
    at_risk: list[dict[str, Any]]
    warnings: list[str]
    low_precision_share: float  # compute nodes in FP16 (or BF16 for a BF16 policy)
    points: list[dict[str, Any]]  # each judged point: name, inputs, data per input
    skipped_points: list[dict[str, Any]]
    summary: PrecisionSummary  # nodes per precision, rule hits: the table's last line
    casts: int
    front: Front = field(repr=False)  # what it was found on, for renderers (`check`'s lines)


@dataclass(frozen=True)
class OutputResult:
    """One output's verdict at the primary point, with the metrics it was judged by."""

    passed: bool
    metrics: dict[str, Any]  # report.json's `outputs.NAME`: max_abs, cosine, checks, ...


@dataclass(frozen=True)
class BuildResult:
    """What `build` made and found; `report` is the whole report (report.json's model)."""

    passed: bool
    low_precision_share: float
    outputs: dict[str, OutputResult]
    shapes: list[dict[str, Any]]  # report.json's `shapes`: every point's verdict and data
    out_dir: Path
    files: dict[str, Path]  # artifact name -> its path in out_dir
    exit_code: int  # the CLI's: 0 passed, 1 below tolerance
    report: Report = field(repr=False)


@dataclass(frozen=True)
class TuneResult:
    """The tuned policy (its rules plus the pins tune added), and how the search went."""

    policy: Policy
    passed: bool
    evaluations: int
    yaml: str  # the tuned policy as `trtbuild tune -o` writes it, each pin with its reason
    # the search itself (`tuning.TuneResult`): each trial, the groups pinned and why,
    # whether the budget ran out; what `trtbuild tune` prints and logs
    search: Any = field(default=None, repr=False, compare=False)


def _policy(policy: Policy | str | Path) -> Policy:
    return policy if isinstance(policy, Policy) else load_policy(policy)


def open_cache(
    root: str | Path | None = None,
    *,
    enabled: bool = True,
    on_event: Callable[[str], None] | None = None,
) -> Cache:
    """The content-addressed cache the CLI uses (`TRTBUILD_CACHE_DIR` by default), ready to
    store values: its codecs given, its folder checked (an untrusted one turns it off).

    Pass it as `cache=` to reuse prepared graphs and references across calls; each
    warning goes to `on_event` as it happens and stays in its `events`.
    """
    from trtbuild import cache_codec
    from trtbuild.cache import Cache

    where = {"root": Path(root)} if root is not None else {}
    found = Cache(codec=cache_codec, enabled=enabled, on_event=on_event, **where)
    found.check_root()
    return found


def _front(policy: Policy, reference: str, cache: Cache | None, verbose: bool) -> Front:
    from trtbuild.front import run_front

    if cache is not None and cache.enabled and cache.codec is None:
        raise ValueError("cache= needs a codec: pass trtbuild.api.open_cache(...)")

    return run_front(policy, reference=reference, cache=cache, verbose=verbose)  # type: ignore[arg-type]


def check(
    policy: Policy | str | Path, *, cache: Cache | None = None, verbose: bool = False
) -> CheckResult:
    """Validate `policy` against its model: every node's precision and why (`trtbuild check`).

    Args:
        policy: a loaded `Policy`, or the path of a policy file.
        cache: `open_cache()` to reuse the prepared graph and the reference's measures;
            None computes everything.
        verbose: let the dependencies' own logs through.

    Returns:
        The nodes with their precision, rule and reason; the ops at risk; the warnings;
        the points measured, each with its data.

    Raises:
        TrtbuildError: the policy, the model or the data is not usable (`exit_code` 2).
    """
    from trtbuild import evaluation

    front = _front(_policy(policy), "measures", cache, verbose)
    nodes = [
        NodeDecision(n.name, n.op_type, d.precision or "-", d.rule, d.reason)
        for n, d in zip(front.assignment.view.nodes, front.assignment.decisions)
    ]
    warnings = evaluation.report_warnings(front)
    for w in warnings:
        log.warning(w)
    summary = front.assignment.summary()  # one walk over the nodes
    return CheckResult(
        nodes=nodes,
        at_risk=evaluation.at_risk(front),
        warnings=warnings,
        low_precision_share=summary.low_share,
        points=[
            {"name": r.point.name, "inputs": dict(r.point.shapes)}
            | {"data": {n: d.to_json() for n, d in r.data.items()}}
            for r in front.shapes
        ],
        skipped_points=[p.skipped_json() for p in front.skipped],
        summary=summary,
        casts=len(front.converted.casts),
        front=front,
    )


def convert(
    policy: Policy | str | Path, *, cache: Cache | None = None, verbose: bool = False
) -> onnx.ModelProto:
    """The mixed-precision model (`trtbuild convert`), validated before it is returned.

    Validated as `convert` does: onnx.checker's full check, and ONNX Runtime loading
    it as a user would (a failure of ONNX Runtime's own is a logged warning, since
    TensorRT still builds the model).

    Args:
        policy: a loaded `Policy`, or the path of a policy file.
        cache: `open_cache()` to reuse earlier work; None computes everything.
        verbose: let the dependencies' own logs through.

    Returns:
        The mixed model, ready for `onnx.save` or TensorRT's parser.

    Raises:
        TrtbuildError: the policy, the model or the data is not usable (`exit_code` 2).
    """
    return convert_front(policy, cache=cache, verbose=verbose).converted.model


def convert_front(
    policy: Policy | str | Path, *, cache: Cache | None = None, verbose: bool = False
) -> Front:
    """`convert`'s work with everything it knows: the assignment and the casts beside the
    validated mixed model (`front.converted.model`), for a caller that shows them.

    Raises:
        TrtbuildError: the policy, the model or the data is not usable (`exit_code` 2).
    """
    from trtbuild.precision.validate import validate_mixed

    front = _front(_policy(policy), "none", cache, verbose)
    timeout = front.policy.build.ort_check_timeout
    loaded = validate_mixed(front.converted.model, cache, timeout)  # once per mixed model
    for w in front.warnings + loaded:
        log.warning(w)
    return front


def build(
    policy: Policy | str | Path,
    out: str | Path | None = None,
    backend: str | None = None,
    *,
    cache: Cache | None = None,
    verbose: bool = False,
) -> BuildResult:
    """Prepare, assign, build and judge; write the artifacts into `out` (`trtbuild build`).

    A policy below tolerance is a result (`passed` False, `exit_code` 1), not an
    exception: the report is the point of a build that fails.

    Args:
        policy: a loaded `Policy`, or the path of a policy file.
        out: the output folder (default `build/<policy stem>/`); published whole.
        backend: `tensorrt`, `tensorrt-rtx`, `none` or `auto`; default the policy's.
        cache: `open_cache()` to reuse earlier work; None computes everything.
        verbose: let the dependencies' own logs through.

    Returns:
        The verdict, the share in low precision, each output's metrics, every point's
        verdict, and the paths written.

    Raises:
        TrtbuildError: a bad policy, model or data (`exit_code` 2), or a backend that is
            missing or fails to build (`exit_code` 3).
    """
    from trtbuild import pipeline
    from trtbuild.artifacts import BUILD_FILES

    policy = _policy(policy)
    out_dir = Path(out) if out is not None else Path("build") / policy.stem
    outcome = pipeline.build(policy, out_dir, backend, verbose, cache=cache)
    report = outcome.report
    for w in report.warnings:
        log.warning(w)
    main = report.main
    return BuildResult(
        passed=report.passed,
        low_precision_share=report.precision.low_share,
        outputs={n: OutputResult(m.passed, m.to_json()) for n, m in main.outputs.items()},
        shapes=[s.to_json() for s in report.shapes],
        out_dir=outcome.out_dir,
        files={n: outcome.out_dir / n for n in BUILD_FILES if (outcome.out_dir / n).is_file()},
        exit_code=outcome.exit_code,
        report=report,
    )


def tune(
    policy: Policy | str | Path,
    *,
    budget: int = 100,
    objective: str = "nodes",
    seed: int = 0,
    jobs: int | None = None,
    cache: Cache | None = None,
    output: str | Path | None = None,
    progress: Callable[[Any, int], None] | None = None,
    verbose: bool = False,
) -> TuneResult:
    """The fewest FP32 pins beyond the policy's rules that meet every tolerance at every point.

    What `trtbuild tune` searches; nothing is written.

    Args:
        policy: a loaded `Policy`, or the path of a policy file.
        budget: evaluations at most.
        objective: what a pin costs, `nodes` or `flops`.
        seed: tie-breaking; the same seed gives the same policy.
        jobs: worker processes (default min(4, usable cores)); the result does not
            depend on it.
        cache: `open_cache()` to reuse earlier work; None computes everything.
        output: where the tuned policy would be written, so its paths point from there
            (default: beside the policy).
        progress: called after each evaluation with the trial and the budget (the CLI
            draws its bar with it).
        verbose: let the dependencies' own logs through.

    Returns:
        The tuned `Policy`, whether it passes, the evaluations spent and its YAML.

    Raises:
        TrtbuildError: a bad policy, model or data, or bad arguments (`exit_code` 2).
    """
    from trtbuild import tuning
    from trtbuild.policy import parse_policy

    jobs = jobs if jobs is not None else tuning.default_jobs()
    tuning.check_args(budget, objective, jobs)
    policy = _policy(policy)
    tuning.check_policy(policy)
    front = _front(policy, "tensors", cache, verbose)
    result = tuning.tune(
        front, budget=budget, objective=objective, seed=seed, jobs=jobs, progress=progress
    )
    where = Path(output) if output is not None else policy.path
    text = tuning.tuned_yaml(front, result, where, seed, objective)
    return TuneResult(
        policy=parse_policy(text, where.resolve()),
        passed=result.passed,
        evaluations=len(result.trials),
        yaml=text,
        search=result,
    )
