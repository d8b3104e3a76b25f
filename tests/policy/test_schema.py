import json
from pathlib import Path

import pytest
import yaml

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
    validate(yaml.safe_load(text))


def test_validate_coerces_yaml_exponent_strings():
    data = {
        "version": 1,
        "model": "m.onnx",
        "accuracy": {"tolerances": {"default": {"atol": "1e-3"}}},
    }
    assert validate(data)["accuracy"]["tolerances"]["default"]["atol"] == 1e-3


def test_validate_rejects_what_the_schema_forbids():
    with pytest.raises(SchemaViolation) as info:
        validate({"version": 1, "model": "m.onnx", "build": {"compute_capabilities": ["sm89"]}})
    assert info.value.path == ("build", "compute_capabilities", 0)
