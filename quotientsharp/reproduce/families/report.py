"""Family studies (ViT, BERT): the per-model CSV columns, the Kendall taus and the docs section.

:func:`csv_columns` names the columns of ``models.csv``, :func:`tau_rows` computes Kendall's tau
between the generalisation gap and each measure, with 95% percentile bootstrap intervals over
the models, next to the paper's value, :func:`confound_rows` the same taus between the gap and
each drawn hyperparameter, and :func:`family_section` writes the markdown section
``docs/results/<study>.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from quotientsharp.reproduce.families.measures import MeasureSpec
from quotientsharp.reproduce.families.settings import FamilyStudy


def spec_label(spec: MeasureSpec, greek: bool = True) -> str:
    """The readable name of a measure of the study: measure, metric, order, radius and (when
    not 0) the Gram relaxation eps."""
    from quotientsharp.workflows.labels import measure_label

    label = measure_label(spec.measure, metric=spec.options.get("metric"),
                          order=spec.options.get("order"), rho=spec.rho,
                          p=spec.options.get("p"), greek=greek)
    eps = spec.options.get("eps")
    # the Gram relaxation tells the eps-sweep variants apart
    return label if not eps else f"{label}, eps {eps:g}"


class _BootstrapSettings(TypedDict):
    resamples: int
    seed: int
    confidence: float


#: The bootstrap of every tau interval: resampled models, seed, nominal coverage.
BOOTSTRAP: _BootstrapSettings = {"resamples": 1000, "seed": 0, "confidence": 0.95}

#: Hyperparameters a confound tau is computed for, when the study draws them.
CONFOUNDS = ("learning_rate", "weight_decay", "epochs", "label_smoothing", "train_size",
             "batch_size", "warmup_fraction", "rank")


def csv_columns(specs: Sequence[MeasureSpec],
                hyperparameters: Sequence[str] = ()) -> list[str]:
    """Columns of the per-model CSV (per-batch values stay in the JSONL file);
    ``hyperparameters``: drawn ones beyond the standard five (``batch_size``, ...)."""
    return (["index", "learning_rate", "weight_decay", "epochs", "label_smoothing",
             "train_size", *hyperparameters, "init_seed", "parameters",
             "final_train_objective", "train_error", "test_error", "gap", "train_loss",
             "test_loss"]
            + [spec.key for spec in specs] + ["diverged", "train_seconds", "measure_seconds"])


def _taus(gaps: Sequence[float], values: Sequence[float]) -> dict[str, Any]:
    """Tau-a, tau-b and their bootstrap intervals (``None`` where undefined; pairs with a NaN
    left out), by :func:`~quotientsharp.workflows.taus.tau_interval`."""
    from quotientsharp.workflows.taus import tau_interval, without_nan

    kept = without_nan(gaps, values)
    if len(kept[0]) < 2:
        return {"tau_a": None, "tau_b": None, "tau_a_interval": None, "tau_b_interval": None}
    tau = tau_interval(*kept, BOOTSTRAP["resamples"], BOOTSTRAP["seed"],
                       BOOTSTRAP["confidence"])
    return {"tau_a": tau.tau_a, "tau_b": tau.tau_b,
            "tau_a_interval": None if tau.a_low is None else [tau.a_low, tau.a_high],
            "tau_b_interval": None if tau.b_low is None else [tau.b_low, tau.b_high]}


def tau_rows(records: Sequence[Mapping[str, Any]], specs: Sequence[MeasureSpec],
             paper: Mapping[str, float]) -> list[dict[str, Any]]:
    """Kendall tau-a and tau-b between the gap and each measure, with 95% bootstrap intervals
    (:data:`BOOTSTRAP`), next to the paper's value."""
    gaps = [r["gap"] for r in records]
    return [{"key": spec.key, "measure": spec.label, "rho": spec.rho,
             **_taus(gaps, [r[spec.key] for r in records]),
             "paper": paper.get(spec.paper_key) if spec.paper_key else None}
            for spec in specs]


