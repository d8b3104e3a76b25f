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
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import TRTBUILD, F, model, node
from trtbuild.cli import main
from trtbuild.fsutil import MARKER, TEST_HOOK, clean_leftovers

SETS = ("build.json", "report.json", "mixed.onnx")

# writes one generation of a build's files through staged_output; argv: OUT GENERATION
DRIVER = """
import sys
from pathlib import Path
from trtbuild.artifacts import BUILD_FILES, staged_output

with staged_output(Path(sys.argv[1]), BUILD_FILES) as stage:
    for name in ("build.json", "report.json", "mixed.onnx"):
        (stage / name).write_text(sys.argv[2])
"""


def _drive(out: Path, generation: str, hook: str = "") -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), TEST_HOOK: hook}
    cmd = [sys.executable, "-c", DRIVER, str(out), generation]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=120).returncode


def _generations(out: Path) -> set[str]:
    return {(out / name).read_text() for name in SETS}


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
            clean_leftovers(tmp_path)
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


def test_orphaned_staging_of_a_dead_process_is_removed_but_a_live_ones_kept(tmp_path):
    out = tmp_path / "out"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = tmp_path / f".out.staging-{dead.stdout.strip()}-abc_12"
    orphan.mkdir()
    (orphan / "engine.plan").write_bytes(b"\0" * 1000)
    live = tmp_path / f".other.staging-{os.getpid()}-xyz"
    live.mkdir()
    assert _drive(out, "new") == 0
    assert not orphan.exists() and live.is_dir()


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
