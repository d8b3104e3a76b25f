"""TensorRT's build in a child process: a crash of its builder is an outcome to report."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.helpers import needs_rtx
from trtbuild.errors import BackendError
from trtbuild.graph.model_io import save_model


def _self_attention_model(path) -> None:
    """An ONNX `Attention` whose query, key and value are one tensor: valid (onnx.checker's
    full check, ONNX Runtime runs it), and TensorRT-RTX 1.7's builder dies on it (SIGSEGV)."""
    from onnx import TensorProto, helper

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8, 16]) for n in "xy")
    attention = helper.make_node("Attention", ["x", "x", "x"], ["y"], name="attn")
    m = helper.make_model(
        helper.make_graph([attention], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 23)],
    )
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    save_model(m, path)


@needs_rtx
def test_a_builder_that_crashes_is_exit_3_naming_the_crash(tmp_path, capsys):
    """The build runs in a child: TensorRT-RTX's SIGSEGV ended trtbuild itself (rc 139, no
    message, nothing of the contract); now exit 3 names it, and nothing is written."""
    from trtbuild.cli import main

    _self_attention_model(tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nbuild: {backend: tensorrt-rtx, variants: false}\n"
    )
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "tensorrt-rtx crashed building the engine of mixed.onnx (SIGSEGV)" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_child_that_died_is_named_by_its_signal_and_whose_fault_it_is():
    """SIGKILL (the out-of-memory killer's) is exit 2, a crash of TensorRT's own exit 3,
    each with the last errors TensorRT logged; a child that could not start is a bug."""
    from trtbuild.engine.child import _answered
    from trtbuild.errors import UsageError

    m = Path("m.onnx")
    with pytest.raises(UsageError, match=r"was killed \(SIGKILL\)"):
        _answered(None, -9, "tensorrt-rtx", m)
    with pytest.raises(BackendError, match=r"crashed .* \(SIGABRT\); .*: ERROR: bad node"):
        _answered(None, -6, "tensorrt-rtx", m, ["ERROR: bad node"])
    with pytest.raises(RuntimeError, match=r"exit code 1, no answer"):
        _answered(None, 1, "tensorrt-rtx", m)
    with pytest.raises(KeyboardInterrupt):
        _answered(("interrupted",), 0, "tensorrt-rtx", m)
    with pytest.raises(RuntimeError, match="Traceback"):
        _answered(("bug", "Traceback ..."), 0, "tensorrt-rtx", m)


def test_a_truncated_answer_is_no_answer():
    """The machine may kill the child while it writes a large engine: what was written is
    not read as an answer (its exit code says what happened)."""
    import io
    import pickle

    from trtbuild.engine.child import _read

    whole = pickle.dumps(("ok", b"x" * 100_000))
    assert _read(io.BytesIO(whole)) == ("ok", b"x" * 100_000)
    assert _read(io.BytesIO(whole[:65536])) is None
    assert _read(io.BytesIO(b"")) is None


@needs_rtx
def test_a_file_the_build_cannot_write_is_the_surroundings_fault(tmp_path, nafnet_path):
    """An OSError in the child (a timing cache under a path through a file) was a bug's
    traceback (exit 70) there; it is exit 2 naming the path, as in trtbuild's own process."""
    from trtbuild.engine.child import build_engine
    from trtbuild.errors import UsageError
    from trtbuild.policy.specs import BuildSpec

    (tmp_path / "afile").write_text("")
    spec = BuildSpec(workspace=1 << 28, timing_cache=tmp_path / "afile" / "t.cache")
    with pytest.raises(UsageError, match="a part of the path is a file"):
        build_engine(Path(nafnet_path), "tensorrt-rtx", spec)


