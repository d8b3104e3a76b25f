"""report.html: self-contained, and its plots really render in a browser."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
from PIL import Image

from tests.helpers import chromium, keep_screenshot, pixels_near, run_browser
from trtbuild.accuracy.report_html import BASELINE_COLOR, POLICY_COLOR
from trtbuild.cli import main


@pytest.fixture(scope="module")
def nafnet_report(tmp_path_factory, nafnet_path):
    from tests.conftest import NAFNET_POLICY, PINS

    tmp = tmp_path_factory.mktemp("html")
    policy = tmp / "policy.yaml"
    text = NAFNET_POLICY.format(model=nafnet_path, rules=PINS, backend="none")
    # walk: always, so the passing policy's error curve is drawn beside the baseline's
    more = "  samples: 2\n  fp32_check: true\n  walk: always"
    policy.write_text(text.replace("  samples: 2", more))
    assert main(["build", "--policy", str(policy), "--out", str(tmp / "out")]) == 0
    return tmp / "out"


def test_page_is_self_contained_with_every_plot_embedded(nafnet_report):
    page = (nafnet_report / "report.html").read_text()
    assert "<link" not in page and not re.search(r"(src|href)=\"https?:", page)
    plots = re.findall(r'data-plot="([^"]+)"[^>]*src="data:image/png;base64,([^"]+)"', page)
    kinds = [k for k, _ in plots]
    # the curve, one histogram per output (restored, total), a heatmap for the image output
    assert kinds == ["error-curve", "histogram", "histogram", "heatmap"]
    for _, data in plots:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "/blocks.0/norm1/Pow" in page  # the baseline's first divergence is named


def test_fp32_check_is_reported(nafnet_report):
    report = json.loads((nafnet_report / "report.json").read_text())
    fp32 = report["baselines"]["fp32"]
    assert fp32["passed"] and fp32["evaluator"] == "onnxrt-fp32-graph"
    assert fp32["outputs"]["restored"]["max_abs"] < 1e-4
    assert "All-FP32 check" in (nafnet_report / "report.html").read_text()


def test_headless_chromium_renders_every_plot(nafnet_report, tmp_path):
    browser = chromium()
    url = (nafnet_report / "report.html").resolve().as_uri()
    dom = run_browser(browser, tmp_path, "--dump-dom", "--virtual-time-budget=5000", url).stdout
    loaded = re.search(r'data-plots-loaded="(\d+)/(\d+)"', dom)
    assert loaded, "the page's load handler did not run"
    assert loaded.group(1) == loaded.group(2) == "4", "a plot failed to decode"

    shot = tmp_path / "report.png"
    run_browser(browser, tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", url)
    keep_screenshot(shot)
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape == (3000, 1200, 3)
    assert img.std() > 10, "the screenshot is blank"
    # the policy's curve and histograms (blue), the baseline's (orange) are on screen
    assert pixels_near(img, POLICY_COLOR) > 1000
    assert pixels_near(img, BASELINE_COLOR) > 1000


def test_markdown_and_html_show_the_same_sections(nafnet_report):
    from html import unescape

    md = (nafnet_report / "report.md").read_text().splitlines()
    md_titles = [line[3:] for line in md if line.startswith("## ")]
    page = (nafnet_report / "report.html").read_text()
    found = re.findall(r"<h2>(.*?)</h2>|<summary>(.*?)</summary>", page)
    html_titles = [unescape(a or b) for a, b in found]
    assert md_titles == html_titles
    assert "All-FP32 check" in md_titles and "Pinned nodes (37)" in md_titles


def test_an_error_map_and_histogram_leave_out_a_sample_whose_shape_is_not_fp32s():
    """A count the data decides (NonZero's, NMS's) made the all-FP16 output another shape:
    its panel says so, and the policy's map and both histograms still draw."""
    from types import SimpleNamespace

    from trtbuild.accuracy.report_html import heatmap_plot, histogram_plot
    from trtbuild.accuracy.sessions import REFERENCE

    ref = np.linspace(0, 1, 3 * 16 * 16, dtype=np.float32).reshape(1, 3, 16, 16)

    def verdict(out: np.ndarray) -> SimpleNamespace:
        return SimpleNamespace(evaluator="emulated-fp16",
                               run_results={REFERENCE: [{"y": ref}], "emulated-fp16": [{"y": out}]})  # fmt: skip

    main, base = verdict(ref + 1e-3), verdict(ref[:, :, :15])
    for a, b in ((main, base), (base, base)):  # the policy's too: no map at all, no scale
        for plot in (heatmap_plot("y", a, b), histogram_plot("y", a, b)):
            png = base64.b64decode(plot.split(",", 1)[1])
            assert Image.open(io.BytesIO(png)).size[0] > 100


def test_drawing_the_report_leaves_the_caller_s_matplotlib_as_it_was(tmp_path, nafnet_path):
    """A notebook's or a script's backend and its figures are its own: the report drew
    through pyplot after `matplotlib.use("Agg")`, and after a `build` the caller's backend
    was Agg (a notebook's inline plots gone)."""
    import subprocess
    import sys

    from tests.conftest import NAFNET_POLICY, PINS, ROOT

    policy = tmp_path / "policy.yaml"
    policy.write_text(NAFNET_POLICY.format(model=nafnet_path, rules=PINS, backend="none"))
    code = (
        "import matplotlib; matplotlib.use('pdf'); import matplotlib.pyplot as plt, trtbuild\n"
        f"trtbuild.build({str(policy)!r}, {str(tmp_path / 'out')!r}, quiet=True)\n"
        "print(matplotlib.get_backend(), plt.get_fignums())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "pdf []"
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3  # the curve and the histograms drawn
