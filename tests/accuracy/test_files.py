""".npz data the model cannot take is the policy's to fix: each message names the field that
names the file and its line, though only reading the file finds it."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.helpers import F, H, identity_policy, model, node
from trtbuild.cli import main
from trtbuild.errors import UsageError
from trtbuild.front import run_front
from trtbuild.policy import load_policy

I32, U8 = TensorProto.INT32, TensorProto.UINT8


@pytest.mark.parametrize(
    ("arrays", "said"),
    [
        ({"y": np.zeros((2, 1, 4), np.float32)}, "inputs.x.data.file: x.npz has no array 'x'"),
        ({"x": np.zeros((2, 1, 4), np.int64)}, "inputs.x.data.file: array 'x' holds int64 values"),
        (
            {"x": np.full((2, 1, 4), np.nan, np.float32)},
            "inputs.x.data.file: array 'x' holds 8 NaN value(s)",
        ),
        ({"x": np.zeros((2, 1, 5), np.float32)}, "inputs.x.data.file: array 'x' has 5 on axis 1"),
    ],
)
def test_an_inputs_file_the_model_cannot_take_names_its_line(tmp_path, arrays, said):
    np.savez(tmp_path / "x.npz", **arrays)
    path = identity_policy(tmp_path, [1, 4], "{shape: [1, 4], data: {file: x.npz}}")
    with pytest.raises(UsageError, match=re.escape(said)) as info:
        run_front(load_policy(path), reference="none")
    assert info.value.where == f"{path.resolve()}:4"


@pytest.mark.parametrize(
    ("elem", "array", "said"),
    [
        (F, np.array([[[1.0, 1e39]]]), "[0, 0, 1] (1e+39; float32 holds ±3.40282e+38)"),
        (H, np.array([[[1.0, 7e4]]], np.float32), "[0, 0, 1] (70000.0; float16 holds ±65504)"),
        (I32, np.array([[[3, 2**32 + 1]]]), "[0, 0, 1] (4294967297; int32 holds -2147483648"),
        (U8, np.array([[[3, -1]]]), "[0, 0, 1] (-1; uint8 holds 0 to 255)"),
    ],
)
def test_a_value_the_inputs_type_cannot_hold_is_the_files_fault(tmp_path, elem, array, said):
    """numpy's cast wraps an integer and overflows a float to inf: a float64 1e39 was blamed
    on the model (its FP32 reference 'holds inf'), an int64 id 2**32 + 1 fed as 1."""
    m = model([node("Identity", ["x"], "y", "id")], [("x", elem, [1, 2])], [("y", elem, [1, 2])])
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=array)
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x: {shape: [1, 2], data: {file: x.npz}}\n"
    )
    with pytest.raises(UsageError, match=re.escape(said)) as info:
        run_front(load_policy(path), reference="none")
    assert "array 'x' holds 1 value(s) that the model's input 'x'" in str(info.value)
    assert info.value.where == f"{path.resolve()}:4"


def _masked_softmax(tmp_path, mask: np.ndarray, elem: int = F) -> tuple[int, dict]:
    """build's exit code and report.json for Softmax(s + mask) on `mask` from a file."""
    import json

    nodes = [node("Add", ["s", "mk"], "a", "add"), node("Softmax", ["a"], "y", "sm", axis=-1)]
    io = [("s", F, [1, 4, 4]), ("mk", elem, [1, 4, 4])]
    if elem != F:  # the mask read as the model types it, added in FP32
        nodes.insert(0, node("Cast", ["mk"], "mf", "cast", to=F))
        nodes[1].input[1] = "mf"
    onnx.save(model(nodes, io, [("y", F, [1, 4, 4])]), tmp_path / "m.onnx")
    s = np.random.default_rng(0).uniform(-1, 1, (2, 1, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "x.npz", s=s, mk=np.broadcast_to(mask, (2, 1, 4, 4)))
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  s: {data: {file: x.npz}}\n"
        "  mk: {data: {file: x.npz}}\naccuracy: {samples: 2, tolerances: {default: {atol: 0.01}}}\n"
    )
    out = tmp_path / "out"
    code = main(
        ["build", "--policy", str(tmp_path / "p.yaml"), "--out", str(out), "--backend", "none"]
    )
    return code, json.loads((out / "report.json").read_text()) if code in (0, 1) else {}


@pytest.mark.parametrize("elem", [F, H])
def test_a_minus_inf_attention_mask_is_data_judged_as_its_finfo_min_is(tmp_path, elem):
    """A causal mask saved as PyTorch makes it (`generate_square_subsequent_mask`: -inf
    above the diagonal) was exit 2, 'reference inputs must be finite', where the same mask
    with finfo.min passed: FP32's softmax is the same on both, and so is FP16's."""
    causal = np.triu(np.ones((4, 4), np.float32), 1)
    codes, errors = [], []
    for k, fill in enumerate([np.float32(-np.inf), np.finfo(np.float32).min]):
        if elem == H and np.isfinite(fill):
            fill = np.float32(-65504)  # FP16's own finfo.min
        folder = tmp_path / str(k)
        folder.mkdir()
        code, report = _masked_softmax(
            folder, np.where(causal > 0, fill, 0).astype(np.float32), elem
        )
        codes.append(code)
        errors.append(report["outputs"]["y"]["max_abs"])
    assert codes == [0, 0]
    assert errors[0] == errors[1]


def test_a_nan_in_a_file_is_still_exit_2(tmp_path, capsys):
    mask = np.zeros((4, 4), np.float32)
    mask[1, 2] = np.nan
    assert _masked_softmax(tmp_path, mask)[0] == 2
    assert (
        "array 'mk' holds 2 NaN value(s), the first at index [0, 0, 1, 2]"
        in capsys.readouterr().err
    )


def _own_npz(path):
    np.savez(path, x=np.zeros((1, 2, 4), np.float32), z=np.zeros(1))


def _own_npy(path):
    np.save(path.with_suffix(".npy"), np.zeros((2, 4), np.float32))
    path.with_suffix(".npy").rename(path)


def _own_shape(path):
    np.savez(path, x=np.zeros((3, 4), np.float32))


def _own_garbage(path):
    path.write_bytes(b"PK\x03\x04 not a zip at all")


@pytest.mark.parametrize(
    ("write", "said"),
    [
        (_own_npz, "own.npz holds array(s) ['z'] that name no model input"),
        (_own_npy, "own.npz is one array (.npy)"),
        (_own_shape, "array 'x' has shape [3, 4]; max [2, 4] needs [2, 4] or [N, 2, 4]"),
        (_own_garbage, "cannot read "),
    ],
    ids=["unknown-key", "one-array", "shape", "unreadable"],
)
def test_a_points_own_file_names_the_line_of_that_point(tmp_path, write, said):
    np.savez(tmp_path / "x.npz", x=np.zeros((2, 1, 4), np.float32))
    write(tmp_path / "own.npz")
    profile = "{min: [1, 4], opt: [1, 4], max: [2, 4], data: {file: x.npz}}"
    extra = "accuracy:\n  shapes:\n    max:\n      data: {file: own.npz}\n"
    path = identity_policy(tmp_path, ["n", 4], profile, extra)
    with pytest.raises(
        UsageError, match=re.escape(f"accuracy.shapes.max.data.file: {said}")
    ) as info:
        run_front(load_policy(path), reference="none")
    assert info.value.where == f"{path.resolve()}:8"
