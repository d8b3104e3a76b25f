"""A file's data at points of other shapes: the file where it fits, derived where it does not,
and said so; `derive: none` and what cannot be derived are the user's to fix."""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import onnx
import pytest

from tests.helpers import I64, F, identity_policy, model, node
from trtbuild.cli import main
from trtbuild.errors import UsageError
from trtbuild.front import run_front
from trtbuild.policy import load_policy

FRAMES = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)  # 2 samples of 5 frames


def _policy(tmp_path, data: str = "{file: x.npz}", accuracy: str = "") -> object:
    np.savez(tmp_path / "x.npz", x=FRAMES[:, None])
    profile = f"{{min: [1, 2, 3], opt: [1, 5, 3], max: [1, 12, 3], data: {data}}}"
    extra = f"accuracy:\n{textwrap.indent(accuracy, '  ')}" if accuracy else ""
    return identity_policy(tmp_path, [1, "t", 3], profile, extra)


def _runs(path) -> dict:
    return {r.point.name: r for r in run_front(load_policy(path), reference="none").shapes}


def test_the_file_where_it_fits_cropped_and_tiled_elsewhere(tmp_path):
    runs = _runs(_policy(tmp_path))
    assert runs["opt"].data["x"].kind == "file"
    np.testing.assert_array_equal(runs["opt"].feeds[1]["x"][0], FRAMES[1])
    assert runs["min"].data["x"].source == "x.npz cropped on axis 1 (5 -> 2)"
    np.testing.assert_array_equal(runs["min"].feeds[0]["x"][0], FRAMES[0, :2])
    assert runs["max"].data["x"].source == "x.npz tiled on axis 1 (5 -> 12)"
    tiled = runs["max"].feeds[1]["x"][0]
    np.testing.assert_array_equal(tiled, FRAMES[1, np.arange(12) % 5])


def test_synthetic_data_keeps_each_channel_within_its_range(tmp_path):
    runs = _runs(_policy(tmp_path, "{file: x.npz, derive: synthetic}"))
    made = runs["max"].feeds[0]["x"][0]  # [12, 3]
    assert runs["max"].data["x"].kind == "synthetic"
    assert "per index of axis 0, 2" in runs["max"].data["x"].source
    lo, hi = FRAMES.min(axis=(0, 1)), FRAMES.max(axis=(0, 1))
    assert made.shape == (12, 3) and (made >= lo).all() and (made <= hi).all()
    assert not np.array_equal(made[:5], FRAMES[0])  # not the file's values


def test_derive_none_names_the_point_and_the_fix(tmp_path, capsys):
    path = _policy(tmp_path, "{file: x.npz, derive: none}")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "min [1, 2, 3] needs [1, 2, 3] and derive is none" in err
    assert f"{path.resolve()}:4: inputs.x.data.file: array 'x'" in err  # the file's line
    assert "accuracy.shapes.min.data.file" in err and "accuracy.shapes.min.skip" in err


def test_a_point_gets_its_own_file(tmp_path, capsys):
    path = _policy(tmp_path, accuracy="shapes: {max: {data: {file: long.npz}}}\n")
    long = np.full((1, 12, 3), 7.0, np.float32)
    np.savez(tmp_path / "long.npz", x=long)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    said = capsys.readouterr().out
    assert "data at min [1, 2, 3]: x.npz cropped on axis 1 (5 -> 2)" in said
    assert "data at max" not in said  # its own real data
    shapes = {s["name"]: s for s in json.loads((out / "report.json").read_text())["shapes"]}
    assert shapes["max"]["data"]["x"] == {"kind": "file", "source": "long.npz (this point's own)"}


def test_a_points_file_of_another_shape_is_exit_2(tmp_path):
    path = _policy(tmp_path, accuracy="shapes: {max: {data: {file: long.npz}}}\n")
    np.savez(tmp_path / "long.npz", x=np.zeros((1, 11, 3), np.float32))
    with pytest.raises(UsageError, match=r"accuracy\.shapes\.max\.data\.file: array 'x' has shape"):
        run_front(load_policy(path), reference="none")


