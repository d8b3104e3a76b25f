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
