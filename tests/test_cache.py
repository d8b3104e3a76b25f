"""The cache never changes a result; it is capped, and `trtbuild cache` shows and clears it."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shlex
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import NAFNET_POLICY, PINS, ROOT
from tests.helpers import F, model, node
from trtbuild import cache as cache_mod
from trtbuild import cache_codec, front
from trtbuild.cache import KINDS, Cache
from trtbuild.cli import main
from trtbuild.policy import load_policy

ARTIFACTS = (
    "prepared.onnx",
    "mixed.onnx",
    "report.json",
    "report.md",
    "junit.xml",
    "reference_outputs.json",
    "evaluated_outputs.json",
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(folder))
    return folder


def test_cached_and_uncached_builds_are_byte_identical(tmp_path, nafnet_path, cache_dir):
    policy = tmp_path / "p.yaml"
    policy.write_text(NAFNET_POLICY.format(model=nafnet_path, rules=PINS, backend="none"))
    runs = {"off": ["--no-cache"], "cold": [], "warm": []}
    for name, extra in runs.items():
        argv = ["build", "--policy", str(policy), "--out", str(tmp_path / name), *extra]
        assert main(argv) == 0
    files = {name: {f: (tmp_path / name / f).read_bytes() for f in ARTIFACTS} for name in runs}
    assert files["off"] == files["cold"] == files["warm"]
    hits = {n: json.loads((tmp_path / n / "build.json").read_text())["cache"] for n in runs}
    kinds = ("prepared", "reference", "converted")
    assert hits["off"] == dict.fromkeys(kinds, "off")
    assert hits["cold"] == dict.fromkeys(kinds, "miss")
    assert hits["warm"] == dict.fromkeys(kinds, "hit")


def test_another_seed_misses_the_reference_only(tmp_path, nafnet_path, cache_dir):
    text = NAFNET_POLICY.format(model=nafnet_path, rules=PINS, backend="none")
    for seed in (0, 1):
        policy = tmp_path / f"s{seed}.yaml"
        policy.write_text(text.replace("  samples: 2", f"  samples: 2\n  seed: {seed}"))
        assert main(["build", "--policy", str(policy), "--out", str(tmp_path / f"s{seed}")]) == 0
    hits = json.loads((tmp_path / "s1" / "build.json").read_text())["cache"]
    assert hits == {"prepared": "hit", "reference": "miss", "converted": "hit"}


def test_least_recently_used_entries_leave_first(tmp_path):
    cache = Cache(codec=cache_codec, root=tmp_path, max_bytes=250_000)
    value = _prepared(100_000)
    a, b, c = (_digest(name) for name in "abc")
    for digest in (a, b):
        cache.put("prepared", digest, value)
    assert _same(cache.get("prepared", a), value)  # a is now the most recently used
    cache.put("prepared", c, value)  # over the cap: b goes, not a
    assert cache.get("prepared", b) is None
    assert _same(cache.get("prepared", a), value)
    assert _same(cache.get("prepared", c), value)


def test_cache_info_and_clear_and_check_writes_no_tensors(
    tmp_path, write_policy, cache_dir, capsys
):
    assert main(["check", "--policy", str(write_policy())]) == 0
    capsys.readouterr()
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["root"] == str(cache_dir) and info["by_kind"] == {
        "prepared": 1,
        "measures": 1,
        "reference": 0,  # check reads the measures only, and writes no tensors
        # the mixed model, and that one of its prepared graph passed onnx.checker's full check
        "converted": 2,
        "neighbourhoods": 0,  # check never loads the mixed model in ONNX Runtime
    }
    sizes = info["bytes_by_kind"]
    assert info["bytes"] == sum(sizes.values()) > 0
    assert main(["cache", "info"]) == 0
    assert "1 measures " in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 4 entries" in capsys.readouterr().out
    assert Cache(codec=cache_codec).info()["entries"] == 0


def test_an_entry_over_its_share_of_the_cap_is_not_written_and_evicts_nothing(tmp_path):
    cache = Cache(codec=cache_codec, root=tmp_path, max_bytes=800_000)
    small = _prepared(90_000)
    for name in "abcd":
        assert cache.put("prepared", _digest(name), small)
    assert not cache.put("prepared", _digest("e"), _prepared(900_000))  # over the whole cap
    assert not cache.put("reference", _digest("f"), _run_results(120_000))  # over 1/8 of it
    assert cache.put("reference", _digest("g"), _run_results(50_000))  # small tensors are kept
    assert all(_same(cache.get("prepared", _digest(n)), small) for n in "abcd")  # none evicted
    assert cache.get("prepared", _digest("e")) is None
    assert cache.get("reference", _digest("f")) is None


def test_check_reads_the_measures_alone_and_says_what_a_cold_check_says(
    write_policy, cache_dir, capsys
):
    policy = write_policy()
    said = []
    for extra in (["--no-cache"], [], []):  # uncached, cold, warm
        assert main(["check", "--policy", str(policy), "--json", *extra]) == 0
        said.append(capsys.readouterr().out)
    assert said[0] == said[1] == said[2]
    cache = Cache(codec=cache_codec)
    stages = front.run_front(load_policy(policy), reference="measures", cache=cache)
    assert stages.reference is None and stages.cache_hits["reference"] == "hit"
    assert "reference" not in cache.hits  # the tensors' entry was not read


def test_eight_checks_at_once_on_one_small_cold_cache(tmp_path, write_policy):
    """As a nightly with --jobs or two terminals do: eviction and listing meet files that
    other processes are writing or have just removed, and no command may fail for it."""
    import os
    import subprocess
    import sys

    policy = write_policy()
    env = {
        **os.environ,
        "TRTBUILD_CACHE_DIR": str(tmp_path / "shared"),
        "TRTBUILD_CACHE_MAX_MB": "0.2",  # every put evicts
    }
    cmd = [sys.executable, "-m", "trtbuild", "check", "--policy", str(policy), "--json"]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    assert [code for code, _, _ in results] == [0] * 8, [err for _, _, err in results]
    assert not any("Traceback" in err for _, _, err in results)
    assert len({out for _, out, _ in results}) == 1  # the cache never changes a result


def test_the_cache_prints_nothing_and_hands_each_warning_once_to_its_listener(tmp_path, capsys):
    heard: list[str] = []
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    cache = Cache(codec=cache_codec, root=blocked, on_event=heard.append)
    cache.check_root()
    cache.check_root()
    assert cache.put("measures", "ab" * 32, {"x": 1}) is False
    assert (
        heard
        == cache.events
        == [f"cache off for this run: {blocked} is a file, not a folder; set TRTBUILD_CACHE_DIR"]
    )
    assert capsys.readouterr().err == ""


# -- the cache holds data, not code (issue #34) -------------------------------------------


def _digest(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def _prepared(nbytes: int = 16):
    """A real prepared graph whose model carries `nbytes` of weights."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from trtbuild.passes.basic import PassRecord
    from trtbuild.passes.prepare import Prepared

    weight = numpy_helper.from_array(np.zeros(max(nbytes // 4, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"], name="id")],
        "g",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [weight],
    )
    records = [PassRecord("lift", 1, {"names": ["a"], "shape": (1, 2), "peak": 1.5})]
    return Prepared(helper.make_model(graph), records)


def _run_results(nbytes: int):
    """Real Polygraphy RunResults with one float32 output of `nbytes`."""
    import numpy as np
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    results = RunResults()
    out = np.arange(max(nbytes // 4, 1), dtype=np.float32)
    results.append(("onnxrt-fp32", [IterationResult({"y": out}, runner_name="onnxrt-fp32")]))
    return results


def _same(a, b) -> bool:
    """Equal and of the same types all the way down; arrays bit for bit, dtypes kept."""
    import dataclasses

    import numpy as np
    import onnx
    from polygraphy.comparator.struct import IterationResult

    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray | np.generic):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, onnx.ModelProto):
        return a.SerializeToString() == b.SerializeToString()
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, IterationResult):
        return (a.runner_name, a.runtime) == (b.runner_name, b.runtime) and _same(
            dict(a.items()), dict(b.items())
        )
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) or type(a).__name__ == "RunResults":
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


