"""Family studies over several study seeds (``--study-seeds S``): per-seed taus, pooled taus
(two-stage cluster bootstrap) and paired differences, Holm-corrected at
:data:`FAMILY_WISE_LEVEL`."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from quotientsharp.reproduce.families.measures import MeasureSpec
from quotientsharp.reproduce.families.report import (
    BOOTSTRAP,
    FAMILY_WISE_LEVEL,
    confound_rows,
    tau_rows,
)
from quotientsharp.reproduce.families.settings import FamilyStudy

#: The paired comparisons ``(first, second)`` of paper keys, first minus second.
COMPARISONS = (("geodesic_inv", "adaptive"), ("geodesic_mix", "geodesic_inv"),
               ("geodesic_mix", "adaptive"))
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
    """Per-seed, pooled (tau-b only) and paired (:data:`COMPARISONS`) statistics of the
    counted models of a seeded study."""
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

    def pooled(gaps: Sequence[float], values: Sequence[float]) -> dict[str, Any]:
        return _pooled(gaps, values, clusters)

    pooled_rows = tau_rows(records, specs, paper, pooled)
    confounds = confound_rows(records, pooled)
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
    return {"seeds": seeds, "per_seed": per_seed, "pooled": pooled_rows, "confounds": confounds,
            "differences": differences,
            "bootstrap": {**BOOTSTRAP, "kind": "two-stage cluster bootstrap: study seeds, "
                                               "then models within each seed"}}


def _headline_measure(spec_key: str, paper_key: str | None) -> str:
    """The headline's measure name: the paper key, else the spec key with ``_oN`` spelled
    ``_orderN``."""
    return paper_key or re.sub(r"_o([12])$", r"_order\1", spec_key)


def headline_rows(study: FamilyStudy, settings: Mapping[str, Any],
                  stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Headline rows: the defined taus of ``stats`` (:func:`seeded_statistics`, or ``pooled``
    and ``confounds`` of one seed), measures then confounds."""
    paper_keys = {m["key"]: m.get("paper_key") for m in settings["measures"]}
    seeds = f"{len(stats['seeds'])} study seeds" if stats.get("seeds") else "one study seed"
    setting = f"{study.title.split(' (')[0]}: {seeds} x {settings['models']} models"
    # one seed: the ordinary bootstrap over the models, as on the single-seed pages
    note = "cluster bootstrap over the seeds" if stats.get("seeds") else ""
    named = [(_headline_measure(row["key"], paper_keys.get(row["key"])), row["paper"], row)
             for row in stats["pooled"]]
    named += [(f"confound: {row['hyperparameter']}", None, row) for row in stats["confounds"]]
    return [{"setting": setting, "measure": measure, "tau": row["tau_b"],
             "low": row["tau_b_interval"][0], "high": row["tau_b_interval"][1],
             "paper": paper, "note": note}
            for measure, paper, row in named
            if row["tau_b"] is not None and row["tau_b_interval"] is not None]
