"""The plots people read: legends beside the data, never on it; summary.html in a browser."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ROOT
from tests.helpers import chromium, keep_screenshot, pixels_near, run_browser
from trtbuild.cli import main
from trtbuild.nightly.summary import trend_figure

LINE_COLOR = "#1f77b4"  # matplotlib's first line colour: the first output's median


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def assert_legends_clear(fig) -> None:
    """Every legend sits outside every axes of its figure, in readable text."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "the figure has no legend"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not _overlaps(box, ax.get_window_extent(renderer)), "a legend covers the data"
        assert min(t.get_fontsize() for t in legend.get_texts()) >= 9


def _points(nights: int) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "run": k + 1,
            "started": f"2026-11-{k + 1:02d}T02:00:00+00:00",
            "status": "pass" if k % 4 else "fail",
            "outputs": {
                name: {"median_abs": float(rng.uniform(1e-4, 1e-3)), "max_abs": 1e-2 * (k + 1)}
                for name in ("restored", "total", "a_long_output_name_for_the_legend")
            },
        }
        for k in range(nights)
    ]


@pytest.mark.parametrize("nights", [1, 2, 30, 60])
def test_trend_legend_is_beside_the_lines(nights):
    import matplotlib.pyplot as plt

    fig = trend_figure("nafnet", _points(nights))
    try:
        assert_legends_clear(fig)
    finally:
        plt.close(fig)


def test_a_trend_plots_an_error_past_fp32s_range_as_missing_not_as_a_crash():
    """A history whose stored error is 1e308 (changed by hand, or a fault: no FP32 output's
    error is past 3.4e38) overflowed the log axis' margin to inf and ended the night as an
    internal error (found by changing the history's values at random)."""
    from trtbuild.nightly.summary import trend_png

    points = _points(3)
    points[1]["outputs"]["total"]["median_abs"] = 1e308
    assert trend_png("nafnet", points).startswith(b"\x89PNG")


def test_report_plot_legends_are_clear_of_the_data(example_policy, monkeypatch):
    """Every plot of report.html: the error curve, each histogram, the heatmap."""
    import matplotlib.pyplot as plt

    from trtbuild import evaluation, front
    from trtbuild.accuracy import report_html
    from trtbuild.policy import load_policy

    stages = front.run_front(load_policy(example_policy("nafnet")))
    report = evaluation.evaluate_all(stages, engines={}, backend="none")
    figures = []
    monkeypatch.setattr(report_html, "_png", lambda fig: figures.append(fig) or "data:,")
    report_html.html(report)
    assert len(figures) == 4  # curve, two histograms, one heatmap
    for fig in figures:
        if any(ax.get_legend() for ax in fig.axes):
            assert_legends_clear(fig)
        plt.close(fig)


@pytest.fixture(scope="module")
def summary_page(tmp_path_factory, models_dir):
    """Three nights of two policies: trends with a few points each."""
    tmp = tmp_path_factory.mktemp("summary")
    policies = tmp / "policies"
    policies.mkdir()
    for name in ("nafnet", "gfpgan"):
        text = (ROOT / "policies" / f"{name}.yaml").read_text()
        (policies / f"{name}.yaml").write_text(text.replace("../models/", f"{models_dir}/"))
    args = ["nightly", "--policies", str(policies), "--out", str(tmp / "out")]
    for _ in range(3):
        assert main([*args, "--history", str(tmp / "h.sqlite"), "--backend", "none"]) == 0
    return tmp / "out" / "summary.html"


def test_headless_chromium_renders_the_summary(summary_page, tmp_path):
    browser = chromium()
    url = summary_page.resolve().as_uri()
    dom = run_browser(browser, tmp_path, "--dump-dom", "--virtual-time-budget=5000", url).stdout
    loaded = re.search(r'data-plots-loaded="(\d+)/(\d+)"', dom)
    assert loaded, "the page's load handler did not run"
    assert loaded.group(1) == loaded.group(2) == "2", "a trend plot failed to decode"

    shot = tmp_path / "summary.png"
    run_browser(browser, tmp_path, f"--screenshot={shot}", "--window-size=1400,1200", url)
    keep_screenshot(shot)
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.std() > 10, "the screenshot is blank"
    assert pixels_near(img, LINE_COLOR) > 200  # the trend lines are on screen


def test_a_trend_plot_leaves_the_caller_s_matplotlib_backend():
    """`main(["summary", ...])` runs in a caller's process: the trends called
    `matplotlib.use("Agg")`, and the caller's backend was Agg after it."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import matplotlib; matplotlib.use('pdf')\n"
        "from tests.nightly.test_summary_html import _points\n"
        "from trtbuild.nightly.summary import trend_png\n"
        "assert trend_png('nafnet', _points(3)).startswith(b'\\x89PNG')\n"
        "print(matplotlib.get_backend())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pdf"
