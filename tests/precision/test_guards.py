"""Hugging Face exports out of the box: the weight-range guard and the mask sentinel.

The BERT-style example carries `transformers`' extended attention mask,
`(1 - mask) * finfo(float32).min`. In FP16 the constant is -inf and `0 x -inf`
is NaN at every unmasked position; the built-in guard keeps that Mul in FP32.
"""

from __future__ import annotations

import json

from trtbuild.cli import main


def _build(policy, out) -> tuple[int, dict]:
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    return code, json.loads((out / "report.json").read_text())


def test_check_names_the_guard_on_the_mask_node(example_policy, capsys):
    assert main(["check", "--policy", str(example_policy("bert")), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert rows["/mask/Mul"]["precision"] == "fp32"
    assert rows["/mask/Mul"]["rule"] == "guard:weight-range"
    assert "3.403e+38" in rows["/mask/Mul"]["reason"]


def test_a_layernorm_policy_passes_with_the_guard_named_in_the_report(example_policy, tmp_path):
    code, report = _build(example_policy("bert"), tmp_path / "b")
    assert code == 0 and report["passed"]
    pinned = {p["node"]: p["rule"] for p in report["precision"]["pinned"]}
    assert pinned["/mask/Mul"] == "guard:weight-range"
    assert report["precision"]["rule_hits"]["guard:weight-range"] == 1
    assert not any("boundary" in w for w in report["warnings"])  # the sentinel is not data


def test_guards_false_gives_back_the_nan_failure_with_its_first_divergence(
    example_policy, tmp_path
):
    policy = example_policy("bert", replace={"guards: true ": "guards: false"})
    code, report = _build(policy, tmp_path / "b")
    assert code == 1 and not report["passed"]
    assert report["first_divergence"]["node"] == "/mask/Mul"
    assert "NaN" in report["first_divergence"]["reason"]
    assert "guard:weight-range" not in report["precision"]["rule_hits"]


def test_a_user_rule_naming_the_node_wins_over_the_guard(example_policy, capsys):
    rule = '[{id: mine, match: {name: "^/mask/Mul$"}, precision: fp16}]'
    assert main(["check", "--policy", str(example_policy("bert", rules=rule)), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert rows["/mask/Mul"]["rule"] == "mine" and rows["/mask/Mul"]["precision"] == "fp16"


def test_a_guard_list_keeps_only_the_named_guards(example_policy, capsys):
    def mask_rule(guards: str) -> str:
        policy = example_policy("bert", replace={"guards: true ": f"guards: {guards}"})
        capsys.readouterr()
        assert main(["check", "--policy", str(policy), "--json"]) == 0
        rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
        return rows["/mask/Mul"]["rule"]

    assert mask_rule("[weight-range]") == "guard:weight-range"
    assert mask_rule("[]") == "default"
