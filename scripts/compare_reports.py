"""Snapshot every example policy's report.json figures, or compare with a snapshot.

A refactor that should not change behaviour is checked by taking a snapshot
before it and comparing after it::

    python scripts/compare_reports.py --write before.json     # on the old commit
    python scripts/compare_reports.py --against before.json   # on the new one

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
    return [] if before == after else [f"{where}: {before!r} -> {after!r}"]


def main(argv: list[str] | None = None) -> int:
    """Write or compare a snapshot of the example policies' figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, metavar="SNAPSHOT.json")
    group.add_argument("--against", type=Path, metavar="SNAPSHOT.json")
    parser.add_argument("--policies", type=Path, default=ROOT / "policies")
    args = parser.parse_args(argv)
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
