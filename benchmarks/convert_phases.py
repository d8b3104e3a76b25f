#!/usr/bin/env python3
"""Where one `trtbuild convert` spends its time, phase by phase, in one process.

Why: `bench_convert.py` times whole processes; this says which part of a
`convert` after a rule edit (prepared graph cached, mixed model new) costs what.
It runs the steps `convert` runs, one after the other and timed apart: the
imports, the front half (the prepared graph from the cache, assigning, converting),
serializing the mixed model, reading the memory of neighbourhoods ONNX Runtime
checked before, the structural keys, the model of the neighbourhoods not yet
checked, `onnx.checker` (its full check unless every key and the prepared graph are
known, as `convert` runs it), ONNX Runtime's loads of that model in child
processes (the default load, and where it fails the load with optimisations off,
then the loads of what the failure was not given to; each child started ahead, as
`convert`'s are, so a load costs its session), writing the memory, and the save.
(`convert` itself runs the first child beside `onnx.checker`, and the "off" load
beside the second round.) With `--cold`
nothing is remembered (as `--no-cache`) and the memory is not written; the check's
children are started before the front half, as a cold `convert` starts them before
its graph passes (which take longer than the cached graph's front half here: a real
cold `convert`'s children have more time for their imports).

Usage: python benchmarks/convert_phases.py POLICY [--cold]  (the cache of TRTBUILD_CACHE_DIR)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cold = "--cold" in args
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
    from trtbuild.precision import neighbourhoods, validate

    lap("imports (trtbuild, onnx)")
    policy = load_policy(args[0])
    cache = api.open_cache()
    with validate.open_spares() as spares:
        if cold and policy.build.ort_check_timeout != 0:  # as a cold `convert` does
            validate.start_ahead(spares, policy.build.ort_check)  # (its graph is prepared)
        front = api._front(policy, "none", cache, False, draw=False)  # as convert_front
        lap("front half (prepared graph cached, assign, convert)")
        model = front.converted.model
        data = model.SerializeToString()
        lap("serialize the mixed model")
        memory = {} if cold else neighbourhoods.read_memory(cache, model)
        if not memory:  # as `start_mixed_check`: a spare's import runs beside the keys
            spares.fill(1)
        lap(f"read the memory of neighbourhoods ({len(memory)} keys)")
        plan = neighbourhoods.plan(model, memory)
        lap(f"structural keys ({len(set(plan.shape.keys))} distinct of {len(plan.shape.keys)})")
        source = plan.neighbourhood() if plan.pending else b""
        size = len(onnx.load_model_from_string(source).graph.node) if source else 0
        lap(f"model of the {len(plan.pending)} new neighbourhoods ({size} nodes)")
        if not source:
            spares.close()  # as `start_mixed_check`: no child waits where none loads
        full = validate.needs_full_check(plan, None if cold else cache, front.digest)
        onnx.checker.check_model(data, full_check=full)
        said = "full check" if full else "every key remembered: the graph's check"
        lap(f"onnx.checker ({said}, the whole model)")
        _loads(plan, source, lap, spares)
    if not cold:
        neighbourhoods.remember(cache, plan.learned, model)
        lap("write the memory")
    folder = Path(tempfile.mkdtemp(prefix="trtbuild-phases-"))
    save_model(model, str(folder / "out.onnx"))
    lap("save")
    total = sum(s for _, s in phases)
    what = "cold (nothing remembered)" if cold else "after an edit"
    print(f"\n| phase of one convert {what} | s | share |\n|---|---|---|")
    for name, seconds in phases:
        print(f"| {name} | {seconds:.2f} | {seconds / total:.0%} |")
    print(f"| **total** | **{total:.2f}** | |")
    return 0


def _loads(plan, source: bytes, lap, spares) -> None:
    """ONNX Runtime's loads of the new neighbourhoods, as `validate` runs them: each in a
    child of `spares` (started ahead, its import done; none started after the last
    round's), one after the other here (`validate` runs the "off" load beside the next
    round's, so each is timed apart)."""
    from trtbuild.precision import neighbourhoods, ort_child

    if not source:
        lap("ONNX Runtime: no child (every neighbourhood known)")
        return
    for round_ in range(neighbourhoods.ROUNDS):
        last = round_ == neighbourhoods.ROUNDS - 1  # no spare for a round after it (`validate`)
        first = ort_child.outcome(spares.take(source, "default", refill=not last))
        lap(f"ONNX Runtime child {round_ + 1}, default optimisations")
        if first.ok or first.no_kernel:
            plan.learn("", "")
            return
        if round_ == 0:
            ort_child.outcome(spares.take(source, "off"))
            lap(f"ONNX Runtime child, optimisations off (the default load failed: {first.kind})")
        given = plan.learn(ort_child.warning(first, source, None, spares.take), first.message)
        lap("the warning, attributed to keys")
        if not given:  # no key charged: `validate` loads the whole model then (not timed here)
            lap("no key charged: the whole model's load decides (not timed)")
            return
        if not plan.pending:
            return
        source = plan.neighbourhood()


if __name__ == "__main__":
    sys.exit(main())
