"""``reproduce diagonal``: the maxima the Auto-PGD values are measured against: exact for mix
exact (the batch loss is quadratic in ``D = 2 beta b``: a trust-region subproblem), a strong
multi-start Auto-PGD for the others (:func:`reference_maxima`), and the population loss."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import cast

import torch

from quotientsharp.engine.exact import TrustRegionMaximum, trust_region_maximum
from quotientsharp.engine.solver import AscentSettings
from quotientsharp.reproduce.diagonal.batched_ascent import NetBall, batched_ascend, mse_objective
from quotientsharp.reproduce.diagonal.measures import (
    MEASURES,
    MeasureSpec,
    geometry_for,
    measure_nets,
)
from quotientsharp.workflows.progress import progress_bar

#: The measures given a strong reference ascent beside their Auto-PGD value.
REFERENCE_MEASURES: tuple[MeasureSpec, ...] = tuple(
    m for m in MEASURES if m.name in ("adaptive", "geodesic_inv_exact", "geodesic_mix_exact"))
#: The names of :func:`extra_values`, in the order of the records and the CSV columns.
EXTRA_NAMES: tuple[str, ...] = (
    *(f"strong:{m.name}" for m in REFERENCE_MEASURES), "exact:geodesic_mix_exact",
    "exact:geodesic_mix_exact_rateball",
    *(f"population:{m.name}" for m in REFERENCE_MEASURES),
    "population_exact:geodesic_mix_exact", "population_exact:geodesic_mix_exact_rateball",
    "interpolation:geodesic_mix_exact", "population_loss")


def _check_batches(beta: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast shared batches to every net: ``[M, K, B, d]`` and ``[M, K, B]``."""
    if beta.dim() != 2:
        raise ValueError(f"beta must have shape [M, d], got {tuple(beta.shape)}")
    if inputs.dim() == 3:
        inputs, targets = inputs.expand(beta.shape[0], *inputs.shape), targets.expand(
            beta.shape[0], *targets.shape)
    if inputs.dim() != 4 or inputs.shape[0] != beta.shape[0] or inputs.shape[-1] != beta.shape[1]:
        raise ValueError(f"inputs must have shape [K, B, d] or [M, K, B, d] with M, d = "
                         f"{tuple(beta.shape)}, got {tuple(inputs.shape)}")
    if targets.shape != inputs.shape[:-1]:
        raise ValueError(f"targets must have shape {tuple(inputs.shape[:-1])}, got "
                         f"{tuple(targets.shape)}")
    return inputs, targets


def mix_exact_maxima(u: torch.Tensor, v: torch.Tensor, inputs: torch.Tensor,
                     targets: torch.Tensor, rho: float) -> torch.Tensor:
    """Exact mix sharpness ``max_{||D|| <= sqrt(2) rho} L_B(beta + D) - L_B(beta)``,
    ``shape=[M, K]``, of the nets ``u``, ``v`` ``shape=[M, d]`` on batches ``shape=[K, B, d]``
    and ``[K, B]`` (or ``[M, K, B, d]`` and ``[M, K, B]``)."""
    return _ball_maxima(u, v, inputs, targets, math.sqrt(2.0) * rho, scaled=False)


def mix_rate_ball_maxima(u: torch.Tensor, v: torch.Tensor, inputs: torch.Tensor,
                         targets: torch.Tensor, rho: float) -> torch.Tensor:
    """As :func:`mix_exact_maxima` over the rate ball ``||D / (2 |beta|)|| <= rho / sqrt(2)``."""
    return _ball_maxima(u, v, inputs, targets, rho / math.sqrt(2.0), scaled=True)


def _ball_maxima(u: torch.Tensor, v: torch.Tensor, inputs: torch.Tensor,
                 targets: torch.Tensor, radius: float, scaled: bool) -> torch.Tensor:
    """``max L_B(beta + D) - L_B(beta)`` per net and batch over ``||D|| <= radius`` (or, with
    ``scaled``, ``||D / (2 |beta|)|| <= radius``)."""
    beta = (u * v).to(torch.float64)
    inputs, targets = _check_batches(beta, inputs.to(torch.float64), targets.to(torch.float64))
    out = torch.empty(inputs.shape[:2], dtype=torch.float64)
    for m, k, maximum in _trust_regions(beta, inputs, targets, radius, scaled):
        out[m, k] = maximum.value
    return out


