"""Scatter plots of generalisation against sharpness, one PNG per measure (matplotlib's Agg
canvas; optional: without it :data:`PLOT_INSTALL_HINT` is printed and nothing is written).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows.grid import GridPoint
from quotientsharp.workflows.labels import decades_note, tau_title

if TYPE_CHECKING:
    from matplotlib.axis import Axis

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
    """Tick values ``m 10^e`` inside ``[low, high]`` for a log axis: the first mantissa set of
    :data:`_TICK_MANTISSAS` giving at least ``least`` ticks, thinned to at most ``most``
    (matplotlib labels the minor ticks of a short axis with long labels that collide)."""
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


def _readable_log_axis(axis: Axis, values: Sequence[float]) -> None:
    """Few short labels on a log ``axis`` (:func:`log_ticks`), minor ticks unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ticks = log_ticks(min(values), max(values))
    if len(ticks) < 2:
        return              # a single value or a tiny range: matplotlib's choice stays
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def scatter_plots(x: Sequence[float], measures: Mapping[str, Sequence[float]], out_dir: Path,
                  *, x_label: str, color: Sequence[float] | None = None, color_label: str = "",
                  titles: Mapping[str, str] | None = None,
                  y_labels: Mapping[str, str] | None = None,
                  notes: Mapping[str, str] | None = None, color_scale: str = "auto",
                  vector: bool = True, panels: str | None = "panels") -> list[Path] | None:
    """One PNG per measure, ``scatter_{name}.png``: ``x`` (generalisation, one value per model)
    against the measure's values (``measures``: key -> one per model); beside each an SVG
    (``vector``), and one multi-panel figure of every measure (``scatter_{panels}.png``;
    ``panels=None``: none). Axes are logarithmic when every value on them is positive.

    ``color`` (one value per model) colours the points on the ``color_scale`` of
    :func:`color_mapping`; ``titles``, ``y_labels`` and ``notes`` map a measure key to its plot
    title, vertical label (default the key) and a note. Returns the per-measure PNG paths, or
    ``None`` (after printing :data:`PLOT_INSTALL_HINT`) when matplotlib is missing.
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
    colours = None if color is None else [float(value) for value in color]
    if colours is not None and len(colours) != len(xs):
        raise ValueError(f"color has {len(colours)} values for {len(xs)} x values")
    mapping = None if colours is None else color_mapping(colours, color_scale)
    columns = {}
    for name, values in measures.items():
        ys = [float(value) for value in values]
        if len(ys) != len(xs):
            raise ValueError(f"measure {name!r} has {len(ys)} values for {len(xs)} x values")
        columns[name] = ys
    written = []
    for name, ys in columns.items():
        figure = Figure(figsize=(4.8, 3.8), dpi=120)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        remarks = _draw_scatter(figure, axes, xs, ys, mapping, color_label, x_label,
                                (y_labels or {}).get(name, name), (titles or {}).get(name),
                                (notes or {}).get(name), legend=True)
        if remarks:
            # below the axes, as a footnote: inside them it would cover points
            figure.text(0.01, 0.01, "\n".join(remarks), fontsize=7, color="dimgray",
                        verticalalignment="bottom")
        figure.tight_layout(rect=(0, 0.035 * len(remarks), 1, 1))
        path = out_dir / f"scatter_{name}.png"
        _save(figure, path, vector)
        written.append(path)
    if panels is not None and len(columns) > 1:
        _save(_panel_figure(xs, columns, mapping, color_label, x_label, titles, y_labels,
                            notes), out_dir / f"scatter_{panels}.png", vector)
    return written


#: At most this many distinct colour values are drawn as categories (``color_scale="auto"``).
MAX_CATEGORIES = 8


@dataclass(frozen=True)
class ColorMapping:
    """How the colour values of the points become colours: ``kind`` ``"categorical"``,
    ``"log"`` or ``"linear"``, every point's value, and the sorted distinct values
    (categorical only)."""

    kind: str
    values: tuple[float, ...]
    categories: tuple[float, ...] = ()


def color_mapping(values: Sequence[float], scale: str = "auto") -> ColorMapping:
    """The colour scale of ``values``: ``scale`` ``"categorical"`` (a legend), ``"log"``,
    ``"linear"``, or ``"auto"`` (categorical for at most :data:`MAX_CATEGORIES` distinct
    values, log for positive values spanning a decade or more, else linear)."""
    if scale not in ("auto", "categorical", "log", "linear"):
        raise ValueError(f"color_scale must be 'auto', 'categorical', 'log' or 'linear', got "
                         f"{scale!r}")
    finite = [v for v in values if math.isfinite(v)]
    distinct = tuple(sorted(set(finite)))
    if scale == "auto":
        positive = bool(finite) and min(finite) > 0
        if 1 < len(distinct) <= MAX_CATEGORIES:
            scale = "categorical"
        elif positive and max(finite) >= 10 * min(finite):
            scale = "log"
        else:
            scale = "linear"
    if scale == "log" and finite and min(finite) <= 0:
        raise ValueError(f"color_scale 'log' needs positive colour values, got {min(finite)}")
    return ColorMapping(scale, tuple(values), distinct if scale == "categorical" else ())


def _draw_points(figure: Any, axes: Any, xs: Sequence[float], ys: Sequence[float],
                 keep: Sequence[int], mapping: ColorMapping | None, color_label: str,
                 legend: bool) -> None:
    """The points ``keep`` of ``(xs, ys)``, coloured by ``mapping``, with its key: a legend
    of the categories (when ``legend``), or a colour bar."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, Normalize

    if mapping is None:
        axes.scatter([xs[i] for i in keep], [ys[i] for i in keep], s=18)
    elif mapping.kind == "categorical":
        # tab10: colours that stay apart, ordered as the values
        palette = [colormaps["tab10"](k % 10) for k in range(len(mapping.categories))]
        for colour, category in zip(palette, mapping.categories, strict=True):
            chosen = [i for i in keep if mapping.values[i] == category]
            axes.scatter([xs[i] for i in chosen], [ys[i] for i in chosen], s=18,
                         color=colour, label=f"{category:g}")
        if legend and keep:
            axes.legend(title=color_label or None, fontsize=6, title_fontsize=7,
                        loc="best", markerscale=0.8)
    else:
        shown_c = [mapping.values[i] for i in keep]
        norm = (LogNorm(min(shown_c), max(shown_c)) if mapping.kind == "log" and shown_c
                else Normalize(min(shown_c), max(shown_c)) if shown_c else None)
        points = axes.scatter([xs[i] for i in keep], [ys[i] for i in keep], s=18, c=shown_c,
                              cmap="viridis", norm=norm)
        if keep:
            figure.colorbar(points, ax=axes, label=color_label)


