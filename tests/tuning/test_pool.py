"""The tune's worker processes: what a worker the machine ends makes of the command."""

from __future__ import annotations

import os
import signal
import time

import pytest

from trtbuild.errors import UsageError
from trtbuild.tuning import pool as tuning_pool


def _slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the tune's pool forks its workers")
def test_a_worker_the_machine_kills_is_exit_2_not_a_bug():
    """The out-of-memory killer's SIGKILL on one of `tune --jobs 2`'s workers broke the
    pool: BrokenProcessPool ended the tune as a bug (exit 70, a traceback). It is the
    machine's: exit 2, naming the signal and the fix (free memory or lower --jobs)."""
    with pytest.raises(UsageError) as said, tuning_pool.pool(None, 2) as workers:  # type: ignore[arg-type]
        running = [workers.submit(_slow, 30) for _ in range(2)]
        deadline = time.monotonic() + 30
        while not workers._processes and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the workers started
        os.kill(next(iter(workers._processes)), signal.SIGKILL)
        for future in running:
            future.result(timeout=60)
    assert said.value.exit_code == 2
    assert "killed (SIGKILL)" in str(said.value) and "--jobs" in str(said.value), said.value
