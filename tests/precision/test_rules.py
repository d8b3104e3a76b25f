from __future__ import annotations

import onnx
import pytest

from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Match, Passes, Precision, Rule
from trtbuild.precision.assign import assign


@pytest.fixture(scope="module")
def prepared(nafnet_path):
    return prepare(onnx.load(nafnet_path), Passes(opset=17)).model


def _pinned(prepared, match: Match, ranges=None) -> dict[str, str]:
    a = assign(prepared, Precision(rules=(Rule("r", match, "fp32"),)), ranges)
    return {n.name: d.reason for n, d in zip(a.view.nodes, a.decisions) if d.rule == "r"}


def test_name_and_op_keys_are_anded(prepared):
    pinned = _pinned(prepared, Match(name="/blocks.0/", op=("Pow",)))
    assert set(pinned) == {"/blocks.0/norm1/Pow", "/blocks.0/norm2/Pow"}


def test_reduction_depth(prepared):
    pinned = _pinned(prepared, Match(reduction_depth_above=4096))
    # 16 channels x 64 x 64: the image-wide sum; GlobalAveragePool sums 64 x 64 = 4096, not above
    assert set(pinned) == {"/head/ReduceSum"}
    assert pinned["/head/ReduceSum"] == "accumulates 65536 terms > 4096"


def test_max_abs_above_uses_reference_ranges(prepared):
    ranges = {"/blocks.0/norm1/Pow_output_0": 1.1e6}
    pinned = _pinned(prepared, Match(max_abs_above=65504), ranges)
    # the producer (output too big) and its consumer (input too big)
    assert set(pinned) == {"/blocks.0/norm1/Pow", "/blocks.0/norm1/ReduceMean_1"}


def test_every_match_key_has_exactly_one_kind_of_matcher():
    """The registry is the one list of what a rule can match on (Match's fields, `last` aside,
    which only narrows a pattern)."""
    from dataclasses import fields

    from trtbuild.policy.specs import Match
    from trtbuild.precision.rules import MATCHERS

    keys = [k.KEY for k in MATCHERS]
    assert len(keys) == len(set(keys))
    assert set(keys) == {f.name for f in fields(Match)} - {"last"}
