"""Scatter plots of generalisation against sharpness, one PNG per measure.

:func:`scatter_plots` writes one PNG per measure with matplotlib's Agg canvas (matplotlib is
optional: without it :data:`PLOT_INSTALL_HINT` is printed and no figure is written); a log
axis gets a few short tick labels (:func:`log_ticks`). :func:`study_plots` is
``quotientsharp study``'s: one plot per grid point, the gap against the measure, each plot's
vertical axis naming the measure, metric, order and radius
(:meth:`~quotientsharp.workflows.grid.GridPoint.label`), its title the Kendall taus with the
bootstrap interval of tau-b and the number of models, and an axis spanning many decades a note.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows.grid import GridPoint
from quotientsharp.workflows.labels import decades_note, tau_title

if TYPE_CHECKING:
    from matplotlib.axis import Axis

__all__ = ["PLOT_INSTALL_HINT", "log_ticks", "scatter_plots", "study_plots", "tick_text"]

PLOT_INSTALL_HINT = ("matplotlib is not installed, so no scatter plots were written "
                     "(pip install 'quotientsharp[plot]', or pass --no-plots)")


def _two_lines(label: str, width: int = 36) -> str:
    """A long axis label broken before its parenthesis: ``name\n(details)``."""
    if len(label) <= width or " (" not in label:
        return label
    head, _, tail = label.partition(" (")
    return f"{head}\n({tail}"


#: Mantissas tried, in turn, for the ticks of a log axis (:func:`log_ticks`).
_TICK_MANTISSAS = ((1,), (1, 2, 5), (1, 2, 3, 5), (1, 2, 3, 4, 5, 6, 8))


def log_ticks(low: float, high: float, least: int = 2, most: int = 6) -> list[float]:
    """Tick values ``m 10^e`` inside ``[low, high]`` for a log axis.

    The first mantissa set of ``(1)``, ``(1, 2, 5)``, ``(1, 2, 3, 5)``, ``(1, 2, 3, 4, 5, 6, 8)``
    giving at least ``least`` ticks is used (sparse where a log axis crowds: 7 and 9 are
    left out), thinned to at most ``most`` (every second tick, and so on). matplotlib's
    own locator labels the minor ticks of an axis spanning less than a decade with long
    ``2 x 10^-2`` labels that run into each other; these few ticks take short labels.

    Raises ``ValueError`` unless ``0 < low <= high`` are finite.
    """
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"log ticks need 0 < low <= high, got low={low!r}, high={high!r}")
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    ticks: list[float] = []
    for mantissas in _TICK_MANTISSAS:
        ticks = [float(f"{m}e{e}") for e in range(first, last + 1) for m in mantissas]
        ticks = [t for t in ticks if low * (1 - 1e-12) <= t <= high * (1 + 1e-12)]
        if len(ticks) >= least:
            break
    step = math.ceil(len(ticks) / most) if ticks else 1
    return ticks[::step]


def tick_text(value: float) -> str:
    """A short tick label: ``0.02``, ``300``, ``2e-05``."""
    return f"{value:g}"


def _readable_log_axis(axis: Axis, values: Sequence[float]) -> None:
    """Few short labels on a log ``axis`` (:func:`log_ticks`), minor ticks unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ticks = log_ticks(min(values), max(values))
    if len(ticks) < 2:
        return              # a single value or a tiny range: matplotlib's choice stays
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda value, _: tick_text(value)))
    axis.set_minor_formatter(NullFormatter())


