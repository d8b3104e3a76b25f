"""A process-wide setting shared by the threads of one call or many."""

from __future__ import annotations

import os
import signal
import time

import pytest


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_forked_while_the_setting_s_lock_was_held_can_take_it():
    """tune's workers are forked: a fork while another thread was making or undoing a
    setting left the child a lock no thread of it would release, and its first judge
    under `quiet_polygraphy` waited for ever."""
    from trtbuild.accuracy import sessions
    from trtbuild.ortload import _IMPORTING

    locks = [sessions._SILENCED._lock, _IMPORTING[0]]
    for lock in locks:
        lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child: quiet, then the module's own import lock
            code = 1
            try:
                with sessions.quiet_polygraphy():
                    pass
                from trtbuild.ortload import onnxruntime

                onnxruntime()
                code = 0
            finally:
                os._exit(code)
    finally:
        for lock in locks:
            lock.release()
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited for a lock of its parent's")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
