"""Figures of a :class:`~quotientsharp.engine.SharpnessResult`: block-wise sharpness.

Stage: result (after it; reads :class:`~.result.SharpnessResult` only, draws with matplotlib).

:func:`plot_blocks` draws, for one or several results measured with ``blockwise=True``, a
horizontal bar chart of the loss change per block (mean over batches), largest first, each bar
labelled with the block's norm share. matplotlib is optional (``pip install
'quotientsharp[plot]'``); its Agg canvas is used directly, so no global backend is switched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quotientsharp.engine.api import SharpnessResult

__all__ = ["BLOCK_COLOURS", "plot_blocks"]

#: Bar colour per block kind.
BLOCK_COLOURS = {"head": "#1f77b4", "diagonal": "#2ca02c", "binding": "#9467bd",
                 "parameter": "#7f7f7f"}


def _label(result: SharpnessResult) -> str:
    variant = f" ({result.variant})" if result.variant else ""
    return f"{result.measure.replace('_', '-')} sharpness{variant}, rho = {result.settings['rho']}"


def plot_blocks(results: SharpnessResult | Sequence[SharpnessResult]
                | Mapping[str, SharpnessResult], path: str | Path, top: int = 30,
                dpi: int = 120) -> Path:
    """Write a bar chart of the loss change per block to ``path`` (PNG, or any format
    matplotlib infers from the suffix).

    Parameters
    ----------
    results
        A result measured with ``blockwise=True``, a sequence of them, or a mapping
        ``title -> result``: one panel per result, stacked. Without titles a panel is titled
        with the measure, its variant and ``rho``.
    path
        Output file; its folder is created.
    top
        Blocks per panel: the ``top`` largest loss changes (by absolute value); the title says
        how many were left out.
    dpi
        Resolution.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        If a result has no block-wise data, or ``top < 1``.
    ImportError
        If matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as err:       # pragma: no cover - matplotlib is a test dependency
        raise ImportError("plot_blocks needs matplotlib: pip install 'quotientsharp[plot]'"
                          ) from err
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an integer >= 1, got {top!r}")
    panels: list[tuple[str, list[dict[str, Any]]]] = []
    if isinstance(results, Mapping):
        items = list(results.items())
    elif isinstance(results, Sequence):
        items = [("", result) for result in results]
    else:
        items = [("", results)]
    if not items:
        raise ValueError("results: nothing to plot")
    for title, result in items:
        summary = result.block_summary()
        if not summary:
            raise ValueError(f"results: {title or result.measure} has no block-wise data; "
                             "measure it with blockwise=True")
        panels.append((title or _label(result), summary))

    shown = [sorted(s, key=lambda r: abs(r["loss_change"]), reverse=True)[:top]
             for _, s in panels]
    heights = [0.28 * len(rows) + 1.2 for rows in shown]
    figure = Figure(figsize=(8.5, sum(heights)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for axis, (title, summary), rows in zip(axes, panels, shown, strict=True):
        rows = rows[::-1]              # largest at the top
        positions = list(range(len(rows)))
        values = [r["loss_change"] for r in rows]
        axis.barh(positions, values, color=[BLOCK_COLOURS.get(r["kind"], "#7f7f7f")
                                            for r in rows])
        axis.set_yticks(positions, [r["name"] for r in rows], fontsize=7)
        axis.axvline(0.0, color="black", linewidth=0.6)
        for position, record in zip(positions, rows, strict=True):
            axis.annotate(f" {100 * record['norm_share']:.1f}%", (record["loss_change"], position),
                          va="center", ha="left" if record["loss_change"] >= 0 else "right",
                          fontsize=6, color="#444444")
        left_out = len(summary) - len(rows)
        more = f" ({left_out} smaller blocks not shown)" if left_out else ""
        axis.set_title(f"{title}{more}", fontsize=9)
        axis.set_xlabel("loss change with only this block's part of the best perturbation "
                        "(mean over batches); label: norm share", fontsize=8)
        axis.margins(x=0.15)
        kinds = [k for k in BLOCK_COLOURS if any(r["kind"] == k for r in rows)]
        axis.legend(handles=[Patch(color=BLOCK_COLOURS[k], label=k) for k in kinds],
                    fontsize=7, loc="lower right")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path
