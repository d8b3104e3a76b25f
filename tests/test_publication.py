"""Publication of an output folder: whole or not at all, and only into a folder that is
trtbuild's.

The kills are real SIGKILLs of real processes (`trtbuild build --backend none`, or a
small driver calling `staged_output`), stopped at every step of a publication by
`fsutil.TEST_HOOK`; the out folder must then hold a whole old set or a whole new
one, and the next publication removes what the killed one left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import TRTBUILD, F, model, node
from trtbuild.cli import main
from trtbuild.fsutil import MARKER, TEST_HOOK, clean_leftovers

SETS = ("build.json", "report.json", "mixed.onnx")

# writes one generation of a build's files through staged_output; argv: OUT GENERATION
DRIVER = """
import json
import sys
from pathlib import Path
from trtbuild.artifacts import BUILD_FILES, staged_output

record = {"policy": sys.argv[2], "versions": {"trtbuild": "0"}, "hashes": {"policy": "a" * 64}}
with staged_output(Path(sys.argv[1]), BUILD_FILES) as stage:
    for name in ("build.json", "report.json", "mixed.onnx"):
        (stage / name).write_text(sys.argv[2])
    (stage / "build.json").write_text(json.dumps(record))  # as trtbuild's: its keys
"""


def _drive(out: Path, generation: str, hook: str = "") -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), TEST_HOOK: hook}
    cmd = [sys.executable, "-c", DRIVER, str(out), generation]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=120).returncode


def _generations(out: Path) -> set[str]:
    found = {(out / name).read_text() for name in SETS if name != "build.json"}
    return found | {json.loads((out / "build.json").read_text())["policy"]}


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("mode", ["exchange", "portable"])
def test_a_kill_at_any_step_of_publication_leaves_a_whole_set(tmp_path, mode):
    out = tmp_path / "out"
    assert _drive(out, "old") == 0
    (out / "notes.txt").write_text("the user's")  # not trtbuild's: it must survive
    kills = 0
    for step in range(1, 30):
        hook = f"kill-at={step}" + (",portable" if mode == "portable" else "")
        code = _drive(out, "new", hook)
        assert code in (0, -signal.SIGKILL)
        if mode == "portable":  # a kill between its two renames is undone by the next one
            clean_leftovers(tmp_path, "out")
        assert _generations(out) in ({"old"}, {"new"}), f"step {step}: a mixed set"
        assert (out / "notes.txt").read_text() == "the user's"
        assert json.loads((out / MARKER).read_text())["command"] == "build"
        if code == 0:
            break
        kills += 1
        assert _drive(out, "old") == 0  # the next publication: the old set, leftovers gone
        assert _leftovers(tmp_path) == [], step
    assert kills >= 3, "the hook stopped no step of the publication"
    assert _generations(out) == {"new"}
    assert _leftovers(tmp_path) == []


def test_a_staging_folder_is_alive_while_its_lock_is_held_whatever_its_name(tmp_path):
    import fcntl

    orphan = tmp_path / ".out.staging-abc_1234"  # no process holds it: a dead build's
    orphan.mkdir()
    (orphan / "engine.plan").write_bytes(b"\0" * 1000)
    dead_pid = tmp_path / f".out.staging-{2**22 + 7}-x_x_x_x_"  # an older trtbuild's name
    dead_pid.mkdir()
    live = tmp_path / ".out.staging-xyzxyzxy"  # named like a dead one, but held
    live.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert _drive(out := tmp_path / "out", "new") == 0
        assert not orphan.exists() and not dead_pid.exists() and live.is_dir()
    finally:
        os.close(fd)
    assert _generations(out) == {"new"}


def test_a_users_folders_named_like_leftovers_of_another_output_are_left_alone(tmp_path):
    """Only this output's leftovers, named as trtbuild names them, are settled: a user's
    `.website.staging-eu`, or a dead build's folder of another output, are not this run's."""
    mine = tmp_path / ".website.staging-eu"
    mine.mkdir()
    (mine / "index.html").write_text("precious")
    empty = tmp_path / ".thesis.old-v1"
    empty.mkdir()
    other = tmp_path / ".other.staging-abcdefgh"  # another output's: its own build settles it
    other.mkdir()
    near = [tmp_path / ".out.staging-eu", tmp_path / ".out.old-v1"]  # this output's name, not
    for folder in near:  # trtbuild's suffix (mkdtemp's 8 characters, token_hex's 16)
        folder.mkdir()
    assert _drive(tmp_path / "out", "new") == 0
    assert (mine / "index.html").read_text() == "precious"
    assert empty.is_dir() and other.is_dir() and all(f.is_dir() for f in near)


# stages one generation, says where, and publishes it once told; argv: OUT GENERATION
WAITING = DRIVER.replace(
    "        (stage / name).write_text(sys.argv[2])\n",
    "        (stage / name).write_text(sys.argv[2])\n"
    "    print(stage, flush=True)\n"
    "    sys.stdin.readline()\n",
)


def _waiting(out: Path, generation: str) -> subprocess.Popen:
    """A publication of `generation` into `out` that prints its staging folder and waits
    for a line on its stdin before it publishes."""
    return subprocess.Popen(
        [sys.executable, "-c", WAITING, str(out), generation],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_one_publication_at_a_time_into_a_parent_folder(tmp_path):
    """A publication waits for the one under way in the same parent: a `report` carrying
    the old set while a `build` published its new one swapped the build's set away."""
    import fcntl

    out = tmp_path / "out"
    assert _drive(out, "old") == 0
    waiting = _waiting(out, "new")
    held = os.open(tmp_path, os.O_RDONLY)
    try:
        assert Path(waiting.stdout.readline().strip()).is_dir()  # staged, not published
        fcntl.flock(held, fcntl.LOCK_EX)  # another publication into tmp_path under way
        waiting.stdin.write("\n")
        waiting.stdin.flush()
        time.sleep(1.5)
        assert waiting.poll() is None and _generations(out) == {"old"}  # it waits
    finally:
        os.close(held)  # that publication ends
    waiting.stdin.close()
    assert waiting.wait(timeout=120) == 0
    assert _generations(out) == {"new"}


