"""A policy written back (`to_dict`, `to_yaml`) reads as the same policy (`from_dict`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trtbuild.errors import UsageError
from trtbuild.policy import Policy, load_policy

POLICIES = sorted((Path(__file__).resolve().parents[2] / "policies").glob("*.yaml"))


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.stem)
def test_every_example_policy_round_trips(path):
    policy = load_policy(path)
    again = Policy.from_dict(yaml.safe_load(policy.to_yaml()), base_dir="/", name=path.stem)
    assert again == Policy(**{**policy.__dict__, "path": again.path})
    assert Policy.from_dict(policy.to_dict(), base_dir="/", name=path.stem) == again


def test_from_dict_resolves_paths_against_base_dir_and_names_the_field(tmp_path):
    policy = Policy.from_dict({"version": 1, "model": "m.onnx"}, base_dir=tmp_path, name="mine")
    assert policy.model == (tmp_path / "m.onnx").resolve() and policy.stem == "mine"
    with pytest.raises(UsageError, match=r"precision\.default: str 'fp8' is not one of") as info:
        Policy.from_dict({"version": 1, "model": "m.onnx", "precision": {"default": "fp8"}})
    assert info.value.where == "<mapping>"


def test_from_dict_leaves_the_mapping_as_it_was():
    doc = {"version": 1, "model": "m.onnx", "accuracy": {"tolerances": {"default": {"atol": 1}}}}
    Policy.from_dict(doc)
    assert doc == {
        "version": 1,
        "model": "m.onnx",
        "accuracy": {"tolerances": {"default": {"atol": 1}}},
    }
