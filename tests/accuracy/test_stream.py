"""The streaming judge: cut runs compute what one run computes, within the budget's cuts.

Real ONNX Runtime sessions on generated models; a budget small enough to cut
NAFNet into many segments must give the same report, figure for figure, as
one that runs it whole.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest

from tests.conftest import NAFNET_POLICY, PINS
from trtbuild import front
from trtbuild.accuracy import judge as judge_mod
from trtbuild.accuracy import stream
from trtbuild.accuracy.emulate import emulate
from trtbuild.accuracy.reference import float_node_outputs
from trtbuild.cli import main
from trtbuild.graph.model_io import load_model
from trtbuild.graph.view import GraphView
from trtbuild.policy import load_policy
from trtbuild.policy.specs import MemoryBudget, Precision
from trtbuild.precision.assign import assign
from trtbuild.precision.convert import convert
from trtbuild.tuning import tune

KIB = 1 << 10


def _feed(seed: int = 0) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).random((1, 3, 64, 64), np.float32)}


def _whole_run(model, names: list[str], feed) -> dict[str, np.ndarray]:
    """Every named tensor of one ONNX Runtime session over the whole graph (the baseline)."""
    import onnxruntime as ort
    from polygraphy.backend.onnx import modify_outputs

    marked = modify_outputs(model, outputs=names, copy=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(
        marked.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return dict(zip(names, sess.run(names, feed)))


def _plan(model, budget: int) -> stream.Plan:
    view = GraphView(model)
    marked = {t for t, _, _ in float_node_outputs(view)} | set(view.outputs)
    sizes = stream.estimate_sizes(model, _feed())
    return stream.plan_by_budget(model, marked, sizes, MemoryBudget(budget))


def test_a_small_budget_cuts_the_graph_and_every_border_is_kept(nafnet_path):
    model = load_model(nafnet_path)
    plan = _plan(model, 2048 * KIB)
    assert len(plan) > 3
    produced: set[str] = {"input"}
    for k, seg in enumerate(plan.segments):
        assert set(seg.needs) <= produced, f"segment {k} reads a value no earlier segment kept"
        here = {o for i in seg.nodes for o in model.graph.node[i].output}
        produced |= set(seg.keep)
        assert set(seg.marked) <= here
    assert sorted(i for seg in plan.segments for i in seg.nodes) == list(
        range(len(model.graph.node))
    )


def test_a_cut_run_gives_every_tensor_bit_for_bit(nafnet_path):
    model = load_model(nafnet_path)
    view = GraphView(model)
    names = [t for t, _, op in float_node_outputs(view) if op != "Constant"]
    whole = _whole_run(model, names, _feed())  # Polygraphy marks no Constant
    plan = _plan(model, 2048 * KIB)
    cut = {}
    for seg, values in zip(plan.segments, stream.SegmentRunner(model, plan).run(_feed())):
        cut.update({t: values[t] for t in seg.marked})
    assert set(whole) <= set(cut)
    for t in names:
        np.testing.assert_array_equal(cut[t], whole[t], err_msg=t)


def test_a_runner_for_one_feed_lets_each_segments_session_go_once_it_ran(nafnet_path):
    """The walk runs the reference on one feed: every segment's session (its weights in
    ONNX Runtime) held to the walk's end was one more copy of the weights at its peak."""
    import weakref

    model = load_model(nafnet_path)
    plan = _plan(model, 2048 * KIB)
    kept, once = stream.SegmentRunner(model, plan), stream.SegmentRunner(model, plan)
    made, alive = once._session, []

    def watched(k, inputs):
        session = made(k, inputs)
        alive.append(weakref.ref(session))
        return session

    once._session = watched
    for a, b in zip(kept.run(_feed()), once.run(_feed(), once=True)):
        assert a.keys() == b.keys() and all(np.array_equal(a[t], b[t]) for t in a)
        assert [r for r in alive if r() is not None] == []  # gone as its segment is yielded
    assert all(s is not None for s, seg in zip(kept.sessions, plan.segments) if seg.nodes)


