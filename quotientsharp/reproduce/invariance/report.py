"""The measures and variants of ``quotientsharp reproduce invariance`` (:data:`FULL`,
:data:`QUICK`; torch-free, read by ``reproduce.config``), and its tables, figure and page data:
each measure's relative change beside its precision's *forward floor*, the clean-loss change
relative to the measure's value on the original model."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEASURES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("adaptive", "adaptive", {"measure": "adaptive"}),
    ("worst_case", "worst-case (L2)", {"measure": "worst_case"}),
    *((f"geodesic_{metric}_o{order}", f"geodesic {metric} (order {order})",
       {"measure": "geodesic", "metric": metric, "order": order})
      for metric in ("inv", "mix") for order in (1, 2)),
)
#: Precisions of the model (weights and forward); the geometry runs in float64 for a float64
#: model and in float32 otherwise (its h x h algebra in float64).
DTYPES = ("float64", "float32", "bfloat16")
RHO = 0.1


@dataclass(frozen=True)
class InvarianceSettings:
    """One variant of the study: orbit scales ``a``, sentences, Auto-PGD steps, and the keys of
    :data:`MEASURES` to run."""

    grid: tuple[float, ...]
    sentences: int
    n_iter: int
    measures: tuple[str, ...] = tuple(key for key, _, _ in MEASURES)

    def __post_init__(self) -> None:
        check_measures(self.measures)
        if not self.grid or any(not (a > 0 and math.isfinite(a)) for a in self.grid):
            raise ValueError(f"grid must hold finite scales a > 0, got {list(self.grid)}")

    def selected(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The entries of :data:`MEASURES` this variant runs."""
        return [entry for entry in MEASURES if entry[0] in self.measures]

    def as_dict(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "sentences": self.sentences, "n_iter": self.n_iter}


def check_measures(measures: Sequence[str]) -> None:
    """``ValueError`` unless ``measures`` is a non-empty subset of the keys of :data:`MEASURES`."""
    known = [key for key, _, _ in MEASURES]
    if not measures or not set(measures) <= set(known):
        raise ValueError(f"measures must be a non-empty subset of {known}, got "
                         f"{list(measures)}")


def log_grid(low: float, high: float, points: int) -> tuple[float, ...]:
    """``points`` values ``10^t``, ``t`` evenly spaced from ``log10 low`` to ``log10 high``."""
    start, stop = math.log10(low), math.log10(high)
    return tuple(float(10 ** (start + (stop - start) * k / (points - 1)))
                 for k in range(points))


FULL = InvarianceSettings(grid=log_grid(1e-2, 1e2, 9), sentences=8, n_iter=8)
QUICK = InvarianceSettings(grid=log_grid(1e-2, 1e2, 3), sentences=4, n_iter=2,
                           measures=("adaptive", "geodesic_inv_o2", "geodesic_mix_o2"))


def parse_dtypes(text: str | Sequence[str]) -> tuple[str, ...]:
    """The model precisions ``"float64,float32"`` (or a sequence of names), checked."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    if not names or any(not isinstance(n, str) or not n for n in names):
        raise ValueError(f"dtypes must be a comma-separated list of {', '.join(DTYPES)}, "
                         f"got {text!r}")
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise ValueError(f"dtypes: unknown precision(s) {unknown}; choose from "
                         f"{', '.join(DTYPES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"dtypes: a precision is listed twice in {text!r}")
    return tuple(names)


@dataclass
class DtypeRun:
    """One precision's run of the study (:func:`.study._dtype_study`)."""

    original: dict[str, Any]
    points: list[dict[str, Any]]
    computed_now: list[int]
    wall: float
    resumed: int
    world_size: int


_GEOMETRY = {"float64": "float64",
             "float32": "float32 (h x h GL algebra in float64)",
             "bfloat16": "float32 (h x h GL algebra in float64)"}


