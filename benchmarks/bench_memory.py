#!/usr/bin/env python3
"""Peak memory and time of `build`, `check` and `tune` against plain FP32 ONNX Runtime inference.

Why whole processes: what stops a user is the peak resident memory of the
command they run (imports, ONNX Runtime, the engine builder, the judge), so
each row is one process, measured by the kernel (`wait4`'s `ru_maxrss`), next
to plain FP32 inference of the same model on the same input in a process of
its own. "Within the bound" is a peak of at most 3x plain inference, or plain
inference plus 0.5 GB where that is more (imports are a fixed cost).

Cases: the real PP-OCRv4 detector (`make models` fetches it) at 640x640,
1280x1280 and 1920x1920, normal input data, `rules: []`, `--no-cache` for
`build` and `tune`; `check` cold (an empty cache) and warm (the same cache).

`--phases N` prints where the accuracy stage's time goes at NxN instead: one
process judges the same policy `--repeat` times and times plain FP32 inference
between the judgements, so every ratio compares figures of one moment on a
machine whose load changes (each phase is wrapped with `time.perf_counter`).

Then a case of large weights: a generated transformer of ViT-B's width and depth (340 MB),
`convert` and `build` (no engine) against its plain inference.

Usage: python benchmarks/bench_memory.py [--sizes 640,1280,1920] [--modelopt-python PY]
       [--skip tune,weights,...] [--tune-max 1280] [--weights-dim 768] [--weights-layers 12]
       [--phases 1280 [--repeat 3]]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "ppocrv4_det.onnx"
GB = 1e9

PLAIN = """
import sys, time, numpy as np, onnxruntime as ort
n = int(sys.argv[2])
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).normal(size=(1, 3, n, n)).astype(np.float32)
t = time.perf_counter()
sess.run(None, {"x": x})
print(time.perf_counter() - t)
"""

AUTOCAST = """
import sys, onnx
from modelopt.onnx.autocast import convert_to_mixed_precision
model = convert_to_mixed_precision(onnx_path=sys.argv[1], low_precision_type="fp16", keep_io_types=True)
onnx.save(model, sys.argv[2])
"""

POLICY = """\
version: 1
model: {model}
inputs:
  x:
    shape: [1, 3, {n}, {n}]
    data: {{distribution: normal, mean: 0.0, std: 1.0}}
passes: {{opset: 17, fold_batchnorm: true}}
precision: {{default: fp16, rules: []}}
build: {{backend: auto, compute_capabilities: ["8.9"], workspace: 1GiB}}
accuracy:
  samples: 2
  tolerances:
    default: {{atol: 1e-4, rtol: 1e-4, check_error_stat: mean}}
"""


@dataclass(frozen=True)
class Run:
    peak: float  # bytes
    seconds: float
    stdout: str
    code: int


def measure(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    """One whole process: its peak RSS from the kernel and its wall time."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT
    )
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(usage.ru_maxrss * 1024, time.perf_counter() - t, out, proc.returncode)


def within(peak: float, plain: float) -> bool:
    return peak <= max(3 * plain, plain + 0.5 * GB)


def cell(run: Run, plain: Run) -> str:
    mark = "" if within(run.peak, plain.peak) else " **over**"
    failed = "" if run.code in (0, 1) else f" (exit {run.code})"
    return (
        f"{run.peak / GB:.2f} GB ({run.peak / plain.peak:.1f}x){mark}, {run.seconds:.1f} s{failed}"
    )


