"""Regressions: tonight's results against each policy's last passing night."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from trtbuild.nightly.history import number
from trtbuild.nightly.runner import PolicyResult

GROWTH = ("max_abs", "median_abs")  # the errors whose growth counts as a regression


@dataclass
class Regression:
    policy: str
    kind: str  # "pass→fail", "pass→error", "error grew"
    detail: str
    since: str | None = None  # started-time of the last passing run


def regressions(
    db: sqlite3.Connection, run_id: int, results: list[PolicyResult], margin: float
) -> list[Regression]:
    """Each policy against its last passing run before `run_id` in the same lane.

    A lane is the evaluator, the emulation and the backend: a night judged on a GPU
    is not compared with a night emulated on a CPU (a result that errored before it
    was judged has no lane and is compared with the policy's last pass anywhere).
    """
    found = []
    for r in results:
        lane = (
            ""
            if r.evaluator is None
            else (" AND r.evaluator IS ? AND r.emulation IS ? AND r.backend IS ?")
        )
        args = () if r.evaluator is None else (r.evaluator, r.emulation, r.backend)
        last = db.execute(
            "SELECT r.run_id, runs.started, r.model_sha256, r.policy_sha256 "
            "FROM results r JOIN runs ON runs.id = r.run_id "
            f"WHERE r.policy = ? AND r.status = 'pass' AND r.run_id < ?{lane} "
            "ORDER BY r.run_id DESC LIMIT 1",
            (r.policy, run_id, *args),
        ).fetchone()
        if last is None:
            continue
        since = last["started"]
        changed = _changed(r, last)
        if r.status != "pass":
            kind = "pass→fail" if r.status == "fail" else "pass→error"
            said = r.message.splitlines()[0] if r.message else ""
            found.append(Regression(r.policy, kind, said + changed, since))
            continue
        before = {
            row["output"]: row
            for row in db.execute(
                "SELECT * FROM outputs WHERE run_id = ? AND policy = ?", (last["run_id"], r.policy)
            )
        }
        for name, m in r.outputs.items():
            old = before.get(name)
            if old is None:
                continue
            for key in GROWTH:
                now, then = number(m.get(key)), old[key]
                if now is None or then is None:
                    continue
                if now > then * (1 + margin) and now - then > 1e-12:
                    found.append(
                        Regression(
                            r.policy,
                            "error grew",
                            f"{name}.{key} {then:.4g} → {now:.4g} (+{(now / then - 1) if then else float('inf'):.0%}, margin {margin:.0%}){changed}",
                            since,
                        )
                    )
    return found


def _changed(r: PolicyResult, last) -> str:
    """What changed since the last pass: the model, the policy, or neither (the toolchain)."""
    what = [
        name
        for name, now, then in (
            ("model", r.model_sha256, last["model_sha256"]),
            ("policy", r.policy_sha256, last["policy_sha256"]),
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
