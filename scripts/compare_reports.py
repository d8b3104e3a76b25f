"""Snapshot every example policy's report.json figures, or compare with a snapshot.

A refactor that should not change behaviour is checked by taking a snapshot
before it and comparing after it::

    python scripts/compare_reports.py --write before.json     # on the old commit
    python scripts/compare_reports.py --against before.json   # on the new one

A change that makes other reference data (a new random generator, say) would
differ everywhere; ``--freeze-data DIR`` first writes the example policies with
today's feeds as ``.npz`` files (``DIR/policies``, ``DIR/data``), and both
snapshots are then taken with ``--policies DIR/policies``.

Builds run with ``--backend none``: the figures come from the evaluator, not the
engine, and the snapshot must not depend on which machine built it. Paths and
the version are left out; every other key must be equal, floats bit for bit.
Exit 0 when equal, 1 when a figure differs (each difference is printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VOLATILE = ("policy", "model", "trtbuild_version")


def snapshot(policies: list[Path]) -> dict[str, Any]:
    """Build each policy on the CPU and keep its report without volatile keys."""
    from trtbuild.cli import main

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in policies:
            dest = Path(tmp) / path.stem
            argv = ["build", "--policy", str(path), "--out", str(dest), "--backend", "none"]
            code = main([*argv, "--no-cache"])  # computed, not recalled
            report = json.loads((dest / "report.json").read_text())
            for key in VOLATILE:
                report.pop(key, None)
            out[path.stem] = {"exit_code": code, "report": report}
    return out


def freeze_data(policies: list[Path], folder: Path) -> None:
    """Each policy again, its inputs read from an .npz of the feeds the current code makes."""
    import numpy as np
    import yaml

    from trtbuild.accuracy.data import make_feeds
    from trtbuild.cache import Cache
    from trtbuild.front import prepared_graph
    from trtbuild.policy import load_policy
    from trtbuild.policy.load import read_yaml

    (folder / "policies").mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for path in policies:
        policy = load_policy(path)
        prepared, _ = prepared_graph(policy.model, policy.passes, Cache(enabled=False))
        feeds = make_feeds(policy, prepared.model)
        npz = (folder / "data" / f"{path.stem}.npz").resolve()
        np.savez(npz, **{name: np.stack([f[name] for f in feeds]) for name in feeds[0]})
        raw = read_yaml(path.read_text(encoding="utf-8"))
        raw["model"] = str(policy.model)
        inputs = raw.get("inputs") or {}
        for name in feeds[0]:
            inputs[name] = {**(inputs.get(name) or {}), "data": {"file": str(npz)}}
        raw["inputs"] = inputs
        (folder / "policies" / path.name).write_text(yaml.safe_dump(raw, sort_keys=False))


def normalized(value: Any) -> Any:
    """The report with its per-tensor lists keyed by tensor (depth dropped), recursively."""
    if isinstance(value, dict):
        out = {k: normalized(v) for k, v in value.items()}
        if isinstance(out.get("error_curve"), list):
            curve = out["error_curve"]
            out["error_curve"] = {p["tensor"]: {**p, "depth": None} for p in curve}
        if isinstance(out.get("at_risk"), list):
            out["at_risk"] = {f"{r['node']} {r['quantity']}": r for r in out["at_risk"]}
        return out
    return value


def differences(before: Any, after: Any, where: str = "") -> list[str]:
    """Every path at which two JSON values differ, as ``path: before -> after``."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after), key=str):
            if key not in after or key not in before:
                found.append(f"{where}.{key}: only in {'before' if key in before else 'after'}")
            else:
                found.extend(differences(before[key], after[key], f"{where}.{key}"))
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            d
            for i, (b, a) in enumerate(zip(before, after))
            for d in differences(b, a, f"{where}[{i}]")
        ]
    return [] if _same(before, after) else [f"{where}: {before!r} -> {after!r}"]


def _same(before: Any, after: Any) -> bool:
    """Equal, NaN to NaN included (a figure no sample defined, in both reports)."""
    both_nan = isinstance(before, float) and isinstance(after, float) and before != before
    return before == after or (both_nan and after != after)


def main(argv: list[str] | None = None) -> int:
    """Write or compare a snapshot of the example policies' figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, metavar="SNAPSHOT.json")
    group.add_argument("--against", type=Path, metavar="SNAPSHOT.json")
    group.add_argument("--freeze-data", type=Path, metavar="DIR")
    parser.add_argument("--policies", type=Path, default=ROOT / "policies")
    args = parser.parse_args(argv)
    if args.freeze_data:
        freeze_data(sorted(args.policies.glob("*.yaml")), args.freeze_data)
        print(
            f"wrote {args.freeze_data}/policies and data: use --policies {args.freeze_data}/policies"
        )
        return 0
    current = snapshot(sorted(args.policies.glob("*.yaml")))
    if args.write:
        args.write.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.write}: {len(current)} policies")
        return 0
    found = differences(normalized(json.loads(args.against.read_text())), normalized(current))
    for line in found:
        print(line)
    print(
        f"{len(current)} policies: "
        + ("identical figures" if not found else f"{len(found)} difference(s)")
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
