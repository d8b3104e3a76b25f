"""Change the bytes of real input files at random and run trtbuild on each: any exit other
than 0, 1 or 2 (an internal error, 70) is a bug, printed once per kind with its traceback's
last lines, the file that caused it kept in `--cases` (default `fuzz-cases/`).

Why: a user's files are damaged in ways no test thinks of (a copy cut short, a flipped
bit, a hand-edited record). The cases this found (a model name that is not UTF-8, an input
of element type 80, a declared shape inference contradicts, an encrypted `.npz` member, a
mangled `.npy` header, a build.json whose `memory` is a number) are tests now; this
script is how they were found, to run again after a change.

Kinds (each mutates one file of a small real setup, in a scratch folder of its own):
- `model`: the ONNX model's bytes (a Conv, ReduceMean, Sub, Mul graph);
- `npz`: an `.npz`/`.npy` given as an input's `data: {file: ...}`;
- `image`: a PNG, JPEG, BMP, GIF, TIFF or WebP in an input's `images:` folder;
- `record`: one value of a real build.json at a time, for `report`.

Usage: python scripts/fuzz_files.py KIND [--runs N] [--seed S] [--command check|build]
       [--cases DIR]
Needs: the project installed (`make install`); `record` builds one engine first.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trtbuild.cli import main

POLICY = "version: 1\nmodel: m.onnx\n{inputs}accuracy: {{samples: 1}}\n"


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c"], ["m"], name="mean", axes=[2, 3], keepdims=1),
        helper.make_node("Sub", ["c", "m"], ["s"], name="sub"),
        helper.make_node("Mul", ["s", "s"], ["y"], name="sq"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])
    graph = helper.make_graph(nodes, "g", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _mutated(data: bytes, rng: random.Random) -> bytes:
    """One to four changes: a byte replaced, a few cut, a few inserted."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        k, op = rng.randrange(len(out)), rng.random()
        if op < 0.7:
            out[k] = rng.randrange(256)
        elif op < 0.85:
            del out[k : k + rng.randint(1, 8)]
        else:
            out[k:k] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
    return bytes(out or b"x")


def _setup(kind: str, folder: Path) -> tuple[Path, list[bytes], Callable[[bytes], None]]:
    """The policy, the originals to mutate and how one mutation is put in place."""
    onnx.save(_model(), folder / "m.onnx")
    inputs = ""
    if kind == "npz":
        inputs = "inputs:\n  x:\n    data: {file: x.npz}\n"
        arrays = [io.BytesIO(), io.BytesIO()]
        pixels = np.random.default_rng(0).standard_normal((2, 1, 3, 16, 16)).astype(np.float32)
        np.savez(arrays[0], x=pixels)
        np.savez_compressed(arrays[1], x=pixels)
        originals = [a.getvalue() for a in arrays]
        put = (folder / "x.npz").write_bytes
    elif kind == "image":
        from PIL import Image

        inputs = "inputs:\n  x:\n    data: {images: pics}\n"
        pixels = np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8)
        originals = []
        for fmt in ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP"):
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, fmt)
            originals.append(buf.getvalue())
        (folder / "pics").mkdir()
        put = (folder / "pics" / "a").write_bytes  # Pillow reads the format, not the name
    else:
        originals = [(folder / "m.onnx").read_bytes()]
        put = (folder / "m.onnx").write_bytes
    (folder / "p.yaml").write_text(POLICY.format(inputs=inputs))
    return folder / "p.yaml", originals, put


def _run(args: list[str]) -> tuple[object, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code: object = main(args)
        except BaseException as exc:  # what escapes main is the finding
            code = f"raised {type(exc).__name__}"
    return code, err.getvalue()


def _report(
    found: dict, i: int, code: object, err: str, keep: Callable[[Path], None], cases: Path
) -> None:
    """Print a kind of failure once, and keep the file that caused it."""
    lines = [line for line in err.splitlines() if line.strip()]
    key = (code, lines[-3][:80] if len(lines) >= 3 else err[:80])
    if key in found:
        return
    found[key] = i
    cases.mkdir(parents=True, exist_ok=True)
    keep(cases / f"case_{i}")
    print(f"run {i}: exit {code}; kept {cases / f'case_{i}'}\n    " + "\n    ".join(lines[-3:]))


def fuzz_files(kind: str, runs: int, seed: int, command: str, folder: Path, cases: Path) -> int:
    policy, originals, put = _setup(kind, folder)
    rng, found = random.Random(seed), {}
    extra = (
        ["--backend", "none", "--no-cache", "--out", str(folder / "out")]
        if command == "build"
        else []
    )
    for i in range(runs):
        data = _mutated(rng.choice(originals), rng)
        put(data)
        code, err = _run([command, "--policy", str(policy), *extra])
        if code not in (0, 1, 2):
            _report(found, i, code, err, lambda p, d=data: p.write_bytes(d), cases)
    return len(found)


def fuzz_record(runs: int, seed: int, folder: Path, cases: Path) -> int:
    """One or two values of a real build.json replaced by a value of another type, or removed."""
    policy, _, _ = _setup("model", folder)
    out = folder / "out"
    if main(["build", "--policy", str(policy), "--out", str(out)]) not in (0, 1):
        raise SystemExit("the build to read back failed")
    base = json.loads((out / "build.json").read_text())
    paths = list(_paths(base))
    values = [None, 5, -1, 1.5, "x", "", [], {}, [1], {"a": 1}, True]
    rng, found = random.Random(seed), {}
    for i in range(runs):
        doc = copy.deepcopy(base)
        for _ in range(rng.randint(1, 2)):
            _change(doc, rng.choice(paths), rng, values)
        text = json.dumps(doc)
        (out / "build.json").write_text(text)
        code, err = _run(["report", "--policy", str(policy), "--out", str(out)])
        if code not in (0, 1, 2):
            _report(found, i, code, err, lambda p, t=text: p.write_text(t), cases)
    return len(found)


def _paths(value, at: tuple = ()):
    if at:
        yield at
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        yield from _paths(item, (*at, key))


def _change(doc, path: tuple, rng: random.Random, values: list) -> None:
    parent = doc
    with contextlib.suppress(KeyError, IndexError, TypeError):
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and rng.random() < 0.25:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = rng.choice(values)


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["model", "npz", "image", "record"])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--command", choices=["check", "build"], default="check")
    parser.add_argument("--cases", type=Path, default=Path("fuzz-cases"))
    args = parser.parse_args(argv)
    cases = args.cases.resolve()  # kept where they were asked for, not in the scratch folder
    warnings.simplefilter("ignore")  # numpy's and onnx's notes about the damaged files
    with tempfile.TemporaryDirectory(prefix="trtbuild-fuzz-") as tmp:
        if args.kind == "record":
            found = fuzz_record(args.runs, args.seed, Path(tmp), cases)
        else:
            found = fuzz_files(args.kind, args.runs, args.seed, args.command, Path(tmp), cases)
    print(f"{args.kind}: {args.runs} runs, {found} kind(s) of internal error")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main_())
