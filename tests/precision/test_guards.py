"""Hugging Face exports out of the box: the weight-range guard and the mask sentinel.

The BERT-style example carries `transformers`' extended attention mask,
`(1 - mask) * finfo(float32).min`. In FP16 the constant is -inf and `0 x -inf`
is NaN at every unmasked position; the built-in guard keeps that Mul in FP32.
"""

from __future__ import annotations

import json

import numpy as np
import onnx

from trtbuild.cli import main


def _build(policy, out) -> tuple[int, dict]:
    code = main(["build", "--policy", str(policy), "--out", str(out), "--backend", "none"])
    return code, json.loads((out / "report.json").read_text())


def test_check_names_the_guard_on_the_mask_node(example_policy, capsys):
    assert main(["check", "--policy", str(example_policy("bert")), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert rows["/mask/Mul"]["precision"] == "fp32"
    assert rows["/mask/Mul"]["rule"] == "guard:weight-range"
    assert "3.403e+38" in rows["/mask/Mul"]["reason"]


def test_a_layernorm_policy_passes_with_the_guard_named_in_the_report(example_policy, tmp_path):
    code, report = _build(example_policy("bert"), tmp_path / "b")
    assert code == 0 and report["passed"]
    pinned = {p["node"]: p["rule"] for p in report["precision"]["pinned"]}
    assert pinned["/mask/Mul"] == "guard:weight-range"
    assert report["precision"]["rule_hits"]["guard:weight-range"] == 1
    assert not any("boundary" in w for w in report["warnings"])  # the sentinel is not data


def test_guards_false_gives_back_the_nan_failure_with_its_first_divergence(
    example_policy, tmp_path
):
    policy = example_policy("bert", replace={"guards: true ": "guards: false"})
    code, report = _build(policy, tmp_path / "b")
    assert code == 1 and not report["passed"]
    assert report["first_divergence"]["node"] == "/mask/Mul"
    assert "NaN" in report["first_divergence"]["reason"]
    assert "guard:weight-range" not in report["precision"]["rule_hits"]


def test_a_user_rule_naming_the_node_wins_over_the_guard(example_policy, capsys):
    rule = '[{id: mine, match: {name: "^/mask/Mul$"}, precision: fp16}]'
    assert main(["check", "--policy", str(example_policy("bert", rules=rule)), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert rows["/mask/Mul"]["rule"] == "mine" and rows["/mask/Mul"]["precision"] == "fp16"


def test_a_guard_list_keeps_only_the_named_guards(example_policy, capsys):
    def mask_rule(guards: str) -> str:
        policy = example_policy("bert", replace={"guards: true ": f"guards: {guards}"})
        capsys.readouterr()
        assert main(["check", "--policy", str(policy), "--json"]) == 0
        rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
        return rows["/mask/Mul"]["rule"]

    assert mask_rule("[weight-range]") == "guard:weight-range"
    assert mask_rule("[]") == "default"


def _timestep_policy(
    tmp_path, high: float, guards: str = "true", default: str = "fp16", low: float = 0
):
    """A diffusion model's timestep embedding, `sin(t · freq)` and `cos(t · freq)`, added to
    an input and projected: what the periodic guard is for, with timesteps up to `high`."""
    import numpy as np
    import onnx

    from tests.helpers import F, model, node

    freq = np.exp(-np.log(10000.0) * np.arange(8) / 8).astype(np.float32)[None]
    w = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32) / 4
    nodes = [
        node("Unsqueeze", ["t", "axes"], "t1", "unsqueeze"),
        node("Mul", ["t1", "freq"], "arg", "mul"),
        node("Sin", ["arg"], "s", "sin"),
        node("Cos", ["arg"], "c", "cos"),
        node("Concat", ["s", "c"], "emb", "concat", axis=1),
        node("Add", ["emb", "x"], "h", "add"),
        node("MatMul", ["h", "w"], "y", "proj"),
    ]
    inits = {"axes": np.array([1], np.int64), "freq": freq, "w": w}
    m = model(nodes, [("t", F, [1]), ("x", F, [1, 16])], [("y", F, [1, 16])], inits)
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        f"  t: {{shape: [1], data: {{distribution: uniform, low: {low}, high: {high}}}}}\n"
        "  x: {shape: [1, 16]}\n"
        f"precision: {{default: {default}, guards: {guards}}}\nbuild: {{backend: none}}\n"
        "accuracy: {tolerances: {default: {atol: 1e-2, rtol: 1e-2}}}\n"
    )
    return policy


def test_a_timestep_embedding_is_computed_in_fp32_by_the_periodic_guard(tmp_path, capsys):
    """FP16 stores t · freq (t up to 1000) to a quarter of a radian: the guard pins the
    argument's chain and the sine and cosine of it, not the frequencies' weight nor the
    projection after."""
    policy = _timestep_policy(tmp_path, 1000)
    assert main(["check", "--policy", str(policy), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    pinned = {n for n, r in rows.items() if r["rule"] == "guard:periodic-range"}
    assert pinned == {"unsqueeze", "mul", "sin", "cos"}
    assert all(rows[n]["precision"] == "fp32" for n in pinned)
    assert "computes the argument of Sin sin" in rows["mul"]["reason"]
    assert rows["proj"]["precision"] == "fp16"


def test_the_periodic_guard_reads_ranges_small_arguments_stay_fp16(tmp_path, capsys):
    policy = _timestep_policy(tmp_path, 1.0)  # |t · freq| below 32: FP16 holds its phase
    assert main(["check", "--policy", str(policy), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    assert rows["sin"]["precision"] == "fp16" and rows["mul"]["precision"] == "fp16"


def test_without_the_periodic_guard_the_timestep_embedding_fails(tmp_path):
    code, report = _build(_timestep_policy(tmp_path, 1000), tmp_path / "b")
    assert code == 0 and report["passed"]
    assert report["precision"]["rule_hits"]["guard:periodic-range"] == 4
    off = _timestep_policy(tmp_path, 1000, guards="[weight-range]")
    code, report = _build(off, tmp_path / "off")
    assert code == 1 and not report["passed"]


def test_convert_runs_the_reference_only_for_a_model_with_a_periodic_op(tmp_path):
    """The guard reads ranges: `convert` of a model with a Sin runs the FP32 reference's
    measures and pins; one without (most models) still runs no reference at all."""
    from tests.helpers import identity_policy
    from trtbuild.front import run_front
    from trtbuild.policy import load_policy

    front = run_front(load_policy(_timestep_policy(tmp_path, 1000)), reference="none", draw=False)
    assert front.measures is not None
    decisions = enumerate(front.assignment.decisions)
    pinned = {front.view.nodes[i].name for i, d in decisions if d.rule == "guard:periodic-range"}
    assert pinned == {"unsqueeze", "mul", "sin", "cos"}
    (tmp_path / "plain").mkdir()
    plain = identity_policy(tmp_path / "plain", [1, 4], "{shape: [1, 4]}")
    front = run_front(load_policy(plain), reference="none", draw=False)
    assert front.measures is None and not front.feeds


def _guarded(tmp_path, capsys, low: float, high: float, default: str = "fp16") -> set[str]:
    policy = _timestep_policy(tmp_path, high, default=default, low=low)
    capsys.readouterr()
    assert main(["check", "--policy", str(policy), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["nodes"]
    return {r["node"] for r in rows if r["rule"] == "guard:periodic-range"}


def test_the_periodic_bound_is_where_the_low_types_half_step_passes_a_hundredth(tmp_path, capsys):
    """FP16 rounds |x| in [16, 32) by at most 1/128 rad and from 32 on by up to 1/64: a
    timestep up to 30 stays FP16, one up to 40 does not. BF16 passes 0.01 from 4 on."""
    assert _guarded(tmp_path, capsys, 20, 30) == set()
    assert _guarded(tmp_path, capsys, 35, 40) == {"unsqueeze", "mul", "sin", "cos"}
    assert _guarded(tmp_path, capsys, 5, 10, "bf16") == {"unsqueeze", "mul", "sin", "cos"}
    assert _guarded(tmp_path, capsys, 0, 3, "bf16") == set()


def test_an_fp32_policy_has_no_periodic_guard_and_convert_runs_no_reference(tmp_path):
    from trtbuild.front import run_front
    from trtbuild.policy import load_policy

    policy = load_policy(_timestep_policy(tmp_path, 1000, default="fp32"))
    assert "guard:periodic-range" not in {r.id for r in policy.precision.all_rules()}
    assert run_front(policy, reference="none", draw=False).measures is None


def test_the_rotary_positions_cast_runs_fp32_once_the_product_is_pinned(tmp_path, capsys):
    """Positions up to 4095 as floats: FP16 holds integers exactly only to 2048. Positions
    the model computed from its data (an `ArgMax` of scores) are the model's: the guard
    stops at the product and the exact-cast rule keeps their `Cast` FP32; positions given
    as the graph's input are the argument's own, and the guard keeps their `Cast`."""
    from tests.helpers import I64, F, model, node

    def rows_for(counted: bool) -> dict:
        nodes = [
            node("Cast", ["pos"], "posf", "to_float", to=onnx.TensorProto.FLOAT),
            node("Reshape", ["posf", "row"], "prow", "as_row"),
            node("MatMul", ["inv", "prow"], "freqs", "outer"),
            node("Cos", ["freqs"], "out", "cos"),
        ]
        if counted:
            nodes.insert(0, node("ArgMax", ["scores"], "pos", "count", axis=1, keepdims=0))
        fed = ("scores", F, [16, 4096]) if counted else ("pos", I64, [16])
        inits = {"inv": np.ones((4, 1), np.float32), "row": np.array([1, -1], np.int64)}
        m = model(nodes, [fed], [("out", F, [4, 16])], inits)
        onnx.save(m, tmp_path / "m.onnx")
        data = "" if counted else ", data: {distribution: uniform, low: 0, high: 4096}"
        policy = tmp_path / "p.yaml"
        policy.write_text(
            "version: 1\nmodel: m.onnx\ninputs:\n"
            f"  {fed[0]}: {{shape: {fed[2]}{data}}}\n"
            "build: {backend: none}\n"
        )
        assert main(["check", "--policy", str(policy), "--json"]) == 0
        return {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}

    rows = rows_for(counted=True)
    assert rows["outer"]["rule"] == "guard:periodic-range" and rows["cos"]["precision"] == "fp32"
    assert rows["to_float"]["precision"] == "fp32" and rows["to_float"]["rule"] == "exact-cast"
    rows = rows_for(counted=False)
    assert rows["to_float"]["rule"] == "guard:periodic-range"


def _resize_policy(tmp_path, extra: str = "") -> str:
    from tests.helpers import resize_by_shape

    onnx.save(resize_by_shape(), tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {min: [1, 3, 64, 64], opt: [1, 3, 100, 150], "
        "max: [1, 3, 128, 192]}\n" + extra + "build: {backend: none}\n"
    )
    return str(policy)


def test_a_scale_computed_from_the_input_shape_runs_fp32_by_the_shape_guard(tmp_path, capsys):
    """FP16 rounded `200 / 150` and the output had 199 columns where FP32's has 200 (and
    TensorRT-RTX refused the FP16 shape computation): every float node computed from the
    shape alone is FP32, the Resize that reads the data stays FP16."""
    policy = _resize_policy(tmp_path)
    assert main(["check", "--policy", policy]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    for name in ("cast_hw", "maxside", "scale_div", "expand_s", "scales_concat"):
        assert rows[name][2:4] == ["fp32", "guard:shape-arithmetic"], rows[name]
    assert rows["resize"][2] == "fp16"
    assert main(["build", "--policy", policy, "-o", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["passed"] and report["precision"]["rule_hits"]["guard:shape-arithmetic"] == 5
    assert report["baselines"]["fp16"]["outputs"]["y"]["shape_mismatch"][0]["candidate"] == [1, 3, 133, 199]  # fmt: skip


def test_without_the_shape_guard_the_resized_shape_is_fp16s(tmp_path):
    policy = _resize_policy(tmp_path, "precision: {guards: [weight-range]}\n")
    assert main(["build", "--policy", policy, "-o", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    said = report["outputs"]["y"]["shape_mismatch"][0]
    assert said["candidate"] == [1, 3, 133, 199] and said["reference"] == [1, 3, 133, 200]


def _embedded() -> onnx.ModelProto:
    """A BERT/ViT-like front (review): position embeddings looked up by positions the
    sequence length cuts, a cls token spread to the batch, a mask filled to a shape's size;
    and one true shape computation, `1 / len` in a scalar."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = {
        "pos_w": rng.random((64, 16), np.float32), "tok_w": rng.random((100, 16), np.float32),
        "cls": rng.random((1, 1, 16), np.float32), "W": rng.random((16, 16), np.float32),
        "pos_ids": np.arange(64, dtype=np.int64)[None], "z": np.array([0], np.int64),
        "one": np.array([1], np.int64), "two": np.array([2], np.int64),
        "dd": np.array([16], np.int64), "unit": np.array(1.0, np.float32),
    }  # fmt: skip
    nodes = [
        ("Shape", ["ids"], "shp", "shape"), ("Slice", ["shp", "one", "two"], "seq", "seqlen"),
        ("Slice", ["pos_ids", "z", "seq", "one"], "pids", "slice_pos"),
        ("Gather", ["pos_w", "pids"], "pe", "pos_embed"), ("Gather", ["tok_w", "ids"], "te", "tok_embed"),
        ("Add", ["te", "pe"], "e", "add_embed"), ("Slice", ["shp", "z", "one"], "b", "batch"),
        ("Concat", ["b", "one", "dd"], "cshape", "cshape", {"axis": 0}),
        ("Expand", ["cls", "cshape"], "clsx", "cls_expand"),
        ("Concat", ["clsx", "e"], "h", "cat_cls", {"axis": 1}), ("ConstantOfShape", ["cshape"], "mask", "fill"),
        ("Cast", ["seq"], "seqf", "len_float", {"to": 1}), ("Div", ["unit", "seqf"], "inv", "inverse"),
        ("Mul", ["h", "inv"], "hs", "scale"), ("MatMul", ["hs", "W"], "y", "mm"),
        ("Add", ["clsx", "mask"], "c2", "masked"),
    ]  # fmt: skip
    made = [helper.make_node(op, i, [o], name=n, **(a[0] if a else {})) for op, i, o, n, *a in nodes]  # fmt: skip
    zero = numpy_helper.from_array(np.zeros(1, np.float32))
    next(n for n in made if n.name == "fill").attribute.append(helper.make_attribute("value", zero))
    graph = helper.make_graph(
        made, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 16]),
         helper.make_tensor_value_info("c2", TensorProto.FLOAT, ["b", 1, 16])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_shape_guard_leaves_lookups_spreads_and_fills_of_a_shapes_size_to_the_data():
    """The review found the position lookup, the cls token spread to the batch (and through
    the Concat the whole hidden state) pinned as "a shape computation"; a fill too."""
    from trtbuild.graph.model_io import infer_shapes
    from trtbuild.policy.specs import Precision
    from trtbuild.precision.assign import assign

    found = assign(infer_shapes(_embedded()), Precision())
    rules = {found.view.nodes[i].name: d.rule for i, d in enumerate(found.decisions)}
    assert [n for n, r in rules.items() if r == "guard:shape-arithmetic"] == [
        "len_float",
        "inverse",
    ]
    for name in ("pos_embed", "cls_expand", "cat_cls", "fill", "scale"):
        assert rules[name] != "guard:shape-arithmetic", (name, rules[name])


def _fourier_policy(tmp_path, guards: str = "true"):
    """SAM's prompt encoder: point coordinates up to 128 normalised to [-1, 1], then the
    `sin` and `cos` of `2π · coords @ B`. The coordinates are within 1, the argument
    reaches hundreds: FP16's rounding of the coordinates moves it by hundredths of a
    radian."""
    from tests.helpers import F, fourier_features, fourier_weights, model

    b = np.random.default_rng(0).normal(scale=10, size=(2, 16)).astype(np.float32)
    inits = {**fourier_weights(b), "side": np.array(128.0, np.float32)}
    nodes = fourier_features()
    m = model(nodes, [("pts", F, [1, 64, 2])], [("emb", F, [1, 64, 32])], inits)
    onnx.save(m, tmp_path / "fourier.onnx")
    policy = tmp_path / f"fourier_{len(guards)}.yaml"
    policy.write_text(
        "version: 1\nmodel: fourier.onnx\ninputs:\n"
        "  pts: {shape: [1, 64, 2], data: {distribution: uniform, low: 0, high: 128}}\n"
        f"precision: {{default: fp16, guards: {guards}}}\nbuild: {{backend: none}}\n"
        "accuracy: {tolerances: {default: {atol: 1e-2, rtol: 0, check_error_stat: max}}}\n"
    )
    return policy


def test_fourier_coordinates_are_computed_in_fp32_with_the_argument(tmp_path, capsys):
    """The coordinates' normalisation before the product is the argument's too: the guard
    judges it by the argument's peak (its own values stay within 128) and the policy
    passes; without the guard all-FP16 fails on the rounding of the coordinates."""
    policy = _fourier_policy(tmp_path)
    assert main(["check", "--policy", str(policy), "--json"]) == 0
    rows = {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}
    pinned = {n for n, r in rows.items() if r["rule"] == "guard:periodic-range"}
    chain = {"shift", "normalise", "twice", "centre", "project", "scale", "sin", "cos"}
    assert pinned == chain
    assert "|arg| reaches" in rows["centre"]["reason"]
    code, report = _build(policy, tmp_path / "b")
    assert code == 0 and report["passed"]
    code, report = _build(_fourier_policy(tmp_path, "[weight-range]"), tmp_path / "off")
    assert code == 1 and not report["passed"]


def test_the_shape_guard_keeps_arithmetic_on_a_shape_tensor_input_fp32():
    """A length fed as an int64 input (TensorRT's shape tensor) and halved in float for a
    Slice's end: FP16 makes 4099 x 0.5 = 2049.5 into 2050 where FP32 ends at 2049, and only
    a `Shape` node's arithmetic was kept FP32."""
    from onnx import TensorProto, helper, numpy_helper

    from trtbuild.graph.model_io import infer_shapes
    from trtbuild.policy.specs import Precision
    from trtbuild.precision.assign import assign

    nodes = [
        helper.make_node("Cast", ["n"], ["nf"], name="len_float", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["nf", "half"], ["h"], name="halve"),
        helper.make_node("Cast", ["h"], ["hi"], name="len_int", to=TensorProto.INT64),
        helper.make_node("Slice", ["x", "zero", "hi", "one"], ["s"], name="cut"),
        helper.make_node("Mul", ["s", "two"], ["y"], name="double"),
    ]
    weights = {"half": np.array(0.5, np.float32), "two": np.array(2.0, np.float32)}
    weights.update(zero=np.array([0], np.int64), one=np.array([1], np.int64))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5000]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "k"])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    found = assign(infer_shapes(model), Precision())
    rules = {found.view.nodes[i].name: d.rule for i, d in enumerate(found.decisions)}
    assert rules["len_float"] == rules["halve"] == "guard:shape-arithmetic", rules
    assert rules["double"] != "guard:shape-arithmetic"
    assert "shape input n" in found.decisions[1].reason


def test_the_shape_guard_leaves_data_made_from_a_size_input_to_the_data():
    """`lengths` [B] decides a Slice's end, and makes a padding mask and a gain too: every
    float node computed from it was pinned as shape arithmetic (6 nodes, 40% FP16); only
    what leads to a shape operand is."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from trtbuild.graph import patterns
    from trtbuild.graph.analysis import Analysis
    from trtbuild.graph.view import GraphView

    nodes = [
        h.make_node("ReduceMax", ["lengths"], ["maxlen"], "MaxLen", keepdims=1),
        h.make_node("Slice", ["x", "zero1", "maxlen", "one1"], ["xs"], "SliceT"),
        h.make_node("Shape", ["xs"], ["sh"], "Sh"),
        h.make_node("Gather", ["sh", "one"], ["t"], "T", axis=0),
        h.make_node("Range", ["zero", "t", "onei"], ["pos"], "Pos"),
        h.make_node("Unsqueeze", ["lengths", "one1"], ["lcol"], "Lcol"),
        h.make_node("Less", ["pos", "lcol"], ["valid"], "Valid"),
        h.make_node("Cast", ["valid"], ["maskf"], "MaskF", to=T.FLOAT),
        h.make_node("Sub", ["onef", "maskf"], ["inv"], "Inv"),
        h.make_node("Mul", ["inv", "big"], ["bias"], "Bias"),
        h.make_node("Add", ["xs", "bias"], ["y0"], "AddBias"),
        h.make_node("Cast", ["lengths"], ["lf"], "LenF", to=T.FLOAT),
        h.make_node("Div", ["lf", "norm"], ["lfn"], "LenNorm"),
        h.make_node("Unsqueeze", ["lfn", "one1"], ["lfc"], "LenCol"),
        h.make_node("Mul", ["y0", "lfc"], ["y"], "Gain"),
    ]
    values = {"zero1": [0], "one1": [1], "one": 1, "zero": 0, "onei": 1}
    inits = [nh.from_array(np.array(v, np.int64), k) for k, v in values.items()]
    inits += [
        nh.from_array(np.array(v, np.float32), k)
        for k, v in (("onef", 1), ("big", -1e4), ("norm", 16000))
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, ["B", "T"]),
            h.make_tensor_value_info("lengths", T.INT64, ["B"]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, ["B", "T2"])],
        inits,
    )
    view = GraphView(
        onnx.shape_inference.infer_shapes(
            h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
        )
    )
    assert patterns.find("shape_arithmetic", Analysis(view)) == {}