def test_an_emulated_candidate_is_cut_where_the_reference_is(nafnet_path):
    model = load_model(nafnet_path)
    mixed = convert(assign(GraphView(model), Precision(default="fp16", guards=()))).model
    emulated = emulate(mixed)
    plan = _plan(model, 2048 * KIB)
    aligned = stream.plan_aligned(emulated, set(plan.segment_of), plan)
    assert len(aligned) == len(plan)
    for tensor, k in plan.segment_of.items():
        assert aligned.segment_of.get(tensor) == k, tensor


def test_a_report_is_the_same_whole_or_cut_into_segments(tmp_path, nafnet_path):
    text = NAFNET_POLICY.format(model=nafnet_path, rules=PINS, backend="none")
    reports = []
    for budget in ("1GiB", "2MiB"):
        policy = tmp_path / f"b{budget}.yaml"
        policy.write_text(text.replace("  samples: 2", f"  samples: 2\n  memory_budget: {budget}"))
        out = tmp_path / budget
        assert main(["build", "--policy", str(policy), "--out", str(out), "--no-cache"]) in (0, 1)
        report = json.loads((out / "report.json").read_text())
        report.pop("policy", None)
        reports.append(report)
    assert reports[0] == reports[1]
    assert reports[0]["baselines"]["fp16"]["first_divergence"] is not None  # something to compare


def test_build_and_tune_are_judged_by_one_function(tmp_path, write_policy, monkeypatch):
    made = []
    real = judge_mod._verdict

    def spy(reference, run, judged, overflow_fails):
        made.append(overflow_fails)
        return real(reference, run, judged, overflow_fails)

    monkeypatch.setattr(judge_mod, "_verdict", spy)
    policy = write_policy()
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "b")]) == 0
    from_build = list(made)
    stages = front.run_front(load_policy(policy))
    tune(stages, budget=2)
    # one rule for a masked overflow, the policy's (`accuracy.masked_overflow: fail`)
    assert from_build and all(from_build)
    assert made[len(from_build) :] and all(made[len(from_build) :])


@pytest.mark.parametrize("budget", [2048 * KIB, 1 << 30])
def test_the_reference_measures_do_not_depend_on_the_cuts(write_policy, budget):
    policy = load_policy(write_policy())
    policy = replace(policy, accuracy=replace(policy.accuracy, memory_budget=budget))
    m = front.run_front(policy, reference="measures").measures
    base = replace(policy, accuracy=replace(policy.accuracy, memory_budget=4 << 30))
    whole = front.run_front(base, reference="measures").measures
    assert m.ranges == whole.ranges and m.internals == whole.internals
    assert m.first_peaks == whole.first_peaks and m.sizes == whole.sizes


def test_a_default_budget_grows_to_the_largest_step_and_a_policys_own_does_not(nafnet_path):
    from trtbuild.errors import UsageError

    model = load_model(nafnet_path)
    view = GraphView(model)
    marked = {t for t, _, _ in float_node_outputs(view)}
    sizes = stream.estimate_sizes(model, _feed())
    grown = stream.plan_by_budget(model, marked, sizes, MemoryBudget(64 * KIB, 1 << 30))
    assert grown.budget > 64 * KIB and len(grown) > 1
    with pytest.raises(UsageError, match="one step may take half the budget of 64 KiB"):
        stream.plan_by_budget(model, marked, sizes, MemoryBudget(64 * KIB))
    with pytest.raises(UsageError, match="half this machine's memory"):
        stream.plan_by_budget(model, marked, sizes, MemoryBudget(64 * KIB, 128 * KIB))


