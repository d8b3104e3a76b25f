"""Run every policy of a night: discover them, build each (in its own process with
`--jobs`, so one crash or one Polygraphy logger cannot touch another), and turn
every outcome, failures included, into a plain `PolicyResult`."""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.accuracy.masked import overflow_node, rule_said
from trtbuild.children import run_task, stop_workers, worker_signals
from trtbuild.errors import EXIT_BUG, EXIT_USAGE, UsageError, exit_code_for, undecoded


@dataclass
class PolicyResult:
    """What one policy did tonight; plain data so it crosses process boundaries."""

    policy: str  # the policy's file stem, the key in history
    path: str
    status: str  # pass | fail | error
    exit_code: int
    message: str = ""
    evaluator: str | None = None
    emulation: str | None = None
    backend: str | None = None
    device: str | None = None  # a GPU's name where an engine was judged, else cpu-emulation
    trt_version: str | None = None  # the TensorRT (or TensorRT-RTX) that built the engines
    model_sha256: str | None = None
    policy_sha256: str | None = None
    low_share: float | None = None
    quantized_share: float | None = None  # INT8/FP8 compute (Q/DQ-fused ops), 0 if none
    fp32_nodes: int | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    shapes: list[dict[str, Any]] = field(default_factory=list)  # [{name, inputs, passed}]

    @property
    def flags(self) -> list[str]:
        """What a verdict alone does not show, from `shapes` (so the history keeps it): a
        masked overflow warned only (`accuracy.masked_overflow: warn`) and data that does not
        exercise the model (an output constant or nearly so at a point)."""
        from trtbuild.accuracy.report import point_rank

        found = []
        for s in self.shapes:
            o = s.get("masked_overflow")
            if o and s.get("passed"):
                found.append(f"masked overflow at {s['name']}: {overflow_node(o)}, warned only")
        flat: dict[str, list[str]] = {}
        for s in sorted(self.shapes, key=lambda s: point_rank(s["name"])):
            for out in s.get("flat_outputs") or []:
                flat.setdefault(out, []).append(s["name"])
        found += [
            f"data does not exercise the model: {out} nearly constant at {', '.join(points)}"
            for out, points in flat.items()
        ]
        return found


CPU_LANE = "cpu-emulation"  # the device of a lane whose outputs come from the emulation


def shard_of(policy: str, shards: int) -> int:
    """The shard (1..shards) a policy belongs to, from its name alone: adding a policy moves
    no other, and every shard of a night agrees without talking to the others.

    The name's bytes as the file system holds them are hashed (`os.fsencode`): a name with
    a byte that is not UTF-8 (legal on Linux) has a shard like any other.
    """
    return int(hashlib.sha256(os.fsencode(policy)).hexdigest(), 16) % shards + 1


def device_of(evaluator: str | None, given: str | None) -> str:
    """The lane's device: `--device` where given, the GPU that ran the engines, or the CPU."""
    if given:
        return given
    if evaluator == "tensorrt":
        from trtbuild.engine.backends import gpu_name

        return gpu_name() or "gpu"
    return CPU_LANE


def discover(policies_dir: Path) -> list[Path]:
    if not policies_dir.is_dir():
        raise UsageError(
            "policies folder not found", where=str(policies_dir), hint="pass --policies DIR"
        )
    # a FIFO, device or folder named *.yaml is found too: `run_policy` records it as an error
    found = sorted(p for p in policies_dir.iterdir() if p.suffix in (".yaml", ".yml"))
    if not found:
        raise UsageError(
            "no *.yaml policies in this folder", where=str(policies_dir), hint="pass --policies DIR"
        )
    _one_per_name(found, policies_dir)
    return found


# What a night writes into OUT beside the policies' folders (`_render`): a policy may not
# take one of these names, and `--out` of a folder holding others is refused (`cli`)
NIGHT_FILES = frozenset({"trends", "summary.md", "summary.html", "junit.xml", "nightly.json"})


