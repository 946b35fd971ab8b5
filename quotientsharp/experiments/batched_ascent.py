"""Auto-PGD over many independent problems at once (a leading problem shape), for diagonal nets.

:func:`batched_ascend` is :func:`quotientsharp.sharpness.solver.ascend` (the engine's solver,
which takes each decision per problem for a loss of shape ``P``) on the geometries below, where
``P`` is ``[models, batches]`` in the study: the step size ``eta``, the checkpoint tests, the
best loss and iterate and the momentum are all per problem. The semantics are those of SPEC
section 6:

- ``xi_0 = 0``; ``z = P_S(xi_k + eta d_k)`` with ``d_k`` the Riemannian gradient normalised by
  its g-norm; ``xi_1 = z``, then ``xi_{k+1} = P_S(xi_k + alpha (z - xi_k) + (1 - alpha)
  (xi_k - xi_{k-1}))``;
- at each checkpoint ``w_j < N``, per problem: if fewer than 75% of the steps since the last
  checkpoint increased the loss, or neither ``eta`` nor the best loss changed since it, ``eta``
  is halved and the iterate, its predecessor, its loss and its direction are reset to the best;
- the best loss over every evaluated iterate (the start included) is returned.

Only the deterministic start ``xi = 0`` without restarts is offered (the engine's default);
``tests/test_reproduce_diagonal.py`` checks that one problem here gives the engine's value on an
equivalent ``nn.Module``.

Geometries (all arguments broadcast over ``P``):

- :class:`DiagonalHorizontalGeometry`: the quotient of ``y = x^T (u * v)`` under ``inv`` or
  ``mix`` (SPEC section 2). Horizontal vectors are ``xi = (b u, b v)``, so the iterate is the
  rate ``b`` (``shape=[*P, d]``); ``||xi||^2`` is ``2 ||b||^2`` (inv) or ``2 ||beta b||^2``
  (mix), the Riemannian gradient has rate ``dL/db / 2`` (inv) or ``dL/db / (2 beta^2)`` (mix),
  and the path multiplies ``beta = u v`` by ``(1 + b)^2`` (order 1), ``(1 + b + b^2 / 2)^2``
  (inv, order 2), ``(1 + b - b^2 / 2)^2`` (mix, order 2), ``exp(2 b)`` (inv, exact) or
  ``1 + 2 b`` (mix, exact).
- :class:`AdaptiveGeometry`: worst-case adaptive L2 sharpness on the raw parameters
  ``(u, v)``: ``||xi_u / |u| ||^2 + ||xi_v / |v| ||^2 <= rho^2``, straight lines, gradient raised
  by ``|w|^2``; coordinates with ``w = 0`` stay fixed (SPEC sections 4-5).

The exact mix path ``beta (1 + 2 b)`` is the straight line of the quotient metric
``d beta^2 / 2`` (flat in ``beta``). Where ``1 + 2 b < 0`` it crosses ``beta_i = 0``, a point
outside the quotient of nonzero coordinates; this module continues the line through it (the
loss depends on ``beta`` only), whereas the engine refuses radii that reach it
(``rho >= min |u v| / sqrt(2)``). Inside the engine's range both agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..sharpness.solver import AscentSettings, ascend

Tensors = tuple[torch.Tensor, ...]
BatchedObjective = Callable[[Tensors], tuple[torch.Tensor, Tensors]]

__all__ = [
    "AdaptiveGeometry",
    "BatchedGeometry",
    "BatchedOutcome",
    "DiagonalHorizontalGeometry",
    "PATH_NAMES",
    "batched_ascend",
    "mse_objective",
]

#: ``(metric, order)`` -> readable path of ``beta`` along a horizontal rate ``b``.
PATH_NAMES = {
    ("inv", 1): "beta (1 + b)^2", ("mix", 1): "beta (1 + b)^2",
    ("inv", 2): "beta (1 + b + b^2/2)^2", ("mix", 2): "beta (1 + b - b^2/2)^2",
    ("inv", "exact"): "beta exp(2 b)", ("mix", "exact"): "beta (1 + 2 b)",
}


class BatchedGeometry(Protocol):
    """What :func:`batched_ascend` needs: a ball per problem, ``P = problem_shape``."""

    radius: torch.Tensor | float
    problem_shape: tuple[int, ...]

    def zeros(self) -> Tensors: ...
    def norm(self, xi: Sequence[torch.Tensor]) -> torch.Tensor: ...
    def project(self, xi: Sequence[torch.Tensor]) -> Tensors: ...
    def clip(self, xi: Sequence[torch.Tensor]) -> Tensors: ...
    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors: ...
    def point(self, xi: Sequence[torch.Tensor]) -> torch.Tensor: ...


def _scale(factor: torch.Tensor, xi: Sequence[torch.Tensor]) -> Tensors:
    """``factor`` (``shape=[*P]``) times each tensor of ``xi`` (``shape=[*P, ...]``)."""
    return tuple(factor.reshape(*factor.shape, *([1] * (t.dim() - factor.dim()))) * t
                 for t in xi)


def _rescale(xi: Sequence[torch.Tensor], norm: torch.Tensor,
             radius: torch.Tensor | float) -> Tensors:
    """Radial rescale into the ball: ``min(1, radius / ||xi||) xi``; zero stays zero."""
    tiny = torch.finfo(norm.dtype).tiny
    return _scale((radius / norm.clamp_min(tiny)).clamp(max=1.0), xi)


def _normalised(vectors: Sequence[torch.Tensor], norm: torch.Tensor) -> Tensors:
    return _scale(1.0 / norm.clamp_min(torch.finfo(norm.dtype).tiny), vectors)


class DiagonalHorizontalGeometry:
    """Horizontal perturbations ``xi = (b u, b v)`` of diagonal nets, iterate ``b``.

    Parameters
    ----------
    u, v
        Base points, ``shape=[*P, d]`` or broadcastable to it (``[M, 1, d]`` for ``P = [M, K]``),
        no zero entry.
    metric
        ``"inv"`` or ``"mix"``.
    order
        ``1``, ``2`` or ``"exact"`` (see the module docstring).
    radius
        ``rho``, a number or a tensor of ``shape=[*P]``.
    problem_shape
        ``P``.
    """

    def __init__(self, u: torch.Tensor, v: torch.Tensor, metric: str, order: int | str,
                 radius: torch.Tensor | float, problem_shape: Sequence[int]) -> None:
        if metric not in ("inv", "mix"):
            raise ValueError(f"metric must be 'inv' or 'mix', got {metric!r}")
        if isinstance(order, bool) or order not in (1, 2, "exact"):
            raise ValueError(f"order must be 1, 2 or 'exact', got {order!r}")
        if u.shape != v.shape:
            raise ValueError(f"u and v must have the same shape, got {tuple(u.shape)} and "
                             f"{tuple(v.shape)}")
        if bool((u == 0).any()) or bool((v == 0).any()):
            raise ValueError(f"u and v must have no zero entry: the {metric} metric divides by "
                             "them (degenerate orbit)")
        self.metric, self.order = metric, order
        self.radius = radius
        self.problem_shape = tuple(int(s) for s in problem_shape)
        self.beta = u * v
        self._beta_sq = self.beta.square()
        self.shape = torch.broadcast_shapes(self.beta.shape, (*self.problem_shape, u.shape[-1]))
        self.dtype, self.device = u.dtype, u.device

    def zeros(self) -> Tensors:
        return (torch.zeros(self.shape, dtype=self.dtype, device=self.device),)

    def norm(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        (b,) = xi
        if self.metric == "inv":
            return (2.0 * b.square().sum(-1)).sqrt()
        return (2.0 * (b.square() * self._beta_sq).sum(-1)).sqrt()

    def project(self, xi: Sequence[torch.Tensor]) -> Tensors:
        # the iterate is horizontal by construction: P_S is the radial rescale alone
        return _rescale(xi, self.norm(xi), self.radius)

    clip = project      # the solver's name for P_S on horizontal vectors

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        (gradient,) = egrad
        rate = 0.5 * gradient if self.metric == "inv" else 0.5 * gradient / self._beta_sq
        return _normalised((rate,), self.norm((rate,)))

    def factor(self, b: torch.Tensor) -> torch.Tensor:
        """``beta(1) / beta`` along the path (see the module docstring)."""
        if self.order == 1:
            return (1.0 + b).square()
        if self.order == 2:
            sign = 1.0 if self.metric == "inv" else -1.0
            return (1.0 + b + sign * 0.5 * b.square()).square()
        return torch.exp(2.0 * b) if self.metric == "inv" else 1.0 + 2.0 * b

    def point(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        """``beta`` at ``gamma_xi(1)``, ``shape=[*P, d]``."""
        return self.beta * self.factor(xi[0])


class AdaptiveGeometry:
    """Worst-case adaptive L2 ball around the raw parameters ``(u, v)``.

    Parameters
    ----------
    u, v
        Base points, ``shape=[*P, d]`` or broadcastable to it.
    radius
        ``rho``, a number or a tensor of ``shape=[*P]``.
    problem_shape
        ``P``.
    """

    def __init__(self, u: torch.Tensor, v: torch.Tensor, radius: torch.Tensor | float,
                 problem_shape: Sequence[int]) -> None:
        if u.shape != v.shape:
            raise ValueError(f"u and v must have the same shape, got {tuple(u.shape)} and "
                             f"{tuple(v.shape)}")
        self.base = (u, v)
        self.radius = radius
        self.problem_shape = tuple(int(s) for s in problem_shape)
        self.shape = torch.broadcast_shapes(u.shape, (*self.problem_shape, u.shape[-1]))
        self.dtype, self.device = u.dtype, u.device
        self._scale_sq = (u.square(), v.square())
        # 1/|w| where w != 0 and 0 where w = 0: fixed coordinates add nothing, never 0/0
        self._inv_scale = tuple(torch.where(w == 0, torch.zeros_like(w),
                                            1.0 / w.abs().masked_fill(w == 0, 1.0))
                                for w in self.base)

    def zeros(self) -> Tensors:
        return tuple(torch.zeros(self.shape, dtype=self.dtype, device=self.device)
                     for _ in range(2))

    def norm(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        total = sum((d * inv).square().sum(-1)
                    for d, inv in zip(xi, self._inv_scale, strict=True))
        return total.clamp_min(0).sqrt()

    def project(self, xi: Sequence[torch.Tensor]) -> Tensors:
        return _rescale(xi, self.norm(xi), self.radius)

    clip = project      # no horizontal space to project on: P_S is the rescale

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        raised = tuple(e * c2 for e, c2 in zip(egrad, self._scale_sq, strict=True))
        return _normalised(raised, self.norm(raised))

    def point(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        return (self.base[0] + xi[0]) * (self.base[1] + xi[1])


def mse_objective(geometry: BatchedGeometry, inputs: torch.Tensor,
                  targets: torch.Tensor) -> BatchedObjective:
    """Per-problem mean squared error ``||X_k beta - y_k||^2 / B`` and its gradient in ``xi``.

    Parameters
    ----------
    geometry
        Maps ``xi`` to ``beta``, ``shape=[M, K, d]`` (``P = [M, K]``).
    inputs, targets
        The ``K`` batches, ``shape=[K, B, d]`` and ``shape=[K, B]``.

    The problems are independent, so the gradient of the summed loss is each problem's own.
    The prediction is an elementwise product summed over ``d`` rather than a matrix product:
    a matrix product's rounding depends on how many rows share the call (the BLAS blocking),
    a per-row reduction does not, so a model measured alone or among others (as after
    ``--resume``) gets the same value to the last bit.
    """

    def objective(xi: Tensors) -> tuple[torch.Tensor, Tensors]:
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            beta = geometry.point(leaves)                              # [M, K, d]
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


def batched_ascend(geometry: BatchedGeometry, objective: BatchedObjective,
                   settings: AscentSettings,
                   on_evaluation: Callable[[], None] | None = None) -> BatchedOutcome:
    """Auto-PGD for every problem of ``geometry.problem_shape`` at once (module docstring).

    Parameters
    ----------
    geometry
        :class:`DiagonalHorizontalGeometry`, :class:`AdaptiveGeometry` or alike.
    objective
        ``xi -> (loss shape=[*P], euclidean gradient w.r.t. xi)``.
    settings
        Solver settings; ``random_init`` and ``restarts`` must be off.
    on_evaluation
        Called after every (batched) objective evaluation.
    """
    if not isinstance(settings, AscentSettings):
        raise TypeError(f"settings must be an AscentSettings, got {type(settings).__name__}")
    if settings.random_init or settings.restarts:
        raise ValueError("batched_ascend starts from xi = 0 without restarts: set "
                         "random_init=False and restarts=0")
    outcome = ascend(geometry, objective, settings, on_evaluation=on_evaluation)
    return BatchedOutcome(outcome.loss, outcome.start_loss, outcome.xi)
