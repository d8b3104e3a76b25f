"""The values a shape input's optimization profile holds (`accuracy.shape_values`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from trtbuild.accuracy.shape_values import _values


def _run(name: str, *values: list[int]) -> SimpleNamespace:
    point = SimpleNamespace(name=name, label=name)
    feeds = [{"shape": np.array(v)} for v in values]
    return SimpleNamespace(point=point, feeds=feeds, data={"shape": SimpleNamespace(kind="file")})


def test_values_of_different_lengths_are_refused_not_cut_to_the_shortest():
    """[2, 8], [4, 2, 2] and [4, 4]: `zip` made min (2, 2) and max (4, 8), the third
    entry gone; one profile holds one length."""
    policy = SimpleNamespace(inputs=(), where_of=lambda *field: f"p.yaml {field}")
    found = _values(policy, [_run("opt", [2, 8], [4, 2, 2]), _run("max", [4, 4])], "shape", "x")
    assert found is not None and found.refused is not None, found
    message, where, hint = found.refused
    assert "fed values of 2, 3 entries: an optimization profile holds one length" in message
    assert where == "p.yaml ('inputs', 'shape')" and "one length" in hint  # the input's line
    same = _values(policy, [_run("opt", [2, 8], [2, 8]), _run("max", [4, 4])], "shape", "x")
    assert same is not None and same.refused is None
    assert (same.min, same.opt, same.max) == ((2, 4), (2, 8), (4, 8))
    assert same.points == (("opt", ((2, 8),)), ("max", ((4, 4),)))  # each value once, by point
