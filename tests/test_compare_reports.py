"""scripts/compare_reports.py: the refactor check compares figures bit for bit."""

from __future__ import annotations

import compare_reports  # scripts/ is on the path (conftest)


def test_nan_against_nan_is_no_difference_and_a_changed_figure_is():
    """A figure NaN in both reports (no sample defined it) was counted as a difference."""
    nan = float("nan")
    before = {"a": nan, "b": [1.0, nan], "c": 0.5}
    assert compare_reports.differences(before, {"a": nan, "b": [1.0, nan], "c": 0.5}) == []
    changed = compare_reports.differences(before, {"a": 1.0, "b": [1.0, nan], "c": 0.25})
    assert changed == [".a: nan -> 1.0", ".c: 0.5 -> 0.25"]
