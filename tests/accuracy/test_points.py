"""Every point of the input space is judged, whatever the data; none is dropped silently."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import onnx
import pytest
from PIL import Image

from tests.helpers import F, model, node
from trtbuild.accuracy.points import point_label, shape_points
from trtbuild.cli import main
from trtbuild.errors import UsageError
from trtbuild.front import run_front
from trtbuild.policy import Policy, load_policy


def _policy(tmp_path, inputs: str, accuracy: str = "") -> object:
    """An identity over [1, 3, h, w] with an image folder of two photos of other sizes."""
    dims = [1, 3, "h", "w"]
    onnx.save(
        model([node("Identity", ["x"], "y", "id")], [("x", F, dims)], [("y", F, dims)]),
        tmp_path / "m.onnx",
    )
    (tmp_path / "images").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i, size in enumerate(((20, 30), (16, 16))):
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "images" / f"{i}.png")
    path = tmp_path / "p.yaml"
    text = f"version: 1\nmodel: m.onnx\ninputs:\n  x:\n{textwrap.indent(inputs, '    ')}"
    path.write_text(text + (f"accuracy:\n{textwrap.indent(accuracy, '  ')}" if accuracy else ""))
    return path


PROFILE = "min: [1, 3, 8, 8]\nopt: [1, 3, 16, 16]\nmax: [1, 3, 32, 24]\ndata: {images: images}\n"


def test_image_data_is_judged_at_every_profile_point_and_named_point(tmp_path):
    path = _policy(tmp_path, PROFILE, "shapes: {wide: {x: [1, 3, 16, 24]}}\n")
    front = run_front(load_policy(path), reference="none")
    got = {r.point.name: r.feeds[0]["x"].shape for r in front.shapes}
    assert got == {
        "opt": (1, 3, 16, 16),
        "min": (1, 3, 8, 8),
        "max": (1, 3, 32, 24),
        "wide": (1, 3, 16, 24),
    }
    data = {r.point.name: r.data["x"] for r in front.shapes}
    assert all(len(run.feeds) == 2 for run in front.shapes)
    assert data["opt"].kind == data["min"].kind == "images"
    assert data["min"].source == "images images/ resized to 8x8"
    # 20x30 and 16x16 photos: each point is fit from them, and one larger than a photo says so
    assert data["max"].kind == data["wide"].kind == "upsampled"
    assert data["max"].source == (
        "images images/ resized to 32x24; 2 of 2 images upsampled up to 2x from 16x16 (1.png): "
        "detail above that is not real data"
    )
    assert data["wide"].source.endswith(
        "1 of 2 images upsampled 1.5x from 16x16 (1.png): detail above that is not real data"
    )


def test_a_named_point_outside_the_profile_is_exit_2_with_image_data(tmp_path, capsys):
    path = _policy(tmp_path, PROFILE, "shapes: {huge: {x: [1, 3, 64, 64]}}\n")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    said = "accuracy.shapes.huge.x: [1, 3, 64, 64] is outside the optimization profile"
    assert f"{path.resolve()}:10: {said}" in err, err  # the line of `shapes: {huge: ...}`
    assert "[1, 3, 8, 8] .. [1, 3, 32, 24]" in err


def test_a_point_beside_a_static_shape_is_outside_what_the_engine_is_built_for(tmp_path):
    path = _policy(tmp_path, "shape: [1, 3, 16, 16]\n", "shapes: {big: {x: [1, 3, 32, 32]}}\n")
    with pytest.raises(UsageError, match="outside the static shape \\[1, 3, 16, 16\\]"):
        shape_points(load_policy(path), onnx.load(tmp_path / "m.onnx"))


def test_a_profile_point_takes_its_dims_from_the_profile(tmp_path):
    path = _policy(tmp_path, PROFILE, "shapes: {max: {x: [1, 3, 30, 24]}}\n")
    with pytest.raises(UsageError, match="differs from the profile's max") as info:
        run_front(load_policy(path), reference="none")
    assert "give only data or skip there" in str(info.value)
    assert info.value.where == f"{path.resolve()}:10"


def test_a_skipped_point_is_named_in_every_verdict(tmp_path, capsys):
    path = _policy(tmp_path, PROFILE, "shapes: {min: {skip: warm-up shape only}}\n")
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("PASSED at opt [1, 3, 16, 16], max [1, 3, 32, 24] (")
    assert "  not judged: min [1, 3, 8, 8] (warm-up shape only)" in said
    report = json.loads((out / "report.json").read_text())
    assert [s["name"] for s in report["shapes"]] == ["opt", "max"]
    assert report["skipped_shapes"] == [
        {"name": "min", "inputs": {"x": [1, 3, 8, 8]}, "reason": "warm-up shape only"}
    ]
    assert "<skipped message=" in (out / "junit.xml").read_text()
    assert "Not judged: min [1, 3, 8, 8]: warm-up shape only." in (out / "report.md").read_text()


def test_skipping_every_point_is_exit_2(tmp_path, capsys):
    path = _policy(
        tmp_path,
        "shape: [1, 3, 16, 16]\ndata: {images: images}\n",
        "shapes: {shape: {skip: none today}}\n",
    )
    assert main(["check", "--policy", str(path)]) == 2
    assert f"{path.resolve()}:8: accuracy.shapes: every point is skipped" in capsys.readouterr().err


def test_skip_true_asks_for_the_reason(tmp_path, capsys):
    path = _policy(tmp_path, PROFILE, "shapes: {min: {skip: true}}\n")
    assert main(["check", "--policy", str(path)]) == 2
    assert 'say why the point is not judged: skip: "the reason"' in capsys.readouterr().err


def test_min_equal_to_opt_is_judged_once_under_both_names(tmp_path):
    inputs = "min: [1, 3, 16, 16]\nopt: [1, 3, 16, 16]\nmax: [1, 3, 32, 24]\n"
    points = shape_points(load_policy(_policy(tmp_path, inputs)), onnx.load(tmp_path / "m.onnx"))
    assert [p.name for p in points] == ["opt=min", "max"]


EQUAL = "min: [1, 3, 16, 16]\nopt: [1, 3, 16, 16]\nmax: [1, 3, 32, 24]\n"


def test_equal_points_with_files_of_their_own_are_each_judged_on_theirs(tmp_path, capsys):
    files = "shapes: {min: {data: {file: a.npz}}, opt: {data: {file: b.npz}}}\n"
    path = _policy(tmp_path, EQUAL, files)
    np.savez(tmp_path / "a.npz", x=np.full((1, 3, 16, 16), 1.0, np.float32))
    np.savez(tmp_path / "b.npz", x=np.full((1, 3, 16, 16), 2.0, np.float32))
    runs = {r.point.name: r for r in run_front(load_policy(path), reference="none").shapes}
    assert list(runs) == ["opt", "min", "max"]  # neither file goes unread
    assert runs["min"].feeds[0]["x"].max() == 1.0 and runs["opt"].feeds[0]["x"].max() == 2.0
    assert runs["min"].data["x"].source == "a.npz (this point's own)"
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    assert capsys.readouterr().out.startswith(
        "PASSED at min [1, 3, 16, 16], opt [1, 3, 16, 16], max [1, 3, 32, 24]"
    )


def test_equal_points_with_one_file_between_them_are_each_judged_on_their_data(tmp_path):
    """min has the inputs' data (random here), opt its own file: both are read."""
    path = _policy(tmp_path, EQUAL, "shapes: {opt: {data: {file: b.npz}}}\n")
    np.savez(tmp_path / "b.npz", x=np.full((1, 3, 16, 16), 2.0, np.float32))
    runs = run_front(load_policy(path), reference="none").shapes
    assert [r.point.name for r in runs] == ["opt", "min", "max"]
    assert runs[0].data["x"].source == "b.npz (this point's own)"
    assert runs[1].data["x"].kind == "random"


