"""Each suspect's error alone: the gated graph, the error statistic, the ranking, the search."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.helpers import (
    F,
    as_stored,
    model,
    node,
    plain_session,
    read_log,
    run_tune,
    strict_tolerances,
    without_rules,
)
from trtbuild import front as front_mod
from trtbuild.accuracy.sessions import REFERENCE
from trtbuild.graph.view import GraphView
from trtbuild.policy import load_policy
from trtbuild.policy.specs import Tolerance
from trtbuild.tuning import groups
from trtbuild.tuning import search as search_mod
from trtbuild.tuning.alone import (
    GATE,
    MOST_ALONE,
    errors_alone,
    gated_model,
    output_error,
    rank_alone,
    stores,
)

STRICT = """version: 1
model: m.onnx
inputs:
  x: {shape: [1, 4], data: {distribution: uniform, low: 0.5, high: 2.0}}
precision: {default: %s, rules: []}
build: {backend: none}
accuracy:
  samples: 1
  tolerances:
    default: {atol: 0.0, rtol: 0.0, check_error_stat: max}
"""


def _small(tmp_path, m: onnx.ModelProto, low: str = "fp16"):
    """`m` with a strict policy in `tmp_path`: its front half, and its groups."""
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(STRICT % low)
    front = front_mod.run_front(load_policy(tmp_path / "p.yaml"))
    return front, groups(front, "nodes")


@pytest.fixture(scope="module")
def nafnet(tmp_path_factory, models_dir):
    """The NAFNet example's front half with no rules: every node a tunable group."""
    tmp = tmp_path_factory.mktemp("alone")
    front = front_mod.run_front(load_policy(without_rules("nafnet", tmp, models_dir)))
    return front, groups(front, "nodes")


def _gated_run(model: onnx.ModelProto, feed: dict, on: set[int], names: list[str]) -> list:
    """`names` from a run of the gated `model` on `feed`, the gates of the groups `on` on."""
    session = plain_session(model)
    gates = {
        i.name: np.array(int(i.name.rsplit("_", 1)[1]) in on)
        for i in session.get_inputs()
        if i.name.startswith(GATE.format(""))
    }
    return session.run(names, {**feed, **gates})


def _run(model: onnx.ModelProto, front, gates_on: set[int], extra: list[str] = ()) -> dict:
    names = [*front.view.outputs, *extra]
    return dict(zip(names, _gated_run(model, front.shapes[0].feeds[0], gates_on, names)))


def test_gates_off_compute_the_fp32_graph_and_one_gate_stores_only_its_group(nafnet):
    front, found = nafnet
    conv = next(k for k, g in enumerate(found) if g.names == ("/intro/Conv",))
    model = gated_model(front, found, range(len(found)), "fp16")
    out = front.view.nodes[found[conv].nodes[0]].output[0]
    last = next(g for g in reversed(found) if g.kind == "node" and "Conv" in g.names[0])
    later = front.view.nodes[last.nodes[0]].output[0]  # another group's: computed in FP32
    for name in (out, later):
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        )
    reference = front.shapes[0].reference.run_results[REFERENCE][0]
    off = _run(model, front, set(), [out])
    for name in front.view.outputs:
        np.testing.assert_array_equal(off[name], reference[name])
    assert not np.array_equal(off[out], as_stored(off[out]))
    on = _run(model, front, {conv}, [out, later])
    np.testing.assert_array_equal(on[out], as_stored(on[out]))
    assert not np.array_equal(on[later], as_stored(on[later]))
    assert any(not np.array_equal(on[n], reference[n]) for n in front.view.outputs)


@pytest.mark.parametrize(
    ("tol", "expected"),
    [
        (Tolerance(check_error_stat="max"), 4.0),
        (Tolerance(check_error_stat="mean"), 1.75),
        (Tolerance(check_error_stat="median"), 1.5),
        (Tolerance(check_error_stat="quantile", error_quantile=0.75), 2.5),
        (Tolerance(check_error_stat="quantile"), 1.5),  # no quantile given: the median
        (Tolerance(atol=2.0, rtol=0.0, check_error_stat="elemwise"), 2.0),
        (Tolerance(atol=0.0, rtol=1.0, check_error_stat="elemwise"), 1.0),  # 1 over |1|
        (Tolerance(atol=1.0, rtol=0.5, check_error_stat="elemwise"), 2.0),  # 4 over max(1, 2)
        (Tolerance(simple=False, psnr_threshold=30.0), 5.25),  # the mean square error
    ],
)
def test_the_error_is_the_statistic_the_outputs_tolerance_judges(tol, expected):
    ref = np.array([1.0, 2.0, 4.0, 3.0], np.float32)
    out = ref + np.array([1.0, 0.0, 4.0, -2.0], np.float32)
    assert output_error(out, ref, tol) == pytest.approx(expected)
    assert output_error(np.array([np.inf, 2, 4, 3], np.float32), ref, tol) == np.inf
    # a count the data decides (NonZero's) that is not FP32's: the worst, not a broadcast
    assert output_error(np.array([1.0], np.float32), ref, tol) == np.inf


