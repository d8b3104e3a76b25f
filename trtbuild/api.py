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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild import _API  # the one list of public names
from trtbuild.errors import PATH, UsageError, check_argument, surroundings_raised
from trtbuild.policy import Policy, load_policy
from trtbuild.policy import PolicySource as PolicySource  # re-exported: the library's names
from trtbuild.policy.model import validated
from trtbuild.policy.specs import Match as Match
from trtbuild.policy.specs import Rule as Rule

if TYPE_CHECKING:
    import onnx

    from trtbuild.cache import Cache
    from trtbuild.front import Front
    from trtbuild.results import AtRisk as AtRisk  # re-exported: read by `__getattr__`
    from trtbuild.results import Backend as Backend
    from trtbuild.results import BuildResult as BuildResult
    from trtbuild.results import CheckedPoint as CheckedPoint
    from trtbuild.results import CheckResult as CheckResult
    from trtbuild.results import Divergence as Divergence
    from trtbuild.results import FlippedDecision as FlippedDecision
    from trtbuild.results import NodeDecision as NodeDecision
    from trtbuild.results import Objective as Objective
    from trtbuild.results import OutputResult as OutputResult
    from trtbuild.results import Pin as Pin
    from trtbuild.results import PointResult as PointResult
    from trtbuild.results import SkippedPoint as SkippedPoint
    from trtbuild.results import TuneResult as TuneResult
    from trtbuild.tuning.search import SearchResult, Trial

# The library's own names: `trtbuild`'s, less the error classes (trtbuild.errors' own)
__all__ = [n for n, module in _API.items() if module != "trtbuild.errors"]

log = logging.getLogger("trtbuild")


# read from `trtbuild.results` when first named: the result types and the argument types
_RESULTS = frozenset(
    {*(n for n, m in _API.items() if m == "trtbuild.results"), "Backend", "Objective"}
)


def __getattr__(name: str) -> Any:
    """The result types (`trtbuild.results`), imported when first named (PEP 562): a
    `convert` returns none of them, and their module is 6 to 10 ms of its start."""
    if name not in _RESULTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from trtbuild import results

    return getattr(results, name)


def __dir__() -> list[str]:
    """The module's names and the result types, before and after they are imported."""
    return sorted({*globals(), *_RESULTS})


def _cache(cache: object) -> None:
    """Refuse a `cache=` that is no cache, before any work."""
    from trtbuild.cache import Cache

    check_argument("cache", cache, (Cache,), "trtbuild.open_cache(...) or None")


def _policy(policy: Policy | str | Path) -> Policy:
    if isinstance(policy, Policy):
        return validated(policy)  # changed in code: checked as its file would be
    if not isinstance(policy, (str, Path)):
        raise UsageError(
            f"`policy` must be a Policy or the path of a policy file, not {type(policy).__name__}",
            hint="pass trtbuild.load_policy(path) or trtbuild.Policy.from_dict(mapping)",
        )
    return load_policy(policy)


@contextmanager
def _quiet(on: bool) -> Iterator[None]:
    """Progress lines off for this call only (a context variable, not a process flag)."""
    from trtbuild.accuracy.progress import silenced

    with silenced(on):
        yield


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

    check_argument("root", root, PATH, "a folder's path (str or Path)")
    check_argument("on_event", on_event, (Callable,), "a function of one str, or None")
    where = {"root": Path(root)} if root is not None else {}
    found = Cache(codec=cache_codec, enabled=enabled, on_event=on_event, **where)
    found.check_root()
    return found


def _front(
    policy: Policy,
    reference: str,
    cache: Cache | None,
    verbose: bool,
    draw: bool = True,
    on_prepare: Callable[[], object] | None = None,
) -> Front:
    from trtbuild.front import run_front

    if cache is not None and cache.enabled and cache.codec is None:
        raise ValueError("cache= needs a codec: pass trtbuild.api.open_cache(...)")

    return run_front(
        policy,
        reference=reference,  # type: ignore[arg-type]
        cache=cache,
        verbose=verbose,
        draw=draw,
        on_prepare=on_prepare,
    )


@surroundings_raised
def check(
    policy: Policy | str | Path,
    *,
    cache: Cache | None = None,
    verbose: bool = False,
    quiet: bool = False,
) -> CheckResult:
    """Validate `policy` against its model: every node's precision and why (`trtbuild check`).

    Args:
        policy: a `Policy` (loaded, or made in code), or the path of a policy file.
        cache: `open_cache()` to reuse the prepared graph and the reference's measures;
            None (the library's default, unlike the CLI's) computes everything.
        verbose: let the dependencies' own logs through.
        quiet: no progress lines on stderr (a long reference run shows its samples).

    Returns:
        The nodes with their precision, rule and reason; the ops at risk; the warnings;
        the points measured, each with its data.

    Raises:
        TrtbuildError: the policy, the model or the data is not usable (`exit_code` 2).
    """
    from trtbuild import evaluation
    from trtbuild.precision import validate
    from trtbuild.results import AtRisk, CheckedPoint, CheckResult, NodeDecision, SkippedPoint

    _cache(cache)
    policy = _policy(policy)
    with _quiet(quiet):
        front = _front(policy, "measures", cache, verbose)
    with validate.blamed_on_model(policy.model):  # what convert's check says of the model
        validate.full_check_once(front.converted.model, cache, front.digest or "")
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
        at_risk=[AtRisk.from_json(r) for r in evaluation.at_risk(front)],
        warnings=warnings,
        low_precision_share=summary.low_share,
        points=[
            CheckedPoint(
                r.point.name,
                {n: tuple(d) for n, d in r.point.shapes.items()},
                {n: d.to_json() for n, d in r.data.items()},
            )
            for r in front.shapes
        ],
        skipped_points=[SkippedPoint(p.name, dict(p.shapes), p.skip or "") for p in front.skipped],
        summary=summary,
        casts=len(front.converted.casts),
        front=front,
    )


