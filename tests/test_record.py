"""An earlier build's build.json, read back by `report`: a record whose parts do not have the
shapes a build writes is exit 2 naming the part, never an internal error."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import F, model, node
from trtbuild.cli import main
from trtbuild.record import BuildRecord


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A real TensorRT-RTX build of a Relu: its folder and its build.json as written."""
    import onnx

    tmp = tmp_path_factory.mktemp("record")
    onnx.save(
        model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])]),
        tmp / "m.onnx",
    )
    (tmp / "p.yaml").write_text("version: 1\nmodel: m.onnx\naccuracy: {samples: 1}\n")
    assert main(["build", "--policy", str(tmp / "p.yaml"), "--out", str(tmp / "out")]) == 0
    return tmp, json.loads((tmp / "out" / "build.json").read_text())


def test_a_builds_own_record_reads_back(built):
    tmp, record = built
    read = BuildRecord.from_json(record, tmp / "out" / "build.json")
    assert read.to_json() == record and read.engines["policy"]["memory"]


def _set(record: dict, path: tuple, value) -> dict:
    record = json.loads(json.dumps(record))
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return record


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("engines", "policy", "memory"), True, "engines.policy.memory is not a dict"),
        (("engines", "policy", "memory", "weights_bytes"), "", "engines.policy.memory is not"),
        (("engines", "fp16", "backend"), -1, "engines.fp16.backend is not a str"),
        (("engines", "policy", "builder_warnings"), [3], "engines.policy.builder_warnings"),
        (("layer_audit",), 1.5, "layer_audit is not a dict[str, Any] | None"),
        (("layer_audit", "not_in_network"), 7, "layer_audit.not_in_network is not a list"),
        (("warnings",), "x", "warnings is not a list[str]"),
    ],
)
def test_a_record_of_the_wrong_shape_is_exit_2_naming_the_part(
    tmp_path, capsys, built, path, value, said
):
    """Found by changing one value of a real build.json at random: a `memory` that is a
    number, an empty string for a size, ended `report` as an internal error."""
    tmp, record = built
    out = tmp_path / "out"
    shutil.copytree(tmp / "out", out)
    for name in ("m.onnx", "p.yaml"):
        shutil.copy(tmp / name, tmp_path / name)
    broken = _set(record, path, value)
    broken["policy"] = str((tmp_path / "p.yaml").resolve())  # this folder's own build
    (out / "build.json").write_text(json.dumps(broken))
    assert main(["report", "--policy", str(tmp_path / "p.yaml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and "it is not a record this trtbuild wrote" in err, err