def test_each_failing_output_counts_alike_and_ties_keep_the_maps_order():
    errors = {
        0: {"a": 1.0, "b": 0.0},
        1: {"a": 0.0, "b": 1e-3},  # as bad on b as 0 is on a: b's scale is not a's
        2: {"a": 0.5, "b": 0.0},
        3: {"a": 0.0, "b": 0.0},
        4: {"a": 0.0, "b": 0.0},
    }
    assert rank_alone([4, 3, 1, 0, 2], errors, ["a", "b"]) == [1, 0, 2, 4, 3]
    assert rank_alone([0, 2], errors, ["a"]) == [0, 2]
    errors[2]["a"] = np.inf  # an inf alone outranks every finite error
    assert rank_alone([0, 2], errors, ["a"]) == [2, 0]
    # a group not measured (inside a body) is not ranked below those measured
    assert rank_alone([0, 7, 2], errors, ["a"]) == [7, 2, 0]


@pytest.mark.parametrize("ranked", [24, 11])
def test_where_the_error_map_ranks_no_suspect_the_search_grows_the_worst_alone_first(
    ranked, tmp_path, models_dir, capsys, monkeypatch
):
    """NAFNet with every tolerance exact: past the range analysis, every suspect's error
    reaches the output through the same jump, so the map scores them alike; the growing's
    first pin is the group whose rounding alone errs most, and the log and the summary say
    how it was ranked. With more suspects than `MOST_ALONE`, only that many are run, the
    nearest the outputs."""
    monkeypatch.setattr(search_mod, "MOST_ALONE", min(ranked, MOST_ALONE))
    policy = strict_tolerances(without_rules("nafnet", tmp_path, models_dir))
    assert run_tune(policy, tmp_path / "t.yaml", "--budget", "12") in (0, 1)
    log = read_log(tmp_path / "t.log.jsonl")
    grow = next(t for t in log if t["action"].startswith("grow"))
    assert [t for t in log if "ranking" in t] == [grow]
    assert "the error map scores its 24 suspects alike: ranked " in grow["ranking"]
    assert f"by each one's error alone at shape ({ranked} runs)" in grow["ranking"]
    assert ("the other" in grow["ranking"]) == (ranked < 24)
    assert grow["ranking"] in capsys.readouterr().out
    if ranked < 24:
        assert f"ranked the {ranked} nearest the outputs by" in grow["ranking"]
        assert f"the other {24 - ranked} after them (at most {ranked} runs)" in grow["ranking"]
    strict = front_mod.run_front(load_policy(policy))
    search = search_mod.Search(strict, 12, "nodes", 0, 1)
    found = search.groups
    search.pinned = [k for k, g in enumerate(found) if g.label in log[0]["pinned_groups"]]
    low_made = search_mod._low_made(search)  # what the start's candidate stores in FP16
    (first,) = set(grow["pinned_groups"]) - set(log[0]["pinned_groups"])
    rest = [k for k in range(len(found)) if k not in search.pinned]
    in_order = sorted(rest, key=lambda k: -max(found[k].nodes))  # the map's: all alike
    head = in_order[:ranked]
    outputs = sorted(log[0]["max_abs"])  # both fail at the start
    alone = errors_alone(strict, found, head, "fp16", 0, low_made)
    best = rank_alone(head, alone, outputs)
    assert first == found[best[0]].label
    assert best[0] != in_order[0]  # not the map's tie-break: the ranking decided
    longer = 0
    for trial in log:  # past the ranked ones, the others follow in the map's order
        grown = [k for k in rest if found[k].label in trial["pinned_groups"]]
        if trial["action"].startswith("grow") and len(grown) > ranked:
            assert set(grown) == {*best, *in_order[ranked : len(grown)]}
            longer += 1
    assert longer or ranked == 24