def _draw_scatter(figure: Any, axes: Any, xs: Sequence[float], ys: Sequence[float],
                  mapping: ColorMapping | None, color_label: str, x_label: str, y_label: str,
                  title: str | None, note: str | None, legend: bool) -> list[str]:
    """One scatter on ``axes``; returns the remarks for below the figure."""
    keep = [i for i in range(len(xs)) if math.isfinite(xs[i]) and math.isfinite(ys[i])]
    _draw_points(figure, axes, xs, ys, keep, mapping, color_label, legend)
    # a log axis where every shown value is positive: the measures span decades
    for values, axis, set_scale in ((xs, axes.xaxis, axes.set_xscale),
                                    (ys, axes.yaxis, axes.set_yscale)):
        if keep and all(values[i] > 0 for i in keep):
            set_scale("log")
            _readable_log_axis(axis, [values[i] for i in keep])
    axes.set_xlabel(x_label)
    axes.set_ylabel(_two_lines(y_label), fontsize=9)
    if title:
        # two lines when long: one line wider than the figure is cut at both ends
        if len(title) > 55 and "; " in title:
            title = title.replace("; ", "\n", 1)
        axes.set_title(title, fontsize=9)
    candidates = [decades_note([ys[i] for i in keep]), note]
    if len(keep) < len(xs):
        candidates.append(f"{len(xs) - len(keep)} non-finite point(s) not shown")
    return [remark for remark in candidates if remark]


def _panel_figure(xs: Sequence[float], columns: Mapping[str, Sequence[float]],
                  mapping: ColorMapping | None, color_label: str, x_label: str,
                  titles: Mapping[str, str] | None, y_labels: Mapping[str, str] | None,
                  notes: Mapping[str, str] | None) -> Any:
    """Every measure in one figure, three panels a row, one shared colour key."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    count = len(columns)
    ncols = min(3, count)
    nrows = math.ceil(count / ncols)
    figure = Figure(figsize=(4.2 * ncols, 3.5 * nrows), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(nrows, ncols, squeeze=False)
    for index, (name, ys) in enumerate(columns.items()):
        axes = grid[index // ncols][index % ncols]
        letter = chr(ord("a") + index) if index < 26 else str(index)
        remarks = _draw_scatter(figure, axes, xs, ys, mapping, color_label, x_label,
                                (y_labels or {}).get(name, name),
                                f"({letter}) " + (titles or {}).get(name, ""),
                                (notes or {}).get(name), legend=index == 0)
        if remarks:
            axes.text(0.01, 0.01, "\n".join(remarks), transform=axes.transAxes, fontsize=6,
                      color="dimgray", verticalalignment="bottom")
    for index in range(count, nrows * ncols):
        grid[index // ncols][index % ncols].set_visible(False)
    return figure


def _save(figure: Any, path: Path, vector: bool) -> None:
    """``path`` (PNG) and, with ``vector``, the same figure as SVG beside it."""
    figure.savefig(path)
    if vector:
        figure.savefig(path.with_suffix(".svg"))


def study_plots(gaps: Sequence[float], values: Mapping[str, Sequence[float]],
                grid: Sequence[GridPoint], taus: Sequence[Mapping[str, Any]], folder: Path, *,
                x_label: str, color: Sequence[float] | None = None,
                color_label: str = "") -> list[Path] | None:
    """Write ``scatter_{key}.png`` for every grid point into ``folder``: the gap against the
    point's ``values``, titled by its row of ``taus``; ``None`` without matplotlib."""
    titles = {}
    for row in taus:
        interval = (None if row["tau_b_low"] is None
                    else (row["tau_b_low"], row["tau_b_high"]))
        titles[row["key"]] = tau_title(row["tau_a"], row["tau_b"], interval=interval,
                                       count=row["count"])
    return scatter_plots(gaps, {point.key: values[point.key] for point in grid}, folder,
                         x_label=x_label, color=color, color_label=color_label, titles=titles,
                         y_labels={point.key: point.label() for point in grid})