@surroundings_raised
def convert(
    policy: Policy | str | Path,
    *,
    cache: Cache | None = None,
    verbose: bool = False,
    quiet: bool = False,
) -> onnx.ModelProto:
    """The mixed-precision model (`trtbuild convert`), validated before it is returned.

    Validated as `convert` does: onnx.checker's full check, and ONNX Runtime loading
    it as a user would (a failure of ONNX Runtime's own is a logged warning, since
    TensorRT still builds the model).

    Args:
        policy: a `Policy` (loaded, or made in code), or the path of a policy file.
        cache: `open_cache()` to reuse earlier work; None computes everything.
        verbose: let the dependencies' own logs through.
        quiet: no progress lines on stderr.

    Returns:
        The mixed model, ready for `onnx.save` or TensorRT's parser.

    Raises:
        TrtbuildError: the policy, the model or the data is not usable (`exit_code` 2).
    """
    front, _ = convert_front(policy, cache=cache, verbose=verbose, quiet=quiet)
    return front.converted.model


def convert_front(
    policy: Policy | str | Path,
    *,
    cache: Cache | None = None,
    verbose: bool = False,
    quiet: bool = False,
) -> tuple[Front, bytes]:
    """`convert`'s work with everything it knows: the assignment and the casts beside the
    validated mixed model (`front.converted.model`), for the CLI's `convert`, which shows
    them, and that model serialized (what the check loaded, and what the CLI writes: a
    10k-node model is serialized once, not twice). Internal (not in `trtbuild`'s
    names): `Front` is the pipeline's own value and changes with it; a user's code calls
    `convert`, and `check` for each node's precision.

    Raises:
        TrtbuildError: the policy, the model or the data is not usable (`exit_code` 2).
    """
    from trtbuild.precision import validate

    _cache(cache)
    policy = _policy(policy)
    spec = policy.build
    with validate.open_spares() as spares:
        # a graph prepared anew makes a mixed model no check has loaded: its children are
        # started before the passes, their imports run beside them
        fill = None
        if spec.ort_check_timeout != 0:
            fill = partial(validate.start_ahead, spares, spec.ort_check)
        with _quiet(quiet):
            front = _front(policy, "none", cache, verbose, draw=False, on_prepare=fill)
        # once per mixed model, and one load of each neighbourhood not checked before
        data = front.converted.model.SerializeToString()
        with validate.blamed_on_model(policy.model):
            loaded = validate.validate_mixed(
                front.converted.model,
                cache,
                spec.ort_check_timeout,
                spec.ort_check,
                front.digest,
                spares,
                data,
            )
    for w in front.warnings + loaded:
        log.warning(w)
    return front, data


def check_backend(backend: str | None) -> None:
    """Refuse a backend no build knows, before any work (`exit_code` 2)."""
    from trtbuild.policy.specs import BACKENDS

    if backend is not None and backend not in BACKENDS:
        raise UsageError(
            f"`backend` must be one of {', '.join(BACKENDS)}, not {backend!r}",
            hint="or None for the policy's build.backend",
        )


