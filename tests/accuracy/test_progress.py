"""One status line: rewritten in place on a terminal, a line per update in a log."""

from __future__ import annotations

import io

import pytest

from trtbuild.accuracy import progress
from trtbuild.accuracy.progress import SampleProgress, StatusLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (Terminal, "\rtune 1/10 pass\rtune 2        \n"),  # the shorter text covers the longer
        (io.StringIO, "tune 1/10 pass\ntune 2\n"),  # a log: nothing more at the end
    ],
)
def test_a_terminal_line_is_rewritten_and_a_log_gets_a_line_per_update(stream, expected):
    out = stream()
    line = StatusLine(out)
    line.write("tune 1/10 pass")
    line.write("tune 2")
    line.done()
    assert out.getvalue() == expected


def test_nothing_written_ends_no_line():
    out = Terminal()
    StatusLine(out).done()
    assert out.getvalue() == ""


def test_samples_show_only_once_the_run_takes_a_while(monkeypatch):
    out = io.StringIO()
    ticker = SampleProgress("FP32 reference", 3, stream=out)
    ticker.tick(1)
    assert out.getvalue() == ""  # the usual quick run stays quiet
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    ticker.tick(3)
    ticker.done()
    assert out.getvalue() == "FP32 reference: 3/3 samples\n"


def test_candidates_judged_in_turn_are_counted_each_on_its_own_samples(monkeypatch):
    """`build` judges its policy, then the FP16 baseline, on the same two samples: the line
    says which sample of which candidate, not "3/4 samples" of a policy with two."""
    monkeypatch.setattr(progress, "DELAY_SECONDS", 0.0)
    out = io.StringIO()
    ticker = SampleProgress("judging emulated-fp16", 4, stream=out, candidates=2)
    for done in range(1, 5):
        ticker.last = 0.0  # every update shown
        ticker.tick(done)
    assert out.getvalue().splitlines() == [
        "judging emulated-fp16: sample 1/2 of candidate 1/2",
        "judging emulated-fp16: sample 2/2 of candidate 1/2",
        "judging emulated-fp16: sample 1/2 of candidate 2/2",
        "judging emulated-fp16: sample 2/2 of candidate 2/2",
    ]


def test_a_status_line_without_stderr_writes_nothing(monkeypatch):
    """No stderr at all (pythonw, a service): `isatty` of None was exit 70."""
    import sys

    from trtbuild.accuracy.progress import StatusLine

    monkeypatch.setattr(sys, "stderr", None)
    line = StatusLine()
    line.write("judging 1/4 samples")
    line.done()
    assert line.silent and not line.tty
