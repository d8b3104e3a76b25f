"""`fsutil`'s JSON: every file trtbuild writes is strict JSON, whatever figures it holds."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from trtbuild.fsutil import dumps_json, strict_json, write_json


def test_non_finite_figures_are_words_at_any_depth_and_numpy_scalars_are_python_numbers():
    doc = {
        "a": math.inf,
        "b": [-math.inf, (np.float32("nan"), 1.5)],
        "c": {"worst": {"abs": np.float64("inf"), "rel": float("nan")}, "n": np.int64(3)},
        "d": np.array([2.5]),
    }
    want = {
        "a": "inf",
        "b": ["-inf", ["nan", 1.5]],
        "c": {"worst": {"abs": "inf", "rel": "nan"}, "n": 3},
        "d": 2.5,
    }
    assert strict_json(doc) == want
    assert json.loads(dumps_json(doc), parse_constant=lambda c: pytest.fail(c)) == want
    assert type(strict_json(np.int64(3))) is int and type(strict_json(np.float32(0.5))) is float


def test_write_json_refuses_what_it_cannot_write_strictly(tmp_path):
    write_json(tmp_path / "ok.json", {"x": [math.inf]})
    assert (tmp_path / "ok.json").read_text() == '{\n  "x": [\n    "inf"\n  ]\n}\n'
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        write_json(tmp_path / "bad.json", {"x": object()})
    assert not (tmp_path / "bad.json").exists()  # nothing half-written


def _relu_policy(tmp_path):
    import onnx

    from tests.helpers import F, model, node

    onnx.save(
        model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])]),
        tmp_path / "m.onnx",
    )
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\naccuracy: {samples: 1}\n")
    return str(tmp_path / "p.yaml")


@pytest.mark.parametrize("target", ["device", "fifo", "descriptor"])
@pytest.mark.parametrize("command", ["convert", "prepare", "tune", "tune-log"])
def test_an_output_that_is_a_device_fifo_or_descriptor_is_refused_not_replaced(
    tmp_path, capsys, target, command
):
    """As root, `convert -o /dev/null` replaced the system's /dev/null with a regular file
    (renamed over it), and every later `> /dev/null` on the machine wrote into that file
    (found by random command lines). Each output path that is, or links to, a device, a
    FIFO or an open file of the process (/dev/stdout) is exit 2 and left as it was. The
    device is reached through a link in tmp_path: a regression replaces the link, never
    /dev/null itself."""
    import os

    from trtbuild.cli import main

    path = tmp_path / "out"
    if target == "device":
        path.symlink_to("/dev/null")
    elif target == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/proc/self/fd/1")
    before = os.readlink(path) if path.is_symlink() else "fifo"
    policy = _relu_policy(tmp_path)
    args = {
        "convert": ["convert", "--policy", policy, "-o", str(path)],
        "prepare": ["prepare", str(tmp_path / "m.onnx"), "-o", str(path)],
        "tune": ["tune", "--policy", policy, "-o", str(path), "--budget", "1"],
        "tune-log": [
            "tune",
            "--policy",
            policy,
            "-o",
            str(tmp_path / "t.yaml"),
            "--log",
            str(path),
        ],
    }[command]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "not a file trtbuild can write" in err and err.count("\n") == 1, err
    assert (os.readlink(path) if path.is_symlink() else "fifo") == before
    assert path.is_symlink() or path.is_fifo()


def _umask() -> int:
    """The process's umask as the kernel says it, without setting it."""
    status = Path("/proc/self/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("Umask:")).split()[1], 8)


def _umasks_seen(work) -> set[int]:
    """The umask at every line of `trtbuild.fsutil` that `work` runs: what a file another
    thread made at that moment got."""
    seen: set[int] = set()

    def trace(frame, event, arg):
        if not frame.f_code.co_filename.endswith("trtbuild/fsutil.py"):
            return None
        if event == "line":
            seen.add(_umask())
        return trace

    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(None)
    return seen


def test_writing_a_file_or_publishing_a_folder_leaves_the_umask_set(tmp_path):
    """The umask is read, not swapped for 0 and back: between the two calls every file
    another thread made (the library caller's) was writable by anyone."""
    from trtbuild.fsutil import publish_folder, write_text

    if not Path("/proc/self/status").is_file() or _umask() == 0:
        pytest.skip("no /proc here (the umask is read by a swap), or a umask of 0")
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "a.txt").write_text("a")

    def work() -> None:
        write_text(tmp_path / "x.txt", "x")
        publish_folder(staging, tmp_path / "out", {"a.txt"}, "build")

    assert _umasks_seen(work) == {_umask()}
    assert (tmp_path / "out" / "a.txt").read_text() == "a"