class _Recording(Cache):
    """A real cache that also keeps what it was asked to store, to compare with what it reads."""

    def __init__(self, root: Path):
        super().__init__(root=root, codec=cache_codec)
        self.stored: dict[tuple[str, str], object] = {}

    def put(self, kind, digest, value):
        stored = super().put(kind, digest, value)
        if stored:
            self.stored[(kind, digest)] = value
        return stored


def test_every_kind_reads_back_exactly_what_was_stored_and_as_data(tmp_path):
    policy = load_policy(ROOT / "policies" / "nafnet.yaml")
    miss = _Recording(tmp_path / "cache")
    cold = front.run_front(policy, reference="tensors", cache=miss)
    # every kind but ONNX Runtime's memory of neighbourhoods, which the check of the
    # mixed model writes (tests/precision/test_validate.py), not the front half
    assert {kind for kind, _ in miss.stored} == set(KINDS) - {"neighbourhoods"}
    warm = Cache(codec=cache_codec, root=tmp_path / "cache")
    hot = front.run_front(policy, reference="tensors", cache=warm)
    assert set(warm.hits.values()) == {"hit"}, warm.hits
    for (kind, digest), value in miss.stored.items():
        assert _same(Cache(codec=cache_codec, root=tmp_path / "cache").get(kind, digest), value), (
            kind
        )
    assert _same(hot.prepared, cold.prepared) and _same(hot.converted, cold.converted)
    assert _same(hot.measures, cold.measures)
    assert _same(hot.reference.run_results, cold.reference.run_results)
    for path in Cache(
        codec=cache_codec, root=tmp_path / "cache"
    ).entries():  # JSON, then blobs: no pickle
        blob = path.read_bytes()
        start = blob.index(b"\n", len(cache_mod.MAGIC)) + 1
        assert blob[start : start + 8] == b'{"kind":', path


