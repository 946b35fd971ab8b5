"""Family studies: the CSV columns, the Kendall taus of the gap against each measure and each
drawn hyperparameter, and the page data (rendered by ``docs/_hooks/results_pages/families.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from quotientsharp.reproduce.families.measures import MeasureSpec
from quotientsharp.reproduce.families.settings import FamilyStudy


def spec_label(spec: MeasureSpec, greek: bool = True) -> str:
    """The readable name of a measure: measure, metric, order, radius and eps (when not 0)."""
    from quotientsharp.workflows.labels import measure_label

    label = measure_label(spec.measure, metric=spec.options.get("metric"),
                          order=spec.options.get("order"), rho=spec.rho,
                          p=spec.options.get("p"), greek=greek)
    eps = spec.options.get("eps")
    # the Gram relaxation tells the eps-sweep variants apart
    return label if not eps else f"{label}, eps {eps:g}"


#: The bootstrap of every tau interval: resampled models, seed, nominal coverage.
BOOTSTRAP: dict[str, Any] = {"resamples": 1000, "seed": 0, "confidence": 0.95}
#: The family-wise error level of the Holm-corrected comparisons over study seeds.
FAMILY_WISE_LEVEL = 0.05

#: Hyperparameters a confound tau is computed for, when the study draws them.
CONFOUNDS = ("learning_rate", "weight_decay", "epochs", "label_smoothing", "train_size",
             "batch_size", "warmup_fraction", "rank")


def csv_columns(specs: Sequence[MeasureSpec],
                hyperparameters: Sequence[str] = ()) -> list[str]:
    """Columns of ``models.csv``; ``hyperparameters``: drawn ones beyond the standard five."""
    return (["index", "learning_rate", "weight_decay", "epochs", "label_smoothing",
             "train_size", *hyperparameters, "init_seed", "parameters",
             "final_train_objective", "train_error", "test_error", "gap", "train_loss",
             "test_loss"]
            + [spec.key for spec in specs] + ["diverged", "train_seconds", "measure_seconds"])


def _taus(gaps: Sequence[float], values: Sequence[float]) -> dict[str, Any]:
    """Tau-a, tau-b and their bootstrap intervals (``None`` where undefined; NaN pairs out)."""
    from quotientsharp.workflows.taus import tau_interval, without_nan

    kept = without_nan(gaps, values)
    if len(kept[0]) < 2:
        return {"tau_a": None, "tau_b": None, "tau_a_interval": None, "tau_b_interval": None}
    tau = tau_interval(*kept, BOOTSTRAP["resamples"], BOOTSTRAP["seed"],
                       BOOTSTRAP["confidence"])
    return {"tau_a": tau.tau_a, "tau_b": tau.tau_b,
            "tau_a_interval": None if tau.a_low is None else [tau.a_low, tau.a_high],
            "tau_b_interval": None if tau.b_low is None else [tau.b_low, tau.b_high]}


#: ``(gaps, values) -> row fields``: the taus and intervals of one measure or hyperparameter.
TauFields = Callable[[Sequence[float], Sequence[float]], dict[str, Any]]


def tau_rows(records: Sequence[Mapping[str, Any]], specs: Sequence[MeasureSpec],
             paper: Mapping[str, float], taus: TauFields = _taus) -> list[dict[str, Any]]:
    """Kendall taus between the gap and each measure with their intervals (``taus``: another
    estimate), next to the paper's value."""
    gaps = [float(r["gap"]) for r in records]
    return [{"key": spec.key, "measure": spec.label, "rho": spec.rho,
             **taus(gaps, [float(r[spec.key]) for r in records]),
             "paper": paper.get(spec.paper_key) if spec.paper_key else None}
            for spec in specs]


def confound_rows(records: Sequence[Mapping[str, Any]],
                  taus: TauFields = _taus) -> list[dict[str, Any]]:
    """Kendall taus between the gap and each drawn hyperparameter of :data:`CONFOUNDS`."""
    gaps = [float(r["gap"]) for r in records]
    names = [name for name in CONFOUNDS if records and all(name in r for r in records)]
    return [{"hyperparameter": name, **taus(gaps, [float(r[name]) for r in records])}
            for name in names]