def _trust_regions(beta: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor,
                   radius: float, scaled: bool) -> Iterator[tuple[int, int, TrustRegionMaximum]]:
    """Per net and batch the trust-region maximum of the loss change ``g^T D + D^T A D / 2``
    (``A = 2 X^T X / B``, ``g = 2 X^T (X beta - y) / B``), as :func:`_ball_maxima`."""
    size = inputs.shape[-2]
    for m in range(inputs.shape[0]):
        scale = 2.0 * beta[m].abs() if scaled else None
        for k in range(inputs.shape[1]):
            x, y = inputs[m, k], targets[m, k]
            hessian, gradient = 2.0 * x.T @ x / size, 2.0 * x.T @ (x @ beta[m] - y) / size
            yield m, k, trust_region_maximum(hessian, gradient, radius, scale=scale)


def mix_exact_at_interpolation(inputs: torch.Tensor, rho: float) -> torch.Tensor:
    """``2 rho^2 lambda_max(X_B^T X_B / B)`` per batch (``inputs`` ``shape=[..., K, B, d]``,
    result ``shape=[..., K]``): mix exact sharpness of every net that interpolates it."""
    x = inputs.to(torch.float64)
    second_moment = x.transpose(-1, -2) @ x / x.shape[-2]
    return 2.0 * rho ** 2 * torch.linalg.eigvalsh(second_moment)[..., -1]


def _model_rates(beta: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor,
                 rate_radius: float) -> torch.Tensor:
    """Per net and batch the rates ``b`` (``||b|| <= rate_radius``) maximising the quadratic
    model of the loss along ``beta (1 + 2 b)``, ``shape=[M, K, d]``."""
    out = torch.zeros(*inputs.shape[:2], beta.shape[-1], dtype=torch.float64)
    for m, k, maximum in _trust_regions(beta, inputs, targets, rate_radius, scaled=True):
        out[m, k] = maximum.d / (2.0 * beta[m])
    return out