def test_a_planted_pickle_entry_is_never_run(tmp_path, write_policy, cache_dir, capsys):
    """Another user who could write the folder, or a CI cache restored from storage: a
    pickle with a valid header and sha256 is dropped as corrupt, never unpickled."""
    policy = str(write_policy())
    assert main(["check", "--policy", policy, "--json"]) == 0
    expected = capsys.readouterr().out
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {shlex.quote(str(marker))}",))

    payload = pickle.dumps(Payload())
    entries = Cache(codec=cache_codec).entries()
    assert entries
    for path in entries:
        path.write_bytes(cache_mod.seal(_name(path), [payload]) + payload)
    code = main(["check", "--policy", policy, "--json"])
    out, err = capsys.readouterr()
    assert not marker.exists(), "the planted pickle ran"
    assert code == 0 and out == expected and err.count("dropped a corrupt cache entry") == 1, err
    assert main(["check", "--policy", policy, "--json"]) == 0  # recomputed and rewritten
    out, err = capsys.readouterr()
    assert out == expected and "warning" not in err and not marker.exists()


def test_a_write_never_goes_through_a_planted_symlink(tmp_path):
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    digest = _digest("symlinks")
    folder = tmp_path / "cache" / "prepared" / digest[:2]
    folder.mkdir(parents=True, mode=0o700)
    names = [f".{digest}.{os.getpid()}.tmp"]  # the name before the fix
    names += [f".{digest}.{os.getpid()}.{n}.tmp" for n in range(_temp_names())]
    for name in names:
        (folder / name).symlink_to(victim)
    cache.put("prepared", digest, _prepared())
    assert victim.read_text() == "precious"
    assert [p.name for p in folder.iterdir() if not p.is_symlink()] in ([], [digest])


