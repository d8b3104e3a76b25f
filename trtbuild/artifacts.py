"""What a build leaves on disk: the staged output folder, build.json as a typed record, the
reports, and the layer audit that proves each FP32 node an FP32 layer.

Artifacts are staged in a hidden directory next to the output directory, which
becomes the output directory in one step only when the run finished (an accuracy
failure is a finished run: its report is the point), so an interrupted, failed or
killed build leaves the previous artifacts intact, all of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from trtbuild import __version__
from trtbuild.accuracy import sessions as ev
from trtbuild.accuracy.judge import Verdict
from trtbuild.accuracy.report import Report
from trtbuild.errors import UsageError
from trtbuild.front import Front
from trtbuild.fsutil import (
    MARKER,
    check_out_folder,
    folder_mode,
    publish_folder,
    read_small,
    sha256_file,
    staging_folder,
    unpublishable,
    write_json,
    write_text,
)
from trtbuild.policy.model import Policy
from trtbuild.record import BuildRecord
from trtbuild.words import first_few

REPORT_FILES = (
    "report.json",
    "report.md",
    "report.html",
    "junit.xml",
    "reference_outputs.json",
    "evaluated_outputs.json",
)


BUILD_FILES = ("prepared.onnx", "mixed.onnx", "engine.plan", "build.json", *REPORT_FILES)


@contextlib.contextmanager
def staged_output(out_dir: Path, owns: tuple[str, ...]) -> Iterator[Path]:
    """A staging folder that becomes `out_dir` in one step, only on success.

    Publication is whole (`fsutil.publish_folder`): the out folder holds the old set
    or the new one, never a mix, even under SIGKILL. `owns` names the files the command
    answers for: those it did not produce this time are dropped (a stale engine next
    to a new report would lie); files it does not own (a build's engine under
    `report`, a user's notes) are kept. A folder that holds files trtbuild did not
    write is refused before anything is staged.
    """
    out_dir = _output_folder(out_dir)
    check_out_folder(out_dir, known=(*BUILD_FILES, MARKER), owns=owns)
    mode = folder_mode(out_dir)
    with staging_folder(out_dir) as staging:  # removed at the end (after an exchange: the old set)
        try:
            yield staging
        except OSError as exc:  # the command's own (a full disk): no publication's fault
            moved = _in_out_folder(exc, staging, out_dir)
            if moved is None:
                raise
            raise moved from exc
        try:
            command = "build" if "build.json" in owns else "report"
            publish_folder(staging, out_dir, owns, command, mode)
        except OSError as exc:  # name the out folder's file, not the staging folder's
            moved = _in_out_folder(exc, staging, out_dir)
            refused = unpublishable(moved or exc, out_dir)
            if refused is not None:
                raise refused from exc
            if moved is None:
                raise
            raise moved from exc


def _output_folder(out_dir: Path) -> Path:
    """`out_dir` resolved, or exit 2 where it or a folder above it is a file."""
    out_dir = out_dir.resolve()
    for folder in (out_dir, *out_dir.parents):
        try:  # one stat: a folder another publication replaces right now is no file
            is_file = not stat.S_ISDIR(os.stat(folder).st_mode)
        except FileNotFoundError:
            continue
        if is_file:
            raise UsageError(
                "the output folder is a file",
                where=str(folder),
                hint="pass --out a folder, or move the file away",
            )
    return out_dir


def _in_out_folder(exc: OSError, staging: Path, out_dir: Path) -> OSError | None:
    """`exc` naming the file it would be in the out folder (the user never sees the
    staging folder's name), or None where it names no file in staging."""
    name = os.fsdecode(exc.filename) if exc.filename is not None else ""
    if not name.startswith(str(staging)):
        return None
    moved = str(out_dir) + name[len(str(staging)) :]
    return OSError(exc.errno, exc.strerror, moved)


def versions(backend: str) -> dict[str, Any]:
    from trtbuild.engine.backends import backend_version
    from trtbuild.precision.ort_child import version as onnxruntime_version

    out = {
        "trtbuild": __version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime_version(),  # read without importing it
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


def build_record(
    front: Front,
    backend: str,
    engines: dict[str, Any],
    warnings: list[str],
    timings: dict[str, float],
) -> BuildRecord:
    """The record of one build; `timings` adds the front after the front half's. Its
    warnings are `warnings` and the engine builder's and the layer audit's, the same list
    the report shows."""
    policy = front.policy
    layers = engines["policy"].layers if "policy" in engines else []
    record = BuildRecord(
        policy=policy.where,
        model=str(policy.model),
        backend=backend,
        versions=versions(backend),
        hashes={"model": sha256_file(policy.model), "policy": policy.sha256},
        passes=front.prepared.records_json(),
        timings_seconds={k: round(v, 3) for k, v in {**front.timings, **timings}.items()},
        cache=dict(front.cache_hits),
        casts=len(front.converted.casts),
        engines={k: v.summary() for k, v in engines.items()},
        layer_audit=audit_layers(front, layers) if layers else None,
        layers=layers,
        warnings=warnings,
    )
    return replace(record, warnings=warnings + engine_warnings(record))


# What TensorRT's builder says about precision is the user's business, not only build.json's.
PRECISION_WORDS = ("fp16", "fp32", "precision", "layernorm", "overflow", "subnormal")


def engine_warnings(record: BuildRecord) -> list[str]:
    """The policy engine builder's warnings about precision, and an audit that could not
    check a pinned node."""
    engine = record.engines.get("policy") or {}  # the variants are baselines
    found = [
        f"TensorRT: {w}"
        for w in engine.get("builder_warnings", [])
        if any(word in w.lower() for word in PRECISION_WORDS)
    ]
    audit = record.layer_audit or {}
    missing = audit.get("not_in_network") or []
    if missing:
        shown = first_few(missing)
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
        write_json(stage / "build.json", report.build.to_json())
    write_json(stage / "report.json", report.to_json())
    write_text(stage / "report.md", render.markdown(report))
    with report_html.plotting_in(stage):
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


def audit_layers(front: Front, layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Proof from the parsed network that every FP32 node is an FP32 layer in TensorRT.

    Only the nodes the mixed model holds: a rule's `dequantize: true` drops the Q/DQ nodes
    left without a reader, and the audit said of 34 such nodes of a BERT that no layer was
    named after them. A node that computes nothing (`optypes.computes`: data movement, a
    Cast) is checked where a layer bears its name but never missed: TensorRT's parser drops
    such a node where it does nothing (a Swin's Pad by 0 became `ONNXTRT_identity`), and the
    audit warned that its precision was unchecked."""
    from trtbuild.graph.optypes import computes
    from trtbuild.graph.subgraphs import all_nodes

    by_name = {layer["name"]: layer for layer in layers}
    held = {n.name for n in all_nodes(front.converted.model)}
    checked, mismatched, missing = 0, [], []
    for node, decision in zip(front.view.nodes, front.assignment.decisions):
        if decision.precision != "fp32" or node.name not in held:
            continue
        layer = by_name.get(node.name)
        if layer is None:
            if computes(node.op_type):
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


def earlier_build(out_dir: Path, policy: Policy) -> BuildRecord | None:
    """build.json of an earlier build of the same policy in `out_dir`, if there is one; exit 2
    for a record of that policy this trtbuild cannot read.

    The same policy: the same file (`where`), or for a policy without one, the same name
    and content (`<policy NAME>` and its sha256)."""
    built = _build_json(out_dir)
    if built is None or not _of(built, policy):
        return None
    return BuildRecord.from_json(built, out_dir / "build.json")


def own_build(out_dir: Path, policy: Policy) -> BuildRecord | None:
    """`earlier_build`, for a folder `report` publishes into: exit 2 where it holds another
    policy's build, beside whose build.json, engine and mixed model the report would sit
    (outputs.md: a folder never holds the files of two builds)."""
    built = _build_json(out_dir)
    if built is None:
        return None
    if not _of(built, policy):
        other = built.get("policy")
        raise UsageError(
            f"holds the build of another policy ({other if isinstance(other, str) else '?'}); "
            "a report there would sit beside that build's engine and mixed model",
            where=str(out_dir),
            hint="pass --out the folder of this policy's build, or a new folder",
        )
    return BuildRecord.from_json(built, out_dir / "build.json")


def _build_json(out_dir: Path) -> dict[str, Any] | None:
    try:
        built = json.loads(read_small(out_dir / "build.json"))  # a FIFO or a huge file: none
    except (OSError, ValueError, RecursionError):
        return None
    return built if isinstance(built, dict) else None


def _of(built: dict[str, Any], policy: Policy) -> bool:
    """Whether a build.json records a build of `policy` (`earlier_build`'s sameness)."""
    if built.get("policy") != policy.where:
        return False
    hashes = built.get("hashes")
    return policy.path is not None or (
        isinstance(hashes, dict) and hashes.get("policy") == policy.sha256
    )
