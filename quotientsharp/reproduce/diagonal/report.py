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

from quotientsharp.engine.solver import checkpoints
from quotientsharp.reproduce.diagonal.analysis import spread
from quotientsharp.reproduce.diagonal.data import Hyperparameters
from quotientsharp.reproduce.diagonal.exact import EXTRA_NAMES
from quotientsharp.reproduce.diagonal.measures import (
    MEASURE_NAMES,
    MEASURES,
    MeasureSpec,
    path_name,
)
from quotientsharp.reproduce.diagonal.page import run_sections
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.training import TrainedNet
from quotientsharp.workflows.labels import measure_label, tau_title
from quotientsharp.workflows.plots import scatter_plots
from quotientsharp.workflows.taus import kendall_tau_a, kendall_tau_b

STUDY = "diagonal"
MODEL_FILE, TRAINED_FILE, CSV_FILE = "models.jsonl", "trained.jsonl", "models.csv"
SECTION_FILE = f"{STUDY}.md"
CSV_COLUMNS = ("model", "init_scale", "learning_rate", "batch_size", "steps", "train_loss",
               "converged", "diverged", "test_loss", *MEASURE_NAMES, *EXTRA_NAMES)


@dataclass
class StudyResult:
    """What :func:`diagonal_study` did and found."""

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
    analysis: dict[str, Any] | None = field(default=None)


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
    row = {k: record.get(k) for k in CSV_COLUMNS if k not in (*MEASURE_NAMES, *EXTRA_NAMES)}
    for name in (*MEASURE_NAMES, *EXTRA_NAMES):
        row[name] = (record["sharpness"] or {}).get(name, "")
    return row


def _canonical_command(settings: DiagonalSettings, full: bool = False) -> str:
    parts = ["quotientsharp reproduce diagonal"] + (["--full"] if full else [])
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