def confound_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Kendall taus between the gap and each drawn hyperparameter (:data:`CONFOUNDS` present
    in the records), with bootstrap intervals: how much of the gap the recipe alone ranks."""
    gaps = [r["gap"] for r in records]
    names = [name for name in CONFOUNDS if records and all(name in r for r in records)]
    return [{"hyperparameter": name, **_taus(gaps, [float(r[name]) for r in records])}
            for name in names]


def ablation_rows(records: Sequence[Mapping[str, Any]],
                  specs: Sequence[MeasureSpec]) -> list[dict[str, Any]]:
    """Per-model ratios that size the geodesic ablations: order 2 over order 1 (what the
    second-order term adds to the corrected norm), and each Gram relaxation ``eps`` over
    ``eps = 0`` (order 2), per metric; median, minimum and maximum over the models whose
    denominator is positive (``count`` of them)."""
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


def solver_table(records: Sequence[Mapping[str, Any]], specs: Sequence[MeasureSpec]) -> str:
    """Markdown: per ascent measure, how far its values can be trusted over the models and
    batches (:func:`quotientsharp.workflows.report.solver_quality`); empty for records written
    before reach and locality were kept."""
    from quotientsharp.workflows.report import solver_quality

    lines = []
    for spec in specs:
        flat = [{"reach": {spec.key: r.get(f"{spec.key}_reach")},
                 "locality": {spec.key: r.get(f"{spec.key}_locality")}} for r in records]
        quality = solver_quality(flat, spec.key)
        if quality["reach_min"] is None and quality["local"] is None:
            continue
        second = quality["second_order_max"]
        lines.append(
            f"| {spec_label(spec)} | "
            + ("-" if quality["reached"] is None else f"{100 * quality['reached']:.0f} %")
            + " | " + ("-" if quality["reach_min"] is None else f"{quality['reach_min']:.3f}")
            + " | " + ("-" if quality["local"] is None else f"{100 * quality['local']:.0f} %")
            + " | " + ("-" if second is None else f"{second:.3g}") + " |")
    if not lines:
        return ""
    return "\n".join(["| measure | reach >= 0.99 | min reach | local | largest second-order "
                      "ratio |", "|---|---|---|---|---|", *lines])


def _interval_text(value: float | None, interval: Sequence[float] | None) -> str:
    if value is None:
        return "—"
    if interval is None:
        return f"{value:+.2f}"
    return f"{value:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]"


def interval_table(first: str, rows: Sequence[tuple[str, Mapping[str, Any], str]]) -> str:
    """A markdown table ``first | tau-a [95%] | tau-b [95%] | note`` from ``(name, taus, note)``."""
    level = f"{100 * BOOTSTRAP['confidence']:g}%"
    lines = [f"| {first} | Kendall tau-a [{level} interval] | Kendall tau-b [{level} interval] "
             "| paper / note |", "|---|---|---|---|"]
    for name, taus, note in rows:
        lines.append(f"| {name} | {_interval_text(taus['tau_a'], taus.get('tau_a_interval'))} "
                     f"| {_interval_text(taus['tau_b'], taus.get('tau_b_interval'))} | {note} |")
    return "\n".join(lines)


def seeded_folder(name: str, quick: bool) -> str:
    """Default results folder of a study over several study seeds."""
    return f"results/{name}-seeds" + ("-quick" if quick else "")


def _ranks_text(world_size: int) -> str:
    return (f" per rank, {world_size} ranks under torchrun, each model trained and measured "
            "whole on one rank") if world_size > 1 else ""


def _device_text(device: str) -> str:
    """The device, with the visible CPU cores or the GPU's name."""
    import os

    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device}: {torch.cuda.get_device_name(torch.device(device))}"
    return f"{device}: {os.cpu_count()} CPU cores visible" if device == "cpu" else device


def _format_rho(rho: float | None) -> str:
    return "—" if rho is None else f"{rho:g}"


