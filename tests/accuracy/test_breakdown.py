"""`accuracy.reference_model`: a quantized model judged against the model before quantization.

The reported errors are checked independently: the original and the quantized model
run in plain ONNX Runtime sessions (optimizations off, so Q/DQ run as their op
definitions say), the policy's emulated graph too, and the figures come from numpy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import NAFNET_POLICY
from tests.helpers import model as make_model
from tests.helpers import plain_session
from trtbuild.accuracy.emulate import emulate
from trtbuild.cli import main
from trtbuild.errors import UsageError
from trtbuild.front import run_front
from trtbuild.policy.model import load_policy

FINAL = """\
    - id: final-reduction
      match: {pattern: final_reductions, last: 1}
      precision: fp32
"""


def _policy(tmp_path: Path, model: Path, extra: str = "") -> Path:
    """The NAFNet policy of the tests on `model`, `extra` lines added under `accuracy:`."""
    path = tmp_path / "q.yaml"
    path.write_text(NAFNET_POLICY.format(model=model, rules=FINAL, backend="none") + extra)
    return path


def _run(model: onnx.ModelProto | str, feeds: list[dict]) -> list[list[np.ndarray]]:
    session = plain_session(model)
    return [session.run(None, feed) for feed in feeds]


def _max_abs(a: list[list[np.ndarray]], b: list[list[np.ndarray]], k: int) -> float:
    return max(
        float(np.abs(x[k].astype(np.float64) - y[k].astype(np.float64)).max()) for x, y in zip(a, b)
    )


def test_the_reported_errors_are_those_against_the_original_checked_independently(
    tmp_path, quantized_dir
):
    quantized, original = (
        quantized_dir / "nafnet_tiny_int8.onnx",
        quantized_dir / "nafnet_tiny.onnx",
    )
    policy = _policy(tmp_path, quantized, f"  reference_model: {original}\n")
    out = tmp_path / "out"
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    report = json.loads((out / "report.json").read_text())
    assert code == (0 if report["passed"] else 1)

    front = run_front(load_policy(policy), reference="none")
    feeds = [dict(f) for f in front.feeds]
    names = [o.name for o in onnx.load(str(original)).graph.output]
    theirs = _run(str(original), feeds)
    mine = _run(str(quantized), feeds)
    policy_runs = _run(emulate(front.converted.model, "storage"), feeds)
    split = report["reference_model"]
    assert split["path"] == str(original)
    for k, name in enumerate(names):
        parts = split["outputs"][name]
        quant = _max_abs(mine, theirs, k)
        assert quant > 0  # INT8 has an error of its own, and it is measured
        assert parts["quantized_vs_original"]["max_abs"] == pytest.approx(quant, rel=1e-3)
        assert parts["policy_vs_original"]["max_abs"] == pytest.approx(
            _max_abs(policy_runs, theirs, k), rel=1e-3
        )
        assert parts["policy_vs_quantized"]["max_abs"] == pytest.approx(
            _max_abs(policy_runs, mine, k), rel=1e-3
        )
        # the verdict's figures are the policy against the original
        assert report["outputs"][name]["max_abs"] == parts["policy_vs_original"]["max_abs"]
        assert report["shapes"][0]["reference_model"]["outputs"][name] == parts
    assert "before quantization" in (out / "report.md").read_text()
    assert not any("quantization's own error is not measured" in w for w in report["warnings"])


def test_without_a_reference_model_a_quantized_model_is_warned(tmp_path, quantized_dir, capsys):
    policy = _policy(tmp_path, quantized_dir / "nafnet_tiny_int8.onnx")
    out = tmp_path / "out"
    main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    report = json.loads((out / "report.json").read_text())
    assert report["reference_model"] is None
    said = [w for w in report["warnings"] if "quantization's own error is not measured" in w]
    assert len(said) == 1 and "accuracy.reference_model" in said[0]
    assert "quantization's own error is not measured" in capsys.readouterr().err


def test_a_float_model_is_not_warned_about_quantization(tmp_path, quantized_dir):
    front = run_front(
        load_policy(_policy(tmp_path, quantized_dir / "nafnet_tiny.onnx")), reference="none"
    )
    from trtbuild.evaluation import report_warnings

    assert not any("quantiz" in w for w in report_warnings(front))


def test_a_missing_reference_model_is_exit_2_naming_the_field(tmp_path, quantized_dir, capsys):
    policy = _policy(
        tmp_path, quantized_dir / "nafnet_tiny_int8.onnx", "  reference_model: gone.onnx\n"
    )
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "accuracy.reference_model" in err and "gone.onnx" in err
    with pytest.raises(UsageError, match="reference_model"):
        load_policy(policy)


def test_a_reference_model_with_other_inputs_is_exit_2_naming_the_field(
    tmp_path, quantized_dir, capsys
):
    other = quantized_dir / "transformer_tiny.onnx"  # input 'tokens', not 'input'
    policy = _policy(
        tmp_path, quantized_dir / "nafnet_tiny_int8.onnx", f"  reference_model: {other}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"]) == 2
    err = capsys.readouterr().err
    assert "accuracy.reference_model" in err and "inputs" in err
    line = policy.read_text().splitlines().index(f"  reference_model: {other}") + 1
    assert f"{policy.resolve()}:{line}: accuracy.reference_model: " in err, err
    assert not out.exists()  # nothing half-written


def test_a_reference_model_with_another_shape_is_exit_2_naming_the_output(tmp_path, capsys):
    def identity(dims: list[int], name: str) -> Path:
        g = helper.make_graph(
            [helper.make_node("Identity", ["input"], ["y"], name="id")],
            "g",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 64, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        )
        path = tmp_path / name
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    model = identity([1, 3, 64, 64], "m.onnx")
    other = identity([1, 3, 32, 64], "other.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: {model.name}\naccuracy:\n  reference_model: {other.name}\n"
    )
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "accuracy.reference_model: output 'y'" in err and "[1, 3, 32, 64]" in err


def test_a_reference_model_of_a_fixed_batch_is_exit_2_naming_the_dim_and_the_point(
    tmp_path, capsys
):
    """A model quantized and then given a dynamic batch, judged against its original exported
    at batch 1: ONNX Runtime's refusal was said as a model that is not the original."""

    def relu(batch: int | str, name: str) -> Path:
        vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 4]) for n in "xy"]
        g = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="r")], "g", vi[:1], vi[1:]
        )
        path = tmp_path / name
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    model, original = relu("n", "m.onnx"), relu(1, "original.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: {model.name}\ninputs:\n  x: {{min: [1, 4], opt: [2, 4], max: [2, 4]}}\n"
        f"accuracy:\n  samples: 1\n  reference_model: {original.name}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--backend", "none", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    line = policy.read_text().splitlines().index(f"  reference_model: {original.name}") + 1
    assert (
        f"p.yaml:{line}: accuracy.reference_model: original.onnx fixes dim 0 of input 'x' at 1"
        in err
    ), err
    assert "gives it 2" in err and "with that dim dynamic" in err and err.count("\n") == 1


def test_a_reference_model_of_other_io_types_names_the_quantizers_io_option(tmp_path, capsys):
    """ModelOpt's --direct_io_types makes the model take its input as INT8 (the first Q
    removed): the hint said to name the model it was quantized from, which it was."""

    def cast(elem: int, name: str) -> Path:
        g = helper.make_graph(
            [helper.make_node("Cast", ["x"], ["y"], name="c", to=TensorProto.FLOAT)],
            "g",
            [helper.make_tensor_value_info("x", elem, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        )
        path = tmp_path / name
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    model, original = cast(TensorProto.INT8, "m.onnx"), cast(TensorProto.FLOAT, "original.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: {model.name}\naccuracy:\n  reference_model: {original.name}\n"
    )
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "input 'x' is float [1, 4] in original.onnx but int8 [1, 4] in the model" in err, err
    assert "--direct_io_types" in err and "name the unquantized model" not in err


def test_the_emulation_keeps_int8_exact_and_rounds_a_dequantized_fp16_value_once():
    """A DQ with an FP16 scale: int8 values and zero points untouched, the scale taken at its
    FP16 value, the product rounded to FP16 once (what an FP16 DQ stores)."""
    scale = np.array([0.0123, 3.1e-3], np.float16)  # per channel, not exact in FP32 terms
    q = np.array([[-128, 127, 5], [1, -7, 100]], np.int8)
    g = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq", axis=0),
            helper.make_node("QuantizeLinear", ["d", "s", "z"], ["q2"], name="q", axis=0),
            helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["y"], name="dq2", axis=0),
        ],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3])],
        [
            numpy_helper.from_array(q, "q"),
            numpy_helper.from_array(scale, "s"),
            numpy_helper.from_array(np.zeros(2, np.int8), "z"),
        ],
    )
    mixed = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    emulated = emulate(mixed)
    inits = {t.name: numpy_helper.to_array(t) for t in emulated.graph.initializer}
    assert inits["q"].dtype == np.int8 and (inits["q"] == q).all()
    assert inits["z"].dtype == np.int8
    assert (inits["s"] == scale.astype(np.float32)).all()  # the FP16 value, exactly
    (y,) = _run(emulated, [{}])[0]
    expected = (q.astype(np.float32) * scale.astype(np.float32)[:, None]).astype(np.float16)
    assert y.dtype == np.float16 and (y == expected).all()


