"""A point with an empty input is run once in a child first: ONNX Runtime dies on some."""

from __future__ import annotations

import numpy as np
import onnx

from tests.helpers import F, model, node
from trtbuild.cli import main


def _norm_of(first: str) -> onnx.ModelProto:
    """x -> `first` -> InstanceNormalization: ONNX Runtime 1.32 dies with SIGSEGV where the
    normalization reads an empty tensor another node made (not the graph's own input)."""
    inits = {"s": np.ones(3, np.float32), "b": np.zeros(3, np.float32)}
    nodes = [
        node(first, ["x"], "d", "first"),
        node("InstanceNormalization", ["d", "s", "b"], "y", "norm"),
    ]
    return model(nodes, [("x", F, [1, 3, "h", 8])], [("y", F, [1, 3, "h", 8])], inits)


def test_onnx_runtime_dying_on_an_empty_input_is_exit_2_naming_the_point(tmp_path, capsys):
    """The FP32 reference ran in trtbuild's process: SIGSEGV ended it (rc 139, no message)."""
    onnx.save(_norm_of("Neg"), tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {min: [1, 3, 0, 8], opt: [1, 3, 8, 8], "
        "max: [1, 3, 16, 8]}\nbuild: {backend: none}\n"
    )
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "crashes (SIGSEGV) running the model at min [1, 3, 0, 8]" in err
    assert "empty input (x: [1, 3, 0, 8])" in err and "give that dim at least 1" in err
    assert not (tmp_path / "out").exists()


def test_an_empty_input_onnx_runtime_runs_is_judged():
    from trtbuild.accuracy.empty import crash, has_empty

    feed = {"x": np.zeros((1, 3, 0, 8), np.float32)}
    assert has_empty(feed) and not has_empty({"x": np.float32(1.0)})  # a scalar: no dim
    assert crash(_norm_of("Neg"), feed) == "SIGSEGV"
    assert crash(_norm_of("Identity"), feed) is None  # the graph's own input: it runs
