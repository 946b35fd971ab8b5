"""The inv metric on diagonal networks: ``<eta, nu> = sum eta_u nu_u / u^2 + eta_v nu_v / v^2``.

(``derivations/diagonal.py`` derives and checks every formula with sympy.) Invariant under
``(a u, v / a)``. Each coordinate is the flat line ``log |u|``:

- vertical products: ``<(u_i, -v_i) e_i, xi> = xi_u / u - xi_v / v``, ``||V_i|| = sqrt 2``;
- raised gradient: ``(dL/du u^2, dL/dv v^2)``;
- Christoffel contraction: ``Gamma(xi, nu) = (-xi_u nu_u / u, -xi_v nu_v / v)``;
- exact geodesic, for any velocity: ``u(t) = u exp(t xi_u / u)``, ``v(t) = v exp(t xi_v / v)``;
- on the quotient ``beta = u v`` the metric is ``d beta^2 / (2 beta^2)``: ``beta(t) =
  beta exp(2 b t)`` for the horizontal rate ``b``.
"""

from __future__ import annotations

import torch

from quotientsharp.core.diagonal.point import DiagonalMetric, DiagonalPoint

Tensors = tuple[torch.Tensor, ...]


class DiagonalInvPoint(DiagonalPoint):
    """The inv metric's formulas at a frozen ``(u, v)`` (module docstring)."""

    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        a, b = self.x
        return (u[0] * v[0] / a.square() + u[1] * v[1] / b.square()).sum(-1)

    def vertical_products(self, u: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        dots = u[0] / self.x[0] - u[1] / self.x[1]
        return dots, torch.full_like(dots, 2.0).sqrt()

    def raise_index(self, egrad: Tensors) -> Tensors:
        return egrad[0] * self.x[0].square(), egrad[1] * self.x[1].square()

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        v = u if v is None else v
        return -u[0] * v[0] / self.x[0], -u[1] * v[1] / self.x[1]

    def geodesic_exact(self, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        a, b = self.x
        return a * torch.exp(t * (u[0] / a)), b * torch.exp(t * (u[1] / b))

    def quotient_geodesic(self, u: Tensors, t: float = 1.0) -> torch.Tensor:
        return self.submersion() * torch.exp(2.0 * t * self.rate(u))

    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        return tuple(torch.randn(c.shape, generator=generator, dtype=c.dtype, device=c.device)
                     * c for c in self.x)   # times c, not |c|: equivariant for a < 0 too


class DiagonalInvMetric(DiagonalMetric):
    """``sum eta_u nu_u / u^2 + eta_v nu_v / v^2``: invariant, flat in ``log |u|``."""

    name = "inv"
    point_type = DiagonalInvPoint