def _recipe_text(settings: Mapping[str, Any]) -> str:
    """The per-model draws and the optimiser, in words."""
    space = settings["hyperparameter_space"]
    seeds = settings.get("study_seeds")
    source = (f"`numpy.random.default_rng([s, i])` for study seed s in {seeds}" if seeds
              else f"`numpy.random.default_rng([{settings['seed']}, i])`")
    text = (f"- Per model i, drawn from {source} (no "
            f"model is filtered or redrawn): learning rate log-uniform in "
            f"{space['learning_rate']}, weight decay log-uniform in {space['weight_decay']}, "
            f"epochs uniform in {space['epochs']}, label smoothing uniform in "
            f"{space['label_smoothing']}, training-set size uniform in {space['train_size']}")
    if "batch_size" in space:
        text += f", batch size uniform among {space['batch_size']}"
    if "warmup" in space:
        text += f", warm-up fraction of the steps uniform in {space['warmup']}"
    if "rank" in space:
        text += f", adapter rank uniform among {space['rank']}"
    text += ", initialisation seed (of the fresh layers). AdamW, "
    if "batch_size" not in space:
        text += f"batch {settings['train_batch_size']}, "
    text += ("5% warm-up" if "warmup" not in space else "linear warm-up") + \
        " then cosine decay to 0, dropout 0."
    if seeds:
        text += (" Each study seed s also draws its own order of the training pool "
                 "(`torch.randperm` with `torch.Generator().manual_seed(s)`): the models' "
                 "training sets and the sharpness set are new samples of the pool per seed.")
    return text


def family_section(study: FamilyStudy, settings: Mapping[str, Any],
                   records: Sequence[Mapping[str, Any]], taus: Sequence[Mapping[str, Any]],
                   wall_seconds: float, threads: int, resumed: int,
                   world_size: int = 1,
                   confounds: Sequence[Mapping[str, Any]] = (), device: str = "cpu",
                   pretrained_note: str = "", specs: Sequence[MeasureSpec] = (),
                   seeded: Mapping[str, Any] | None = None) -> str:
    """The markdown section ``docs/results/<study>.md`` (``world_size``: ranks of this session,
    mentioned when above 1; ``confounds``: :func:`confound_rows`; ``device``: where it ran;
    ``pretrained_note``: a line on the common pretrained start; ``specs``: the measures, for
    the ablation sizes of :func:`ablation_rows`; ``seeded``: the statistics of a study over
    several study seeds,
    :func:`~quotientsharp.reproduce.families.seeds_report.seeded_statistics`, whose tables
    replace the single-seed ones)."""
    table = interval_table("measure", [
        (row["measure"] if row["rho"] is None
         else f"{row['measure']} (rho {_format_rho(row['rho'])})", row,
         "" if row["paper"] is None else f"{row['paper']:+.2f} (paper: other setting)")
        for row in taus])
    counted = [r for r in records if not r["diverged"]]
    diverged = [r["index"] for r in records if r["diverged"]]
    quick = settings["quick"]
    command = f"quotientsharp reproduce {study.name}" + (" --quick" if quick else "")
    if seeded is not None:
        command += (f" --study-seeds {len(settings['study_seeds'])} --models "
                    f"{settings['models']}" + (f" --seed {settings['seed']}"
                                               if settings["seed"] else ""))
    folder = f"results/{study.name}" + ("-quick" if quick else "")
    if seeded is not None:
        folder = seeded_folder(study.name, quick)
    solver = solver_table(counted, specs) if specs else ""
    lines = [f"## {study.title}", ""]
    if quick:
        lines += ["**A `--quick` smoke run (tiny training, few ascent steps): the numbers mean "
                  "nothing.**", ""]
    lines += [
        f"Reproduce: `{command} --docs docs` (outputs in `{folder}/`: per-model CSV and JSONL "
        "written as each model finishes, `taus.json`, `confounds.json`, one scatter plot per "
        f"measure, `run.json`). This run: {len(records)} models, {len(counted)} counted, wall "
        f"time {wall_seconds / 60:.1f} min (device {_device_text(device)}, {threads} torch "
        "thread(s)"
        f"{_ranks_text(world_size)}{', resumed' if resumed else ''}).",
        "",
        " ".join(study.description.split()),
        "",
        f"- Architecture: `{json.dumps(settings['model_config'], sort_keys=True)}`.",
    ]
    if "pretrained" in settings:
        lines.append(f"- Common pretrained start: "
                     f"`{json.dumps(settings['pretrained'], sort_keys=True)}`."
                     + (f" {pretrained_note}" if pretrained_note else ""))
    lines.append(_recipe_text(settings))
    if counted:
        gaps = [r["gap"] for r in counted]
        train_errors = [r["train_error"] for r in counted]
        test_errors = [r["test_error"] for r in counted]
        lines.append(
            f"- Generalisation gap = test error - train error (0-1 errors): range "
            f"[{min(gaps):+.3f}, {max(gaps):+.3f}]; train error [{min(train_errors):.3f}, "
            f"{max(train_errors):.3f}], test error [{min(test_errors):.3f}, "
            f"{max(test_errors):.3f}].")
    if diverged:
        lines.append(f"- Diverged in training (kept in the records, left out of the taus): "
                     f"models {diverged}.")
    lines += [
        f"- Sharpness on the same {settings['sharpness_points']} training points for every "
        f"model{' of a study seed' if seeded is not None else ''} (the first points of the "
        "pool, inside every training set), in "
        f"{settings['sharpness_points'] // settings['sharpness_batch_size']} batches of "
        f"{settings['sharpness_batch_size']}, per batch then averaged; Auto-PGD with "
        f"{settings['n_iter']} steps from xi = 0, eta0 = 2 rho"
        + (", in the engine's reach search (chains of ascents, the first from xi = 0, the "
           "others from random points of the ball, until two agree to 1 %). "
           if solver else ". ")
        + (study.measurement_note or "Geodesic: attention heads in the GL(h) quotient, every "
           "other parameter in the adaptive metric along straight lines. Radii fixed once, "
           "before the study, from pilot models (on which the perturbed loss rose by about "
           "0.005-0.5 nats, far above round-off); the same for every model and never adjusted "
           "to any correlation."),
    ]
    if seeded is None:
        lines += [
            f"- Intervals: percentile bootstrap over the models, {BOOTSTRAP['resamples']} "
            f"draws, seed {BOOTSTRAP['seed']}, the same draws for every row.",
            "",
            f"Kendall tau between the gap and each sharpness measure over the {len(counted)} "
            f"counted models. The paper's column is {study.paper_setting}: a different "
            "setting (large pretrained models, fine-tuned), shown for orientation only.",
            "",
            table,
        ]
    else:
        from quotientsharp.reproduce.families.seeds_report import seeded_tables

        lines += ["", f"The paper's column is {study.paper_setting}: a different setting "
                  "(large pretrained models, fine-tuned), shown for orientation only.", ""]
        lines += seeded_tables(seeded)
    lines += _trust_lines(solver, counted, specs, confounds if seeded is None else ())
    return "\n".join(lines) + "\n"


