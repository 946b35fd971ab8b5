"""``reproduce diagonal``: the records, the Kendall taus, the plots and the docs section.

The names of the results files and the CSV columns, one net's record (:func:`model_record`, its
CSV row :func:`csv_row`), the Kendall taus between test loss and each measure with their table
(:func:`kendall_taus`), the scatter plots (:func:`scatter_measures`) and the markdown section
``docs/results/diagonal.md`` (:func:`study_section`). :class:`StudyResult` is what the study
returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..sharpness.solver import checkpoints
from .common import (
    TauRow,
    kendall_tau_a,
    kendall_tau_b,
    scatter_plots,
    tau_table,
)
from .diagonal_data import Hyperparameters
from .diagonal_measures import MEASURE_NAMES, MEASURES, MeasureSpec, path_name
from .diagonal_settings import DiagonalSettings
from .diagonal_training import TrainedNet
from .labels import measure_label, tau_title

__all__ = [
    "CSV_COLUMNS",
    "CSV_FILE",
    "MODEL_FILE",
    "SECTION_FILE",
    "STUDY",
    "TRAINED_FILE",
    "StudyResult",
    "csv_row",
    "default_out",
    "kendall_taus",
    "measure_axis_label",
    "model_record",
    "scatter_measures",
    "study_section",
    "tau_text",
]


STUDY = "diagonal"
MODEL_FILE, TRAINED_FILE, CSV_FILE = "models.jsonl", "trained.jsonl", "models.csv"
SECTION_FILE = f"{STUDY}.md"
CSV_COLUMNS = ("model", "init_scale", "learning_rate", "batch_size", "steps", "train_loss",
               "converged", "diverged", "test_loss", *MEASURE_NAMES)


@dataclass
class StudyResult:
    """What :func:`run_study` did and found."""

    records: list[dict[str, Any]]
    taus: dict[str, dict[str, float | None]]
    counted: list[int]
    unconverged: list[int]
    diverged: list[int]
    trained_now: list[int]
    measured_now: list[int]
    wall_seconds: float
    markdown: str
    table: str
    out: Path
    plots: list[Path] | None = field(default=None)


def model_record(hyper: Hyperparameters, net: TrainedNet, test_loss: float,
                 per_batch: dict[str, list[float]] | None) -> dict[str, Any]:
    """One net's record of ``models.jsonl``: its draw, training, test loss and sharpness."""
    record: dict[str, Any] = {
        "model": hyper.model, "init_scale": hyper.init_scale,
        "learning_rate": hyper.learning_rate, "batch_size": hyper.batch_size,
        "schedule_seed": hyper.schedule_seed, "steps": net.steps, "train_loss": net.train_loss,
        "converged": net.converged, "diverged": net.diverged, "test_loss": test_loss,
        "beta_l1": float(sum(abs(a * b) for a, b in zip(net.u, net.v, strict=True))),
        "min_abs_beta": float(min(abs(a * b) for a, b in zip(net.u, net.v, strict=True))),
    }
    record["sharpness"] = ({k: sum(vals) / len(vals) for k, vals in per_batch.items()}
                           if per_batch is not None else None)
    record["sharpness_per_batch"] = per_batch
    return record


def csv_row(record: dict[str, Any]) -> dict[str, Any]:
    """The ``models.csv`` row of a record (mean sharpness per measure, no per-batch values)."""
    row = {k: record.get(k) for k in CSV_COLUMNS if k not in MEASURE_NAMES}
    for name in MEASURE_NAMES:
        row[name] = (record["sharpness"] or {}).get(name, "")
    return row


def _canonical_command(settings: DiagonalSettings) -> str:
    parts = ["quotientsharp reproduce diagonal"]
    default = DiagonalSettings.quick() if settings.variant == "quick" else DiagonalSettings()
    if settings.variant == "quick":
        parts.append("--quick")
    if settings.seed != default.seed:
        parts.append(f"--seed {settings.seed}")
    if settings.nets != default.nets:
        parts.append(f"--nets {settings.nets}")
    return " ".join(parts)