@pytest.mark.parametrize("low", ["fp16", "bf16"])
def test_a_gate_stores_what_pinning_its_group_keeps_in_fp32(tmp_path, low):
    """y = (x * w) + b, every node low in the candidate: the Mul alone stores its graph
    input and its weight on the way in, its product on the way out, and the Add stays
    FP32; the Add alone stores its weight and its sum, not the product, which the Mul
    stores pinned or not. With the Mul made FP32 (pinned), the Add reads its product
    through its own store. b nearly cancels x * w: the sum is small, so every rounding
    before it shows, in BF16's coarse steps as in FP16's, and a store left out fails."""
    w = np.array([[0.4494, 0.5456, 1.1599, 1.3306]], np.float32)
    b = np.array([[-0.6887, -0.8248, -0.9537, -0.7404]], np.float32)
    m = model(
        [node("Mul", ["x", "w"], "a", "mul"), node("Add", ["a", "b"], "y", "add")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"w": w, "b": b},
    )
    front, found = _small(tmp_path, m, low)
    mul = next(k for k, g in enumerate(found) if g.names == ("mul",))
    add = next(k for k, g in enumerate(found) if g.names == ("add",))
    gated = gated_model(front, found, range(len(found)), low, frozenset({"a", "y"}))
    x = np.array([[1.5006, 1.8491, 0.869, 0.7088]], np.float32)
    rx, rw, rb = as_stored(x, low), as_stored(w, low), as_stored(b, low)
    expected = as_stored(rx * rw, low) + b
    np.testing.assert_array_equal(_run_feed(gated, {"x": x}, {mul}), expected)
    # without the input's, the weight's or the product's store, or with the sum's too
    for wrong in (as_stored(x * rw, low), as_stored(rx * w, low), rx * rw):
        assert not np.array_equal(wrong + b, expected)
    assert not np.array_equal(as_stored(expected, low), expected)
    np.testing.assert_array_equal(_run_feed(gated, {"x": x}, set()), x * w + b)
    alone = as_stored(x * w + rb, low)
    np.testing.assert_array_equal(_run_feed(gated, {"x": x}, {add}), alone)
    assert not np.array_equal(as_stored(x * w + b, low), alone)  # the weight's store shows
    pinned = gated_model(front, found, [add], low, frozenset({"y"}))  # the Mul made FP32
    through = as_stored(as_stored(x * w, low) + rb, low)
    np.testing.assert_array_equal(_run_feed(pinned, {"x": x}, {add}), through)
    assert not np.array_equal(alone, through)


def _run_feed(gated: onnx.ModelProto, feed: dict, on: set[int]) -> np.ndarray:
    return _gated_run(gated, feed, on, ["y"])[0]


def test_a_value_read_twice_is_stored_once_and_a_resizes_scales_never(tmp_path):
    c = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
    m = model(
        [node("Sum", ["x", "c", "c"], "s", "sum"), node("Relu", ["s"], "y", "relu")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"c": c},
    )
    front, found = _small(tmp_path, m)
    k = next(k for k, g in enumerate(found) if g.names == ("sum",))
    x = np.array([[1.0001, 1.2345, 0.777, 1.9999]], np.float32)
    gated = gated_model(front, found, [k], "fp16")
    y = _run_feed(gated, {"x": x}, {k})
    np.testing.assert_array_equal(y, as_stored(as_stored(x) + 2 * as_stored(c)))
    stores_of_c = [
        n
        for n in gated.graph.node
        if n.op_type == "If" and n.input and n.output[0].startswith("c__")
    ]
    assert len(stores_of_c) == 1  # rounding twice would give the same values: counted
    resize = model(
        [node("Resize", ["x", "", "scales"], "y", "resize", mode="linear")],
        [("x", F, [1, 1, 3, 3])],
        [("y", F, [1, 1, 4, 4])],
        {"scales": np.array([1, 1, 4 / 3, 4 / 3], np.float32)},
    )
    assert stores(GraphView(resize), 0, onnx.TensorProto.FLOAT16) == ([0], [0])


