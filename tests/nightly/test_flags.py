"""The nightly flags what a pass alone does not say: data that does not exercise the model
and a masked overflow that was only warned; a masked overflow that fails is named (#42)."""

from __future__ import annotations

import json

from tests.accuracy import test_flat_outputs as flat
from tests.accuracy import test_masked_overflow as masked
from trtbuild.cli import main


def test_the_night_flags_flat_data_and_a_warned_overflow(tmp_path, capsys):
    policies = tmp_path / "policies"
    policies.mkdir()
    flat._policy(policies, high=1.0)  # flat_1.yaml: y ~2e-9 everywhere
    data = "{distribution: uniform, low: 0.0, high: 100.0}"
    masked._policy(policies, rule="warn", data=data)  # masked_warn.yaml
    masked._policy(policies, rule="fail", data=data)  # masked_fail.yaml
    out, history = tmp_path / "night", tmp_path / "h.sqlite"
    args = ["nightly", "--policies", str(policies), "--out", str(out), "--history", str(history)]
    assert main([*args, "--backend", "none", "--run-id", "n1"]) == 1  # masked_fail fails
    printed = capsys.readouterr().out
    assert (
        "FLAG flat_1: data does not exercise the model: y nearly constant at min, opt, max"
        in printed
    )
    assert "FLAG masked_warn: masked overflow at shape: /scale (Mul), warned only" in printed
    assert (
        "FAIL masked_fail: masked overflow: /scale (Mul) (accuracy.masked_overflow: fail)"
        in printed
    )
    results = {r["policy"]: r for r in json.loads((out / "nightly.json").read_text())["results"]}
    assert results["flat_1"]["status"] == "pass" and results["flat_1"]["flags"]
    assert results["masked_warn"]["status"] == "pass" and results["masked_warn"]["flags"]
    assert "data does not exercise the model" in (out / "summary.md").read_text()
    # the history keeps them: the night's summary from the history alone says the same
    summary = ["summary", "--history", str(history), "--run-id", "n1", "--out", str(tmp_path / "s")]
    assert main(summary) == 1
    again = capsys.readouterr().out
    assert "FLAG flat_1:" in again and "FLAG masked_warn:" in again
