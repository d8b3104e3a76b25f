"""trtbuild/nightly/summary.py: the lanes a night's results are side by side in."""

from __future__ import annotations

from trtbuild.nightly.runner import CPU_LANE, PolicyResult
from trtbuild.nightly.summary import lanes_section


def _judged(policy: str, status: str, device: str = CPU_LANE) -> PolicyResult:
    return PolicyResult(
        policy=policy,
        path=f"{policy}.yaml",
        status=status,
        exit_code=0 if status == "pass" else 1,
        evaluator="emulated-fp16",
        emulation="storage",
        device=device,
    )


def _errored(policy: str, device: str = CPU_LANE) -> PolicyResult:
    return PolicyResult(
        policy=policy, path=f"{policy}.yaml", status="error", exit_code=2, device=device
    )


def test_a_policy_that_ended_before_judging_is_no_lane_of_its_own():
    """One lane tonight: the errored policy is a cell of it, and no lanes section is drawn."""
    lanes = lanes_section([_judged("nafnet", "pass"), _errored("gfpgan")], [])
    assert lanes.head == ["policy", f"{CPU_LANE} (emulated-fp16 (storage))"]
    assert lanes.rows == [["gfpgan", "error"], ["nafnet", "pass"]]
    assert not lanes.shown()


def test_an_error_on_a_device_no_policy_was_judged_on_is_that_devices_lane():
    lanes = lanes_section([_judged("nafnet", "pass"), _errored("nafnet", device="L4")], [])
    assert lanes.head == ["policy", "L4 (–)", f"{CPU_LANE} (emulated-fp16 (storage))"]
    assert lanes.split == [
        f"nafnet passes on {CPU_LANE} (emulated-fp16 (storage)) but fails on L4 (–)"
    ]


def test_a_device_none_of_whose_shards_reported_is_missing(tmp_path, capsys):
    """The workflow's matrix is shards x GPU kinds. Every H100 job lost (its runners offline):
    a device's missing shards are counted from what it recorded, so the H100 left no trace
    and the summary of the A10's lanes said every result passes, exit 0."""
    from tests.nightly.test_retry import _record, _result
    from trtbuild.cli import main

    history, started = str(tmp_path / "h.sqlite"), "2026-11-24T02:00:00+00:00"
    for k, policy in ((1, "a"), (2, "b")):
        _record(history, "9", [_result(policy, "pass", 0.1, "NVIDIA A10")], started, k, 2, "A10")
    argv = ["summary", "--history", history, "--run-id", "9", "--out", str(tmp_path / "s")]
    assert main([*argv, "--shards", "2"]) == 0  # nothing says a second device was due
    capsys.readouterr()
    assert main([*argv, "--shards", "2", "--devices", "2"]) == 1
    said = capsys.readouterr().out
    assert "MISSING device 2 of 2 (reported: A10): it did not report" in said
    assert "ALL PASS" not in (tmp_path / "s" / "summary.md").read_text()
    assert 'failures="1"' in (tmp_path / "s" / "junit.xml").read_text()
    assert main([*argv, "--devices", "1"]) == 0
    assert main([*argv, "--devices", "-1"]) == 2


def test_each_device_of_a_policy_has_its_own_trend(tmp_path):
    """Two GPU kinds: the trend plots were keyed by policy alone, so the last device's plot
    stood under every row of the policy (the H100's failing night unshaded beside its FAIL,
    or the A10's passes shown as the H100's)."""
    from tests.nightly.test_retry import _record, _result
    from trtbuild.cli import main

    history = str(tmp_path / "h.sqlite")
    for night, h100 in (("1", "pass"), ("2", "fail")):
        started = f"2026-11-2{night}T02:00:00+00:00"
        _record(history, night, [_result("a", "pass", 0.1, "NVIDIA A10")], started, 1, 1, "A10")
        _record(history, night, [_result("a", h100, 0.2, "NVIDIA H100")], started, 1, 1, "H100")
    out = tmp_path / "s"
    assert main(["summary", "--history", history, "--run-id", "2", "--out", str(out)]) == 1
    plots = sorted(p.name for p in (out / "trends").iterdir())
    assert plots == ["a @ NVIDIA A10.png", "a @ NVIDIA H100.png"]
    assert (out / "trends" / plots[0]).read_bytes() != (out / "trends" / plots[1]).read_bytes()
    summary = (out / "summary.md").read_text()
    assert "![a @ NVIDIA A10](trends/a%20%40%20NVIDIA%20A10.png)" in summary
    assert "![a @ NVIDIA H100](trends/a%20%40%20NVIDIA%20H100.png)" in summary
    assert "href='a/report.html'" in (out / "summary.html").read_text()


def test_a_runs_device_is_a_judged_results_not_an_early_errors():
    """An A10 shard whose first policy errored (no evaluator: `cpu-emulation`) was run on
    `cpu-emulation`, as was the H100's shard of the same policies: one device, so the later
    run's results superseded the other's, and the A10's failures vanished."""
    from trtbuild.nightly import _device

    results = [_errored("a", CPU_LANE), _judged("b", "fail", "NVIDIA A10")]
    assert _device(results) == "NVIDIA A10"
    assert _device([_errored("a", CPU_LANE)]) == CPU_LANE
    assert _device([]) == CPU_LANE


def test_an_a10_failure_beside_an_early_error_survives_the_h100s_shard(tmp_path):
    """The same shard on two GPU kinds, each run's device as `nightly` gives it: the A10's
    failure of `b` stays in the night beside the H100's pass."""
    import json

    from tests.nightly.test_retry import _record
    from trtbuild.cli import main
    from trtbuild.nightly import _device

    history, started = str(tmp_path / "h.sqlite"), "2026-11-24T02:00:00+00:00"
    for gpu, status in (("NVIDIA A10", "fail"), ("NVIDIA H100", "pass")):
        results = [_errored("a", CPU_LANE), _judged("b", status, gpu)]
        _record(history, "7", results, started, 1, 1, _device(results))
    out = tmp_path / "s"
    assert main(["summary", "--history", history, "--run-id", "7", "--out", str(out)]) == 1
    found = json.loads((out / "nightly.json").read_text())["results"]
    assert ("b", "fail", "NVIDIA A10") in {(r["policy"], r["status"], r["device"]) for r in found}
