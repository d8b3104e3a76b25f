"""The cache never changes a result; it is capped, and `trtbuild cache` shows and clears it."""

from __future__ import annotations

import json

import pytest

from tests.conftest import NAFNET_POLICY, PINS
from trtbuild import front
from trtbuild.cache import Cache
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
    cache = Cache(root=tmp_path, max_bytes=250_000)
    payload = b"x" * 100_000
    for name in ("a", "b"):
        cache.put("prepared", name * 64, payload)
    assert cache.get("prepared", "a" * 64) == payload  # a is now the most recently used
    cache.put("prepared", "c" * 64, payload)  # over the cap: b goes, not a
    assert cache.get("prepared", "b" * 64) is None
    assert cache.get("prepared", "a" * 64) == payload
    assert cache.get("prepared", "c" * 64) == payload


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
        "converted": 1,
    }
    sizes = info["bytes_by_kind"]
    assert info["bytes"] == sum(sizes.values()) > 0
    assert main(["cache", "info"]) == 0
    assert "1 measures " in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert Cache().info()["entries"] == 0


def test_an_entry_over_its_share_of_the_cap_is_not_written_and_evicts_nothing(tmp_path):
    cache = Cache(root=tmp_path, max_bytes=800_000)
    small = b"x" * 90_000
    for name in "abcd":
        assert cache.put("prepared", name * 64, small)
    assert not cache.put("prepared", "e" * 64, b"x" * 900_000)  # over the whole cap
    assert not cache.put("reference", "f" * 64, b"x" * 120_000)  # tensors: over 1/8 of it
    assert cache.put("reference", "g" * 64, b"x" * 50_000)  # small tensors are kept
    assert all(cache.get("prepared", n * 64) == small for n in "abcd")  # nothing evicted
    assert cache.get("prepared", "e" * 64) is None and cache.get("reference", "f" * 64) is None


def test_check_reads_the_measures_alone_and_says_what_a_cold_check_says(
    write_policy, cache_dir, capsys
):
    policy = write_policy()
    said = []
    for extra in (["--no-cache"], [], []):  # uncached, cold, warm
        assert main(["check", "--policy", str(policy), "--json", *extra]) == 0
        said.append(capsys.readouterr().out)
    assert said[0] == said[1] == said[2]
    cache = Cache()
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
    cache = Cache(root=blocked, on_event=heard.append)
    cache.check_root()
    cache.check_root()
    assert cache.put("measures", "ab" * 32, {"x": 1}) is False
    assert (
        heard
        == cache.events
        == [f"cache off for this run: {blocked} is a file, not a folder; set TRTBUILD_CACHE_DIR"]
    )
    assert capsys.readouterr().err == ""
