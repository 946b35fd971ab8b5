"""``quotientsharp study``: one scatter plot per grid point, the gap against the measure.

Each plot's vertical axis names the measure, metric, order and radius
(:meth:`~quotientsharp.workflows.grid.GridPoint.label`), its title holds the Kendall taus with the
bootstrap interval of tau-b and the number of models, and an axis spanning many decades gets a
note (:func:`quotientsharp.workflows.results.scatter_plots`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotientsharp.workflows.grid import GridPoint
from quotientsharp.workflows.labels import tau_title
from quotientsharp.workflows.results import scatter_plots

__all__ = ["study_plots"]


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
