import json
from pathlib import Path

import pytest

from trtbuild.policy import load_policy
from trtbuild.policy.load import read_yaml
from trtbuild.policy.schema import SCHEMA, SchemaViolation, validate

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schema_matches_the_loader():
    """docs/policy.schema.json is what editors read; `make schema` refreshes it."""
    committed = json.loads((ROOT / "docs" / "policy.schema.json").read_text())
    assert committed == SCHEMA, "run `make schema` and commit docs/policy.schema.json"


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.yaml")), ids=lambda p: p.name)
def test_example_policies_validate_and_point_editors_at_the_schema(path):
    text = path.read_text()
    assert text.startswith("# yaml-language-server: $schema=../docs/policy.schema.json")
    load_policy(path)


@pytest.mark.parametrize("text", ["1e-3", "1E-3", "+1e-3", "1.e-3", "0.001"])
def test_exponents_without_a_dot_are_numbers(text):
    """YAML 1.1 (PyYAML) reads `1e-3` as a string; a policy reads it as users mean."""
    assert read_yaml(f"atol: {text}") == {"atol": 1e-3}
    assert read_yaml("name: '1e-3'") == {"name": "1e-3"}  # quoted stays a string


def test_a_number_in_quotes_is_refused():
    data = {"version": 1, "model": "m.onnx", "accuracy": {"samples": "4"}}
    with pytest.raises(SchemaViolation, match="must be an integer, got str '4'"):
        validate(data)


def test_validate_rejects_what_the_schema_forbids():
    with pytest.raises(SchemaViolation) as info:
        validate({"version": 1, "model": "m.onnx", "build": {"compute_capabilities": ["sm89"]}})
    assert info.value.path == ("build", "compute_capabilities", 0)