def test_an_axis_the_model_fixes_cannot_be_derived(tmp_path):
    path = _policy(tmp_path)
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 5, 4), np.float32))  # 4 features, the model 3
    with pytest.raises(UsageError, match="has 4 on axis 2 where the model's input has 3"):
        run_front(load_policy(path), reference="none")


# -- 0-d inputs and empty files ------------------------------------------------------


def _scalar_policy(tmp_path, sr_data: str, accuracy: str = "") -> object:
    """y = x * float(sr): a VAD-like model whose sample rate `sr` is a 0-d int64 input."""
    m = model(
        [node("Cast", ["sr"], "srf", "cast", to=F), node("Mul", ["x", "srf"], "y", "mul")],
        [("x", F, [1, "t"]), ("sr", I64, [])],
        [("y", F, [1, "t"])],
    )
    onnx.save(m, tmp_path / "m.onnx")
    frames = np.random.default_rng(0).random((2, 1, 8), dtype=np.float32)
    np.savez(tmp_path / "frames.npz", x=frames, sr=np.array(16000, np.int64))
    np.savez(tmp_path / "long.npz", x=np.ones((1, 16), np.float32), sr=np.array(8000, np.int64))
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        "  x: {min: [1, 4], opt: [1, 8], max: [1, 16], data: {file: frames.npz}}\n"
        f"  sr: {{data: {sr_data}}}\n" + (f"accuracy:\n  {accuracy}\n" if accuracy else "")
    )
    return path


@pytest.mark.parametrize(
    "sr_data, want",
    [
        ("{file: frames.npz}", {"opt": 16000, "min": 16000, "max": 8000}),
        ("{low: 8000, high: 8001}", {"opt": 8000, "min": 8000, "max": 8000}),
    ],
)
def test_a_scalar_input_at_every_point_from_a_file_or_a_distribution(tmp_path, sr_data, want):
    path = _scalar_policy(tmp_path, sr_data, "shapes: {max: {data: {file: long.npz}}}")
    if "low" in sr_data:
        np.savez(tmp_path / "long.npz", x=np.ones((1, 16), np.float32))
    runs = _runs(path)
    for name, run in runs.items():
        sr = run.feeds[0]["sr"]
        assert type(sr) is np.ndarray and sr.shape == () and sr.dtype == np.int64
        assert int(sr) == want[name]
    assert runs["min"].data["x"].kind == "derived" and runs["max"].data["sr"].kind == (
        "file" if "file" in sr_data else "random"
    )
    # the 0-d sample rate is the same in every sample: it does not cut the 2 frames to one
    assert [len(runs[n].feeds) for n in ("opt", "min", "max")] == [2, 2, 1]
    if "file" in sr_data:
        assert runs["opt"].data["sr"].source == "frames.npz, the same in every sample"
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    shapes = json.loads((out / "report.json").read_text())["shapes"]
    assert [s["inputs"]["sr"] for s in shapes] == [[], [], []]


def test_a_points_file_without_samples_is_exit_2_naming_it(tmp_path, capsys):
    path = _policy(tmp_path, accuracy="shapes: {max: {data: {file: empty.npz}}}\n")
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 1, 12, 3), np.float32))
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path.resolve()}:6: accuracy.shapes.max.data.file: empty.npz holds no samples" in err
    assert "[0, 1, 12, 3]" in err
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 2
    assert "empty.npz holds no samples" in capsys.readouterr().err and not out.exists()


def test_an_inputs_file_without_samples_is_exit_2_naming_it(tmp_path):
    path = _policy(tmp_path)
    np.savez(tmp_path / "x.npz", x=np.zeros((0, 1, 5, 3), np.float32))
    with pytest.raises(
        UsageError, match=r"inputs\.x\.data\.file: x\.npz holds no samples of 'x'"
    ) as info:
        run_front(load_policy(path), reference="none")
    assert info.value.where == f"{path.resolve()}:4"


