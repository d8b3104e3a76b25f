"""Data that does not exercise the model: a reference output constant or nearly so at a point
gets a warning from `check`, `build` and `tune` naming the point, the output and the fix, and
report.json lists it (`flat_outputs`) (issue #42)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from tests.helpers import F, model, node
from trtbuild.cli import main


def _policy(tmp_path: Path, high: float) -> Path:
    """y = Sigmoid(x * 0.01 - 20), x in [0, high] on [1, N] for N = 8, 16, 32: on [0, 1] it
    answers ~2e-9 everywhere (a text detector on noise); on [0, 3000] it spans (0, 1)."""
    m = model(
        [node("Mul", ["x", "k"], "a", "/scale"), node("Sub", ["a", "b"], "z", "/shift"),
         node("Sigmoid", ["z"], "y", "/sigmoid")],
        [("x", F, [1, "n"])],
        [("y", F, [1, "n"])],
        {"k": np.array(0.01, np.float32), "b": np.array(20.0, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "flat.onnx")
    path = tmp_path / f"flat_{int(high)}.yaml"
    path.write_text(
        "version: 1\nmodel: flat.onnx\ninputs:\n  x:\n"
        "    min: [1, 8]\n    opt: [1, 16]\n    max: [1, 32]\n"
        f"    data: {{distribution: uniform, low: 0.0, high: {high}}}\n"
        "accuracy:\n  samples: 2\n  tolerances:\n    default: {atol: 1e-3, rtol: 1e-3}\n"
    )
    return path


def _flat_warning(err: str) -> str:
    lines = [w for w in err.splitlines() if "data does not exercise the model" in w]
    assert len(lines) == 1, err
    return lines[0]


def test_check_build_and_tune_warn_of_a_nearly_constant_output(tmp_path, capsys):
    policy = _policy(tmp_path, high=1.0)
    assert main(["check", "--policy", str(policy)]) == 0
    said = _flat_warning(capsys.readouterr().err)
    for part in ("output y", "at min [1, 8]", "at opt [1, 16]", "at max [1, 32]", "inputs.x.data"):
        assert part in said, said
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 0
    assert _flat_warning(capsys.readouterr().err) == said
    report = json.loads((out / "report.json").read_text())
    assert {(f["point"], f["output"]) for f in report["flat_outputs"]} == {
        ("min", "y"),
        ("opt", "y"),
        ("max", "y"),
    }
    assert all(f["std"] < f["limit"] for f in report["flat_outputs"])
    assert said.split("warning: ")[1] in report["warnings"]
    tuned = tmp_path / "tuned.yaml"
    assert main(["tune", "--policy", str(policy), "-o", str(tuned), "--budget", "2"]) == 0
    assert _flat_warning(capsys.readouterr().err) == said


def test_data_that_exercises_the_model_gets_no_warning(tmp_path, capsys):
    policy = _policy(tmp_path, high=3000.0)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) in (
        0,
        1,
    )
    assert "data does not exercise" not in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["flat_outputs"] == []


def test_a_point_whose_output_barely_moves_against_the_others_is_named(tmp_path, capsys):
    """At max the data spans y in [0.5, 0.505] (std ~0.0014, above one FP16 step) where min
    and opt span (0, 1) (std ~0.47): std over peak under 1% of another point's, so max alone
    is named."""
    policy = _policy(tmp_path, high=3000.0)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "max.npz", x=rng.uniform(2000.0, 2002.0, (2, 1, 32)).astype(np.float32))
    policy.write_text(policy.read_text() + "  shapes:\n    max: {data: {file: max.npz}}\n")
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) in (
        0,
        1,
    )
    said = _flat_warning(capsys.readouterr().err)
    assert "at max [1, 32]" in said and "at opt" not in said and "another point" in said
    (found,) = json.loads((out / "report.json").read_text())["flat_outputs"]
    assert found["point"] == "max" and found["why"] == "points"
    assert 2.0**-10 < found["std"] <= found["limit"]


def test_an_integer_output_is_flat_only_where_its_values_do_not_move(tmp_path, capsys):
    """An integer output (a codebook's indices, an ArgMax) is judged by its own peak: indices
    that move are not flat, whatever the axis they index (`where`: 0-3 at min, 0-2047 at max,
    whose std alone is 500 times min's), and indices that are all 0 are."""
    m = model(
        [node("ArgMax", ["x"], "codes", "/argmax", axis=2, keepdims=0),
         node("ArgMax", ["x"], "where", "/argmax_rows", axis=1, keepdims=0),
         node("Mul", ["x", "zero"], "z", "/zeros"),
         node("ArgMax", ["z"], "none", "/argmax_of_zeros", axis=2, keepdims=0)],
        [("x", F, [1, "n", 4])],
        [("codes", onnx.TensorProto.INT64, [1, "n"]), ("where", onnx.TensorProto.INT64, [1, 4]),
         ("none", onnx.TensorProto.INT64, [1, "n"])],
        {"zero": np.array(0.0, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "codes.onnx")
    policy = tmp_path / "codes.yaml"
    policy.write_text(
        "version: 1\nmodel: codes.onnx\ninputs:\n  x:\n"
        "    min: [1, 4, 4]\n    opt: [1, 64, 4]\n    max: [1, 2048, 4]\n"
        "accuracy:\n  samples: 4\n"
    )
    assert main(["check", "--policy", str(policy)]) == 0
    said = _flat_warning(capsys.readouterr().err)
    assert "output none" in said and "output codes" not in said, said
    assert "output where" not in said, said


def test_an_output_empty_on_every_sample_is_named_as_such(tmp_path, capsys):
    """A detector that finds nothing on the data keeps no box in FP32: its outputs are empty
    on both sides and pass whatever the engine computes. That passed with no word (the
    spread of an empty output was not measured); it is flat, `why: "empty"`."""
    m = model(
        [node("Greater", ["x", "t"], "m", "/found"), node("NonZero", ["m"], "idx", "/where"),
         node("Transpose", ["idx"], "at", "/at"), node("GatherND", ["x", "at"], "kept", "/kept"),
         node("Relu", ["x"], "y", "/relu")],
        [("x", F, [2, 8])],
        [("idx", onnx.TensorProto.INT64, [2, "k"]), ("kept", F, ["k"]), ("y", F, [2, 8])],
        {"t": np.array(2.0, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "nms.onnx")
    for high, empty in ((1.0, True), (3.0, False)):
        policy = tmp_path / f"nms_{int(high)}.yaml"
        policy.write_text(
            "version: 1\nmodel: nms.onnx\ninputs:\n  x:\n    shape: [2, 8]\n"
            f"    data: {{distribution: uniform, low: 0.0, high: {high}}}\n"
            "accuracy:\n  samples: 2\n"
        )
        out = tmp_path / f"out_{int(high)}"
        assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 0
        err = capsys.readouterr().err
        flat = json.loads((out / "report.json").read_text())["flat_outputs"]
        if not empty:
            assert "does not exercise" not in err and flat == [], err
            continue
        lines = [w for w in err.splitlines() if "data does not exercise the model" in w]
        assert len(lines) == 2, err
        assert all("is empty on every sample" in w and "inputs.x.data" in w for w in lines)
        assert {(f["output"], f["why"]) for f in flat} == {("idx", "empty"), ("kept", "empty")}


def test_tune_keeping_little_on_flat_data_names_the_data(tmp_path, capsys):
    """x in [1, 1.0005] moves y = 1.0001 x by less than one FP16 step (flat), and y is
    judged exactly: tune keeps 0% in FP16 and names the data, not the tolerances."""
    m = model(
        [node("Mul", ["x", "k"], "y", "/scale")],
        [("x", F, [1, 8])],
        [("y", F, [1, 8])],
        {"k": np.array(1.0001, np.float32)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [1, 8]\n"
        "    data: {distribution: uniform, low: 1.0, high: 1.0005}\n"
        "accuracy:\n  tolerances:\n    default: {atol: 0.0, rtol: 0.0, check_error_stat: max}\n"
    )
    tuned = tmp_path / "tuned.yaml"
    assert main(["tune", "--policy", str(policy), "-o", str(tuned), "--budget", "4"]) == 0
    err = capsys.readouterr().err
    assert "data does not exercise the model" in err, err
    kept = [w for w in err.splitlines() if "tune kept only" in w]
    assert len(kept) == 1 and "on data that does not exercise the model" in kept[0], err


def test_an_output_empty_on_the_first_sample_only_is_not_called_empty(tmp_path, capsys):
    """Empty on sample 0, one and two elements (all 3.0) on the others: constant, not empty
    (the first feed's shape alone called it empty on every sample)."""
    m = model(
        [node("Greater", ["x", "t"], "m", "/found"), node("NonZero", ["m"], "idx", "/where"),
         node("Transpose", ["idx"], "at", "/at"), node("GatherND", ["x", "at"], "kept", "/kept")],
        [("x", F, [2, 8])],
        [("kept", F, ["k"])],
        {"t": np.array(2.0, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "nms.onnx")
    x = np.zeros((3, 2, 8), np.float32)
    x[1, 0, 1] = x[2, 0, 2] = x[2, 1, 3] = 3.0
    np.savez(tmp_path / "x.npz", x=x)
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: nms.onnx\ninputs:\n  x:\n    shape: [2, 8]\n"
        "    data: {file: x.npz}\naccuracy:\n  samples: 3\n"
    )
    out = tmp_path / "out"
    assert (
        main(
            ["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(out), "--backend", "none"]
        )
        == 0
    )
    flat = json.loads((out / "report.json").read_text())["flat_outputs"]
    assert [(f["output"], f["why"]) for f in flat] == [("kept", "dtype")], flat
    assert "is empty on every sample" not in capsys.readouterr().err


def test_a_constant_integer_output_is_said_as_such_not_in_fp16_steps(tmp_path, capsys):
    """An argmax over a constant channel is 0 on every sample: "at most 0 (one FP16 step at
    its scale)" read as if an integer output had an FP16 step; it says every value is the
    same."""
    m = model(
        [
            node("Mul", ["x", "zero"], "z", "/flatten"),
            node("ArgMax", ["z"], "y", "/argmax", axis=1),
        ],
        [("x", F, [1, 4])],
        [("y", onnx.TensorProto.INT64, [1, 1])],  # keepdims: what convert's full check wants
        {"zero": np.zeros((1, 4), np.float32)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\naccuracy: {samples: 2}\n")
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 0
    said = _flat_warning(capsys.readouterr().err)
    assert "output y is constant or nearly so" in said, said
    assert "at shape [1, 4]: every value the same on all 2 sample(s)" in said, said
    assert "step" not in said, said


def test_a_model_without_inputs_is_not_told_to_give_data(tmp_path, capsys):
    """A model taking no inputs (a generator with its seed baked in) answers the same on
    every sample: the warning told its user to give data under `inputs.<input>.data`,
    which it has none of, and `check` said it measured `at shape {} ()`."""
    m = model([node("Mul", ["w", "w"], "y", "/mul")], [], [("y", F, [1, 4])],
              {"w": np.arange(4, dtype=np.float32).reshape(1, 4)})  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nmodel: m.onnx\n")
    assert main(["check", "--policy", str(policy)]) == 0
    said = capsys.readouterr()
    assert "measured at shape (no inputs)\n" in said.out, said.out
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 0
    err = said.err + capsys.readouterr().err
    assert "does not exercise" not in err, err