def test_a_read_never_follows_a_symlink_nor_waits_on_a_fifo(tmp_path):
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    source, planted = _digest("real"), _digest("planted")
    assert cache.put("prepared", source, _prepared())
    elsewhere = tmp_path / "elsewhere"
    (cache.root / "prepared" / source[:2] / source).rename(elsewhere)
    link = cache.root / "prepared" / planted[:2] / planted
    link.parent.mkdir(mode=0o700, exist_ok=True)
    link.symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    assert cache.get("prepared", planted) is None and cache.hits["prepared"] == "miss"
    assert not link.is_symlink() and elsewhere.read_bytes() == before  # dropped, not followed
    assert [e.startswith("dropped") for e in cache.events] == [True]
    fifo = cache.root / "prepared" / source[:2] / source
    os.mkfifo(fifo)  # a read that waited for a writer would hang here
    assert cache.get("prepared", source) is None and not fifo.exists()


def _temp_names() -> int:
    return getattr(cache_mod, "TEMP_NAMES", 16)


def _chown_away(folder: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user")
    os.chown(folder, 65534, 65534)


@pytest.mark.parametrize(
    "trouble", ["world-writable root", "group-writable kind folder", "root of another user"]
)
def test_a_folder_others_could_write_turns_the_cache_off(
    trouble, tmp_path, write_policy, capsys, monkeypatch
):
    policy = str(write_policy())
    assert main(["check", "--policy", policy, "--json", "--no-cache"]) == 0
    expected = capsys.readouterr().out
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o700)
    if trouble == "world-writable root":
        folder.chmod(0o777)
    elif trouble == "group-writable kind folder":
        (folder / "prepared").mkdir(mode=0o700)
        (folder / "prepared").chmod(0o770)
    else:
        _chown_away(folder)
    monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(folder))
    assert main(["check", "--policy", policy, "--json"]) == 0
    out, err = capsys.readouterr()
    assert out == expected
    assert err.count("trtbuild: warning:") == 1 and "cache off for this run" in err, err
    assert "Traceback" not in err
    assert Cache(codec=cache_codec).info()["entries"] == 0  # nothing was written there


def test_eviction_and_clear_touch_only_the_caches_own_files(tmp_path):
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    digest = _digest("entry")
    assert cache.put("prepared", digest, _prepared())
    folder = cache.root / "prepared" / digest[:2]
    header = cache_mod.MAGIC + b"0" * 64 + b"\n"
    other = _digest("other")
    elsewhere = "00" if other[:2] != "00" else "01"
    theirs = {
        folder / "photo.jpg": b"\xff\xd8" + b"x" * (3 << 20),  # a user's 3 MB file
        folder / (digest[:2] + _digest("no header")[2:]): b"a digest's name, no header",
        cache.root / "prepared" / elsewhere / other: header,  # not in its own XX folder
        cache.root / "measures" / "ab" / "photo.jpg": b"holiday",
    }
    for path, data in theirs.items():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_bytes(data)
    assert cache.info()["entries"] == 1 and cache.info()["bytes"] < 1 << 20
    cache.max_bytes = 1
    assert cache.evict() == 1
    assert all(path.read_bytes() == data for path, data in theirs.items())
    cache.max_bytes = 1 << 30
    assert cache.put("prepared", digest, _prepared())
    assert cache.clear() == 1 and cache.entries() == []
    assert all(path.read_bytes() == data for path, data in theirs.items())


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    import subprocess

    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    digest = _digest("stale")
    assert cache.put("prepared", digest, _prepared())
    folder = cache.root / "prepared" / digest[:2]
    dead = subprocess.Popen(["true"])
    dead.wait()
    now = time.time()
    temps = {  # name -> (age in seconds, removed?)
        f".{digest}.{dead.pid}.0.tmp": (120, True),  # its process is gone
        f".{digest}.{dead.pid}.tmp": (120, True),  # the name before the fix
        f".{digest}.{os.getpid()}.1.tmp": (2 * 3600, True),  # alive, but two hours old
        f".{digest}.{os.getpid()}.0.tmp": (0, False),  # a write under way
        ".notes.tmp": (2 * 3600, False),  # not a name the cache makes
    }
    for name, (age, _) in temps.items():
        (folder / name).write_bytes(b"partial")
        os.utime(folder / name, (now - age, now - age))
    cache.evict()
    assert {n for n in temps if (folder / n).exists()} == {
        n for n, (_, removed) in temps.items() if not removed
    }
    (folder / f".{digest}.{dead.pid}.0.tmp").write_bytes(b"partial")
    os.utime(folder / f".{digest}.{dead.pid}.0.tmp", (now - 120, now - 120))
    assert cache.clear() == 1 and not (folder / f".{digest}.{dead.pid}.0.tmp").exists()


