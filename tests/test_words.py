"""How a message names a few of many things."""

from __future__ import annotations

from trtbuild.words import first_few


def test_the_first_three_are_said_and_the_rest_counted():
    assert first_few([]) == ""
    assert first_few(["a", "b", "c"]) == "a, b, c"
    assert first_few(["a", "b", "c", "d"]) == "a, b, c, +1 more"
    assert first_few(["a", "b"], most=1) == "a, +1 more"
