"""The family pages (ViT, BERT, MiniLM, fine-tuned ViT, LoRA): ``docs/results/<study>.md``.

:func:`section` renders a family study's page data
(:func:`quotientsharp.reproduce.families.report.page_data`: the study's words, its settings,
the counts and ranges of its models, the taus, confounds, solver quality and ablation sizes,
and with several study seeds :func:`quotientsharp.reproduce.families.seeds_report.
seeded_statistics`). Every number is read from the data; nothing is computed here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .sections import locality_rule_note

#: The paired comparisons' short names, and the family-wise error level of Holm's correction
#: (the study's :data:`quotientsharp.reproduce.families.seeds_report.FAMILY_WISE_LEVEL`, as
#: its differences were tested at it).
_SHORT = {"adaptive": "adaptive", "geodesic_inv": "inv", "geodesic_mix": "mix"}


def _interval_text(value: float | None, interval: Sequence[float] | None) -> str:
    if value is None:
        return "—"
    if interval is None:
        return f"{value:+.2f}"
    return f"{value:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]"


def interval_table(first: str, rows: Sequence[tuple[str, Mapping[str, Any], str]],
                   confidence: float) -> str:
    """A markdown table ``first | tau-a [95%] | tau-b [95%] | note`` from ``(name, taus, note)``."""
    level = f"{100 * confidence:g}%"
    lines = [f"| {first} | Kendall tau-a [{level} interval] | Kendall tau-b [{level} interval] "
             "| paper / note |", "|---|---|---|---|"]
    for name, taus, note in rows:
        lines.append(f"| {name} | {_interval_text(taus['tau_a'], taus.get('tau_a_interval'))} "
                     f"| {_interval_text(taus['tau_b'], taus.get('tau_b_interval'))} | {note} |")
    return "\n".join(lines)


def solver_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: per ascent measure, how far its values can be trusted over the models and
    batches (the study's :func:`quotientsharp.workflows.report.solver_quality` rows); empty
    without rows (records written before reach and locality were kept)."""
    lines = []
    for row in rows:
        second = row["second_order_max"]
        lines.append(
            f"| {row['measure']} | "
            + ("-" if row["reached"] is None else f"{100 * row['reached']:.0f} %")
            + " | " + ("-" if row["reach_min"] is None else f"{row['reach_min']:.3f}")
            + " | " + ("-" if row["local"] is None else f"{100 * row['local']:.0f} %")
            + " | " + ("-" if second is None else f"{second:.3g}") + " |")
    if not lines:
        return ""
    return "\n".join(["| measure | reach >= 0.99 | min reach | local | largest second-order "
                      "ratio |", "|---|---|---|---|---|", *lines])


def _ranks_text(world_size: int) -> str:
    return (f" per rank, {world_size} ranks under torchrun, each model trained and measured "
            "whole on one rank") if world_size > 1 else ""


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


def _command_and_folder(name: str, settings: Mapping[str, Any], seeded: bool
                        ) -> tuple[str, str]:
    """The command that reproduces the page and its default results folder."""
    quick = settings["quick"]
    command = f"quotientsharp reproduce {name}" + (" --quick" if quick else "")
    folder = f"results/{name}" + ("-quick" if quick else "")
    if seeded:
        command += (f" --study-seeds {len(settings['study_seeds'])} --models "
                    f"{settings['models']}" + (f" --seed {settings['seed']}"
                                               if settings["seed"] else ""))
        folder = f"results/{name}-seeds" + ("-quick" if quick else "")
    return command, folder


def _setup_lines(page: Mapping[str, Any], solver: str) -> list[str]:
    """The bullets of the setup: architecture, pretrained start, recipe, gap, sharpness."""
    settings, study, seeded = page["settings"], page["study"], page["seeded"]
    lines = [f"- Architecture: `{json.dumps(settings['model_config'], sort_keys=True)}`."]
    if "pretrained" in settings:
        note = page["pretrained_note"]
        lines.append(f"- Common pretrained start: "
                     f"`{json.dumps(settings['pretrained'], sort_keys=True)}`."
                     + (f" {note}" if note else ""))
    lines.append(_recipe_text(settings))
    ranges = page["ranges"]
    if ranges is not None:
        gap, train, test = ranges["gap"], ranges["train_error"], ranges["test_error"]
        lines.append(
            f"- Generalisation gap = test error - train error (0-1 errors): range "
            f"[{gap[0]:+.3f}, {gap[1]:+.3f}]; train error [{train[0]:.3f}, "
            f"{train[1]:.3f}], test error [{test[0]:.3f}, {test[1]:.3f}].")
    if page["diverged"]:
        lines.append(f"- Diverged in training (kept in the records, left out of the taus): "
                     f"models {page['diverged']}.")
    lines.append(
        f"- Sharpness on the same {settings['sharpness_points']} training points for every "
        f"model{' of a study seed' if seeded is not None else ''} (the first points of the "
        "pool, inside every training set), in "
        f"{settings['sharpness_points'] // settings['sharpness_batch_size']} batches of "
        f"{settings['sharpness_batch_size']}, per batch then averaged; Auto-PGD with "
        f"{settings['n_iter']} steps from xi = 0, eta0 = 2 rho"
        + (", in the engine's reach search (chains of ascents, the first from xi = 0, the "
           "others from random points of the ball, until two agree to 1 %). "
           if solver else ". ")
        + (study["measurement_note"] or "Geodesic: attention heads in the GL(h) quotient, every "
           "other parameter in the adaptive metric along straight lines. Radii fixed once, "
           "before the study, from pilot models (on which the perturbed loss rose by about "
           "0.005-0.5 nats, far above round-off); the same for every model and never adjusted "
           "to any correlation."))
    return lines


