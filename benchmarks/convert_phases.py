#!/usr/bin/env python3
"""Where one `trtbuild convert` spends its time, phase by phase, in one process.

Why: `bench_convert.py` times whole processes; this says which part of a
`convert` after a rule edit (prepared graph cached, mixed model new) costs what.
It runs the steps `convert` runs, one after the other and timed apart: the
imports, the front half (the prepared graph from the cache, assigning, converting),
serializing the mixed model, `onnx.checker`'s full check, ONNX Runtime's default
load in a child process and, where that load fails, the second child with
optimisations off, and the save. (`convert` itself runs the first child beside
`onnx.checker`; the second starts only after the first has failed.)

Usage: python benchmarks/convert_phases.py POLICY  (the cache of TRTBUILD_CACHE_DIR)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    phases: list[tuple[str, float]] = []
    t = STARTED

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        phases.append((name, now - t))
        t = now

    import onnx

    from trtbuild import api
    from trtbuild.graph.model_io import save_model
    from trtbuild.policy import load_policy
    from trtbuild.precision import ort_child

    lap("imports (trtbuild, onnx)")
    policy = load_policy(args[0])
    front = api._front(policy, "none", api.open_cache(), False)
    lap("front half (prepared graph cached, assign, convert)")
    data = front.converted.model.SerializeToString()
    folder = Path(tempfile.mkdtemp(prefix="trtbuild-phases-"))
    path = folder / "mixed.onnx"
    path.write_bytes(data)
    lap("serialize the mixed model")
    onnx.checker.check_model(data, full_check=True)
    lap("onnx.checker (full check)")
    first = ort_child.outcome(ort_child.spawn(path, "default"))
    lap("ONNX Runtime child, default optimisations")
    if not (first.ok or first.no_kernel):
        ort_child.outcome(ort_child.spawn(path, "off"))
        lap(f"ONNX Runtime child, optimisations off (the default load failed: {first.kind})")
    save_model(front.converted.model, str(folder / "out.onnx"))
    lap("save")
    total = sum(s for _, s in phases)
    print("\n| phase of one convert after an edit | s | share |\n|---|---|---|")
    for name, seconds in phases:
        print(f"| {name} | {seconds:.2f} | {seconds / total:.0%} |")
    print(f"| **total** | **{total:.2f}** | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
