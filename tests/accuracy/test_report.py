"""One byte format for the report and `cache info`: three significant digits, never 1e+03."""

from __future__ import annotations

import pytest

from trtbuild.sizes import fmt_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "–"),
        (999, "999 B"),
        (1000, "0.977 KiB"),
        (1_034_839, "0.987 MiB"),  # the bench model's measures entry
        (23_743_902, "22.6 MiB"),
        (2 << 30, "2 GiB"),
    ],
)
def test_bytes_read_as_a_person_writes_them(n, text):
    assert fmt_bytes(n) == text
