"""Faults of the machine around trtbuild are the user's to fix: exit 2 and one line that
names the path and the fix, never exit 70 and a traceback that calls them a bug.

A full disk is a real one: a 1 MiB tmpfs, filled (we run as root in CI). Where tmpfs
cannot be mounted, `os.replace` into it raises ENOSPC instead, in process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.helpers import TRTBUILD, F, model, needs_rtx, node, proc_stat
from trtbuild.cli import main
from trtbuild.errors import EXIT_BUG, exit_code_for


def _relu_policy(folder: Path) -> Path:
    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    (folder / "m.onnx").write_bytes(m.SerializeToString())
    (folder / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    return folder / "p.yaml"


def _mount(folder: Path, options: str) -> bool:
    cmd = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


class Disk:
    """A folder on a full (or read-only) file system, and how to run trtbuild against it."""

    def __init__(self, folder: Path, real: bool, monkeypatch, capsys) -> None:
        self.folder, self.real = folder, real
        self.monkeypatch, self.capsys = monkeypatch, capsys

    def run(self, argv: list[str], cwd: Path) -> tuple[int, str]:
        """The real CLI in a subprocess; in process with ENOSPC simulated as a fallback."""
        if self.real:
            done = subprocess.run(
                [TRTBUILD, *argv], cwd=cwd, capture_output=True, text=True, timeout=300
            )
            return done.returncode, done.stderr
        self.monkeypatch.chdir(cwd)
        self.capsys.readouterr()
        code = main(argv)
        return code, self.capsys.readouterr().err


@pytest.fixture(params=["full", "read-only"])
def disk(request, tmp_path, monkeypatch, capsys) -> Iterator[Disk]:
    folder = tmp_path / request.param
    folder.mkdir()
    ro = request.param == "read-only"
    real = _mount(folder, "size=1m,ro" if ro else "size=1m")
    if not real:  # no tmpfs here: the same error, raised where trtbuild renames into place
        code = errno.EROFS if ro else errno.ENOSPC
        replace = os.replace

        def refuse(src, dst, *args, **kwargs):
            if str(dst).startswith(str(folder)):
                raise OSError(code, os.strerror(code), str(dst))
            return replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", refuse)
    elif not ro:
        with open(folder / "filler", "wb") as f, pytest.raises(OSError, match="No space"):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    try:
        yield Disk(folder, real, monkeypatch, capsys)
    finally:
        if real:
            subprocess.run(["umount", str(folder)], check=True)


def _one_line(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("trtbuild: error:")]
    assert len(lines) == 1 and all(w in lines[0] for w in words), err


@pytest.mark.parametrize("command", ["build", "convert", "prepare", "tune", "nightly"])
def test_a_full_or_read_only_disk_is_exit_2_naming_the_path(command, disk, tmp_path):
    policy = _relu_policy(tmp_path)
    out, history = disk.folder / "out", str(tmp_path / "h.sqlite")
    argv = {
        "build": ["build", "--policy", str(policy), "--out", str(out)],
        "convert": ["convert", "--policy", str(policy), "-o", str(out)],
        "prepare": ["prepare", str(tmp_path / "m.onnx"), "-o", str(out)],
        "tune": ["tune", "--policy", str(policy), "-o", str(out), "--budget", "2"],
        "nightly": [
            "nightly",
            "--policies",
            str(tmp_path),
            "--out",
            str(out),
            "--history",
            history,
        ],
    }[command]
    if command == "nightly" and not disk.real:
        pytest.skip("the nightly's builds rename with os.rename, which the fallback leaves alone")
    code, err = disk.run(argv, tmp_path)
    fix = "free space on the disk" if disk.folder.name == "full" else "write to a writable folder"
    _one_line(code, err, str(disk.folder), fix)
    assert not [p for p in disk.folder.rglob("*") if p.is_file() and p.name != "filler"]
    if command == "tune" and disk.real and disk.folder.name == "read-only":
        assert "tune [" not in err, err  # said before the search, not after it


def test_the_nightly_records_a_full_disk_as_the_users_fault_not_a_bug(tmp_path, disk):
    from trtbuild.nightly.runner import run_policy

    result = run_policy(_relu_policy(tmp_path), disk.folder / "night", None)
    assert result.status == "error" and result.exit_code == 2, result.message
    assert str(disk.folder / "night") in result.message
    assert "internal error" not in result.message and "Traceback" not in result.message


def test_a_symlink_loop_as_out_is_exit_2(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert (
        main(["build", "--policy", str(_relu_policy(tmp_path)), "--out", str(tmp_path / "a")]) == 2
    )
    _one_line(2, capsys.readouterr().err, "a symlink loop", str(tmp_path / "a"))


@pytest.mark.parametrize("command", ["convert", "prepare"])
def test_a_folder_where_the_output_file_goes_is_exit_2(command, tmp_path, capsys):
    policy = _relu_policy(tmp_path)
    taken = tmp_path / "taken.onnx"
    (taken / "inside").mkdir(parents=True)
    argv = {
        "convert": ["convert", "--policy", str(policy), "-o", str(taken)],
        "prepare": ["prepare", str(tmp_path / "m.onnx"), "-o", str(taken)],
    }[command]
    assert main(argv) == 2
    _one_line(2, capsys.readouterr().err, f"{taken}: is a folder where a file goes")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    "argv, named",
    [
        (["convert", "--policy", "p.yaml", "-o", "p.yaml"], "-o names the policy this"),
        (["convert", "--policy", "p.yaml", "-o", "./sub/../m.onnx"], "-o names the policy's model"),
        (["convert", "--policy", "p.yaml", "-o", "link.onnx"], "-o names the policy's model"),
        (["prepare", "m.onnx", "-o", "link.onnx"], "-o names the model this"),
        (["tune", "--policy", "p.yaml", "-o", "m.onnx"], "-o names the policy's model"),
        (
            ["tune", "--policy", "p.yaml", "-o", "t.yaml", "--log", "p.yaml"],
            "--log names the policy",
        ),
        (
            ["tune", "--policy", "p.yaml", "-o", "t.yaml", "--log", "t.yaml"],
            "--log names the tuned policy (-o)",
        ),
    ],
)
def test_an_output_that_is_a_file_the_command_reads_is_exit_2(
    argv, named, tmp_path, capsys, monkeypatch
):
    # Before, `convert -o p.yaml` wrote the mixed model over the policy and said `wrote`.
    _relu_policy(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.onnx").symlink_to("m.onnx")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    _one_line(2, capsys.readouterr().err, named, "write to another path")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert not (tmp_path / "t.yaml").exists()


@pytest.mark.parametrize("how", ["policy", "prepare"])
def test_a_fifo_model_is_exit_2_at_once(how, tmp_path):
    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    argv = ["build", "--policy", "p.yaml"] if how == "policy" else ["prepare", "m.onnx", "-o", "x"]
    started = time.monotonic()
    done = subprocess.run(
        [TRTBUILD, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    _one_line(done.returncode, done.stderr, "FIFO")
    assert time.monotonic() - started < 30


def test_a_device_as_the_model_is_exit_2_before_it_is_read(tmp_path, capsys):
    assert main(["prepare", "/dev/zero", "-o", str(tmp_path / "x.onnx")]) == 2
    _one_line(2, capsys.readouterr().err, "/dev/zero", "character device")


def _reshape_policy(folder: Path) -> Path:
    """A model ONNX Runtime cannot run on the policy's shape: it would log in colour."""
    m = model(
        [node("Reshape", ["x", "s"], "y", "rs")],
        [("x", F, [1, 4])],
        [("y", F, [3, 5])],
        {"s": np.array([3, 5], np.int64)},
    )
    (folder / "m.onnx").write_bytes(m.SerializeToString())
    (folder / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    return folder / "p.yaml"


def test_onnxruntimes_log_never_reaches_the_terminal(tmp_path):
    done = subprocess.run(
        [TRTBUILD, "build", "--policy", str(_reshape_policy(tmp_path))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "[E:onnxruntime" not in done.stderr and "\x1b" not in done.stderr, done.stderr
    assert done.stderr.startswith("trtbuild: error:") and done.stderr.count("\n") == 1


def test_control_characters_of_a_key_are_escaped(tmp_path, capsys):
    (tmp_path / "p.yaml").write_text('version: 1\nmodel: m.onnx\n"\\e[31mred\\nline": 1\n')
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("\n") == 1, err
    assert "\\x1b[31mred\\nline" in err


def test_one_mapping_from_exceptions_to_exit_codes():
    assert exit_code_for(OSError(errno.EDQUOT, "Disk quota exceeded", "/q/x"))[0] == 2
    assert exit_code_for(PermissionError(errno.EACCES, "Permission denied", "/p"))[1] == (
        "/p: permission denied (check permissions of /p)"
    )
    assert exit_code_for(OSError(errno.EIO, "Input/output error", "/x"))[0] == 2  # the disk's
    assert exit_code_for(OSError(errno.EINVAL, "Invalid argument", "/x"))[0] == EXIT_BUG
    assert exit_code_for(KeyError("x"))[0] == EXIT_BUG
    # the process's limits (ulimit -u, a container's pids.max): threading's word for EAGAIN
    code, said = exit_code_for(RuntimeError("can't start new thread"))
    assert code == 2 and "ulimit -u" in said, said
    assert exit_code_for(OSError(errno.ENFILE, "Too many open files in system"))[0] == 2
    code, said = exit_code_for(MemoryError("Unable to allocate 2.00 GiB"))  # under ulimit -v
    assert code == 2 and said.startswith("not enough memory (free memory"), said
    assert json.loads(json.dumps(exit_code_for(ValueError("\x1b[2J"))))[1].endswith("\\x1b[2J")


def _address_space() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmSize")
def test_onnx_runtime_refused_memory_is_exit_2_not_a_bug():
    """A session's run under `ulimit -v` (or on a full machine): ONNX Runtime raises its
    own `Fail` ("Failed to allocate memory for requested buffer"), never MemoryError, and
    a build under `ulimit -v 600000` ended as a bug (exit 70) in the emulation's run. A
    real session, its 1 GiB Expand refused by a real limit."""
    import resource

    from tests.helpers import plain_session

    big = np.array([1, 1 << 28], np.int64)
    m = model(
        [node("Expand", ["x", "s"], "y", "grow"), node("Relu", ["y"], "z", "relu")],
        [("x", F, [1, 1])],
        [("z", F, [1, 1 << 28])],
        {"s": big},
    )
    session = plain_session(m)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + (256 << 20), hard))
    try:
        with pytest.raises(Exception) as refused:
            session.run(None, {"x": np.ones((1, 1), np.float32)})
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert type(refused.value).__module__.startswith("onnxruntime"), refused.value
    code, said = exit_code_for(refused.value)
    assert code == 2 and said.startswith("not enough memory"), said


@needs_rtx
def test_a_low_open_file_limit_is_exit_2_naming_it(tmp_path):
    """`ulimit -n 16` (a container's): the engine build child's pipes could not be made
    (EMFILE) and the build said it was a bug (exit 70). It is the limit's: exit 2, named.
    Where the command first runs out of descriptors depends on the machine, so the limit
    is raised from 12 until the build passes, and every run before must be exit 2."""
    import resource

    policy = _relu_policy(tmp_path)
    policy.write_text(policy.read_text().replace("backend: none", "backend: tensorrt-rtx"))
    cmd = [sys.executable, "-m", "trtbuild", "build", "--policy", str(policy)]
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    refused = []
    for limit in range(12, 64, 2):

        def limited(n: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

        run = [*cmd, "--out", str(tmp_path / f"out{limit}")]
        done = subprocess.run(run, capture_output=True, text=True, preexec_fn=limited, env=env)
        if done.returncode == 0:
            break
        assert done.returncode == 2, (limit, done.stderr[-2000:])
        assert "open files" in done.stderr and "Traceback" not in done.stderr, done.stderr
        refused.append(limit)
    assert refused and done.returncode == 0, refused


@pytest.mark.parametrize("command", ["convert", "build"])
def test_a_file_size_limit_is_exit_2_naming_it_and_leaves_nothing(tmp_path, command):
    """`ulimit -f` (a CI job's, a container's; a FAT disk's 4 GiB is the same EFBIG): a
    write past it was a traceback called a bug (exit 70). It is the limit's: exit 2
    naming the file and the limit, and no output nor temporary file is left."""
    import resource

    weight = np.ones((1, 16384), np.float32)  # 64 KiB of weights: every model file is larger
    m = model(
        [node("Mul", ["x", "w"], "y", "mul")],
        [("x", F, [1, 16384])],
        [("y", F, [1, 16384])],
        {"w": weight},
    )
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    out = tmp_path / ("mixed.onnx" if command == "convert" else "out")
    flag = "-o" if command == "convert" else "--out"
    before = set(os.listdir(tmp_path))

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, 32 << 10))

    cmd = [sys.executable, "-m", "trtbuild", command, "--policy", str(policy), flag, str(out)]
    done = subprocess.run(
        [*cmd, "--no-cache"], capture_output=True, text=True, preexec_fn=limited, timeout=300
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "ulimit -f" in done.stderr, done.stderr
    assert str(out) in done.stderr, done.stderr
    assert set(os.listdir(tmp_path)) == before  # no output, no temporary, no staging folder


def test_a_removed_working_folder_is_no_bug(tmp_path):
    """A CI step's or a Makefile's temporary folder removed under trtbuild: every command
    was exit 70 (pathlib's cwd() to show the policy's path), absolute paths too. Absolute
    paths work; a relative one is exit 2 saying the working folder was removed."""
    policy = _relu_policy(tmp_path)
    gone = tmp_path / "gone"
    gone.mkdir()

    def run(*argv: str) -> subprocess.CompletedProcess:
        line = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "trtbuild", *argv))
        script = f'cd {shlex.quote(str(gone))} && rmdir "$PWD" && exec {line}'
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=300)

    done = run("convert", "--policy", str(policy), "-o", str(tmp_path / "mixed.onnx"))
    assert done.returncode == 0 and (tmp_path / "mixed.onnx").is_file(), done.stderr
    gone.mkdir()
    done = run("convert", "--policy", str(policy), "-o", "mixed.onnx")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "the working folder was removed" in done.stderr, done.stderr


