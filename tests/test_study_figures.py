"""Tick labels of the studies' scatter plots: few, short, and never overlapping."""

from __future__ import annotations

import math
import random

import pytest

from quotientsharp.workflows.plots import log_ticks

matplotlib = pytest.importorskip("matplotlib")


@pytest.mark.parametrize(("low", "high"), [(0.017, 0.09), (0.018, 0.04), (0.06, 4.0),
                                           (1.7e-8, 76.0), (300.0, 1100.0), (2e-5, 3e-5)])
def test_log_ticks_lie_in_range_are_round_and_few(low, high):
    ticks = log_ticks(low, high)
    assert ticks == sorted(ticks) and len(ticks) <= 6
    for tick in ticks:
        assert low * (1 - 1e-9) <= tick <= high * (1 + 1e-9)
        exponent = math.floor(math.log10(tick))
        mantissa = tick / 10 ** exponent
        assert abs(mantissa - round(mantissa)) < 1e-9, tick      # 1, 2, ..., 9 times 10^e
    # a range that holds at least two round values gets at least two ticks
    if math.floor(math.log10(high)) > math.floor(math.log10(low)) or high / low >= 2:
        assert len(ticks) >= 2


def test_log_ticks_reject_a_bad_range():
    with pytest.raises(ValueError, match="low"):
        log_ticks(0.0, 1.0)
    with pytest.raises(ValueError, match="low"):
        log_ticks(2.0, 1.0)


def _overlaps(boxes) -> bool:
    return any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1:])


def test_scatter_tick_labels_do_not_overlap(tmp_path, monkeypatch):
    """The ViT case that overlapped: a gap axis spanning less than a decade (0.017-0.09)."""
    import matplotlib.figure

    from quotientsharp.workflows.plots import scatter_plots

    rng = random.Random(0)
    x = [10 ** rng.uniform(-1.77, -1.05) for _ in range(32)]
    measures = {"narrow": [10 ** rng.uniform(-1.75, -1.4) for _ in range(32)],
                "wide": [10 ** rng.uniform(-8, 2) for _ in range(32)]}
    captured = []
    savefig = matplotlib.figure.Figure.savefig

    def spy(figure, path, *args, **kwargs):
        # the per-measure PNGs (their SVG twins and the multi-panel figure are checked below)
        if str(path).endswith(".png") and "panels" not in str(path):
            captured.append(figure)
        return savefig(figure, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    written = scatter_plots(x, measures, tmp_path, x_label="gap", color=list(range(32)),
                            color_label="size")
    assert written is not None and len(captured) == 2
    for name in ("scatter_narrow", "scatter_wide", "scatter_panels"):
        assert (tmp_path / f"{name}.png").is_file() and (tmp_path / f"{name}.svg").is_file()
    for figure in captured:
        renderer = figure.canvas.get_renderer()
        axes = figure.axes[0]
        for axis in (axes.xaxis, axes.yaxis):
            labels = [t for t in axis.get_ticklabels(which="both")
                      if t.get_visible() and t.get_text()]
            assert len(labels) >= 2
            assert not _overlaps([t.get_window_extent(renderer) for t in labels])


def test_colour_scales_separate_the_hyperparameter_values() -> None:
    from quotientsharp.workflows.plots import MAX_CATEGORIES, color_mapping

    sizes = [256.0, 512.0, 1024.0, 256.0, 512.0]
    assert color_mapping(sizes).kind == "categorical"
    assert color_mapping(sizes).categories == (256.0, 512.0, 1024.0)
    spread = [10 ** (-3 + 3 * k / 40) for k in range(41)]
    assert color_mapping(spread).kind == "log"
    assert color_mapping([0.1 * k for k in range(MAX_CATEGORIES + 5)]).kind == "linear"
    assert color_mapping(sizes, "linear").kind == "linear"
    with pytest.raises(ValueError, match="positive"):
        color_mapping([-1.0, 2.0], "log")
    with pytest.raises(ValueError, match="color_scale"):
        color_mapping(sizes, "rainbow")


def test_categorical_and_log_colours_draw_distinct_colours(tmp_path, monkeypatch) -> None:
    import matplotlib.figure
    import numpy as np

    from quotientsharp.workflows.plots import scatter_plots

    figures = []
    savefig = matplotlib.figure.Figure.savefig

    def spy(figure, path, *args, **kwargs):
        if str(path).endswith("scatter_m.png"):
            figures.append(figure)
        return savefig(figure, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    x = [0.1 * (k + 1) for k in range(12)]
    # three categories: three scatter collections with three different colours and a legend
    scatter_plots(x, {"m": x}, tmp_path, x_label="gap", color=[256.0, 512.0, 1024.0] * 4,
                  color_label="size", panels=None, vector=False)
    axes = figures[-1].axes[0]
    colours = {tuple(np.round(c.get_facecolor()[0], 6)) for c in axes.collections}
    assert len(axes.collections) == 3 and len(colours) == 3
    assert axes.get_legend() is not None
    assert not (tmp_path / "scatter_m.svg").exists()
    # a log scale: the smallest decade gets as much of the colour range as the largest
    init = [10 ** (-3 + 3 * k / 11) for k in range(12)]
    scatter_plots(x, {"m": x}, tmp_path, x_label="gap", color=init, color_label="a",
                  color_scale="log", panels=None)
    norm = figures[-1].axes[0].collections[0].norm
    assert type(norm).__name__ == "LogNorm"
    assert norm(1e-2) == pytest.approx(1 / 3, abs=1e-9)
