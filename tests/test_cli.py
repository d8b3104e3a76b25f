"""The CLI end to end, as `make demo` and the nightly job run it."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.conftest import ROOT
from tests.helpers import needs_rtx
from trtbuild.cli import main

rtx = needs_rtx  # one marker for every test that builds with TensorRT-RTX
# These tests expect the CPU verdict; on a GPU host with full TensorRT the engine is judged.
cpu_only = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None and os.path.exists("/dev/nvidia0"),
    reason="a GPU and tensorrt are present: the evaluator is tensorrt, not emulated-fp16",
)
EXPECTED = {
    "prepared.onnx",
    "mixed.onnx",
    "engine.plan",
    "build.json",
    "report.json",
    "report.md",
    "junit.xml",
}


@rtx
@cpu_only
def test_build_writes_engine_and_passing_report(write_policy, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(["build", "--policy", str(write_policy(backend="tensorrt-rtx")), "--out", str(out)])
        == 0
    )
    assert {p.name for p in out.iterdir()} >= EXPECTED
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is True
    assert report["evaluator"] == "emulated-fp16" and report["emulation"] == "storage"
    assert report["baselines"]["fp16"]["passed"] is False
    assert report["baselines"]["fp16"]["first_divergence"]["node"] == "/blocks.0/norm1/Pow"
    assert report["first_divergence"] is None
    assert {p["rule"] for p in report["precision"]["pinned"]} == {"layernorm", "final-reduction"}
    build = json.loads((out / "build.json").read_text())
    assert build["layer_audit"]["ok"] and build["layer_audit"]["fp32_nodes_checked"] >= 37
    assert build["engines"]["policy"]["engine_bytes"] == (out / "engine.plan").stat().st_size
    assert build["warnings"] == report["warnings"]  # one list: the engine's warnings in both
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "staging left behind"
    assert (
        "PASSED at shape [1, 3, 64, 64] (emulated-fp16, storage emulation; random data)"
        in capsys.readouterr().out
    )
    # `report` owns only the report files: the engine and build record stay as built.
    engine = (out / "engine.plan").read_bytes()
    policy = str(write_policy(backend="tensorrt-rtx"))
    assert main(["report", "--policy", policy, "--out", str(out)]) == 0
    assert (out / "engine.plan").read_bytes() == engine and (out / "build.json").exists()
    # ... and the report still says what was built (the Engines section, the backend)
    assert json.loads((out / "report.json").read_text())["backend"] == "tensorrt-rtx"
    assert "## Engines" in (out / "report.md").read_text()
    assert "<h2>Engines</h2>" in (out / "report.html").read_text()


def test_policy_without_pins_fails_accuracy_with_exit_1(write_policy, tmp_path):
    out = tmp_path / "out"
    assert main(["build", "--policy", str(write_policy(rules="")), "--out", str(out)]) == 1
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is False and report["outputs"]["total"]["nonfinite"] > 0
    assert "engine.plan" not in os.listdir(out)  # backend none


def test_malformed_policy_is_one_line_exit_2(write_policy, tmp_path, capsys):
    path = write_policy("version: 1\nmodel: m.onnx\nprecision: {default: fp8}\n")
    assert main(["build", "--policy", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "policy.yaml:3" in err and "precision.default" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["./", ".", "..", "/", "sub", "sub/"])
@pytest.mark.parametrize("command", ["check", "build", "report", "tune"])
def test_a_folder_as_the_policy_is_exit_2_not_an_internal_error(
    tmp_path, monkeypatch, capsys, name, command
):
    """`--policy ./` (a folder, or `/`) made the search for `NAME.yaml` ask pathlib for a
    name `.` has not: exit 70 in every command (found by random command lines)."""
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    out = ["-o", "t.yaml"] if command == "tune" else []
    assert main([command, "--policy", name, *out]) == 2
    err = capsys.readouterr().err
    assert f"{name}: a folder, not a policy file" in err and "nightly --policies" in err, err
    assert err.count("\n") == 1, err


def test_missing_policy_and_model(tmp_path, write_policy, capsys):
    assert main(["check", "--policy", str(tmp_path / "nope.yaml")]) == 2
    assert "policy file not found" in capsys.readouterr().err
    path = write_policy("version: 1\nmodel: missing.onnx\n")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "model file not found (fix the `model` path, which is relative to the policy's" in err
    # each fix names what names the file: `prepare`'s argument is no policy's field
    assert main(["prepare", str(tmp_path / "gone.onnx"), "-o", str(tmp_path / "p.onnx")]) == 2
    err = capsys.readouterr().err
    assert "fix the path (relative to the current folder)" in err and "policy's" not in err, err
    model = path.read_text().replace("missing.onnx", str(tmp_path / "m.onnx"))
    (tmp_path / "m.onnx").write_bytes((ROOT / "models" / "nafnet_tiny.onnx").read_bytes())
    path.write_text(model + "accuracy: {reference_model: gone.onnx}\n")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "accuracy.reference_model: reference model not found" in err, err


def test_check_lists_every_node_with_reason(write_policy, capsys):
    assert main(["check", "--policy", str(write_policy()), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["node"]: r for r in data["nodes"]}
    assert rows["/blocks.0/norm1/Pow"]["precision"] == "fp32"
    assert rows["/blocks.0/norm1/Pow"]["rule"] == "layernorm"
    assert rows["/intro/Conv"]["precision"] == "fp16"


def test_convert_writes_only_the_mixed_model(write_policy, tmp_path):
    import onnx

    out = tmp_path / "mixed.onnx"
    assert main(["convert", "--policy", str(write_policy()), "-o", str(out)]) == 0
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".onnx") == ["mixed.onnx"]


def test_schema_and_help_exit_0(capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "trtbuild precision policy"
    assert main(["--help"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    for code in (
        "0 ok",
        "1 accuracy",
        "2 bad usage",
        "3 backend",
        "70 internal",
        "130 interrupted",
    ):
        assert code in said, code
    assert main(["frobnicate"]) == 2


def test_every_default_is_said_by_the_commands_help():
    """`trtbuild tune --help` says `--budget`'s 100 as the CLI page does.

    Why: the page (sphinx-argparse, `:nodefault:`) shows each flag's help and nothing else,
    so a default the help leaves out is on neither; a user reads `--help` first.
    """
    import argparse

    from trtbuild.cli import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    unsaid = []
    for command, sp in sub.choices.items():
        text = " ".join(sp.format_help().split())
        for a in sp._actions:
            if a.default in (None, argparse.SUPPRESS) or a.default is False:  # 0 is a default
                continue
            if not a.option_strings:
                continue
            said = " ".join(((a.help or "") % {**vars(a), "default": a.default}).split())
            if "default" not in said or said not in text:
                unsaid.append(f"{command} {a.option_strings[0]}")
    assert not unsaid, f"--help does not say the default of {unsaid}"


def test_an_interrupt_a_library_rewrapped_is_still_exit_130(monkeypatch, write_policy, capsys):
    """onnxruntime turns a Ctrl-C during its import into ImportError; that is still Ctrl-C."""
    from trtbuild import pipeline

    def interrupted_import(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ImportError("initialization failed") from exc

    monkeypatch.setattr(pipeline, "run_front", interrupted_import)
    assert main(["build", "--policy", str(write_policy())]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err


def _swallowing(real):
    """`real`, after trtbuild's SIGTERM handler raised inside a library that swallowed it
    (a bare `except:`)."""
    import signal

    from trtbuild.errors import stop_raised

    def swallowing(*args, **kwargs):
        try:
            raise stop_raised(signal.SIGTERM)  # what `cli._terminate` raises
        except BaseException:
            pass
        return real(*args, **kwargs)

    return swallowing


def test_a_stop_a_library_swallowed_is_still_exit_143_and_writes_nothing(
    monkeypatch, write_policy, tmp_path, capsys
):
    """The command ran on: `build` published and said so, `check` printed its table, exit 0."""
    from trtbuild import api, pipeline
    from trtbuild.errors import _STOPS_RAISED, forget_stops

    out, policy = tmp_path / "out", str(write_policy())
    try:
        with monkeypatch.context() as patched:
            patched.setattr(pipeline, "run_front", _swallowing(pipeline.run_front))
            assert main(["build", "--policy", policy, "--out", str(out)]) == 143
        assert "terminated (SIGTERM)" in capsys.readouterr().err and not out.exists()
        with monkeypatch.context() as patched:
            patched.setattr(api, "check", _swallowing(api.check))
            assert main(["check", "--policy", policy]) == 143  # it publishes nothing: at the end
        assert main(["build", "--policy", policy, "--out", str(out)]) == 0  # the next one's own
        assert not _STOPS_RAISED  # nor a library call's after it, in this process
    finally:
        forget_stops()  # this test process's later tests publish


RUN_WITH_A_HANDLER = """
import atexit, sys
from trtbuild.cli import run
atexit.register(lambda: print("exit handler ran", file=sys.stderr))
sys.argv = ["trtbuild", *sys.argv[1:]]
run()
"""


def test_the_command_flushes_its_output_and_runs_the_exit_handlers(tmp_path, capsys):
    """`run` ends the process without the interpreter's teardown: what `main` printed
    still reaches a pipe whole, the exit code is `main`'s, and the exit handlers ran."""
    import subprocess
    import sys

    assert main(["schema"]) == 0
    schema = capsys.readouterr().out
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a buffer
    command = [sys.executable, "-m", "trtbuild", "schema"]
    piped = subprocess.run(command, capture_output=True, env=env)
    assert piped.returncode == 0 and piped.stdout.decode() == schema
    missing = subprocess.run(
        [sys.executable, "-c", RUN_WITH_A_HANDLER, "check", "--policy", str(tmp_path / "no")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2
    assert "policy file not found" in missing.stderr
    assert missing.stderr.rstrip().endswith("exit handler ran")


def test_a_reader_that_left_before_the_last_flush_is_exit_141():
    """The reader of stdout closed the pipe before `run`'s flush (`--version`'s line waits
    in the buffer until then): 141, as `main` says it, not Python's 120."""
    import subprocess
    import sys

    code = "import sys; from trtbuild.cli import run; sys.argv = ['trtbuild', '--version']; run()"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a buffer
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    proc.stdout.close()  # before anything is read
    assert proc.wait(timeout=60) == 141


def test_a_policy_that_is_a_device_or_a_pipe_is_said_so_and_never_read(tmp_path, capsys):
    """`/dev/zero` and a FIFO were "policy file not found" (they exist); a FIFO opened would
    wait for a writer."""
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        assert main(["check", "--policy", path]) == 2
        err = capsys.readouterr().err
        assert f"{path}: the policy is not a regular file (a FIFO, device" in err, err


def test_a_full_stdout_names_where_the_space_ran_out(capsys):
    """`check > /dev/full`: no file is named; the fix said an output folder `check` has not."""
    import subprocess
    import sys

    done = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -m trtbuild schema > /dev/full'],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "the file stdout or stderr is written to" in done.stderr, done.stderr


def _line_of(path, text: str) -> int:
    return next(k for k, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_pass_that_refuses_its_field_names_the_policy_file_and_line(write_policy, capsys):
    """`passes.opset` past what onnx knows was said by the pass as `passes.opset: ...`,
    naming no file: the pass knows the field, not the policy."""
    policy = write_policy()
    policy.write_text(policy.read_text().replace("opset: 17", "opset: 99"))
    assert main(["check", "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    line = _line_of(policy, "opset: 99")
    assert f"error: {policy}:{line}: passes.opset: opset 99 is newer than this onnx" in err


@needs_rtx
def test_an_engine_build_that_refuses_its_field_names_the_policy_file_and_line(
    write_policy, tmp_path, capsys
):
    """A compute capability TensorRT-RTX has no target for is found in the build's child,
    which knows `build.compute_capabilities`, not the file: the parent adds it."""
    policy = write_policy(backend="tensorrt-rtx")
    text = policy.read_text().replace("  variants: false", '  compute_capabilities: ["9.0"]')
    policy.write_text(text)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    line = _line_of(policy, "compute_capabilities")
    assert f"{policy}:{line}: build.compute_capabilities: compute capability 9.0 is not" in err
    assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_report_engine_that_is_no_regular_file_says_what_it_is(tmp_path, capsys, kind):
    """`report --engine` naming a FIFO or a folder said "engine file not found", for a path
    that is there: it says what the path is (found by random command lines)."""
    import os

    path = tmp_path / "engine.plan"
    (os.mkfifo if kind == "fifo" else os.mkdir)(path)
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\n")
    assert main(["report", "--policy", str(tmp_path / "p.yaml"), "--engine", str(path)]) == 2
    said = {"fifo": "is a FIFO (named pipe)", "folder": "is a folder"}[kind]
    assert f"{path}: {said}, not an engine file" in capsys.readouterr().err


# Runs the command with SIGTERM sent to itself as native module TARGET is initialised (its
# loader's exec_module: pybind11's init), and writes WHOLE once that init has ended.
_STOP_IN_NATIVE_INIT = """
import importlib.abc, importlib.machinery, os, signal, sys
_, target, whole, *argv = sys.argv

class StopThere(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target_=None):
        if name != target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run_init = spec.loader.exec_module

        def exec_module(module):
            os.kill(os.getpid(), signal.SIGTERM)  # `timeout`'s, as the module is made
            run_init(module)
            open(whole, "w").close()

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, StopThere())
sys.argv = ["trtbuild", *argv]
from trtbuild.cli import run
run()
"""


@pytest.mark.parametrize(
    "target", ["onnx.onnx_cpp2py_export", "onnxruntime.capi.onnxruntime_pybind11_state"]
)
def test_a_stop_waits_for_a_native_modules_init(tmp_path, target):
    """SIGTERM whose handler raised while onnx's or ONNX Runtime's native module was being
    made crashed the interpreter now and then (SIGSEGV, exit 139, `Fatal Python error`;
    ONNX Runtime's import also failed as 'import numpy failed'). The stop waits for the
    import to end, then ends the command as a stop: exit 143, nothing written."""
    import subprocess
    import sys

    from tests.helpers import F, model, node

    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    whole = tmp_path / "whole"
    argv = ["build", "--policy", "p.yaml", "--out", "out", "--no-cache"]
    cmd = [sys.executable, "-c", _STOP_IN_NATIVE_INIT, target, str(whole), *argv]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "terminated (SIGTERM)" in done.stderr
    assert whole.exists(), "the stop cut the native module's init short"
    assert not (tmp_path / "out").exists()


def test_a_stop_while_the_command_line_is_read_is_a_stop(tmp_path):
    """SIGTERM as the parser is made (argparse imports locale for its help, after
    trtbuild's handlers are set): a traceback and exit 1. It is a stop: exit 143."""
    import subprocess
    import sys

    whole = tmp_path / "whole"
    cmd = [sys.executable, "-c", _STOP_IN_NATIVE_INIT, "locale", str(whole), "schema"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr[-3000:]
    assert done.stderr == "trtbuild: terminated (SIGTERM); previous artifacts left as they were\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_stderr_keeps_the_exit_code(tmp_path):
    """stderr on a full disk (a CI log): the error line's own OSError, raised in main's
    handler, ended the process as Python's uncaught exception, exit 1, which the contract
    says is 'accuracy below tolerance'. The exit code is the error's: 2."""
    import subprocess
    import sys

    trtbuild = [sys.executable, "-m", "trtbuild"]
    for argv in (["check", "--policy", str(tmp_path / "none.yaml")], ["check"], ["--bogus"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([*trtbuild, *argv], stderr=full, timeout=300)
        assert done.returncode == 2, argv