# In a mount namespace of its own: the test's folder at /mnt/w, the repository at /mnt/src,
# the interpreter's environment (the virtualenv) at /mnt/env, then every temporary folder
# Python would try (TMPDIR=/tmp, /var/tmp, /usr/tmp) and the working folder read-only,
# as in a container run with a read-only root (`docker run --read-only`) and no tmpfs
_NO_TEMPORARY_FOLDER = """
set -e
mount -t tmpfs tmpfs /mnt
mkdir /mnt/w
mount --bind "$1" /mnt/w
mkdir /mnt/src
mount --bind "$2" /mnt/src
mkdir /mnt/env
mount --bind "$3" /mnt/env
shift 3
for folder in /tmp /var/tmp /usr/tmp; do
    if [ -d "$folder" ]; then mount -t tmpfs -o ro,size=1m tmpfs "$folder"; fi
done
mkdir -p /mnt/w/cwd
mount -t tmpfs -o ro,size=1m tmpfs /mnt/w/cwd
cd /mnt/w/cwd
exec "$@"
"""


def _without_temporary_folder(
    tmp_path: Path, argv: list[str], env: dict[str, str], timeout: int
) -> subprocess.CompletedProcess:
    """`python -m trtbuild ARGV` in `_NO_TEMPORARY_FOLDER`'s container, the interpreter
    read from /mnt/env: a clone under /tmp (CI's) had its virtualenv hidden by the
    read-only /tmp, and the interpreter was not found (exit 127)."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("needs a mount namespace of its own (unshare -m, as root)")
    prefix = os.path.realpath(sys.prefix)
    inside = os.path.relpath(os.path.abspath(sys.executable), sys.prefix)
    python = sys.executable if inside.startswith("..") else f"/mnt/env/{inside}"
    env = {**env, "PYTHONPATH": "/mnt/src"}  # this trtbuild, wherever its folder is
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", _NO_TEMPORARY_FOLDER, "sh"]
    cmd += [str(tmp_path), str(ROOT), prefix, python, "-m", "trtbuild", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def test_no_temporary_folder_is_no_bug(tmp_path):
    """A container with a read-only root and no writable /tmp, TMPDIR or working folder:
    `check` ended as a bug (exit 70, tempfile's 'No usable temporary directory found')
    where ONNX Runtime's import caught its stderr in a temporary file."""
    policy = _relu_policy(tmp_path)
    env = {**os.environ, "TMPDIR": "/tmp", "TRTBUILD_CACHE_DIR": "/mnt/w/cache"}
    argv = ["check", "--policy", f"/mnt/w/{policy.name}"]
    done = _without_temporary_folder(tmp_path, argv, env, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "warning" not in done.stderr, done.stderr


@needs_rtx
def test_no_temporary_folder_builds_the_engines_and_the_report(tmp_path):
    """The same container: `build` wrote its all-FP16/FP32 variants' models in a temporary
    folder, and Matplotlib's font cache went to one (HOME's not writable): each ended the
    build as a bug (exit 70). Both are made in the staging folder now, and not published."""
    policy = _relu_policy(tmp_path)
    policy.write_text(policy.read_text().replace("backend: none", "backend: tensorrt-rtx"))
    env = {**os.environ, "TMPDIR": "/tmp", "TRTBUILD_CACHE_DIR": "/mnt/w/cache"}
    env.update(HOME="/mnt/w/cwd")  # HOME read-only too
    argv = ["build", "--policy", f"/mnt/w/{policy.name}", "--out", "/mnt/w/out"]
    done = _without_temporary_folder(tmp_path, argv, env, 600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    built = json.loads((tmp_path / "out" / "build.json").read_text())
    assert set(built["engines"]) == {"policy", "fp16", "fp32"}, built["engines"].keys()
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith((".variants", ".mat"))]


def test_no_temporary_folder_draws_the_nights_trends(tmp_path):
    """The same container, a night with workers (`--jobs 2`): the builds imported
    Matplotlib in the workers, and the night's own trends found no folder for its font
    cache: exit 70 once the night was recorded. Matplotlib is given one in OUT."""
    policies = tmp_path / "policies"
    policies.mkdir()
    _relu_policy(policies)
    env = {**os.environ, "TMPDIR": "/tmp", "TRTBUILD_CACHE_DIR": "/mnt/w/cache"}
    env.update(HOME="/mnt/w/cwd")  # HOME read-only too
    night = ["nightly", "--policies", "/mnt/w/policies", "--out", "/mnt/w/out", "--jobs", "2"]
    night += ["--history", "/mnt/w/h.sqlite", "--run-id", "r1"]
    done = _without_temporary_folder(tmp_path, night, env, 600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "trends" / "p.png").is_file()
    assert not (tmp_path / "out" / ".matplotlib").exists()


def test_the_nightly_history_holds_a_full_disk_as_exit_2(tmp_path, disk):
    import sqlite3

    policies = tmp_path / "policies"
    policies.mkdir()
    _relu_policy(policies)
    out = tmp_path / "night"
    out.mkdir()
    (out / ".trtbuild-output").write_text("{}")  # an earlier night's folder
    (out / "p").symlink_to(disk.folder / "p")  # the policy's build folder is on that disk
    argv = ["nightly", "--policies", str(policies), "--out", str(out)]
    code, err = disk.run([*argv, "--history", str(tmp_path / "h.sqlite")], tmp_path)
    assert code == 1 and "Traceback" not in err, err  # the night ran; a policy errored
    with sqlite3.connect(tmp_path / "h.sqlite") as db:
        assert db.execute("SELECT status, exit_code FROM results").fetchall() == [("error", 2)]
    message = json.loads((out / "nightly.json").read_text())["results"][0]["message"]
    assert str(disk.folder / "p") in message and "internal error" not in message


# -- ONNX Runtime's check of the mixed model, in a child process (#45) ------------------


def _relu_model():
    return model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie nobody reaped has ended too)."""
    try:
        state = proc_stat(pid)[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_a_stopped_child_ends_in_exit_2_within_its_timeout():
    from trtbuild.precision.validate import CheckFailed, start_mixed_check

    check = start_mixed_check(_relu_model(), None, timeout=2)
    pid = check.proc.pid
    os.kill(pid, signal.SIGSTOP)  # as a debugger, a frozen cgroup or a swap storm does
    started = time.monotonic()
    with pytest.raises(CheckFailed) as caught:
        check.result()
    assert time.monotonic() - started < 30 and _gone(pid)
    said = str(caught.value)
    assert "gave no answer within 2 s" in said and "build.ort_check_timeout" in said
    assert "0 to skip this check" in said and caught.value.exit_code == 2


def test_a_child_killed_by_a_signal_is_exit_2_naming_memory_and_the_skip():
    """SIGKILL is what the kernel's OOM killer sends: the machine's fault, not a bug."""
    from trtbuild.precision.validate import CheckFailed, start_mixed_check

    check = start_mixed_check(_relu_model(), None)
    os.kill(check.proc.pid, signal.SIGKILL)
    with pytest.raises(CheckFailed) as caught:
        check.result()
    said = str(caught.value)
    assert "killed (SIGKILL)" in said and "out of memory" in said, said
    assert "build.ort_check_timeout: 0" in said and caught.value.exit_code == 2


def test_a_timeout_of_0_skips_the_check_and_records_no_pass(tmp_path):
    from trtbuild import cache_codec
    from trtbuild.cache import Cache
    from trtbuild.precision.validate import start_mixed_check

    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    skipped = start_mixed_check(_relu_model(), cache, timeout=0)
    assert skipped.proc is None and skipped.result() == []
    assert cache.entries() == []  # no record: a later check with a timeout loads it
    check = start_mixed_check(_relu_model(), cache)
    assert check.proc is not None
    check.cancel()


def test_a_child_that_cannot_start_is_exit_2(tmp_path, monkeypatch):
    from trtbuild.precision.validate import CheckFailed, start_mixed_check

    monkeypatch.setattr(sys, "executable", str(tmp_path))  # a folder: exec fails (EACCES)
    with pytest.raises(CheckFailed, match="could not start a child process"):
        start_mixed_check(_relu_model(), None)


def test_a_child_that_prints_garbage_and_exits_is_an_outcome_not_a_crash():
    from trtbuild.precision import ort_child

    for printed in ("garbage {", ort_child.RESULT + "{not json", ort_child.RESULT + "[1]"):
        proc = subprocess.Popen(
            [sys.executable, "-c", f"print({printed!r}); raise SystemExit(3)"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        said = ort_child.outcome(proc, 60)
        assert not said.ok and said.crash == "exit code 3" and not said.killed, said


def test_the_child_is_isolated_from_pythonpath_and_sitecustomize(tmp_path, monkeypatch):
    """A sitecustomize or an `onnxruntime.py` on PYTHONPATH would decide the check."""
    from trtbuild.precision.validate import validate_mixed

    planted = tmp_path / "planted"
    planted.mkdir()
    ran = tmp_path / "ran"
    (planted / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    (planted / "onnxruntime.py").write_text("raise SystemExit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(planted))
    monkeypatch.setenv("PYTHONSTARTUP", str(planted / "sitecustomize.py"))
    assert validate_mixed(_relu_model(), None) == []
    assert not ran.exists()


ONLY_ON_PYTHONPATH = """
import sys
from tests.helpers import F, model, node
from trtbuild.precision.validate import validate_mixed

m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
print(validate_mixed(m, None))
"""


def test_the_child_imports_onnxruntime_from_where_the_parent_does(tmp_path):
    """ONNX Runtime reached only through PYTHONPATH (or the user site, `pip install
    --user`), not the interpreter's own site-packages: `-I` alone drops it, and the check
    called every mixed model broken (exit 70). The child takes the parent's import path."""
    import onnxruntime

    from tests.conftest import ROOT

    base = os.path.realpath(sys.executable)  # the interpreter under the virtualenv
    found = str(Path(onnxruntime.__file__).resolve().parents[1])
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join([str(ROOT), found])}
    done = subprocess.run(
        [base, "-c", ONLY_ON_PYTHONPATH], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


CHECK_THEN_DIE = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from tests.helpers import F, model, node
from trtbuild.precision.validate import start_mixed_check

m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
check = start_mixed_check(m, None)
print(check.proc.pid, *(p.pid for p in check.spares.idle), flush=True)  # loading, and spares
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_parent_leaves_no_child_and_no_temporary_folder(tmp_path):
    from tests.conftest import ROOT

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", CHECK_THEN_DIE, str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    children = [int(pid) for pid in done.stdout.split()]
    assert len(children) >= 2  # the loading child and a spare
    deadline = time.monotonic() + 30
    while not all(map(_gone, children)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(map(_gone, children)), "a child of the check outlived trtbuild"
    # ONNX Runtime's own telemetry session file (`.ses`, written in TMPDIR by any process
    # that imports it) is not a folder of trtbuild's
    assert [p.name for p in tmp_path.iterdir() if p.name != ".ses"] == []


def _child_of(pid: int) -> int | None:
    """The ONNX Runtime check's child of process `pid`, where one runs."""
    from trtbuild.precision import ort_child

    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for kid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes()
                if ort_child.CHILD.encode() in cmdline.split(b"\0"):  # its -c program
                    return int(kid)
    return None


def test_a_build_whose_check_is_stopped_is_exit_2_saying_what_to_set(tmp_path):
    policy = _relu_policy(tmp_path)
    policy.write_text(
        policy.read_text().replace("{backend: none}", "{backend: none, ort_check_timeout: 3}")
    )
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [TRTBUILD, "build", "--policy", str(policy), "--out", str(tmp_path / "out")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, child = time.monotonic() + 120, None
    while child is None and proc.poll() is None and time.monotonic() < deadline:
        child = _child_of(proc.pid)
    if child is None:
        proc.communicate()
        pytest.skip("the check's child ended before it could be stopped")
    os.kill(child, signal.SIGSTOP)
    _, err = proc.communicate(timeout=300)
    _one_line(proc.returncode, err, "gave no answer within 3 s", "build.ort_check_timeout")
    assert not (tmp_path / "out").exists() and _gone(child)


# -- deep nesting, -o under a file, an unwritable HOME (#45) ------------------------------


@pytest.mark.parametrize("depth", [33, 500, 20_000])
def test_a_policy_nested_deep_is_exit_2_naming_the_line(tmp_path, capsys, depth):
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\nprecision:\n  extra: " + "[" * depth + "]" * depth + "\n"
    )
    assert main(["check", "--policy", str(tmp_path / "p.yaml")]) == 2
    _one_line(2, capsys.readouterr().err, f"{tmp_path / 'p.yaml'}:4", "nests deeper than 32")


def test_a_mapping_nested_deep_is_exit_2():
    from trtbuild.errors import UsageError
    from trtbuild.policy.load import mapping_fields

    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(UsageError, match="nests deeper than 32"):
        mapping_fields({"version": 1, "model": "m.onnx", "x": deep}, Path("/"))


@pytest.mark.parametrize("command", ["convert", "prepare"])
def test_an_output_under_a_file_is_exit_2_before_any_work(command, tmp_path, capsys):
    policy = _relu_policy(tmp_path)
    (tmp_path / "FILE").write_text("the user's")
    out = str(tmp_path / "FILE" / "x.onnx")
    argv = {
        "convert": ["convert", "--policy", str(policy), "-o", out],
        "prepare": ["prepare", str(tmp_path / "m.onnx"), "-o", out],
    }[command]
    assert main(argv) == 2
    _one_line(
        2, capsys.readouterr().err, f"{tmp_path / 'FILE'}: a part of the output path is a file"
    )
    assert (tmp_path / "FILE").read_text() == "the user's"


@pytest.mark.parametrize(
    "command",
    [
        ["build", "--out", "out"],
        ["convert", "--no-cache", "-o", "mixed.onnx"],
        ["check", "--no-cache"],
    ],
)
def test_an_unwritable_home_prints_no_line_of_onnx_runtime_or_matplotlib(tmp_path, command):
    """ONNX Runtime logs from C++ at import where it cannot persist its telemetry id (a
    `convert` imports it only where a stage needs it: its passes here, without a cache)."""
    policy = _relu_policy(tmp_path)
    (tmp_path / "home").write_text("HOME is a file: nothing can be made under it")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "TRTBUILD_CACHE_DIR": str(tmp_path / "c")}
    env.pop("XDG_CACHE_HOME", None)
    env.pop("MPLCONFIGDIR", None)
    where = [str(tmp_path / a) if a in ("out", "mixed.onnx") else a for a in command]
    done = subprocess.run(
        [TRTBUILD, where[0], "--policy", str(policy), *where[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and "onnxruntime" not in done.stderr, done.stderr
    assert "atplotlib" not in done.stderr, done.stderr
    assert all(line.startswith("trtbuild:") for line in done.stderr.splitlines()), done.stderr


# -- external data: read only what the model names, and only beside it (#45) -------------

PEAK = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(done.stderr)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _external_model(folder: Path, location: str, data: Path, size: int = 3 << 30) -> Path:
    """m.onnx: y = x + w, w's 2 KB at the end of a sparse `size`-byte file `data`."""
    from onnx import TensorProto, helper

    w = np.arange(512, dtype=np.float32)
    with open(data, "wb") as f:
        f.truncate(size)  # sparse: no disk taken
        f.seek(size - w.nbytes)
        f.write(w.tobytes())
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[512])
    tensor.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(size - w.nbytes)), ("length", "2048")):
        tensor.external_data.add(key=k, value=v)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])],
        [tensor],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (folder / "m.onnx").write_bytes(m.SerializeToString())
    (folder / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    return folder / "p.yaml"


def _peak(argv: list[str], env: dict) -> tuple[int, int, str]:
    """Exit code, peak resident KiB of the command and its children, and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, *argv], env=env, capture_output=True, text=True, timeout=600
    )
    code, peak = done.stdout.split()
    return int(code), int(peak), done.stderr


def test_the_cache_key_of_external_data_reads_the_bytes_the_model_names(tmp_path):
    """A 2 KB tensor in a 3 GiB file took 3.2 GB for the cache key; now kilobytes."""
    policy = _external_model(tmp_path, "w.bin", tmp_path / "w.bin")
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # cold (the key, then the model), warm (the key only)
        code, peak, err = _peak([TRTBUILD, "check", "--policy", str(policy)], env)
        assert code == 0, err
        assert peak < 1 << 20, f"{peak} KiB"  # < 1 GiB: the file is 3 GiB
    from trtbuild.graph.model_io import model_digest

    before = model_digest(tmp_path / "m.onnx")
    with open(tmp_path / "w.bin", "r+b") as f:
        f.seek((3 << 30) - 4)
        f.write(b"\x01\x02\x03\x04")  # one weight changed: another key
    assert model_digest(tmp_path / "m.onnx") != before


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_external_data_outside_the_models_folder_is_refused_before_any_read(tmp_path, where):
    folder = tmp_path / "model"
    folder.mkdir()
    outside = tmp_path / "big.bin"
    location = {"parent": "../big.bin", "absolute": str(outside), "symlink": "link.bin"}[where]
    policy = _external_model(folder, location, outside)
    (folder / "link.bin").symlink_to(outside)
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    code, peak, err = _peak([TRTBUILD, "check", "--policy", str(policy)], env)
    _one_line(code, err, str(folder / "m.onnx"), "outside the model's folder", location)
    assert peak < 1 << 20, f"{peak} KiB"


@pytest.mark.parametrize("length", [True, False])
def test_a_model_past_2_gib_with_its_data_is_exit_2_without_loading_it(tmp_path, length):
    """Every stage holds the model as one protobuf message: with 2.2 GiB of weights in a
    file, the load read them all and failed at its check (exit 70, a traceback). The
    sizes (`length`, or the file's size) say it before the load reads a byte of them
    (the cache key streams them: kilobytes held)."""
    from onnx import TensorProto, helper

    n = (2200 << 20) // 4
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(n * 4)  # sparse: no disk taken
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[n])
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="w.bin")
    if length:
        tensor.external_data.add(key="length", value=str(n * 4))
    x, y = (helper.make_tensor_value_info(t, TensorProto.FLOAT, [n]) for t in "xy")
    add = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    graph = helper.make_graph([add], "g", [x], [y], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    code, peak, err = _peak([TRTBUILD, "check", "--policy", str(tmp_path / "p.yaml")], env)
    _one_line(code, err, str(tmp_path / "m.onnx"), "2.1 GiB", "2 GiB", "quantize")
    assert peak < 1 << 20, f"{peak} KiB"


def test_a_tensor_marked_external_without_a_file_is_exit_2_naming_it(tmp_path, capsys):
    """A tensor whose data would be in a file it does not name: refused in one line naming
    it (onnx.checker's words: bytes without the key `location` name no data file, so no
    tensor is walked for one), before anything is read."""
    import onnx

    m = model(
        [node("Add", ["x", "w"], "y", "add")], [("x", F, [2])], [("y", F, [2])], {"w": [1.0, 2.0]}
    )
    m.graph.initializer[0].data_location = onnx.TensorProto.EXTERNAL
    m.graph.initializer[0].ClearField("raw_data")
    onnx.save(m, tmp_path / "m.onnx")
    assert b"location" not in (tmp_path / "m.onnx").read_bytes()
    code = main(["prepare", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "p.onnx")])
    err = capsys.readouterr().err
    _one_line(code, err, "m.onnx", "location")
    assert re.search(r"\bw\b", err), err  # the tensor named (in onnx.checker's words)


def test_a_fifo_as_an_earlier_builds_record_does_not_hang_report(tmp_path):
    policy = _relu_policy(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    (out / "build.json").unlink()
    os.mkfifo(out / "build.json")  # a read that waited for a writer would hang here
    done = subprocess.run(
        [TRTBUILD, "report", "--policy", str(policy), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_a_closed_stderr_is_no_bug(tmp_path):
    """`2>&-` (a cron line, a service): ONNX Runtime's quiet import flushed and duplicated
    the missing stream, exit 70 with nothing written; from the library, `sys.stderr` None
    (pythonw) the same. Now the command opens the null device there and runs."""
    policy = _relu_policy(tmp_path)
    rule = "precision: {rules: [{id: none, match: {op: Conv}, precision: fp32}]}\n"
    policy.write_text(policy.read_text() + rule)  # a rule that matches nothing: a warning
    done = subprocess.run(
        ["sh", "-c", f'"{TRTBUILD}" build --policy "{policy}" --out out 2>&-'],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "wrote " in done.stdout, done.stdout
    assert "warning" not in done.stdout  # said on the null device, not mixed into stdout
    assert json.loads((tmp_path / "out" / "report.json").read_text())["passed"]
    script = (
        "import sys; sys.stderr = None\nimport trtbuild\n"
        f"print(trtbuild.build({str(policy)!r}, out='lib', backend='none').passed)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_a_policy_name_that_is_not_utf8_is_no_bug(tmp_path, capsys):
    """Linux names are bytes: `g\\xfe.yaml` (Latin-1) is read with a lone surrogate, which
    report.md (UTF-8) could not hold (exit 70 with nothing written), nor tune's YAML."""
    policy = tmp_path / os.fsdecode(b"g\xfe.yaml")
    policy.write_text(_relu_policy(tmp_path).read_text())
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "out")]) == 0
    assert "g\\xfe.yaml" in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    tuned = tmp_path / os.fsdecode(b"t\xfe.yaml")
    assert main(["tune", "--policy", str(policy), "-o", str(tuned)]) == 0
    assert "from g\\xfe.yaml" in tuned.read_text(encoding="utf-8")