class _ReferenceStarts:
    """A batched geometry whose restarts are the quadratic model's maximiser, its negative,
    then random points from each net's own stream (the same starts whichever nets are
    measured with it)."""

    def __init__(self, batched: NetBall, single: Sequence[NetBall], seeds: Sequence[int],
                 model: tuple[torch.Tensor, ...] | None) -> None:
        self._batched = batched
        self._single = list(single)
        self._generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self._models = [] if model is None else [model, tuple(-t for t in model)]

    def __getattr__(self, name: str):
        return getattr(self._batched, name)

    def random_start(self, generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        # ``generator`` is unused: the first restarts are the model's maximiser and its
        # negative, the others are drawn from each net's own stream
        if self._models:
            return self._batched.clip(self._models.pop(0))
        starts = [ball.random_start(gen) for ball, gen in zip(self._single, self._generators,
                                                              strict=True)]
        return tuple(torch.stack(parts) for parts in zip(*starts, strict=True))


def reference_maxima(u: torch.Tensor, v: torch.Tensor, inputs: torch.Tensor,
                     targets: torch.Tensor, rho: float, ascent: AscentSettings,
                     seeds: Sequence[int],
                     measures: Sequence[MeasureSpec] = REFERENCE_MEASURES,
                     progress: bool | None = False) -> dict[str, torch.Tensor]:
    """The strong reference ascent: per measure, net and batch (``shape=[M, K]``) the best
    loss increase over ``ascent.runs`` Auto-PGD runs from ``xi = 0``, the quadratic model's
    maximiser and its negative (adaptive and inv), then random points from ``seeds``."""
    if len(seeds) != u.shape[0]:
        raise ValueError(f"seeds must hold one seed per net ({u.shape[0]}), got {len(seeds)}")
    problem_shape = (u.shape[0], inputs.shape[-3])
    base_u, base_v = (t.unsqueeze(1).expand(*problem_shape, -1).contiguous() for t in (u, v))
    beta = (u * v).to(torch.float64)
    full_inputs, full_targets = _check_batches(beta, inputs.to(torch.float64),
                                               targets.to(torch.float64))
    out = {}
    bar = progress_bar(len(measures) * ascent.evaluations_per_run * ascent.runs,
                       "reference ascent", progress, unit="eval")
    try:
        for spec in measures:
            batched = geometry_for(spec, base_u, base_v, rho, problem_shape)
            single = [geometry_for(spec, base_u[m], base_v[m], rho, problem_shape[1:])
                      for m in range(problem_shape[0])]
            model = None
            if spec.metric != "mix":
                # a horizontal xi = (b u, b v) has norm sqrt(2) ||b|| in the adaptive and the
                # inv ball. Mix exact has no model start: its exact maximum is known, and its
                # random-start ascent is the check of this ascent the page reports
                rates = _model_rates(beta, full_inputs, full_targets, rho / math.sqrt(2.0))
                model = (rates * base_u, rates * base_v)
            # a proxy of the batched NetBall: what it does not override it forwards to it
            geometry = cast(NetBall, _ReferenceStarts(batched, single, seeds, model))
            outcome = batched_ascend(geometry, mse_objective(batched, inputs, targets), ascent,
                                     bar.update, generator=torch.Generator())
            out[spec.name] = outcome.sharpness
    finally:
        bar.close()
    return out


def mix_exact_population(population_loss: torch.Tensor, rho: float) -> torch.Tensor:
    """Mix exact sharpness of the population loss ``||beta - beta*||^2`` (any ``shape``):
    ``2 sqrt(2) rho ||beta - beta*|| + 2 rho^2``, increasing in the population loss."""
    return 2.0 * math.sqrt(2.0) * rho * population_loss.sqrt() + 2.0 * rho ** 2


def population_batch(beta_star: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch ``X = sqrt(d) I_d``, ``y = X beta*`` (``shape=[1, d, d]``, ``[1, d]``): its
    mean squared error is ``||beta - beta*||^2``, the population loss of ``x ~ N(0, I_d)``."""
    d = beta_star.shape[-1]
    x = math.sqrt(d) * torch.eye(d, dtype=torch.float64)
    return x.unsqueeze(0), (x @ beta_star.to(torch.float64)).unsqueeze(0)


def extra_values(u: torch.Tensor, v: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor,
                 beta_star: torch.Tensor, rho: float, ascent: AscentSettings,
                 reference: AscentSettings, seeds: Sequence[int],
                 progress: bool | None = False) -> dict[str, torch.Tensor]:
    """Every value the study reports beside its Auto-PGD measures (:data:`EXTRA_NAMES`),
    ``shape=[M, K]`` (``[M, 1]`` on the population loss)."""
    out = {f"strong:{name}": value for name, value in reference_maxima(
        u, v, inputs, targets, rho, reference, seeds, progress=progress).items()}
    out["exact:geodesic_mix_exact"] = mix_exact_maxima(u, v, inputs, targets, rho)
    out["exact:geodesic_mix_exact_rateball"] = mix_rate_ball_maxima(u, v, inputs, targets, rho)
    population_x, population_y = population_batch(beta_star)
    out.update({f"population:{name}": value for name, value in measure_nets(
        u, v, population_x, population_y, rho, ascent, REFERENCE_MEASURES,
        progress=progress).items()})
    out["population_exact:geodesic_mix_exact"] = mix_exact_maxima(u, v, population_x,
                                                                  population_y, rho)
    out["population_exact:geodesic_mix_exact_rateball"] = mix_rate_ball_maxima(
        u, v, population_x, population_y, rho)
    constant = mix_exact_at_interpolation(inputs, rho)
    out["interpolation:geodesic_mix_exact"] = constant.expand(u.shape[0], constant.shape[-1])
    # the population loss itself, as the mean squared error of the population batch
    out["population_loss"] = ((u * v).unsqueeze(1).unsqueeze(-2) * population_x).sum(-1).sub(
        population_y).square().mean(-1)
    return out
