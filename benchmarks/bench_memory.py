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

Usage: python benchmarks/bench_memory.py [--sizes 640,1280,1920] [--modelopt-python PY]
       [--skip tune,...] [--tune-max 1280]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="640,1280,1920")
    parser.add_argument("--skip", default="", help="commands to leave out, e.g. tune")
    parser.add_argument("--tune-max", type=int, default=1280, help="tune only up to this size")
    parser.add_argument("--modelopt-python", help="python of a virtualenv with nvidia-modelopt")
    args = parser.parse_args(argv)
    if not MODEL.exists():
        sys.exit(f"{MODEL} is missing: run `make models` first")
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
    print(
        "\nPeaks are whole processes (wait4 ru_maxrss); 'over' marks a peak beyond "
        "max(3x plain inference, plain + 0.5 GB)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
