"""Two nights of the accuracy job: a policy loses a needed pin, the second night says so."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
import yaml

from tests.conftest import ROOT
from trtbuild.cli import main

LN_RULES = ("    - id: ln-after-attention", "    - id: first-layernorm")


def _example_policies(folder, models_dir):
    folder.mkdir()
    for name in ("nafnet", "gfpgan", "transformer"):
        text = (ROOT / "policies" / f"{name}.yaml").read_text()
        (folder / f"{name}.yaml").write_text(text.replace("../models/", f"{models_dir}/"))


def _drop_layernorm_pins(path) -> None:
    text = path.read_text()
    start, end = text.index(LN_RULES[0]), text.index("    - id: final-reduction")
    path.write_text(text[:start] + text[end:])


def _nightly(policies, out, history, *extra) -> int:
    args = ["nightly", "--policies", str(policies), "--out", str(out), "--history", str(history)]
    return main([*args, "--backend", "none", *extra])


def test_two_nights_a_lost_pin_is_named_and_both_nights_are_in_history(
    tmp_path, models_dir, capsys
):
    policies, out, history = tmp_path / "policies", tmp_path / "nightly", tmp_path / "h.sqlite"
    _example_policies(policies, models_dir)

    assert _nightly(policies, out, history) == 0
    first = (out / "summary.md").read_text()
    assert "ALL PASS" in first

    _drop_layernorm_pins(policies / "nafnet.yaml")
    assert _nightly(policies, out, history, "--jobs", "2") == 1
    said = capsys.readouterr().out
    assert "REGRESSION nafnet on cpu-emulation: pass→fail" in said and "ATTENTION: nafnet" in said
    assert "the policy changed since that pass" in said  # its pins were dropped; not the model

    summary = (out / "summary.md").read_text()
    assert "ATTENTION: nafnet" in summary.splitlines()[0]
    row = next(line for line in summary.splitlines() if line.startswith("| `nafnet`"))
    assert "FAIL" in row and "pass→fail" in row
    assert "| `gfpgan` | pass |" in summary and "| `transformer` | pass |" in summary
    html = (out / "summary.html").read_text()
    assert "ATTENTION: nafnet" in html and html.count("data:image/png;base64,") == 3
    assert (out / "trends" / "nafnet.png").read_bytes()[:4] == b"\x89PNG"
    junit = (out / "junit.xml").read_text()
    assert 'failures="1"' in junit and "pass→fail" in junit

    db = sqlite3.connect(history)
    assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (2,)
    rows = db.execute("SELECT run_id, policy, status FROM results ORDER BY run_id, policy")
    assert rows.fetchall() == [
        (1, "gfpgan", "pass"),
        (1, "nafnet", "pass"),
        (1, "transformer", "pass"),
        (2, "gfpgan", "pass"),
        (2, "nafnet", "fail"),
        (2, "transformer", "pass"),
    ]
    versions, model_hash, policy_hash = db.execute(
        "SELECT versions, model_sha256, policy_sha256 FROM results WHERE run_id = 2 AND policy = 'nafnet'"
    ).fetchone()
    assert json.loads(versions)["onnxruntime"] and len(model_hash) == len(policy_hash) == 64
    before, after = db.execute(
        "SELECT median_abs FROM outputs WHERE policy = 'nafnet' AND output = 'restored' ORDER BY run_id"
    ).fetchall()
    assert after[0] > 5 * before[0]


def test_one_broken_policy_does_not_stop_the_others(tmp_path, models_dir):
    policies = tmp_path / "policies"
    _example_policies(policies, models_dir)
    (policies / "broken.yaml").write_text("version: 1\nmodel: nowhere.onnx\n")
    out = tmp_path / "nightly"
    assert _nightly(policies, out, tmp_path / "h.sqlite") == 1
    report = json.loads((out / "nightly.json").read_text())
    status = {r["policy"]: (r["status"], r["exit_code"]) for r in report["results"]}
    assert status == {
        "broken": ("error", 2),
        "gfpgan": ("pass", 0),
        "nafnet": ("pass", 0),
        "transformer": ("pass", 0),
    }
    assert "nowhere.onnx" in (out / "summary.md").read_text()


def test_error_growth_beyond_the_margin_is_a_regression(tmp_path, models_dir, capsys):
    policies, out, history = tmp_path / "policies", tmp_path / "nightly", tmp_path / "h.sqlite"
    policies.mkdir()
    text = (ROOT / "policies" / "gfpgan.yaml").read_text().replace("../models/", f"{models_dir}/")
    (policies / "gfpgan.yaml").write_text(text.replace("default: fp16", "default: fp32"))
    assert _nightly(policies, out, history) == 0  # all FP32: errors near zero
    (policies / "gfpgan.yaml").write_text(text)  # FP16 again: still passes, larger errors
    assert _nightly(policies, out, history) == 1
    said = capsys.readouterr().out
    assert "REGRESSION gfpgan on cpu-emulation: error grew: face.max_abs" in said
    assert "error grew" in (out / "summary.md").read_text()


def test_bad_arguments_are_exit_2(tmp_path, capsys):
    assert main(["nightly", "--policies", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert "policies folder not found" in capsys.readouterr().err
    (tmp_path / "p").mkdir()
    assert main(["nightly", "--policies", str(tmp_path / "p"), "--out", str(tmp_path)]) == 2
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database")
    (tmp_path / "p" / "x.yaml").write_text("version: 1\nmodel: m.onnx\n")
    code = main(
        [
            "nightly",
            "--policies",
            str(tmp_path / "p"),
            "--out",
            str(tmp_path / "out"),
            "--history",
            str(bad),
        ]
    )
    assert code == 2 and "history database" in capsys.readouterr().err


def test_workflow_is_a_matrix_of_shards_and_gpus_then_one_summary():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    triggers = flow.get("on") or flow.get(True)  # YAML 1.1 reads a bare `on` as true
    assert "schedule" in triggers and triggers["schedule"][0]["cron"]
    shards, summary = flow["jobs"]["nightly"], flow["jobs"]["summary"]
    matrix = shards["strategy"]["matrix"]
    assert len(matrix["shard"]) == int(flow["env"]["SHARDS"]) and len(matrix["gpu"]) >= 2
    assert shards["strategy"]["fail-fast"] is False
    runs = "\n".join(s.get("run", "") for s in shards["steps"])
    assert "make models" in runs
    assert "trtbuild nightly --policies policies --out build/nightly" in runs
    assert "--shard ${{ matrix.shard }}/$SHARDS --run-id ${{ github.run_id }}" in runs
    assert summary["needs"] == "nightly" and summary["if"] == "always()"
    said = "\n".join(s.get("run", "") for s in summary["steps"])
    assert "trtbuild summary --history" in said and "--run-id ${{ github.run_id }}" in said
    assert "--devices $GPUS" in said and len(matrix["gpu"]) == int(flow["env"]["GPUS"])
    uploads = [s for s in summary["steps"] if s.get("uses", "").startswith("actions/upload")]
    assert uploads and "build/nightly/summary.html" in uploads[0]["with"]["path"]
    readme = (ROOT / "README.md").read_text()
    assert "trtbuild nightly --policies" in readme and "make nightly" in readme
    assert "trtbuild summary --history" in readme
    script = (ROOT / "scripts" / "nightly.sh").read_text()
    assert "trtbuild nightly --policies" in script


@pytest.mark.parametrize(("flag", "named"), [("--jobs=0", "--jobs"), ("--margin=-1", "--margin")])
def test_bad_numbers_are_exit_2(tmp_path, flag, named, capsys):
    assert main(["nightly", "--policies", str(tmp_path), flag]) == 2
    assert named in capsys.readouterr().err


def test_a_pass_in_another_lane_is_no_baseline_for_a_regression(tmp_path, models_dir, capsys):
    """A night judged on a GPU and a night emulated on a CPU are different lanes."""
    policies, out, history = tmp_path / "policies", tmp_path / "nightly", tmp_path / "h.sqlite"
    _example_policies(policies, models_dir)
    assert _nightly(policies, out, history) == 0
    with sqlite3.connect(history) as db:  # as if that night had run the engines on a GPU
        db.execute("UPDATE results SET evaluator = 'tensorrt', emulation = NULL")
    _drop_layernorm_pins(policies / "nafnet.yaml")
    assert _nightly(policies, out, history) == 1  # nafnet fails tonight ...
    said = capsys.readouterr().out
    assert "FAIL nafnet" in said and "REGRESSION nafnet" not in said  # ... in a lane of its own


def test_a_quantized_policy_records_its_int8_share(tmp_path, quantized_dir):
    policies, out, history = tmp_path / "policies", tmp_path / "nightly", tmp_path / "h.sqlite"
    policies.mkdir()
    text = (ROOT / "policies" / "nafnet.yaml").read_text()
    model = str(quantized_dir / "nafnet_tiny_int8.onnx")
    text = text.replace("../models/nafnet_tiny.onnx", model)
    pins = '    - {id: ln, match: {name: "/norm[0-9]+/"}, precision: fp32}\n'
    (policies / "nafnet_int8.yaml").write_text(text.replace("  rules:\n", "  rules:\n" + pins))
    assert _nightly(policies, out, history) == 0
    with sqlite3.connect(history) as conn:
        low, quantized = conn.execute("SELECT low_share, quantized_share FROM results").fetchone()
    assert 0 < quantized < 1 and low + quantized <= 1  # 14 INT8 Convs of 65 compute nodes
    row = next(
        line for line in (out / "summary.md").read_text().splitlines() if "nafnet_int8" in line
    )
    assert f"{quantized:.1%} INT8/FP8" in row


def test_an_output_whose_shape_is_not_fp32s_says_so_in_the_nights_message(tmp_path, capsys):
    """A NonZero whose count FP16 changes (the judge's test model): the night's failure
    names each such output with why, in the terminal and in junit.xml."""
    import onnx

    from tests.accuracy.test_judge import _thresholded

    m, x = _thresholded()
    policies = tmp_path / "policies"
    policies.mkdir()
    onnx.save(m, policies / "m.onnx")
    np.savez(policies / "x.npz", x=x)
    (policies / "nz.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [64, 64]\n"
        "    data: {file: x.npz}\naccuracy:\n  samples: 1\n"
    )
    out = tmp_path / "out"
    args = ["--policies", str(policies), "--out", str(out), "--history", str(tmp_path / "h.db")]
    main(["nightly", *args, "--backend", "none"])
    said = "idx (its shape is not FP32's), vals (its shape is not FP32's)"
    assert said in capsys.readouterr().out
    assert said in (out / "junit.xml").read_text()


@pytest.mark.parametrize("group", [False, True])
def test_sigterm_stops_every_worker_of_a_parallel_night(tmp_path, models_dir, group):
    """SIGTERM (`timeout`, a cancelled CI job) to `nightly --jobs 2`: exit 143, and its
    workers stop with it. They were left running for good, one publishing after the night
    had ended. `group`: a terminal's Ctrl-C, to the night and its workers at once (exit
    130): the parent's SIGTERM then cut a worker's cleanup short, its staging folder left."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    policies, out = tmp_path / "policies", tmp_path / "night"
    _example_policies(policies, models_dir)
    cmd = [sys.executable, "-m", "trtbuild", "nightly", "--policies", str(policies)]
    cmd += ["--out", str(out), "--history", str(tmp_path / "h.sqlite"), "--jobs", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRTBUILD_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    deadline = time.monotonic() + 60
    workers: list[str] = []
    while len(workers) < 2:  # the pool's two workers, started
        assert proc.poll() is None and time.monotonic() < deadline, "the night ended first"
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        time.sleep(0.01)
    time.sleep(0.5)  # into their first policies

    def published() -> list[str]:
        return sorted(p.name for p in out.iterdir()) if out.exists() else []

    before = [name for name in published() if ".staging-" not in name]
    if group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    code, said = (130, b"interrupted") if group else (143, b"terminated (SIGTERM)")
    assert proc.returncode == code and said in err, err.decode()
    if not group:  # (a group's Ctrl-C also reaches an ONNX Runtime child still starting
        # its interpreter, which may print Python's own "init_import_site" error)
        assert b"Traceback" not in err and b"Exception ignored" not in err, err.decode()
    time.sleep(2)  # a worker left running would publish its policy now
    assert all(not Path(f"/proc/{w}").exists() for w in workers), workers
    assert published() == before  # no policy finished after the signal, no staging left