def scatter_plots(x: Sequence[float], measures: Mapping[str, Sequence[float]], out_dir: Path,
                  *, x_label: str, prefix: str = "scatter_",
                  color: Sequence[float] | None = None, color_label: str = "",
                  titles: Mapping[str, str] | None = None,
                  y_labels: Mapping[str, str] | None = None,
                  notes: Mapping[str, str] | None = None) -> list[Path] | None:
    """One PNG per measure: ``x`` against the measure's values, ``{prefix}{name}.png``.

    Parameters
    ----------
    x
        The horizontal values (generalisation), one per model.
    measures
        Measure key (file name) -> its values, one per model.
    out_dir
        Folder of the PNG files (created if missing).
    x_label
        Label of the horizontal axis.
    prefix
        File-name prefix.
    color, color_label
        Optional colour value per model, with the colour bar's label.
    titles
        Measure key -> plot title (the taus: :func:`~quotientsharp.workflows.labels.tau_title`).
    y_labels
        Measure key -> label of the vertical axis (readable:
        :func:`~quotientsharp.workflows.labels.measure_label`); default the key.
    notes
        Measure key -> a note written in the plot, below the automatic one for an axis that
        spans many decades (:func:`~quotientsharp.workflows.labels.decades_note`).

    Returns
    -------
    list of Path or None
        The written paths, or ``None`` (after printing :data:`PLOT_INSTALL_HINT` to stderr)
        when matplotlib is missing.

    Notes
    -----
    Axes are logarithmic when every value on them is positive, with a few short tick labels
    (:func:`log_ticks`). matplotlib's Agg canvas is used directly, so no global backend is
    switched.
    """

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(PLOT_INSTALL_HINT, file=sys.stderr)
        return None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    xs = [float(value) for value in x]
    written = []
    for name, values in measures.items():
        ys = [float(value) for value in values]
        if len(ys) != len(xs):
            raise ValueError(f"measure {name!r} has {len(ys)} values for {len(xs)} x values")
        keep = [i for i in range(len(xs)) if math.isfinite(xs[i]) and math.isfinite(ys[i])]
        figure = Figure(figsize=(4.8, 3.8), dpi=120)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        shown_x, shown_y = [xs[i] for i in keep], [ys[i] for i in keep]
        points = (axes.scatter(shown_x, shown_y, s=18) if color is None
                  else axes.scatter(shown_x, shown_y, s=18, c=[float(color[i]) for i in keep],
                                    cmap="viridis"))
        if color is not None and keep:
            figure.colorbar(points, ax=axes, label=color_label)
        if keep and all(xs[i] > 0 for i in keep):
            axes.set_xscale("log")
            _readable_log_axis(axes.xaxis, [xs[i] for i in keep])
        if keep and all(ys[i] > 0 for i in keep):
            axes.set_yscale("log")
            _readable_log_axis(axes.yaxis, [ys[i] for i in keep])
        axes.set_xlabel(x_label)
        axes.set_ylabel(_two_lines((y_labels or {}).get(name, name)), fontsize=9)
        if titles and name in titles:
            # two lines when long: one line wider than the figure is cut at both ends
            title = titles[name]
            if len(title) > 55 and "; " in title:
                title = title.replace("; ", "\n", 1)
            axes.set_title(title, fontsize=9)
        candidates = [decades_note([ys[i] for i in keep]), (notes or {}).get(name)]
        if len(keep) < len(xs):
            candidates.append(f"{len(xs) - len(keep)} non-finite point(s) not shown")
        remarks = [remark for remark in candidates if remark]
        if remarks:
            # below the axes, as a footnote: inside them it would cover points
            figure.text(0.01, 0.01, "\n".join(remarks), fontsize=7, color="dimgray",
                        verticalalignment="bottom")
        figure.tight_layout(rect=(0, 0.035 * len(remarks), 1, 1))
        path = out_dir / f"{prefix}{name}.png"
        figure.savefig(path)
        written.append(path)
    return written



def study_plots(gaps: Sequence[float], values: Mapping[str, Sequence[float]],
                grid: Sequence[GridPoint], taus: Sequence[Mapping[str, Any]], folder: Path, *,
                x_label: str, color: Sequence[float] | None = None,
                color_label: str = "") -> list[Path] | None:
    """Write ``scatter_{key}.png`` for every grid point into ``folder``.

    Parameters
    ----------
    gaps
        One gap per model.
    values
        Grid key -> one value per model.
    grid, taus
        The grid points and their rows of :func:`~quotientsharp.workflows.report.tau_rows`.
    folder
        Output folder.
    x_label
        The horizontal axis (:func:`~quotientsharp.workflows.report.gap_label`).
    color, color_label
        A manifest key's value per model, and its name (``--color``).

    Returns
    -------
    list of Path or None
        The files written; ``None`` without matplotlib (a hint is printed).
    """
    titles = {}
    for row in taus:
        interval = (None if row["tau_b_low"] is None
                    else (row["tau_b_low"], row["tau_b_high"]))
        titles[row["key"]] = tau_title(row["tau_a"], row["tau_b"], interval=interval,
                                       count=row["count"])
    return scatter_plots(gaps, {point.key: values[point.key] for point in grid}, folder,
                         x_label=x_label, color=color, color_label=color_label, titles=titles,
                         y_labels={point.key: point.label() for point in grid})
