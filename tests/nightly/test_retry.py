"""A shard re-run under its night's id (a CI retry) supersedes its earlier attempt (issue #34).

Before: the retry added a second result, so one earlier failure made that night's
`summary` exit 1 for ever. Now the last attempt of a night, shard, device and policy
counts, in the summary, the regressions and the trends; every attempt stays in the
history. With SQLite and with a real PostgreSQL server alike (`history_target`).
"""

from __future__ import annotations

import json

from tests.nightly.test_shards import _names, _policies
from trtbuild.cli import main
from trtbuild.nightly.history import open_history
from trtbuild.nightly.runner import CPU_LANE, PolicyResult


def _result(policy: str, status: str, median: float, device: str = CPU_LANE) -> PolicyResult:
    out = {"passed": status == "pass", "max_abs": median * 2, "median_abs": median}
    return PolicyResult(
        policy=policy,
        path="",
        status=status,
        exit_code=0 if status == "pass" else 1,
        message="" if status == "pass" else "outputs below tolerance: y",
        evaluator="onnxruntime",
        emulation="storage",
        backend="none",
        device=device,
        outputs={"y": out},
    )


def _record(history, night, results, started, shard=1, shards=1, device=CPU_LANE) -> int:
    run = {"night": night, "device": device}
    if shards > 1:
        run.update(shard=shard, shards=shards)
    db = open_history(history)
    try:
        return db.record(started, results, {}, **run)
    finally:
        db.close()


def _summary(history, night, out) -> int:
    return main(["summary", "--history", history, "--run-id", night, "--out", str(out)])


def test_a_retried_shard_supersedes_its_failed_attempt(tmp_path, history_target, capsys):
    started = "2026-11-24T02:00:00+00:00"
    _record(history_target, "77", [_result("a", "fail", 1.0), _result("b", "pass", 0.1)], started)
    assert _summary(history_target, "77", tmp_path / "s1") == 1
    _record(history_target, "77", [_result("a", "pass", 0.1), _result("b", "pass", 0.1)], started)
    capsys.readouterr()
    assert _summary(history_target, "77", tmp_path / "s2") == 0
    said = capsys.readouterr().out
    assert "FAIL" not in said
    night = json.loads((tmp_path / "s2" / "nightly.json").read_text())
    assert sorted(r["policy"] for r in night["results"]) == ["a", "b"]  # one result each
    db = open_history(history_target)
    try:
        runs, found = db.night("77")
        assert [r["attempt"] for r in runs] == [1, 2]  # both attempts are kept for the record
        assert [r.status for _, r in found] == ["pass", "pass"]
        assert [t["status"] for t in db.trend("a", CPU_LANE)] == ["pass"]  # one point a night
    finally:
        db.close()


def test_the_last_attempt_counts_when_it_is_the_failing_one(tmp_path, history_target):
    """A pass superseded by a failing retry is no baseline for the next night either."""
    _record(history_target, "1", [_result("a", "pass", 0.1)], "2026-11-22T02:00:00+00:00")
    _record(history_target, "2", [_result("a", "pass", 0.1)], "2026-11-23T02:00:00+00:00")
    _record(history_target, "2", [_result("a", "fail", 5.0)], "2026-11-23T02:00:00+00:00")
    assert _summary(history_target, "2", tmp_path / "s2") == 1
    _record(history_target, "3", [_result("a", "fail", 5.0)], "2026-11-24T02:00:00+00:00")
    assert _summary(history_target, "3", tmp_path / "s3") == 1
    night = json.loads((tmp_path / "s3" / "nightly.json").read_text())
    (regression,) = night["regressions"]
    assert regression["kind"] == "pass→fail"
    assert regression["since"] == "2026-11-22T02:00:00+00:00"  # not night 2's superseded pass


def test_another_shard_or_device_of_the_night_is_no_retry(tmp_path, history_target):
    started = "2026-11-24T02:00:00+00:00"
    _record(history_target, "9", [_result("a", "fail", 1.0, "NVIDIA A10")], started, 1, 2, "A10")
    _record(history_target, "9", [_result("a", "pass", 0.1, "NVIDIA H100")], started, 1, 2, "H100")
    _record(history_target, "9", [_result("b", "pass", 0.1, "NVIDIA A10")], started, 2, 2, "A10")
    _record(history_target, "9", [_result("b", "pass", 0.1, "NVIDIA H100")], started, 2, 2, "H100")
    assert _summary(history_target, "9", tmp_path / "s") == 1  # the A10's failure stands
    night = json.loads((tmp_path / "s" / "nightly.json").read_text())
    assert len(night["results"]) == 4


def test_a_ci_retry_of_a_shard_through_the_command(tmp_path, models_dir, history_target):
    """The real commands: shard 1 fails (a lost pin), is retried after the fix, and passes."""
    policies = _policies(tmp_path / "policies", models_dir, unpinned=_names()[0])
    base = ["nightly", "--policies", str(policies), "--history", history_target]
    base += ["--backend", "none", "--run-id", "4711"]
    assert main([*base, "--shard", "1/2", "--out", str(tmp_path / "a1")]) == 1
    assert main([*base, "--shard", "2/2", "--out", str(tmp_path / "b1")]) == 0
    assert _summary(history_target, "4711", tmp_path / "s1") == 1
    _policies(policies, models_dir)  # the retry passes
    assert main([*base, "--shard", "1/2", "--out", str(tmp_path / "a2")]) == 0
    assert _summary(history_target, "4711", tmp_path / "s2") == 0
    assert "ALL PASS" in (tmp_path / "s2" / "summary.md").read_text().splitlines()[0]


def test_a_policy_run_in_two_shards_of_different_counts_counts_once(tmp_path, history_target):
    """A night whose matrix changed between attempts: `a` ran in shard 1/2, then (its shard
    follows from the count) in shard 2/3. Each counted, so the night's total held `a` twice
    (and a failure of the superseded run stood beside the later pass). Its later run counts."""
    started = "2026-11-24T02:00:00+00:00"
    _record(history_target, "5", [_result("a", "fail", 1.0)], started, 1, 2)
    _record(history_target, "5", [_result("b", "pass", 0.1)], started, 1, 3)
    _record(history_target, "5", [_result("a", "pass", 0.1)], started, 2, 3)
    _record(history_target, "5", [_result("c", "pass", 0.1)], started, 3, 3)
    assert _summary(history_target, "5", tmp_path / "s") == 0
    night = json.loads((tmp_path / "s" / "nightly.json").read_text())
    assert sorted((r["policy"], r["status"]) for r in night["results"]) == [
        ("a", "pass"),
        ("b", "pass"),
        ("c", "pass"),
    ]