@pytest.mark.parametrize("walk", ["always", "on_failure"])
def test_lean_runs_keep_the_arena_until_the_last_feed(write_policy, monkeypatch, walk):
    """Every lean run of a feed leaves the arena's pages to the next of the same graph and the
    last gives them back; a cut run shrinks after every segment (kept for a whole pass, the
    arena held fragments of every segment's sizes)."""
    text = write_policy(rules="").read_text().replace("samples: 2", "samples: 4")
    stages = front.run_front(load_policy(write_policy(text, name="four.yaml")))
    shrinks = []
    real = stream.run_session

    def spy(session, names, feed, *, shrink=True):
        shrinks.append(shrink)
        return real(session, names, feed, shrink=shrink)

    monkeypatch.setattr(stream, "run_session", spy)
    model, spec = stages.prepared.model, replace(stages.policy.accuracy, walk=walk)
    candidate = judge_mod.Candidate(stages.converted.model)
    (verdict,) = judge_mod.judge_all(stages.reference, model, [candidate], stages.feeds, spec)
    if walk == "always":  # the first feed: the reference and the candidate, one segment
        assert shrinks == [True, True, False, False, True]  # each here; then feeds 2-4
    else:  # four lean runs, then the walk of this failing, overflowing candidate
        assert not verdict.passed and verdict.overflow is not None
        assert shrinks == [False, False, False, True, True, True]


def test_a_candidate_judged_at_several_shapes_opens_one_lean_session(monkeypatch):
    """A policy is judged at min, opt and max: each candidate's whole-graph session takes
    any shape, so it is made once for all of them (the cut runs' sessions are per shape)."""
    from tests.conftest import ROOT
    from trtbuild.evaluation import evaluate_all

    stages = front.run_front(load_policy(ROOT / "policies" / "gfpgan_dynamic.yaml"))
    assert len(stages.shapes) == 3
    opened = []
    real = stream.lean_session
    monkeypatch.setattr(stream, "lean_session", lambda b: opened.append(1) or real(b))
    report = evaluate_all(stages, engines={}, backend="none")
    assert [s.main.passed for s in report.shapes] == [True, True, True]
    assert len(opened) == 2  # the policy and the all-FP16 baseline, once each


def test_an_fp8_value_crosses_a_border_as_fp8():
    """ONNX Runtime hands an FP8 tensor to Python as uint8: a segment reading it from an earlier
    one declared it uint8 and its DequantizeLinear refused it (a ModelOpt FP8 Restormer). It
    crosses as the type its maker's session says, the graph's value_info or not."""
    import ml_dtypes

    from tests.helpers import F, model, node

    m = model(
        [node("Relu", ["x"], "a", "relu"),
         node("QuantizeLinear", ["a", "s", "z"], "q", "quantize"),
         node("DequantizeLinear", ["q", "s", "z"], "d", "dequantize"),
         node("Sigmoid", ["d"], "y", "sigmoid")],
        [("x", F, [64, 64])],
        [("y", F, [64, 64])],
        {"s": np.array(0.05, np.float32), "z": np.zeros((), ml_dtypes.float8_e4m3fn)},
        opset=19,
    )  # fmt: skip
    del m.graph.value_info[:]  # nothing declares q: its session does
    sizes = {t: 64 * 64 * 4 for t in ("x", "a", "d", "y")} | {"q": 64 * 64}
    plan = stream.plan_by_budget(m, {"a", "d", "y"}, sizes, MemoryBudget(64 * KIB))
    assert len(plan) == 4 and "q" in {t for seg in plan.segments for t in seg.needs}
    feed = {"x": np.random.default_rng(0).normal(0, 4, (64, 64)).astype(np.float32)}
    values = {}
    for got in stream.SegmentRunner(m, plan).run(feed):
        values.update(got)
    whole = _whole_run(m, ["y"], feed)
    np.testing.assert_array_equal(values["y"], whole["y"])


