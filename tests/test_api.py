"""trtbuild as a library: every function on an example policy, from Python, printing nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import pytest
import yaml

import trtbuild
from trtbuild.cli import main
from trtbuild.errors import EXIT_USAGE


def test_check_lists_every_node_with_its_rule(example_policy, capsys):
    result = trtbuild.check(trtbuild.load_policy(example_policy("nafnet")))
    pinned = [n for n in result.nodes if n.precision == "fp32"]
    assert "final-reduction" in {n.rule for n in pinned}
    assert all(n.reason for n in result.nodes)
    assert 0.4 < result.low_precision_share < 0.5
    assert result.points[0].data["input"]["kind"] == "random"
    assert result.points[0].inputs == {"input": (1, 3, 64, 64)}
    assert capsys.readouterr().out == ""


def test_convert_returns_the_validated_mixed_model(example_policy, capsys):
    model = trtbuild.convert(example_policy("nafnet"))
    assert isinstance(model, onnx.ModelProto)
    types = {vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    assert onnx.TensorProto.FLOAT16 in types and onnx.TensorProto.FLOAT in types
    assert capsys.readouterr().out == ""


def test_build_writes_and_returns_the_verdict(example_policy, tmp_path, capsys):
    result = trtbuild.build(example_policy("gfpgan_dynamic", rules="[]"), tmp_path / "out", "none")
    assert not result.passed and result.exit_code == 1
    assert [p.name for p in result.points] == ["opt", "min", "max"]
    assert not next(p for p in result.points if p.name == "max").passed
    assert result.outputs["energy"].passed  # at the primary point, opt
    assert result.outputs == result.points[0].outputs
    energy = result.points[2].outputs["energy"]
    assert energy.max_abs > 0 and not energy.passed and isinstance(energy.failed_samples, tuple)
    assert result.points[0].inputs["input"] == (1, 3, 64, 64)
    assert result.files["report.json"] == tmp_path / "out" / "report.json"
    assert result.report.passed is False
    assert capsys.readouterr().out == ""


def test_convert_front_holds_the_assignment_beside_the_same_model(example_policy):
    """What the CLI prints (shares, casts) comes with the model `convert` returns."""
    from trtbuild.api import convert_front

    policy = example_policy("nafnet")
    front, data = convert_front(policy)
    assert data == front.converted.model.SerializeToString()  # what `convert` writes
    summary = front.assignment.summary()
    assert summary.fp32_nodes > 0 and 0.4 < summary.low_share < 0.5 and front.converted.casts
    types = {vi.type.tensor_type.elem_type for vi in front.converted.model.graph.value_info}
    assert onnx.TensorProto.FLOAT16 in types


def test_convert_starts_its_checks_children_ahead_only_where_it_prepares_the_graph(
    example_policy, tmp_path, monkeypatch
):
    """A cold `convert` starts the children its check will load in (`validate.AHEAD`, the
    first at the default priority, the others lower) before the graph passes, so their
    imports run beside them; one checking the whole model starts one; a convert whose
    prepared graph and mixed model are cached starts none."""
    from trtbuild import front as front_mod
    from trtbuild.precision import ort_child, validate

    seen: list[object] = []
    start, prepare = ort_child.start, front_mod.prepare
    monkeypatch.setattr(ort_child, "start", lambda nice=0: seen.append(nice) or start(nice))
    monkeypatch.setattr(
        front_mod, "prepare", lambda *a, **k: seen.append("prepare") or prepare(*a, **k)
    )
    cache = trtbuild.open_cache(tmp_path / "cache")
    policy = example_policy("nafnet")
    trtbuild.convert(policy, cache=cache)
    ahead = [0] + [ort_child.SPARE_NICE] * (validate.AHEAD - 1)
    assert seen[: validate.AHEAD + 1] == [*ahead, "prepare"], seen
    seen.clear()
    trtbuild.convert(policy, cache=cache)
    assert seen == []
    loaded = trtbuild.load_policy(policy)
    whole = dataclasses.replace(loaded, build=dataclasses.replace(loaded.build, ort_check="whole"))
    trtbuild.convert(whole, cache=None)
    assert seen[:2] == [0, "prepare"], seen


def test_tune_returns_a_policy_that_passes(example_policy, tmp_path, capsys):
    seen = []
    result = trtbuild.tune(
        example_policy("gfpgan_dynamic", rules="[]"),
        jobs=1,
        progress=lambda trial, budget: seen.append((trial.step, budget)),
    )
    assert result.passed and result.evaluations >= 1
    assert seen == [(k + 1, 100) for k in range(result.evaluations)]
    assert len(result.search.trials) == result.evaluations and not result.search.exhausted
    assert any("ReduceSumSquare" in (r.match.name or "") for r in result.policy.precision.rules)
    assert trtbuild.build(result.policy, tmp_path / "out", "none").passed
    assert capsys.readouterr().out == ""


def test_errors_are_exceptions_with_the_exit_code(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmodel: m.onnx\nprecision: {default: fp8}\n")
    with pytest.raises(trtbuild.TrtbuildError) as info:
        trtbuild.check(bad)
    assert info.value.exit_code == EXIT_USAGE and "precision.default" in str(info.value)


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError):
        trtbuild.frobnicate  # noqa: B018


def test_a_cache_from_open_cache_serves_the_second_call(example_policy, tmp_path):
    cache = trtbuild.open_cache(tmp_path / "cache")
    first = trtbuild.check(example_policy("nafnet"), cache=cache)
    again = trtbuild.open_cache(tmp_path / "cache")
    second = trtbuild.check(example_policy("nafnet"), cache=again)
    assert again.hits["prepared"] == "hit" and second.nodes == first.nodes


def test_a_cache_without_codec_is_refused_before_any_work(example_policy, tmp_path):
    from trtbuild.cache import Cache

    with pytest.raises(ValueError, match="open_cache"):
        trtbuild.check(example_policy("nafnet"), cache=Cache(root=tmp_path))


def _in_code(example_policy, tmp_path, name: str, **edits) -> trtbuild.Policy:
    """The example policy as a script makes it: a mapping, no file behind it; a decoy
    `policy.yaml` (another model, other rules) where a file would have been looked for."""
    doc = yaml.safe_load(example_policy(name, **edits).read_text())  # YAML 1.1: 1e-2 a string
    (tmp_path / "policy.yaml").write_text("version: 1\nmodel: decoy.onnx\n")
    return trtbuild.Policy.from_dict(doc, base_dir=tmp_path, name="mine")


def test_a_policy_made_in_code_is_tuned_written_and_built_as_itself(
    example_policy, tmp_path, monkeypatch, caplog
):
    """No file behind the policy: tune searches it (not a file's), the tuned policy is a new
    value with its own name and hash, and build.json records that value."""
    policy = _in_code(example_policy, tmp_path, "gfpgan_dynamic", rules="[]")
    monkeypatch.chdir(tmp_path)
    tuned = trtbuild.tune(policy, jobs=1, quiet=True)
    assert tuned.passed and not tuned.budget_exhausted and 0.5 < tuned.low_precision_share < 1
    assert tuned.policy.name == "mine.tuned" and tuned.policy.path is None
    assert tuned.policy.sha256 not in (policy.sha256, trtbuild.load_policy("policy.yaml").sha256)
    assert [p.rule for p in tuned.pins] == [r.id for r in tuned.policy.precision.rules]
    assert all(f"# {p.group}: {p.reason}" in tuned.yaml for p in tuned.pins)
    assert tuned.policy.to_yaml() == tuned.yaml
    result = trtbuild.build(tuned.policy, backend="none")
    assert result.passed and result.out_dir == Path("build") / "mine.tuned"
    built = json.loads((tmp_path / "build" / "mine.tuned" / "build.json").read_text())
    assert built["policy"] == "<policy mine.tuned>"
    assert built["hashes"]["policy"] == tuned.policy.sha256
    saved = tuned.policy.save(tmp_path / "out" / "mine.tuned.yaml")
    assert saved == tuned.policy and saved.path == tmp_path / "out" / "mine.tuned.yaml"
    assert trtbuild.load_policy(saved.path) == tuned.policy
    assert not [r for r in caplog.records if "budget" in r.getMessage()]


def test_tune_searches_the_policy_changed_in_code_not_its_file(example_policy, tmp_path):
    """A rule added in code stays first and unchanged; the file's rules are not read again."""
    path = example_policy("gfpgan_dynamic", rules="[]")
    policy = trtbuild.load_policy(path).with_rules(
        {"id": "mine", "match": {"op": "ReduceSumSquare"}, "precision": "fp32"}
    )
    path.write_text("version: 1\nmodel: elsewhere.onnx\n")  # edited during the search
    tuned = trtbuild.tune(policy, jobs=1, quiet=True, output=tmp_path / "t.yaml")
    assert tuned.policy.precision.rules[0].id == "mine"
    assert tuned.policy.name == "t" and tuned.passed


def test_a_budget_cut_short_says_so_to_the_result_and_the_logger(write_policy, caplog):
    """Every tolerance exact: the start fails and one evaluation leaves the search wanting."""
    policy = trtbuild.load_policy(write_policy(rules=""))
    exact = {"atol": 0.0, "rtol": 0.0, "check_error_stat": "max"}
    policy = trtbuild.Policy.from_dict(
        {**policy.to_dict(), "accuracy": {"samples": 1, "tolerances": {"default": exact}}}
    )
    tuned = trtbuild.tune(policy, budget=1, jobs=1, quiet=True)
    assert tuned.evaluations == 1 and tuned.budget_exhausted and not tuned.passed
    said = [r.getMessage() for r in caplog.records if r.name == "trtbuild"]
    assert any("ran out" in m and "raise `budget`" in m for m in said)
    assert "DOES NOT PASS (budget exhausted)" in tuned.yaml


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda p: trtbuild.build(p, backend="nonee"), "`backend` must be one of auto, tensorrt"),
        (lambda p: trtbuild.tune(p, budget=0), "`budget` must be at least 1"),
        (lambda p: trtbuild.tune(p, budget="5"), "`budget` must be a whole number, not '5'"),
        (lambda p: trtbuild.tune(p, jobs=1.5), "`jobs` must be a whole number, not 1.5"),
        (lambda p: trtbuild.tune(p, objective="speed"), "`objective` must be one of nodes"),
        (lambda p: trtbuild.tune(p, seed="x"), "`seed` must be a whole number, not str 'x'"),
        (lambda p: trtbuild.tune(p, output=3), "`output` must be a file's path (str or Path)"),
        (lambda p: trtbuild.tune(p, progress=3), "`progress` must be a function of (trial,"),
        (lambda p: trtbuild.build(p, out=3), "`out` must be a folder's path (str or Path)"),
        (lambda p: trtbuild.check(p, cache="x"), "`cache` must be trtbuild.open_cache(...)"),
        (lambda p: trtbuild.convert(p, cache={}), "`cache` must be trtbuild.open_cache(...)"),
        (lambda p: trtbuild.open_cache(3), "`root` must be a folder's path (str or Path)"),
        (lambda p: trtbuild.load_policy(b"p.yaml"), "`name` must be a policy file's path"),
        (lambda p: p.to_yaml(3), "`where` must be a file's path (str or Path), or None"),
        (lambda p: p.save(None), "`path` must be a file's path (str or Path)"),
        (lambda p: p.with_rules(drop=None), "`drop` must be rule ids (a str or an iterable"),
        (lambda p: p.with_rules(drop=[1]), "`drop` must be rule ids (a str or an iterable"),
    ],
)
def test_bad_arguments_are_usage_errors_in_the_library_s_words(call, words, tmp_path):
    """Before any work (the policy's model does not even exist), no flag named; an argument
    of a type it cannot be too (a TypeError or an AttributeError deep inside, exit 70)."""
    policy = trtbuild.Policy.from_dict({"version": 1, "model": "m.onnx"}, base_dir=tmp_path)
    with pytest.raises(trtbuild.UsageError) as info:
        call(policy)
    assert words in str(info.value) and "--" not in str(info.value)


