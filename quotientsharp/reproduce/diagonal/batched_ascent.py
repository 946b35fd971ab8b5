"""Auto-PGD over many independent problems at once (a leading problem shape), for diagonal nets.

:func:`batched_ascend` is the engine's :func:`~quotientsharp.engine.solver.ascend` on a
:class:`~quotientsharp.engine.ball.GeodesicBall` whose frozen point carries the nets on leading
dimensions, with the library's quotient classes as geometry. The exact mix path ``beta (1 + 2
b)`` is continued through ``beta_i = 0`` (the loss depends on ``beta`` only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from quotientsharp.core.adaptive import AdaptiveQuotient
from quotientsharp.core.diagonal import DiagonalPoint, DiagonalQuotient
from quotientsharp.core.frozen import check_order
from quotientsharp.engine.ball import GeodesicBall
from quotientsharp.engine.solver import AscentSettings, ascend

Tensors = tuple[torch.Tensor, ...]
BatchedObjective = Callable[[Tensors], tuple[torch.Tensor, Tensors]]

#: ``(metric, order)`` -> readable path of ``beta`` along a horizontal rate ``b``.
PATH_NAMES = {
    ("inv", 1): "beta (1 + b)^2", ("mix", 1): "beta (1 + b)^2",
    ("inv", 2): "beta (1 + b + b^2/2)^2", ("mix", 2): "beta (1 + b - b^2/2)^2",
    ("inv", "exact"): "beta exp(2 b)", ("mix", "exact"): "beta (1 + 2 b)",
}


class NetBall(GeodesicBall):
    """A geodesic ball over diagonal nets whose perturbed point is read as ``beta = u v``."""

    def beta(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        """``beta`` at the end of the path from the nets along ``xi``, ``shape=[*P, d]``."""
        quotient_path = getattr(self.frozen, "quotient_geodesic", None)
        if self.order == "exact" and quotient_path is not None:
            return quotient_path(tuple(xi))
        u, v = self.point(xi)
        return u * v


def _problem_shape(u: torch.Tensor, v: torch.Tensor, problem_shape: Sequence[int]) -> tuple:
    if u.shape != v.shape:
        raise ValueError(f"u and v must have the same shape, got {tuple(u.shape)} and "
                         f"{tuple(v.shape)}")
    return tuple(int(s) for s in problem_shape)


class DiagonalHorizontalGeometry(NetBall):
    """Horizontal perturbations of diagonal nets in the ``inv`` or ``mix`` quotient, along the
    path of ``order`` ``1``, ``2`` or ``"exact"``, around base points ``u``, ``v`` of
    ``shape=[*P, d]`` or broadcastable to it (``[M, 1, d]`` for ``P = [M, K]``; no zero
    entry), in a ball of ``radius`` (a number or ``shape=[*P]``), ``P = problem_shape``."""

    def __init__(self, u: torch.Tensor, v: torch.Tensor, metric: str, order: int | str,
                 radius: torch.Tensor | float, problem_shape: Sequence[int]) -> None:
        if metric not in ("inv", "mix"):
            raise ValueError(f"metric must be 'inv' or 'mix', got {metric!r}")
        order = check_order(order)
        problem_shape = _problem_shape(u, v, problem_shape)
        frozen = DiagonalQuotient(metric).at((u, v))
        super().__init__(frozen, radius, order, problem_shape=problem_shape)
        self.metric = metric


class RateBallMixGeometry(DiagonalHorizontalGeometry):
    """The exact mix path ``beta (1 + 2 b)`` over the *rate ball* ``||b|| <= rho / sqrt(2)``:
    the inv quotient's ball with the mix geodesic as the path (the mix ball allows huge rates
    where ``|beta_i|`` is tiny). Arguments as :class:`DiagonalHorizontalGeometry`."""

    def __init__(self, u: torch.Tensor, v: torch.Tensor, radius: torch.Tensor | float,
                 problem_shape: Sequence[int]) -> None:
        super().__init__(u, v, "inv", "exact", radius, problem_shape)
        self.metric = "mix"
        # the path is the mix quotient's own geodesic; only the ball is inv's
        mix = DiagonalQuotient("mix").at((u, v))
        assert isinstance(mix, DiagonalPoint)  # the diagonal quotient's own point class
        self._mix = mix

    def beta(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        """``u v (1 + 2 b)``, ``b`` the rate of ``xi`` (the mix quotient's geodesic)."""
        return self._mix.quotient_geodesic(tuple(xi))


class AdaptiveGeometry(NetBall):
    """Worst-case adaptive L2 ball around the raw parameters ``(u, v)``, straight lines;
    arguments as :class:`DiagonalHorizontalGeometry`."""

    def __init__(self, u: torch.Tensor, v: torch.Tensor, radius: torch.Tensor | float,
                 problem_shape: Sequence[int]) -> None:
        problem_shape = _problem_shape(u, v, problem_shape)
        # unfused: a net alone rounds as it does among others (bit-identical resumed runs)
        frozen = AdaptiveQuotient("adaptive", point_ndims=(1, 1), fused=False).frozen_point(
            (u, v))
        super().__init__(frozen, radius, 1, problem_shape=problem_shape)


def mse_objective(geometry: NetBall, inputs: torch.Tensor,
                  targets: torch.Tensor) -> BatchedObjective:
    """Per-problem mean squared error ``||X_k beta - y_k||^2 / B`` and its gradient in ``xi``
    (``beta`` ``shape=[M, K, d]``, batches ``shape=[K, B, d]`` and ``[K, B]``). The prediction
    is an elementwise product summed over ``d``, not a matrix product, whose rounding would
    depend on how many nets share the call (a resumed run must match to the last bit)."""

    def objective(xi: Tensors) -> tuple[torch.Tensor, Tensors]:
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            beta = geometry.beta(leaves)                               # [M, K, d]
            prediction = (beta.unsqueeze(-2) * inputs).sum(-1)         # [M, K, B]
            loss = (prediction - targets).square().mean(-1)            # [M, K]
            grads = torch.autograd.grad(loss.sum(), leaves)
        return loss.detach(), grads

    return objective


@dataclass
class BatchedOutcome:
    """Per problem: the best loss found, the clean loss (at ``xi = 0``) and the best iterate."""

    loss: torch.Tensor
    clean: torch.Tensor
    xi: Tensors

    @property
    def sharpness(self) -> torch.Tensor:
        """Best perturbed loss minus clean loss, ``shape=[*P]``."""
        return self.loss - self.clean


def batched_ascend(geometry: NetBall, objective: BatchedObjective,
                   settings: AscentSettings,
                   on_evaluation: Callable[[], None] | None = None,
                   generator: torch.Generator | None = None) -> BatchedOutcome:
    """Auto-PGD for every problem of ``geometry.problem_shape`` at once; ``objective`` maps
    ``xi`` to ``(loss shape=[*P], gradient)``; ``generator`` seeds random starts."""
    if not isinstance(settings, AscentSettings):
        raise TypeError(f"settings must be an AscentSettings, got {type(settings).__name__}")
    if (settings.random_init or settings.restarts) and generator is None:
        raise ValueError("random_init and restarts draw random starts: pass a seeded generator "
                         "(without one, batched_ascend starts from xi = 0 only)")
    outcome = ascend(geometry, objective, settings, generator=generator,
                     on_evaluation=on_evaluation)
    return BatchedOutcome(outcome.loss, outcome.start_loss, outcome.xi)