def test_an_int4_value_never_crosses_a_border():
    """ONNX Runtime cannot hand an INT4 tensor to Python at all ("No corresponding Numpy
    type"): a cut waits until its last reader has run, told by the Q's zero point where no
    value_info declares it."""
    from tests.helpers import node

    m = _int4_model(
        [node("Relu", ["x"], "a", "relu"),
         node("QuantizeLinear", ["a", "s", "z"], "q", "quantize"),
         node("DequantizeLinear", ["q", "s", "z"], "d", "dequantize"),
         node("Sigmoid", ["d"], "y", "sigmoid")]
    )  # fmt: skip
    sizes = {t: 64 * 64 * 4 for t in ("x", "a", "d", "y")} | {"q": 64 * 64 // 2}
    plan = stream.plan_by_budget(m, {"a", "d", "y"}, sizes, MemoryBudget(64 * KIB, 1 << 30))
    assert "q" not in {t for seg in plan.segments for t in seg.needs} and len(plan) == 3
    assert plan.budget == 2 * (2 + 16 + 16) * KIB  # a default grows to the uncut stretch
    feed = {"x": np.random.default_rng(0).normal(0, 4, (64, 64)).astype(np.float32)}
    values = {}
    for got in stream.SegmentRunner(m, plan).run(feed):
        values.update(got)
    np.testing.assert_array_equal(values["y"], _whole_run(m, ["y"], feed)["y"])


def test_a_sequence_never_crosses_a_border_and_its_stretch_must_fit():
    """ONNX Runtime hands a sequence out as a list, which no segment input can be declared
    from: the run is not cut while it lives. That stretch is held like one step: a default
    budget grows to it, a policy's own too small for it is exit 2 naming the sequence."""
    from tests.helpers import F, model, node
    from trtbuild.errors import UsageError

    m = model(
        [node("Relu", ["x"], "a", "relu"),
         node("Sigmoid", ["x"], "b", "sigmoid"),
         node("SequenceConstruct", ["a", "b"], "seq", "pack"),
         node("Tanh", ["a"], "c", "tanh"),
         node("Neg", ["c"], "c2", "neg"),
         node("Exp", ["c2"], "c3", "exp"),
         node("ConcatFromSequence", ["seq"], "cat", "unpack", axis=0),
         node("Mul", ["cat", "cat"], "y", "square")],
        [("x", F, [64, 64])],
        [("y", F, [128, 64]), ("c3", F, [64, 64])],
    )  # fmt: skip
    sizes = {t: 16 * KIB for t in ("x", "a", "b", "c", "c2", "c3", "seq")}
    sizes |= {"cat": 32 * KIB, "y": 32 * KIB}
    marked = {"a", "b", "c", "c2", "c3", "cat", "y"}
    with pytest.raises(UsageError) as refused:
        stream.plan_by_budget(m, marked, sizes, MemoryBudget(192 * KIB))
    said = str(refused.value)
    assert "seq (a sequence," in said and "from pack until unpack" in said, said
    assert "holds 128 KiB" in said and "at least 384 KiB" in refused.value.hint, said
    stream.plan_by_budget(m, marked, sizes, MemoryBudget(384 * KIB))  # the hint is enough
    plan = stream.plan_by_budget(m, marked, sizes, MemoryBudget(192 * KIB, 1 << 30))
    assert "seq" not in {t for seg in plan.segments for t in seg.needs} and len(plan) > 2
    assert plan.budget == 256 * KIB
    feed = {"x": np.random.default_rng(0).normal(0, 4, (64, 64)).astype(np.float32)}
    values = {}
    for got in stream.SegmentRunner(m, plan).run(feed):
        values.update(got)
    np.testing.assert_array_equal(values["y"], _whole_run(m, ["y"], feed)["y"])


@pytest.mark.parametrize("case", ["op only", "declared sequence", "declared bf16"])
def test_each_way_a_value_is_known_unhanded_holds_the_cut(case):
    """A sequence known by the op that made it (no value_info), one known by its declared
    type alone (an Identity of it), a BF16 value declared so: none crosses a border."""
    from onnx import TensorProto

    from tests.helpers import F, model, node

    if case == "declared bf16":
        made = [node("Cast", ["x"], "v", "store", to=TensorProto.BFLOAT16)]
        read = [node("Cast", ["v"], "w", "load", to=TensorProto.FLOAT)]
    else:
        made = [node("SequenceConstruct", ["x", "x"], "s", "pack")]
        made += [node("Identity", ["s"], "v", "same")] if case == "declared sequence" else []
        read = [node("ConcatFromSequence", ["s" if case == "op only" else "v"], "w", "unpack",
                     axis=0, new_axis=0)]  # fmt: skip
    m = model(
        [*made, node("Relu", ["x"], "a", "relu"), node("Tanh", ["a"], "b", "tanh"), *read,
         node("Sum", ["w", "b", "b"] if case == "declared bf16" else ["w"], "y", "sum")],
        [("x", F, [64, 64])],
        [("y", F, [64 if case == "declared bf16" else 128, 64]), ("b", F, [64, 64])],
    )  # fmt: skip
    if case == "op only":
        del m.graph.value_info[:]
    held = "s" if case == "op only" else "v"
    sizes = {t: 16 * KIB for t in ("x", "s", "v", "a", "b", "w", "y")}
    plan = stream.plan_by_budget(m, {"a", "b", "w", "y"}, sizes, MemoryBudget(64 * KIB, 1 << 30))
    assert held not in {t for seg in plan.segments for t in seg.needs}, case
    assert len(plan) > 1


def test_a_candidate_keeps_an_int4_value_with_its_readers():
    """The conversion clones a Q under a new name (`quantize/trtbuild_fp32`), which the
    reference does not know: aligned, it joined its input's segment and its DQ's cut carried
    an INT4 value (exit 70). It joins its readers' segment instead."""
    from tests.helpers import node

    def build(q: str) -> onnx.ModelProto:
        return _int4_model(
            [node("Relu", ["x"], "a", "relu"), node("Tanh", ["a"], "b", "tanh"),
             node("Sigmoid", ["b"], "c", "sigmoid"),
             node("QuantizeLinear", ["a", "s", "z"], "q", q),
             node("DequantizeLinear", ["q", "s", "z"], "d", "dequantize"),
             node("Add", ["d", "c"], "y", "add")]
        )  # fmt: skip

    sizes = {t: 16 * KIB for t in ("x", "a", "b", "c", "d", "y")} | {"q": 2 * KIB}
    marked = {"a", "b", "c", "d", "y"}
    reference = stream.plan_by_budget(build("quantize"), marked, sizes, MemoryBudget(100 * KIB))
    candidate = build("quantize/trtbuild_fp32")
    plan = stream.plan_aligned(candidate, marked, reference)
    assert "q" not in {t for seg in plan.segments for t in seg.needs}
    feed = {"x": np.random.default_rng(0).normal(0, 4, (64, 64)).astype(np.float32)}
    values = {}
    for got in stream.SegmentRunner(candidate, plan).run(feed):
        values.update(got)
    np.testing.assert_array_equal(values["y"], _whole_run(candidate, ["y"], feed)["y"])


@pytest.mark.parametrize("seed", ["0", "1", "4", "5"])
def test_a_chain_of_unknown_sequence_makers_moves_whole_whatever_the_hash_seed(seed):
    """Two sequence makers the reference does not know, one reading the other's sequence: the
    last moves first, so neither sequence crosses a border (the values were walked in a
    set's order, and under some hash seeds the first was left behind: exit 70)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = """
from tests.helpers import F, model, node
from trtbuild.accuracy import stream
def build(p1, p2):
    return model(
        [node("Relu", ["x"], "a", "relu"), node("SequenceConstruct", ["a"], "s1", p1),
         node("SequenceInsert", ["s1", "a"], "s2", p2), node("Tanh", ["a"], "b", "tanh"),
         node("Sigmoid", ["b"], "c", "sigmoid"),
         node("ConcatFromSequence", ["s2"], "cat", "unpack", axis=0),
         node("Add", ["cat", "c"], "y", "add")],
        [("x", F, [64, 64])], [("y", F, [128, 64])])
marked = {"a", "b", "c", "cat", "y"}
reference = stream.cut(build("pack", "insert"), [0, 0, 0, 1, 2, 2, 2], marked)
candidate = build("pack/clone", "insert/clone")
plan = stream.plan_aligned(candidate, marked, reference)
print(sorted({t for s in plan.segments for t in s.needs} & {"s1", "s2"}))
"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def _int4_model(nodes: list) -> onnx.ModelProto:
    """x [64, 64] -> `nodes` -> y [64, 64], with an INT4 zero point `z` and a scale `s` (no
    value_info: the Q's zero point says its output is INT4)."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.helpers import F

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [64, 64])],
        [helper.make_tensor_value_info("y", F, [64, 64])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
         helper.make_tensor("z", TensorProto.INT4, [], [0])],
    )  # fmt: skip
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    made.ir_version = 10
    return made


def test_segments_and_lean_runs_get_their_large_weights_apart(monkeypatch):
    """A 343 MB transformer's segment sessions took 1.7 to 3 s each, its weights serialized
    into every model's bytes: each session now gets them apart, and computes the same."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    ws = [
        numpy_helper.from_array(rng.standard_normal((64, 64), np.float32), f"w{k}")
        for k in range(4)
    ]
    nodes = [helper.make_node("MatMul", [f"h{k}", f"w{k}"], [f"h{k + 1}"]) for k in range(4)]
    x = helper.make_tensor_value_info("h0", TensorProto.FLOAT, [8, 64])
    y = helper.make_tensor_value_info("h4", TensorProto.FLOAT, [8, 64])
    model = helper.make_model(
        helper.make_graph(nodes, "chain", [x], [y], ws), opset_imports=[helper.make_opsetid("", 17)]
    )
    feed = {"h0": rng.standard_normal((8, 64), np.float32)}
    given = []
    for name in ("plain_session", "lean_session"):
        made = getattr(stream, name)
        monkeypatch.setattr(stream, name, lambda m, made=made: given.append(m) or made(m))
    names = ["h1", "h2", "h3", "h4"]
    sizes = dict.fromkeys([*names, "h0"], 8 * 64 * 4) | {w.name: 64 * 64 * 4 for w in ws}
    plan = stream.plan_by_budget(model, set(names), sizes, MemoryBudget(24 * KIB, 24 * KIB))
    assert len(plan) > 1
    cut = {}
    for seg, values in zip(plan.segments, stream.SegmentRunner(model, plan).run(feed)):
        cut.update({t: values[t] for t in seg.marked})
    lean = stream.LeanRunner(model, ["h4"], {"h2"}).run(feed)
    assert len(given) == len(plan) + 1 and all(len(m.files) >= 1 for m in given)
    assert sum(len(m.files) for m in given[:-1]) == 4 and len(given[-1].files) == 4
    whole = _whole_run(model, names, feed)
    for t in names:
        np.testing.assert_array_equal(cut[t], whole[t], err_msg=t)
    np.testing.assert_array_equal(lean["h4"], whole["h4"])