def test_the_real_silero_vad_takes_its_sample_rate_from_the_file(example_policy, tmp_path, capsys):
    """Silero VAD 6.2.3 with `sr` (int64, shape []) an input, not frozen: fed from the .npz
    beside its 31 frames, every frame is judged at 16 kHz."""
    path = example_policy("silero_vad")
    text = path.read_text()
    frames = re.search(r"data: \{file: (\S+\.npz)\}", text).group(1)
    with np.load(frames) as d:
        arrays = {k: d[k] for k in d.files}
    np.savez(tmp_path / "frames_sr.npz", **arrays, sr=np.array(16000, np.int64))
    text = text.replace(frames, str(tmp_path / "frames_sr.npz"))
    text = text.replace("  freeze_inputs: {sr: 16000}", "  fold_constants: true")
    path.write_text(text.replace("\npasses:", "\n  sr: {data: {file: frames_sr.npz}}\npasses:", 1))
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("PASSED at shape {input: [1, 576], state: [2, 1, 128], sr: []}")
    report = json.loads((out / "report.json").read_text())
    assert report["samples"] == 31
    assert report["shapes"][0]["data"]["sr"]["source"] == "frames_sr.npz, the same in every sample"


# -- reading only what a point uses, within accuracy.memory_budget ---------------------


def test_only_the_samples_a_point_uses_are_read(tmp_path, capsys):
    """NaN in the third sample: judged on two, the file is good; on three, exit 2."""
    frames = np.ones((3, 1, 5, 3), np.float32)
    frames[2, 0, 1, 1] = np.nan
    path = _policy(tmp_path, accuracy="samples: 2\n")
    np.savez(tmp_path / "x.npz", x=frames)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    path.write_text(path.read_text().replace("samples: 2", "samples: 3"))
    assert main(["check", "--policy", str(path)]) == 2
    assert "array 'x' holds 1 NaN value(s)" in capsys.readouterr().err


def test_synthetic_data_of_a_file_holding_inf_is_exit_2(tmp_path, capsys):
    """An attention mask's -inf has no mean nor std: the normal draws were NaN everywhere,
    and the reference's NaN was blamed on the model; tiling keeps the mask (here an
    Identity's, which passes it to its output: refused there as any inf output is)."""
    frames = FRAMES[:, None].copy()
    frames[:, 0, 1, 2] = -np.inf
    path = _policy(tmp_path, data="{file: x.npz, derive: synthetic}")
    np.savez(tmp_path / "x.npz", x=frames)
    assert main(["check", "--policy", str(path)]) == 2
    said = capsys.readouterr().err
    assert "inputs.x.data.file: array 'x' holds ±inf (a mask's?)" in said
    assert "set derive: tile" in said
    path.write_text(path.read_text().replace("derive: synthetic", "derive: tile"))
    assert main(["check", "--policy", str(path)]) == 2  # tiled, the -inf reaches the output
    assert "the FP32 reference of output 'y' holds inf" in capsys.readouterr().err


def test_synthetic_data_reading_a_whole_file_past_the_budget_is_exit_2(tmp_path, capsys):
    """derive: synthetic takes every sample's statistics: 2000 samples of 1000 values (8 MB)
    are over a 4 MiB budget, and said so before the file is read."""
    m = model([node("Identity", ["x"], "y", "id")], [("x", F, [1, "t"])], [("y", F, [1, "t"])])
    onnx.save(m, tmp_path / "m.onnx")
    np.savez_compressed(tmp_path / "x.npz", x=np.zeros((2000, 1, 1000), np.float32))
    data = "{file: x.npz, derive: synthetic}"
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        f"  x: {{min: [1, 500], opt: [1, 1000], max: [1, 2000], data: {data}}}\n"
        "accuracy: {memory_budget: 4MiB}\n"
    )
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "reading the data 7.63 MiB: x.npz 7.63 MiB" in err
    assert "accuracy.memory_budget is 4 MiB" in err
    assert "x.npz is read whole (derive: synthetic takes every sample's statistics)" in err


