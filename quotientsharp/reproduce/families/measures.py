"""Family studies: the sharpness measures and their radii, run on one trained model."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn


@dataclass(frozen=True)
class MeasureSpec:
    """One sharpness measure of a study: its CSV ``key``, ``label``, the options of
    :func:`quotientsharp.sharpness` and the paper's column it is compared with."""

    key: str
    label: str
    measure: str
    rho: float | None
    options: Mapping[str, Any] = field(default_factory=dict)
    paper_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def family_measures(rho_adaptive: float, rho_worst_case: float, rho_inv: float,
                    rho_mix: float) -> list[MeasureSpec]:
    """The family measures: adaptive, plain L2 worst case, geodesic inv and mix at orders 1
    and 2, relative flatness of the classifier."""
    geodesic = [MeasureSpec(f"geodesic_{metric}_o{order}", f"geodesic {metric} (order {order})",
                            "geodesic", rho, {"metric": metric, "order": order},
                            f"geodesic_{metric}" if order == 2 else None)
                for metric, rho in (("inv", rho_inv), ("mix", rho_mix)) for order in (1, 2)]
    return [MeasureSpec("adaptive", "adaptive", "adaptive", rho_adaptive, {}, "adaptive"),
            MeasureSpec("worst_case", "worst-case (L2)", "worst_case", rho_worst_case, {}, None),
            *geodesic,
            MeasureSpec("relative_flatness", "relative flatness", "relative_flatness", None, {},
                        "relative_flatness")]


def eps_sweep_measures(rho_inv: float, rho_mix: float,
                       eps_values: Sequence[float]) -> list[MeasureSpec]:
    """Geodesic inv and mix (order 2) at each Gram relaxation ``eps > 0`` of ``eps_values``."""
    specs = []
    for eps in eps_values:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (
                math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps_values must be finite numbers > 0 (eps = 0 is measured "
                             f"already), got {eps!r}")
        for metric, rho in (("inv", rho_inv), ("mix", rho_mix)):
            specs.append(MeasureSpec(f"geodesic_{metric}_o2_eps{eps:g}",
                                     f"geodesic {metric} (order 2, eps {eps:g})", "geodesic",
                                     rho, {"metric": metric, "order": 2, "eps": float(eps)},
                                     None))
    return specs


def measure_model(model: nn.Module, batches: Sequence[Any], specs: Sequence[MeasureSpec],
                  n_iter: int, seed: int = 0,
                  tick: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every measure of ``specs`` on ``batches``: per key its ``value``, ``per_batch``,
    ``seconds``, ``reach``, ``locality`` and ``evaluations`` (``tick`` called per key)."""
    from quotientsharp.engine import ReachWarning, sharpness

    results: dict[str, dict[str, Any]] = {}
    for spec in specs:
        options = dict(spec.options)
        if spec.measure != "relative_flatness":
            options["n_iter"] = n_iter
        start = time.perf_counter()
        with warnings.catch_warnings():
            # recorded per batch below and reported on the study's page
            warnings.simplefilter("ignore", ReachWarning)
            result = sharpness(model, batches, measure=spec.measure, rho=spec.rho, seed=seed,
                               progress=False, **options)
        results[spec.key] = {"value": float(result.value), "per_batch": list(result.per_batch),
                             "seconds": time.perf_counter() - start, "reach": result.reach,
                             "locality": result.locality, "evaluations": result.evaluations}
        if not math.isfinite(result.value):
            raise FloatingPointError(f"{spec.label} sharpness is not finite ({result.value})")
        if tick is not None:
            tick(spec.key)
    return results