def test_a_temporary_whose_writer_holds_its_lock_is_kept_whatever_its_pid_and_age(tmp_path):
    """A writer in another PID namespace: its pid is no process here, but it holds its lock."""
    import fcntl

    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    digest = _digest("held")
    assert cache.put("prepared", digest, _prepared())
    temp = cache.root / "prepared" / digest[:2] / f".{digest}.{2**22 + 7}.0.tmp"
    temp.write_bytes(b"partial")
    old = time.time() - 2 * 3600
    os.utime(temp, (old, old))
    with open(temp, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        cache.evict()
        assert temp.exists()
    cache.evict()
    assert not temp.exists()


def test_a_value_the_codec_cannot_express_is_not_cached(tmp_path):
    import numpy as np

    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    odd = _prepared()
    odd.records[0].details["obj"] = np.array([object()], dtype=object)  # would need pickle
    assert cache.put("prepared", _digest("odd"), odd) is False
    assert cache.put("prepared", _digest("set"), {"not": "a Prepared"}) is False
    assert cache.entries() == []


def test_check_twice_from_the_command_line_hits_and_says_the_same(tmp_path):
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "trtbuild"
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [str(exe), "check", "--policy", "policies/nafnet.yaml"]
    runs = []
    for _ in range(2):
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
        files = Cache(codec=cache_codec, root=tmp_path / "cache").entries()
        runs.append((proc.stdout, {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}))
    (first, cold), (second, warm) = runs
    assert first == second and cold
    assert cold.keys() == warm.keys()
    for path, (inode, mtime) in cold.items():  # read (touched), not rewritten
        assert warm[path][0] == inode and warm[path][1] > mtime, path


# -- the surroundings of the cache (#45) ----------------------------------------------------


def _size(path: Path) -> int:
    return path.stat().st_size


def _name(path: Path) -> str:
    """An entry's name under its cache's root (`KIND/XX/DIGEST`)."""
    return "/".join(path.parts[-3:])


def _entry(kind: str, digest: str, payload: bytes) -> bytes:
    """The file of entry `digest` with a valid header and sha256 around `payload`."""
    return cache_mod.seal(f"{kind}/{digest[:2]}/{digest}", [payload]) + payload


def _plant(cache: Cache, kind: str, digest: str, data: bytes) -> Path:
    folder = cache.root / kind / digest[:2]
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    (folder / digest).write_bytes(data)
    return folder / digest


@pytest.mark.parametrize("sticky", [False, True])
def test_an_ancestor_others_can_write_turns_the_cache_off_unless_sticky(tmp_path, sticky):
    """OpenSSH's StrictModes: who can rename a folder above the root can swap the root."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777 if sticky else 0o777)
    cache = Cache(codec=cache_codec, root=shared / "me" / "cache")
    assert cache.put("prepared", _digest("strict"), _prepared()) is sticky
    if sticky:
        assert cache.events == [] and cache.entries()
    else:
        (said,) = cache.events
        assert f"{shared}, above the cache, is writable by others (mode 777)" in said, said
        assert "without the sticky bit" in said and cache.hits["prepared"] == "off"


def test_the_root_is_used_through_the_descriptor_it_was_checked_on(tmp_path):
    """Swapping the root after its check (the race of #45) changes nothing a run reads."""
    digest = _digest("swap")
    root = tmp_path / "cache"
    assert Cache(codec=cache_codec, root=root).put("prepared", digest, _prepared(10))
    cache = Cache(codec=cache_codec, root=root)
    cache.check_root()  # opened and checked here
    root.rename(tmp_path / "moved")
    attacker = Cache(codec=cache_codec, root=root)  # a folder of theirs in its place
    assert attacker.put("prepared", digest, _prepared(99))
    got = cache.get("prepared", digest)
    assert _same(got, _prepared(10)) and not _same(got, _prepared(99))


def test_a_symlinked_root_of_another_user_turns_the_cache_off(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root can give a symlink to another user")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(mine)
    os.lchown(link, 65534, 65534)  # theirs: they could point it elsewhere at any time
    cache = Cache(codec=cache_codec, root=link)
    assert cache.put("prepared", _digest("link"), _prepared()) is False
    assert "is a symbolic link of another user (uid 65534)" in cache.events[0]
    os.lchown(link, os.geteuid(), os.getegid())  # the user's own link: followed
    assert Cache(codec=cache_codec, root=link).put("prepared", _digest("link"), _prepared())


def test_folders_the_cache_makes_are_its_own_under_a_group_writable_umask(tmp_path):
    """umask 002 (many distributions' default for users): every folder made on the way to
    the root is 0700, so the cache does not refuse what it made itself."""
    old = os.umask(0o002)
    try:
        cache = Cache(codec=cache_codec, root=tmp_path / "made" / "by" / "trtbuild")
        assert cache.put("prepared", _digest("umask"), _prepared()) is True
    finally:
        os.umask(old)
    assert cache.events == []
    for folder in ("made", "made/by", "made/by/trtbuild"):
        assert (tmp_path / folder).stat().st_mode & 0o777 == 0o700, folder


def test_a_root_that_is_a_symbolic_link_to_nothing_says_so(tmp_path):
    """Not a silent miss on every run: the cache is off, and the warning says why."""
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "nowhere")
    cache = Cache(codec=cache_codec, root=link)
    assert cache.put("prepared", _digest("dangling"), _prepared()) is False
    (said,) = cache.events
    assert "symbolic link to nothing" in said and str(link) in said


def _reshaped(kind: str, value, change) -> bytes:
    """The payload of `value` with its JSON line changed by `change` (a valid entry's
    frame, the wrong content)."""
    parts = cache_codec.encode(kind, value)
    head = json.loads(parts[0])
    change(head["value"])
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + b"".join(parts[1:])


@pytest.mark.parametrize(
    "kind, change",
    [
        ("prepared", lambda v: v.update(model="not a model")),
        ("prepared", lambda v: v.update(records=[{"name": 5, "changed": 0, "details": {}}])),
        ("converted", lambda v: v.update(warnings=[1, 2])),
        ("converted", lambda v: v.update(casts={"$tuple": []})),
        ("neighbourhoods", lambda v: v.update(ab=5)),
    ],
)
def test_an_entry_of_the_wrong_shape_is_dropped_and_recomputed_like_a_bad_hash(
    tmp_path, kind, change
):
    from onnx import helper

    from trtbuild.precision.convert import Converted

    value = (
        _prepared()
        if kind == "prepared"
        else {"cd": ""}
        if kind == "neighbourhoods"
        else Converted(helper.make_model(helper.make_graph([], "g", [], [])), [], ["w"])
    )
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    digest = _digest(f"shape-{kind}")
    assert cache.put(kind, digest, value)
    path = _plant(cache, kind, digest, _entry(kind, digest, _reshaped(kind, value, change)))
    assert cache.get(kind, digest) is None and cache.hits[kind] == "miss"
    assert not path.exists() and cache.events[0].startswith("dropped a corrupt cache entry")


def test_entry_sizes_are_bounded_before_reading(tmp_path):
    """A sparse entry of 8 GiB is dropped unread; a 70 MB string in the JSON line is not
    parsed (it took 4.4 GB for a 300 MB one)."""
    import resource

    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    digest, other = _digest("sparse"), _digest("string")
    assert cache.put("prepared", digest, _prepared())
    path = cache.root / "prepared" / digest[:2] / digest
    with open(path, "r+b") as f:
        f.truncate(8 << 30)  # sparse: no disk taken
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert cache.get("prepared", digest) is None and not path.exists()
    assert "larger than any entry of its kind" in cache.events[0]
    head = b'{"kind":"prepared","blobs":[],"value":"' + b"x" * (70 << 20) + b'"}\n'
    _plant(cache, "prepared", other, _entry("prepared", other, head))
    assert Cache(codec=cache_codec, root=cache.root).get("prepared", other) is None
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak  # KiB on Linux
    assert grown < 1 << 20, f"{grown} KiB more to drop two entries"


def test_a_reference_model_replaced_while_it_runs_stores_no_outputs(
    tmp_path, quantized_dir, cache_dir, monkeypatch
):
    """`accuracy.reference_model` is hashed for its key, then opened by path: a model
    replaced between the two (an export rewriting it) stored its outputs under the other's
    key, which a later run of the first model read. Nothing is stored unless the file still
    has the bytes the key was made of."""
    from trtbuild.accuracy import reference

    original = tmp_path / "fp32.onnx"
    original.write_bytes((quantized_dir / "nafnet_tiny.onnx").read_bytes())
    policy = tmp_path / "q.yaml"
    policy.write_text(
        f"version: 1\nmodel: {quantized_dir / 'nafnet_tiny_int8.onnx'}\n"
        "inputs:\n  input: {shape: [1, 3, 64, 64]}\nprecision: {default: fp16}\n"
        "accuracy:\n  samples: 1\n  reference_model: fp32.onnx\n"
        "  tolerances: {default: {atol: 1, rtol: 1}}\nbuild: {backend: none}\n"
    )
    real, ran = reference.against_reference_model, []

    def replaced_while_running(*args, **kwargs):
        ran.append(1)
        made = real(*args, **kwargs)
        if len(ran) == 1:  # another process rewrites the model during the first run
            original.write_bytes(original.read_bytes() + b"\n")  # other bytes, same model
        return made

    monkeypatch.setattr(reference, "against_reference_model", replaced_while_running)
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "a")]) in (0, 1)
    original.write_bytes((quantized_dir / "nafnet_tiny.onnx").read_bytes())  # put back
    assert main(["build", "--policy", str(policy), "--out", str(tmp_path / "b")]) in (0, 1)
    assert len(ran) == 2  # run again: nothing stored under the key of the bytes it ran