def test_an_inputs_file_may_be_one_npy_as_modelopt_calibrates_from(tmp_path):
    """`data: {file: calib.npy}` under an input: its one array is that input's, derived
    at the other points as an .npz member is, and ModelOpt's layout (the batches one after
    the other on the first axis, which the model fixes) is read as samples; a point's own
    file must name its inputs."""
    np.save(tmp_path / "calib.npy", FRAMES[:, None])
    runs = _runs(_policy(tmp_path, data="{file: calib.npy}"))
    np.testing.assert_array_equal(runs["opt"].feeds[1]["x"][0], FRAMES[1])
    assert runs["min"].data["x"].source == "calib.npy cropped on axis 1 (5 -> 2)"
    for order in ("C", "F"):  # ModelOpt's layout: [N*B, ...], the batch fixed; either order
        np.save(tmp_path / "calib.npy", np.asarray(FRAMES, order=order))
        batches = _runs(_policy(tmp_path, data="{file: calib.npy}"))
        assert len(batches["opt"].feeds) == 2
        assert (
            batches["opt"].data["x"].source
            == "calib.npy (its first axis, 2, read as 2 batches of 1)"
        )
        np.testing.assert_array_equal(batches["opt"].feeds[1]["x"][0], FRAMES[1])
        np.testing.assert_array_equal(batches["min"].feeds[1]["x"][0], FRAMES[1, :2])
    path = _policy(tmp_path, accuracy="shapes: {max: {data: {file: calib.npy}}}\n")
    with pytest.raises(UsageError, match=r"is one array \(\.npy\); a point's own file holds"):
        run_front(load_policy(path), reference="none")


def test_an_array_shaped_like_the_input_stays_one_sample_for_all_beside_a_batched_one(tmp_path):
    """`s` shaped like its input (batch 1) is the same in every sample; `x` in ModelOpt's
    layout (3 batches of 1) gives the samples; an empty `x` is named by its own shape."""
    m = model(
        [node("Mul", ["x", "s"], "y", "mul")],
        [("x", F, [1, 3]), ("s", F, [1, 3])],
        [("y", F, [1, 3])],
    )
    onnx.save(m, tmp_path / "m.onnx")
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.savez(tmp_path / "d.npz", x=x, s=np.full((1, 3), 2.0, np.float32))
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {data: {file: d.npz}}\n"
        "  s: {data: {file: d.npz}}\naccuracy:\n  samples: 8\n"
    )
    (run,) = run_front(load_policy(policy), reference="none").shapes
    assert [f["x"].tolist() for f in run.feeds] == [[r] for r in x.tolist()]
    assert all(f["s"].tolist() == [[2.0, 2.0, 2.0]] for f in run.feeds)
    np.savez(tmp_path / "d.npz", x=np.zeros((0, 3), np.float32), s=np.ones((1, 3), np.float32))
    with pytest.raises(UsageError, match=r"array 'x' has 0 on axis 0"):
        run_front(load_policy(policy), reference="none")


def test_synthetic_integer_data_is_said_as_drawn(tmp_path):
    """Token ids are drawn uniformly in the file's range: they were said to be "normal values
    with its mean, std and range", as floats are drawn."""
    m = model(
        [node("Identity", ["ids"], "y", "id")], [("ids", I64, [1, "t"])], [("y", I64, [1, "t"])]
    )
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "ids.npz", ids=np.arange(20, dtype=np.int64).reshape(2, 1, 10))
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  ids: {min: [1, 4], opt: [1, 10], max: [1, 33], "
        "data: {file: ids.npz, derive: synthetic}}\n"
    )
    said = _runs(path)["max"].data["ids"].source
    assert said.startswith("synthetic: uniform integers in ids.npz's range"), said
