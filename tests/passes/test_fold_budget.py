"""Constant folding stays within the memory budget (issue #34: a model of a few hundred bytes took 4.1 GB)."""

from __future__ import annotations

import json
import resource
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from tests.helpers import TRTBUILD, F, model, node, sequence_loop
from trtbuild.front import run_front
from trtbuild.passes.prepare import prepare
from trtbuild.policy import load_policy
from trtbuild.policy.specs import Passes

ONE = np.ones(1, np.float32)
ADDRESS_SPACE = 2 << 30  # far below the 4 GB the fold would allocate


def _filled(dims: list[int]) -> onnx.ModelProto:
    """y = x + sum(ConstantOfShape(dims)): a constant subgraph whose size the model sets."""
    return model(
        [
            node("ConstantOfShape", ["dims"], "big", "big", value=numpy_helper.from_array(ONE)),
            node("ReduceSum", ["big"], "total", "sum", keepdims=0),
            node("Add", ["x", "total"], "y", "add"),
        ],
        [("x", F, [1])],
        [("y", F, [1])],
        {"dims": np.asarray(dims, dtype=np.int64)},
    )


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_prepare_leaves_a_constant_larger_than_the_budget_unfolded(tmp_path):
    source = tmp_path / "huge.onnx"
    onnx.save(_filled([1000, 1000, 1000]), source)  # 4 GB of float32 when folded
    assert source.stat().st_size < 400
    out = tmp_path / "prepared.onnx"
    done = subprocess.run(
        [str(TRTBUILD), "prepare", str(source), "-o", str(out), "--no-cache"],
        preexec_fn=_limited,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Failed to allocate" not in done.stderr  # nothing was even attempted
    assert "big: left unfolded: 'big' would take 3.73 GiB" in done.stdout
    assert "over the memory budget" in done.stdout
    ops = [n.op_type for n in onnx.load(out).graph.node]
    assert ops == ["ConstantOfShape", "ReduceSum", "Add"]  # the model computes it at run time


def test_the_record_names_what_was_left_unfolded_and_small_constants_still_fold():
    prepared = prepare(_filled([64, 64]), Passes(), budget=1024)  # 16 KiB > 1 KiB
    record = next(r for r in prepared.records if r.name == "fold_constants")
    unfolded = record.to_json()["unfolded"]
    assert [u["name"] for u in unfolded] == ["big"]
    assert "16 KiB" in unfolded[0]["why"] and "1 KiB" in unfolded[0]["why"]
    json.dumps(record.to_json())  # build.json keeps it
    folded = prepare(_filled([64, 64]), Passes(), budget=1 << 20)
    assert [n.op_type for n in folded.model.graph.node] == ["Add"]
    feed = {"x": np.ones(1, np.float32)}
    for m in (prepared.model, folded.model):
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, feed)[0], [4097.0])


def test_a_growing_op_of_unknown_size_is_not_folded():
    """Expand's shape comes from a Tile of constants: shape inference cannot size it."""
    m = model(
        [
            node("Tile", ["reps", "times"], "dims", "tile"),
            node("Expand", ["one", "dims"], "big", "expand"),
            node("ReduceSum", ["big"], "total", "sum", keepdims=0),
            node("Add", ["x", "total"], "y", "add"),
        ],
        [("x", F, [1])],
        [("y", F, [1])],
        {
            "reps": np.asarray([1000], dtype=np.int64),
            "times": np.asarray([3], dtype=np.int64),
            "one": np.ones(1, np.float32),
        },
    )
    record = next(r for r in prepare(m, Passes()).records if r.name == "fold_constants")
    names = [u["name"] for u in record.details.get("unfolded", [])]
    assert names == ["expand"], record.details
    assert "not known before computing it" in record.details["unfolded"][0]["why"]


def test_the_policy_memory_budget_bounds_folding(tmp_path):
    onnx.save(_filled([64, 64]), tmp_path / "m.onnx")
    text = "version: 1\nmodel: m.onnx\nbuild: {backend: none}\n"
    for budget, left in (("4KiB", ["big"]), ("1MiB", [])):
        path = tmp_path / f"p{budget}.yaml"
        path.write_text(text + f"accuracy: {{memory_budget: {budget}}}\n")
        front = run_front(load_policy(path), reference="none")
        record = next(r for r in front.prepared.records if r.name == "fold_constants")
        assert [u["name"] for u in record.details.get("unfolded", [])] == left


def test_a_sequence_is_not_folded():
    """A constant sequence (a Loop filling an empty one): onnx-graphsurgeon's fold holds
    what it computes as arrays, and its list made `prepare` end in exit 70 (`'list' object
    has no attribute 'nbytes'`); it is left unfolded, the record says why."""
    m = model(
        [*sequence_loop("one", F, "n"), node("Add", ["x", "y"], "z", "add")],
        [("x", F, [3])],
        [("z", F, [3])],
        {"n": np.array(3, np.int64), "one": ONE},
    )
    prepared = prepare(m, Passes())
    (fold,) = [r for r in prepared.records if r.name == "fold_constants"]
    assert fold.details["unfolded"][0]["name"] == "empty"
    assert "is not a tensor" in fold.details["unfolded"][0]["why"]
    session = ort.InferenceSession(prepared.model.SerializeToString())
    (y,) = session.run(None, {"x": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(y, np.ones(3, np.float32))