def test_the_reference_models_outputs_are_cached_with_what_they_depend_on(
    tmp_path, quantized_dir, monkeypatch
):
    """A second build of the same policy reads the original's outputs from the cache (it
    does not run it) and reports the same split; new bytes of the original run it again."""
    from trtbuild.accuracy import reference

    runs: list[Path] = []
    real = reference.against_reference_model
    monkeypatch.setattr(
        reference,
        "against_reference_model",
        lambda ref, path, *a: runs.append(path) or real(ref, path, *a),
    )
    monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(tmp_path / "cache"))
    original = tmp_path / "original.onnx"
    original.write_bytes((quantized_dir / "nafnet_tiny.onnx").read_bytes())
    quantized = quantized_dir / "nafnet_tiny_int8.onnx"
    policy = _policy(tmp_path, quantized, f"  reference_model: {original}\n")

    def split(out: str) -> dict:
        main(["build", "--policy", str(policy), "--out", str(tmp_path / out), "--backend", "none"])
        return json.loads((tmp_path / out / "report.json").read_text())["reference_model"]

    first = split("a")
    assert runs == [original]
    assert split("b") == first and runs == [original]  # from the cache: not run again
    model = onnx.load(str(original))
    model.doc_string = "the same graph, other bytes"
    onnx.save(model, str(original))
    assert split("c") == first and runs == [original, original]  # its bytes are in the key


