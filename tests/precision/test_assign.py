"""The assignment's own decisions beside the rules': here, the Casts that make integers float."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.helpers import F, H, model, node, plain_session
from trtbuild.policy.specs import GUARDS, Precision
from trtbuild.precision.assign import EXACT_CAST, assign
from trtbuild.precision.convert import convert


def _anchors(through: bool = False) -> onnx.ModelProto:
    """A detector's anchors: the feature map's width (Shape, Gather), made float (Cast), a
    Range over it (no FP16 type: FP32), plus 0.5, added to the map. `through`: the width
    reaches the Range through a Reshape (data movement, which follows its input). Beside
    it the width made float again for an FP16 Mul, which no FP32 node reads."""
    width = ["wf"]
    nodes = [
        node("Conv", ["x", "k"], "f", "conv"),
        node("Shape", ["f"], "s", "shape"),
        node("Gather", ["s", "three"], "wd", "gather", axis=0),
        node("Cast", ["wd"], "wf", "cast", to=TensorProto.FLOAT),
    ]
    if through:
        nodes.append(node("Reshape", ["wf", "scalar"], "wr", "reshape"))
        width = ["wr"]
    nodes += [
        node("Range", ["zero", *width, "one"], "r", "range"),
        node("Add", ["r", "half"], "a", "anchor"),
        node("Add", ["f", "a"], "g", "add"),
        node("Cast", ["wd"], "wf2", "cast_side", to=TensorProto.FLOAT),
        node("Mul", ["g", "wf2"], "y", "scale"),
    ]
    scalars = {"zero": 0.0, "one": 1.0, "half": 0.5}
    inits = {k: np.array(v, np.float32) for k, v in scalars.items()}
    inits |= {"three": np.array(3, np.int64), "scalar": np.zeros(0, np.int64)}
    inits["k"] = np.full((4, 3, 1, 1), 0.25, np.float32)
    return model(nodes, [("x", F, [1, 3, 1, "W"])], [("y", F, [1, 4, 1, "W"])], inits)


def _precision(default: str = "fp16", shapes: bool = False) -> Precision:
    """No rules; `shapes`: with `guard:shape-arithmetic`, which takes arithmetic on shapes
    alone to FP32 before the exact casts are looked at (the tests here are theirs)."""
    guards = tuple(g for g in GUARDS if shapes or g != "shape-arithmetic")
    return Precision(default=default, guards=guards)


def _decided(m: onnx.ModelProto, default: str = "fp16", shapes: bool = False) -> dict:
    found = assign(m, _precision(default, shapes))
    return {found.view.nodes[i].name: d for i, d in enumerate(found.decisions)}


def test_the_shape_guard_takes_the_anchors_arithmetic_and_leaves_the_maps():
    """The width, its Range and the anchors (`+ 0.5`) are computed from the feature map's
    shape alone: FP32; what reads the map's values stays FP16."""
    decided = _decided(_anchors(), shapes=True)
    for name in ("cast", "range", "anchor", "cast_side"):
        assert (decided[name].precision, decided[name].rule) == ("fp32", "guard:shape-arithmetic")
    assert decided["add"].precision == decided["scale"].precision == "fp16"


@pytest.mark.parametrize("through", [False, True])
def test_a_cast_of_integers_an_fp32_node_reads_is_fp32(through):
    decided = _decided(_anchors(through))
    assert decided["range"].precision == "fp32" and decided["range"].rule == "schema"
    cast = decided["cast"]
    assert (cast.precision, cast.rule) == ("fp32", EXACT_CAST)
    assert "that range reads in FP32" in cast.reason and "up to 2048" in cast.reason
    if through:  # the data movement between follows the Cast again, to FP32
        assert (decided["reshape"].precision, decided["reshape"].rule) == ("fp32", "follows-input")
    assert (decided["cast_side"].precision, decided["cast_side"].rule) == ("fp16", "default")
    assert decided["anchor"].precision == "fp16"


def test_bf16_says_its_own_limit_and_an_fp32_default_has_nothing_to_keep():
    assert (
        "BF16 holds integers exactly only up to 256" in _decided(_anchors(), "bf16")["cast"].reason
    )
    assert all(d.rule != EXACT_CAST for d in _decided(_anchors(), "fp32").values())


