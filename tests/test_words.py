"""How a message names a few of many things, and says a share."""

from __future__ import annotations

import pytest

from trtbuild.words import field, first_few, percent


def test_the_first_three_are_said_and_the_rest_counted():
    assert first_few([]) == ""
    assert first_few(["a", "b", "c"]) == "a, b, c"
    assert first_few(["a", "b", "c", "d"]) == "a, b, c, +1 more"
    assert first_few(["a", "b"], most=1) == "a, +1 more"


@pytest.mark.parametrize(
    ("share", "text"),
    [
        (0.431, "43.1%"),
        (1.0, "100.0%"),
        (0.0, "0.0%"),
        (0.9995, ">99.9%"),  # a guard's node of two thousand kept FP32: not all of it
        (0.99949, "99.9%"),
        (0.0004, "<0.1%"),  # one node of three thousand in FP16: not none
        (0.0005, "0.1%"),
    ],
)
def test_a_share_is_all_or_nothing_only_where_it_is(share, text):
    assert percent(share) == text


def test_a_field_path_quotes_a_key_that_holds_a_dot():
    """An ONNX input named `input.1` (a PyTorch export's): `inputs.input.1.data` read as four
    keys."""
    assert field("inputs", "x", "data") == "inputs.x.data"
    assert field("inputs", "input.1", "data") == 'inputs."input.1".data'
    assert field("precision", "rules", 2, "match") == "precision.rules[2].match"
    assert field("inputs", "onnx::Conv_0") == "inputs.onnx::Conv_0"