def test_a_quantization_failing_alone_names_dequantize_as_a_fix(tmp_path, quantized_dir, capsys):
    """The verdict's hint where the quantization alone misses the tolerances named only
    re-quantizing and loosening; docs/quantized.md's fix, `dequantize: true`, is named too."""
    original = quantized_dir / "nafnet_tiny.onnx"
    policy = _policy(tmp_path, quantized_dir / "nafnet_tiny_int8.onnx")
    text = policy.read_text().replace("atol: 1e-2, rtol: 1e-2", "atol: 1e-5, rtol: 0")
    policy.write_text(text + f"  reference_model: {original}\n")
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "o")]) == 1
    out = capsys.readouterr().out
    assert "the quantization alone fails the tolerances on restored" in out, out
    assert "with `dequantize: true` rules, re-quantize, or loosen the tolerances" in out, out


def test_a_policy_with_dequantize_rules_is_measured_on_the_quantization_it_keeps(
    tmp_path, quantized_dir, capsys
):
    """Where the policy's `dequantize: true` rules take ops out of the quantization, the
    quantization alone is the graph with those rules applied: where that still fails, no
    FP32 pin can fix it (it is what every pin keeps), and the line says which quantization it
    measured and that taking more ops out may help (report.md says the same). Against the
    graph as given it said only that the run did not measure the rules."""
    original = quantized_dir / "nafnet_tiny.onnx"
    rules = FINAL + (
        "    - id: ending-out\n      match: {name: '^/ending/'}\n"
        "      precision: fp16\n      dequantize: true\n"
    )
    text = NAFNET_POLICY.format(
        model=quantized_dir / "nafnet_tiny_int8.onnx", rules=rules, backend="none"
    )
    policy = tmp_path / "q.yaml"
    text = text.replace("atol: 1e-2, rtol: 1e-2", "atol: 1e-5, rtol: 0")
    policy.write_text(text + f"  reference_model: {original}\n")
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "o")]) == 1
    out = capsys.readouterr().out
    said = (
        "the quantization alone as the policy keeps it fails the tolerances on restored, total "
        "(the policy's `dequantize: true` rules take 2 op(s) out of the quantization, which read "
        "the float values): no FP32 pin can fix that (take more of the ops that lose most out "
        "of the quantization with `dequantize: true` rules, re-quantize, or loosen the "
        "tolerances)"
    )
    assert said in out, out
    assert "restored: quantization alone as the policy keeps it max_abs=" in out, out
    md = (tmp_path / "o" / "report.md").read_text()
    assert "**The quantization alone as the policy keeps it fails the tolerances**" in md, md
    assert "FP16 part (policy against the quantized graph as the policy keeps it in FP32)" in md


