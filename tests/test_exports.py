"""Real exports as they come: placeholder shapes, weights listed as inputs, shapes a model
cannot run, and a mixed model that is checked before it is written."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import onnxruntime as ort
import pytest

from tests.helpers import needs_rtx
from trtbuild.cli import main


def _policy(example_policy, **replace):
    return example_policy("legacy_detector", replace=replace)


def test_the_ir3_model_builds_and_its_mixed_model_is_valid(example_policy, tmp_path, capsys):
    out = tmp_path / "out"
    policy = _policy(example_policy)
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 0
    mixed = onnx.load(out / "mixed.onnx")
    onnx.checker.check_model(mixed, full_check=True)
    ort.InferenceSession(mixed.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.name for i in mixed.graph.input] == ["input"]  # the weights are weights only
    dims = [d.dim_param or d.dim_value for d in mixed.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, "height", "width"]
    import json

    passes = {p["pass"]: p for p in json.loads((out / "build.json").read_text())["passes"]}
    assert passes["override_input_shapes"]["changed"] == 1
    assert passes["drop_initializer_inputs"]["changed"] == 5
    assert "shape inference failed" not in capsys.readouterr().err


def test_without_the_override_the_mismatch_points_to_it(example_policy, tmp_path, capsys):
    policy = _policy(
        example_policy, **{"  override_input_shapes: {input: [1, 3, height, width]}\n": ""}
    )
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "does not fit the model's [10, 3, 32, 32]" in err
    assert "passes.override_input_shapes" in err


def test_an_unknown_input_in_the_override_is_exit_2(example_policy, capsys):
    policy = _policy(example_policy, **{"{input: [1, 3, height, width]}": "{image: [1, 3, 8, 8]}"})
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "passes.override_input_shapes.image: the model has no input 'image'" in err


def test_a_shape_the_model_cannot_run_is_exit_2_naming_shape_and_node(
    example_policy, tmp_path, capsys
):
    policy = _policy(example_policy, **{"shape: [1, 3, 96, 128]": "shape: [1, 3, 90, 128]"})
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "cannot run at shape [1, 3, 90, 128] in node merge" in err
    assert not out.exists()


def test_tune_says_when_its_budget_cut_the_search_short_and_which_point_costs_most(
    example_policy, tmp_path, capsys
):
    """A search that ends on its last evaluation says nothing of the budget; one the budget
    stops with more to try says so (the point that took the most judging time, where it
    judged several: `test_the_costliest_point_is_named_only_among_several_judged`)."""
    finished = example_policy("matting", rules="[]")  # the range analysis's start passes
    argv = ["tune", "-o", str(tmp_path / "t.yaml"), "--budget", "1", "--jobs", "1"]
    assert main([*argv, "--policy", str(finished)]) == 0
    assert "budget" not in capsys.readouterr().err
    exact = {"{atol: 0.02, rtol: 0, check_error_stat: max}": "{atol: 1e-7, rtol: 0}"}
    cut = example_policy("matting", rules="[]", replace=exact)  # the start fails
    assert main([*argv, "--policy", str(cut)]) == 1
    err = capsys.readouterr().err
    assert "tune's budget of 1 evaluations ran out before the search ended" in err
    assert "raise --budget" in err
    # the first trial walks the cheapest point first, fails there and judges no other: no
    # point is named as the costliest (the others' cost is not known)
    assert "most of the judging time went to" not in err
    assert "DOES NOT PASS (budget exhausted)" in (tmp_path / "t.yaml").read_text()


def test_the_costliest_point_is_named_only_among_several_judged():
    """Two points judged: the one that took most of the judging time, with its share; one
    judged (a search cut short at its first, cheapest point): none, since it says nothing
    of what the others cost; one point in the policy: none."""
    from trtbuild.policy.specs import Precision
    from trtbuild.tuning.search import SearchResult

    def result(seconds: dict, points: int = 3) -> SearchResult:
        return SearchResult(Precision(), [], [], {}, "", point_seconds=seconds, points=points)

    both = result({"min [1, 3, 256, 256]": 1.0, "max [1, 3, 1024, 1024]": 3.0})
    assert both.costliest_point == "max [1, 3, 1024, 1024] (75% of the judging time)"
    assert result({"min [1, 3, 256, 256]": 1.0}).costliest_point is None
    assert result({"x [1, 4]": 1.0, "y [2, 4]": 2.0}, points=1).costliest_point is None


# The lines trtbuild writes on a build: its verdict, the outputs and shapes under it, the
# ops at risk, the baseline, progress, warnings and errors.
OURS = ("PASSED", "FAILED", "  ", "at risk", "all-FP16", "wrote ", "trtbuild: ", "judging ")
OURS += ("FP32 reference",)


@pytest.mark.parametrize("name", ["legacy_detector", "bert"])
@needs_rtx
def test_a_cold_build_prints_only_trtbuild_lines(example_policy, tmp_path, name):
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "trtbuild", "build", "--policy", str(example_policy(name))]
    done = subprocess.run(
        [*cmd, "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = [x for x in (done.stdout + done.stderr).splitlines() if x.strip()]
    foreign = [x for x in lines if not x.startswith(OURS)]
    assert lines and not foreign