def section(page: Mapping[str, Any]) -> str:
    """The markdown section ``docs/results/<study>.md`` of a family study's page data."""
    study, seeded, boot = page["study"], page["seeded"], page["bootstrap"]
    command, folder = _command_and_folder(study["name"], page["settings"], seeded is not None)
    solver = solver_table(page["solver"])
    lines = [f"## {study['title']}", ""]
    if page["settings"]["quick"]:
        lines += ["**A `--quick` smoke run (tiny training, few ascent steps): the numbers mean "
                  "nothing.**", ""]
    lines += [
        f"Reproduce: `{command} --docs docs` (outputs in `{folder}/`: per-model CSV and JSONL "
        "written as each model finishes, `taus.json`, `confounds.json`, one scatter plot per "
        f"measure, `run.json`). This run: {page['models']} models, {page['counted']} counted, "
        f"wall time {page['wall_seconds'] / 60:.1f} min (device {page['device']}, "
        f"{page['threads']} torch thread(s)"
        f"{_ranks_text(page['world_size'])}{', resumed' if page['resumed'] else ''}).",
        "",
        study["description"],
        "",
        *_setup_lines(page, solver),
    ]
    if seeded is None:
        table = interval_table("measure", [
            (row["measure"] if row["rho"] is None
             else f"{row['measure']} (rho {_format_rho(row['rho'])})", row,
             "" if row["paper"] is None else f"{row['paper']:+.2f} (paper: other setting)")
            for row in page["taus"]], boot["confidence"])
        lines += [
            f"- Intervals: percentile bootstrap over the models, {boot['resamples']} "
            f"draws, seed {boot['seed']}, the same draws for every row.",
            "",
            f"Kendall tau between the gap and each sharpness measure over the "
            f"{page['counted']} counted models. The paper's column is "
            f"{study['paper_setting']}: a different setting (large pretrained models, "
            "fine-tuned), shown for orientation only.",
            "",
            table,
        ]
    else:
        lines += ["", f"The paper's column is {study['paper_setting']}: a different setting "
                  "(large pretrained models, fine-tuned), shown for orientation only.", ""]
        lines += seeded_tables(seeded, page["family_wise_level"])
    lines += _trust_lines(solver, page["ablation"],
                          page["confounds"] if seeded is None else (), boot["confidence"],
                          page.get("locality_rule"))
    return "\n".join(lines) + "\n"


def _trust_lines(solver: str, ablation: Sequence[Mapping[str, Any]],
                 confounds: Sequence[Mapping[str, Any]], confidence: float,
                 locality_rule: str | None) -> list[str]:
    """The end of a family section: the solver's reach and locality table, the ablation
    sizes and the confounds (each when there is one); ``locality_rule``: how the run judged
    locality (a note says so where the engine now judges otherwise)."""
    lines: list[str] = []
    if solver:
        lines += ["", "How far each measure's values can be trusted, over every model and batch "
                  "(reach estimate of the search, share of values whose ball is local at the "
                  "best perturbation; docs/sharpness.md, 'Reach and locality'). A tau of values "
                  "that are not maxima of local balls compares solver outcomes, not sharpness.",
                  "", solver]
        lines += locality_rule_note(locality_rule)
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
                                              for row in confounds], confidence),
        ]
    return lines


# ------------------------------------------------------------------ several study seeds
def _cell(tau: float | None, interval: Sequence[float] | None, undefined: str = "") -> str:
    if tau is None:
        return f"undefined ({undefined})" if undefined else "—"
    if interval is None:
        return f"{tau:+.2f}"
    return f"{tau:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]"


