#!/usr/bin/env python3
"""Whole-process time of `trtbuild convert` (cold and warm) against onnxconverter-common.

Why whole processes: a user runs one command from a Makefile, so the figure
that matters includes interpreter start, imports, loading, converting and
saving. Both tools get the same generated transformer (decomposed LayerNorms,
GELU, self-attention; about 10k nodes) and keep its LayerNorms in FP32:
trtbuild by `pattern: layernorm`, onnxconverter-common by its `node_block_list`
of the same nodes. onnxconverter-common's cast insertion around blocked nodes
grows with their number, so its all-FP16 run (no block list, a lighter job) is
timed too: the strictest peer, with `keep_io_types=True` (FP32 inputs and outputs, as
trtbuild keeps them; its topological sort is O(n²) on this model) and with
`keep_io_types=False` (FP16 inputs and outputs: a lighter job still than trtbuild's,
but the figure quoted in issue #46). trtbuild runs cold (`--no-cache`: every graph pass) and warm
(the prepared graph from a fresh cache folder), and `check` runs warm. trtbuild's bytecode
is compiled first, as pip compiles an installed package's. Each is
run `--repeat` times (`check`, the quickest, `--check-repeat` times); the table shows the
median, the fastest and the slowest run.

Two transformers of the same size: `dim 32` (11 MB of weights, where onnxconverter-
common's per-weight work is slow) and `dim 8` (small weights: many small nodes, the other
half of real models, where it is fast). On each, the rule-edit loop a user lives in is
timed too: one rule's regex edited between runs (a different layer's MLP pinned each
time), `convert` again with the prepared graph cached, so every mixed model is new: the
first `--edits` edits on layers 0, 1, ... (next to the embedding: neighbourhoods ONNX
Runtime has not loaded), then as many on layers in the middle (alike to those: no child).
`--phases` times, in one process, where a `convert` spends its time: the front half,
the structural keys and the memory of neighbourhoods ONNX Runtime checked, the model of
the new neighbourhoods, `onnx.checker`, ONNX Runtime's loads of it in children, and the
save; once after an edit (a layer not edited before) and once cold (nothing remembered).

`--rounds` (default 5) then times, round after round, the lighter peer, an edit, a warm and a
cold `convert` one after the other, so the machine's drift hits both tools alike;
`--cold-parts` adds, each round, a cold `convert` of the model saved at the policy's opset
beforehand and one with the ONNX Runtime check off (what the version conversion and the
check cost of a cold run).

Usage: python benchmarks/bench_convert.py [--nodes 10000] [--dims 32,8] [--repeat 3]
       [--check-repeat 10] [--edits 5] [--phases] [--rounds 5] [--cold-parts]
Needs: pip install -e ".[bench]" (onnxconverter-common).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import version_converter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import make_models  # noqa: E402

# the opset the benchmark's policy asks (the generated model is at 13: `prepare` upgrades it)
OPSET = 17
# #46's targets, trtbuild's time over the peer's: cold, after a rule edit, warm
TARGET = {"cold": 2.0, "edit": 1.5, "warm": 1.0}

POLICY = """\
version: 1
model: {model}
passes: {{opset: {opset}, fuse_layernorm: false}}
precision:
  default: fp16
  rules:
    - id: layernorm
      match: {{pattern: layernorm}}
      precision: fp32{edit}