def test_a_missing_model_is_said_in_library_words_naming_the_policy_value(tmp_path):
    policy = trtbuild.Policy.from_dict({"version": 1, "model": "m.onnx"}, base_dir=tmp_path)
    with pytest.raises(trtbuild.UsageError) as info:
        trtbuild.check(policy)
    said = str(info.value)
    assert "model file not found" in said and str(tmp_path / "m.onnx") in said
    assert "make models" not in said and "--" not in said


def test_the_cli_says_the_library_s_arguments_as_flags(tmp_path, write_policy, capsys):
    from trtbuild.cli import main

    assert (
        main(["tune", "--policy", str(write_policy()), "-o", str(tmp_path / "t"), "--budget", "0"])
        == 2
    )
    assert "--budget must be at least 1" in capsys.readouterr().err


def test_quiet_silences_progress_for_the_call_only():
    import io

    from trtbuild.accuracy.progress import StatusLine, silenced

    loud, hushed = io.StringIO(), io.StringIO()
    with silenced():
        StatusLine(hushed).write("judging 1/4 samples")
    StatusLine(loud).write("judging 1/4 samples")
    assert hushed.getvalue() == "" and loud.getvalue() == "judging 1/4 samples\n"


def test_the_namespace_is_visible_without_importing_the_pipeline():
    import subprocess
    import sys

    code = (
        "import sys, trtbuild; names = dir(trtbuild);"
        "assert {'Policy', 'build', 'TuneResult', 'PointResult'} <= set(names), names;"
        "assert 'onnx' not in sys.modules and 'trtbuild.api' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    from importlib.resources import files

    assert files("trtbuild").joinpath("py.typed").is_file()


def test_the_stub_names_what_the_package_imports_lazily():
    """`__init__.pyi` (what type checkers read) and `_API` (what `__getattr__` imports) agree."""
    import ast

    from tests.conftest import ROOT

    stub = ast.parse((ROOT / "trtbuild" / "__init__.pyi").read_text())
    typed = {
        a.asname: f"{n.module}" for n in stub.body if isinstance(n, ast.ImportFrom) for a in n.names
    }
    assert set(typed) == set(trtbuild._API)
    assert all(
        getattr(trtbuild, name) is getattr(__import__(typed[name], fromlist=[name]), name)
        for name in typed
    )
    for name in trtbuild.__all__:  # each lazy name resolves in the module `_API` names
        assert getattr(trtbuild, name) is not None, name
    # the public names hold no pipeline-internal value (the CLI's `api.convert_front` is one)
    assert "convert_front" not in trtbuild.__all__ and "Front" not in trtbuild.__all__


def test_no_module_names_a_policy_by_its_path():
    """A policy made in code has no path (`policy.path` is None): errors and records name it
    by `policy.where`, and its hash is `policy.sha256`, never a file's read again."""
    import re

    from tests.conftest import ROOT

    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "trtbuild").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"(str\(|sha256_file\(|\{)(\w+\.)*policy\.path[)}]", line)
    ]
    assert not found, found


