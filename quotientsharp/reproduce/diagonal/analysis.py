"""``reproduce diagonal``: the numbers of one run, from its records (plain JSON, in ``run.json``
and the page data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from quotientsharp.reproduce.diagonal.data import derived_seed
from quotientsharp.reproduce.diagonal.exact import REFERENCE_MEASURES, mix_exact_population
from quotientsharp.reproduce.diagonal.measures import MEASURES
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.workflows.taus import tau_interval

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
    middle = len(ordered) // 2
    median = (ordered[middle] if len(ordered) % 2
              else 0.5 * (ordered[middle - 1] + ordered[middle]))
    return {"min": ordered[0], "median": median, "max": ordered[-1]}


def maximum_values(records: Sequence[Mapping[str, Any]], measure: str) -> list[float]:
    """Per record, the maximum of ``measure`` (:data:`MAXIMUM_OF`)."""
    return [r["sharpness"][MAXIMUM_OF[measure]] for r in records]


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

    out: dict[str, Any] = {
        "counted": len(rows),
        "taus": {m.name: tau([r["sharpness"][m.name] for r in rows])
                 for m in MEASURES if not m.diagnostic},
        "maximum_taus": {name: tau(maximum_values(rows, name)) for name in MAXIMUM_OF},
        "population_taus": {
            **{m.name: tau([r["sharpness"][f"population:{m.name}"] for r in rows])
               for m in REFERENCE_MEASURES},
            "geodesic_mix_exact_max": tau(
                [r["sharpness"]["population_exact:geodesic_mix_exact"] for r in rows]),
            "geodesic_mix_exact_rateball_max": tau(
                [r["sharpness"]["population_exact:geodesic_mix_exact_rateball"]
                 for r in rows])},
        "confounds": {name: tau([float(r[name]) for r in rows]) for name in CONFOUNDS},
    }
    percent = {}
    for name in MAXIMUM_OF:
        maxima = maximum_values(rows, name)
        if min(maxima) <= 0:
            raise ValueError(f"the maximum of {name} is not positive for some net: "
                             f"{min(maxima)!r}")
        percent[name] = spread([100.0 * r["sharpness"][name] / m
                                for r, m in zip(rows, maxima, strict=True)])
    out["percent_of_maximum"] = percent
    exact = [r["sharpness"]["exact:geodesic_mix_exact"] for r in rows]
    strong = [r["sharpness"]["strong:geodesic_mix_exact"] for r in rows]
    out["strong_over_exact_mix"] = spread([s / e for s, e in zip(strong, exact, strict=True)])
    theory = [r["sharpness"]["interpolation:geodesic_mix_exact"] for r in rows]
    out["interpolation"] = {
        "theory": spread(theory),
        "exact": spread(exact),
        "auto_pgd": spread([r["sharpness"]["geodesic_mix_exact"] for r in rows]),
        "largest_relative_deviation": max(abs(e - t) / t
                                          for e, t in zip(exact, theory, strict=True)),
        "largest_train_loss": max(r["train_loss"] for r in rows),
    }
    population = [r["sharpness"]["population_loss"] for r in rows]
    closed_form = mix_exact_population(torch.tensor(population, dtype=torch.float64),
                                       settings.rho).tolist()
    measured = [r["sharpness"]["population_exact:geodesic_mix_exact"] for r in rows]
    out["population"] = {
        "loss": spread(population),
        "closed_form_largest_relative_deviation": max(
            abs(m - c) / c for m, c in zip(measured, closed_form, strict=True)),
        "tau_population_loss": tau_interval(population, measured, settings.bootstrap,
                                            seed).as_dict(),
    }
    min_abs_beta = [r["min_abs_beta"] for r in rows]
    out["diagnostics"] = {
        m.name: {**spread([r["sharpness"][m.name] for r in rows]),
                 "tau_min_abs_beta": tau_interval(min_abs_beta,
                                                  [r["sharpness"][m.name] for r in rows],
                                                  settings.bootstrap, seed).as_dict()}
        for m in MEASURES if m.diagnostic}
    return out