def _two_matmuls(quantized: bool) -> onnx.ModelProto:
    """x @ W1 @ W2, each matrix product INT8 as ModelOpt exports it (x and h behind a Q/DQ
    pair, each weight a float constant behind its own Q), or its float original."""
    rng = np.random.default_rng(11)
    w = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2)]
    inits = {"w1": w[0], "w2": w[1]}
    if not quantized:
        nodes = [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2"),
        ]
        return make_model(
            nodes,
            [("x", TensorProto.FLOAT, [1, 64])],
            [("y", TensorProto.FLOAT, [1, 64])],
            inits,
            opset=19,
        )
    nodes = []
    for k, (a, out) in enumerate((("x", "h"), ("h", "y")), 1):
        inits[f"as{k}"] = np.array(3.0 * 8 ** (k - 1) / 127, np.float32)
        inits[f"ws{k}"] = (np.abs(w[k - 1]).max(0) / 127).astype(np.float32)
        inits[f"wz{k}"] = np.zeros(64, np.int8)
        nodes += [
            helper.make_node("QuantizeLinear", [a, f"as{k}", "z"], [f"{a}q"], name=f"q_{a}"),
            helper.make_node("DequantizeLinear", [f"{a}q", f"as{k}", "z"], [f"{a}d"], name=f"dq_{a}"),
            helper.make_node("QuantizeLinear", [f"w{k}", f"ws{k}", f"wz{k}"], [f"w{k}q"], name=f"q_w{k}", axis=1),
            helper.make_node("DequantizeLinear", [f"w{k}q", f"ws{k}", f"wz{k}"], [f"w{k}d"], name=f"dq_w{k}", axis=1),
            helper.make_node("MatMul", [f"{a}d", f"w{k}d"], [out], name=f"mm{k}"),
        ]  # fmt: skip
    inits["z"] = np.array(0, np.int8)
    return make_model(nodes, [("x", TensorProto.FLOAT, [1, 64])], [("y", TensorProto.FLOAT, [1, 64])], inits, opset=19)  # fmt: skip