def case(n: int, tmp: Path, skip: set[str], modelopt: str | None, tune_max: int) -> list[str]:
    trt = [sys.executable, "-m", "trtbuild"]
    policy = tmp / f"det{n}.yaml"
    policy.write_text(POLICY.format(model=MODEL, n=n))
    plain = measure([sys.executable, "-c", PLAIN, str(MODEL), str(n)])
    infer = float(plain.stdout.strip() or "nan")
    row = [f"{n}x{n}", f"{plain.peak / GB:.2f} GB, run {infer:.2f} s"]
    out = tmp / f"out{n}"
    build = measure([*trt, "build", "--policy", str(policy), "--out", str(out), "--no-cache"])
    stage = json.loads((out / "build.json").read_text())["timings_seconds"].get("accuracy")
    row += [cell(build, plain), f"{stage:.1f} s ({stage / infer:.0f}x)" if stage else "–"]
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp / f"cache{n}")}
    for _ in ("cold", "warm"):
        row.append(cell(measure([*trt, "check", "--policy", str(policy)], env), plain))
    info = measure([*trt, "cache", "info"], env).stdout.strip().split(": ", 1)[-1]
    print(f"{n}x{n} cache after check: {info}", file=sys.stderr)  # no tensors: measures only
    if "tune" not in skip and n > tune_max:
        row.append("–")
    elif "tune" not in skip:
        tuned = tmp / f"tuned{n}.yaml"
        cmd = [*trt, "tune", "--policy", str(policy), "-o", str(tuned), "--no-cache"]
        row.append(cell(measure(cmd), plain))
    if modelopt:
        row.append(
            cell(measure([modelopt, "-c", AUTOCAST, str(MODEL), str(tmp / "ac.onnx")]), plain)
        )
    return row


# --- large weights: a ViT-B-sized transformer ---------------------------------------------

# Plain inference of any model: every input fed normal noise at its declared shape (a
# dynamic dim as 1)
PLAIN_ANY = """
import sys, numpy as np, onnxruntime as ort
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
shape = lambda i: [d if isinstance(d, int) else 1 for d in i.shape]
sess.run(None, {i.name: rng.normal(size=shape(i)).astype(np.float32) for i in sess.get_inputs()})
"""

WEIGHTS_POLICY = """\
version: 1
model: {model}
passes: {{opset: 18}}
precision: {{default: fp16, rules: [{{id: norms, match: {{pattern: layernorm}}, precision: fp32}}]}}
build: {{backend: none}}
accuracy: {{samples: 2}}
"""


def weights_case(tmp: Path, dim: int, layers: int) -> None:
    """Peak memory where the weights, not the tensors, are the model: a generated transformer
    of ViT-B's width and depth (about 340 MB of FP32 weights at dim 768 and 12 layers), at
    opset 13 with its LayerNorms decomposed, so the policy's opset 18 takes the whole model
    through onnx's version converter (ReduceMean's axes become an input)."""
    src = tmp / "weights.onnx"
    # made in a process of its own: a child's peak (wait4) counts the pages it is forked
    # with, and a parent holding the model's arrays floored every figure at its own
    made = f"import make_models, onnx; onnx.save(make_models.transformer_tiny(seq=16, dim={dim}, layers={layers}, outlier=0.0), {str(src)!r})"
    subprocess.run([sys.executable, "-c", made], cwd=ROOT / "scripts", check=True)
    policy = tmp / "weights.yaml"
    policy.write_text(WEIGHTS_POLICY.format(model=src))
    trt = [sys.executable, "-m", "trtbuild"]
    plain = measure([sys.executable, "-c", PLAIN_ANY, str(src)])
    convert = [*trt, "convert", "--policy", str(policy), "-o", str(tmp / "w.onnx"), "--no-cache"]
    build = [*trt, "build", "--policy", str(policy), "--out", str(tmp / "wout"), "--no-cache"]
    print(
        f"\nlarge weights: transformer, dim {dim}, {layers} layers, {src.stat().st_size / 1e6:.0f} MB"
    )
    print("| plain FP32 ORT | convert (opset 13 -> 18) | build (no engine) |\n|---|---|---|")
    print(
        f"| {plain.peak / GB:.2f} GB, {plain.seconds:.1f} s | {cell(measure(convert), plain)} "
        f"| {cell(measure(build), plain)} |",
        flush=True,
    )


# --- where the accuracy stage's time goes (--phases) --------------------------------------

# (module, attribute, phase): every function of the accuracy stage that takes time, wrapped
# where it is looked up. ONNX Runtime's runs are split by whose graph they run.
TIMED = [
    ("trtbuild.accuracy.judge", "emulate", "emulate"),
    ("trtbuild.accuracy.judge", "probe", "probes"),
    ("trtbuild.accuracy.judge", "reference_plan", "cut plans"),
    ("trtbuild.accuracy.judge", "plan_aligned", "cut plans"),
    ("trtbuild.accuracy.judge", "compare", "outputs compared (Polygraphy, metrics)"),
    ("trtbuild.accuracy.risk", "at_risk", "at risk"),
    ("trtbuild.accuracy.stream", "plain_session", "sessions made"),
    ("trtbuild.accuracy.stream", "lean_session", "sessions made"),
    ("trtbuild.accuracy.stream", "release_freed_memory", "malloc_trim"),
]
KINDS = ("policy", "fp16 baseline", "fp32 baseline")


