"""Regressions: tonight's results against each policy's last passing night."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trtbuild.nightly.history import History, number
from trtbuild.nightly.runner import PolicyResult

GROWTH = ("max_abs", "median_abs")  # the errors whose growth counts as a regression


@dataclass
class Regression:
    policy: str
    kind: str  # "pass→fail", "pass→error", "error grew"
    detail: str
    since: str | None = None  # started-time of the last passing run
    device: str | None = None  # the lane's device: a GPU's name, or cpu-emulation


def regressions(
    history: History,
    run_id: int,
    results: list[PolicyResult],
    margin: float,
    night: str | None = None,
) -> list[Regression]:
    """Each policy against its last passing run before `run_id` in the same lane.

    A lane is the evaluator, the emulation, the backend and the device (a GPU's
    name, or `cpu-emulation`): a night judged on an A10 is not compared with one on
    an H100, nor with a night emulated on a CPU. The other shards of `night` are
    not "before" it. A result that errored before it was judged has no evaluator
    and is compared with its device's last pass.
    """
    found = []
    for r in results:
        last = history.last_pass(r, run_id, night)
        if last is None:
            continue
        since, changed = last["started"], _changed(r, last)
        if r.status != "pass":
            kind = "pass→fail" if r.status == "fail" else "pass→error"
            said = r.message.splitlines()[0] if r.message else ""
            found.append(Regression(r.policy, kind, said + changed, since, r.device))
            continue
        before = history.outputs(last["run_id"], r.policy)
        for name, m in r.outputs.items():
            found += _growth(r, name, m, before.get(name), margin, changed, since)
    return found


def _growth(r, name, m, old, margin, changed, since) -> list[Regression]:
    """An output whose error grew past the margin since the last pass."""
    out = []
    for key in GROWTH if old is not None else ():
        now, then = number(m.get(key)), old[key]
        if now is None or then is None:
            continue
        if now > then * (1 + margin) and now - then > 1e-12:
            grew = f"{_grew(then, now)}, margin {_percent(margin)}"
            detail = f"{name}.{key} {then:.4g} → {now:.4g} ({grew})"
            out.append(Regression(r.policy, "error grew", detail + changed, since, r.device))
    return out


def _grew(then: float, now: float) -> str:
    """How much an error grew, in words that are true: from an exact 0 (an all-FP32 policy)
    or to an infinite error there is no finite ratio, and `+inf%` reads as a bug."""
    if then == 0:
        return "from exactly 0"
    if not math.isfinite(now):
        return "to no finite error"
    return f"+{_percent(now / then - 1)}"


def _percent(share: float) -> str:
    """A growth or a margin in percent to three digits: `26%`, `0.45%`, not `0%` for a
    margin of 0.004 (a regression of `+0%, margin 0%` reads as no growth at all)."""
    return f"{share * 100:.3g}%"


def _changed(r: PolicyResult, last: dict) -> str:
    """What changed since the last pass: the model, the policy, TensorRT, or none of them."""
    what = [
        name
        for name, now, then in (
            ("model", r.model_sha256, last["model_sha256"]),
            ("policy", r.policy_sha256, last["policy_sha256"]),
            ("TensorRT version", r.trt_version, last.get("trt_version")),
        )
        if now and then and now != then
    ]
    if not what:
        return "; model and policy unchanged since that pass"
    return f"; the {' and the '.join(what)} changed since that pass"


def by_policy(found: list[Regression]) -> dict[str, list[Regression]]:
    grouped: dict[str, list[Regression]] = {}
    for g in found:
        grouped.setdefault(g.policy, []).append(g)
    return grouped