def _conv(opset: int) -> onnx.ModelProto:
    nodes = [node("Conv", ["x", "k"], "c", "conv"), node("Relu", ["c"], "y", "relu")]
    inits = {"k": np.full((4, 3, 1, 1), 0.25, np.float32)}
    return model(nodes, [("x", F, [1, 3, 8, 8])], [("y", F, [1, 4, 8, 8])], inits, opset=opset)


def test_an_op_kept_fp32_by_its_schema_at_this_opset_names_the_opset_that_types_it():
    """Conv has no BF16 type before opset 22: a BF16 CNN at opset 17 kept every convolution
    FP32, a cast around each, and said only "schema" per node."""
    found = assign(_conv(17), _precision("bf16"))
    conv = found.decisions[0]
    assert (conv.precision, conv.rule, conv.opset) == ("fp32", "schema", 22)
    assert conv.reason == "Conv has no bf16 type at opset 17 (opset 22 has one: passes.opset: 22)"
    (hint,) = [w for w in found.warnings if "passes.opset" in w]
    assert hint.startswith("1 node(s) stay FP32 only because their op's schema at opset 17")
    assert "(Conv 1;" in hint and hint.endswith("set passes.opset: 22, whose schemas have one")
    for m, default in ((_conv(22), "bf16"), (_conv(17), "fp16")):
        found = assign(m, _precision(default))
        assert found.decisions[0].precision == default
        assert not [w for w in found.warnings if "passes.opset" in w]


def test_a_width_past_2048_reaches_the_range_whole():
    """In FP16, 2049 rounds to 2048: the Range made one anchor too few, and the Add that
    broadcasts it over the 2049-wide map could not run. Kept FP32, the mixed model runs
    and gives the FP32 model's anchors (the map's values aside, which are FP16)."""
    m = _anchors()
    mixed = convert(assign(m, _precision())).model
    onnx.checker.check_model(mixed, full_check=True)
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 1, 2049)).astype(np.float32)
    (want,) = plain_session(m).run(None, {"x": x})
    (got,) = plain_session(mixed).run(None, {"x": x})
    assert got.shape == want.shape == (1, 4, 1, 2049)
    np.testing.assert_allclose(got, want, rtol=2e-3)


def test_a_cast_read_as_a_graph_output_or_by_a_control_node_is_fp32_too():
    """Both keep their exported FP32 type: the width made FP16 first came back 2048. Here
    a graph output, and an If whose branches make the width float for a Range after it."""
    from onnx import helper

    def branch(tag: str) -> onnx.GraphProto:
        cast = node("Cast", ["wd"], f"w_{tag}", f"cast_{tag}", to=TensorProto.FLOAT)
        return helper.make_graph(
            [cast], tag, [], [helper.make_tensor_value_info(f"w_{tag}", TensorProto.FLOAT, [])]
        )

    m = model(
        [
            node("Shape", ["x"], "s", "shape"),
            node("Gather", ["s", "one_i"], "wd", "gather", axis=0),
            node("Cast", ["wd"], "width", "cast", to=TensorProto.FLOAT),
            node("Greater", ["wd", "zero_i"], "c", "positive"),
            helper.make_node(
                "If",
                ["c"],
                ["wf"],
                name="if",
                then_branch=branch("then"),
                else_branch=branch("else"),
            ),
            node("Range", ["zero", "wf", "one"], "r", "range"),
        ],
        [("x", F, [1, "W"])],
        [("width", F, []), ("r", F, ["W"])],
        {
            "one_i": np.array(1, np.int64),
            "zero_i": np.array(0, np.int64),
            "zero": np.array(0, np.float32),
            "one": np.array(1, np.float32),
        },
    )
    decided = _decided(m)
    assert decided["cast"].rule == EXACT_CAST and "graph output width" in decided["cast"].reason
    for tag in ("then", "else"):
        assert decided[f"cast_{tag}"].rule == EXACT_CAST
    mixed = convert(assign(m, _precision())).model
    width, r = plain_session(mixed).run(None, {"x": np.zeros((1, 2049), np.float32)})
    assert width == 2049 and r.shape == (2049,)


