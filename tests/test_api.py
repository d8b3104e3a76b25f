"""trtbuild as a library: every function on an example policy, from Python, printing nothing."""

from __future__ import annotations

import onnx
import pytest

import trtbuild
from trtbuild.errors import EXIT_USAGE


def test_check_lists_every_node_with_its_rule(example_policy, capsys):
    result = trtbuild.check(trtbuild.load_policy(example_policy("nafnet")))
    pinned = [n for n in result.nodes if n.precision == "fp32"]
    assert "final-reduction" in {n.rule for n in pinned}
    assert all(n.reason for n in result.nodes)
    assert 0.4 < result.low_precision_share < 0.5
    assert result.points[0]["data"]["input"]["kind"] == "random"
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
    assert [s["name"] for s in result.shapes] == ["opt", "min", "max"]
    assert not next(s for s in result.shapes if s["name"] == "max")["passed"]
    assert result.outputs["energy"].passed  # at the primary point, opt
    assert result.files["report.json"] == tmp_path / "out" / "report.json"
    assert result.report.passed is False
    assert capsys.readouterr().out == ""


def test_convert_front_holds_the_assignment_beside_the_same_model(example_policy):
    """What the CLI prints (shares, casts) comes with the model `convert` returns."""
    from trtbuild.api import convert_front

    policy = example_policy("nafnet")
    front = convert_front(policy)
    summary = front.assignment.summary()
    assert summary.fp32_nodes > 0 and 0.4 < summary.low_share < 0.5 and front.converted.casts
    types = {vi.type.tensor_type.elem_type for vi in front.converted.model.graph.value_info}
    assert onnx.TensorProto.FLOAT16 in types


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