def _trust_lines(solver: str, counted: Sequence[Mapping[str, Any]],
                 specs: Sequence[MeasureSpec], confounds: Sequence[Mapping[str, Any]]
                 ) -> list[str]:
    """The end of a family section: the solver's reach and locality table, the ablation
    sizes and the confounds (each when there is one)."""
    lines: list[str] = []
    if solver:
        lines += ["", "How far each measure's values can be trusted, over every model and batch "
                  "(reach estimate of the search, share of values whose ball is local at the "
                  "best perturbation; docs/sharpness.md, 'Reach and locality'). A tau of values "
                  "that are not maxima of local balls compares solver outcomes, not sharpness.",
                  "", solver]
    ablation = ablation_rows(counted, specs) if specs else []
    if ablation:
        lines += ["", "Ablation sizes: per-model ratio of two measures (median [min, max] over "
                  "the models).", "", "| metric | ratio | median [min, max] | models |",
                  "|---|---|---|---|"]
        lines += [f"| {row['metric']} | {row['ratio']} | {row['median']:.3g} "
                  f"[{row['min']:.3g}, {row['max']:.3g}] | {row['count']} |"
                  for row in ablation if row["median"] is not None]
    if confounds:
        lines += [
            "",
            "Confounds: Kendall tau between the gap and each drawn hyperparameter. A measure "
            "whose tau is no larger than these may only be tracking the recipe.",
            "",
            interval_table("hyperparameter", [(row["hyperparameter"], row, "")
                                              for row in confounds]),
        ]
    return lines
