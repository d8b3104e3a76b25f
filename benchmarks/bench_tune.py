#!/usr/bin/env python3
"""`trtbuild tune` against onnxconverter-common and ModelOpt AutoCast, judged the same way.

Why one judge: each tool checks its own result in its own way (onnxconverter-
common with ONNX Runtime's FP16 on the CPU, which hides overflow; AutoCast not
at all), so a tool's own verdict cannot be compared. Here every tool starts
from the same prepared FP32 graph and the same reference data, and every
result is judged by trtbuild's evaluator (FP16 storage emulated on the CPU,
Polygraphy's comparator with the policy's tolerances). FP16 share is counted the
same way for all: nodes of the prepared graph (Casts aside) whose float output
is FP16.

Peers:
- onnxconverter-common `auto_convert_mixed_precision` (bisects node blocks
  with ONNX Runtime), given a validate_fn that applies the policy's tolerances;
- ModelOpt AutoCast `convert_to_mixed_precision` with its defaults, where
  nvidia-modelopt installs (it needs torch and onnx 1.21, so it runs from its
  own virtualenv: `--modelopt-python PATH`).

AutoCast takes no profile: a model with dynamic input dims is given to it fixed at the
policy's largest point (it feeds a dynamic dim as 1), and its result is judged with the
dims dynamic again, at every point.

Times: `trtbuild tune` and AutoCast run as whole processes, cold (start, imports,
preparing the graph, the FP32 reference, the search); onnxconverter-common has no
command line and is timed in this process, from the prepared graph.

Evaluations: `tune`'s trials (its log's lines), onnxconverter-common's calls of its
validate_fn; AutoCast judges nothing. Where a policy has several points (modnet: 256²,
512², 1024²), every tool's result is judged at every point.

Usage: python benchmarks/bench_tune.py [--models nafnet,gfpgan,...] [--modelopt-python PY]
       [--emulation storage|strict] [--objective flops|nodes] [--jobs N]
Needs: pip install -e ".[bench]"; the models of `make models`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtbuild import cores, front, tuning  # noqa: E402
from trtbuild.accuracy import sessions as ev  # noqa: E402
from trtbuild.accuracy.judge import judge  # noqa: E402
from trtbuild.policy import load_policy  # noqa: E402
from trtbuild.precision.assign import assign  # noqa: E402
from trtbuild.precision.convert import convert  # noqa: E402
from trtbuild.tuning.pool import point_size  # noqa: E402

MODELS = ("nafnet", "gfpgan", "transformer", "bert", "ppocrv4_rec", "ppocrv4_det", "open_nsfw")
# Benchmark policies of their own (benchmarks/policies/): the detector on a real photo of
# handwriting (`python scripts/fetch_models.py photo_text`), judged by its mean error; a
# streaming GRU speech enhancer (`make models`) with its caches, judged by SNR; a
# MODNet-style matting network (benchmarks/modnet.py) on real photos at 256², 512² and
# 1024², judged by its matte's largest error.
EXTRA = ("ppocrv4_det_photo", "gru_enhancer", "modnet")

AUTOCAST = """
import sys, onnx
from modelopt.onnx.autocast import convert_to_mixed_precision
model = convert_to_mixed_precision(onnx_path=sys.argv[1], low_precision_type="fp16", keep_io_types=True)
onnx.save(model, sys.argv[2])
"""


def empty_policy(name: str, tmp: Path, emulation: str) -> Path:
    """The example policy (or a benchmark's own) with no rules, under `emulation`: every tool
    starts from nothing."""
    source = ROOT / "policies" / f"{name}.yaml"
    if not source.exists():
        source = ROOT / "benchmarks" / "policies" / f"{name}.yaml"
    text = source.read_text()
    text = text.replace("../../models/", "../models/").replace("../models/", f"{ROOT / 'models'}/")
    start, end = text.index("  rules:"), text.index("build:")
    text = text[:start] + "  rules: []\n" + text[end:]
    text = text.replace("\naccuracy:\n", f"\naccuracy:\n  emulation: {emulation}\n", 1)
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return path


def fp16_share(mixed: onnx.ModelProto) -> tuple[float, float]:
    """(FP16 share of FLOPs, FP16 share of compute nodes) in the tool's own graph.

    FLOPs first: tools fuse and rename differently (AutoCast turns a decomposed
    LayerNorm into one node), so node counts differ between graphs, while the
    FLOPs a graph spends in FP16 are what FP16 buys.
    """
    from trtbuild.graph.optypes import computes
    from trtbuild.graph.view import GraphView

    view = GraphView(onnx.shape_inference.infer_shapes(mixed))
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    flops = {True: 0.0, False: 0.0}
    nodes = {True: 0, False: 0}
    for i, node in enumerate(view.nodes):
        if not computes(node.op_type):  # the same count as the report's fp16_share
            continue
        kinds = [view.dtype.get(o) for o in node.output if view.dtype.get(o) in floats]
        if not kinds:
            continue
        half = kinds[0] == onnx.TensorProto.FLOAT16
        flops[half] += tuning.node_flops(view, i)
        nodes[half] += 1
    return (
        flops[True] / max(flops[True] + flops[False], 1.0),
        nodes[True] / max(nodes[True] + nodes[False], 1),
    )


def verdict(stages, mixed: onnx.ModelProto) -> tuple[bool, float]:
    """trtbuild's judge on a peer's graph at every point of the policy: passes, and the
    worst max error over output range."""
    passed, worst = True, 0.0
    for run in stages.shapes:
        result = judge(
            run.reference, stages.prepared.model, mixed, run.feeds, stages.policy.accuracy
        )
        passed = passed and result.passed
        worst = max(worst, *(m.max_abs_of_range for m in result.outputs.values()))
    return passed, worst


def static_at_largest(model: onnx.ModelProto, stages) -> onnx.ModelProto:
    """`model` with every input's dims fixed at the policy's largest point, for AutoCast.

    Why: AutoCast runs the model on random inputs of its own, and feeds a dynamic
    dimension as 1 (a 1x1 image does not pass modnet's concats); a profile it
    cannot take, so it gets the point where sums and errors are largest."""
    dims = [d for vi in model.graph.input for d in vi.type.tensor_type.shape.dim]
    if all(d.HasField("dim_value") for d in dims):
        return model  # static already: as it is
    largest = max(stages.shapes, key=lambda r: point_size(r.point.shapes)).point.shapes
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        if vi.name in largest:
            for dim, value in zip(vi.type.tensor_type.shape.dim, largest[vi.name]):
                dim.Clear()
                dim.dim_value = value
    del fixed.graph.value_info[:]
    return fixed


def shapes_of(mixed: onnx.ModelProto, prepared: onnx.ModelProto) -> onnx.ModelProto:
    """AutoCast's graph with the prepared graph's input and output shapes back (dynamic where
    they were), so that it is judged at every point of the policy."""
    dims = [d for vi in prepared.graph.input for d in vi.type.tensor_type.shape.dim]
    if all(d.HasField("dim_value") for d in dims):
        return mixed  # a static model was given as it is
    for vi in (*mixed.graph.input, *mixed.graph.output):
        for own in (*prepared.graph.input, *prepared.graph.output):
            if own.name == vi.name:
                vi.type.tensor_type.shape.CopyFrom(own.type.tensor_type.shape)
    del mixed.graph.value_info[:]
    return mixed


def ensure_model(name: str) -> None:
    """Generate a benchmark's own model where it is missing (`modnet`: benchmarks/modnet.py)."""
    path = ROOT / "models" / "modnet_bench.onnx"
    if name == "modnet" and not path.exists():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import modnet

        onnx.save(modnet.modnet(), path)


def policy_check(spec, names):
    """onnxconverter-common's validate_fn: the policy's tolerances, Polygraphy's median/max semantics."""

    def ok(ref_list, out_list) -> bool:
        for name, r, o in zip(names, ref_list, out_list):
            tol = spec.tolerance(name)
            r, o = np.asarray(r, np.float64), np.asarray(o, np.float64)
            if not np.all(np.isfinite(o)):
                return False
            d = np.abs(o - r)
            rel = d / np.maximum(np.abs(r), 1e-30)
            stat = {"max": np.max, "mean": np.mean, "median": np.median}.get(
                tol.check_error_stat, np.max
            )
            if stat(d) > tol.atol and stat(rel) > tol.rtol:
                return False
        return True

    return ok


def run_model(
    name: str, tmp: Path, modelopt_python: str | None, objective: str, emulation: str, jobs: int
) -> list[tuple]:
    ensure_model(name)
    source = empty_policy(name, tmp, emulation)
    policy = load_policy(source)
    stages = front.run_front(policy)  # no cache: computed here, as tune computes it
    prepared = stages.prepared.model
    rows = []

    # A whole `trtbuild tune` process, cold (--no-cache: passes and the FP32 reference
    # included), as AutoCast's row below is a whole process of its own.
    tuned = tmp / f"{name}.tuned.yaml"
    cmd = [sys.executable, "-m", "trtbuild", "tune", "--policy", str(source), "-o", str(tuned)]
    cmd += ["--objective", objective, "--jobs", str(jobs), "--no-cache"]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t
    if done.returncode not in (0, 1):  # 1: the budget ran out; the pins settled are judged
        sys.exit(f"trtbuild tune failed on {name}:\n{done.stderr[-2000:]}")
    mixed = convert(assign(stages.view, load_policy(tuned).precision)).model
    trials = len(tuned.with_suffix(".log.jsonl").read_text().splitlines())
    row = (name, "trtbuild tune", *fp16_share(mixed), *verdict(stages, mixed), seconds)
    rows.append((*row, "", str(trials)))

    from onnxconverter_common.auto_mixed_precision import auto_convert_mixed_precision

    outputs = [o.name for o in prepared.graph.output]
    calls = []  # its validate_fn's calls: one ONNX Runtime run of a candidate each
    check = policy_check(policy.accuracy, outputs)
    t = time.perf_counter()
    try:
        # its per-weight "will be truncated" warnings would bury the table
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            occ = auto_convert_mixed_precision(
                prepared,
                stages.feeds[0],
                validate_fn=lambda r, o: calls.append(1) or check(r, o),
                keep_io_types=True,
            )
        seconds = time.perf_counter() - t
        rows.append(
            (
                name,
                "onnxconverter-common auto_mixed",
                *fp16_share(occ),
                *verdict(stages, occ),
                seconds,
                "",
                str(len(calls)),
            )
        )
    except Exception as exc:  # a peer failing on a model is a result too
        rows.append(
            (
                name,
                "onnxconverter-common auto_mixed",
                None,
                None,
                None,
                None,
                time.perf_counter() - t,
                str(exc)[:80],
            )
        )

    if modelopt_python:
        src, dst = tmp / f"{name}.prepared.onnx", tmp / f"{name}.autocast.onnx"
        onnx.save(static_at_largest(prepared, stages), src)
        t = time.perf_counter()
        done = subprocess.run(
            [modelopt_python, "-c", AUTOCAST, str(src), str(dst)], capture_output=True, text=True
        )
        seconds = time.perf_counter() - t
        if done.returncode == 0:
            ac = shapes_of(onnx.load(dst), prepared)
            rows.append(
                (
                    name,
                    "ModelOpt AutoCast (defaults)",
                    *fp16_share(ac),
                    *verdict(stages, ac),
                    seconds,
                )
            )
        else:
            err = (done.stderr.strip().splitlines() or ["failed"])[-1][:80]
            rows.append(
                (name, "ModelOpt AutoCast (defaults)", None, None, None, None, seconds, err)
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS + EXTRA))
    parser.add_argument("--objective", default="flops", choices=["nodes", "flops"])
    parser.add_argument(
        "--modelopt-python", help="python of a virtualenv with nvidia-modelopt[onnx]"
    )
    parser.add_argument(
        "--emulation",
        default="storage",
        choices=["storage", "strict"],
        help="what the judge assumes inside an FP16 kernel (the policies' accuracy.emulation)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=tuning.default_jobs(),
        help=f"trtbuild tune --jobs (default: tune's own, {cores.DEFAULT_JOBS})",
    )
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="trtbuild-bench-tune-"))
    rows = []
    with ev.quiet_polygraphy():
        for name in args.models.split(","):
            rows += run_model(
                name, tmp, args.modelopt_python, args.objective, args.emulation, args.jobs
            )
    print(
        f"| model | tool | FP16 FLOPs | FP16 nodes | passes (emulated-fp16, {args.emulation}) "
        "| worst max error / output range | evaluations | time s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        name, tool, flops, share, passed, worst, seconds, *note = row
        runs = note[1] if len(note) > 1 else "–"
        if share is None:
            why = note[0] if note else ""
            print(f"| {name} | {tool} | – | – | fails to run: {why} | – | {runs} | {seconds:.1f} |")
            continue
        verdict = "yes" if passed else "**no**"
        print(
            f"| {name} | {tool} | {flops:.1%} | {share:.1%} | {verdict} | {worst:.2e} "
            f"| {runs} | {seconds:.1f} |"
        )
    print()
    for name in args.models.split(","):
        times = {row[1]: row[6] for row in rows if row[0] == name}
        ours, theirs = times.get("trtbuild tune"), times.get("ModelOpt AutoCast (defaults)")
        if ours is not None and theirs:
            print(
                f"{name}: trtbuild tune {ours:.1f} s, {ours / theirs:.2f}x ModelOpt AutoCast's "
                "default run in the same run (target < 1x)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