@pytest.mark.parametrize("cast_first", [True, False])
def test_a_concat_passes_the_fp32_read_on_only_where_it_follows_the_cast(cast_first):
    """Concat(width, relu) follows the width: FP32 with it, the width whole. Concat(relu,
    width) follows the FP16 Relu and stores the width in FP16 whatever the Cast runs in:
    no `exact-cast` claimed there (it said "exact there", and 2049 came out 2048)."""
    values = ["wf", "r"] if cast_first else ["r", "wf"]
    m = model(
        [
            node("Shape", ["x"], "s", "shape"),
            node("Gather", ["s", "one_i"], "wd", "gather", axis=0),
            node("Cast", ["wd"], "w1", "cast", to=TensorProto.FLOAT),
            node("Reshape", ["w1", "single"], "wf", "as_vector"),
            node("ReduceMax", ["x"], "mx", "peak", axes=[1], keepdims=0),
            node("Relu", ["mx"], "r", "relu"),
            node("Concat", values, "c", "concat", axis=0),
        ],
        [("x", F, [1, "W"])],
        [("c", F, [2])],
        {"one_i": np.array(1, np.int64), "single": np.array([1], np.int64)},
    )
    decided = _decided(m)
    assert (decided["cast"].rule == EXACT_CAST) == cast_first
    (c,) = plain_session(convert(assign(m, _precision())).model).run(
        None, {"x": np.zeros((1, 2049), np.float32)}
    )
    assert (c[0 if cast_first else 1] == 2049) == cast_first


@pytest.mark.parametrize("pinned_first", [True, False])
def test_a_concat_of_a_pinned_value_follows_it_to_fp32_whichever_input_it_is(pinned_first):
    """A Relu pinned for its range (9.6e4, past FP16's) concatenated with an FP16 branch:
    the Concat followed its first input, and where that was the FP16 branch the pinned
    value was cast down and turned inf (Inception v1 of the ONNX model zoo; `tune` then
    stopped on the Cast it could not place). An FP32 input is followed wherever it is."""
    from trtbuild.policy.specs import Match, Rule

    values = ["big", "small"] if pinned_first else ["small", "big"]
    m = model(
        [
            node("Mul", ["x", "gain"], "scaled", "scale"),
            node("Relu", ["scaled"], "big", "wide"),
            node("Sigmoid", ["x"], "small", "narrow"),
            node("Concat", values, "c", "join", axis=1),
        ],
        [("x", F, [1, 4])],
        [("c", F, [1, 8])],
        {"gain": np.float32(3e4)},
    )
    pins = Precision(rules=(Rule("range", Match(name="^(scale|wide)$"), "fp32"),))
    assignment = assign(m, pins)
    decided = {assignment.view.nodes[i].name: d for i, d in enumerate(assignment.decisions)}
    join = decided["join"]
    assert (join.precision, join.rule) == (
        "fp32",
        "follows-input",
    ) and "follows wide" in join.reason
    assert decided["narrow"].precision == "fp16"
    x = np.array([[1.0, 2.0, 3.2, -1.0]], np.float32)
    (c,) = plain_session(convert(assignment).model).run(None, {"x": x})
    big = np.maximum(x * np.float32(3e4), 0)[0]
    np.testing.assert_array_equal(c[0, :4] if pinned_first else c[0, 4:], big)  # 9.6e4 whole


def test_a_cast_between_floats_follows_its_input_to_a_graph_output():
    """A pinned sum cast to its own type before the output (ModelOpt's default export
    casts every output back, `total_cast_to_fp32`; prepare makes that cast FP32 to FP32):
    the Cast took the default, so the pinned 9.6e4 was stored in FP16 as inf on its way
    to the FP32 output. A Cast only converts; like data movement it follows its input."""
    from trtbuild.policy.specs import Match, Rule

    m = model(
        [
            node("Mul", ["x", "gain"], "scaled", "scale"),
            node("ReduceSum", ["scaled"], "sum", "sum", keepdims=1),
            node("Cast", ["sum"], "y", "sum_cast", to=TensorProto.FLOAT),
            node("Sigmoid", ["x"], "small", "narrow"),
            node("Cast", ["small"], "z", "small_cast", to=TensorProto.FLOAT),
        ],
        [("x", F, [1, 4])],
        [("y", F, [1, 1]), ("z", F, [1, 4])],
        {"gain": np.float32(3e4)},
    )
    pins = Precision(rules=(Rule("range", Match(name="^(scale|sum)$"), "fp32"),))
    assignment = assign(m, pins)
    decided = {assignment.view.nodes[i].name: d for i, d in enumerate(assignment.decisions)}
    cast = decided["sum_cast"]
    assert (cast.precision, cast.rule) == ("fp32", "follows-input") and "sum" in cast.reason
    assert (decided["small_cast"].precision, decided["small_cast"].rule) == (
        "fp16",
        "follows-input",
    )
    x = np.array([[1.0, 2.0, 0.2, 0.0]], np.float32)
    y, _ = plain_session(convert(assignment).model).run(None, {"x": x})
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, [[9.6e4]], rtol=1e-6)  # FP16 stops at 65504


