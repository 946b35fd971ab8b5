"""``reproduce diagonal``: the records, the numbers of one run, the Kendall taus, the plots and
the page data."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quotientsharp.engine.solver import checkpoints
from quotientsharp.reproduce.diagonal.data import Hyperparameters, derived_seed
from quotientsharp.reproduce.diagonal.exact import (
    EXTRA_NAMES,
    REFERENCE_MEASURES,
    mix_exact_population,
)
from quotientsharp.reproduce.diagonal.measures import (
    MEASURE_NAMES,
    MEASURES,
    MeasureSpec,
    path_name,
)
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.training import TrainedNet
from quotientsharp.workflows.labels import measure_label, tau_title
from quotientsharp.workflows.plots import scatter_plots
from quotientsharp.workflows.taus import kendall_tau_a, kendall_tau_b, tau_interval

STUDY = "diagonal"
MODEL_FILE, TRAINED_FILE, CSV_FILE = "models.jsonl", "trained.jsonl", "models.csv"
PAGE_FILE = "page.json"
CSV_COLUMNS = ("model", "init_scale", "learning_rate", "batch_size", "steps", "train_loss",
               "converged", "diverged", "test_loss", *MEASURE_NAMES, *EXTRA_NAMES)


#: The hyperparameters drawn per net, whose rank correlation with the test loss is reported.
CONFOUNDS = ("init_scale", "learning_rate", "batch_size")
#: Measure -> the record key of its maximum: the exact maximum where there is one (the trust
#: region of mix exact), else the strong reference ascent.
MAXIMUM_OF = {**{spec.name: ("exact:" if spec.name == "geodesic_mix_exact" else "strong:")
                 + spec.name for spec in REFERENCE_MEASURES},
              "geodesic_mix_exact_rateball": "exact:geodesic_mix_exact_rateball"}


def spread(values: Sequence[float]) -> dict[str, float]:
    """Minimum, median and maximum."""
    if not values:
        raise ValueError("spread of no values")
    ordered = sorted(values)
    return {"min": ordered[0], "median": statistics.median(values), "max": ordered[-1]}


def analyse(records: Sequence[Mapping[str, Any]], counted: Sequence[int],
            settings: DiagonalSettings) -> dict[str, Any]:
    """Every derived number of one run, from the nets' records (``models.jsonl``) and the
    nets that enter the correlations (``counted``)."""
    rows = [r for r in records if r["model"] in set(counted)]
    if len(rows) < 2:
        raise ValueError(f"counted must hold at least 2 nets, got {len(rows)}")
    test = [r["test_loss"] for r in rows]
    seed = derived_seed(settings.seed, "bootstrap")

    def tau(values: Sequence[float]) -> dict[str, Any]:
        return tau_interval(test, values, settings.bootstrap, seed).as_dict()

    def column(key: str) -> list[float]:
        return [r["sharpness"][key] for r in rows]

    out: dict[str, Any] = {
        "counted": len(rows),
        "taus": {m.name: tau(column(m.name)) for m in MEASURES if not m.diagnostic},
        "maximum_taus": {name: tau(column(key)) for name, key in MAXIMUM_OF.items()},
        "population_taus": {
            **{m.name: tau(column(f"population:{m.name}")) for m in REFERENCE_MEASURES},
            **{f"{name}_max": tau(column(f"population_exact:{name}"))
               for name in ("geodesic_mix_exact", "geodesic_mix_exact_rateball")}},
        "confounds": {name: tau([float(r[name]) for r in rows]) for name in CONFOUNDS},
    }
    percent = {}
    for name, key in MAXIMUM_OF.items():
        maxima = column(key)
        if min(maxima) <= 0:
            raise ValueError(f"the maximum of {name} is not positive for some net: "
                             f"{min(maxima)!r}")
        percent[name] = spread([100.0 * r["sharpness"][name] / m
                                for r, m in zip(rows, maxima, strict=True)])
    out["percent_of_maximum"] = percent
    exact = column("exact:geodesic_mix_exact")
    strong = column("strong:geodesic_mix_exact")
    out["strong_over_exact_mix"] = spread([s / e for s, e in zip(strong, exact, strict=True)])
    theory = column("interpolation:geodesic_mix_exact")
    out["interpolation"] = {
        "theory": spread(theory),
        "exact": spread(exact),
        "auto_pgd": spread(column("geodesic_mix_exact")),
        "largest_relative_deviation": max(abs(e - t) / t
                                          for e, t in zip(exact, theory, strict=True)),
        "largest_train_loss": max(r["train_loss"] for r in rows),
    }
    population = column("population_loss")
    closed_form = mix_exact_population(torch.tensor(population, dtype=torch.float64),
                                       settings.rho).tolist()
    measured = column("population_exact:geodesic_mix_exact")
    out["population"] = {
        "loss": spread(population),
        "closed_form_largest_relative_deviation": max(
            abs(m - c) / c for m, c in zip(measured, closed_form, strict=True)),
        "tau_population_loss": tau_interval(population, measured, settings.bootstrap,
                                            seed).as_dict(),
    }
    min_abs_beta = [r["min_abs_beta"] for r in rows]
    out["diagnostics"] = {
        m.name: {**spread(column(m.name)),
                 "tau_min_abs_beta": tau_interval(min_abs_beta, column(m.name),
                                                  settings.bootstrap, seed).as_dict()}
        for m in MEASURES if m.diagnostic}
    return out


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
    page: dict[str, Any]
    out: Path
    analysis: dict[str, Any] | None = None


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


def page_data(settings: DiagonalSettings, result: StudyResult, records: list[dict[str, Any]],
              wall: float, resumed: int, threads: int, world_size: int = 1,
              full: dict[str, Any] | None = None, runs: int = 1,
              command: str | None = None) -> dict[str, Any]:
    """What the study's page shows, as JSON values; ``full`` the statistics of ``--full`` over
    ``runs`` runs; ``command`` the one that reproduces it (default: the canonical one)."""
    counted = [r for r in records if r["model"] in result.counted]
    test = [r["test_loss"] for r in counted]
    spreads = []
    for spec in MEASURES:
        values = [r["sharpness"][spec.name] for r in counted]
        stats = spread(values) if values else dict.fromkeys(("min", "median", "max"), math.nan)
        spreads.append({"label": spec.name + (" (diagnostic)" if spec.diagnostic else ""),
                        "path": path_name(spec), **stats})
    setup = settings.as_dict()
    setup.update(init_scale=list(settings.init_scale),
                 learning_rate=list(settings.learning_rate),
                 batch_sizes=list(settings.batch_sizes),
                 checkpoints=list(checkpoints(settings.n_iter)),
                 problem_seed=settings.problem_seed,
                 reference_runs=settings.reference_ascent.runs)
    return {"command": command if command is not None
            else _canonical_command(settings, full is not None),
            "folder": default_out(settings), "setup": setup, "nets": len(records),
            "counted": len(counted), "runs": runs, "wall_seconds": wall, "resumed": resumed,
            "threads": threads, "world_size": world_size, "analysis": result.analysis,
            "full": full, "spread": spreads,
            "test_loss": spread(test) if test else None,
            "unconverged": list(result.unconverged), "diverged": list(result.diverged)}


def kendall_taus(records: Sequence[dict[str, Any]], counted: Sequence[int]
                 ) -> dict[str, dict[str, float | None]]:
    """Per measure (not the diagnostic rows), Kendall tau-a and tau-b between test loss and it
    over the counted nets, the paper's value and the number of nets."""
    taus: dict[str, dict[str, float | None]] = {}
    for spec in MEASURES:
        if spec.diagnostic:
            continue
        pairs = [(r["test_loss"], r["sharpness"][spec.name]) for r in records
                 if r["model"] in counted and not math.isnan(r["sharpness"][spec.name])]
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        enough = len(pairs) >= 2
        taus[spec.name] = {"tau_a": kendall_tau_a(xs, ys) if enough else None,
                           "tau_b": kendall_tau_b(xs, ys) if enough else None,
                           "paper": spec.paper, "count": len(pairs)}
    return taus


