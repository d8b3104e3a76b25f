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


@pytest.mark.parametrize(
    "accuracy",
    [{"samples": 10**400}, {"tolerances": {"default": {"atol": 10**400}}}],
    ids=["integer", "number"],
)
def test_an_integer_past_float64s_range_is_refused_not_a_traceback(accuracy):
    """YAML reads 400 digits as a Python int: the number check raised OverflowError (exit
    70), and an integer field of it skipped its maximum (`samples` got past 10000)."""
    data = {"version": 1, "model": "m.onnx", "accuracy": accuracy}
    with pytest.raises(SchemaViolation, match="must be a finite number, got an integer of 401"):
        validate(data)


def test_validate_rejects_what_the_schema_forbids():
    with pytest.raises(SchemaViolation) as info:
        validate({"version": 1, "model": "m.onnx", "build": {"compute_capabilities": ["sm89"]}})
    assert info.value.path == ("build", "compute_capabilities", 0)


def test_every_default_the_schema_shows_is_valid_where_it_stands():
    """The defaults come from the dataclasses (`policy.specs`); each must fit its own field."""
    import jsonschema

    shown = []

    def walk(node):
        if isinstance(node, dict):
            if "default" in node and not isinstance(node["default"], dict):
                piece = {k: v for k, v in node.items() if k not in ("default", "description")}
                jsonschema.validate(node["default"], piece)
                shown.append(node["default"])
            for value in node.values():
                walk(value)

    walk(SCHEMA)
    assert len(shown) > 15


def test_the_loader_adds_no_default_of_its_own(tmp_path):
    """Every key left out takes the dataclass's default: one place where defaults live."""
    from trtbuild.policy import Policy

    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nmodel: m.onnx\ninputs: {x: {shape: [1], data: {}}}\n")
    loaded = load_policy(path)
    from trtbuild.policy.specs import InputSpec

    assert loaded == Policy("p", (tmp_path / "m.onnx").resolve(), (InputSpec("x", (1,)),))
