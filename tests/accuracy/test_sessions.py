"""The engine runner bound to the right TensorRT, no flag left behind; the metrics exact."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import ROOT
from tests.helpers import interleaved, needs_rtx
from trtbuild.errors import BackendError
from trtbuild.numerics import RELATIVE_EPSILON
from trtbuild.policy.specs import BuildSpec


@needs_rtx
def test_rtx_runner_binds_tensorrt_rtx_and_gives_polygraphys_flag_back(tmp_path):
    from polygraphy import config as pg_config

    from trtbuild.accuracy.sessions import trt_runner
    from trtbuild.engine.child import build_engine

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "relu.onnx")
    engine = build_engine(tmp_path / "relu.onnx", "tensorrt-rtx", BuildSpec()).engine

    was = pg_config.USE_TENSORRT_RTX
    runner = trt_runner(engine, "tensorrt-rtx")
    assert pg_config.USE_TENSORRT_RTX is was  # nothing process-wide left flipped
    from polygraphy.backend.trt import runner as pg_runner

    assert pg_runner.trt.__name__ == "tensorrt_rtx"  # the engine's own runtime
    assert runner.rtx and runner.runner.name == "tensorrt"
    # the other flavour cannot share this process: one clear error, not a wrong runtime
    with pytest.raises(BackendError, match="process of its own"):
        trt_runner(engine, "tensorrt")


@needs_rtx
def test_the_other_tensorrt_flavour_in_one_process_is_refused_with_one_message():
    """Polygraphy binds its TensorRT backend once per process; the second flavour says so."""
    code = (
        "from trtbuild.accuracy.sessions import bound_flavour, tensorrt_flavour\n"
        "from trtbuild.errors import BackendError\n"
        "assert bound_flavour() is None\n"
        "with tensorrt_flavour(True):\n"
        "    import polygraphy.backend.trt\n"
        "assert bound_flavour() is True\n"
        "try:\n"
        "    with tensorrt_flavour(False):\n"
        "        pass\n"
        "except BackendError as exc:\n"
        "    print(exc.message)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "already ran engines of the other TensorRT flavour" in done.stdout


def test_intra_op_threads_follow_an_affinity_narrower_than_the_machine():
    """In a child process (the affinity is the process's): one allowed core, one thread;
    every core allowed, ONNX Runtime's own choice (0)."""
    code = (
        "import os\n"
        "from trtbuild.accuracy.sessions import intra_op_threads\n"
        "print(intra_op_threads())\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "print(intra_op_threads())\n"
    )
    import os

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    whole = len(os.sched_getaffinity(0)) == os.cpu_count()
    assert out[0] == ("0" if whole else str(len(os.sched_getaffinity(0))))
    assert out[1] == ("1" if (os.cpu_count() or 1) > 1 else "0")


def _plain_metrics(ref, out):
    """The figures as written first: every step on a fresh float64 copy."""
    ref = np.asarray(ref, dtype=np.float64).ravel()
    out = np.asarray(out, dtype=np.float64).ravel()
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        diff = np.abs(out - ref)
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = diff / np.where(ref == 0, RELATIVE_EPSILON, np.abs(ref))
        finite = np.abs(ref)[np.isfinite(ref)]
        peak = float(finite.max()) if finite.size else 0.0
        return {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "mean_abs": float(diff.mean()) if diff.size else 0.0,
            "median_abs": float(np.median(diff)) if diff.size else 0.0,
            "p99_abs": _plain_p99(diff),
            "max_rel": float(rel.max()) if rel.size else 0.0,
            "max_abs_of_range": float(diff.max()) / peak if diff.size and peak > 0 else 0.0,
            "nonfinite": int(np.count_nonzero(~np.isfinite(out) & np.isfinite(ref))),
        }


def _plain_p99(diff: np.ndarray) -> float:
    """numpy's linear 99th percentile of the sorted errors, read off them where an inf is
    near: the rank it falls on, or inf where it lies between a value and an inf."""
    if not diff.size:
        return 0.0
    ranked = np.sort(diff)
    where = 0.99 * (diff.size - 1)
    low = int(np.floor(where))
    if where == low:
        return float(ranked[low])
    if np.isinf(ranked[low + 1]):
        return np.inf
    return float(np.percentile(diff, 99))


@pytest.mark.parametrize("size", [0, 1, 2, 7, 100, 101, 40_001])
@pytest.mark.parametrize(
    "kind",
    ["plain", "nan", "inf", "both_inf", "ref_nan", "zeros", "fp16", "int", "inf_tail", "inf_last"],
)
def test_metrics_are_the_plain_formulas_bit_for_bit(size, kind):
    """The in-place figures are the same numbers as the plain ones, NaN and inf included; a
    percentile among infinities is inf (numpy interpolates inf - inf, NaN: `p99_abs: nan`
    beside `max_abs: inf` where 2 of 2 elements turned inf)."""
    from trtbuild.accuracy.sessions import metrics

    rng = np.random.default_rng(size)
    ref = rng.standard_normal(size).astype(np.float32)
    out = ref + rng.standard_normal(size).astype(np.float32) * np.float32(1e-3)
    if size > 3:
        out[3] = np.nan if kind == "nan" else out[3]
        out[1] = np.inf if kind == "inf" else out[1]
        if kind == "both_inf":
            ref[2] = out[2] = -np.inf
        ref[0] = np.nan if kind == "ref_nan" else ref[0]
        ref[: size // 2] = 0 if kind == "zeros" else ref[: size // 2]
    if kind == "inf_tail":
        out[size - max(1, size // 20) :] = np.inf  # the 99th percentile among them
    if kind == "inf_last" and size:
        out[-1] = np.inf  # 101 errors: the 99th percentile is the 100th, finite
    if kind == "fp16":
        out = out.astype(np.float16)
    if kind == "int":
        ref, out = (ref * 10).astype(np.int64), (out * 10).astype(np.int32)
    got, want = metrics(ref, out), _plain_metrics(ref, out)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == value or (np.isnan(value) and np.isnan(got[key])), key
    if kind == "inf_tail" and size:
        assert got["p99_abs"] == np.inf
    if kind == "inf_last" and size == 101:
        assert np.isfinite(got["p99_abs"])


def _weighty() -> onnx.ModelProto:
    """Large weights of two types, one read only inside an If's branch (an outer name)."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64), np.float32), "w")
    h = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float16), "h")
    inner = numpy_helper.from_array(rng.standard_normal((64, 64), np.float32), "inner")
    branch = lambda name, weight: helper.make_graph(  # noqa: E731
        [helper.make_node("MatMul", ["y", weight], [name])],
        name,
        [],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["y", "h32"], ["z"]),
        helper.make_node(
            "If", ["c"], ["b"], then_branch=branch("t", "inner"), else_branch=branch("e", "w")
        ),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("z", "b")]
    graph = helper.make_graph(nodes, "g", [x, c], outs, [w, h, inner])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("memory_files", [True, False])
def test_a_session_given_its_weights_apart_computes_what_the_whole_models_does(
    monkeypatch, memory_files
):
    import gc

    from trtbuild.accuracy import sessions

    if not memory_files:  # an ONNX Runtime without files of memory: the weights in the bytes
        monkeypatch.setattr(sessions, "_memory_files", lambda: False)
    m = _weighty()
    g = m.graph
    bare = helper.make_model(  # its weights given beside it, as a segment's are
        helper.make_graph(g.node, "g", g.input, g.output), opset_imports=m.opset_import
    )
    made = sessions.session_model(bare, g.initializer)
    whole = sessions.session_model(m)
    assert len(made.files) == len(whole.files) == (3 if memory_files else 0)
    if memory_files:  # no weight's data in the bytes ONNX Runtime parses
        assert len(made.data) < 2000 and len(whole.data) < 2000
    inline = sessions.plain_session(m.SerializeToString())
    apart = [sessions.plain_session(made), sessions.lean_session(whole)]
    del made, whole
    gc.collect()  # ONNX Runtime copied the files' bytes as it made each session
    x = np.random.default_rng(1).standard_normal((2, 64), np.float32)
    for c in (True, False):
        feed = {"x": x, "c": np.array(c)}
        expected = inline.run(None, feed)
        for session in apart:
            got = session.run(None, feed)
            assert all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_an_engines_run_feeds_an_input_the_parser_renamed_under_its_name():
    """TensorRT's parser names an input that is a graph output too `__x`; an engine's run
    (`EngineRunner.run`) is fed by the model's names. Polygraphy's cache of a Comparator's
    data loader, given the engine's inputs as the Comparator gives them, reads `x`'s array
    as `__x`'s (its names match "allowing for minor differences"): what the GPU's run of such
    an engine relies on (the TrtRunner itself is not run here: no GPU)."""
    from polygraphy.common import TensorMetadata
    from polygraphy.comparator.data_loader import DataLoaderCache

    x, z = np.ones((1, 4), np.float32), np.zeros((1, 2), np.float32)
    cache = DataLoaderCache([{"x": x, "z": z}])
    engine = TensorMetadata().add("__x", np.float32, (1, 4)).add("z", np.float32, (1, 2))
    cache.set_input_metadata(engine)
    fed = cache[0]
    assert set(fed) == {"__x", "z"} and np.array_equal(fed["__x"], x) and fed["z"] is z


def test_two_threads_quieting_polygraphy_leave_the_process_as_it_was():
    """The warnings filters and Polygraphy's log are the process's: two threads that each
    restored what they found on entry left the second's quiet state for good (a filter
    ignoring every RuntimeWarning of the user's, Polygraphy's log at critical)."""
    from polygraphy.logger import G_LOGGER

    from trtbuild.accuracy.sessions import quiet_polygraphy

    filters, severity = list(warnings.filters), G_LOGGER.module_severity
    indent = G_LOGGER.logging_indent
    interleaved(quiet_polygraphy)
    assert list(warnings.filters) == filters
    assert G_LOGGER.module_severity is severity
    assert G_LOGGER.logging_indent == indent
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        warnings.warn("the user's", RuntimeWarning, stacklevel=1)
    assert len(said) == 1


def test_two_threads_running_engines_give_polygraphy_s_flavour_flag_back():
    """`USE_TENSORRT_RTX` as it was before two runs at once, whichever leaves first."""
    from polygraphy import config as pg_config

    from trtbuild.accuracy.sessions import bound_flavour, tensorrt_flavour

    rtx = bound_flavour()
    rtx = True if rtx is None else rtx
    original = pg_config.USE_TENSORRT_RTX
    before = pg_config.USE_TENSORRT_RTX = not rtx
    try:
        interleaved(lambda: tensorrt_flavour(rtx))
        assert pg_config.USE_TENSORRT_RTX is before
    finally:
        pg_config.USE_TENSORRT_RTX = original