def _one_per_name(found: list[Path], policies_dir: Path) -> None:
    """Exit 2 where two files give one policy name (`x.yaml` and `x.yml`): a name is the
    key of `OUT/<name>/` and of the history's row, so one would overwrite the other's
    reports and the night's record would fail on the history's unique key. Nor may a
    name be one of the night's own entries in `OUT` (`trends.yaml`: its build and every
    policy's trend plot shared `OUT/trends/`, a plot missing from the first night)."""
    seen: dict[str, Path] = {}
    for path in found:
        if path.stem in NIGHT_FILES:
            raise UsageError(
                f"{undecoded(path.name)}: policy '{undecoded(path.stem)}' would be written into "
                f"OUT/{undecoded(path.stem)}, where the night writes its own "
                f"{'trend plots' if path.stem == 'trends' else 'file'}",
                where=str(policies_dir),
                hint="rename the policy file",
            )
        other = seen.setdefault(path.stem, path)
        if other is not path:
            raise UsageError(
                f"{undecoded(other.name)} and {undecoded(path.name)} are both policy '{undecoded(path.stem)}' "
                "(a policy's name is its file's stem)",
                where=str(policies_dir),
                hint="rename one of them, or move it out of the folder",
            )


def run_policy(
    path: Path,
    out_dir: Path,
    backend: str | None,
    use_cache: bool = True,
    device: str | None = None,
) -> PolicyResult:
    """Build and report one policy; every failure becomes a result, never an exception."""
    from trtbuild import cache_codec, pipeline
    from trtbuild.artifacts import versions
    from trtbuild.cache import Cache
    from trtbuild.fsutil import sha256_file
    from trtbuild.policy import load_policy
    from trtbuild.policy.load import check_regular

    name = undecoded(path.stem)
    result = PolicyResult(
        policy=name, path=undecoded(str(path)), status="error", exit_code=EXIT_BUG
    )
    result.device = device_of(None, device)
    try:
        check_regular(path)  # before anything opens it: a FIFO would block for ever
        result.policy_sha256 = sha256_file(path)
        policy = load_policy(path)
        if policy.model.is_file():
            result.model_sha256 = sha256_file(policy.model)
        cache = Cache(
            enabled=use_cache, on_event=logging.getLogger("trtbuild").warning, codec=cache_codec
        )
        cache.check_root()
        outcome = pipeline.build(policy, out_dir / name, backend, cache=cache)
    except Exception as exc:  # the CLI's mapping: the user's faults 2 or 3, a bug 70
        result.exit_code, result.message = exit_code_for(exc)
        if result.exit_code == EXIT_BUG:  # keep the traceback in the summary
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            result.message += "\n" + "".join(tb[-3:])
        return result
    report = outcome.report
    result.status = "pass" if report.passed else "fail"
    result.exit_code = outcome.exit_code
    result.evaluator = report.main.evaluator
    result.emulation = report.main.emulation
    result.backend = report.backend
    result.device = device_of(result.evaluator, device)
    result.low_share = report.precision.low_share  # FP16 or BF16, the policy's own
    result.quantized_share = report.precision.quantized_share
    result.fp32_nodes = report.precision.fp32_nodes
    result.versions = versions(result.backend or "none")
    result.trt_version = result.versions.get(result.backend or "none")
    result.outputs = report.main.outputs_json()  # plain data: it crosses processes
    result.shapes = _shapes(report)
    if not report.passed:
        result.message = "; ".join(_below(sv, len(report.shapes)) for sv in report.failing_shapes)
    return result


def _shapes(report: Any) -> list[dict[str, Any]]:
    """Each point judged (and each skipped) as plain data: the history keeps it with the
    night, so the summary's flags come from the history alone."""
    flat = report.flat_outputs
    return [
        {
            "name": sv.name,
            "inputs": {n: list(d) for n, d in sv.inputs.items()},
            "passed": sv.main.passed,
            "data": {n: d.to_json() for n, d in sv.data.items()},
            "masked_overflow": sv.main.masked_overflow,
            "flat_outputs": [f["output"] for f in flat if f["point"] == sv.name],
        }
        for sv in report.shapes
    ] + [{**s.skipped_json(), "passed": None, "skipped": True} for s in report.skipped]


def _below(sv, n_shapes: int) -> str:
    failing = ", ".join(
        n + (" (its shape is not FP32's)" if m.shape_mismatch else "")
        for n, m in sv.main.outputs.items()
        if not m.passed
    )
    where = f" at {sv.label}" if n_shapes > 1 else ""
    if not failing and sv.main.masked_overflow:  # every output holds: the rule failed it
        return (
            f"masked overflow{where}: {overflow_node(sv.main.masked_overflow)} {rule_said('fail')}"
        )
    return f"outputs below tolerance{where}: {failing}"


