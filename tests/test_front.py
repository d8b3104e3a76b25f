"""The front half: what `run_front` draws and runs, as its callers ask."""

from __future__ import annotations

import pytest

from tests.helpers import identity_policy
from trtbuild.front import run_front
from trtbuild.policy import load_policy


def test_convert_draws_no_feeds_but_says_where_data_comes_from(tmp_path):
    """`convert` runs nothing (`draw=False`): no samples drawn, the sources still said."""
    policy = load_policy(identity_policy(tmp_path, [1, 4], "{shape: [1, 4]}"))
    drawn = run_front(policy, reference="none")
    bare = run_front(policy, reference="none", draw=False)
    assert len(drawn.feeds) == policy.accuracy.samples and bare.feeds == []
    assert bare.shapes[0].data == drawn.shapes[0].data
    assert bare.converted.model == drawn.converted.model
    with pytest.raises(ValueError, match="draw=False"):
        run_front(policy, reference="tensors", draw=False)