@pytest.mark.parametrize("segments", [1, 6, (0, 0, 1, 2, 2, 2)])
def test_a_resize_to_sizes_computed_from_an_inputs_shape_runs_in_segments(segments):
    """A dynamo export of a DINOv2 resizes its position embeddings to sizes computed from the
    image's `Shape`: a segment declared its inputs without a rank, and ONNX Runtime's shape
    inference then gave the `Resize` an empty `sizes` and refused the segment ("Number of
    elements of input 'sizes' (0) must be same as rank of input 'X' (4)": `check` exit 2,
    "the FP32 model cannot run", for a model that runs). A graph input is declared as the
    model declares it, a value from an earlier segment with its rank; whole (one segment)
    or cut at every node, the run is the whole graph's; and cut where `sizes` is computed
    in the Resize's own segment from a short vector an earlier one made (SeemoRe's `Concat`
    of its feature map's `Shape` and the `Cast` of the sizes it resizes to, refused at `max`
    under the default memory budget)."""
    from tests.helpers import F, model, node

    m = model(
        [node("Relu", ["x"], "a", "relu"),
         node("Shape", ["a"], "shape", "shape"),
         node("Slice", ["shape", "starts", "ends"], "hw", "slice"),
         node("Concat", ["lead", "hw"], "sizes", "concat", axis=0),
         node("Resize", ["w", "", "", "sizes"], "r", "resize", mode="cubic", antialias=1),
         node("Add", ["r", "a"], "y", "add")],
        [("x", F, [1, 1, "h", "w"])],
        [("y", F, [1, 4, "h", "w"])],
        {"w": np.random.default_rng(0).normal(size=(1, 4, 3, 3)).astype(np.float32),
         "lead": np.array([1, 4], np.int64), "starts": np.array([2], np.int64),
         "ends": np.array([4], np.int64)},
        opset=18,
    )  # fmt: skip
    del m.graph.value_info[:]
    feed = {"x": np.random.default_rng(1).normal(size=(1, 1, 6, 5)).astype(np.float32)}
    if isinstance(segments, tuple):
        assign, segments = list(segments), max(segments) + 1
    else:
        assign = [min(i, segments - 1) for i in range(len(m.graph.node))]
    plan = stream.cut(m, assign, {"a", "r", "y"})
    assert len(plan) == segments
    values = {}
    for got in stream.SegmentRunner(m, plan).run(feed):
        values.update(got)
    np.testing.assert_array_equal(values["y"], _whole_run(m, ["y"], feed)["y"])


