"""The field table: each policy key is declared once, on its dataclass, and read from there."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from trtbuild.policy import Policy
from trtbuild.policy.keys import NAME, NUMBER, given, key, keyed, section
from trtbuild.policy.schema import SCHEMA
from trtbuild.policy.specs import (
    AccuracySpec,
    BuildSpec,
    DataSpec,
    ImageSpec,
    InputSpec,
    Match,
    Passes,
    Precision,
    Rule,
    Tolerance,
)

SECTIONS = (AccuracySpec, BuildSpec, DataSpec, ImageSpec, InputSpec, Match, Passes, Precision)
SECTIONS += (Rule, Tolerance)
# fields no policy key names: the loader makes them from other keys or from the document
NOT_KEYS = {
    (InputSpec, "name"),  # the key of `inputs:`
    (DataSpec, "images"),  # the ImageSpec keys of the same `data:` mapping
    (AccuracySpec, "output_tolerances"),  # tolerances.outputs, beside tolerances.default
    (Tolerance, "simple"),  # whether any simple-check key is given
    (DataSpec, "range_given"),  # whether `low` or `high` is written
}


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__name__)
def test_every_field_is_a_key_or_says_where_it_comes_from(cls):
    """A field added without a Key would be neither in the schema nor read by the loader."""
    unkeyed = {f.name for f in fields(cls)} - {f.name for f, _, _ in keyed(cls)}
    assert unkeyed == {name for c, name in NOT_KEYS if c is cls}


def _at(path: tuple[str, ...]) -> dict:
    node = SCHEMA
    for part in path:
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    return node


@pytest.mark.parametrize(
    ("path", "cls"),
    [
        (("passes",), Passes),
        (("build",), BuildSpec),
        (("accuracy",), AccuracySpec),
        (("accuracy", "tolerances", "default"), Tolerance),
        (("inputs", "*", "data"), ImageSpec),
    ],
)
def test_the_schema_shows_the_defaults_the_loader_leaves_to_the_dataclass(tmp_path, path, cls):
    """What an editor completes is what a policy without the key gets."""
    shown = {k: node["default"] for k, node in _at(path)["properties"].items() if "default" in node}
    assert shown
    spec = {
        AccuracySpec: lambda p: p.accuracy,
        BuildSpec: lambda p: p.build,
        Passes: lambda p: p.passes,
        Tolerance: lambda p: p.accuracy.default_tolerance,
        ImageSpec: lambda p: p.inputs[0].data.images,
    }[cls]
    (tmp_path / "photos").mkdir()
    data = {"images": "photos"}
    policy = Policy.from_dict(
        {"version": 1, "model": "m.onnx", "inputs": {"x": {"shape": [1, 3, 8, 8], "data": data}}},
        base_dir=tmp_path,
    )
    names = {name: f.name for f, _, name in keyed(cls)}  # a data: section is two classes
    for name, default in ((n, d) for n, d in shown.items() if n in names):
        value = getattr(spec(policy), names[name])
        assert (list(value) if isinstance(value, tuple) else value) == default, name


def test_the_loader_reads_each_key_as_its_field_declares(tmp_path):
    """Sizes, paths and lists are converted on the way in, from the one declaration."""
    policy = Policy.from_dict(
        {
            "version": 1,
            "model": "m.onnx",
            "build": {
                "workspace": "1GiB",
                "timing_cache": "t.cache",
                "compute_capabilities": ["9.0"],
            },
            "accuracy": {"memory_budget": "512MiB", "tolerances": {"default": {"atol": 0.5}}},
            "passes": {"freeze_inputs": {"sr": 16000}},
        },
        base_dir=tmp_path,
    )
    assert policy.build.workspace == 1 << 30
    assert policy.build.timing_cache == (tmp_path / "t.cache").resolve()
    assert policy.build.compute_capabilities == ("9.0",)
    assert policy.accuracy.memory_budget == 512 << 20
    assert policy.accuracy.default_tolerance.atol == 0.5
    assert policy.passes.freeze_inputs == (("sr", 16000),)


def test_a_key_two_classes_share_must_be_declared_alike():
    @dataclass(frozen=True)
    class A:
        x: float = field(default=0.0, metadata=key(NUMBER))

    @dataclass(frozen=True)
    class B:
        x: str = field(default="a", metadata=key(NAME))

    assert section(A, A)["properties"]["x"] == {**NUMBER, "default": 0.0}
    with pytest.raises(TypeError, match="'x' is declared otherwise"):
        section(A, B)


def test_given_leaves_absent_and_built_keys_alone():
    assert given({"workspace": 1024, "variants": False}, BuildSpec, Path()) == {
        "workspace": 1024,
        "variants": False,
    }
    assert "match" not in given(
        {"id": "r", "match": {"op": "Add"}, "precision": "fp32"}, Rule, Path()
    )
