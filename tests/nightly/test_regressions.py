"""How a regression says an error grew: in words that are true at the edges."""

from __future__ import annotations

import json

import pytest

from tests.nightly.test_retry import _record, _result
from trtbuild.cli import main


@pytest.mark.parametrize(
    ("then", "now", "margin", "says"),
    [
        (0.0, 0.5, "0.25", "y.median_abs 0 → 0.5 (from exactly 0, margin 25%"),
        (1.0, 1.0046, "0.004", "y.median_abs 1 → 1.005 (+0.46%, margin 0.4%"),
        (1.0, 2.0, "0.25", "y.median_abs 1 → 2 (+100%, margin 25%"),
    ],
)
def test_the_growth_of_an_error_is_said_as_it_is(tmp_path, then, now, margin, says, capsys):
    """From an exact 0 (an all-FP32 policy's error) the growth printed `+inf%`; a margin
    under 0.5% printed as `margin 0%`, its growth as `+0%`: a regression of no growth."""
    history = str(tmp_path / "h.sqlite")
    _record(history, "n1", [_result("p", "pass", then)], "2026-01-01T00:00:00+00:00")
    _record(history, "n2", [_result("p", "pass", now)], "2026-01-02T00:00:00+00:00")
    argv = ["summary", "--history", history, "--run-id", "n2", "--out", str(tmp_path / "s")]
    assert main([*argv, "--margin", margin]) == 1
    said = capsys.readouterr().out
    assert f"REGRESSION p on cpu-emulation: error grew: {says}" in said
    assert "inf%" not in said
    night = json.loads((tmp_path / "s" / "nightly.json").read_text())
    assert says in night["regressions"][-1]["detail"]