build: {{backend: none}}
"""
# The rule a user edits between runs: one layer's MLP pinned, a different layer each time.
EDIT = """
    - id: edited
      match: {{name: '^/layers\\.{layer}/fc2/'}}
      precision: fp32"""

OCC = """\
import sys, json, onnx
from onnxconverter_common.float16 import convert_float_to_float16
src, dst = sys.argv[1], sys.argv[2]
block = set(json.loads(sys.argv[3]))  # a set: the converter tests membership once per node
keep_io = sys.argv[4] == "1"  # FP32 inputs and outputs, as trtbuild's mixed model keeps
model = onnx.load(src)
mixed = convert_float_to_float16(model, keep_io_types=keep_io, node_block_list=block)
onnx.save(mixed, dst)
"""


def _time(cmd: list[str], repeat: int, env: dict[str, str]) -> tuple[list[float], str]:
    runs, out = [], ""
    for _ in range(repeat):
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        runs.append(time.perf_counter() - t)
        if done.returncode != 0:
            sys.exit(f"{cmd[:3]} failed:\n{done.stderr[-2000:]}")
        out = done.stdout.strip()
    return runs, out


def _stats(rows: list[tuple[str, list[float]]]) -> dict[str, float]:
    print("\n| command | median s | fastest s | slowest s | runs |\n|---|---|---|---|---|")
    for name, runs in rows:
        median, fastest, slowest = statistics.median(runs), min(runs), max(runs)
        print(f"| {name} | {median:.2f} | {fastest:.2f} | {slowest:.2f} | {len(runs)} |")
    return {name: statistics.median(runs) for name, runs in rows}


def bench_model(args, layers: int, dim: int, tmp: Path) -> None:
    """Every row for one generated transformer (`dim` wide, `layers` deep)."""
    model = make_models.transformer_tiny(layers=layers, dim=dim, outlier=0.0)
    src = tmp / "transformer.onnx"
    onnx.save(model, src)
    n_nodes = len(model.graph.node)
    block = [n.name for n in model.graph.node if "/norm" in n.name]
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY.format(opset=OPSET, model=src, edit=""))
    print(
        f"\nmodel: transformer, dim {dim}, {layers} layers, {n_nodes} nodes, "
        f"{src.stat().st_size / 1e6:.1f} MB; {len(block)} LayerNorm nodes kept FP32"
    )

    cache = tmp / "cache"
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(cache)}
    trt = [sys.executable, "-m", "trtbuild"]
    convert = [*trt, "convert", "--policy", str(policy), "-o", str(tmp / "trtbuild.onnx")]
    check = [*trt, "check", "--policy", str(policy)]

    def occ_cmd(blocked: list[str], keep_io: bool = True) -> list[str]:
        out, listed = str(tmp / "occ.onnx"), json.dumps(blocked)
        return [sys.executable, "-c", OCC, str(src), out, listed, str(int(keep_io))]

    cold, trt_out = _time([*convert, "--no-cache"], args.repeat, env)
    _time(convert, 1, env)  # fills the cache
    warm, _ = _time(convert, args.repeat, env)

    def edit_runs(edited: range) -> list[float]:
        """One convert per layer edited: each a new mixed model, the prepared graph cached."""
        runs = []
        for layer in edited:
            policy.write_text(
                POLICY.format(opset=OPSET, model=src, edit=EDIT.format(layer=layer % layers))
            )
            runs += _time(convert, 1, env)[0]
        return runs

    # The first edits (layers 0, 1, ...) make neighbourhoods ONNX Runtime has not loaded
    # (the embedding next to them); later ones, in the middle, are alike to those.
    first_edits = edit_runs(range(args.edits))
    later_edits = edit_runs(range(layers // 2, layers // 2 + args.edits))
    policy.write_text(POLICY.format(opset=OPSET, model=src, edit=""))
    occ, _ = _time(occ_cmd(block), args.repeat, env)
    occ_all, _ = _time(occ_cmd([]), args.repeat, env)
    occ_fp16_io, _ = _time(occ_cmd([], keep_io=False), args.repeat, env)
    _time([*check, "--json"], 1, env)  # convert never runs the FP32 reference; check caches it
    check_warm, _ = _time([*check, "--json"], args.check_repeat, env)
    edited = "trtbuild convert after editing one rule (cached prepared graph, a new mixed model)"
    rows = {
        "cold": ("trtbuild convert, cold (--no-cache)", cold),
        "warm": ("trtbuild convert, warm (cached prepared graph, the same mixed model)", warm),
        "first edits": (
            f"{edited}: first edits, layers 0-{args.edits - 1} (new neighbourhoods loaded)",
            first_edits,
        ),
        "later edits": (
            f"{edited}: later edits, middle layers (every neighbourhood seen: no child)",
            later_edits,
        ),
        "occ": (
            "onnxconverter-common convert_float_to_float16, LayerNorms in node_block_list",
            occ,
        ),
        "occ all": ("onnxconverter-common convert_float_to_float16, all FP16, FP32 IO", occ_all),
        "occ fp16 io": (
            "onnxconverter-common convert_float_to_float16, all FP16, FP16 IO "
            "(keep_io_types=False: a lighter job than trtbuild's)",
            occ_fp16_io,
        ),
        "check": ("trtbuild check, warm", check_warm),
    }
    by_name = _stats(list(rows.values()))
    med = {k: by_name[name] for k, (name, _) in rows.items()}
    peers = (
        ("the same job", med["occ"]),
        ("its all-FP16 run, FP32 IO", med["occ all"]),
        ("its all-FP16 run, FP16 IO: a lighter job", med["occ fp16 io"]),
    )
    for label, peer in peers:
        print(
            f"trtbuild / onnxconverter-common ({label}): {med['cold'] / peer:.2f}x cold "
            f"(target <= {TARGET['cold']}x), {med['first edits'] / peer:.2f}x after a first "
            f"edit and {med['later edits'] / peer:.2f}x after a later one (target <= "
            f"{TARGET['edit']}x), {med['warm'] / peer:.2f}x warm (target <= {TARGET['warm']}x)"
        )
    print(f"check warm {med['check']:.2f} s, slowest {max(check_warm):.2f} s (target < 1 s)")
    print(f"trtbuild said: {trt_out}")
    if args.rounds:
        parts = _cold_parts(model, src, tmp) if args.cold_parts else {}
        interleaved(
            args.rounds, layers, policy, src, occ_cmd([], keep_io=False), convert, env, parts
        )
    if args.phases:  # a layer not edited before (interior: alike to those that were)
        edit = EDIT.format(layer=layers // 2 + args.edits)  # in the middle, not edited before
        policy.write_text(POLICY.format(opset=OPSET, model=src, edit=edit))
        phases = [sys.executable, str(Path(__file__).with_name("convert_phases.py")), str(policy)]
        for extra in ([], ["--cold"]):
            done = subprocess.run(
                [*phases, *extra], capture_output=True, text=True, env=env, cwd=ROOT
            )
            print(done.stdout.rstrip() or done.stderr[-2000:])
    # What `check` read from the cache: the reference's measures, not its tensors.
    print(subprocess.run([*trt, "cache", "info"], capture_output=True, text=True, env=env).stdout)


def _cold_parts(model: onnx.ModelProto, src: Path, tmp: Path) -> dict[str, Path]:
    """Policies for what a cold `convert` of `src` (`model` saved) costs beyond the peer's
    work: the same model saved at the policy's opset beforehand (no version conversion),
    and the ONNX Runtime check off (`build.ort_check_timeout: 0`)."""
    at_opset = tmp / f"transformer_opset{OPSET}.onnx"
    converted = version_converter.convert_version(model, OPSET)
    del converted.graph.value_info[:]  # as an exporter writes it: prepare infers the shapes
    onnx.save(converted, at_opset)
    plain = POLICY.format(opset=OPSET, model=src, edit="")
    off = plain.replace("{backend: none}", "{backend: none, ort_check_timeout: 0}")
    assert off != plain, "POLICY's build line changed: update _cold_parts"
    opset_label, off_label = (
        f"cold, the model already at opset {OPSET}",
        "cold, the ONNX Runtime check off",
    )
    (tmp / "cold_opset.yaml").write_text(POLICY.format(opset=OPSET, model=at_opset, edit=""))
    (tmp / "cold_off.yaml").write_text(off)
    return {opset_label: tmp / "cold_opset.yaml", off_label: tmp / "cold_off.yaml"}


def interleaved(
    rounds: int,
    layers: int,
    policy: Path,
    src: Path,
    peer: list[str],
    convert: list[str],
    env,
    parts: dict[str, Path],
) -> None:
    """Each round the lighter peer, an edit (a middle layer not edited before), a warm and a
    cold `convert` (and each of `parts`' policies cold), one after the other: the machine's
    drift (a shared CI machine slows and speeds up over minutes) hits both tools alike,
    where the rows above time each command's runs in a block of their own."""
    times: dict[str, list[float]] = {"peer": [], "edit": [], "warm": [], "cold": []}
    times.update({label: [] for label in parts})
    at = convert.index("--policy") + 1
    for k in range(rounds):
        times["peer"] += _time(peer, 1, env)[0]
        edit = EDIT.format(layer=(layers // 2 + layers // 4 + k) % layers)
        policy.write_text(POLICY.format(opset=OPSET, model=src, edit=edit))
        times["edit"] += _time(convert, 1, env)[0]
        policy.write_text(POLICY.format(opset=OPSET, model=src, edit=""))
        times["warm"] += _time(convert, 1, env)[0]
        times["cold"] += _time([*convert, "--no-cache"], 1, env)[0]
        for label, path in parts.items():
            times[label] += _time(
                [*convert[:at], str(path), *convert[at + 1 :], "--no-cache"], 1, env
            )[0]
    med = {k: statistics.median(v) for k, v in times.items()}
    said = [
        f"{k} {med[k]:.2f} s ({med[k] / med['peer']:.2f}x, target <= {TARGET[k]}x)"
        for k in ("edit", "warm", "cold")
    ]
    said += [f"{k} {med[k]:.2f} s ({med[k] / med['peer']:.2f}x)" for k in parts]
    print(
        f"interleaved, {rounds} rounds (medians): onnxconverter-common FP16 IO "
        f"{med['peer']:.2f} s, trtbuild {', '.join(said)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="approximate graph size")
    parser.add_argument(
        "--dims", default="32,8", help="the transformers' widths (8: small weights)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--check-repeat", type=int, default=10)
    parser.add_argument("--edits", type=int, default=5, help="rule edits timed, one run each")
    parser.add_argument("--phases", action="store_true", help="where an edit's convert goes")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleaved rounds against the lighter peer (0: none)",
    )
    parser.add_argument(
        "--cold-parts",
        action="store_true",
        help="in the rounds, also a cold convert of the model saved at the policy's opset "
        "and one with the ONNX Runtime check off: what each costs",
    )
    args = parser.parse_args(argv)
    # Time what an installed trtbuild runs: pip compiles a regular install's bytecode, and an
    # environment with PYTHONDONTWRITEBYTECODE would otherwise compile every module every run.
    compileall.compile_dir(ROOT / "trtbuild", quiet=1)
    one = len(make_models.transformer_tiny(layers=1).graph.node)
    two = len(make_models.transformer_tiny(layers=2).graph.node)
    layers = max(1, round((args.nodes - one) / (two - one)) + 1)
    for dim in (int(d) for d in args.dims.split(",")):
        bench_model(args, layers, dim, Path(tempfile.mkdtemp(prefix="trtbuild-bench-")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
