"""The mix metric on diagonal networks: ``<eta, nu> = sum eta_u nu_u v^2 + eta_v nu_v u^2``.

(``derivations/diagonal.py`` derives and checks every formula with sympy.) Invariant under
``(a u, v / a)``.

- vertical products: ``<(u_i, -v_i) e_i, xi> = p (xi_u v - xi_v u)`` with ``p = u v``,
  ``||V_i|| = sqrt(2) |p|``;
- raised gradient: ``(dL/du / v^2, dL/dv / u^2)``;
- Christoffel contraction, with ``c = xi_u nu_v + nu_u xi_v``:
  ``Gamma(xi, nu) = (c / v - u xi_v nu_v / v^2, c / u - v xi_u nu_u / u^2)``;
- exact geodesic, for any velocity: the metric is ``(dp^2 + p^2 ds^2) / 2`` with ``p = u v`` and
  ``s = log |u / v|``, flat polar coordinates, so geodesics are straight lines in the plane.
  With ``alpha = xi_u / u``, ``beta = xi_v / v`` and
  ``z = 1 + t (alpha + beta) + i t (alpha - beta) = r e^{i phi}``:
  ``u(t) = u sqrt(r) e^{phi / 2}``, ``v(t) = v sqrt(r) e^{-phi / 2}``. For a horizontal velocity
  (``alpha = beta = b``) it is ``sqrt(1 + 2 b t)`` times the start, and it reaches ``u v = 0``
  (leaves the manifold) once ``1 + 2 b t <= 0``;
- on the quotient the metric is ``d beta^2 / 2``, flat in ``beta = u v``: ``beta(t) =
  beta (1 + 2 b t)``, a straight line that :meth:`DiagonalMixPoint.quotient_geodesic` continues
  through ``beta = 0`` (the completion of the quotient, where the loss of a diagonal net,
  a function of ``beta`` alone, is still defined).
"""

from __future__ import annotations

import math

import torch

from quotientsharp.core.diagonal.point import DiagonalMetric, DiagonalPoint
from quotientsharp.core.validation import value_checks_enabled

Tensors = tuple[torch.Tensor, ...]


class DiagonalMixPoint(DiagonalPoint):
    """The mix metric's formulas at a frozen ``(u, v)`` (module docstring)."""

    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        a, b = self.x
        return (u[0] * v[0] * b.square() + u[1] * v[1] * a.square()).sum(-1)

    def vertical_products(self, u: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.x
        p = a * b
        return p * (u[0] * b - u[1] * a), (2.0 * p.square()).sqrt()

    def raise_index(self, egrad: Tensors) -> Tensors:
        return egrad[0] / self.x[1].square(), egrad[1] / self.x[0].square()

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        a, b = self.x
        v = u if v is None else v
        cross = u[0] * v[1] + v[0] * u[1]
        return (cross / b - a * u[1] * v[1] / b.square(),
                cross / a - b * u[0] * v[0] / a.square())

    def geodesic_exact(self, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        a, b = self.x
        alpha, beta = u[0] / a, u[1] / b
        re = 1.0 + t * (alpha + beta)
        im = t * (alpha - beta)
        if value_checks_enabled():
            # a radial line through p = 0 leaves the manifold: u * v would change sign
            tol = 64 * torch.finfo(re.dtype).eps
            leaves = (re <= 0) & (im.abs() <= tol * (1.0 + re.abs()))
            if bool(leaves.any()):
                raise ValueError("the exact mix geodesic leaves the manifold before time t (it "
                                 "reaches u * v = 0); shorten t or the velocity u")
        r = torch.sqrt(re.square() + im.square())
        phi = torch.atan2(im, re)
        root = torch.sqrt(r)
        half = torch.exp(0.5 * phi)
        return a * root * half, b * root / half

    def check_ball(self, radius: float, order: int | str) -> None:
        """Reject radii whose exact geodesics may leave the manifold.

        A horizontal ``xi = (b u, b v)`` has ``|xi|^2 = 2 |u v b|^2``, so the ball allows
        ``|b_i|`` up to ``rho / (sqrt(2) |u_i v_i|)``, and ``sqrt(1 + 2 b)`` reaches ``u v = 0``
        before ``t = 1`` once ``b_i <= -1/2``.
        """
        if order != "exact":
            return
        limit = float(self.submersion().abs().min()) / math.sqrt(2.0)
        if radius >= limit:
            raise ValueError(f"order='exact' with the mix metric: rho={radius:g} lets the exact "
                             "geodesic of a diagonal coordinate leave the manifold (reach "
                             f"u * v = 0) before t = 1; use rho < {limit:.6g} (min |u v| / "
                             "sqrt(2)) or order=2")

    def quotient_geodesic(self, u: Tensors, t: float = 1.0) -> torch.Tensor:
        return self.submersion() * (1.0 + 2.0 * t * self.rate(u))

    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        a, b = self.x
        # over b, not |b|: (a u, v / a) maps the draw to (a xi_u, xi_v / a) for a < 0 too
        return (torch.randn(a.shape, generator=generator, dtype=a.dtype, device=a.device) / b,
                torch.randn(b.shape, generator=generator, dtype=b.dtype, device=b.device) / a)


class DiagonalMixMetric(DiagonalMetric):
    """``sum eta_u nu_u v^2 + eta_v nu_v u^2``: invariant, flat in ``beta = u v``."""

    name = "mix"
    point_type = DiagonalMixPoint
