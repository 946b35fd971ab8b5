"""What every metric on diagonal networks shares at a frozen point ``(u, v)``, and their base.

The group ``(R \\ {0})^d`` acts by ``(a u, v / a)``; the algebra element ``a`` generates the
vertical vector ``(a u, -a v)``, and ``beta = u v`` (the network's only dependence on the
parameters) is the quotient map, :meth:`DiagonalPoint.submersion`.

For the invariant metrics (inv and mix) the horizontal vectors are exactly the coordinatewise
rescalings ``(b u, b v)``: the vertical direction ``(u_i, -v_i) e_i`` has metric product
``c_i (xi_u / u - xi_v / v)_i`` with ``xi`` for a positive weight ``c_i`` (``1`` for inv,
``u_i^2 v_i^2`` for mix), so the horizontal projection keeps the rate
``b = (xi_u / u + xi_v / v) / 2`` and is the same for both metrics.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from quotientsharp.core.frozen import ClosedFormPoint
from quotientsharp.core.metric import Metric
from quotientsharp.core.reference import largest_normalised_product

Tensors = tuple[torch.Tensor, ...]


class DiagonalPoint(ClosedFormPoint):
    """Diagonal coordinates ``(u, v)``, ``shape=[..., d]`` each, frozen (module docstring)."""

    new_gradients = True

    # ------------------------------------------------------------------ fiber bundle
    def submersion(self, x: Tensors | None = None) -> torch.Tensor:
        """``beta = u v``, the point of the quotient (of ``x``, default the base point)."""
        u, v = self.x if x is None else x
        return u * v

    def rate(self, xi: Tensors) -> torch.Tensor:
        """The horizontal rate ``b = (xi_u / u + xi_v / v) / 2``, ``shape=[..., d]``."""
        return 0.5 * (xi[0] / self.x[0] + xi[1] / self.x[1])

    def vertical_rate(self, xi: Tensors) -> torch.Tensor:
        """The vertical rate ``c = (xi_u / u - xi_v / v) / 2``, ``shape=[..., d]``."""
        return 0.5 * (xi[0] / self.x[0] - xi[1] / self.x[1])

    # ------------------------------------------------------------------ projections
    def horizontal_projection(self, u: Tensors) -> Tensors:
        b = self.rate(u)
        return b * self.x[0], b * self.x[1]

    def vertical_projection(self, u: Tensors) -> Tensors:
        c = self.vertical_rate(u)
        return c * self.x[0], -c * self.x[1]

    def riemannian_gradient(self, egrad: Tensors) -> Tensors:
        return self.horizontal_projection(self.raise_index(egrad))

    def horizontality_error(self, u: Tensors) -> torch.Tensor:
        """``max_i |<V_i, u>| / (||V_i|| ||u||)`` over ``V_i = (u_i, -v_i) e_i``."""
        return largest_normalised_product(*self.vertical_products(u), self.norm(u))

    def vertical_products(self, u: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        """``<V_i, u>`` and ``||V_i||`` per coordinate (per metric)."""
        raise NotImplementedError

    def check_ball(self, radius: float, order: int | str) -> None:
        """Nothing can leave the manifold (the mix metric overrides this)."""

    def quotient_geodesic(self, u: Tensors, t: float = 1.0) -> torch.Tensor:
        """``beta(t)`` on the geodesic of the quotient with velocity ``d beta = d pi(u)``."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form quotient geodesic")


class DiagonalMetric(Metric):
    """A metric on diagonal-network coordinates ``(u, v)``.

    Attributes
    ----------
    name
        Short name (``"inv"``, ``"mix"``, ``"euclidean"``).
    point_type
        The :class:`~quotientsharp.core.diagonal.point.DiagonalPoint` subclass holding the formulas.
    group_invariant
        Whether the rescalings ``(a u, v / a)`` leave the metric invariant.
    """

    name: ClassVar[str] = "diagonal"
    point_type: ClassVar[type[DiagonalPoint]] = DiagonalPoint
    group_invariant: ClassVar[bool] = True