def test_an_entry_moved_under_another_key_is_dropped_not_served(tmp_path, cache_dir, capsys):
    """Two policies of one model, one with a node pinned: the first's converted entry
    replaced by the second's file (whole, its own sha256 valid: a sync tool, a restored CI
    cache). `convert` of the first wrote the second's mixed model, exit 0, while saying
    100% FP16. The entry's sha256 covers its name: it reads as corrupt and is recomputed."""
    m = model(
        [node("Relu", ["x"], "y", "relu"), node("Mul", ["y", "y"], "z", "mul")],
        [("x", F, [1, 4])],
        [("z", F, [1, 4])],
    )
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    base = "version: 1\nmodel: m.onnx\nbuild: {backend: none}\n"
    pin = "precision:\n  rules:\n    - {id: k, why: t, match: {name: mul}, precision: fp32}\n"
    converted = {}
    for name, text in (("all", base), ("pinned", base + pin)):
        (tmp_path / f"{name}.yaml").write_text(text)
        before = set(Cache(codec=cache_codec).entries())
        out = tmp_path / f"{name}.onnx"
        assert main(["convert", "--policy", str(tmp_path / f"{name}.yaml"), "-o", str(out)]) == 0
        new = set(Cache(codec=cache_codec).entries()) - before
        # the mixed model: the largest new converted entry (the other is convert's record)
        converted[name] = max((p for p in new if p.parts[-3] == "converted"), key=_size)
    expected = (tmp_path / "all.onnx").read_bytes()
    assert expected != (tmp_path / "pinned.onnx").read_bytes()
    converted["all"].write_bytes(converted["pinned"].read_bytes())
    capsys.readouterr()
    again = tmp_path / "again.onnx"
    assert main(["convert", "--policy", str(tmp_path / "all.yaml"), "-o", str(again)]) == 0
    assert again.read_bytes() == expected, "another key's entry was served"
    assert capsys.readouterr().err.count("dropped a corrupt cache entry") == 1


