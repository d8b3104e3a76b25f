"""Inputs TensorRT takes for shape tensors (a Resize's sizes, a Reshape's shape, TopK's K):
their values in the engine's optimization profile, from the data the points judged feed;
refused where trtbuild cannot know them. Real TensorRT-RTX builds on the CPU."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import I64, F, model, needs_rtx, node
from trtbuild.cli import main
from trtbuild.errors import UsageError
from trtbuild.graph.shape_inputs import ShapeValues, shape_inputs
from trtbuild.graph.view import GraphView

I32 = onnx.TensorProto.INT32


def _topk_model() -> onnx.ModelProto:
    """TopK of x [1, 100] by a scalar int64 input k (unsqueezed to TopK's [1])."""
    return model(
        [
            node("Unsqueeze", ["k", "ax"], "k1", "unsq"),
            node("TopK", ["x", "k1"], ["v", "i"], "top"),
        ],
        [("x", F, [1, 100]), ("k", I64, [])],
        [("v", F, [1, "k"]), ("i", I64, [1, "k"])],
        {"ax": np.array([0], np.int64)},
    )


def _topk(tmp_path: Path) -> Path:
    onnx.save(_topk_model(), tmp_path / "topk.onnx")
    return tmp_path / "topk.onnx"


def _resize(tmp_path: Path) -> Path:
    """x resized to `sizes`, then reshaped to `shape`: two int64 shape inputs of rank 1."""
    m = model(
        [
            node("Resize", ["x", "", "", "sizes"], "y", "up", mode="linear"),
            node("Reshape", ["y", "shape"], "z", "flat"),
        ],
        [("x", F, [1, 3, "h", "w"]), ("sizes", I64, [4]), ("shape", I64, [2])],
        [("z", F, ["a", "b"])],
    )
    onnx.save(m, tmp_path / "resize.onnx")
    return tmp_path / "resize.onnx"


def _resize_policy(tmp_path: Path, extra: str = "") -> Path:
    """The Resize model with a min/opt/max profile: sizes twice x's H and W at each point,
    min's and max's from their own files, opt's from the inputs' file."""
    rng = np.random.default_rng(0)
    for name, side in (("min", 8), ("opt", 16), ("max", 32)):
        np.savez(
            tmp_path / f"{name}.npz",
            x=rng.random((1, 3, side, side), dtype=np.float32),
            sizes=np.array([1, 3, 2 * side, 2 * side]),
            shape=np.array([3, 4 * side * side]),
        )
    path = tmp_path / "p.yaml"
    path.write_text(
        f"version: 1\nmodel: {_resize(tmp_path)}\n"
        "inputs:\n"
        "  x: {min: [1, 3, 8, 8], opt: [1, 3, 16, 16], max: [1, 3, 32, 32], "
        "data: {file: opt.npz}}\n"
        "  sizes: {shape: [4], data: {file: opt.npz}}\n"
        "  shape: {shape: [2], data: {file: opt.npz}}\n"
        "build: {backend: tensorrt-rtx, variants: false}\n"
        "accuracy:\n"
        "  tolerances: {default: {atol: 1e-2, rtol: 1e-2}}\n"
        "  shapes:\n"
        "    min: {data: {file: min.npz}}\n"
        "    max: {data: {file: max.npz}}\n" + extra
    )
    return path


def _topk_policy(tmp_path: Path, k: str, backend: str = "tensorrt-rtx") -> Path:
    """The TopK model on four samples, each x a permutation of 0..99 (exact in FP16: the
    indices agree)."""
    rng = np.random.default_rng(0)
    x = np.stack([rng.permutation(100)[None] for _ in range(4)]).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    path = tmp_path / "p.yaml"
    path.write_text(
        f"version: 1\nmodel: {_topk(tmp_path)}\n"
        f"inputs:\n  x: {{data: {{file: x.npz}}}}\n  k: {k}\n"
        f"build: {{backend: {backend}, variants: false}}\n"
    )
    return path


def _points(entries: int, *last: int) -> tuple:
    """The values fed at opt, min and max: `sizes` ([1, 3, S, S], `entries` 2) or `shape`
    ([3, S], `entries` 1), S the `last` given for each point."""
    head = (1, 3) if entries == 2 else (3,)
    return tuple((p, ((*head, *[v] * entries),)) for p, v in zip(("opt", "min", "max"), last))


@needs_rtx
def test_a_resize_and_a_reshape_fed_from_files_build_with_each_points_values(tmp_path):
    """The tester's model: `build` was exit 3 ("Optimization profile 0 is missing values for
    shape input tensor sizes"). The profile holds the least and largest values fed at any
    point, and opt's own (which fit x at opt: TensorRT checks the Reshape's volume there)."""
    import trtbuild
    from trtbuild.accuracy.shape_values import engine_values

    policy = _resize_policy(tmp_path)
    front = trtbuild.check(policy, quiet=True).front
    got = engine_values(front.policy, front.view, front.shapes, front.analysis.shape_inputs())
    assert got == (
        ShapeValues(
            "sizes", (1, 3, 16, 16), (1, 3, 32, 32), (1, 3, 64, 64), points=_points(2, 32, 16, 64)
        ),
        ShapeValues("shape", (3, 256), (3, 1024), (3, 4096), points=_points(1, 1024, 256, 4096)),
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    built = json.loads((out / "build.json").read_text())["engines"]["policy"]
    assert built["engine_bytes"] == (out / "engine.plan").stat().st_size > 0


@needs_rtx
def test_build_json_records_the_values_each_shape_input_was_given(tmp_path):
    """`engines.VARIANT.shape_inputs`: the profile's min, opt and max of each input TensorRT
    took for a shape tensor, and the values fed at each point judged, a named one too."""
    rng = np.random.default_rng(1)
    np.savez(
        tmp_path / "mid.npz",
        x=rng.random((1, 3, 12, 12), dtype=np.float32),
        sizes=np.array([1, 3, 24, 24]),
        shape=np.array([3, 576]),
    )
    extra = "    mid: {x: [1, 3, 12, 12], data: {file: mid.npz}}\n"
    policy = _resize_policy(tmp_path, extra)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    got = json.loads((out / "build.json").read_text())["engines"]["policy"]["shape_inputs"]
    assert got == {
        "sizes": {
            "min": [1, 3, 16, 16],
            "opt": [1, 3, 32, 32],
            "max": [1, 3, 64, 64],
            "points": {
                "opt": [[1, 3, 32, 32]],
                "min": [[1, 3, 16, 16]],
                "max": [[1, 3, 64, 64]],
                "mid": [[1, 3, 24, 24]],
            },
        },
        "shape": {
            "min": [3, 256],
            "opt": [3, 1024],
            "max": [3, 4096],
            "points": {
                "opt": [[3, 1024]],
                "min": [[3, 256]],
                "max": [[3, 4096]],
                "mid": [[3, 576]],
            },
        },
    }


@needs_rtx
def test_a_scalar_k_of_topk_builds_with_the_range_its_samples_span(tmp_path, capsys):
    """A static model whose one shape input is a scalar: `build` was exit 3 ("Network has
    dynamic or shape inputs, but no optimization profile has been defined")."""
    import trtbuild
    from trtbuild.accuracy.shape_values import engine_values

    policy = _topk_policy(tmp_path, "{shape: [], data: {low: 1, high: 20}}")
    front = trtbuild.check(policy, quiet=True).front
    fed = [int(f["k"]) for f in front.shapes[0].feeds]
    assert len(set(fed)) > 1  # the samples differ: the profile spans them
    mode = Counter(fed).most_common(1)[0][0]
    got = engine_values(front.policy, front.view, front.shapes, front.analysis.shape_inputs())
    points = (("shape", tuple(dict.fromkeys((k,) for k in fed))),)  # each value once
    assert got == (ShapeValues("k", (min(fed),), (mode,), (max(fed),), points=points),)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0, capsys.readouterr()
    assert (out / "engine.plan").stat().st_size > 0


def test_check_refuses_a_shape_input_the_policy_gives_no_data(tmp_path, capsys):
    """The default range [0, 1) feeds k = 0 alone: an engine for 0. `check` says so before
    the reference runs (exit 2), naming the field, the op and the fixes."""
    policy = _topk_policy(tmp_path, "{shape: []}", backend="none")
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert "inputs.k: the input is a shape tensor to TensorRT" in err
    assert "the K of TopK node top" in err and "no data at shape" in err
    assert "under inputs.k.data" in err and '`passes: {freeze_inputs: {"k": VALUE}}`' in err


def test_check_refuses_values_that_differ_by_point_where_opt_is_not_judged(tmp_path, capsys):
    """opt's values are what TensorRT checks the network at, beside x at opt: with opt
    skipped and the values differing between min and max, trtbuild cannot know them."""
    extra = '    opt: {skip: "never run"}\n'
    text = _resize_policy(tmp_path, extra).read_text().replace("tensorrt-rtx", "none")
    (tmp_path / "p.yaml").write_text(text)
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "inputs.sizes: the input is a shape tensor to TensorRT" in err
    assert "[1, 3, 16, 16] at min, [1, 3, 64, 64] at max" in err
    assert "remove accuracy.shapes.opt.skip" in err


@needs_rtx
def test_the_build_sets_the_values_of_each_input_tensorrt_takes_for_a_shape(tmp_path):
    """In the build's child, after the parse: TensorRT names the shape inputs, each gets its
    values, or its refusal is raised (exit 2) before the engine is built."""
    from trtbuild.engine.child import build_engine
    from trtbuild.policy.specs import BuildSpec

    path, spec = _topk(tmp_path), BuildSpec(workspace=1 << 28)
    k = ShapeValues("k", (1,), (5,), (19,))
    assert build_engine(path, "tensorrt-rtx", spec, shape_values=(k,)).engine
    with pytest.raises(UsageError) as info:
        build_engine(path, "tensorrt-rtx", spec)
    assert info.value.message.startswith("inputs.k: the input is a shape tensor to TensorRT")
    refused = ShapeValues("k", refused=("inputs.k: no values", "p.yaml", "give some"))
    with pytest.raises(UsageError) as info:
        build_engine(path, "tensorrt-rtx", spec, shape_values=(refused,))
    assert (info.value.message, info.value.where, info.value.hint) == refused.refused


def _operand(op: str, data: list, shaped: list, out: list) -> onnx.ModelProto:
    """A model whose int64 input `v` (of `shaped` dims) is the second input of one `op`
    node, the first `d` (of `data` dims); its output of `out` dims."""
    n = node(op, ["d", "v"], ["y"], "n")
    return model([n], [("d", F, data), ("v", I64, shaped)], [("y", F, out)])


def _concat_model() -> onnx.ModelProto:
    nodes = [
        node("Concat", ["v", "six"], "w", "cat", axis=0),
        node("Reshape", ["d", "w"], "y", "r"),
    ]
    ins = [("d", F, [2, 6]), ("v", I64, [1])]
    return model(nodes, ins, [("y", F, ["a", "b"])], {"six": np.array([6], np.int64)})


def _cast_model() -> onnx.ModelProto:
    nodes = [node("Cast", ["v"], "w", "cast", to=I64), node("Reshape", ["d", "w"], "y", "r")]
    return model(nodes, [("d", F, [2, 6]), ("v", I32, [2])], [("y", F, ["a", "b"])])


CASES = {  # each: a model, and the inputs whose values decide a shape there
    "Reshape's shape": (lambda: _operand("Reshape", [2, 6], [2], ["a", "b"]), {"v"}),
    "Expand's shape": (lambda: _operand("Expand", [1, 6], [2], ["a", "b"]), {"v"}),
    "Tile's repeats": (lambda: _operand("Tile", [2, 6], [2], ["a", "b"]), {"v"}),
    "Pad's pads": (lambda: _operand("Pad", [4, 4], [4], ["a", "b"]), {"v"}),
    "TopK's K, unsqueezed": (_topk_model, {"k"}),
    "Reshape's shape, through Concat": (_concat_model, {"v"}),
    "Reshape's shape, through Cast": (_cast_model, {"v"}),
    "Gather's indices": (lambda: _operand("Gather", [8, 3], [2], [2, 3]), set()),
    "Trilu's k": (lambda: _operand("Trilu", [4, 4], [], [4, 4]), set()),
}


@needs_rtx
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_graph_finds_the_shape_inputs_tensorrts_parser_finds(case):
    """`check` runs no TensorRT: the graph's finding must be the parser's own."""
    import tensorrt_rtx as trt

    m, expected = CASES[case][0](), CASES[case][1]
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(m.SerializeToString()), parser.get_error(0)
    said = {
        network.get_input(i).name
        for i in range(network.num_inputs)
        if network.get_input(i).is_shape_tensor
    }
    assert said == expected
    assert set(shape_inputs(GraphView(m))) == expected


def _gathered_model(declared: list) -> onnx.ModelProto:
    """v's first entry, unsqueezed and concatenated with 6, is the Reshape's shape: the
    operand's length is 2 whatever v's is."""
    nodes = [
        node("Gather", ["v", "zero"], "g", "first", axis=0),
        node("Unsqueeze", ["g", "ax"], "u", "unsq"),
        node("Concat", ["u", "six"], "w", "cat", axis=0),
        node("Reshape", ["d", "w"], "y", "r"),
    ]
    inits = {"zero": np.array(0), "ax": np.array([0]), "six": np.array([6])}
    return model(nodes, [("d", F, [2, 6]), ("v", I64, declared)], [("y", F, ["a", "b"])], inits)


def _concat_of(declared: list, op: str) -> onnx.ModelProto:
    """v concatenated with one more entry, the second input of `op` on d [2, 6]."""
    nodes = [node("Concat", ["v", "one"], "w", "cat", axis=0), node(op, ["d", "w"], "y", "n")]
    ins = [("d", F, [2, 6]), ("v", I64, declared)]
    return model(nodes, ins, [("y", F, ["a", "b"])], {"one": np.array([1], np.int64)})


def _split(declared: list) -> onnx.ModelProto:
    n = node("Split", ["d", "v"], ["y", "z"], "n", axis=1)
    outs = [("y", F, [2, "a"]), ("z", F, [2, "b"])]
    return model([n], [("d", F, [2, 6]), ("v", I64, declared)], outs)


def _resize_of(declared: list) -> onnx.ModelProto:
    n = node("Resize", ["d", "", "", "v"], "y", "n", mode="nearest")
    return model([n], [("d", F, [1, 3, 4, 4]), ("v", I64, declared)], [("y", F, ["a"] * 4)])


def _topk_of(declared: list) -> onnx.ModelProto:
    n = node("TopK", ["d", "v"], ["y", "i"], "n")
    outs = [("y", F, [1, "k"]), ("i", I64, [1, "k"])]
    return model([n], [("d", F, [1, 100]), ("v", I64, declared)], outs)


# Each: a model of a shape input v (its dims as the argument), the values fed, and whether
# TensorRT-RTX 1.7 builds it where v's length is dynamic (["n"]). Measured: Reshape, Expand,
# Resize, Pad, ConstantOfShape, Slice, OneHot are refused by the parser, CumSum and Range
# fail the build, TopK kills it (SIGSEGV).
LENGTHS = {
    "Reshape's shape": (lambda d: _operand("Reshape", [2, 6], d, ["a", "b"]), [3, 4], False),
    "Resize's sizes": (_resize_of, [1, 3, 8, 8], False),
    "TopK's K (SIGSEGV)": (_topk_of, [5], False),
    "Reshape's shape, through Concat": (lambda d: _concat_of(d, "Reshape"), [12], False),
    "Tile's repeats": (lambda d: _operand("Tile", [2, 6], d, ["a", "b"]), [2, 1], True),
    "Tile's repeats, through Concat": (lambda d: _concat_of(d, "Tile"), [2], True),
    "Split's split": (_split, [2, 4], True),
    "Reshape's shape, through Gather of one entry": (_gathered_model, [2, 7], True),
}


@needs_rtx
@pytest.mark.parametrize("case", sorted(LENGTHS))
def test_the_graph_refuses_a_dynamic_length_where_tensorrt_fails_on_it(case, tmp_path):
    """TensorRT-RTX built for the values fed, v's length in the profile: where it fails,
    `unfixed_lengths` names v (check refuses it); with v's length fixed in the model, each
    builds."""
    from trtbuild.engine.child import build_engine
    from trtbuild.errors import BackendError
    from trtbuild.graph.shape_inputs import unfixed_lengths
    from trtbuild.policy.specs import BuildSpec, InputSpec

    make, values, builds = LENGTHS[case]
    spec, k = BuildSpec(workspace=1 << 28), ShapeValues("v", *[tuple(values)] * 3)
    fixed = [] if builds else [([len(values)], True)]  # the fix the refusal names
    for declared, expected in [(["n"], builds), *fixed]:
        m = make(declared)
        onnx.save(m, tmp_path / "m.onnx")
        shaped = (InputSpec("v", shape=(len(values),)),)
        try:
            built = bool(build_engine(tmp_path / "m.onnx", "tensorrt-rtx", spec, shaped, (k,)))
        except BackendError:
            built = False
        assert built == expected, (declared, built)
        assert ("v" not in unfixed_lengths(GraphView(m))) == built


def _dynamic_reshape_policy(tmp_path: Path, shape_yaml: str, passes: str = "") -> Path:
    """x [2, 6] reshaped by `shape`, which the model declares [n]; its data [3, 4]."""
    m = _operand("Reshape", [2, 6], ["n"], ["a", "b"])
    m.graph.input[0].name, m.graph.input[1].name = "x", "shape"
    m.graph.node[0].input[:] = ["x", "shape"]
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.arange(12, dtype=np.float32).reshape(2, 6), shape=[3, 4])
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nmodel: m.onnx\n"
        f"inputs:\n  x: {{data: {{file: d.npz}}}}\n  shape: {shape_yaml}\n{passes}"
        "build: {backend: tensorrt-rtx, variants: false}\n"
    )
    return path