def test_the_split_of_a_policy_with_dequantize_rules_is_the_two_parts_of_its_error(
    tmp_path, capsys
):
    """`dequantize: true` (FP16) on the second of two INT8 matrix products: the split compared
    the policy with the graph as given, so that op's whole INT8 error showed as the FP16 part
    (larger than the policy's whole error). Both parts are against the graph as the policy
    keeps it (the second product in float, the first INT8), built here by hand and run in
    plain ONNX Runtime: the FP16 part is the policy against it, the quantization alone it
    against the original."""
    q, f = _two_matmuls(True), _two_matmuls(False)
    onnx.save(q, tmp_path / "q.onnx")
    onnx.save(f, tmp_path / "f.onnx")
    kept = onnx.ModelProto.FromString(q.SerializeToString())  # mm2 reads h and w2 as they are
    taken = {"q_h", "dq_h", "q_w2", "dq_w2"}
    nodes = [n for n in kept.graph.node if n.name not in taken]
    nodes[-1].input[:] = ["h", "w2"]
    del kept.graph.node[:]
    kept.graph.node.extend(nodes)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: q.onnx\ninputs:\n  x: {shape: [1, 64], data: {distribution: normal}}\n"
        "precision:\n  default: fp16\n  rules:\n"
        "    - {id: out, match: {name: '^mm2$'}, precision: fp16, dequantize: true}\n"
        "build: {backend: none}\naccuracy:\n  samples: 2\n  reference_model: f.onnx\n"
        "  tolerances: {default: {atol: 100, rtol: 0}}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    front = run_front(load_policy(policy), reference="none")
    feeds = [dict(x) for x in front.feeds]
    theirs, mine = _run(f, feeds), _run(kept, feeds)
    policy_runs = _run(emulate(front.converted.model, "storage"), feeds)
    split = json.loads((out / "report.json").read_text())["reference_model"]
    parts = split["outputs"]["y"]
    assert parts["quantized_vs_original"]["max_abs"] == pytest.approx(
        _max_abs(mine, theirs, 0), rel=1e-3
    )
    assert parts["policy_vs_quantized"]["max_abs"] == pytest.approx(
        _max_abs(policy_runs, mine, 0), rel=1e-3
    )
    # the FP16 part is FP16's: well under the policy's whole error, which holds mm1's INT8
    assert parts["policy_vs_quantized"]["max_abs"] < parts["policy_vs_original"]["max_abs"] / 4
    assert split["dequantized"] == 1  # report.json says which graph the parts are against
    said = capsys.readouterr().out
    assert "y: quantization alone as the policy keeps it max_abs=" in said, said


def _half_and_twin(tmp_path: Path) -> tuple[Path, Path]:
    """A MatMul and Relu computing in FP16 between FP32 inputs and outputs (as ModelOpt
    AutoCast converts a model), and its FP32 original: no Q/DQ anywhere."""
    w = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    paths = []
    for half in (True, False):
        t = TensorProto.FLOAT16 if half else TensorProto.FLOAT
        nodes = [
            helper.make_node("Cast", ["x"], ["xl"], name="cast_in", to=t),
            helper.make_node("MatMul", ["xl", "w"], ["m"], name="mm"),
            helper.make_node("Relu", ["m"], ["r"], name="relu"),
            helper.make_node("Cast", ["r"], ["y"], name="cast_out", to=TensorProto.FLOAT),
        ]
        g = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
            [numpy_helper.from_array(w.astype(np.float16) if half else w, "w")],
        )
        path = tmp_path / ("half.onnx" if half else "fp32.onnx")
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        paths.append(path)
    return paths[0], paths[1]


def test_a_model_without_qdq_is_judged_against_the_reference_model_not_its_quantization(
    tmp_path, capsys
):
    """An FP16 model judged against its FP32 original was said to be judged "before
    quantization", its own error "the quantization alone": it holds no Q/DQ."""
    half, original = _half_and_twin(tmp_path)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"version: 1\nmodel: {half.name}\nbuild: {{backend: none}}\naccuracy:\n"
        f"  reference_model: {original.name}\n"
        "  tolerances: {default: {atol: 1e-6, rtol: 0}}\n"  # the FP16 weights alone miss it
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 1
    said = capsys.readouterr().out
    assert "against the reference model fp32.onnx;" in said.splitlines()[0], said
    assert "  y: model alone (before trtbuild's precision) max_abs=" in said, said
    assert (
        "  the model alone (before trtbuild's precision) fails the tolerances on y: no FP32 pin "
        "can fix that (convert the model again, or loosen the tolerances)"
    ) in said, said
    report = (out / "report.md").read_text()
    assert "## Against the reference model" in report
    assert "quantiz" not in said + report  # neither "before quantization" nor Q/DQ said
    split = json.loads((out / "report.json").read_text())["reference_model"]
    assert set(split["outputs"]["y"]) == {
        "policy_vs_original",
        "quantized_vs_original",
        "policy_vs_quantized",
    }  # report.json's keys stay