def study_section(settings: DiagonalSettings, result: StudyResult,
                  records: list[dict[str, Any]], wall: float, resumed: int, threads: int,
                  world_size: int = 1, full: Sequence[str] = (), runs: int = 1) -> str:
    """The markdown section ``docs/results/diagonal.md`` (also ``diagonal.md`` in the results
    folder); ``full``: the lines of the ``--full`` tables, placed before the per-run details,
    and ``runs`` the number of runs they took (``wall`` is their total)."""
    counted = [r for r in records if r["model"] in result.counted]
    test = [r["test_loss"] for r in counted]
    lines = [
        "## Diagonal networks (paper Sec. 5.1)",
        "",
        f"Reproduce: `{_canonical_command(settings, bool(full))}` (outputs in "
        f"`{default_out(settings)}/`; add "
        "`--docs docs` to rewrite this section and regenerate this page"
        + ("" if full else "; `--full` adds the data seeds, the ρ sweep and the variants")
        + f"). This run: {len(records)} nets, {len(counted)} counted"
        + (f" (and {runs - 1} more runs of {len(records)} nets below)" if runs > 1 else "")
        + f", wall time {_duration(wall)}{' in all' if runs > 1 else ''} "
        f"({threads} torch thread(s)"
        + (f" per rank, {world_size} ranks under torchrun: training on rank 0, the measures "
           "dealt over the ranks" if world_size > 1 else "")
        + f"{', resumed' if resumed else ''}).",
        "",
        f"Setup (ours; the paper does not state n, rho or what varies): d = {settings.d}, "
        f"n = {settings.n_train} Gaussian training inputs "
        f"({'one set per net' if settings.training_sets == 'per_net' else 'shared by the nets'}"
        f"), {settings.n_test} test inputs, "
        f"beta* with {settings.support} nonzero N(0, 1) entries rescaled to unit norm, "
        f"noiseless targets; u0 = a 1, v0 = 0; per net a ~ logU{list(settings.init_scale)}, "
        f"learning rate ~ logU{list(settings.learning_rate)}, batch size ~ "
        f"U{list(settings.batch_sizes)}; minibatch gradient descent to training loss "
        f"< {settings.target_loss:g} (at most {settings.max_steps} steps). Sharpness on the "
        f"training set in {settings.n_train // settings.sharpness_batch_size} batches of "
        f"{settings.sharpness_batch_size} (per batch, then averaged), rho = {settings.rho:g} "
        f"for every measure, Auto-PGD with N = {settings.n_iter}, "
        f"checkpoints {checkpoints(settings.n_iter)}. Generalisation: test loss. "
        f"Seed {settings.seed}, data seed {settings.problem_seed}.",
        "",
        "Kendall tau between test loss and sharpness (negative: sharper nets generalise "
        "better), with 95 % bootstrap intervals; the paper's values are in a separate table "
        "below:",
        "",
        result.table,
        "",
    ]
    if result.analysis is not None:
        lines += run_sections(settings, result.analysis)
    lines += [""] + list(full)
    lines += [
        "### Spread of each measure",
        "",
        "| measure | path | min | median | max |",
        "|---|---|---|---|---|",
    ]
    for spec in MEASURES:
        values = [r["sharpness"][spec.name] for r in counted]
        stats = spread(values) if values else dict.fromkeys(("min", "median", "max"), math.nan)
        label = spec.name + (" (diagnostic)" if spec.diagnostic else "")
        lines.append(f"| {label} | {path_name(spec)} | {stats['min']:.3g} | "
                     f"{stats['median']:.3g} | {stats['max']:.3g} |")
    lines += [
        "",
        "From `xi = 0`, the adaptive ascent on `(u, v)` never leaves the horizontal space "
        "(its raised gradient `dL/dbeta' (1 + b) beta (u, v)` is horizontal at every iterate), "
        "so it coincides with the order-1 inv geodesic ascent: those two rows agree up to "
        "rounding (order 1 under the GL(1) inv metric is exactly adaptive sharpness).",
    ]
    if test:
        stats = spread(test)
        lines += ["", f"Test loss over the counted nets: min {stats['min']:.3g}, median "
                  f"{stats['median']:.3g}, max {stats['max']:.3g}."]
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


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def kendall_taus(records: Sequence[dict[str, Any]], counted: Sequence[int]
                 ) -> dict[str, dict[str, float | None]]:
    """Kendall tau-a and tau-b between test loss and each measure over the counted nets (the
    diagnostic rows are not measures and get none).

    Returns
    -------
    dict
        Measure name -> ``tau_a``, ``tau_b``, the paper's value and the number of nets.
    """
    taus: dict[str, dict[str, float | None]] = {}
    for spec in MEASURES:
        if spec.diagnostic:
            continue
        pairs = [(r["test_loss"], r["sharpness"][spec.name]) for r in records
                 if r["model"] in counted and not math.isnan(r["sharpness"][spec.name])]
        tau_a: float | None
        tau_b: float | None
        if len(pairs) >= 2:
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            tau_a, tau_b = kendall_tau_a(xs, ys), kendall_tau_b(xs, ys)
        else:
            tau_a = tau_b = None
        taus[spec.name] = {"tau_a": tau_a, "tau_b": tau_b, "paper": spec.paper,
                           "count": len(pairs)}
    return taus


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
                     analysis: dict[str, Any] | None,
                     folder: Path, rho: float | None = None) -> list[Path] | None:
    """One scatter plot of test loss against each measure over the counted nets, in ``folder``.

    The vertical axis names the measure, metric, order and ``rho``; the title holds our Kendall
    taus with the bootstrap interval of tau-b (the paper's values are compared in a table of
    their own), or says that a diagnostic row is not a measure; an axis spanning many decades
    gets a note.
    """
    counted_records = [r for r in records if r["model"] in counted]
    titles = {spec.name: "diagnostic, outside the expansion's validity (not a measure)"
              for spec in MEASURES if spec.diagnostic}
    if analysis is not None:
        for name, t in analysis["taus"].items():
            interval = (None if t["b_low"] is None or t["b_high"] is None
                        else (t["b_low"], t["b_high"]))
            titles[name] = tau_title(t["tau_a"], t["tau_b"], interval=interval)
    return scatter_plots(
        [r["test_loss"] for r in counted_records],
        {spec.name: [r["sharpness"][spec.name] for r in counted_records]
         for spec in MEASURES},
        folder, x_label="test loss",
        color=[r["init_scale"] for r in counted_records],
        color_label="init scale a", color_scale="log",
        titles=titles,
        y_labels={spec.name: measure_axis_label(spec, rho) for spec in MEASURES},
        notes={spec.name: _MIX_NOTE for spec in MEASURES if spec.diagnostic})


def tau_text(value: float | None) -> str:
    """A tau for a plot title: signed, two decimals, or ``"undefined"``."""
    return "undefined" if value is None else f"{value:+.2f}"