def test_an_fp64_node_keeps_its_type_and_says_so():
    """A square computed in FP64 as exported: no FP32 tensor to lower, and the
    reason says FP64, not that it holds no float."""
    m = model(
        [node("Mul", ["t", "t"], "s", "square"),
         node("Cast", ["s"], "y", "to_float", to=TensorProto.FLOAT),
         node("Shape", ["t"], "n", "shape")],
        [("t", TensorProto.DOUBLE, [4])],
        [("y", F, [4]), ("n", TensorProto.INT64, [1])],
    )  # fmt: skip
    decided = _decided(m)
    assert decided["square"].precision is None and "FP64" in decided["square"].reason
    assert decided["shape"].reason == "produces no floating-point tensor"


def test_only_a_weight_handed_out_as_it_is_stays_fp32():
    """A weight's `Identity` into an output no node reads is FP32 (rule `weight-output`); an
    embedding lookup by an input (`Gather(w, ids)`), or what other nodes read on, is not."""
    w = np.linspace(-3, 3, 12, dtype=np.float32).reshape(4, 3)
    m = model(
        [node("Identity", ["w"], "handed", "copy"),
         node("Gather", ["w", "ids"], "e", "embed", axis=0),
         node("Concat", ["e", "x"], "c", "cat", axis=0),
         node("Reshape", ["w", "shape"], "flat", "flatten"),
         node("Mul", ["flat", "two"], "y", "twice")],
        [("ids", TensorProto.INT64, [2]), ("x", F, [1, 3])],
        [("handed", F, [4, 3]), ("e", F, [2, 3]), ("c", F, [3, 3]), ("flat", F, [12]),
         ("y", F, [12])],
        {"w": w, "shape": np.array([12], np.int64), "two": np.array(2.0, np.float32)},
    )  # fmt: skip
    decided = _decided(m)
    assert (decided["copy"].precision, decided["copy"].rule) == ("fp32", "weight-output")
    assert decided["embed"].precision == decided["cat"].precision == "fp16"
    assert decided["flatten"].precision == "fp16"  # the Mul reads it on: not handed out alone


def test_an_input_handed_back_as_it_is_keeps_its_own_type():
    """An input an `Identity` or a `Transpose` hands straight to an output (torch's `return
    y, x`) keeps the input's type (rule `input-output`): FP16 would hand back FP32(FP16(x)).
    An FP16 input stays FP16; a copy other nodes read on follows the default."""
    m = model(
        [node("Relu", ["x"], "y", "relu"),
         node("Identity", ["x"], "x_out", "back"),
         node("Transpose", ["x"], "x_t", "back_t", perm=[1, 0]),
         node("Identity", ["h"], "h_out", "back_h"),
         node("Reshape", ["x", "shape"], "flat", "flatten"),
         node("Mul", ["flat", "two"], "z", "twice"),
         node("Gather", ["w", "ids"], "e", "embed", axis=0)],
        [("x", F, [2, 3]), ("h", H, [2, 3]), ("ids", TensorProto.INT64, [2])],
        [("y", F, [2, 3]), ("x_out", F, [2, 3]), ("x_t", F, [3, 2]), ("h_out", H, [2, 3]),
         ("z", F, [6]), ("e", F, [2, 3])],
        {"shape": np.array([6], np.int64), "two": np.array(2.0, np.float32),
         "w": np.ones((4, 3), np.float32)},
    )  # fmt: skip
    decided = _decided(m)
    assert (decided["embed"].precision, decided["embed"].rule) == ("fp16", "default")  # a lookup
    for name in ("back", "back_t"):
        assert (decided[name].precision, decided[name].rule) == ("fp32", "input-output")
    assert (decided["back_h"].precision, decided["back_h"].rule) == ("fp16", "input-output")
    assert decided["flatten"].precision == decided["relu"].precision == "fp16"
    mixed = convert(assign(m, _precision())).model
    x = np.array([[0.1, 1 / 3, 2049.0], [-7.77, 1e-5, 3.14159]], np.float32)
    h = x.astype(np.float16)
    ids = np.array([0, 3], np.int64)
    got = plain_session(mixed).run(["x_out", "x_t", "h_out"], {"x": x, "h": h, "ids": ids})
    np.testing.assert_array_equal(got[0], x)  # not x rounded to FP16 and back
    np.testing.assert_array_equal(got[1], x.T)
    np.testing.assert_array_equal(got[2], h)


