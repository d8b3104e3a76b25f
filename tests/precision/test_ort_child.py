"""Children started ahead (`ort_child.Spares`): the import done before the job, the same
child answering it, every one reaped, a crash still a crash (#46, the cold `convert`)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import proc_stat
from trtbuild.precision import ort_child


def _relu() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _imported(pid: int) -> bool:
    """Whether process `pid` has ONNX Runtime's native module loaded (its memory map)."""
    try:
        return "onnxruntime_pybind11_state" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _warm(spares: ort_child.Spares) -> int:
    """The first idle child's PID, once its `import onnxruntime` is done."""
    pid = spares.idle[0].pid
    deadline = time.monotonic() + 60
    while not _imported(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _imported(pid), "the spare did not import ONNX Runtime while it waited"
    return pid


def _reaped(procs) -> bool:
    """Each child ended and waited for: no process left, running or zombie."""
    return all(p.returncode is not None and not Path(f"/proc/{p.pid}").exists() for p in procs)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_a_spare_imports_onnxruntime_first_and_is_the_child_that_answers_the_job():
    with ort_child.Spares(keep=1) as spares:
        spares.fill()
        pid = _warm(spares)  # imported before any job was given
        proc = spares.take(_relu(), "default")
        assert proc.pid == pid and ort_child.outcome(proc, 60).ok
        (next_one,) = spares.idle  # taking one started the next
        assert next_one.pid != pid and next_one.poll() is None
        children = list(spares.children)
    assert len(children) == 2 and _reaped(children)


def test_a_spare_loads_a_file_and_refuses_a_broken_model(tmp_path):
    (tmp_path / "m.onnx").write_bytes(_relu())
    with ort_child.Spares(keep=2) as spares:
        spares.fill()
        assert len(spares.idle) == 2
        assert ort_child.outcome(spares.take(tmp_path / "m.onnx", "off"), 60).ok
        said = ort_child.outcome(spares.take(b"not a model", "default"), 60)
        assert not said.ok and said.kind == "InvalidProtobuf" and said.crash is None, said
        assert len(spares.idle) == 2  # kept at two while taken


def test_close_kills_and_waits_for_idle_and_loading_children():
    spares = ort_child.Spares(keep=2)
    spares.fill()
    loading = spares.take(_relu(), "default")
    os.kill(loading.pid, signal.SIGSTOP)  # as a slow load: still running when closed
    children = list(spares.children)
    assert len(children) == 3
    spares.close()
    assert _reaped(children) and spares.idle == [] and spares.children == []
    assert loading.returncode == -signal.SIGKILL
    with pytest.raises(RuntimeError, match="closed"):
        spares.take(_relu(), "default")  # a check that ended starts nothing more
    spares.close()  # again: nothing to do


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_a_warm_child_that_dies_of_a_signal_mid_load_is_a_crash():
    """A SIGSEGV in the warm child's session (here raised from outside, held until the
    job is in: a real one is test_validate's GRU) is a crash, not a killed child."""
    with ort_child.Spares(keep=1) as spares:
        spares.fill()
        pid = _warm(spares)
        os.kill(pid, signal.SIGSTOP)
        proc = spares.take(_relu(), "default")
        os.kill(pid, signal.SIGSEGV)  # pending until it runs again: it never reads on
        os.kill(pid, signal.SIGCONT)
        said = ort_child.outcome(proc, 60)
    assert not said.ok and said.crash == "SIGSEGV" and not said.killed, said


def test_an_fp16_gru_crashing_onnx_runtime_in_a_warm_child_is_a_crash_naming_its_node(tmp_path):
    from tests.precision.test_validate import _crashes_in_default_session, _gru

    mixed = _gru(fp16=True)
    onnx.save(mixed, tmp_path / "mixed.onnx")
    if not _crashes_in_default_session(tmp_path / "mixed.onnx"):
        pytest.skip("ONNX Runtime on this CPU does not crash on it")
    data = mixed.SerializeToString()
    with ort_child.Spares(keep=1) as spares:
        spares.fill()
        first = ort_child.outcome(spares.take(data, "default"), 60)
        assert first.crash == "SIGSEGV" and not first.killed, first
        said = ort_child.warning(first, data, 60, spares.take)  # its probes are spares too
    assert "NchwcTransformer" in said and "at node 'head' (MatMul)" in said, said


def test_a_child_that_cannot_import_onnxruntime_answers_import_error(tmp_path, monkeypatch):
    """A broken ONNX Runtime where the parent imports from (a missing library raises
    ImportError): the spare answers at once, whatever job it is given next."""
    broken = tmp_path / "site" / "onnxruntime"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libonnxruntime.so: not found')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with ort_child.Spares(keep=1) as spares:
        spares.fill()
        said = ort_child.outcome(spares.take(_relu(), "default"), 60)
    assert said.kind == "ImportError" and "libonnxruntime.so" in said.message, said


def _nice(pid: int) -> int:
    """Process `pid`'s nice value (it must still run: a process gone raises)."""
    return int(proc_stat(pid)[16])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_only_children_started_long_ahead_wait_at_a_lower_priority():
    """A child started long before its job (`fill`'s `nice`: a cold `convert` as it
    prepares the graph) must not take the CPU from the parent whose work it waits for;
    a spare refilled as one is taken is needed soon."""
    mine = os.nice(0)
    if mine + ort_child.SPARE_NICE > 19:  # no lower priority left to tell apart
        pytest.skip(f"the tests already run at nice {mine}")
    with ort_child.Spares(keep=1) as spares:
        spares.fill(2, ort_child.SPARE_NICE)
        ahead = _warm(spares)  # imported: its priority is set by then
        assert _nice(ahead) == mine + ort_child.SPARE_NICE
        taken = spares.take(_relu(), "default")
        assert taken.pid == ahead and ort_child.outcome(taken, 60).ok  # it still loads
        spares.take(_relu(), "default")  # the second: a spare refilled at once
        assert _nice(_warm(spares)) == mine