@surroundings_raised
def build(
    policy: Policy | str | Path,
    out: str | Path | None = None,
    backend: Backend | None = None,
    *,
    cache: Cache | None = None,
    verbose: bool = False,
    quiet: bool = False,
) -> BuildResult:
    """Prepare, assign, build and judge; write the artifacts into `out` (`trtbuild build`).

    A policy below tolerance is a result (`passed` False, `exit_code` 1), not an
    exception: the report is the point of a build that fails. build.json records the
    policy's `where` and `sha256` (its file's where it is what its file says).

    Args:
        policy: a `Policy` (loaded, or made in code), or the path of a policy file.
        out: the output folder (default `build/<policy name>/`); published whole.
        backend: `tensorrt`, `tensorrt-rtx`, `none` or `auto`; default the policy's.
        cache: `open_cache()` to reuse earlier work; None computes everything.
        verbose: let the dependencies' own logs through.
        quiet: no progress lines on stderr.

    Returns:
        The verdict, the share in low precision, each output's figures at every point,
        and the paths written.

    Raises:
        TrtbuildError: a bad policy, model, data or argument (`exit_code` 2), or a
            backend that is missing or fails to build (`exit_code` 3).
    """
    from trtbuild import pipeline
    from trtbuild.artifacts import BUILD_FILES
    from trtbuild.results import BuildResult, PointResult

    check_backend(backend)
    check_argument("out", out, PATH, "a folder's path (str or Path), or None")
    _cache(cache)
    policy = _policy(policy)
    out_dir = Path(out) if out is not None else Path("build") / policy.name
    with _quiet(quiet):
        outcome = pipeline.build(policy, out_dir, backend, verbose, cache=cache)
    report = outcome.report
    for w in report.warnings:
        log.warning(w)
    points = [PointResult.from_json(s.to_json()) for s in report.shapes]
    return BuildResult(
        passed=report.passed,
        low_precision_share=report.precision.low_share,
        outputs=dict(points[0].outputs) if points else {},
        points=points,
        out_dir=outcome.out_dir,
        files={n: outcome.out_dir / n for n in BUILD_FILES if (outcome.out_dir / n).is_file()},
        exit_code=outcome.exit_code,
        policy=policy,
        report=report,
    )


@surroundings_raised
def tune(
    policy: Policy | str | Path,
    *,
    budget: int = 100,
    objective: Objective = "nodes",
    seed: int = 0,
    jobs: int | None = None,
    cache: Cache | None = None,
    output: str | Path | None = None,
    progress: Callable[[Trial, int], None] | None = None,
    verbose: bool = False,
    quiet: bool = False,
) -> TuneResult:
    """The fewest FP32 pins beyond the policy's rules that meet every tolerance at every point.

    What `trtbuild tune` searches, on the policy given (made in code or loaded); nothing
    is written. Where the budget runs out first, `budget_exhausted` says so and the
    `trtbuild` logger warns.

    Args:
        policy: a `Policy` (loaded, or made in code), or the path of a policy file.
        budget: evaluations at most.
        objective: what a pin costs, `nodes` or `flops`.
        seed: tie-breaking; the same seed gives the same policy.
        jobs: worker processes (default: `cores.DEFAULT_JOBS`);
            the result does not depend on it.
        cache: `open_cache()` to reuse earlier work; None computes everything.
        output: the file the tuned policy will be saved as: its paths are written from
            there, and it is named after it (default: `<name>.tuned`, beside the policy).
        progress: called after each evaluation with the trial and the budget (the CLI
            draws its bar with it).
        verbose: let the dependencies' own logs through.
        quiet: no progress lines on stderr.

    Returns:
        The tuned `Policy` (a new value), whether it passes, its share, whether the
        budget ran out, the evaluations spent, the pins with their reasons, its YAML.

    Raises:
        TrtbuildError: a bad policy, model, data or argument (`exit_code` 2).
    """
    from trtbuild import tuning

    jobs = jobs if jobs is not None else tuning.default_jobs()
    tuning.check_args(budget, objective, jobs)
    check_argument("seed", seed, (int,), "a whole number")
    check_argument("output", output, PATH, "a file's path (str or Path), or None")
    check_argument("progress", progress, (Callable,), "a function of (trial, budget), or None")
    _cache(cache)
    policy = _policy(policy)
    tuning.check_policy(policy)
    with _quiet(quiet):
        front = _front(policy, "tensors", cache, verbose)
        for w in front.warnings:  # the policy's own rules and conversion, as check says them
            log.warning(w)
        found = tuning.tune(
            front, budget=budget, objective=objective, seed=seed, jobs=jobs, progress=progress
        )
    return _tuned(front, found, output, seed, objective)


def _tuned(
    front: Front, found: SearchResult, output: str | Path | None, seed: int, objective: str
) -> TuneResult:
    """The search's result as the library's: the tuned policy a new value, named after
    `output` (or `<name>.tuned`); the budget's warning and, where it keeps almost nothing
    low, the tolerances' to the `trtbuild` logger."""
    from trtbuild import tuning
    from trtbuild.results import Pin, TuneResult

    where = Path(output) if output is not None else None
    name = where.stem if where is not None else f"{front.policy.name}.tuned"
    text, tuned = tuning.tuned_policy(front, found, where, seed, objective, name)
    if found.exhausted:
        log.warning(tuning.budget_warning(found))
    from trtbuild.accuracy.breakdown import split_words
    from trtbuild.evaluation import flat_outputs

    for said in (
        tuning.tight_warning(found, flat=bool(flat_outputs(front))),
        tuning.stuck_warning(
            found,
            len(front.assignment.quantized),
            split_words(front.quantized),
            len(front.assignment.dequantized),
        ),
    ):
        if said is not None:
            log.warning(said)
    return TuneResult(
        policy=tuned,
        passed=found.passed,
        low_precision_share=found.low_share,
        budget_exhausted=found.exhausted,
        evaluations=len(found.trials),
        pins=[Pin(rule, group, reason) for rule, group, reason in tuning.pins(front, found)],
        yaml=text,
        search=found,
    )