def test_a_ctrl_c_to_trtbuild_alone_is_passed_to_the_building_child():
    """`kill -INT` of trtbuild (not of its process group): the child must hear it too, or
    it builds on to the end before trtbuild can stop."""
    import os
    import signal
    import subprocess
    import sys

    from trtbuild.engine.child import _passed_on

    hears = "import signal, sys, time; signal.signal(signal.SIGINT, lambda *_: sys.exit(7)); "
    hears += "print(flush=True); time.sleep(60)"
    with _passed_on() as (interrupted, started):
        child = subprocess.Popen([sys.executable, "-c", hears], stdout=subprocess.PIPE)
        started.append(child)
        assert child.stdout is not None and child.stdout.readline()  # its handler is set
        os.kill(os.getpid(), signal.SIGINT)  # this process alone
        assert child.wait(timeout=30) == 7
    assert interrupted.is_set()
    child.stdout.close()


def test_a_child_that_cannot_cancel_is_killed_after_the_grace(monkeypatch):
    """TensorRT-RTX deadlocks where it cannot start a thread (a small pids limit): the
    child heard Ctrl-C and never ended, and trtbuild waited for ever. It is killed once
    `GRACE` seconds have passed."""
    import os
    import signal
    import subprocess
    import sys

    from trtbuild.engine import child as engine_child

    monkeypatch.setattr(engine_child, "GRACE", 0.2)
    deaf = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    deaf += "print(flush=True); time.sleep(60)"
    with engine_child._passed_on() as (interrupted, started):
        child = subprocess.Popen([sys.executable, "-c", deaf], stdout=subprocess.PIPE)
        started.append(child)
        assert child.stdout is not None and child.stdout.readline()
        os.kill(os.getpid(), signal.SIGINT)
        assert child.wait(timeout=30) == -signal.SIGKILL
    assert interrupted.is_set()
    child.stdout.close()


@needs_rtx
def test_one_child_builds_each_model_in_turn_and_names_the_one_that_fails(tmp_path, nafnet_path):
    """`build`'s engine and its two variants are built by one child (its start is 0.25 s):
    the engines come back in order, and a crash is said of the model it happened on."""
    from trtbuild.engine.child import build_engines
    from trtbuild.policy.specs import BuildSpec

    spec = BuildSpec(workspace=1 << 28)
    good = Path(nafnet_path)
    first, second = build_engines([good, good], "tensorrt-rtx", spec)
    assert first.engine and second.engine and first.layers == second.layers
    _self_attention_model(tmp_path / "crash.onnx")
    with pytest.raises(BackendError, match=r"engine of crash\.onnx \(SIGSEGV\)"):
        build_engines([good, tmp_path / "crash.onnx", good], "tensorrt-rtx", spec)


def _nonzero_model(path) -> None:
    """A model TensorRT-RTX refuses (it has no `NonZero`): exit 3 with its words."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["y"], name="nz")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "n"])],
    )  # fmt: skip
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@needs_rtx
def test_an_optional_model_tensorrt_refuses_or_crashes_on_is_its_error_and_the_rest_build(
    tmp_path, nafnet_path
):
    """`build`'s variants are baselines: one TensorRT refuses is its error in the list and
    the child builds on; after a crash each left is that error; a required one raises."""
    from trtbuild.engine.child import build_engines
    from trtbuild.policy.specs import BuildSpec

    spec = BuildSpec(workspace=1 << 28)
    good, refused, crash = Path(nafnet_path), tmp_path / "refused.onnx", tmp_path / "crash.onnx"
    _nonzero_model(refused)
    _self_attention_model(crash)
    first, second, third = build_engines([good, refused, good], "tensorrt-rtx", spec, optional=2)
    assert first.engine and third.engine and isinstance(second, BackendError), second
    assert "NonZero" in second.message, second.message
    first, crashed, after = build_engines([good, crash, good], "tensorrt-rtx", spec, optional=2)
    assert first.engine and isinstance(crashed, BackendError) and isinstance(after, BackendError)
    assert "engine of crash.onnx (SIGSEGV)" in crashed.message, crashed.message
    assert after.message == f"{good.name} not built: the build child crashed on crash.onnx"
    with pytest.raises(BackendError):
        build_engines([refused, good], "tensorrt-rtx", spec, optional=1)
