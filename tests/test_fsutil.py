"""`fsutil`'s JSON: every file trtbuild writes is strict JSON, whatever figures it holds."""

from __future__ import annotations

import json
import math

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