def test_a_build_in_another_pid_namespace_leaves_a_running_builds_staging_alone(tmp_path):
    """A container beside a running build (#45): it sees no such PID, yet the lock holds."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is refused here: {probe.stderr.decode().strip()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out"
    assert _drive(out, "old") == 0
    running = _waiting(out, "new")
    try:
        stage = Path(running.stdout.readline().strip())
        assert stage.is_dir()
        cmd = ["unshare", "--pid", "--fork", sys.executable, "-c", DRIVER]
        other = subprocess.run([*cmd, str(out), "x"], env=env, timeout=120)  # the same out
        assert other.returncode == 0 and stage.is_dir(), "the running build's staging is gone"
        running.stdin.write("\n")
        running.stdin.close()
        assert running.wait(timeout=120) == 0
    finally:
        if running.poll() is None:
            running.kill()
    assert _generations(out) == {"new"} and _leftovers(tmp_path) == []


def test_a_planted_aside_folder_of_another_user_is_never_linked_into_an_output(tmp_path):
    """In a shared parent (sticky, like /tmp), another user plants `.out.old-*` holding a
    marker and a file: it must neither become the user's out folder nor be carried."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = shared / ".out.old-4242-abcdefgh"
    planted.mkdir()
    (planted / "notes.txt").write_text("the attacker's")
    (planted / MARKER).write_text(json.dumps({"command": "build", "files": ["notes.txt"]}))
    for path in (planted, planted / "notes.txt", planted / MARKER):
        os.chown(path, 65534, 65534)
    if os.geteuid() == 65534:
        pytest.skip("the test runs as the user it plants as")
    out = shared / "out"
    assert _drive(out, "new") == 0
    assert not (out / "notes.txt").exists()
    assert "notes.txt" not in json.loads((out / MARKER).read_text())["files"]
    assert (planted / "notes.txt").read_text() == "the attacker's"  # and left alone


def test_the_portable_path_never_removes_an_aside_set_it_did_not_move_there(tmp_path):
    out = tmp_path / "out"
    assert _drive(out, "old") == 0
    mine = tmp_path / f".out.old-{2**22 + 7}-mine_abc"  # named like an aside of a dead PID
    mine.mkdir()
    (mine / MARKER).write_text("{}")
    (mine / "notes.txt").write_text("kept")
    assert _drive(out, "new", "portable") == 0
    assert _drive(out, "old", "portable") == 0
    assert (mine / "notes.txt").read_text() == "kept" and _generations(out) == {"old"}