def measures_of(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """The entries of :data:`MEASURES` the records hold."""
    return [entry for entry in MEASURES if all(entry[0] in r for r in records)]


def largest_change(points: Sequence[Mapping[str, Any]], key: str) -> float:
    """``max_a |sharpness(reparametrised) / sharpness(original) - 1|`` of measure ``key``."""
    return max(abs(r[f"change_{key}"]) for r in points)


def median_change(points: Sequence[Mapping[str, Any]], key: str) -> float:
    """The median over the grid of ``|sharpness(reparametrised) / sharpness(original) - 1|``."""
    return statistics.median(abs(r[f"change_{key}"]) for r in points)


def forward_floor(points: Sequence[Mapping[str, Any]], original: Mapping[str, Any],
                  key: str) -> float:
    """``max_a |L_reparametrised(0) - L_original(0)| / sharpness(original)`` of measure ``key``:
    the clean-loss change over the grid in units of the measure's value."""
    return max(abs(r["clean_loss_change"]) for r in points) / abs(original[key])


#: Columns of the combined ``invariance.csv`` (every precision, original rows included).
CSV_COLUMNS = ["dtype", "point", "a", "max_condition", "max_logit_change", "clean_loss",
               "clean_loss_change", "gradient_error",
               *(c for key, _, _ in MEASURES for c in (key, f"change_{key}", f"{key}_kept"))]


def combined_rows(runs: Mapping[str, DtypeRun]) -> list[dict[str, Any]]:
    """The rows of the combined CSV: per precision its original model (point -1), then the
    grid points."""
    return [{"dtype": dtype, **{k: v for k, v in record.items() if k in CSV_COLUMNS}}
            for dtype, run in runs.items() for record in [run.original, *run.points]]


def plot_relative_changes(runs: Mapping[str, DtypeRun], path: Path) -> Path | None:
    """``|relative change|`` against ``a`` (log-log), a panel per precision, dashed the
    clean-loss change in units of the smallest geodesic sharpness; ``None`` without
    matplotlib. Exact zeros cannot be drawn on a log axis: the panel counts them."""
    from quotientsharp.workflows.plots import PLOT_INSTALL_HINT

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(PLOT_INSTALL_HINT, file=sys.stderr)
        return None
    dtypes = list(runs)
    figure = Figure(figsize=(3.6 * len(dtypes) + 1.0, 4.0), dpi=120)
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, len(dtypes), sharey=True, squeeze=False)[0]
    markers = ("o", "s", "^", "v", "D", "P")
    handles = []
    for axes, dtype in zip(panels, dtypes, strict=True):
        records = runs[dtype].points
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
        smallest = min((abs(runs[dtype].original[key]) for key, _, _ in measures_of(records)
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


def page_data(runs: Mapping[str, DtypeRun], variant: InvarianceSettings, *, quick: bool, seed: int,
              threads: int) -> dict[str, Any]:
    """What the study's page shows, as JSON values (the ``page`` of its page data), from each
    precision's run, the variant run and the study's arguments."""
    dtypes = list(runs)
    command = ("quotientsharp reproduce invariance" + (" --quick" if quick else "")
               + ("" if tuple(dtypes) == DTYPES else f" --dtypes {','.join(dtypes)}")
               + ("" if variant.measures == (QUICK if quick else FULL).measures
                  else f" --measures {','.join(variant.measures)}"))
    return {"command": command, "folder": "results/invariance" + ("-quick" if quick else ""),
            "quick": quick, "seed": seed, "threads": threads, "rho": RHO,
            "geometry": {d: _GEOMETRY[d] for d in dtypes},
            "measures": [[key, label] for key, label, _ in MEASURES],
            "variant": {**variant.as_dict(), "measures": list(variant.measures)},
            "runs": {d: {"points": r.points, "original": r.original, "wall": r.wall,
                         "resumed": r.resumed, "world_size": r.world_size}
                     for d, r in runs.items()}}


def console_lines(page: Mapping[str, Any]) -> list[str]:
    """The console's summary of :func:`page_data`: per precision, the largest relative change
    over the grid of each measure."""
    lines = []
    for dtype, run in page["runs"].items():
        changes = ", ".join(f"{label} {largest_change(run['points'], key):.1e}"
                            for key, label in page["measures"]
                            if all(key in r for r in run["points"]))
        lines.append(f"{dtype} model, largest |relative change| over the grid: {changes}")
    return lines