def ablation_rows(records: Sequence[Mapping[str, Any]],
                  specs: Sequence[MeasureSpec]) -> list[dict[str, Any]]:
    """Per metric, the spread over the models of order 2 over order 1 and of each Gram
    relaxation ``eps`` over ``eps = 0`` (order 2)."""
    import statistics

    keys = {spec.key: spec for spec in specs}
    rows = []
    for metric in ("inv", "mix"):
        base = f"geodesic_{metric}_o2"
        if base not in keys:
            continue
        pairs = [("order 2 / order 1", base, f"geodesic_{metric}_o1")]
        pairs += [(f"eps {spec.options['eps']:g} / eps 0 (order 2)", spec.key, base)
                  for spec in specs if spec.measure == "geodesic"
                  and spec.options.get("metric") == metric and spec.options.get("order") == 2
                  and spec.options.get("eps", 0.0) > 0]
        for label, top, bottom in pairs:
            if top not in keys or bottom not in keys:
                continue
            ratios = [r[top] / r[bottom] for r in records if r[bottom] > 0]
            rows.append({"metric": metric, "ratio": label, "numerator": top,
                         "denominator": bottom, "count": len(ratios),
                         "median": statistics.median(ratios) if ratios else None,
                         "min": min(ratios) if ratios else None,
                         "max": max(ratios) if ratios else None})
    return rows


def solver_rows(records: Sequence[Mapping[str, Any]],
                specs: Sequence[MeasureSpec]) -> list[dict[str, Any]]:
    """Per ascent measure, :func:`quotientsharp.workflows.report.solver_quality` over the
    models and batches (measures without reach or locality left out)."""
    from quotientsharp.workflows.report import solver_quality

    rows = []
    for spec in specs:
        flat = [{"reach": {spec.key: r.get(f"{spec.key}_reach")},
                 "locality": {spec.key: r.get(f"{spec.key}_locality")}} for r in records]
        quality = solver_quality(flat, spec.key)
        if quality["reach_min"] is None and quality["local"] is None:
            continue
        rows.append({"measure": spec_label(spec), **quality})
    return rows


def device_text(device: str) -> str:
    """The device, with the visible CPU cores or the GPU's name."""
    import os

    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device}: {torch.cuda.get_device_name(torch.device(device))}"
    return f"{device}: {os.cpu_count()} CPU cores visible" if device == "cpu" else device


def page_data(study: FamilyStudy, settings: Mapping[str, Any],
              records: Sequence[Mapping[str, Any]], taus: Sequence[Mapping[str, Any]],
              wall_seconds: float, threads: int, resumed: int, world_size: int = 1,
              confounds: Sequence[Mapping[str, Any]] = (), device: str = "cpu",
              pretrained_note: str = "", specs: Sequence[MeasureSpec] = (),
              seeded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the study's page shows, as JSON values (``seeded``: the statistics over several
    study seeds, which replace the single-seed tables)."""
    from quotientsharp.engine.blocks import LOCALITY_RULE

    counted = [r for r in records if not r["diverged"]]
    ranges = None if not counted else {
        key: [min(r[key] for r in counted), max(r[key] for r in counted)]
        for key in ("gap", "train_error", "test_error")}
    return {
        "study": {"name": study.name, "title": study.title,
                  "description": " ".join(study.description.split()),
                  "paper_setting": study.paper_setting,
                  "measurement_note": study.measurement_note},
        "settings": dict(settings), "models": len(records), "counted": len(counted),
        "diverged": [r["index"] for r in records if r["diverged"]], "ranges": ranges,
        "taus": [dict(row) for row in taus], "confounds": [dict(row) for row in confounds],
        "seeded": None if seeded is None else dict(seeded),
        "wall_seconds": wall_seconds, "threads": threads, "resumed": resumed,
        "world_size": world_size, "device": device_text(device),
        "pretrained_note": pretrained_note,
        "solver": solver_rows(counted, specs) if specs else [],
        # how `local` was judged: pages of earlier runs say under their tables which rule
        "locality_rule": LOCALITY_RULE,
        "ablation": ablation_rows(counted, specs) if specs else [],
        "bootstrap": dict(BOOTSTRAP), "family_wise_level": FAMILY_WISE_LEVEL}
