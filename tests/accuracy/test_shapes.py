"""Accuracy over the input space: every profile point and named shape is judged.

The GFPGAN-style generator with a dynamic H x W (`policies/gfpgan_dynamic.yaml`)
has a final reduction that fits FP16 at `opt` and is inf at `max`: judged at
`opt` alone, all-FP16 would pass.
"""

from __future__ import annotations

import json

from trtbuild.cli import main
from trtbuild.policy import load_policy


def _build(policy, out) -> int:
    return main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])


def test_unpinned_the_reduction_fails_at_max_and_the_verdict_names_it(
    example_policy, tmp_path, capsys
):
    policy = example_policy("gfpgan_dynamic", rules="[]")
    assert _build(policy, tmp_path / "out") == 1
    said = capsys.readouterr().out
    assert said.startswith("FAILED at max [1, 3, 256, 256]")
    first = next(line for line in said.splitlines() if "first divergence at" in line)
    assert first.startswith("  first divergence at /energy/ReduceSumSquare (")
    assert first.endswith(", at max [1, 3, 256, 256]")  # the point it was walked at, named
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    verdicts = {s["name"]: s["passed"] for s in report["shapes"]}
    assert verdicts == {"opt": True, "min": True, "max": False} and not report["passed"]
    maximum = next(s for s in report["shapes"] if s["name"] == "max")
    assert maximum["inputs"] == {"input": [1, 3, 256, 256]}
    assert maximum["outputs"]["energy"]["nonfinite"] > 0
    assert maximum["first_divergence"]["node"] == "/energy/ReduceSumSquare"
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert (
        junit.count("<testcase") == 6 and 'name="energy @ max [1, 3, 256, 256]"><failure' in junit
    )
    # where it fails: the top-level figures are opt's (the primary point), so report.json
    # names the failing points, and the reports show max first. report.md showed opt's
    # outputs, all passing, and "not searched" beside FAILED.
    assert report["failed_points"] == ["max"] and report["outputs"]["energy"]["passed"]
    fp16 = report["baselines"]["fp16"]
    assert fp16["passed"] is False and fp16["failed_points"] == ["max"]
    md = (tmp_path / "out" / "report.md").read_text()
    outputs = md.split("## Outputs (policy, at max [1, 3, 256, 256])\n", 1)[1].split("\n## ", 1)[0]
    assert "| `energy` | **FAIL**" in outputs and "| `energy` | pass" not in outputs, outputs
    assert "First divergence (policy): `/energy/ReduceSumSquare`" in outputs, outputs
    assert "## Error along the graph, at max [1, 3, 256, 256]" in md


def test_pinned_it_passes_at_all_three_shapes(example_policy, tmp_path):
    assert _build(example_policy("gfpgan_dynamic"), tmp_path / "out") == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["name"] for s in report["shapes"]] == ["opt", "min", "max"]
    assert all(s["passed"] for s in report["shapes"])
    assert not next(s for s in report["shapes"] if s["name"] == "max")["baselines"]["fp16"][
        "passed"
    ]  # what the pin buys, at the shape that needs it
    assert report["failed_points"] == [] and report["baselines"]["fp16"]["failed_points"] == ["max"]
    assert report["baselines"]["fp16"]["passed"] is False  # at every point, as `passed`
    assert (
        "## Outputs (policy, at opt [1, 3, 64, 64])" in (tmp_path / "out" / "report.md").read_text()
    )


def test_tune_from_no_rules_pins_the_reduction(example_policy, tmp_path):
    tuned = tmp_path / "tuned.yaml"
    assert (
        main(
            [
                "tune",
                "--policy",
                str(example_policy("gfpgan_dynamic", rules="[]")),
                "-o",
                str(tuned),
            ]
        )
        == 0
    )
    names = [r.match.name for r in load_policy(tuned).precision.rules]
    assert names == [r"^/energy/ReduceSumSquare$"]


def test_a_named_shape_is_judged_beside_the_profile(example_policy, tmp_path):
    policy = example_policy(
        "gfpgan_dynamic", accuracy={"shapes": "{wide: {input: [1, 3, 32, 128]}}"}
    )
    assert _build(policy, tmp_path / "out") == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    wide = next(s for s in report["shapes"] if s["name"] == "wide")
    assert wide["inputs"] == {"input": [1, 3, 32, 128]} and wide["passed"]