def test_the_surroundings_faults_are_usage_errors_from_the_library_too(tmp_path):
    """A folder that refuses files (/proc answers ENOENT), a folder where the file goes:
    exit 2 from the CLI, a bare OSError (and from /proc a traceback's exit 70 in the CLI
    too) from the library, though every error a user can act on is a `TrtbuildError`."""
    from tests.helpers import bare_policy, model, node

    m = model([node("Relu", ["x"], "y", "relu")], [("x", 1, [1, 4])], [("y", 1, [1, 4])])
    policy = trtbuild.load_policy(bare_policy(tmp_path, m))
    with pytest.raises(
        trtbuild.UsageError, match=r"^/proc/trtbuild-x: the folder refuses new"
    ) as raised:
        trtbuild.build(policy, out="/proc/trtbuild-x", backend="none")
    assert raised.value.exit_code == EXIT_USAGE
    with pytest.raises(trtbuild.UsageError, match="is a folder where a file goes"):
        policy.save(tmp_path)
    assert main(["convert", "--policy", str(bare_policy(tmp_path, m)), "-o", "/proc/x.onnx"]) == 2


@pytest.mark.parametrize("name", ["../x", "", ".", "a/b", "a\nb", None])
def test_a_policy_name_is_one_plain_folder_name(tmp_path, name):
    """`build/<name>/`: "../x" published outside `build/`, "" and "." into it, None failed
    inside `build` with a TypeError."""
    with pytest.raises(trtbuild.UsageError, match="name must be one plain folder name"):
        trtbuild.Policy.from_dict({"version": 1, "model": "m.onnx"}, tmp_path, name=name)


