"""The Euclidean metric on diagonal networks: ``<eta, nu> = sum eta_u nu_u + eta_v nu_v``.

The GL(1) case of the Euclidean metric on attention pairs: not invariant under the rescalings,
flat (``Gamma = 0``, straight geodesics). The orbit is degenerate only where ``u = v = 0``.

- vertical products: ``<(u_i, -v_i) e_i, xi> = xi_u u - xi_v v``, ``||V_i|| = sqrt(u^2 + v^2)``;
- horizontal projection: ``xi - c (u, -v)`` with ``c = (xi_u u - xi_v v) / (u^2 + v^2)``;
- raised gradient: the Euclidean gradient itself.
"""

from __future__ import annotations

import torch

from quotientsharp.core.diagonal.point import DiagonalMetric, DiagonalPoint
from quotientsharp.core.frozen import EuclideanMetricPoint

Tensors = tuple[torch.Tensor, ...]


class DiagonalEuclideanPoint(EuclideanMetricPoint, DiagonalPoint):
    """The Euclidean metric's projections at a frozen ``(u, v)`` (module docstring); the
    metric, its flat connection and straight geodesics are :class:`EuclideanMetricPoint`'s."""

    def vertical_products(self, u: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.x
        return u[0] * a - u[1] * b, (a.square() + b.square()).sqrt()

    def vertical_rate(self, xi: Tensors) -> torch.Tensor:
        a, b = self.x
        return (xi[0] * a - xi[1] * b) / (a.square() + b.square())

    def horizontal_projection(self, u: Tensors) -> Tensors:
        c = self.vertical_rate(u)
        return u[0] - c * self.x[0], u[1] + c * self.x[1]


class DiagonalEuclideanMetric(DiagonalMetric):
    """``sum eta_u nu_u + eta_v nu_v``: flat, not invariant under the rescalings."""

    name = "euclidean"
    point_type = DiagonalEuclideanPoint
    group_invariant = False