@needs_rtx
def test_a_shape_input_of_dynamic_length_is_refused_by_check_and_builds_once_fixed(
    tmp_path, capsys
):
    """`check` passed and `build` was exit 3, TensorRT-RTX's parser saying the Reshape
    was an invalid node ("check the op is supported"), a `shape: [2]` in the policy or
    not. Now both are exit 2 naming the input and the override that builds."""
    policy = _dynamic_reshape_policy(tmp_path, "{shape: [2], data: {file: d.npz}}")
    out = tmp_path / "out"
    for args in (["check"], ["build", "--out", str(out)]):
        assert main([*args, "--policy", str(policy)]) == 2
        err = capsys.readouterr().err
        assert f"{policy}:5: inputs.shape: the input is a shape tensor to TensorRT" in err
        assert "the shape of Reshape node n), and the model leaves its length dynamic" in err
        assert '`passes: {override_input_shapes: {"shape": [2]}}`' in err
        assert "Traceback" not in err
    assert not out.exists()  # refused before any engine work
    fixed = "passes: {override_input_shapes: {shape: [2]}}\n"
    policy = _dynamic_reshape_policy(tmp_path, "{data: {file: d.npz}}", fixed)
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0, capsys.readouterr()
    assert (out / "engine.plan").stat().st_size > 0


def test_the_refusal_of_a_dynamic_length_says_one_length_for_a_profile_of_several(tmp_path, capsys):
    """min [1], max [3] for the input itself: one length to fix, which the policy must give
    at every point."""
    policy = _dynamic_reshape_policy(tmp_path, "{min: [1], opt: [2], max: [3]}")
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert '{override_input_shapes: {"shape": [LENGTH]}}`, LENGTH the number of values' in err
    assert "and give inputs.shape that one length (shape: [LENGTH])" in err


def test_only_the_input_whose_length_is_dynamic_is_named():
    """v [2] and u [n] make one Reshape's shape, of a length the graph leaves dynamic: u is
    what to fix, not v."""
    from trtbuild.graph.shape_inputs import unfixed_lengths

    nodes = [node("Concat", ["v", "u"], "w", "cat", axis=0), node("Reshape", ["d", "w"], "y", "r")]
    ins = [("d", F, [2, 6]), ("v", I64, [2]), ("u", I64, ["n"])]
    m = model(nodes, ins, [("y", F, ["a", "b", "c"])])
    assert unfixed_lengths(GraphView(m)) == {"u": "its values decide the shape of Reshape node r"}