def test_a_named_point_of_opts_shape_with_its_own_file_leaves_opts_data_judged(tmp_path, capsys):
    """opt's data (the inputs' file) overflows FP16 behind a Clip; a named point of opt's
    shape with a file of its own that does not absorbed opt, and that file alone was judged
    there: PASS, where the same policy without the named point fails."""
    dims = [1, "t"]
    nodes = [node("Mul", ["x", "c"], "p", "mul"), node("Clip", ["p", "lo", "hi"], "y", "clip")]
    consts = {"c": np.float32(6e4), "lo": np.float32(0), "hi": np.float32(1000)}
    m = model(nodes, [("x", F, dims)], [("y", F, dims)], consts)
    onnx.save(m, tmp_path / "m.onnx")
    hot = np.full((1, 1, 4), 0.5, np.float32)
    hot[0, 0, 3] = 1.2  # 72000 in FP16 is inf; the Clip hides it
    np.savez(tmp_path / "x.npz", x=hot)
    np.savez(tmp_path / "own.npz", x=np.full((1, 1, 4), 0.5, np.float32))
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nmodel: m.onnx\nprecision: {guards: false}\ninputs:\n"
        "  x: {min: [1, 2], opt: [1, 4], max: [1, 4], data: {file: x.npz}}\n"
        "accuracy:\n  tolerances: {default: {atol: 1}}\n"
        "  shapes: {named: {x: [1, 4], data: {file: own.npz}}}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 1
    said = capsys.readouterr().out
    assert said.startswith("FAILED at opt=max [1, 4]; passed at min [1, 2], named [1, 4]")
    assert "masked overflow at opt=max [1, 4]: mul (Mul)" in said


def test_an_input_named_with_a_dot_is_quoted_in_the_field_to_fix(tmp_path, capsys):
    """A shape that does not fit PyTorch's `input.1`: the field to fix reads as one key."""
    m = model(
        [node("Relu", ["input.1"], "y", "relu")], [("input.1", F, [1, 4])], [("y", F, [1, 4])]
    )
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        'version: 1\nmodel: m.onnx\ninputs:\n  "input.1": {shape: [1, 4, 2]}\n'
    )
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        f'{(tmp_path / "p.yaml").resolve()}:4: inputs."input.1".shape: rank 3 does not fit' in err
    )


