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

:func:`headline_rows` writes them as the rows of the study's headline file
(:mod:`quotientsharp.reproduce.headline`); the page shows them as tables
(``docs/_hooks/results_pages/families.py``).
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
#: The comparisons' short names, in the labels of the differences.
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
