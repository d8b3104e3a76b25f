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


def test_a_child_the_machine_killed_is_the_surroundings_fault():
    """SIGKILL (the out-of-memory killer's) is exit 2, a crash of TensorRT's own exit 3."""
    from trtbuild.engine.child import _answered
    from trtbuild.errors import UsageError

    with pytest.raises(UsageError, match=r"was killed \(SIGKILL\)"):
        _answered(b"", -9, "tensorrt-rtx", Path("m.onnx"))
    with pytest.raises(BackendError, match=r"crashed .* \(SIGABRT\)"):
        _answered(b"", -6, "tensorrt-rtx", Path("m.onnx"))
    with pytest.raises(BackendError, match=r"\(exit code 1\)"):
        _answered(b"", 1, "tensorrt-rtx", Path("m.onnx"))
