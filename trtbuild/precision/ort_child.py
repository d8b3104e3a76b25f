"""ONNX Runtime sessions created in a child process, and what to say when one fails.

Why a child: ONNX Runtime's graph optimisers can crash (SIGSEGV) on a valid
model; in a child that is an outcome to report, not the end of trtbuild. The
child imports nothing but ONNX Runtime and reads the model from a file.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import onnx
from onnx import helper

from trtbuild.graph import subgraphs
from trtbuild.graph.model_io import infer_shapes

# The child: create one CPU session at the given optimisation level, say why it failed.
CHILD = """\
import json, sys
import onnxruntime as ort
path, level, verbose = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
options = ort.SessionOptions()
options.log_severity_level = 0 if verbose else 3
options.intra_op_num_threads = 1
if level == "off":
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
try:
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
except Exception as exc:
    print(json.dumps({"kind": type(exc).__name__, "message": str(exc)}))
    sys.exit(3)
"""
FAILED = 3  # the child's exit code for a session that raised
PROBES = 16  # child sessions at most to find the node a crash needs
PROBE_SECONDS = 120.0  # and at most this long


@dataclass(frozen=True)
class Outcome:
    ok: bool
    kind: str = ""  # ONNX Runtime's exception type, where it raised
    message: str = ""
    crash: str | None = None  # the signal (SIGSEGV) or exit code of a child that died

    @property
    def no_kernel(self) -> bool:
        """ONNX Runtime has no CPU kernel for a type (BF16 ReduceMean): no fault of the model."""
        return self.kind == "NotImplemented"


def spawn(path: Path, level: str, verbose: bool = False) -> subprocess.Popen:
    """A child creating a session for the model at `path`; `level` is "default" or "off".

    Why it runs in the model's folder (trtbuild's own temporary one): `python -c` puts
    its working folder first on `sys.path`, and an `onnxruntime.py` in the user's folder
    would otherwise be what the check imports.
    """
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), level, "1" if verbose else "0"],
        cwd=path.parent,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def outcome(proc: subprocess.Popen) -> Outcome:
    """Wait for a child and read what happened."""
    out, err = proc.communicate()
    if proc.returncode == 0:
        return Outcome(True)
    if proc.returncode == FAILED and out.strip():
        said = json.loads(out.decode().strip().splitlines()[-1])
        return Outcome(False, said["kind"], said["message"])
    code = proc.returncode
    why = signal.Signals(-code).name if code < 0 else f"exit code {code}"
    return Outcome(False, message=err.decode(errors="replace")[-500:], crash=why)


@cache
def version() -> str:
    """The installed ONNX Runtime's version, read without importing it."""
    from importlib import metadata

    for name in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "(version unknown)"


def warning(first: Outcome, path: Path) -> str:
    """What the default-optimised load did, where, and what a user of ONNX Runtime can do.

    A crash names the graph transformer it happened in (ONNX Runtime's verbose log)
    and the node it needs (the shortest prefix of the graph that still crashes);
    an error is ONNX Runtime's own first line, which names its node.
    """
    head = f"ONNX Runtime {version()} "
    tail = (
        "; the model is valid (onnx.checker's full check passes, and ONNX Runtime loads it "
        "with graph optimisations off) and TensorRT builds it. To run it in ONNX Runtime, "
    )
    if first.crash is None:
        said = first.message.strip().splitlines()[0][:400] if first.message.strip() else first.kind
        return (
            head + f"refuses the mixed model under its default graph optimisations: {said}"
            f"{tail}lower SessionOptions.graph_optimization_level"
        )
    transformer = _last_transformer(path)
    where = f" in its {transformer}" if transformer else ""
    node = _crashing_node(path)
    at = f", at node {node.name!r} ({node.op_type})" if node is not None else ""
    fix = (
        f'pass disabled_optimizers=["{transformer}"] to InferenceSession'
        if transformer
        else "lower SessionOptions.graph_optimization_level"
    )
    return (
        head + f"crashes ({first.crash}) creating a session for the mixed model with its "
        f"default graph optimisations{where}{at}{tail}{fix}"
    )


def _last_transformer(path: Path) -> str | None:
    """The graph transformer ONNX Runtime's verbose log last started before the crash."""
    proc = spawn(path, "default", verbose=True)
    _, err = proc.communicate()
    found = re.findall(r"Applying graph transformer (\w+)", err.decode(errors="replace"))
    return found[-1] if found and proc.returncode != 0 else None


def _crashing_node(path: Path) -> onnx.NodeProto | None:
    """The node whose addition makes a prefix of the graph crash (bisection, bounded)."""
    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    typed = infer_shapes(model)  # never fails: an inference error must not hide the warning
    types = {v.name: v for v in (*typed.graph.value_info, *typed.graph.output)}
    low, high, deadline = 0, len(nodes), time.monotonic() + PROBE_SECONDS
    for _ in range(PROBES):
        if high - low <= 1 or time.monotonic() > deadline:
            break
        middle = (low + high) // 2
        probe = path.with_name(f"prefix_{middle}.onnx")
        onnx.save(_prefix(model, middle, types), str(probe))
        crashed = outcome(spawn(probe, "default")).crash is not None
        probe.unlink()
        low, high = (low, middle) if crashed else (middle, high)
    return nodes[high - 1] if high - low <= 1 and nodes else None


def _prefix(model: onnx.ModelProto, count: int, types: dict) -> onnx.ModelProto:
    """The first `count` nodes, every value they leave unread a graph output."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[count:]
    read = {t for n in out.graph.node for t in subgraphs.node_reads(n)}
    made = [o for n in out.graph.node for o in n.output if o and o not in read]
    outputs = [types[o] for o in made if o in types] or [
        helper.make_empty_tensor_value_info(o) for o in made[-1:]
    ]
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    return out
