"""Writing what `tune` found: the tuned policy, its log, the progress bar, argument checks.

Why a readable policy rather than a list of node names: the user keeps and edits
the result, so it is the original policy with one commented rule per pinned
group, each comment saying the measured error that made the pin necessary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from trtbuild.accuracy.progress import StatusLine
from trtbuild.errors import UsageError
from trtbuild.front import Front
from trtbuild.tuning.search import Trial, TuneResult

OBJECTIVES = ("nodes", "flops")


def _rel(path: Path, start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)


def _flow(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000)
    return text.split("\n...")[0].strip()  # a bare scalar ends with a document marker


def _rebase(value: str, here: Path, there: Path) -> str:
    """A path written relative to the source policy, relative to the tuned one; absolute stays."""
    if Path(value).is_absolute() or "://" in value:
        return value
    return _rel((here / value).resolve(), there)


def _schema_line(text: str, here: Path, there: Path) -> list[str]:
    """The editor's `$schema` comment from the policy's header, re-based to `there`."""
    marker = "# yaml-language-server: $schema="
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(marker):
            return [marker + _rebase(line[len(marker) :].strip(), here, there)]
    return []


def tuned_yaml(front: Front, result: TuneResult, out: Path, seed: int, objective: str) -> str:
    """The original policy, then one commented rule per pinned group; paths re-based to `out`."""
    import yaml

    from trtbuild.policy.load import read_yaml

    policy = front.policy
    text = policy.path.read_text(encoding="utf-8")
    raw = read_yaml(text)
    here, there = policy.path.parent, out.resolve().parent
    raw["model"] = _rebase(raw["model"], here, there)
    for spec in (raw.get("inputs") or {}).values():
        data = (spec or {}).get("data") or {}
        for key in ("file", "images"):
            if key in data:
                data[key] = _rebase(data[key], here, there)
    for point in ((raw.get("accuracy") or {}).get("shapes") or {}).values():
        data = (point or {}).get("data")
        if isinstance(data, dict) and "file" in data:  # a list is an input named `data`
            data["file"] = _rebase(data["file"], here, there)
    accuracy = raw.get("accuracy") or {}
    if accuracy.get("reference_model"):  # the model before quantization
        accuracy["reference_model"] = _rebase(accuracy["reference_model"], here, there)
    build = raw.get("build") or {}
    if build.get("timing_cache"):
        build["timing_cache"] = _rebase(build["timing_cache"], here, there)
    precision = raw.pop("precision", {}) or {}
    rules = precision.pop("rules", []) or []
    verdict = "passes" if result.passed else "DOES NOT PASS"
    verdict += " (budget exhausted)" if result.exhausted else ""
    lines = [
        *_schema_line(text, here, there),
        f"# Tuned by `trtbuild tune` from {_rel(policy.path, there)}: {verdict} with "
        f"{result.low_share:.1%} of compute nodes in {result.low.upper()},",
        f"# {len(result.pinned)} group(s) pinned after {len(result.trials)} evaluation(s) "
        f"(evaluator emulated-fp16, emulation {policy.accuracy.emulation}, "
        f"objective {objective}, seed {seed}).",
    ]
    lines.append(yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=100).rstrip())
    lines.append("precision:")
    for key, value in precision.items():
        lines.append(f"  {key}: {_flow(value)}")
    lines.append("  rules:")
    if rules:
        lines.append("    # the policy's own rules, unchanged")
        lines += [f"    - {_flow(rule)}" for rule in rules]
    for k, rule in zip(result.pinned, result.policy.rules[len(rules) :]):
        lines.append(f"    # {result.groups[k].label}: {result.reasons[k]}")
        entry = {"id": rule.id, "match": {"name": rule.match.name}, "precision": "fp32"}
        lines.append(f"    - {_flow(entry)}")
    if not rules and not result.pinned:
        lines[-1] = "  rules: []   # every tolerance holds with no FP32 pin"
    return "\n".join(lines) + "\n"


def write_log(path: Path, result: TuneResult) -> None:
    """One JSON line per evaluation, in the order they were recorded."""
    from trtbuild.fsutil import write_text

    rows = []
    for t in result.trials:
        rows.append(
            json.dumps(
                {
                    "step": t.step,
                    "action": t.action,
                    "pinned_groups": [result.groups[k].label for k in t.pinned],
                    "passed": t.passed,
                    "low_share": t.low_share,
                    "failing": t.failing,
                    "max_abs": t.worst,
                    "seconds": t.seconds,
                }
            )
        )
    write_text(path, "\n".join(rows) + "\n")


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, stream: TextIO | None = None, width: int = 24):
        self.line = StatusLine(stream)
        self.width = width

    def __call__(self, trial: Trial, budget: int) -> None:
        filled = min(self.width, round(self.width * trial.step / max(budget, 1)))
        bar = "#" * filled + "." * (self.width - filled)
        state = "pass" if trial.passed else "fail"
        self.line.write(
            f"tune [{bar}] {trial.step}/{budget} {state} {trial.low_share:.1%}  {trial.action[:60]}"
        )

    def done(self) -> None:
        self.line.done()


def check_args(budget: int, objective: str, jobs: int = 1) -> None:
    """Refuse arguments no search can use (exit 2, before any work)."""
    if budget < 1:
        raise UsageError("--budget must be at least 1")
    if not 1 <= jobs <= 256:
        raise UsageError("--jobs must be between 1 and 256")
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}")


def check_output(policy, output: Path, force: bool) -> None:
    """Refuse to overwrite the policy being tuned: its comments and rules would be lost."""
    if output.resolve() == policy.path.resolve() and not force:
        raise UsageError(
            "-o names the policy being tuned; writing there would replace it and lose its comments",
            where=str(output),
            hint="write the tuned policy to another file, or pass --force to replace it",
        )


def check_policy(policy) -> None:
    """Tuning pins nodes to FP32, so it needs a policy whose default is a low precision."""
    if policy.precision.default == "fp32":
        raise UsageError(
            "precision.default: tune pins nodes to FP32, and this policy's default is already fp32",
            where=str(policy.path),
            hint="set precision.default: fp16 (or bf16) and let tune find what must stay fp32",
        )