def _phase_child(policy_path: str, repeat: int, shrink: bool) -> None:
    """In its own process: judge `policy_path` `repeat` times, phases timed, plain inference
    timed before each judgement; prints one JSON line per judgement."""
    import importlib

    import numpy as np
    import onnxruntime as ort

    from trtbuild.accuracy import judge, sessions, stream
    from trtbuild.cache import Cache
    from trtbuild.evaluation import evaluate_all
    from trtbuild.front import baselines, run_front
    from trtbuild.policy import load_policy

    spent: dict[str, float] = {}
    stack: list[list[float]] = []  # [start, time of inner phases] of the phases running

    def timed(fn, phase):
        def wrapper(*args, **kwargs):
            stack.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, inner = stack.pop()
                took = time.perf_counter() - start
                key = phase(args) if callable(phase) else phase
                spent[key] = spent.get(key, 0.0) + took - inner
                if stack:
                    stack[-1][1] += took

        return wrapper

    for module, name, phase in TIMED:
        mod = importlib.import_module(module)
        setattr(mod, name, timed(getattr(mod, name), phase))
    sums: dict[str, int] = {}  # the policy's lean run: tensors summed, of those the graph names
    _time_runs(judge, stream, timed, sums)
    _time_walk(judge, timed)
    if not shrink:
        sessions._run_options.cache_clear()
        sessions._run_options = lambda shrink=True: ort.RunOptions()  # ablation: no shrink

    policy = load_policy(Path(policy_path))
    front = run_front(policy, cache=Cache(enabled=False))
    base_models = baselines(front, engines=True)
    plain = ort.InferenceSession(str(policy.model), providers=["CPUExecutionProvider"])
    feed = front.feeds[0]
    plain.run(None, feed)  # warm-up
    for _ in range(repeat):
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            plain.run(None, feed)
            runs.append(time.perf_counter() - t)
        spent.clear()
        t = time.perf_counter()
        evaluate_all(front, engines={}, backend="none", base_models=base_models)
        stage = time.perf_counter() - t
        spent["other"] = stage - sum(spent.values())
        out = {"plain": float(np.median(runs)), "stage": stage, "phases": dict(spent), **sums}
        print(json.dumps(out), flush=True)


def _time_runs(judge, stream, timed, sums: dict[str, int]) -> None:
    """ONNX Runtime's runs, by whose graph a runner runs (reference, policy, baselines) and how
    (cut into segments, or lean)."""
    kind_of: dict[int, str] = {}  # id(emulated graph) -> candidate kind
    start = judge._Run.start.__func__

    def run_start(cls, c, *args, **kwargs):
        run = start(cls, c, *args, **kwargs)
        kind_of[id(run.emulated)] = KINDS[min(len(kind_of), len(KINDS) - 1)]
        if kind_of[id(run.emulated)] == "policy":
            sums.update(summed=len(run.lean.sums), named=len(run.walk.depth))
        return run

    judge._Run.start = classmethod(run_start)
    original_judge_all = judge.judge_all

    def judge_all(*args, **kwargs):
        kind_of.clear()  # candidates are numbered per judgement
        return original_judge_all(*args, **kwargs)

    judge.judge_all = judge_all
    import trtbuild.evaluation

    trtbuild.evaluation.judge_all = judge_all
    current: list[str] = []
    run_session = stream.run_session
    stream.run_session = timed(run_session, lambda args: current[-1])
    for cls, how in ((stream.SegmentRunner, "cut"), (stream.LeanRunner, "lean")):
        _kind_runs(cls, how, kind_of, current)


def _kind_runs(cls, how: str, kind_of: dict[int, str], current: list[str]) -> None:
    run = cls.run

    def labelled(self, feed, **kwargs):
        kind = f"{kind_of.get(id(self.model), 'reference')} run ({how})"
        if how == "lean":
            current.append(kind)
            try:
                return run(self, feed, **kwargs)
            finally:
                current.pop()
        return _labelled_gen(run(self, feed, **kwargs), kind, current)

    cls.run = labelled