def _stranger() -> int:
    """A uid the password database does not know."""
    import pwd

    uid = 54321
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="runs a command as a user the password database does not know: root and setpriv",
)
def test_no_home_folder_turns_the_cache_off_not_every_command(tmp_path):
    """HOME unset for a user the password database does not know (a container run as
    `--user 12345` under `env -i`): pathlib's "Could not determine home directory." ended
    every command, `--no-cache` and `cache info` too, as a bug (exit 70). The cache is off
    with one warning that says why; `cache info` is exit 2 saying it."""
    import subprocess
    import sys

    uid = _stranger()
    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    os.chown(tmp_path, uid, uid)
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")}
    env.pop("TRTBUILD_CACHE_DIR", None)
    # the stranger reads the interpreter wherever it is installed (/root/.pyenv), writes
    # only where its uid may
    who = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    trtbuild = ["setpriv", *who, *caps, sys.executable, "-m", "trtbuild"]

    def run(*argv: str) -> subprocess.CompletedProcess:
        cmd = [*trtbuild, *argv]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)

    for extra in ([], ["--no-cache"]):
        done = run("convert", "--policy", "p.yaml", "-o", "out.onnx", *extra)
        assert done.returncode == 0, done.stderr
        warned = [line for line in done.stderr.splitlines() if "warning" in line]
        if extra:
            assert warned == [], warned
        else:
            (said,) = warned
            assert "cache off for this run: no folder for the cache" in said, said
            assert "TRTBUILD_CACHE_DIR" in said and str(uid) in said, said
        assert (tmp_path / "out.onnx").is_file()
    done = run("cache", "info")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "no folder for the cache" in done.stderr, done.stderr
    assert not (tmp_path / "~").exists()


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="runs a command as root without its power over file modes: root and setpriv",
)
def test_an_entry_the_user_may_not_read_is_dropped_not_the_cache_off_for_good(tmp_path):
    """Entries another user wrote in the user's own folders (a `sudo trtbuild` that kept
    HOME: root's, mode 0600): every later run said 'cache off for this run: cannot read'
    and stayed off for good. Such a file at an entry's name is dropped once and recomputed;
    the next run is quiet."""
    import subprocess
    import sys

    m = model([node("Relu", ["x"], "y", "relu")], [("x", F, [1, 4])], [("y", F, [1, 4])])
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    (tmp_path / "p.yaml").write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\n")
    root = tmp_path / "cache"
    env = {**os.environ, "TRTBUILD_CACHE_DIR": str(root)}
    # root, but held to file modes as any user is
    plain = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    cmd = [*plain, sys.executable, "-m", "trtbuild", "convert", "--policy", "p.yaml"]

    def convert() -> list[str]:
        done = subprocess.run(
            [*cmd, "-o", "out.onnx"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0 and (tmp_path / "out.onnx").is_file(), done.stderr
        return [line for line in done.stderr.splitlines() if "warning" in line]

    assert convert() == []
    entries = Cache(codec=cache_codec, root=root).entries()
    assert entries
    for path in entries:
        os.chown(path, _stranger(), _stranger())
    warned = convert()
    assert len(warned) == 1 and "you may not read it" in warned[0], warned
    assert "cache off" not in warned[0]
    assert convert() == []  # recomputed and written again: the cache is on


def test_an_entry_of_an_earlier_version_is_a_quiet_miss_then_replaced(tmp_path):
    """After an upgrade that changed the entries' format (version 3 seals the name), every
    entry an earlier trtbuild wrote under an unchanged key was dropped as corrupt, one
    warning each: it is another version's, a miss, and the next put replaces it."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    digest = _digest("entry")
    assert cache.put("prepared", digest, _prepared())
    (path,) = cache.entries()
    blob = path.read_bytes()
    path.write_bytes(cache_mod.HEADER + b"2\n" + blob[len(cache_mod.MAGIC) :])
    assert cache.get("prepared", digest) is None
    assert cache.hits["prepared"] == "miss" and not cache.events, cache.events
    assert cache.put("prepared", digest, _prepared())
    assert cache.get("prepared", digest) is not None and cache.hits["prepared"] == "hit"