def test_an_input_the_model_lacks_is_exit_2_at_the_line_of_its_key(tmp_path, capsys):
    """Found against the model, after loading: the message names the line of `nope:`, as the
    loader's own messages do; a policy made in code has no line to name."""
    path = _policy(tmp_path, "shape: [1, 3, 16, 16]\n")
    path.write_text(path.read_text() + "  nope:\n    shape: [1, 4]\n")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    said = f"trtbuild: error: {path.resolve()}:6: inputs.nope: the model has no input 'nope'"
    assert err.startswith(said), err
    doc = {"version": 1, "model": "m.onnx", "inputs": {"x": {"shape": [1, 3, 16, 16]}, "nope": {}}}
    made = Policy.from_dict(doc, base_dir=tmp_path, name="mine")
    with pytest.raises(UsageError, match=r"inputs\.nope: the model has no input") as info:
        shape_points(made, onnx.load(tmp_path / "m.onnx"))
    assert info.value.where == "<policy mine>"


@pytest.mark.parametrize(
    ("inputs", "accuracy", "line", "said"),
    [
        ("data: {low: 0}\n", "", 4, "inputs.x: the model's input 'x' has dynamic shape"),
        (PROFILE, "shapes: {wide: {nope: [1, 2]}}\n", 10, "accuracy.shapes.wide: the model has"),
        (PROFILE, "shapes: {wide: {x: [1, 3, 16]}}\n", 10, "accuracy.shapes.wide.x: rank 3"),
        ("shape: [1, 3, 8, 8]\n", "shapes: {min: {x: [1, 3, 8, 8]}}\n", 7, "accuracy.shapes.min:"),
    ],
    ids=["dynamic-unshaped", "point-unknown-input", "point-rank", "min-without-profile"],
)
def test_a_point_or_input_found_wrong_against_the_model_names_its_line(
    tmp_path, capsys, inputs, accuracy, line, said
):
    """Each of these is found against the model, after loading: the message names the line
    of the field to fix in the policy file, as the loader's own messages do."""
    path = _policy(tmp_path, inputs, accuracy)
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trtbuild: error: {path.resolve()}:{line}: {said}"), err


def test_an_input_given_a_shape_and_frozen_says_it_is_frozen(tmp_path, capsys, monkeypatch):
    """A conformer's `lengths` given a shape and data under `inputs` and frozen under
    `passes.freeze_inputs`: "the model has no input 'lengths' (name one of the model's
    inputs: mel)" for an input the model has. It says the input is frozen and what to do,
    under `inputs` and under a named point alike; without it the policy checks."""
    m = model(
        [node("Mul", ["mel", "lengths"], "y", "scale")],
        [("mel", F, [2, 4]), ("lengths", F, [4])], [("y", F, [2, 4])],
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    frozen = "passes:\n  freeze_inputs: {lengths: [1.0, 2.0, 3.0, 4.0]}\n"
    given = "version: 1\nmodel: m.onnx\ninputs:\n  mel: {shape: [2, 4]}\n  lengths: {shape: [4]}\n"
    (tmp_path / "p.yaml").write_text(given + frozen)
    assert main(["check", "--policy", "p.yaml"]) == 2
    err = capsys.readouterr().err
    assert "p.yaml:5: inputs.lengths: input 'lengths' is frozen by passes.freeze_inputs" in err
    assert "has no input" not in err
    point = "accuracy:\n  shapes:\n    other: {lengths: [4]}\n"
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\n" + frozen + point)
    assert main(["check", "--policy", "p.yaml"]) == 2
    err = capsys.readouterr().err
    assert "p.yaml:7: accuracy.shapes.other: input 'lengths' is frozen" in err
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\n" + frozen)
    assert main(["check", "--policy", "p.yaml"]) == 0


def test_a_point_of_a_model_without_inputs_says_so():
    """`measured at shape {}` read as a bug of the tool; a model taking no inputs (a
    generator with its seed baked in) has one point and nothing to name in it."""
    assert point_label("shape", {}) == "shape (no inputs)"
    assert point_label("max", {"x": (1, 3)}) == "max [1, 3]"


def test_an_input_declared_with_a_dim_of_0_is_said_so_not_dynamic(tmp_path, capsys):
    """ONNX's empty-set reductions declare `data` as `[2, 0, 4]`: it was said to have a
    dynamic shape `[2, '?', 4]` with the hint to give a `shape:`, which the policy then
    refused for its 0 (`must be at least 1`)."""
    onnx.save(
        model([node("Relu", ["x"], "y", "relu")], [("x", F, [2, 0, 4])], [("y", F, [2, 0, 4])]),
        tmp_path / "m.onnx",
    )
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\n")
    assert main(["check", "--policy", str(tmp_path / "p.yaml"), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "declares a dim of 0 ([2, 0, 4]: an empty tensor)" in err
    assert "dynamic" not in err and "Traceback" not in err