def test_a_share_is_stored_as_all_or_none_only_where_it_is():
    """Four places, as report.json holds a share; one node of twenty thousand is not all."""
    from trtbuild.precision.assign import stored_share
    from trtbuild.words import percent

    assert stored_share(431, 1000) == 0.431
    assert (stored_share(0, 5), stored_share(5, 5), stored_share(0, 0)) == (0.0, 1.0, 0.0)
    assert stored_share(20000, 20001) == 0.9999 and percent(stored_share(20000, 20001)) == ">99.9%"
    assert stored_share(1, 30000) == 0.0001 and percent(stored_share(1, 30000)) == "<0.1%"


def _dq_reshape(requantized: bool) -> onnx.ModelProto:
    """x -> Q -> DQ -> Reshape -> Relu, or with a Q/DQ pair around the Reshape's output too
    (`requantized`: ONNX Runtime's quantize_static quantizes around data movement)."""
    s, z = "s", "z"
    nodes = [
        node("QuantizeLinear", ["x", s, z], "xq", "q"),
        node("DequantizeLinear", ["xq", s, z], "xd", "dq"),
        node("Reshape", ["xd", "shape"], "r", "reshape"),
    ]
    if requantized:
        nodes += [
            node("QuantizeLinear", ["r", s, z], "rq", "q2"),
            node("DequantizeLinear", ["rq", s, z], "rd", "dq2"),
        ]
    nodes.append(node("Relu", ["rd" if requantized else "r"], "y", "relu"))
    inits = {s: np.array(0.05, np.float32), z: np.array(0, np.int8)}
    inits["shape"] = np.array([1, 8], np.int64)
    return model(nodes, [("x", F, [2, 4])], [("y", F, [1, 8])], inits, opset=19)


@pytest.mark.parametrize("requantized", [False, True])
def test_data_movement_after_a_dq_is_fp32_where_its_reader_is_pinned(tmp_path, requantized):
    """A quantized UNet's GroupNorm (DQ -> Reshape -> [Q -> DQ ->] InstanceNormalization):
    the Reshape followed the DQ, the DQ what it fed, so both took the default and the
    pinned op read FP16-rounded values; `tune`, every group pinned, still failed PSNR 50
    against the quantized graph and said FP16 was not what failed it."""
    from trtbuild.front import run_front
    from trtbuild.policy.model import load_policy

    onnx.save(_dq_reshape(requantized), tmp_path / "m.onnx")
    rule = '[{id: pin, match: {name: "^relu$"}, precision: fp32}]'
    for rules, want in (("[]", "fp16"), (rule, "fp32")):
        policy = tmp_path / "p.yaml"
        policy.write_text(f"version: 1\nmodel: m.onnx\nprecision: {{rules: {rules}}}\n")
        found = run_front(load_policy(policy), reference="none").assignment
        decided = {found.view.nodes[i].name: d.precision for i, d in enumerate(found.decisions)}
        assert decided["reshape"] == decided["dq"] == want, decided
        if requantized:
            assert decided["q2"] == want, decided


@pytest.mark.parametrize(("opset", "low"), [(17, "bf16"), (22, "bf16"), (17, "fp16")])
def test_an_op_tensorrt_runs_in_no_low_type_stays_fp32_and_no_opset_is_offered(opset, low):
    """HardSwish's schema types BF16 from opset 22, and the hint said `passes.opset: 22`:
    TensorRT-RTX then refused the BF16 HardSwish (exit 3). FP16's Range the same at 27."""
    nodes = [node("Conv", ["x", "k"], "c", "conv"), node("HardSwish", ["c"], "h", "act")]
    nodes += [node("Relu", ["h"], "y", "relu")]
    inits = {"k": np.full((4, 3, 1, 1), 0.25, np.float32)}
    m = model(nodes, [("x", F, [1, 3, 8, 8])], [("y", F, [1, 4, 8, 8])], inits, opset=opset)
    found = assign(m, _precision(low))
    act = found.decisions[1]
    if low == "fp16":  # FP16 HardSwish runs: only BF16's is refused
        assert act.precision == "fp16"
        return
    assert (act.precision, act.rule, act.opset) == ("fp32", "schema", None)
    assert act.reason == "TensorRT runs no bf16 HardSwish; kept FP32"
    assert not any("HardSwish" in w for w in found.warnings)