def test_every_wrote_line_spells_a_name_that_is_not_utf8_as_its_byte(tmp_path, capsys):
    """`wrote g\\xfe.onnx`, as docs/cli.md says every message spells it: `convert` and the
    nightly printed the lone surrogate Python read (`g\\udcfe`), a name no file has."""
    policies = tmp_path / "policies"
    policies.mkdir()
    _relu_policy(policies)
    mixed = tmp_path / os.fsdecode(b"g\xfe.onnx")
    assert main(["convert", "--policy", str(policies / "p.yaml"), "-o", str(mixed)]) == 0
    out = tmp_path / os.fsdecode(b"n\xfe")
    history = tmp_path / os.fsdecode(b"h\xfe.sqlite")
    argv = ["--policies", str(policies), "--out", str(out), "--history", str(history)]
    assert main(["nightly", *argv]) == 0
    said = capsys.readouterr().out
    assert "wrote " + str(tmp_path) + "/g\\xfe.onnx:" in said, said
    assert "/n\\xfe/summary.md" in said and "history " + str(tmp_path) + "/h\\xfe.sqlite" in said
    assert "\udcfe" not in said


def test_a_tensor_marked_external_without_a_file_beside_large_weights_is_said_so(tmp_path, capsys):
    """Where the model's weights are large (its tensors walked, not its bytes searched) or
    the model is text, such a tensor was "keeps its data in '', outside the model's
    folder": exit 2 either way, now naming what is wrong."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = model(
        [node("Add", ["x", "w"], "y", "add")], [("x", F, [2])], [("y", F, [2])], {"w": [1.0, 2.0]}
    )
    big = numpy_helper.from_array(np.zeros((4, 4096), np.float32), "unused")
    m.graph.initializer.append(big)  # 64 KiB for 1 node: its tensors are walked
    m.graph.initializer[0].data_location = onnx.TensorProto.EXTERNAL
    m.graph.initializer[0].ClearField("raw_data")
    for name in ("m.onnx", "m.textproto"):  # binary, and onnx's text format
        onnx.save(m, tmp_path / name)
        code = main(["prepare", str(tmp_path / name), "-o", str(tmp_path / "p.onnx")])
        _one_line(code, capsys.readouterr().err, name, "names none (its external_data has no")