def _labelled_gen(gen, kind: str, current: list[str]):
    while True:
        current.append(kind)
        try:
            value = next(gen)
        except StopIteration:
            return
        finally:
            current.pop()
        yield value


def _time_walk(judge, timed) -> None:
    judge._Walk.take = timed(judge._Walk.take, "per-tensor compare (walk)")


def phases(n: int, tmp: Path, repeat: int, shrink: bool = True) -> None:
    """Where the accuracy stage's time goes at nxn: a table of seconds and multiples of one
    plain inference, one column per judgement (`shrink=False`: the arena never shrunk)."""
    policy = tmp / f"det{n}.yaml"
    policy.write_text(POLICY.format(model=MODEL, n=n))
    cmd = [sys.executable, __file__, "--phase-child", str(policy), "--repeat", str(repeat)]
    done = subprocess.run(
        cmd + ([] if shrink else ["--no-shrink"]), capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    names = sorted({k for r in rows for k in r["phases"]}, key=lambda k: -rows[0]["phases"][k])
    said = "" if shrink else ", the arena never shrunk"
    print(f"accuracy stage at {n}x{n}{said}: seconds (x one plain FP32 inference just before)")
    print("| phase | " + " | ".join(f"judgement {i + 1}" for i in range(len(rows))) + " |")
    print("|---|" + "---|" * len(rows))
    for name in names:
        cells = [_times(r["phases"].get(name, 0.0), r["plain"]) for r in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = [f"**{_times(r['stage'], r['plain'])}**" for r in rows]
    print("| **accuracy stage** | " + " | ".join(cells) + " |")
    print("| plain FP32 inference | " + " | ".join(f"{r['plain']:.3f} s" for r in rows) + " |")
    if "summed" in rows[0]:
        print(f"the policy's lean run sums {rows[0]['summed']} of the {rows[0]['named']} tensors")


def _times(seconds: float, plain: float) -> str:
    return f"{seconds:.2f} ({seconds / plain:.1f}x)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="640,1280,1920")
    parser.add_argument(
        "--skip", default="", help="commands to leave out: tune, weights (the large-weights case)"
    )
    parser.add_argument("--weights-dim", type=int, default=768, help="the large-weights case's")
    parser.add_argument("--weights-layers", type=int, default=12)
    parser.add_argument("--tune-max", type=int, default=1280, help="tune only up to this size")
    parser.add_argument("--modelopt-python", help="python of a virtualenv with nvidia-modelopt")
    parser.add_argument("--phases", type=int, metavar="N", help="time the accuracy stage's phases")
    parser.add_argument("--repeat", type=int, default=3, help="judgements per --phases process")
    parser.add_argument("--phase-child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-shrink", action="store_true", help="with --phases: never shrink the arena"
    )
    args = parser.parse_args(argv)
    if args.phase_child:
        _phase_child(args.phase_child, args.repeat, not args.no_shrink)
        return 0
    if not MODEL.exists():
        sys.exit(f"{MODEL} is missing: run `make models` first")
    if args.phases:
        with tempfile.TemporaryDirectory(prefix="trtbuild-bench-phases-") as tmp:
            phases(args.phases, Path(tmp), args.repeat, not args.no_shrink)
        return 0
    skip = set(filter(None, args.skip.split(",")))
    head = ["input", "plain FP32 ORT: peak, run", "build", "accuracy stage (x one run)"]
    head += ["check cold", "check warm"] + ([] if "tune" in skip else ["tune"])
    head += ["ModelOpt AutoCast"] if args.modelopt_python else []
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    with tempfile.TemporaryDirectory(prefix="trtbuild-bench-memory-") as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            row = case(n, Path(tmp), skip, args.modelopt_python, args.tune_max)
            print("| " + " | ".join(row) + " |", flush=True)
        if "weights" not in skip:
            weights_case(Path(tmp), args.weights_dim, args.weights_layers)
    print(
        "\nPeaks are whole processes (wait4 ru_maxrss); 'over' marks a peak beyond "
        "max(3x plain inference, plain + 0.5 GB)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
