"""A BF16 policy end to end: its share is counted as BF16 everywhere, the mixed model is valid
though ONNX Runtime's CPU has no BF16 kernels for it, and `tune` limits by BF16's range."""

from __future__ import annotations

import json

from tests.helpers import needs_rtx
from trtbuild.cli import main


def _bf16(example_policy):
    return example_policy(
        "gfpgan",
        rules="[]",
        replace={
            "  default: fp16": "  default: bf16",
            "atol: 1e-2, rtol: 1e-2": "atol: 5e-2, rtol: 5e-2",
        },
    )


@needs_rtx
def test_a_bf16_policy_builds_and_says_bf16(example_policy, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", "--policy", str(_bf16(example_policy)), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("PASSED") and "% BF16," in said.splitlines()[0]
    precision = json.loads((out / "report.json").read_text())["precision"]
    assert precision["low"] == "bf16" and precision["bf16_nodes"] > 0 == precision["fp16_nodes"]
    assert precision["low_share"] > 0.7
    assert "BF16 and" in (out / "report.md").read_text()
    assert (out / "engine.plan").stat().st_size > 0


def test_a_bf16_policys_prose_says_bf16_where_the_contract_keeps_its_names(
    example_policy, tmp_path, capsys
):
    """The verdict's at-risk line and report.md said "no FP16 op's internal sums ... leave
    the FP16 range" of a policy with no FP16 op: the prose names the policy's low precision,
    report.json's keys and evaluator (`emulated-fp16`) stay."""
    out = tmp_path / "out"
    policy = str(_bf16(example_policy))
    assert main(["build", "--policy", policy, "--out", str(out), "--backend", "none"]) == 0
    said = capsys.readouterr().out
    assert "at risk: none (no BF16 op's internal sums or squares leave the BF16 range)" in said
    assert "all-FP16 baseline:" in said  # the baseline is all-FP16 whatever the policy
    report = (out / "report.md").read_text()
    assert "None: no BF16 op's internal quantities leave the BF16 range." in report
    assert "FP16 op" not in report
    found = json.loads((out / "report.json").read_text())
    assert found["evaluator"] == "emulated-fp16" and "fp16_share" in found["precision"]


def test_tune_keeps_in_bf16_what_only_fp16_cannot_hold(example_policy, tmp_path, capsys):
    tuned = tmp_path / "tuned.yaml"
    assert main(["tune", "--policy", str(_bf16(example_policy)), "-o", str(tuned)]) == 0
    assert "rules: []" in tuned.read_text()  # the ~1e7 energy fits BF16: no pin
    assert "% BF16" in capsys.readouterr().out
