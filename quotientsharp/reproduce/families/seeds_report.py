"""Family studies over several study seeds: per-seed taus, pooled taus, paired differences.

With ``--study-seeds S`` a family study draws ``S`` independent families of models (new
hyperparameters, initialisations and training-pool order per seed). :func:`seeded_statistics`
then gives

- per seed, the Kendall taus of :func:`~quotientsharp.reproduce.families.report.tau_rows`
  (bootstrap over that seed's models);
- pooled over the seeds, the mean of the per-seed tau-b, with the two-stage cluster bootstrap
  interval of :func:`~quotientsharp.workflows.taus.cluster_bootstrap_tau`
  (seeds resampled, then models within each seed: the interval accounts for the variation
  between seeds, which a bootstrap over all models as if independent ignores);
- the paired differences of the pooled taus of the three measures compared with the paper
  (inv - adaptive, mix - inv, mix - adaptive), with cluster bootstrap intervals and p-values,
  and Holm's correction over these three comparisons: a measure is called ahead of another
  only when the Holm-adjusted p-value is below 0.05.

:func:`seeded_tables` writes them as markdown, :func:`headline_rows` as the rows of the
study's headline file (:mod:`quotientsharp.reproduce.headline`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quotientsharp.reproduce.families.measures import MeasureSpec
from quotientsharp.reproduce.families.report import BOOTSTRAP, CONFOUNDS, tau_rows
from quotientsharp.reproduce.families.settings import FamilyStudy

#: The paired comparisons ``(first, second)`` of paper keys, first minus second.
COMPARISONS = (("geodesic_inv", "adaptive"), ("geodesic_mix", "geodesic_inv"),
               ("geodesic_mix", "adaptive"))
#: The family-wise error level of the Holm-corrected comparisons.
FAMILY_WISE_LEVEL = 0.05
_SHORT = {"adaptive": "adaptive", "geodesic_inv": "inv", "geodesic_mix": "mix"}


def _pooled(gaps: Sequence[float], values: Sequence[float],
            seeds: Sequence[int]) -> dict[str, Any]:
    """Pooled tau-b and its cluster bootstrap interval, or ``None`` with the reason."""
    from quotientsharp.workflows.taus import cluster_bootstrap_tau

    try:
        tau, low, high = cluster_bootstrap_tau(gaps, values, seeds,
                                               n_boot=BOOTSTRAP["resamples"],
                                               seed=BOOTSTRAP["seed"])
    except ValueError as err:
        return {"tau_a": None, "tau_b": None, "tau_a_interval": None, "tau_b_interval": None,
                "undefined": str(err)}
    return {"tau_a": None, "tau_b": tau, "tau_a_interval": None, "tau_b_interval": [low, high]}


def seeded_statistics(records: Sequence[Mapping[str, Any]], specs: Sequence[MeasureSpec],
                      paper: Mapping[str, float]) -> dict[str, Any]:
    """Per-seed, pooled and paired statistics of the counted models of a seeded study.

    Parameters
    ----------
    records
        The counted (not diverged) models, each with ``study_seed``, ``gap`` and every
        measure's key.
    specs
        The measures.
    paper
        The paper's taus by paper key.

    Returns
    -------
    dict
        ``seeds``; ``per_seed``: ``[{"study_seed", "models", "taus"}]``; ``pooled``: one row
        per measure (the fields of ``tau_rows``, tau-b pooled, tau-a ``None``); ``confounds``:
        pooled taus of the drawn hyperparameters; ``differences``: the :data:`COMPARISONS`;
        ``bootstrap``: its settings.
    """
    from quotientsharp.workflows.taus import (
        cluster_bootstrap_difference,
        holm_adjust,
    )

    seeds = list(dict.fromkeys(int(r["study_seed"]) for r in records))
    if not seeds:
        raise ValueError("no counted model: no statistics over study seeds")
    clusters = [int(r["study_seed"]) for r in records]
    gaps = [float(r["gap"]) for r in records]
    per_seed = []
    for seed in seeds:
        mine = [r for r in records if int(r["study_seed"]) == seed]
        per_seed.append({"study_seed": seed, "models": len(mine),
                         "taus": tau_rows(mine, specs, paper)})
    pooled = [{"key": spec.key, "measure": spec.label, "rho": spec.rho,
               **_pooled(gaps, [float(r[spec.key]) for r in records], clusters),
               "paper": paper.get(spec.paper_key) if spec.paper_key else None}
              for spec in specs]
    names = [name for name in CONFOUNDS if all(name in r for r in records)]
    confounds = [{"hyperparameter": name,
                  **_pooled(gaps, [float(r[name]) for r in records], clusters)}
                 for name in names]
    by_paper = {spec.paper_key: spec.key for spec in specs if spec.paper_key}
    differences: list[dict[str, Any]] = []
    for first, second in COMPARISONS:
        if first not in by_paper or second not in by_paper:
            continue
        row: dict[str, Any] = {"first": first, "second": second,
                               "label": f"{_SHORT[first]} - {_SHORT[second]}"}
        try:
            value, low, high, p_value = cluster_bootstrap_difference(
                gaps, [float(r[by_paper[first]]) for r in records],
                [float(r[by_paper[second]]) for r in records], clusters,
                n_boot=BOOTSTRAP["resamples"], seed=BOOTSTRAP["seed"])
        except ValueError as err:
            row.update(difference=None, interval=None, p_value=None, undefined=str(err))
        else:
            row.update(difference=value, interval=[low, high], p_value=p_value)
        differences.append(row)
    tested = [row for row in differences if row["p_value"] is not None]
    for row, adjusted in zip(tested, holm_adjust([row["p_value"] for row in tested]),
                             strict=True):
        row["p_holm"] = adjusted
        row["significant"] = adjusted < FAMILY_WISE_LEVEL
    return {"seeds": seeds, "per_seed": per_seed, "pooled": pooled, "confounds": confounds,
            "differences": differences,
            "bootstrap": {"resamples": BOOTSTRAP["resamples"], "seed": BOOTSTRAP["seed"],
                          "confidence": BOOTSTRAP["confidence"],
                          "kind": "two-stage cluster bootstrap: study seeds, then models "
                                  "within each seed"}}


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


def _verdict(differences: Sequence[Mapping[str, Any]]) -> str:
    """The ordering the Holm-corrected comparisons support, in words."""
    ahead = [row for row in differences if row.get("significant")]
    tested = [row for row in differences if row.get("p_holm") is not None]
    if not tested:
        return "No paired comparison could be made."
    level = f"{100 * FAMILY_WISE_LEVEL:g} %"
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


def seeded_tables(stats: Mapping[str, Any]) -> list[str]:
    """Markdown lines: per-seed taus, pooled taus, paired differences with Holm, confounds."""
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
    lines += ["", _verdict(stats["differences"])]
    if stats["confounds"]:
        lines += ["", "Confounds: pooled Kendall tau-b between the gap and each drawn "
                  "hyperparameter (same cluster bootstrap). A measure whose tau is no larger "
                  "than these may only be tracking the recipe.", "",
                  f"| hyperparameter | pooled [{level} cluster interval] |", "|---|---|"]
        lines += [f"| {row['hyperparameter']} | "
                  f"{_cell(row['tau_b'], row['tau_b_interval'], row.get('undefined', ''))} |"
                  for row in stats["confounds"]]
    return lines


def _headline_measure(spec_key: str, paper_key: str | None) -> str:
    """The headline file's measure name: the paper key, else the spec key (``_oN`` spelled
    ``_orderN``, as in the single-seed headline files)."""
    if paper_key:
        return paper_key
    for order in (1, 2):
        if spec_key.endswith(f"_o{order}"):
            return f"{spec_key[:-3]}_order{order}"
    return spec_key


def headline_rows(study: FamilyStudy, settings: Mapping[str, Any],
                  stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of ``docs/results/data/<study>.json``: the pooled taus with their cluster
    intervals (measures, then confounds); undefined ones (a tau or its interval) are left
    out, said in a note.

    ``stats`` is :func:`seeded_statistics`'s mapping, or, for a study of one seed,
    ``{"pooled": taus, "confounds": confounds}`` with the taus and confounds over the models
    and their percentile-bootstrap intervals (no ``"seeds"`` entry).
    """
    paper_keys = {m["key"]: m.get("paper_key") for m in settings["measures"]}
    if stats.get("seeds"):
        setting = (f"{study.title.split(' (')[0]}: {len(stats['seeds'])} study seeds x "
                   f"{settings['models']} models")
        note = "cluster bootstrap over the seeds"
    else:
        setting = f"{study.title.split(' (')[0]}: one study seed x {settings['models']} models"
        note = ""   # the ordinary bootstrap over the models, as on the single-seed pages
    rows = []
    for row in stats["pooled"]:
        if row["tau_b"] is None or row["tau_b_interval"] is None:
            continue
        rows.append({"setting": setting,
                     "measure": _headline_measure(row["key"], paper_keys.get(row["key"])),
                     "tau": row["tau_b"], "low": row["tau_b_interval"][0],
                     "high": row["tau_b_interval"][1], "paper": row["paper"], "note": note})
    for row in stats["confounds"]:
        if row["tau_b"] is None or row["tau_b_interval"] is None:
            continue
        rows.append({"setting": setting, "measure": f"confound: {row['hyperparameter']}",
                     "tau": row["tau_b"], "low": row["tau_b_interval"][0],
                     "high": row["tau_b_interval"][1], "paper": None, "note": note})
    return rows