def test_with_rules_drops_one_id_given_as_a_string(example_policy):
    policy = trtbuild.load_policy(example_policy("nafnet"))
    ids = [r.id for r in policy.precision.rules]
    assert [r.id for r in policy.with_rules(drop=ids[0]).precision.rules] == ids[1:]


def _changed(policy: trtbuild.Policy, section: str, **edits) -> trtbuild.Policy:
    return dataclasses.replace(
        policy, **{section: dataclasses.replace(getattr(policy, section), **edits)}
    )


def test_a_policy_changed_in_code_is_checked_as_its_file_would_be(tmp_path):
    """`dataclasses.replace` makes values no file can hold: each is the loader's message naming
    the field (exit 2), before any work; a list or a str where a tuple or a Path goes is read
    as the file's value would be. Zero samples judged nothing; `fp8` was a KeyError."""
    from tests.helpers import identity_policy

    policy = trtbuild.load_policy(identity_policy(tmp_path, [1, 4], "{shape: [1, 4]}"))
    tol = policy.accuracy.default_tolerance
    bad = {
        "accuracy.samples: must be at least 1": _changed(policy, "accuracy", samples=0),
        "precision.default: str 'fp8' is not one of": _changed(policy, "precision", default="fp8"),
        "tolerances.default.atol: must be at least 0": _changed(
            policy, "accuracy", default_tolerance=dataclasses.replace(tol, atol=-1.0)
        ),
        "name must be one plain folder name": dataclasses.replace(policy, name="../x"),
    }
    for words, changed in bad.items():
        with pytest.raises(trtbuild.UsageError) as info:
            trtbuild.check(changed)
        assert words in str(info.value) and info.value.exit_code == EXIT_USAGE
    with pytest.raises(trtbuild.UsageError, match=r"accuracy\.samples"):
        bad["accuracy.samples: must be at least 1"].save(tmp_path / "bad.yaml")
    assert not (tmp_path / "bad.yaml").exists()  # refused before anything is written
    rule = trtbuild.Rule("all", trtbuild.Match(op=("Identity",)), "fp32")
    loose = dataclasses.replace(
        _changed(policy, "precision", rules=[rule]), model=str(policy.model)
    )
    checked = trtbuild.check(loose, quiet=True)
    assert [(n.name, n.precision, n.rule) for n in checked.nodes] == [("id", "fp32", "all")]
