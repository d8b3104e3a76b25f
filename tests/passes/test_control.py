"""Frozen inputs and If nodes with a constant condition: the branch taken replaces the If."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.helpers import I64, F, if_model, model, node
from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.passes.control import freeze_inputs, inline_constant_ifs
from trtbuild.passes.prepare import prepare
from trtbuild.policy.specs import Passes


def _run(m: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _rate_switch() -> onnx.ModelProto:
    """y = If(rate == 16000) then Relu(x) * w else Neg(x) * w: an audio model picking its rate."""
    base = if_model()
    m = model(
        [
            node("Equal", ["rate", "k16"], "c", "is_16k"),
            node(
                "If", ["c"], "y", "by_rate", **{a.name: a.g for a in base.graph.node[2].attribute}
            ),
        ],
        [("x", F, [1, 4]), ("rate", I64, [])],
        [("y", F, [1, 4])],
        {"k16": np.array(16000, np.int64), "w": np.full((1, 4), 2.0, np.float32)},
    )
    return m


@pytest.mark.parametrize(("rate", "branch"), [(16000, "then_branch"), (8000, "else_branch")])
def test_a_frozen_input_folds_its_if_to_the_branch_it_takes(rate, branch):
    source = _rate_switch()
    prepared = prepare(source, Passes(freeze_inputs=(("rate", rate),)))
    assert [i.name for i in prepared.model.graph.input] == ["x"]
    assert not [n for n in subgraphs.all_nodes(prepared.model) if n.op_type == "If"]
    names = [n.name for n in prepared.model.graph.node]
    assert f"by_rate/{branch}/mul" in names  # the branch's nodes keep their qualified names
    inlined = next(r for r in prepared.records if r.name == "inline_constant_ifs")
    assert inlined.details["inlined"] == [{"name": "by_rate", "branch": branch}]
    x = np.array([[1.0, -2.0, 3.0, 4.0]], np.float32)
    want = _run(source, {"x": x, "rate": np.array(rate, np.int64)})
    np.testing.assert_array_equal(_run(prepared.model, {"x": x})[0], want[0])
    onnx.checker.check_model(prepared.model, full_check=True)


def test_an_if_on_data_stays():
    model_, record = inline_constant_ifs(prepare(if_model(), Passes()).model)
    assert record.changed == 0
    assert [n.op_type for n in model_.graph.node].count("If") == 1


def test_freezing_an_input_the_model_lacks_names_the_field():
    with pytest.raises(UsageError, match=r"passes.freeze_inputs.sr: the model has no input 'sr'"):
        freeze_inputs(if_model(), (("sr", 16000),))


def test_a_single_number_for_a_tensor_input_is_refused():
    with pytest.raises(UsageError, match="a single number fits only a scalar input"):
        freeze_inputs(if_model(), (("x", 1.0),))


@pytest.mark.parametrize(
    ("elem", "value", "said"),
    [
        (onnx.TensorProto.INT32, 2**32 + 1, "4294967297 is not a value the input 'v' holds"),
        (I64, 16000.5, "16000.5 is not a value the input 'v' holds: it takes int64 integers"),
        (
            onnx.TensorProto.FLOAT16,
            7e4,
            "70000 is not a value the input 'v' holds: it takes finite",
        ),
        (onnx.TensorProto.BOOL, 2, "2 is not a value the input 'v' holds: it takes booleans"),
        # float64 rounds 2**63 to int64's largest value: read as whole numbers they are not
        (I64, 2**63, "9223372036854775808 is not a value the input 'v' holds"),
        (I64, -(2**63) - 1, "-9223372036854775809 is not a value the input 'v' holds"),
        (onnx.TensorProto.UINT64, 2**64, "18446744073709551616 is not a value the input 'v'"),
        (onnx.TensorProto.FLOAT16, 10**400, "is not a value the input 'v' holds: it takes finite"),
    ],
)
def test_a_frozen_value_the_inputs_type_cannot_hold_is_refused(tmp_path, capsys, elem, value, said):
    """numpy's cast raised on an int32 past its range (a traceback, exit 70 from check and
    build), made an FP16 70000 inf, and cut `sr: 16000.5` to 16000, without a word; each
    names its field and line now."""
    from trtbuild.cli import main

    m = model(
        [node("Cast", ["v"], "vf", "cast", to=F), node("Mul", ["x", "vf"], "y", "mul")],
        [("x", F, [1, 4]), ("v", elem, [])],
        [("y", F, [1, 4])],
    )
    with pytest.raises(UsageError, match=said) as info:
        freeze_inputs(m, (("v", value),))
    assert info.value.field == ("passes", "freeze_inputs", "v")
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(f"version: 1\nmodel: m.onnx\npasses: {{freeze_inputs: {{v: {value}}}}}\n")
    assert main(["check", "--policy", str(policy)]) == 2
    assert f"{policy.resolve()}:3: passes.freeze_inputs.v: " in capsys.readouterr().err


def test_weights_only_a_body_reads_survive_folding(models_dir):
    prepared = prepare(onnx.load(models_dir / "loop_sum.onnx"), Passes())
    names = {t.name for t in prepared.model.graph.initializer}
    assert "proj.w" in names  # onnx-graphsurgeon's cleanup drops it: read inside the Loop only
    onnx.checker.check_model(prepared.model, full_check=True)


def test_body_weights_move_to_the_main_graph():
    prepared = prepare(if_model(), Passes())
    for scope, graph in subgraphs.walk(prepared.model.graph):
        assert not scope or not graph.initializer
    assert {"k_then", "k_else"} <= {t.name for t in prepared.model.graph.initializer}


def test_real_silero_vad_at_16k_keeps_its_outputs(real_model):
    source = onnx.load(real_model("silero_vad"))
    prepared = prepare(source, Passes(freeze_inputs=(("sr", 16000),)))
    top_ifs = [n.name for n in prepared.model.graph.node if n.op_type == "If"]
    assert "If_0" not in top_ifs
    rng = np.random.default_rng(0)
    feed = {"input": rng.normal(0, 0.1, (1, 576)).astype(np.float32)}
    feed["state"] = rng.normal(0, 0.1, (2, 1, 128)).astype(np.float32)
    want = _run(source, {**feed, "sr": np.array(16000, np.int64)})
    for got, ref in zip(_run(prepared.model, feed), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_freezing_an_input_the_model_lacks_names_the_field_with_its_dot_quoted():
    """`passes.freeze_inputs."in.2"`: a name holding a dot reads as one key of the field."""
    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    with pytest.raises(UsageError) as info:
        freeze_inputs(m, (("in.2", 3),))
    assert 'passes.freeze_inputs."in.2"' in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("dtype", "value", "said"),
    [
        (np.float32, [1.5, 10**400], "1000000000"),  # the value past float64, not 1.5
        (np.bool_, 10**400, r"it takes booleans \(0 or 1\)"),
    ],
)
def test_a_value_past_float64_is_the_one_named(dtype, value, said):
    """An integer past float64's range made every element 'not held' (the message named a
    1.5 beside it) and a boolean input's message said 'finite bool values'."""
    from trtbuild.passes.control import _held

    with pytest.raises(UsageError, match=said) as info:
        _held("v", value, np.dtype(dtype))
    assert "1.5 is not" not in str(info.value)
