"""The README's examples are run, so none can drift from what trtbuild does."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.conftest import ROOT
from trtbuild.cli import main
from trtbuild.policy import Policy, load_policy

README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    """The fenced blocks of `lang` ("" for plain text), each opening fence with its close."""
    found, block, kind = [], None, None
    for line in README.splitlines(keepends=True):
        if line.startswith("```") and block is None:
            block, kind = [], line[3:].strip()
        elif line.startswith("```"):
            if kind == lang:
                found.append("".join(block))
            block = None
        elif block is not None:
            block.append(line)
    return found


def test_the_demo_output_is_what_the_demo_prints(example_policy, tmp_path, capsys):
    """`make demo`'s lines in the README, but for the folder they name."""
    shown = next(b for b in _blocks("") if b.startswith(("PASSED", "FAILED")))
    out = tmp_path / "nafnet"
    assert main(["build", "--policy", str(example_policy("nafnet")), "--out", str(out)]) == 0
    said = capsys.readouterr().out.replace(f"wrote {out}/", "wrote build/nafnet/")
    assert said == shown
    # strict JSON, which any parser reads: no `Infinity` or `NaN`, at any depth (the simple
    # check's `worst` of the baseline's inf output was written bare)
    strict = {"parse_constant": lambda c: pytest.fail(f"not JSON: {c}")}
    json.loads((out / "build.json").read_text(), **strict)
    baseline = json.loads((out / "report.json").read_text(), **strict)["baselines"]["fp16"]
    assert "`baselines.fp16.outputs.total.max_abs`" in README  # as said after the lines
    assert baseline["outputs"]["total"]["max_abs"] == "inf"
    worst = baseline["outputs"]["total"]["checks"]["simple"]["worst"]
    assert (worst["abs"], worst["rel"]) == ("inf", "inf")  # inf against a finite FP32 value


def test_the_first_policy_is_a_valid_policy(tmp_path):
    text = next(b for b in _blocks("yaml") if "model: my_model.onnx" in b)
    (tmp_path / "samples").mkdir()
    policy = Policy.from_dict(yaml.safe_load(text), base_dir=tmp_path, name="my")
    assert [s.name for s in policy.inputs] == ["image"]
    assert policy.inputs[0].data.images.folder == (tmp_path / "samples").resolve()
    assert [r.id for r in policy.precision.rules] == ["ln-after-attention", "last-reduction"]


def test_the_python_api_example_runs(models_dir, tmp_path, capsys):
    """A policy made in code, tuned, written and built, as the README shows it."""
    code = next(b for b in _blocks("python") if "import trtbuild" in b)
    model = "models/gfpgan_dynamic.onnx"
    assert model in code
    code = code.replace(model, str(models_dir / "gfpgan_dynamic.onnx"))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    said = capsys.readouterr()
    assert said.out.splitlines()[0].startswith("True ") and said.err == ""
    text = (tmp_path / "gfpgan.tuned.yaml").read_text()
    tuned = load_policy(tmp_path / "gfpgan.tuned.yaml")
    assert [r.id for r in tuned.precision.rules] == ["tuned-1"]
    assert "    # reduction /energy/ReduceSumSquare: reaches |x| = " in text  # the pin's reason
    built = json.loads((tmp_path / "build" / "gfpgan.tuned" / "build.json").read_text())
    assert built["policy"] == str(tmp_path.resolve() / "gfpgan.tuned.yaml")
    assert built["hashes"]["policy"] == tuned.sha256