def test_sizes_past_a_pad_of_computed_size_follow_channels_and_strides():
    """Past a `Pad` whose size is computed from the input's shape, shape inference tells no
    size; each was guessed at its largest input's, the image's. Real-CUGAN's UpCunet3x grows
    3 channels of 256² to 64 of 804² there: the whole graph was one segment and `check` held
    every tensor at once (2.96 GB under a 256 MiB budget). A convolution's guess follows
    its channels and strides, a `Concat`'s its inputs together."""
    import onnxruntime as ort
    from onnx import helper

    from tests.helpers import F, model, node

    rng = np.random.default_rng(0)
    m = model(
        [node("Shape", ["x"], "s", "shape"),
         node("Slice", ["s", "two", "four"], "hw", "hw"),
         node("Cast", ["hw"], "hwf", "to_float", to=1),
         node("Div", ["hwf", "eight"], "q", "div"),
         node("Ceil", ["q"], "c", "ceil"),
         node("Mul", ["c", "eight"], "full", "mul"),
         node("Sub", ["full", "hwf"], "extra", "sub"),
         node("Cast", ["extra"], "e", "to_int", to=7),
         node("Concat", ["zeros", "e"], "pads", "pads", axis=0),
         node("Pad", ["x", "pads"], "p", "pad", mode="reflect"),
         node("Conv", ["p", "w"], "a", "conv", pads=[1, 1, 1, 1]),
         node("ConvTranspose", ["a", "wt"], "u", "up", strides=[3, 3]),
         node("Concat", ["u", "u"], "y", "cat", axis=1)],
        [("x", F, [1, 3, "h", "w"])],
        [("y", F, [1, 32, "H", "W"])],
        {"two": np.array([2], np.int64), "four": np.array([4], np.int64),
         "eight": np.array(8.0, np.float32), "zeros": np.zeros(6, np.int64),
         "w": rng.normal(size=(16, 3, 3, 3)).astype(np.float32),
         "wt": rng.normal(size=(16, 16, 3, 3)).astype(np.float32)},
    )  # fmt: skip
    feed = {"x": rng.normal(size=(1, 3, 30, 30)).astype(np.float32)}
    sizes = stream.estimate_sizes(m, feed)
    whole = onnx.ModelProto.FromString(m.SerializeToString())
    whole.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in ("p", "a", "u"))
    session = ort.InferenceSession(whole.SerializeToString(), providers=["CPUExecutionProvider"])
    real = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    for t in ("p", "a", "u", "y"):  # within a factor of two of what the run holds
        assert real[t].nbytes / 2 <= sizes[t] <= real[t].nbytes * 2, (t, sizes[t], real[t].nbytes)
