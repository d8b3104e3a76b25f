"""The front half: what `run_front` draws and runs, as its callers ask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import F, bare_policy, identity_policy, if_on_sign, model, node
from trtbuild.cli import main
from trtbuild.front import run_front
from trtbuild.policy import load_policy


def test_convert_draws_no_feeds_but_says_where_data_comes_from(tmp_path):
    """`convert` runs nothing (`draw=False`): no samples drawn, the sources still said."""
    policy = load_policy(identity_policy(tmp_path, [1, 4], "{shape: [1, 4]}"))
    drawn = run_front(policy, reference="none")
    bare = run_front(policy, reference="none", draw=False)
    assert len(drawn.feeds) == policy.accuracy.samples and bare.feeds == []
    assert bare.shapes[0].data == drawn.shapes[0].data
    assert bare.converted.model == drawn.converted.model
    with pytest.raises(ValueError, match="draw=False"):
        run_front(policy, reference="tensors", draw=False)


def _check(tmp_path, m) -> int:
    """`trtbuild check` on `m`, under a policy of no rules."""
    return main(["check", "--policy", str(bare_policy(tmp_path, m))])


def test_onnx_runtimes_own_ops_are_exit_2_before_any_work(tmp_path, capsys):
    """A com.microsoft op (what onnxruntime.transformers.optimizer fuses a BERT's
    LayerNorms and GELUs into, inside an If's branch here): ONNX Runtime runs it, so
    `check` passed and the policy's patterns no longer saw the LayerNorms; TensorRT's parser
    refused it only at the build. Now exit 2 names the ops and the fix, before the
    reference runs."""
    ms = "com.microsoft"
    fused = helper.make_graph(
        [
            node("BiasGelu", ["x", "b"], "g", "fused_gelu", domain=ms),
            node("Gelu", ["g"], "g2", "gelu", domain=ms),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("g2", F, [1, 4])],
    )
    other = helper.make_graph(
        [node("Neg", ["x"], "n", "neg")],
        "else",
        [],
        [helper.make_tensor_value_info("n", F, [1, 4])],
    )
    bias = {"b": np.zeros(4, np.float32)}  # BiasGelu's, read from outside the branch
    assert _check(tmp_path, if_on_sign(fused, other, [1, 4], bias, {ms: 1})) == 2
    err = capsys.readouterr().err
    # its Gelu, an ONNX op's name, TensorRT's parser imports as ONNX's: not counted
    assert "1 node(s) of ONNX Runtime's own ops (com.microsoft::BiasGelu; the first:" in err
    assert "before onnxruntime.transformers.optimizer" in err and "measured at" not in err


def test_an_op_onnx_runtime_does_not_have_says_so(tmp_path, capsys):
    """A TensorRT plugin node (`trt.plugins`): the FP32 reference cannot run in ONNX Runtime
    whatever the shape, and the message says why and what to give instead (it said to
    choose input shapes)."""
    m = model(
        [
            node("Relu", ["x"], "r", "relu"),
            node("CustomGeluPlugin", ["r"], "y", "plug", domain="trt.plugins"),
        ],
        [("x", F, [1, 8])],
        [("y", F, [1, 8])],
        domains={"trt.plugins": 1},
    )
    assert _check(tmp_path, m) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'm.onnx'}: ONNX Runtime has no op trt.plugins:CustomGeluPlugin" in err
    assert "before its nodes were replaced by plugin or custom ops" in err
    assert "choose input shapes" not in err


def test_a_model_without_outputs_is_exit_2_from_check_on(tmp_path, capsys):
    """A graph with nodes and no `graph.output`: `check` passed it and `build` was ONNX
    Runtime's refusal of the session ("OrtValue indexes should have been populated"), a
    traceback (exit 70)."""
    graph = helper.make_graph(
        [node("Mul", ["x", "k"], "y", "scale")],
        "g",
        [helper.make_tensor_value_info("x", F, [1, 4])],
        [],
        [onnx.numpy_helper.from_array(np.array(2, np.float32), "k")],
    )
    policy = bare_policy(
        tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    for command in (["check"], ["build", "--out", str(tmp_path / "out")]):
        assert main([command[0], "--policy", str(policy), *command[1:]]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / 'm.onnx'}: the model has no graph outputs" in err, err
        assert err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_an_input_no_engine_binds_is_exit_2_naming_it(tmp_path, capsys):
    """A string input (a text normalizer's words), a sequence and an optional input: drawing
    data for them ended in a traceback (Polygraphy's data loader has no such buffers, exit
    70); a string output (a classifier's labels) where it was compared. A TensorRT engine
    binds tensors of numbers only, so exit 2 names the input or output and the fix."""
    words = model(
        [node("StringNormalizer", ["x"], "y", "lower", case_change_action="LOWER")],
        [("x", onnx.TensorProto.STRING, [1, 3])],
        [("y", onnx.TensorProto.STRING, [1, 3])],
        opset=17,
    )
    listed = helper.make_model(
        helper.make_graph(
            [node("SequenceAt", ["s", "i"], "y", "at")],
            "g",
            [
                helper.make_tensor_sequence_value_info("s", F, [2]),
                helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            ],
            [helper.make_tensor_value_info("y", F, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    maybe = helper.make_model(
        helper.make_graph(
            [node("OptionalHasElement", ["o"], "y", "has")],
            "g",
            [helper.make_value_info("o", helper.make_optional_type_proto(
                helper.make_tensor_type_proto(F, [2])))],
            [helper.make_tensor_value_info("y", onnx.TensorProto.BOOL, [])],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
    )  # fmt: skip
    named = model(  # a classifier's label strings as its output
        [
            node("ArgMax", ["x"], "i", "best", axis=1, keepdims=0),
            node("Gather", ["labels", "i"], "y", "label", axis=0),
        ],
        [("x", F, [1, 3])],
        [("y", onnx.TensorProto.STRING, [1])],
        {"labels": np.array(["cat", "dog", "owl"], dtype=object)},
    )
    packed = helper.make_model(
        helper.make_graph(
            [node("SequenceConstruct", ["x", "x"], "s", "pack")],
            "g",
            [helper.make_tensor_value_info("x", F, [2])],
            [helper.make_tensor_sequence_value_info("s", F, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    cases = (
        (words, "input 'x' is a string tensor", "tokenize, decode or split them"),
        (packed, "output 's' is a sequence", "tensors of numbers (stack them)"),
        (listed, "input 's' is a sequence", "tokenize, decode or split them"),
        (maybe, "input 'o' is an optional", "tokenize, decode or split them"),
        (named, "output 'y' is a string tensor", "map indices to labels after it"),
    )
    for m, said, fix in cases:
        assert _check(tmp_path, m) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / 'm.onnx'}: the model's {said}: a TensorRT engine binds" in err
        assert "Traceback" not in err and fix in err


def test_a_bf16_input_or_output_is_exit_2_naming_it(tmp_path, capsys):
    """A model exported in BF16 keeps its BF16 inputs and outputs through `prepare`, and
    ONNX Runtime's Python API takes and hands out no BF16 array: drawing its data (the
    data loader) and reading its output ended in a traceback (exit 70). `convert`, which
    draws and reads nothing, writes its mixed model as before."""
    bf16 = onnx.TensorProto.BFLOAT16
    fed = model(
        [node("Cast", ["x"], "f", "load", to=F), node("Relu", ["f"], "y", "relu")],
        [("x", bf16, [4, 8])],
        [("y", F, [4, 8])],
    )
    made = model(
        [node("Relu", ["x"], "r", "relu"), node("Cast", ["r"], "y", "store", to=bf16)],
        [("x", F, [4, 8])],
        [("y", bf16, [4, 8])],
    )
    for m, said in ((fed, "input 'x' is BFLOAT16"), (made, "output 'y' is BFLOAT16")):
        assert _check(tmp_path, m) == 2
        err = capsys.readouterr().err
        assert f"the model's {said}: trtbuild judges through ONNX Runtime's Python" in err
        assert "Traceback" not in err and "FP32 (or FP16) inputs and outputs, cast to" in err
        policy = str(bare_policy(tmp_path, m))  # `convert` judges nothing: its model is written
        assert main(["convert", "--policy", policy, "-o", str(tmp_path / "mixed.onnx")]) == 0


def test_an_op_older_than_onnx_runtime_runs_says_to_upgrade_the_opset(tmp_path, capsys):
    """A model of opset 6 (the ONNX backend tests' PyTorch conversions): ONNX Runtime has no
    kernel for its Add(6) whatever the shape, and the message said to choose input shapes.
    It says the fix, and with `passes: {opset: 17}` the same model is checked. At opset 17
    an op ONNX Runtime has no kernel for of its types (a GlobalAveragePool of doubles) is
    said as that, not as a shape to choose nor an opset to upgrade."""
    m = model(
        [node("Add", ["x", "x"], "y", "twice")], [("x", F, [1, 4])], [("y", F, [1, 4])], opset=6
    )
    assert _check(tmp_path, m) == 2
    err = capsys.readouterr().err
    said = "ONNX Runtime has no kernel for Add as opset 6 defines it (it runs opset 7 and later)"
    assert said + ": the model is of opset 6" in err
    assert "`passes: {opset: 17}`" in err and "choose input shapes" not in err
    policy = tmp_path / "p.yaml"
    policy.write_text(policy.read_text() + "passes: {opset: 17}\n")
    assert main(["check", "--policy", str(policy)]) == 0
    capsys.readouterr()
    double = onnx.TensorProto.DOUBLE  # no kernel for GlobalAveragePool(1) of doubles: not the
    recent = model(  # opset's fault at opset 17, whatever the version ONNX Runtime names
        [node("GlobalAveragePool", ["x"], "y", "pool")],
        [("x", double, [1, 2, 4, 4])],
        [("y", double, [1, 2, 1, 1])],
    )
    assert _check(tmp_path, recent) == 2
    err = capsys.readouterr().err
    said = "ONNX Runtime has no kernel for GlobalAveragePool(1) of the types node 'pool' reads"
    assert said in err and "compute that node in float32" in err
    assert "passes: {opset" not in err and "choose input shapes" not in err


def test_onnx_ml_ops_are_exit_2_before_any_work(tmp_path, capsys):
    """A network followed by scikit-learn's kind of ops (`ai.onnx.ml`, as skl2onnx writes):
    ONNX Runtime runs them, so `check` passed, and TensorRT's parser refused them at the
    build ("Plugin not found", exit 3 after the reference and the judge)."""
    ml = "ai.onnx.ml"
    m = model(
        [
            node("Relu", ["x"], "r", "relu"),
            node("LinearRegressor", ["r"], "y", "lin", domain=ml, coefficients=[0.5, -1, 2, 1]),
            node("Normalizer", ["r"], "z", "norm", domain=ml, norm="L2"),
        ],
        [("x", F, [2, 4])],
        [("y", F, [2, 1]), ("z", F, [2, 4])],
        domains={ml: 3},
    )
    assert _check(tmp_path, m) == 2
    err = capsys.readouterr().err
    said = "2 node(s) of ONNX-ML's classic ML ops (ai.onnx.ml::LinearRegressor, "
    assert said + "ai.onnx.ml::Normalizer; the first: lin), which TensorRT does not run" in err
    assert "run the ai.onnx.ml part in ONNX Runtime" in err


def test_random_draws_are_exit_2_before_any_work(tmp_path, capsys):
    """StyleGAN2's noise injection as torch exports `randn_like` (GFPGAN's
    randomize_noise=True): `check` passed, `convert` ended in exit 70 (the node's `dtype`
    FLOAT under an FP16 output), and with the draw pinned every verdict failed as if FP16
    had (`tune` pinned every node). No reference judges a draw: exit 2 naming it."""
    m = model(
        [node("RandomNormalLike", ["x"], "n", "noise", dtype=F, seed=1.0),
         node("Mul", ["n", "w"], "s", "scale"), node("Add", ["x", "s"], "y", "inject")],
        [("x", F, [1, 4])], [("y", F, [1, 4])], {"w": np.array(0.1, np.float32)},
    )  # fmt: skip
    assert _check(tmp_path, m) == 2
    err = capsys.readouterr().err
    said = "1 node(s) of random numbers drawn in the graph (RandomNormalLike; the first: noise)"
    assert said in err and "randomize_noise=False" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "keys, reads",
    [
        ("{max_abs_above: 1}", True),  # a range alone reads the reference
        ("{max_abs_above: 1, op: Identity}", True),
        ("{max_abs_above: 1, op: Conv}", False),  # nothing left for the range to judge
        ("{max_abs_above: 1, reduction_depth_above: 1000}", False),
        ("{max_abs_above: 1, initializer_abs_above: 1e6}", False),
    ],
)
def test_convert_runs_the_reference_where_a_range_rule_has_a_node_to_judge(tmp_path, keys, reads):
    """`convert` runs no reference unless a range rule's other keys leave it a node; a rule
    they leave empty is no error either (its range key is never asked: exit 0, not 2)."""
    rule = f"precision: {{rules: [{{id: r, match: {keys}, precision: fp32}}]}}\n"
    policy = identity_policy(tmp_path, [1, 4], "{shape: [1, 4]}", rule)
    front = run_front(load_policy(policy), reference="none", draw=False)
    assert (front.measures is not None) is reads
    out = tmp_path / "m16.onnx"
    assert main(["convert", "--policy", str(policy), "-o", str(out), "--no-cache"]) == 0


def test_a_node_onnx_runtime_cannot_make_a_kernel_of_is_the_models_not_the_shapes(tmp_path, capsys):
    """A `Transpose` with a negative `perm` (torch.onnx's TorchScript export of Mamba2):
    ONNX Runtime refuses it at the session's start, whatever the shapes; the message had
    said to choose input shapes."""
    nodes = [node("Exp", ["x"], "e", "exp"), node("Transpose", ["e"], "y", "bad", perm=[0, -1, 1])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4, 5])],
        [helper.make_tensor_value_info("y", F, ["p", "q", "r"])],
    )  # fmt: skip
    assert _check(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "ONNX Runtime cannot load the model: " in err, err
    assert "TransposeBase" in err or "Invalid attribute perm {0, -1, 1}" in err, err
    assert "re-export the model" in err and "choose input shapes" not in err, err


@pytest.mark.parametrize(
    ("tolerances", "said"),
    [
        (
            "outputs: {restord: {atol: 1e-9}}",
            "accuracy.tolerances.outputs.restord: the model has no output 'restord' "
            "(its outputs: restored, total)",
        ),
        (
            "outputs: {restored: {compare: indices}}",
            "accuracy.tolerances.outputs.restored: compare: indices on the float output "
            "'restored' compares its values as indices",
        ),
        (
            "default: {compare: indices}",
            "accuracy.tolerances.default: compare: indices on the float output 'restored'",
        ),
        (
            "outputs: {restored: {compare: indices, top_k: 1, top_k_axis: 4}}",
            "accuracy.tolerances.outputs.restored: top_k_axis 4 is not an axis of the output "
            "'restored' (rank 4)",
        ),
        ("outputs: {restored: {top_k_axis: 1}}", "top_k_axis is read only with top_k"),
    ],
)
def test_a_tolerance_the_model_cannot_read_is_exit_2(example_policy, capsys, tolerances, said):
    """A misspelt output's tolerance was never read (the output judged by the default one,
    unsaid); `compare: indices` compared a float output's values for equality."""
    policy = example_policy("nafnet")
    text = policy.read_text().replace("  tolerances:\n", f"  tolerances:\n    {tolerances}\n", 1)
    if tolerances.startswith("default"):  # the example's own default after it: one kept
        text = text.replace("    default: {atol: 1e-2, rtol: 1e-2, check_error_stat: median}\n", "")
    policy.write_text(text)
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    line = text.splitlines().index(f"    {tolerances}") + 1  # found after loading, or by it
    assert f"{policy.resolve()}:{line}: accuracy.tolerances." in err, err


@pytest.mark.parametrize(
    ("tolerances", "said"),
    [
        (
            "outputs: {total: {compare: indices, top_k: 1}}",
            "accuracy.tolerances.outputs.total: top_k ranks the output 'total' along an axis, "
            "and it is a scalar (rank 0)",
        ),
        (
            "default: {compare: indices, top_k: 2}",
            "accuracy.tolerances.default: top_k ranks the output 'total' along an axis",
        ),
        (
            "outputs: {mask: {compare: indices, top_k: 3}}",
            "accuracy.tolerances.outputs.mask: top_k ranks the boolean output 'mask', whose "
            "values tie everywhere",
        ),
    ],
)
def test_top_k_on_a_scalar_or_boolean_output_is_exit_2(tmp_path, capsys, tolerances, said):
    """The axis check skipped a rank-0 output (its rank, 0, read as unknown) and Polygraphy's
    top k negates its input: a scalar's top k and a boolean output's were tracebacks where
    the outputs were compared (exit 70 from build, after the reference had run)."""
    m = model(
        [
            node("ReduceSum", ["x"], "total", "sum", keepdims=0),
            node("Greater", ["x", "t"], "mask", "gt"),
        ],
        [("x", F, [2, 8])],
        [("total", F, []), ("mask", TensorProto.BOOL, [2, 8])],
        {"t": np.array(0.5, np.float32)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nbuild: {backend: none}\naccuracy:\n"
        f"  tolerances:\n    {tolerances}\n"
    )
    for command in ("check", "build"):
        args = [command, "--policy", str(policy)] + (
            ["--out", str(tmp_path / "o")] if command == "build" else []
        )
        assert main(args) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
        assert f"{policy.resolve()}:6: accuracy.tolerances." in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("tolerance", "said"),
    [
        ("{cls: {compare: indices, index_tolerance: 1}}", "index_tolerance 1 leaves nothing of "
         "the output 'cls' to compare (rows of 1 (its last axis))"),
        ("{scores: {compare: indices, top_k: 3, index_tolerance: 3}}", "index_tolerance 3 "
         "leaves nothing of the output 'scores' to compare (its top 3)"),
    ],
)  # fmt: skip
def test_an_index_tolerance_that_compares_nothing_is_exit_2(tmp_path, capsys, tolerance, said):
    """Polygraphy's `IndicesCompareFunc` leaves the last `index_tolerance` values of each
    row out: on an ArgMax's `[1, 1]` class, `index_tolerance: 1` compared nothing and passed
    where FP16 chose class 10 and FP32 class 15 (a false PASS)."""
    m = model(
        [node("Mul", ["x", "k"], "scores", "scale"),
         node("ArgMax", ["scores"], "cls", "argmax", axis=1, keepdims=1)],
        [("x", F, [1, 16])],
        [("scores", F, [1, 16]), ("cls", onnx.TensorProto.INT64, [1, 1])],
        {"k": np.array(1000, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.linspace(0.1, 100, 16, dtype=np.float32)[None, None])
    policy = tmp_path / "p.yaml"
    text = "version: 1\nmodel: m.onnx\nbuild: {backend: none}\n"
    text += "inputs:\n  x: {shape: [1, 16], data: {file: d.npz}}\n"
    text += "accuracy:\n  samples: 1\n  masked_overflow: warn\n"
    policy.write_text(text + f"  tolerances:\n    outputs: {tolerance}\n")
    out = tmp_path / "out"
    for args in (["check"], ["build", "--out", str(out)]):
        assert main([args[0], "--policy", str(policy), *args[1:]]) == 2
        err = capsys.readouterr().err
        assert f"{policy.resolve()}:10: accuracy.tolerances.outputs." in err and said in err, err
    if "cls" in tolerance:  # one less compares the class, and FP16's is not FP32's
        policy.write_text(text + "  tolerances:\n    outputs: {cls: {compare: indices}}\n")
        assert main(["build", "--policy", str(policy), "--out", str(out)]) == 1


def test_top_k_along_an_axis_of_one_is_exit_2(tmp_path, capsys):
    """A one-channel map judged as the docs judge a segmentation's logits, `{compare:
    indices, top_k: 1, top_k_axis: 1}`: its top index along a channel axis of length 1 is 0
    on both sides, so FP16's `(x + 2048) - 2048`, off by a whole range, passed."""
    m = model(
        [node("Add", ["x", "c"], "y", "shift"), node("Sub", ["y", "c"], "mask", "back")],
        [("x", F, [1, 1, 8, 8])],
        [("mask", F, [1, 1, 8, 8])],
        {"c": np.array(2048, np.float32)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    text = "version: 1\nmodel: m.onnx\nbuild: {backend: none}\naccuracy:\n  tolerances:\n"
    policy.write_text(text + "    outputs: {mask: {compare: indices, top_k: 1, top_k_axis: 1}}\n")
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert (
        f"{policy.resolve()}:6: accuracy.tolerances.outputs.mask: top_k ranks the output "
        "'mask' along axis 1, of length 1" in err
    ), err
    policy.write_text(text + "    outputs: {mask: {psnr_threshold: 30}}\n")  # by its values
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "out")]) == 1


def test_a_model_replaced_while_it_is_read_is_prepared_from_the_bytes_its_key_names(
    tmp_path, monkeypatch
):
    """The cache key hashed the file, then the load read it again: a model replaced between
    the two (an export rewriting it during a nightly) stored its prepared graph under the
    other's key, and every later run of that model judged the wrong one. Both now come
    from one read."""
    from trtbuild import front
    from trtbuild.api import open_cache

    def scaled(k: float) -> onnx.ModelProto:
        return model([node("Mul", ["x", "k"], "y", "scale")], [("x", F, [1, 4])],
                     [("y", F, [1, 4])], {"k": np.array(k, np.float32)})  # fmt: skip

    path = tmp_path / "m.onnx"
    onnx.save(scaled(2.0), path)
    read = front.read_model

    def replaced_after_reading(p):
        raw = read(p)
        onnx.save(scaled(3.0), path)  # another process replaces it now
        return raw

    monkeypatch.setattr(front, "read_model", replaced_after_reading)
    policy = load_policy(bare_policy(tmp_path, onnx.load(path)))
    prepared, _ = front.prepared_graph(policy.model, policy.passes, open_cache(tmp_path / "c"))
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in prepared.model.graph.initializer}
    assert float(weights["k"]) == 2.0  # the bytes the key was made of


def test_a_shared_named_dim_given_two_sizes_is_refused_where_onnx_runtime_broadcasts(
    tmp_path, capsys, monkeypatch
):
    """A TrOCR's `pixel_values` and `decoder_input_ids` share the batch `b`: judged at an
    image batch of 2 and a token batch of 1, ONNX Runtime broadcast the one token row over
    both images and the point PASSED. TensorRT's parser names both dims `b` and holds them
    to one size (no engine runs that point), so it is exit 2 before anything runs, naming
    both inputs and the line of the field; a distinct name for each passes."""
    m = model(
        [node("Add", ["x", "t"], "y", "add")], [("x", F, ["b", 4]), ("t", F, ["b", 4])],
        [("y", F, ["b", 4])],
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    Path("p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        "  x: {min: [1, 4], opt: [1, 4], max: [2, 4]}\n"
        "  t:\n    min: [1, 4]\n    opt: [1, 4]\n    max: [1, 4]\n"
    )
    assert main(["check", "--policy", "p.yaml"]) == 2
    err = capsys.readouterr().err
    assert "p.yaml:8: no engine runs max {x: [2, 4], t: [1, 4]}: x (dim 0) and t (dim 0) " in err
    assert "share the model's dim 'b', given 2 and 1" in err and "Traceback" not in err, err
    Path("p.yaml").write_text(
        Path("p.yaml").read_text() + "passes: {override_input_shapes: {t: [c, 4]}}\n"
    )
    assert main(["check", "--policy", "p.yaml"]) == 0


def test_inputs_sharing_a_named_dim_given_two_sizes_are_named(tmp_path, capsys, monkeypatch):
    """A BERT's `input_ids` and `attention_mask` are both `[b, s]`: a profile whose `opt`
    gave them two sequence lengths was exit 2 with ONNX Runtime's broadcasting message from
    inside the graph and the policy's whole path. It names both inputs, the dim and the
    field's line; a shape the model cannot take names the line of `inputs` too."""
    dims = ["b", "s"]
    m = model(
        [node("Add", ["ids", "mask"], "y", "add")], [("ids", F, dims), ("mask", F, dims)],
        [("y", F, dims)],
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    profile = "{{min: [1, 2], opt: [2, {s}], max: [2, 8]}}"
    Path("p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        f"  ids: {profile.format(s=4)}\n  mask: {profile.format(s=3)}\n"
    )
    assert main(["check", "--policy", "p.yaml"]) == 2
    err = capsys.readouterr().err
    assert "p.yaml:5: no engine runs opt {ids: [2, 4], mask: [2, 3]}: " in err
    assert "ids (dim 1) and mask (dim 1) share the model's dim 's', given 4 and 3" in err
    assert "Attempting to broadcast" not in err
    Path("p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  ids: {shape: [2, 4]}\n  mask: {shape: [2, 3]}\n"
    )
    assert main(["check", "--policy", "p.yaml"]) == 2  # static shapes: the same check
    err = capsys.readouterr().err
    assert "share the model's dim 's', given 4 and 3" in err and "p.yaml:5:" in err
    Path("p.yaml").write_text(  # a named point of accuracy.shapes: its own line
        "version: 1\nmodel: m.onnx\ninputs:\n"
        f"  ids: {profile.format(s=4)}\n  mask: {profile.format(s=4)}\n"
        "accuracy:\n  shapes:\n    long:\n      ids: [2, 8]\n"
    )
    assert main(["check", "--policy", "p.yaml"]) == 2
    err = capsys.readouterr().err
    assert "p.yaml:8: no engine runs long {ids: [2, 8], mask: [2, 4]}: " in err
    Path("p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  ids: {shape: [2, 4]}\n  mask: {shape: [3, 4]}\n"
    )
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "c"  # another name: ORT refuses
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["check", "--policy", "p.yaml"]) == 2
    err = capsys.readouterr().err
    assert (
        "p.yaml:3: the FP32 model cannot run at shape {ids: [2, 4], mask: [3, 4]} in node add"
        in err
    )


@pytest.mark.parametrize(("target", "baked"), [([1, 6, 2], True), ([1, -1, 4], False)])
def test_a_size_the_export_wrote_into_the_graph_is_said_as_such(tmp_path, capsys, target, baked):
    """A TorchScript export traces `x.view(1, 6, 2)` with the length it saw: a profile over
    other lengths failed with ONNX Runtime's reshape message and "choose input shapes". It
    says the node makes a constant shape, and how to re-export; a shape with -1 (a dim the
    node infers, refused here for divisibility) keeps ONNX Runtime's words."""
    shape = {"shape": np.array(target, np.int64)}
    m = model(
        [node("Reshape", ["x", "shape"], "r", "/enc/Reshape"), node("Relu", ["r"], "y", "relu")],
        [("x", F, [1, "t", 2])], [("y", F, [1, "u", target[2]])], shape,
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {min: [1, 3, 2], opt: [1, 6, 2], max: [1, 9, 2]}\n"
    )
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "cannot run at min [1, 3, 2] in node /enc/Reshape: " in err
    said = "it reshapes to the constant shape [1, 6, 2], a size the export wrote into the graph"
    assert (said in err) == baked
    assert ("re-export the model with that dim dynamic" in err) == baked


def test_a_named_point_the_model_cannot_run_is_said_at_its_own_line(tmp_path, capsys):
    """ONNX Runtime's refusal at a point of `accuracy.shapes` (a HAT export at 36x44, off
    its window size) pointed at `inputs:`, the line of min, opt and max."""
    shape = {"shape": np.array([1, 3, -1], np.int64)}  # 2t values in rows of 3: t of 3k only
    m = model(
        [node("Reshape", ["x", "shape"], "r", "/enc/Reshape"), node("Relu", ["r"], "y", "relu")],
        [("x", F, [1, "t", 2])], [("y", F, [1, 3, "u"])], shape,
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {min: [1, 6, 2], opt: [1, 6, 2], max: [1, 12, 2]}\n"
        "accuracy:\n  shapes:\n    odd: {x: [1, 7, 2]}\n"
    )
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "p.yaml:7: the FP32 model cannot run at odd [1, 7, 2] in node /enc/Reshape" in err


def test_an_index_tolerance_on_a_scalar_class_is_exit_2(tmp_path, capsys):
    """A scalar class (ArgMax without keepdims of a [16]) is judged as one value: with
    `index_tolerance: 1` nothing was compared, and FP16's other class passed."""
    m = model(
        [node("Mul", ["x", "k"], "scores", "scale"),
         node("ArgMax", ["scores"], "cls", "argmax", axis=0, keepdims=0)],
        [("x", F, [16])],
        [("scores", F, [16]), ("cls", onnx.TensorProto.INT64, [])],
        {"k": np.array(1000, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\nbuild: {backend: none}\naccuracy:\n  tolerances:\n"
        "    outputs: {cls: {compare: indices, index_tolerance: 1}}\n"
    )
    assert main(["check", "--policy", str(policy)]) == 2
    assert "index_tolerance 1 leaves nothing of the output 'cls'" in capsys.readouterr().err


def test_top_k_along_a_dynamic_axis_the_data_makes_one_is_exit_2(tmp_path, capsys):
    """The channel axis is a name in the model, so `check` cannot tell; the data makes it 1,
    and the judge says so (exit 2) where it passed a map off by a whole range."""
    m = model(
        [node("Add", ["x", "c"], "y", "shift"), node("Sub", ["y", "c"], "mask", "back")],
        [("x", F, [1, "ch", 8, 8])],
        [("mask", F, [1, "ch", 8, 8])],
        {"c": np.array(2048, np.float32)},
    )
    onnx.save(m, tmp_path / "m.onnx")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 1, 8, 8]}\nbuild: {backend: none}\n"
        "accuracy:\n  tolerances:\n    outputs: {mask: {compare: indices, top_k: 1, top_k_axis: 1}}\n"
    )
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "top_k ranks the output 'mask' along axis 1, of length 1" in err
    assert "at the output's shape [1, 1, 8, 8]" in err and not (tmp_path / "out").exists()