def test_a_failing_point_says_what_the_quantization_alone_costs_there(tmp_path, capsys):
    """A row sum quantized to INT8 at a scale its sum over 2 columns fits (opt) and its sum
    over 16 does not (max: clipped at 2.54): only max fails, by the quantization alone.
    The terminal and report.md showed opt's split ("pass") alone, as if FP16 failed max."""
    scale, zero = np.array(0.02, np.float32), np.array(0, np.int8)
    nodes = [
        helper.make_node("ReduceSum", ["x", "axes"], ["s"], "sum", keepdims=1),
        helper.make_node("QuantizeLinear", ["s", "scale", "zero"], ["q"], "q"),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], "dq"),
    ]
    inits = {"axes": np.array([-1], np.int64), "scale": scale, "zero": zero}
    io = ([("x", TensorProto.FLOAT, [1, "w"])], [("y", TensorProto.FLOAT, [1, 1])])
    quantized = make_model(nodes, *io, inits)
    total = helper.make_node("ReduceSum", ["x", "axes"], ["y"], "sum", keepdims=1)
    original = make_model([total], *io, {"axes": inits["axes"]})
    onnx.save(quantized, tmp_path / "q.onnx")
    onnx.save(original, tmp_path / "f.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: q.onnx\ninputs:\n  x:\n    min: [1, 2]\n    opt: [1, 2]\n"
        "    max: [1, 16]\nprecision: {default: fp16}\nbuild: {backend: none}\n"
        "accuracy:\n  reference_model: f.onnx\n  tolerances:\n    default: {atol: 0.05, rtol: 0}\n"
    )
    out = tmp_path / "out"
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    said = capsys.readouterr().out
    assert code == 1, said
    at_max = said[said.index("at max [1, 16]: FAIL") :]
    assert "y: quantization alone" in at_max and "(FAIL)" in at_max, said
    assert "the quantization alone fails the tolerances on y: no FP32 pin" in at_max, said
    md = (out / "report.md").read_text()
    assert "## Against the model before quantization, at max [1, 16]" in md
    assert "**The quantization alone fails the tolerances** on y" in md


def test_a_reference_model_that_holds_nan_on_the_data_is_exit_2_naming_the_field(tmp_path, capsys):
    """log(x - 0.5) on x in [0, 1): the reference model's NaN was judged (exit 1, max_abs inf,
    "the model alone fails: no FP32 pin can fix that"), where the graph's own FP32 NaN is
    refused."""
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16]) for n in "xy"]
    half = numpy_helper.from_array(np.array(0.5, np.float32), "h")
    graphs = {
        "m.onnx": helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", vi[:1], vi[1:]),
        "orig.onnx": helper.make_graph(
            [helper.make_node("Sub", ["x", "h"], ["d"]), helper.make_node("Log", ["d"], ["y"])],
            "g",
            vi[:1],
            vi[1:],
            [half],
        ),
    }
    for name, g in graphs.items():
        onnx.save(
            helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / name
        )
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        "  x: {shape: [1, 16], data: {distribution: uniform, low: 0.0, high: 1.0}}\n"
        "build: {backend: none}\naccuracy:\n  reference_model: orig.onnx\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    line = policy.read_text().splitlines().index("  reference_model: orig.onnx") + 1
    assert f"p.yaml:{line}: accuracy.reference_model: output 'y' of orig.onnx holds NaN" in err
    assert not out.exists()