def _run_one(args: tuple[Path, Path, str | None, bool, str | None]) -> PolicyResult:
    return run_policy(*args)


def run_all(
    paths: list[Path],
    out_dir: Path,
    backend: str | None,
    jobs: int,
    progress=None,
    use_cache: bool = True,
    device: str | None = None,
) -> list[PolicyResult]:
    """Every policy's result, in `paths`' order; with `jobs` > 1 each in a pool's worker.

    A worker the machine killed (the out-of-memory killer's SIGKILL) breaks the whole
    pool, and which task it held is not known: the tasks without a result then run again,
    each in a process of its own, and one whose process dies again is its `error`. Before,
    the pool's error was the night's: exit 70, nothing recorded, every result lost.
    """
    tasks = [(p, out_dir, backend, use_cache, device) for p in paths]
    if jobs <= 1:
        results = []
        for task in tasks:
            results.append(_run_one(task))
            if progress:
                progress(results[-1])
        return results
    done = _pooled(tasks, jobs, progress)
    for task in tasks:
        if task[0] not in done:
            done[task[0]] = _alone(task)
            if progress:
                progress(done[task[0]])
    return [done[p] for p in paths]


def _pooled(tasks: list[tuple], jobs: int, progress=None) -> dict[Path, PolicyResult]:
    """The results of `tasks` from a pool of `jobs` workers; none for a task the pool lost
    when a worker died (`BrokenProcessPool`: every task it had not finished)."""
    done: dict[Path, PolicyResult] = {}
    with ProcessPoolExecutor(max_workers=jobs, initializer=worker_signals) as pool:
        try:  # from the first submit (which starts the workers): a stop there stops them too
            futures = {}
            for task in tasks:
                try:
                    futures[pool.submit(run_task, _run_one, task)] = task[0]
                except BrokenProcessPool:  # a worker died already: the rest run alone
                    break
            for future in concurrent.futures.as_completed(futures):
                try:
                    done[futures[future]] = future.result()
                except BrokenProcessPool:
                    continue  # run again alone (`run_all`)
                if progress:
                    progress(done[futures[future]])
        except BaseException:  # Ctrl-C, SIGTERM: no worker outlives the night
            stop_workers(pool)
            raise
    return done


def _alone(task: tuple) -> PolicyResult:
    """One policy in a process of its own, after a pool's worker died: a death now is
    this policy's, its `error` (exit 2 where the machine killed it, 70 for a crash).

    Why a process, not a pool of one: a pool that breaks forgets its workers, and with
    them the exit code that says who ended it.
    """
    import multiprocessing

    receive, send = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.Process(target=_send_one, args=(send, task), daemon=True)
    proc.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:  # it ended without an answer
        proc.join()
        return _died(task, proc.exitcode)
    except BaseException:  # Ctrl-C, SIGTERM: it ends with the night
        proc.terminate()
        proc.join()
        raise
    finally:
        receive.close()
    proc.join()
    return result


def _send_one(send: Any, task: tuple) -> None:
    """`_alone`'s child: the policy's result through the pipe, stopped as a worker is."""
    worker_signals()
    send.send(run_task(_run_one, task))


def _died(task: tuple, code: int | None) -> PolicyResult:
    """The `error` of a policy whose process ended (exit `code`) before it handed back a
    result."""
    from trtbuild.children import KILLED_HINT, ended_by, signal_name

    path, device = task[0], task[4]
    number = ended_by(code)
    killed = number is not None
    crash = code is not None and code < 0
    why = signal_name(number if killed else -code) if killed or crash else f"exit code {code}"
    said = f"was killed ({why})" if killed else f"ended ({why})"
    hint = f"; {KILLED_HINT}"
    return PolicyResult(
        policy=undecoded(path.stem),
        path=undecoded(str(path)),
        status="error",
        exit_code=EXIT_USAGE if killed else EXIT_BUG,
        message=f"its process {said} before it handed back a result" + (hint if killed else ""),
        device=device_of(None, device),
    )