def measure_axis_label(spec: MeasureSpec, rho: float | None = None) -> str:
    """The vertical-axis label of a measure of the study (measure, metric, order, radius)."""
    if spec.kind == "adaptive":
        return measure_label("adaptive", rho=rho)
    return measure_label("geodesic", metric=spec.metric, order=spec.order, rho=rho)


#: What the plots of the mix measures with first- and second-order paths say about their
#: spread (see the docs section: the smallest ``|beta_i|`` dominates them).
_MIX_NOTE = "dominated by the smallest |beta_i| (see the results page)"


def scatter_measures(records: Sequence[dict[str, Any]], counted: Sequence[int],
                     analysis: dict[str, Any] | None,
                     folder: Path, rho: float | None = None) -> list[Path] | None:
    """One scatter plot of test loss against each measure over the counted nets, in ``folder``,
    titled with the taus."""
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


def tau_lines(result: StudyResult) -> list[str]:
    """The console's taus: per measure tau-b with its bootstrap interval (tau-b alone when
    too few nets were counted for the analysis)."""
    lines = []
    for spec in MEASURES:
        if spec.diagnostic:
            continue
        if result.analysis is not None:
            tau = result.analysis["taus"][spec.name]
            value, low, high = tau["tau_b"], tau.get("b_low"), tau.get("b_high")
        else:
            value, low, high = result.taus[spec.name]["tau_b"], None, None
        text = "undefined" if value is None else f"{value:+.2f}" + (
            "" if low is None or high is None else f" [{low:+.2f}, {high:+.2f}]")
        lines.append(f"{spec.name}: Kendall tau-b {text}")
    return lines