def _p_text(p_value: float, resamples: int) -> str:
    """A bootstrap p-value; 0 (no resample on the other side of 0) as a bound."""
    return f"< {1 / resamples:.2g}" if p_value == 0.0 else f"{p_value:.3f}"


def _name(row: Mapping[str, Any]) -> str:
    return row["measure"] if row["rho"] is None else f"{row['measure']} (rho {row['rho']:g})"


def _verdict(differences: Sequence[Mapping[str, Any]], family_wise_level: float) -> str:
    """The ordering the Holm-corrected comparisons support, in words."""
    ahead = [row for row in differences if row.get("significant")]
    tested = [row for row in differences if row.get("p_holm") is not None]
    if not tested:
        return "No paired comparison could be made."
    level = f"{100 * family_wise_level:g} %"
    if not ahead:
        return (f"After Holm's correction over the {len(tested)} comparisons (family-wise "
                f"level {level}), no two of these measures have significantly different pooled "
                "taus: the page names no winner.")
    said = []
    for row in ahead:
        first, second = _SHORT[row["first"]], _SHORT[row["second"]]
        said.append(f"{first} > {second}" if row["difference"] > 0 else f"{second} > {first}")
    return (f"After Holm's correction over the {len(tested)} comparisons (family-wise level "
            f"{level}), only these orderings of the pooled taus hold: {', '.join(said)} "
            "(a higher tau: the measure ranks alike with the gap more strongly); every other "
            "pair is not significantly different.")


def seeded_tables(stats: Mapping[str, Any], family_wise_level: float) -> list[str]:
    """Markdown lines: per-seed taus, pooled taus, paired differences with Holm, confounds
    (:func:`quotientsharp.reproduce.families.seeds_report.seeded_statistics`)."""
    seeds = stats["seeds"]
    boot = stats["bootstrap"]
    level = f"{100 * boot['confidence']:g}%"
    counts = ", ".join(f"seed {row['study_seed']}: {row['models']}"
                       for row in stats["per_seed"])
    lines = [f"Kendall tau-b between the gap and each measure, per study seed (bootstrap over "
             f"that seed's models, {level} interval; counted models {counts}) and pooled over "
             f"the {len(seeds)} seeds (mean of the per-seed tau-b; {level} interval of a "
             f"two-stage cluster bootstrap, {boot['resamples']} draws, seed {boot['seed']}: "
             "seeds resampled, then models within each seed, so the interval accounts for the "
             "variation between seeds). Models of different seeds are never ranked against "
             "each other.", ""]
    header = ("| measure | " + " | ".join(f"seed {s}" for s in seeds)
              + f" | pooled [{level} cluster interval] | paper (other setting) |")
    lines += [header, "|---|" + "---|" * (len(seeds) + 2)]
    for k, row in enumerate(stats["pooled"]):
        cells = [_cell(per["taus"][k]["tau_b"], per["taus"][k]["tau_b_interval"])
                 for per in stats["per_seed"]]
        paper = "" if row["paper"] is None else f"{row['paper']:+.2f}"
        lines.append(f"| {_name(row)} | " + " | ".join(cells) + " | "
                     f"{_cell(row['tau_b'], row['tau_b_interval'], row.get('undefined', ''))} "
                     f"| {paper} |")
    lines += ["", "Paired differences of the pooled tau-b (the same cluster bootstrap draws for "
              "both measures; p-value: twice the smaller share of resampled differences on "
              "either side of 0; Holm: step-down correction over these comparisons).", "",
              f"| difference | pooled [{level} cluster interval] | p | Holm-adjusted p |",
              "|---|---|---|---|"]
    for row in stats["differences"]:
        if row["difference"] is None:
            lines.append(f"| {row['label']} | undefined ({row['undefined']}) | — | — |")
            continue
        lines.append(f"| {row['label']} | {_cell(row['difference'], row['interval'])} | "
                     f"{_p_text(row['p_value'], boot['resamples'])} | "
                     f"{_p_text(row['p_holm'], boot['resamples'])} |")
    lines += ["", _verdict(stats["differences"], family_wise_level)]
    if stats["confounds"]:
        lines += ["", "Confounds: pooled Kendall tau-b between the gap and each drawn "
                  "hyperparameter (same cluster bootstrap). A measure whose tau is no larger "
                  "than these may only be tracking the recipe.", "",
                  f"| hyperparameter | pooled [{level} cluster interval] |", "|---|---|"]
        lines += [f"| {row['hyperparameter']} | "
                  f"{_cell(row['tau_b'], row['tau_b_interval'], row.get('undefined', ''))} |"
                  for row in stats["confounds"]]
    return lines