def test_a_cast_stores_its_output_only_and_an_unknown_op_nothing():
    """A Cast converts what it reads (it stores its output, not its input); an op whose
    schema is unknown is left as it is by the conversion, so a gate stores nothing of it."""
    cast = model(
        [node("Cast", ["x"], "y", "cast", to=onnx.TensorProto.FLOAT)],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
    )
    assert stores(GraphView(cast), 0, onnx.TensorProto.FLOAT16) == ([], [0])
    custom = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Mine", ["x"], ["y"], name="mine", domain="custom")],
            "g",
            [onnx.helper.make_tensor_value_info("x", F, [1, 4])],
            [onnx.helper.make_tensor_value_info("y", F, [1, 4])],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("custom", 1)],
    )
    assert stores(GraphView(custom), 0, onnx.TensorProto.FLOAT16) == ([], [])


def test_an_opset_8_graph_is_ranked_alone_too(tmp_path, capsys):
    """The gates are `If`s, which every opset has (a `Where` would need opset 9)."""
    w = np.array([[3.0001, 1.0007, 0.3333, 7.77]], np.float32)
    m = model(
        [node("Mul", ["x", "w"], "a", "mul"), node("Sigmoid", ["a"], "y", "sigmoid")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"w": w},
        opset=8,
    )
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(STRICT % "fp16")
    assert run_tune(tmp_path / "p.yaml", tmp_path / "t.yaml") == 0
    assert "alike: ranked by each one's error alone at shape (2 runs)" in capsys.readouterr().out


def test_a_dequantized_value_is_charged_to_its_reader_as_the_candidate_stores_it(tmp_path):
    """Q -> DQ -> MatMul, the MatMul alone in FP16: the DQ follows its reader (FP16 with it,
    FP32 with it pinned), so its output is the MatMul's to store, and the gate gives what
    the emulated candidate computes, bit for bit."""
    from trtbuild.accuracy.emulate import emulate
    from trtbuild.precision.convert import convert

    w = np.random.default_rng(0).uniform(-1, 1, (4, 4)).astype(np.float32)
    scales = {"s": np.array(0.0123457, np.float32), "zp": np.array(0, np.int8)}
    m = model(
        [
            node("QuantizeLinear", ["x", "s", "zp"], "q", "q"),
            node("DequantizeLinear", ["q", "s", "zp"], "dq", "dq"),
            node("MatMul", ["dq", "w"], "y", "mm"),
        ],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {"w": w, **scales},
    )
    front, _ = _small(tmp_path, m)
    search = search_mod.Search(front, 10, "nodes", 0, 1)
    low_made = search_mod._low_made(search)
    assert "y" in low_made and "dq" not in low_made
    (mm,) = range(len(search.groups))
    gated = gated_model(front, search.groups, [mm], "fp16", low_made)
    x = np.array([[1.0001, -0.4321, 0.777, 1.2999]], np.float32)
    candidate = emulate(convert(front.assignment).model)  # every group in FP16: the MatMul
    expected = plain_session(candidate).run(["y"], {"x": x})[0]
    np.testing.assert_array_equal(_run_feed(gated, {"x": x}, {mm}), expected)


def test_pins_that_change_what_is_made_low_measure_the_errors_alone_again(tmp_path):
    """y = (x * w) * v + x * u, w tiny: the product `a` is an FP16 subnormal (coarse), and
    v scales its rounding up. With the tiny Mul low, `a` is stored by its maker whatever
    its reader's gate, and the scale alone adds least; with it pinned, the scale stores
    `a` itself and adds most. Errors kept from the first ranking (under other pins) would
    rank the scale last again: `Search.alone` is measured again where that set changed."""
    m = model(
        [
            node("Mul", ["x", "w"], "a", "tiny"),
            node("Mul", ["a", "v"], "c", "scale"),
            node("Mul", ["x", "u"], "e", "side"),
            node("Add", ["c", "e"], "y", "add"),
        ],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {k: np.array(v, np.float32) for k, v in {"w": 1e-6, "v": 1e4, "u": 0.05}.items()},
    )
    front, _ = _small(tmp_path, m)
    search = search_mod.Search(front, 10, "nodes", 0, 1)
    k = {g.names[0]: n for n, g in enumerate(search.groups)}
    rest = [k["scale"], k["side"], k["add"]]
    assert search_mod._ranked_alone(search, [k["tiny"], *rest], ("y",))[-1] == k["scale"]
    search.pinned = [k["tiny"]]
    assert search_mod._ranked_alone(search, rest, ("y",))[0] == k["scale"]
    assert search.rankings[-1].note.endswith("(3 runs)")  # none of the first's kept


