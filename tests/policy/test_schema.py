import json

from trtbuild.policy.schema import SCHEMA, validate


def test_schema_is_json_and_documents_every_section():
    text = json.dumps(SCHEMA)
    assert set(SCHEMA["properties"]) == {
        "version",
        "model",
        "inputs",
        "passes",
        "precision",
        "build",
        "accuracy",
    }
    assert json.loads(text) == SCHEMA


def test_validate_coerces_yaml_exponent_strings():
    out = validate(
        {"version": 1, "model": "m.onnx", "accuracy": {"tolerances": {"default": {"atol": "1e-3"}}}}
    )
    assert out["accuracy"]["tolerances"]["default"]["atol"] == 1e-3
