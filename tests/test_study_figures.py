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

    def spy(figure, *args, **kwargs):
        captured.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    written = scatter_plots(x, measures, tmp_path, x_label="gap", color=list(range(32)),
                            color_label="size")
    assert written is not None and len(captured) == 2
    for figure in captured:
        renderer = figure.canvas.get_renderer()
        axes = figure.axes[0]
        for axis in (axes.xaxis, axes.yaxis):
            labels = [t for t in axis.get_ticklabels(which="both")
                      if t.get_visible() and t.get_text()]
            assert len(labels) >= 2
            assert not _overlaps([t.get_window_extent(renderer) for t in labels])