def default_out(settings: DiagonalSettings) -> str:
    """The default results folder of ``settings``' variant."""
    return "results/diagonal-quick" if settings.variant == "quick" else "results/diagonal"


def _summary_stats(values: Sequence[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = (ordered[middle] if len(ordered) % 2
              else 0.5 * (ordered[middle - 1] + ordered[middle]))
    return ordered[0], median, ordered[-1]


def study_section(settings: DiagonalSettings, result: StudyResult,
                  records: list[dict[str, Any]], wall: float, resumed: int, threads: int,
                  world_size: int = 1) -> str:
    """The markdown section ``docs/results/diagonal.md`` (also ``diagonal.md`` in the results
    folder)."""
    counted = [r for r in records if r["model"] in result.counted]
    test = [r["test_loss"] for r in counted]
    lines = [
        "## Diagonal networks (paper Sec. 5.1)",
        "",
        f"Reproduce: `{_canonical_command(settings)}` (outputs in `{default_out(settings)}/`; add "
        "`--docs docs` to rewrite this section and regenerate this page). "
        f"This run: {len(records)} nets, {len(counted)} counted, wall time {wall:.1f} s "
        f"({threads} torch thread(s)"
        + (f" per rank, {world_size} ranks under torchrun: training on rank 0, the measures "
           "dealt over the ranks" if world_size > 1 else "")
        + f"{', resumed' if resumed else ''}).",
        "",
        f"Setup (ours; the paper does not state n, rho or what varies): d = {settings.d}, "
        f"n = {settings.n_train} Gaussian training inputs, {settings.n_test} test inputs, "
        f"beta* with {settings.support} nonzero N(0, 1) entries rescaled to unit norm, "
        f"noiseless targets; u0 = a 1, v0 = 0; per net a ~ logU{list(settings.init_scale)}, "
        f"learning rate ~ logU{list(settings.learning_rate)}, batch size ~ "
        f"U{list(settings.batch_sizes)}; minibatch gradient descent to training loss "
        f"< {settings.target_loss:g} (at most {settings.max_steps} steps). Sharpness on the "
        f"training set in {settings.n_train // settings.sharpness_batch_size} batches of "
        f"{settings.sharpness_batch_size} (per batch, then averaged), rho = {settings.rho:g} "
        f"for every measure, Auto-PGD with N = {settings.n_iter}, "
        f"checkpoints {checkpoints(settings.n_iter)}. Generalisation: test loss. "
        f"Seed {settings.seed}.",
        "",
        "Kendall tau between test loss and sharpness (negative: sharper nets generalise "
        "better):",
        "",
        result.table,
        "",
        "The paper's geodesic numbers are placed on the exact-geodesic rows; its Alg. 1 uses "
        "the second-order path (order-2 rows).",
        "",
        "Spread of each measure over the counted nets:",
        "",
        "| measure | path | min | median | max |",
        "|---|---|---|---|---|",
    ]
    for spec in MEASURES:
        values = [r["sharpness"][spec.name] for r in counted]
        low, mid, high = _summary_stats(values) if values else (math.nan,) * 3
        path = path_name(spec)
        lines.append(f"| {spec.name} | {path} | {low:.3g} | {mid:.3g} | {high:.3g} |")
    lines += [
        "",
        "Facts that hold whatever the numbers, to read the table by:",
        "",
        "- From `xi = 0`, the adaptive ascent on `(u, v)` never leaves the horizontal space "
        "(its raised gradient `dL/dbeta' (1 + b) beta (u, v)` is horizontal at every iterate), "
        "so it coincides with the order-1 inv geodesic ascent: those two rows agree up to "
        "rounding (order 1 under the GL(1) inv metric is exactly adaptive sharpness).",
        "- The exact mix path `beta (1 + 2b)` is a straight line in `beta` with "
        "`||d beta|| <= sqrt(2) rho`: plain L2 worst-case sharpness of the linear model in "
        "`beta`. On data shared by all nets it is about `2 rho^2 lambda_max(X_B^T X_B / B)` "
        "plus a gradient term that vanishes at interpolation, so it barely varies between "
        "nets.",
        "- The mix ball allows rates `|b_i|` up to `rho / (sqrt(2) |beta_i|)`: the order-1 and "
        "order-2 mix values are dominated by the smallest `|beta_i|` and spread over many "
        "decades.",
    ]
    if test:
        low, mid, high = _summary_stats(test)
        lines += ["", f"Test loss over the counted nets: min {low:.3g}, median {mid:.3g}, "
                  f"max {high:.3g}."]
    if result.unconverged or result.diverged:
        missed = []
        if result.unconverged:
            missed.append(f"net(s) {result.unconverged} still above the target loss after "
                          f"{settings.max_steps} steps")
        if result.diverged:
            missed.append(f"net(s) {result.diverged} diverged")
        lines += ["", f"Not counted in the correlations: {'; '.join(missed)}."]
    else:
        lines += ["", "Every net reached the target training loss."]
    return "\n".join(lines) + "\n"


def kendall_taus(records: Sequence[dict[str, Any]], counted: Sequence[int]
                 ) -> tuple[dict[str, dict[str, float | None]], str]:
    """Kendall tau-a and tau-b between test loss and each measure over the counted nets.

    Returns
    -------
    tuple
        Measure name -> ``tau_a``, ``tau_b``, the paper's value and the number of nets; and the
        markdown table of the taus.
    """
    taus: dict[str, dict[str, float | None]] = {}
    rows = []
    for spec in MEASURES:
        pairs = [(r["test_loss"], r["sharpness"][spec.name]) for r in records
                 if r["model"] in counted and not math.isnan(r["sharpness"][spec.name])]
        if len(pairs) >= 2:
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            tau_a, tau_b = kendall_tau_a(xs, ys), kendall_tau_b(xs, ys)
        else:
            tau_a = tau_b = None
        taus[spec.name] = {"tau_a": tau_a, "tau_b": tau_b, "paper": spec.paper,
                           "count": len(pairs)}
        rows.append(TauRow(spec.name, tau_a, tau_b, spec.paper, spec.note))
    table = tau_table(rows)
    return taus, table


def measure_axis_label(spec: MeasureSpec, rho: float | None = None) -> str:
    """The readable vertical-axis label of a measure of the study (measure, metric, order,
    radius)."""
    if spec.kind == "adaptive":
        return measure_label("adaptive", rho=rho)
    return measure_label("geodesic", metric=spec.metric, order=spec.order, rho=rho)


#: What the plots of the mix measures with first- and second-order paths say about their
#: spread (see the docs section: the smallest ``|beta_i|`` dominates them).
_MIX_NOTE = "dominated by the smallest |beta_i| (see the results page)"


def scatter_measures(records: Sequence[dict[str, Any]], counted: Sequence[int],
                     taus: dict[str, dict[str, float | None]],
                     folder: Path, rho: float | None = None) -> list[Path] | None:
    """One scatter plot of test loss against each measure over the counted nets, in ``folder``.

    The vertical axis names the measure, metric, order and ``rho``; the title holds our Kendall
    taus and the paper's where it reports one; an axis spanning many decades gets a note.
    """
    counted_records = [r for r in records if r["model"] in counted]
    return scatter_plots(
        [r["test_loss"] for r in counted_records],
        {spec.name: [r["sharpness"][spec.name] for r in counted_records]
         for spec in MEASURES},
        folder, x_label="test loss",
        color=[math.log10(r["init_scale"]) for r in counted_records],
        color_label="log10 init scale a",
        titles={name: tau_title(t["tau_a"], t["tau_b"], paper=t.get("paper"))
                for name, t in taus.items()},
        y_labels={spec.name: measure_axis_label(spec, rho) for spec in MEASURES},
        notes={spec.name: _MIX_NOTE for spec in MEASURES
               if spec.metric == "mix" and spec.order in (1, 2)})


def tau_text(value: float | None) -> str:
    """A tau for a plot title: signed, two decimals, or ``"undefined"``."""
    return "undefined" if value is None else f"{value:+.2f}"