def test_a_write_protected_out_folder_is_refused_and_left_as_it_is(tmp_path, capsys):
    plain = _policy(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(plain), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    out.chmod(0o555)
    try:
        capsys.readouterr()
        assert main(["build", "--policy", str(plain), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{out}: the output folder is write-protected (mode 555)" in err, err
        assert "chmod u+w" in err and "Traceback" not in err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert _leftovers(tmp_path) == []
    finally:
        out.chmod(0o755)


def _mount(how: str, target: Path, tmp_path: Path) -> None:
    """`target` made a mount point (a tmpfs, or a bind mount of a folder), or a skip."""
    if how == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(target)]
    else:
        (tmp_path / "source").mkdir()
        cmd = ["mount", "--bind", str(tmp_path / "source"), str(target)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"{how} cannot be mounted here: {done.stderr.strip()}")


@pytest.mark.parametrize("how", ["tmpfs", "bind"])
def test_a_mount_point_as_out_is_published_into(tmp_path, how):
    """Docker's `-v host/build:/work/build`: no rename can replace a mount point (EBUSY);
    the set is published into it, the marker last, and the user's files stay."""
    out = tmp_path / "out"
    out.mkdir()
    _mount(how, out, tmp_path)
    try:
        assert _drive(out, "old") == 0
        (out / "notes.txt").write_text("the user's")
        assert _drive(out, "new") == 0
        assert _generations(out) == {"new"} and (out / "notes.txt").read_text() == "the user's"
        marker = json.loads((out / MARKER).read_text())
        assert set(marker["files"]) == set(SETS)
        assert _leftovers(tmp_path) == [] and _leftovers(out) == [MARKER]
    finally:
        subprocess.run(["umount", str(out)], check=True)


def test_an_out_folder_in_an_overlays_lower_layer_is_published_into(tmp_path):
    """A folder of an image's lower layer cannot be renamed (EXDEV): published into."""
    layers = {n: tmp_path / n for n in ("lower", "upper", "work", "merged")}
    for folder in layers.values():
        folder.mkdir()
    assert _drive(layers["lower"] / "out", "old") == 0
    options = "lowerdir={lower},upperdir={upper},workdir={work}".format(**layers)
    cmd = ["mount", "-t", "overlay", "overlay", "-o", options, str(layers["merged"])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"an overlay cannot be mounted here: {done.stderr.strip()}")
    out = layers["merged"] / "out"
    try:
        for generation in ("new", "newer"):
            assert _drive(out, generation) == 0
            assert _generations(out) == {generation}
        assert _leftovers(layers["merged"]) == [] and _leftovers(out) == [MARKER]
    finally:
        subprocess.run(["umount", str(layers["merged"])], check=True)


def test_a_kill_at_any_step_of_a_publication_in_place_leaves_what_the_next_one_fixes(tmp_path):
    out = tmp_path / "out"
    assert _drive(out, "old") == 0
    (out / "notes.txt").write_text("the user's")
    for step in range(1, 30):
        code = _drive(out, "new", f"kill-at={step},in-place")
        assert code in (0, -signal.SIGKILL)
        if code == 0:
            break
        if len(_generations(out)) > 1:  # a mix says so
            assert json.loads((out / MARKER).read_text())["partial"] is True, step
        assert _drive(out, "old", "in-place") == 0, step
        assert _generations(out) == {"old"} and (out / "notes.txt").read_text() == "the user's"
        assert _leftovers(tmp_path) == [], step
    assert step > 3 and _generations(out) == {"new"}


def _policy(tmp_path: Path, rules: str = "") -> Path:
    m = model(
        [node("Relu", ["x"], "a", "relu"), node("Neg", ["a"], "y", "neg")],
        [("x", F, [1, 4])],
        [("y", F, [1, 4])],
    )
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    name = "pinned.yaml" if rules else "plain.yaml"
    path = tmp_path / name
    path.write_text(f"version: 1\nmodel: m.onnx\nbuild: {{backend: none}}\n{rules}")
    return path


def _build(policy: Path, out: Path, hook: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, TEST_HOOK: hook}
    cmd = [TRTBUILD, "build", "--policy", str(policy), "--out", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _which(out: Path, plain: dict[str, bytes], pinned: dict[str, bytes]) -> set[str]:
    """Which build each of build.json, report.json and mixed.onnx belongs to."""
    found = {"plain" if out.joinpath("mixed.onnx").read_bytes() == plain["mixed.onnx"] else "x"}
    found.add("pinned" if out.joinpath("mixed.onnx").read_bytes() == pinned["mixed.onnx"] else "x")
    found.discard("x")
    policy = json.loads((out / "build.json").read_text())["policy"]
    found.add("pinned" if policy.endswith("pinned.yaml") else "plain")
    fp32 = json.loads((out / "report.json").read_text())["precision"]["fp32_nodes"]
    found.add("pinned" if fp32 == 1 else "plain")
    return found


def test_a_kill_inside_a_real_builds_publication_leaves_a_whole_set(tmp_path):
    plain = _policy(tmp_path)
    pinned = _policy(
        tmp_path, "precision: {rules: [{id: n, match: {name: '^neg$'}, precision: fp32}]}\n"
    )
    for policy in (plain, pinned):
        assert _build(policy, tmp_path / policy.stem).returncode == 0
    sets = {p: {f: (tmp_path / p / f).read_bytes() for f in SETS} for p in ("plain", "pinned")}
    assert sets["plain"]["mixed.onnx"] != sets["pinned"]["mixed.onnx"]
    out = tmp_path / "out"
    assert _build(plain, out).returncode == 0
    for step in range(1, 30):
        done = _build(pinned, out, f"kill-at={step}")
        assert done.returncode in (0, -signal.SIGKILL), done.stderr
        assert _which(out, sets["plain"], sets["pinned"]) in ({"plain"}, {"pinned"}), step
        if done.returncode == 0:
            break
        assert _build(plain, out).returncode == 0
        assert _leftovers(tmp_path) == [], step
    assert step > 3 and _which(out, sets["plain"], sets["pinned"]) == {"pinned"}


def test_a_folder_where_an_artifact_goes_is_exit_2_and_changes_nothing(tmp_path, capsys):
    plain = _policy(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(plain), "--out", str(out)]) == 0
    (out / "junit.xml").unlink()
    (out / "junit.xml").mkdir()
    (out / "junit.xml" / "mine.txt").write_text("kept")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["build", "--policy", str(plain), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "junit.xml: is a folder where trtbuild writes a file" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert (out / "junit.xml" / "mine.txt").read_text() == "kept"
    assert _leftovers(tmp_path) == []


def test_foreign_out_folder_is_refused_and_its_files_kept(tmp_path, capsys):
    home = tmp_path / "home"
    home.mkdir()
    for name in (".bashrc", "engine.plan", "report.json", "photos.txt"):
        (home / name).write_text(f"the user's {name}")
    assert main(["build", "--policy", str(_policy(tmp_path)), "--out", str(home)]) == 2
    err = capsys.readouterr().err
    assert (
        "did not write (.bashrc, photos.txt); publishing into it would replace engine.plan, report.json"
        in err
    ), err
    assert {p.name: p.read_text() for p in home.iterdir()} == {
        n: f"the user's {n}" for n in (".bashrc", "engine.plan", "report.json", "photos.txt")
    }
    assert _leftovers(tmp_path) == []


def test_root_is_refused(tmp_path, capsys):
    assert main(["build", "--policy", str(_policy(tmp_path)), "--out", "/"]) == 2
    assert "trtbuild: error: /:" in capsys.readouterr().err


def test_report_into_a_build_keeps_the_build_and_the_users_files(tmp_path):
    plain = _policy(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(plain), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    (out / "extra").mkdir()
    (out / "extra" / "deep.txt").write_text("mine too")
    built = (out / "build.json").read_bytes()
    assert main(["report", "--policy", str(plain), "--out", str(out)]) == 0
    assert (out / "build.json").read_bytes() == built and (out / "mixed.onnx").is_file()
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "extra" / "deep.txt").read_text() == "mine too"
    marker = json.loads((out / MARKER).read_text())
    assert marker["command"] == "report" and "build.json" in marker["files"]
    assert "notes.txt" not in marker["files"]


def test_report_into_another_policys_build_is_refused_and_leaves_it_whole(tmp_path, capsys):
    """Before, `report --policy B --out A's build` wrote B's report.json beside A's
    build.json, engine and mixed model, exit 0: one folder holding two builds."""
    first = _policy(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(first), "--out", str(out)]) == 0
    other = tmp_path / "other"
    other.mkdir()
    second = _policy(other)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(["report", "--policy", str(second), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"trtbuild: error: {out}: holds the build of another policy ({first})" in err, err
    assert "pass --out the folder of this policy's build, or a new folder" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert main(["report", "--policy", str(first), "--out", str(out)]) == 0  # its own: fine


def test_a_policy_made_in_code_is_told_apart_by_its_content(tmp_path):
    """Two policies made in code under one name are `<policy p>` both: the folder's build
    is another's where the content differs (its sha256), and the report refused there."""
    import trtbuild
    from trtbuild.errors import UsageError
    from trtbuild.pipeline import report_only

    _policy(tmp_path)
    first = trtbuild.Policy.from_dict({"version": 1, "model": "m.onnx"}, tmp_path, name="p")
    out = tmp_path / "out"
    trtbuild.build(first, out=out, backend="none")
    rules = [{"id": "r", "match": {"name": "^neg$"}, "precision": "fp32"}]
    second = trtbuild.Policy.from_dict(
        {"version": 1, "model": "m.onnx", "precision": {"rules": rules}}, tmp_path, name="p"
    )
    with pytest.raises(UsageError, match=r"holds the build of another policy \(<policy p>\)"):
        report_only(second, out)
    assert report_only(first, out).exit_code == 0


def test_an_owned_file_not_produced_again_is_dropped_and_the_folder_mode_kept(tmp_path):
    plain = _policy(tmp_path)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(plain), "--out", str(out)]) == 0
    (out / MARKER).unlink()  # as an older trtbuild left it: its build.json proves it
    out.chmod(0o750)
    (out / "engine.plan").write_bytes(b"an engine of an earlier build")
    assert main(["build", "--policy", str(plain), "--out", str(out)]) == 0
    assert not (out / "engine.plan").exists()  # backend none: a stale engine would lie
    assert out.stat().st_mode & 0o777 == 0o750
    fresh = tmp_path / "fresh"
    assert main(["build", "--policy", str(plain), "--out", str(fresh)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700


def _record(folder: Path) -> None:
    """A build.json as trtbuild writes it: the version it was written by, the policy hash."""
    doc = {"policy": "p.yaml", "versions": {"trtbuild": "0.1"}, "hashes": {"policy": "a" * 64}}
    (folder / "build.json").write_text(json.dumps(doc))


def test_a_marker_less_earlier_output_is_accepted(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in SETS:
        (out / name).write_text("{}")
    _record(out)
    assert main(["build", "--policy", str(_policy(tmp_path)), "--out", str(out)]) == 0
    assert (out / MARKER).is_file()


@pytest.mark.parametrize(
    "files",
    [
        ("engine.plan",),
        ("report.md",),
        ("junit.xml",),
        ("engine.plan", "report.md", "junit.xml", "build.json"),  # a build.json not trtbuild's
    ],
)
def test_a_folder_of_artifact_names_without_trtbuilds_record_is_refused(tmp_path, capsys, files):
    """Names prove nothing (#42): a user's own engine.plan, report.md or junit.xml, or a
    build.json trtbuild did not write, is kept and the build refused."""
    out = tmp_path / "mine"
    out.mkdir()
    for name in files:
        (out / name).write_text(f"the user's {name}")
    assert main(["build", "--policy", str(_policy(tmp_path)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}: the output folder has no {MARKER} and no build.json trtbuild wrote" in err
    assert "publishing into it would replace" in err and "Traceback" not in err, err
    assert {p.name: p.read_text() for p in out.iterdir()} == {n: f"the user's {n}" for n in files}
    assert _leftovers(tmp_path) == []


def test_a_record_that_is_a_fifo_or_a_symlink_proves_nothing(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _record(elsewhere)
    (out / "build.json").symlink_to(elsewhere / "build.json")
    assert main(["build", "--policy", str(_policy(tmp_path)), "--out", str(out)]) == 2
    (out / "build.json").unlink()
    os.mkfifo(out / "build.json")  # must not hang the check
    assert main(["build", "--policy", str(_policy(tmp_path)), "--out", str(out)]) == 2
    assert (out / "report.md").read_text() == "mine"


def test_an_out_folder_on_a_disk_made_read_only_is_exit_2_naming_the_disk(tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount("tmpfs", disk, tmp_path)
    try:
        out = disk / "out"
        plain = _policy(tmp_path)
        assert main(["build", "--policy", str(plain), "--out", str(out)]) == 0
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        capsys.readouterr()
        assert main(["build", "--policy", str(plain), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{out}: read-only file system" in err and "write-protected" not in err, err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.parametrize("mode", ["exchange", "portable"])
def test_concurrent_publications_into_one_folder_each_publish_a_whole_set(tmp_path, mode):
    """Four at once, from no folder at all: each ends 0, one whole set wins, nothing is left."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), TEST_HOOK: mode if mode == "portable" else ""}
    for _ in range(2):
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", DRIVER, str(out), f"g{i}"], env=env, stderr=subprocess.PIPE
            )
            for i in range(4)
        ]
        errors = [p.communicate(timeout=120)[1].decode() for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, errors
        assert len(_generations(out)) == 1 and _leftovers(tmp_path) == []


# swaps two trtbuild folders by name, as the portable swap does (the old set renamed
# aside, the new one into its place), every millisecond; argv: PARENT SECONDS
SWAPPER = """
import os, sys, time
from pathlib import Path
root = Path(sys.argv[1])
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    os.rename(root / "out", root / "aside")
    os.rename(root / "new", root / "out")
    os.rename(root / "aside", root / "new")
    time.sleep(0.001)
"""


def test_an_out_folder_another_publication_replaces_meanwhile_is_checked_as_it_is_now(tmp_path):
    """Another process swaps the out folder with another trtbuild folder all the time,
    leaving no folder between its renames: the checks before staging read it again and
    pass, never "no such file" (a traceback) or "write-protected" (exit 2, wrongly)."""
    from trtbuild.artifacts import BUILD_FILES, _output_folder
    from trtbuild.fsutil import check_out_folder, folder_mode

    for name in ("out", "new"):
        (tmp_path / name).mkdir()
        (tmp_path / name / MARKER).write_text(json.dumps({"command": "build", "files": []}))
        (tmp_path / name / "report.md").write_text(name)
    out = tmp_path / "out"
    modes = {None, folder_mode(out), folder_mode(tmp_path / "new")}  # None: between renames
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(tmp_path), "1.5"])
    checks = 0
    try:
        while swapper.poll() is None:
            check_out_folder(out, known=(*BUILD_FILES, MARKER))
            assert _output_folder(out) == out and folder_mode(out) in modes
            checks += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert swapper.returncode == 0 and checks > 100


def test_an_out_folder_renamed_away_and_back_during_its_access_check_is_not_write_protected(
    tmp_path, monkeypatch
):
    """Another publication's two swaps during the one `access` of the check: the path named
    no folder then, and the check said "write-protected" of a writable folder (exit 2); the
    inode was the same before and after, so it was not read again. The check reads the
    folder through one descriptor."""
    from trtbuild.fsutil import check_out_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"command": "build", "files": []}))
    real, swaps = os.access, []

    def swapped(*args, **kwargs):
        if not swaps:
            os.rename(out, tmp_path / "aside")
            swaps.append(real(*args, **kwargs))
            os.rename(tmp_path / "aside", out)
            return swaps[0]
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "access", swapped)
    check_out_folder(out, known=(MARKER,))
    assert swaps == [True]  # the access check ran during the swap, and found the folder


def test_a_file_mounted_into_the_out_folder_stays_and_a_mounted_artifact_is_exit_2(tmp_path):
    """`-v notes.txt:/work/build/out/notes.txt`: a rename of the folder would carry the
    mount away with the old set; the set is published into the folder instead."""
    out = tmp_path / "out"
    assert _drive(out, "old") == 0
    (tmp_path / "notes.txt").write_text("the user's")
    try:
        for name in ("notes.txt", "mixed.onnx"):
            (out / name).touch()
            done = subprocess.run(["mount", "--bind", str(tmp_path / "notes.txt"), str(out / name)])
            if done.returncode != 0:
                pytest.skip("a file cannot be bind-mounted here")
            code = _drive(out, "new" if name == "notes.txt" else "newer")
            assert (out / "notes.txt").read_text() == "the user's" and _leftovers(tmp_path) == []
            if name == "notes.txt":
                assert code == 0 and _generations(out) == {"new"}
            else:  # an artifact trtbuild must replace is mounted: refused, nothing changed
                assert code != 0 and (out / "report.json").read_text() == "new"
                assert json.loads((out / "build.json").read_text())["policy"] == "new"
                assert "partial" not in json.loads((out / MARKER).read_text())
    finally:  # every mount under tmp_path, wherever a publication may have carried it
        points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for point in sorted((p for p in points if p.startswith(f"{tmp_path}/")), reverse=True):
            subprocess.run(["umount", "-l", point])


@pytest.mark.parametrize("files", [None, 5, [["a"]]])  # each crashed the old reader
def test_a_marker_whose_files_are_not_a_list_of_names_is_read_as_naming_none(tmp_path, files):
    """A damaged (or another version's) marker is no exit 70: it names no files to keep."""
    out = tmp_path / "out"
    assert _drive(out, "old") == 0
    marker = json.loads((out / MARKER).read_text())
    (out / MARKER).write_text(json.dumps({**marker, "files": files}))
    assert _drive(out, "new") == 0
    assert _generations(out) == {"new"}


def test_a_fault_of_the_command_while_it_stages_is_not_called_a_publication_race(tmp_path):
    """Forking the build child refused (EAGAIN, `ulimit -u`) inside the staging: it was said
    to be "another publication into it kept replacing it", which nothing was doing."""
    import errno

    from trtbuild.artifacts import staged_output
    from trtbuild.errors import exit_code_for

    with pytest.raises(BlockingIOError) as raised, staged_output(tmp_path / "out", ("x",)):
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    code, said = exit_code_for(raised.value)
    assert code == 2 and "publication" not in said and "ulimit -u" in said, said


def test_a_staging_folder_other_runs_keep_taking_is_said_so_not_a_process_limit(
    tmp_path, monkeypatch
):
    """Eight staging folders taken in a row by other runs' cleaners was EAGAIN, which the
    surroundings' mapping now reads as a process refused (`ulimit -u`)."""
    from trtbuild import fsutil
    from trtbuild.errors import UsageError

    monkeypatch.setattr(fsutil, "lock", lambda fd, wait=False: False)  # another holds each
    with pytest.raises(UsageError) as raised, fsutil.staging_folder(tmp_path / "out"):
        pass
    assert "other runs kept taking it" in str(raised.value)
    assert "ulimit" not in str(raised.value) and str(tmp_path / "out") in str(raised.value)


def test_a_stop_as_the_staging_folder_is_made_or_removed_leaves_none(tmp_path, monkeypatch):
    """A nightly worker stopped (Ctrl-C, SIGTERM) right as its staging folder was made, or
    while a finished one was removed, left `.NAME.staging-*` in the night's folder: the
    stop raises there once (`children.worker_signals`) and nothing removed it."""
    import shutil

    from trtbuild import fsutil

    def stopped(*_):
        raise KeyboardInterrupt

    def leftovers() -> list[str]:
        return [p.name for p in tmp_path.iterdir() if ".staging-" in p.name]

    with monkeypatch.context() as patch:
        patch.setattr(fsutil, "lock", stopped)  # between the folder's making and its lock
        with pytest.raises(KeyboardInterrupt), fsutil.staging_folder(tmp_path / "out"):
            pass
    assert leftovers() == []
    removal, calls = shutil.rmtree, []

    def cut_short(path, ignore_errors=False):
        calls.append(path)
        if len(calls) == 1:
            (Path(path) / "part").unlink()  # a part removed, then the stop
            raise KeyboardInterrupt
        removal(path, ignore_errors=ignore_errors)

    with pytest.raises(KeyboardInterrupt), fsutil.staging_folder(tmp_path / "out") as staging:
        (staging / "part").write_text("x")
        (staging / "rest").write_text("x")
        monkeypatch.setattr(fsutil.shutil, "rmtree", cut_short)
    assert leftovers() == [] and len(calls) == 2


def test_a_stop_signal_while_the_staging_folder_is_made_or_removed_waits_for_it(
    tmp_path, monkeypatch
):
    """A real SIGINT to the main thread right after the folder is made (inside `mkdtemp`,
    before any code that removes it), and one as a finished folder's removal starts, are
    held until the folder is held, or removed, whole (`fsutil.stops_held`): then the stop
    is raised. (Sent to the thread: a signal the process's other threads may take, as
    pytest's here do, is not held; `_removed`'s guard is what is left then.)"""
    import shutil
    import tempfile
    import threading

    from trtbuild import fsutil

    made, removal, calls = tempfile.mkdtemp, shutil.rmtree, []

    def interrupt() -> None:  # Python's handler: KeyboardInterrupt
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def making(*args, **kwargs):
        path = made(*args, **kwargs)
        interrupt()
        return path

    def removing(path, ignore_errors=False):
        calls.append(path)
        interrupt()
        removal(path, ignore_errors=ignore_errors)

    def leftovers() -> list[str]:
        return [p.name for p in tmp_path.iterdir() if ".staging-" in p.name]

    with monkeypatch.context() as patch:
        patch.setattr(fsutil.tempfile, "mkdtemp", making)
        with pytest.raises(KeyboardInterrupt), fsutil.staging_folder(tmp_path / "out"):
            pytest.fail("the stop came after the folder was held, before the block")
    assert leftovers() == []
    with pytest.raises(KeyboardInterrupt), fsutil.staging_folder(tmp_path / "out") as staging:
        (staging / "part").write_text("x")
        monkeypatch.setattr(fsutil.shutil, "rmtree", removing)
    assert leftovers() == [] and len(calls) == 1, (calls, leftovers())  # removed whole, once


# A staging folder made while another thread of the process takes the stop: the thread
# starts before the mask, as ONNX Runtime's pool does, so the process's signal is its
HELD_ELSEWHERE = """
import signal, sys, tempfile, threading, time
from pathlib import Path
from trtbuild import cli, fsutil
from trtbuild.errors import Terminated

cli._on_stops()
done = threading.Event()
other = threading.Thread(target=done.wait)
other.start()
made = tempfile.mkdtemp

def making(*args, **kwargs):
    path = made(*args, **kwargs)
    signal.pthread_kill(other.ident, int(sys.argv[2]))
    for _ in range(200):  # the handler runs in the main thread between these
        time.sleep(0.001)
    print("made whole", flush=True)
    return path

fsutil.tempfile.mkdtemp = making
try:
    with fsutil.staging_folder(Path(sys.argv[1]) / "out"):
        print("block entered", flush=True)
except (KeyboardInterrupt, Terminated) as exc:
    print("stopped:", type(exc).__name__, flush=True)
finally:
    done.set()
"""


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_another_thread_takes_waits_for_the_staging_folder_too(tmp_path, sent):
    """A process's stop that another thread takes (ONNX Runtime's pool after a session)
    runs its Python handler in the main thread, which the main thread's mask does not
    hold: `cli`'s handlers keep it for the end of the making (`fsutil.stop_kept`), then
    raise it. Before, it cut `mkdtemp`'s caller short, and only a guard removed the folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = [sys.executable, "-c", HELD_ELSEWHERE, str(tmp_path), str(int(sent))]
    done = subprocess.run(code, capture_output=True, text=True, env=env, timeout=60)
    name = "KeyboardInterrupt" if sent == signal.SIGINT else "Terminated"
    assert done.stdout.splitlines() == ["made whole", f"stopped: {name}"], done.stderr
    assert [p.name for p in tmp_path.iterdir()] == []


# Nested holds, two stops at once, and a block after them: one stop, raised once, at the
# outermost block's end, and nothing left over for the next block
HELD_TWICE = """
import signal, threading, time
from trtbuild import cli, fsutil
from trtbuild.errors import Terminated

cli._on_stops()
done = threading.Event()
other = threading.Thread(target=done.wait)
other.start()

def wait():
    for _ in range(200):
        time.sleep(0.001)

try:
    with fsutil.stops_held():
        with fsutil.stops_held():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # masked
            signal.pthread_kill(other.ident, signal.SIGTERM)  # another thread's: kept
            wait()
        print("inner ended", flush=True)
        wait()
        print("outer whole", flush=True)
except (KeyboardInterrupt, Terminated) as exc:
    print("stopped:", type(exc).__name__, flush=True)
with fsutil.stops_held():
    wait()
print("next block clean", flush=True)
done.set()
"""


def test_stops_held_twice_and_nested_raise_one_stop_once_and_leave_none_behind(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", HELD_TWICE], capture_output=True, text=True, env=env, timeout=60
    )
    said = done.stdout.splitlines()
    assert said == ["inner ended", "outer whole", "stopped: Terminated", "next block clean"], (
        done.stderr
    )


def test_a_stop_the_parent_left_ignored_stays_ignored():
    """`trap '' INT` or a shell's background job: Python leaves such a SIGINT ignored, and
    so does the command (a Ctrl-C meant for the foreground job killed it)."""
    code = (
        "import signal\n"
        "from trtbuild import cli\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "cli._on_stops()\n"
        "assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN\n"
        "assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN\n"
        "signal.raise_signal(signal.SIGINT)\n"
        "print('still here', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.stdout == "still here\n" and done.returncode == 0, done.stderr