def test_a_static_policy_is_judged_once(write_policy, tmp_path):
    assert _build(write_policy(), tmp_path / "out") == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["name"] for s in report["shapes"]] == ["shape"]
    assert "## Shapes" not in (tmp_path / "out" / "report.md").read_text()


# -- real data at every point: the matting example (photos) and the denoiser (.npz) -----


def test_photos_judged_at_every_point_and_opt_alone_would_have_passed(
    example_policy, tmp_path, capsys
):
    """The matting example unpinned: the photos pass at min and opt and fail at max, where the
    context sum leaves FP16; the verdict names every point and the data."""
    out = tmp_path / "out"
    assert _build(example_policy("matting", rules="[]"), out) == 1
    said = capsys.readouterr().out
    assert said.startswith(
        "FAILED at max [1, 3, 1024, 1024]; passed at min [1, 3, 256, 256], opt [1, 3, 512, 512] "
        "(emulated-fp16, storage emulation; image data at min; upsampled image data at opt, max)"
    )
    # the photos are 512x512 and 300x451: larger points are fit from them, and say so
    assert (
        "  data at max [1, 3, 1024, 1024]: images portraits/ resized to 1024x1024; 2 of 2 images "
        "upsampled up to 3.41x from 300x451 (chelsea.png): detail above that is not real data"
    ) in said
    report = json.loads((out / "report.json").read_text())
    shapes = {s["name"]: s for s in report["shapes"]}
    assert {n: s["passed"] for n, s in shapes.items()} == {"opt": True, "min": True, "max": False}
    assert shapes["max"]["data"]["input"]["kind"] == "upsampled"
    assert shapes["min"]["data"]["input"] == {
        "kind": "images",
        "source": "images portraits/ resized to 256x256",
    }
    assert shapes["max"]["first_divergence"]["node"] == "/context/ReduceSum"
    assert report["data"] == "image data at min; upsampled image data at opt, max"
    md = (out / "report.md").read_text()
    assert "upsampled 1.71x from 300x451 (chelsea.png): detail above that is not real data" in md


def test_tune_on_photos_meets_the_tolerance_at_max(example_policy, tmp_path, capsys):
    tuned = tmp_path / "tuned.yaml"
    policy = example_policy("matting", rules="[]")
    assert main(["tune", "--policy", str(policy), "-o", str(tuned)]) == 0
    assert "^/context/ReduceSum$" in tuned.read_text()
    capsys.readouterr()
    assert _build(tuned, tmp_path / "out") == 0
    assert capsys.readouterr().out.startswith(
        "PASSED at min [1, 3, 256, 256], opt [1, 3, 512, 512], max [1, 3, 1024, 1024]"
    )


def test_a_file_of_299_frames_is_judged_at_1000_and_says_how(example_policy, tmp_path, capsys):
    out = tmp_path / "out"
    assert _build(example_policy("denoiser", rules="[]"), out) == 1
    said = capsys.readouterr().out
    assert said.startswith(
        "FAILED at max [1, 1000, 161]; passed at min [1, 1, 161], opt [1, 299, 161]"
    )
    assert "file data at opt; data derived from a file at min, max" in said.splitlines()[0]
    assert "  data at max [1, 1000, 161]: denoiser_frames.npz tiled on axis 1 (299 -> 1000)" in said
    shapes = {s["name"]: s for s in json.loads((out / "report.json").read_text())["shapes"]}
    assert shapes["max"]["data"]["spec"]["kind"] == "derived"
    assert shapes["max"]["first_divergence"]["node"] == "/norm/ReduceSum"
    md = (out / "report.md").read_text()
    assert "denoiser_frames.npz tiled on axis 1 (299 -> 1000)" in md


def test_the_nightly_history_keeps_where_the_photos_were_upsampled(example_policy, tmp_path):
    import sqlite3

    folder, history = tmp_path / "policies", tmp_path / "h.sqlite"
    folder.mkdir()
    example_policy("matting").rename(folder / "matting.yaml")
    args = ["nightly", "--policies", str(folder), "--out", str(tmp_path / "nightly")]
    assert main([*args, "--history", str(history), "--backend", "none"]) == 0
    (shapes,) = sqlite3.connect(history).execute("SELECT shapes FROM results").fetchone()
    data = {s["name"]: s["data"]["input"] for s in json.loads(shapes)}
    assert data["min"]["kind"] == "images" and data["max"]["kind"] == "upsampled"
    assert data["opt"]["source"] == (
        "images portraits/ resized to 512x512; 1 of 2 images upsampled 1.71x from 300x451 "
        "(chelsea.png): detail above that is not real data"
    )