def test_a_ranking_that_cannot_run_leaves_the_maps_order_and_says_why(
    tmp_path, models_dir, capsys, monkeypatch
):
    """A heuristic never stops `tune`: where the gated graph fails to run (here made to),
    the suspects keep the map's order, nearest the outputs first."""

    def fails(*args, **kwargs):
        raise RuntimeError("no session for this graph\nsecond line")

    monkeypatch.setattr(search_mod, "errors_alone", fails)
    policy = strict_tolerances(without_rules("nafnet", tmp_path, models_dir))
    assert run_tune(policy, tmp_path / "t.yaml", "--budget", "4") in (0, 1)
    out = capsys.readouterr().out
    assert "could not rank them alone (RuntimeError: no session for this graph)" in out
    log = read_log(tmp_path / "t.log.jsonl")
    grow = next(t for t in log if t["action"].startswith("grow"))
    found = groups(front_mod.run_front(load_policy(policy)), "nodes")
    rest = [k for k, g in enumerate(found) if g.label not in log[0]["pinned_groups"]]
    nearest = max(rest, key=lambda k: max(found[k].nodes))
    assert grow["action"] == f"grow: pin {found[nearest].label}"


def test_a_cast_of_integers_is_charged_to_its_reader_as_a_dequantize_is(tmp_path):
    """Pinning the reader of a Cast of integers makes the Cast FP32 too (`exact-cast`), so
    the ranking charges its value to the reader, not to a maker that stores it anyway."""
    from onnx import TensorProto

    m = model(
        [
            node("Shape", ["x"], "s", "shape"),
            node("Gather", ["s", "one"], "w", "width", axis=0),
            node("Cast", ["w"], "sf", "cast", to=TensorProto.FLOAT),
            node("Mul", ["x", "sf"], "y", "scale"),
        ],
        [("x", F, [1, "W"])],  # a width not folded away: the policy's shape picks it
        [("y", F, [1, "W"])],
        {"one": np.array(1, np.int64)},
    )
    front, _ = _small(tmp_path, m)
    low_made = search_mod._low_made(search_mod.Search(front, 10, "nodes", 0, 1))
    assert "sf" not in low_made and "y" in low_made


def test_a_ranking_of_errors_measured_before_says_so_not_zero_runs(tmp_path):
    """A Mixture-of-Experts block's `tune`: after the verification failed at another point,
    the search grew again under the same values made low and ranked the same suspects from
    the errors it had: the note said "(0 runs)", as if nothing had been ranked."""
    m = model(
        [
            node("Mul", ["x", "w"], "a", "tiny"),
            node("Mul", ["a", "v"], "c", "scale"),
            node("Mul", ["x", "u"], "e", "side"),
            node("Add", ["c", "e"], "y", "add"),
        ],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
        {k: np.array(v, np.float32) for k, v in {"w": 1e-6, "v": 1e4, "u": 0.05}.items()},
    )
    front, _ = _small(tmp_path, m)
    search = search_mod.Search(front, 10, "nodes", 0, 1)
    k = {g.names[0]: n for n, g in enumerate(search.groups)}
    first = search_mod._ranked_alone(search, [k["scale"], k["side"]], ("y",))
    assert search.rankings[-1].note.endswith("(2 runs)"), search.rankings[-1].note
    again = search_mod._ranked_alone(search, [k["scale"], k["side"]], ("y",))
    assert again == first
    assert search.rankings[-1].note.endswith("(each measured before)"), search.rankings[-1].note
    search_mod._ranked_alone(search, [k["scale"], k["side"], k["add"]], ("y",))
    assert search.rankings[-1].note.endswith("(1 runs, 2 measured before)"), search.rankings[
        -1
    ].note


def test_a_ranking_of_suspects_all_inside_bodies_says_none_was_measured(tmp_path):
    """Where every suspect is inside a control-flow body nothing is run alone: the note said
    "(each measured before)" beside "not measured"; it says 0 runs."""
    from tests.helpers import if_model

    front, _ = _small(tmp_path, if_model())
    search = search_mod.Search(front, 10, "nodes", 0, 1)
    inside = [k for k, g in enumerate(search.groups) if all(front.view.scope[i] for i in g.nodes)]
    assert len(inside) >= 2
    search_mod._ranked_alone(search, inside, tuple(front.view.outputs))
    note = search.rankings[-1].note
    assert "(0 runs)" in note and "inside control-flow bodies, not measured" in note, note
