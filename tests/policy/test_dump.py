"""A policy written back (`to_dict`, `to_yaml`) reads as the same policy (`from_dict`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trtbuild.errors import UsageError
from trtbuild.policy import Policy, load_policy, parse_policy
from trtbuild.policy.load import PolicyLoader
from trtbuild.policy.specs import Match, Rule, Tolerance

POLICIES = sorted((Path(__file__).resolve().parents[2] / "policies").glob("*.yaml"))


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.stem)
def test_every_example_policy_round_trips(path, tmp_path):
    """`to_dict` anywhere; `to_yaml` beside it (its text) and elsewhere (paths re-based), and
    what `yaml.safe_load` makes of a file (YAML 1.1: `1e-2` a string) is read as the file."""
    policy = load_policy(path)
    assert Policy.from_dict(policy.to_dict(), base_dir="/", name=path.stem) == policy
    assert policy.to_yaml() == path.read_text()  # the file itself, every comment kept
    moved = tmp_path / "sub" / f"{path.stem}.yaml"
    again = parse_policy(policy.to_yaml(moved), moved)
    assert again == policy
    raw = yaml.safe_load(path.read_text())
    assert Policy.from_dict(raw, base_dir=path.parent, name=path.stem) == policy
    changed = policy.with_rules(Rule("extra", Match(op=("Exp",)), "fp32"))  # written anew
    text = changed.to_yaml(moved)
    assert parse_policy(text, moved) == changed and text != policy.to_yaml(moved)


def test_from_dict_resolves_paths_against_base_dir_and_names_the_field(tmp_path):
    policy = Policy.from_dict({"version": 1, "model": "m.onnx"}, base_dir=tmp_path, name="mine")
    assert policy.model == (tmp_path / "m.onnx").resolve() and policy.name == "mine"
    with pytest.raises(UsageError, match=r"precision\.default: str 'fp8' is not one of") as info:
        Policy.from_dict({"version": 1, "model": "m.onnx", "precision": {"default": "fp8"}})
    assert info.value.where == "<policy policy>"  # as its later errors and its record name it


def test_from_dict_leaves_the_mapping_as_it_was():
    doc = {"version": 1, "model": "m.onnx", "accuracy": {"tolerances": {"default": {"atol": 1}}}}
    Policy.from_dict(doc)
    assert doc == {
        "version": 1,
        "model": "m.onnx",
        "accuracy": {"tolerances": {"default": {"atol": 1}}},
    }


def test_values_beside_the_examples_round_trip_too(tmp_path):
    """Keys no example sets are written from the field table as well: an index tolerance of
    0, a file's derivation, a metric-only output, an empty guard list, an op-less match (a
    file's range is refused: a file's values are its own)."""
    (tmp_path / "d.npz").write_bytes(b"")
    doc = {
        "version": 1,
        "model": "m.onnx",
        "inputs": {"x": {"shape": [1, 4], "data": {"file": "d.npz", "derive": "synthetic"}}},
        "passes": {"freeze_inputs": {"sr": [1, 2]}, "override_input_shapes": {"x": [1, "n"]}},
        "precision": {
            "guards": [],
            "rules": [{"id": "r", "match": {"pattern": "layernorm"}, "precision": "fp32"}],
        },
        "accuracy": {
            "tolerances": {
                "default": {"compare": "indices", "index_tolerance": 0, "top_k": 3},
                "outputs": {"y": {"psnr_threshold": 30}},
            }
        },
    }
    policy = Policy.from_dict(doc, base_dir=tmp_path)
    again = Policy.from_dict(yaml.safe_load(policy.to_yaml()), base_dir=tmp_path)
    assert again == policy
    assert again.accuracy.default_tolerance.index_tolerance == 0
    assert again.inputs[0].data.derive == "synthetic" and again.precision.guards == ()


def test_a_policy_of_scalars_only_is_written_as_yaml(tmp_path):
    """Only `version` and `model` at the top beside a flow-style `precision` (the layout
    `tune` cannot edit, so it writes the value): each top-level key on a line of its own
    (PyYAML wrote `{version: 1, model: m.onnx}` and then `precision:`, no YAML)."""
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nmodel: m.onnx\nprecision: {default: fp16, rules: []}\n")
    policy = load_policy(path)
    changed = policy.with_rules(Rule("extra", Match(op=("Exp",)), "fp32"))
    text = changed.to_yaml(path)
    assert text.splitlines()[:2] == ["version: 1", "model: m.onnx"]
    assert parse_policy(text, path) == changed


def test_an_output_judged_without_the_simple_check_round_trips_through_to_dict():
    """`to_dict` writes every value, the default tolerance's `atol` too, and the loader
    reads each output's keys over the default's: a `compare: indices` output read back
    was judged by atol again (its logits, as values)."""
    doc = {
        "version": 1,
        "model": "m.onnx",
        "accuracy": {
            "tolerances": {
                "outputs": {"logits": {"compare": "indices", "top_k": 1}, "y": {"atol": 0.5}}
            }
        },
    }
    policy = Policy.from_dict(doc)
    tolerance = dict(policy.accuracy.output_tolerances)
    assert tolerance["logits"].checks() == ("indices",) and tolerance["y"].simple
    assert Policy.from_dict(policy.to_dict()) == policy


def test_compare_values_alone_is_judged_by_the_simple_check():
    """`compare: values` (the default) is no check of its own: alone it left an output judged
    by nothing, and every output passed."""
    doc = {"version": 1, "model": "m.onnx"}
    doc["accuracy"] = {"tolerances": {"default": {"compare": "values"}}}
    assert Policy.from_dict(doc).accuracy.default_tolerance.checks() == ("simple",)
    assert Tolerance(simple=False).checks() == ("simple",)  # the library's value alike


@pytest.mark.parametrize(
    "text",
    [
        # the last line without its newline: the rules were run into `default: fp16`
        "version: 1\nmodel: m.onnx\nprecision:\n  default: fp16",
        "version: 1\nmodel: m.onnx\nprecision:\n  rules:\n    - {id: a, match: {op: [Add]}}",
        # a dash followed by more than one space: the rules were indented under the last one
        "version: 1\nmodel: m.onnx\nprecision:\n    rules:\n        -   id: a\n"
        "            match: {op: [Add]}\n    default: fp16\n",
    ],
)
def test_rules_are_added_to_any_block_layout_a_person_writes(text):
    """`with_rules` (what `tune` writes its pins with) gives YAML holding the rules after
    the policy's own, for layouts its first version wrote unreadable YAML for."""
    from trtbuild.policy.text import with_rules

    edited = with_rules(text, ["# why", "- {id: t1, match: {name: ^m2$}, precision: fp32}"])
    rules = yaml.safe_load(edited)["precision"]["rules"]
    assert rules[-1] == {"id": "t1", "match": {"name": "^m2$"}, "precision": "fp32"}
    assert [r["id"] for r in rules[:-1]] == ([] if "rules" not in text else ["a"])


def test_a_name_yaml_reads_as_a_number_is_written_quoted(tmp_path):
    """An input, output or rule named `1e3` (a number to the policy loader, whose YAML reads
    `1e-3` as users mean it) was written bare by `to_yaml` and `save`, and the file said
    `keys must be strings, got float 1000.0`: every name round-trips."""
    (tmp_path / "m.onnx").write_bytes(b"")
    doc = {
        "version": 1,
        "model": "m.onnx",
        "inputs": {"1e3": {"shape": [1, 4]}},
        "precision": {"rules": [{"id": "1e3", "match": {"name": "1E-3"}, "precision": "fp32"}]},
        "accuracy": {"tolerances": {"outputs": {"-2e5": {"atol": 0.5}}}},
    }
    policy = Policy.from_dict(doc, base_dir=tmp_path, name="p")
    saved = policy.save(tmp_path / "p.yaml")
    assert saved == policy == load_policy(tmp_path / "p.yaml")
    read = yaml.load(policy.to_yaml(), Loader=PolicyLoader)
    assert Policy.from_dict(read, base_dir=tmp_path, name="p") == policy
