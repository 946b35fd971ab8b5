"""The GL(1)^d quotient of diagonal networks ``y = x^T (u * v)``.

The rescaling ``(a * u, v / a)``, ``a`` in ``(R \\ {0})^d``, leaves ``beta = u * v`` and hence the
network unchanged. Both metrics of the paper are invariant, so they descend to the quotient:

- ``inv``: ``<eta, nu> = sum eta_u nu_u / u^2 + eta_v nu_v / v^2``;
- ``mix``: ``<eta, nu> = sum eta_u nu_u v^2 + eta_v nu_v u^2``.

Every operation has a closed form (``derivations/diagonal.py`` derives and checks them).
The exact geodesics hold for any initial velocity, not only horizontal ones. Writing
``alpha = xi_u / u`` and ``beta = xi_v / v`` (coordinatewise):

- ``inv``: each coordinate is the line ``log |u|``, so ``u(t) = u exp(alpha t)``,
  ``v(t) = v exp(beta t)``;
- ``mix``: the metric is ``(dp^2 + p^2 ds^2) / 2`` with ``p = u v`` and ``s = log |u / v|``, flat
  polar coordinates. Geodesics are straight lines in the plane: with
  ``z = 1 + t (alpha + beta) + i t (alpha - beta) = r e^{i phi}``,
  ``u(t) = u sqrt(r) e^{phi / 2}``, ``v(t) = v sqrt(r) e^{-phi / 2}``. For horizontal
  velocities (``alpha = beta = b``) this is ``sqrt(1 + 2 b t)`` times the start.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .quotient import SymmetryQuotient
from .validation import check_nonzero, value_checks_enabled

Tensors = tuple[torch.Tensor, ...]

METRICS = ("inv", "mix")


class DiagonalQuotient(SymmetryQuotient):
    """Diagonal networks ``(u, v)``, ``shape=[..., d]`` each, modulo coordinatewise rescaling.

    Parameters
    ----------
    metric
        ``"inv"`` or ``"mix"`` (see the module docstring).
    d
        Optional width, used only by :meth:`random_point`.
    """

    point_ndims = (1, 1)

    def __init__(self, metric: str = "inv", d: int | None = None) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        super().__init__(None if d is None else ((d,), (d,)))
        self.metric = metric
        self.name = f"diagonal-{metric}"

    # ------------------------------------------------------------------ definition
    def inner(self, x: Tensors, u: Tensors, v: Tensors) -> torch.Tensor:
        a, b = x
        if self.metric == "inv":
            return (u[0] * v[0] / a.square() + u[1] * v[1] / b.square()).sum(-1)
        return (u[0] * v[0] * b.square() + u[1] * v[1] * a.square()).sum(-1)

    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        return a * x[0], -a * x[1]

    def act(self, x: Tensors, g: torch.Tensor) -> Tensors:
        return g * x[0], x[1] / g

    def act_tangent(self, x: Tensors, u: Tensors, g: torch.Tensor) -> Tensors:
        return g * u[0], u[1] / g

    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        return (x[0].shape[-1],)

    def check_point(self, x: object, name: str = "x") -> Tensors:
        x = super().check_point(x, name)
        if x[0].shape[-1] != x[1].shape[-1]:
            raise ValueError(f"{name}[0] (u) and {name}[1] (v) must have the same last dimension, "
                             f"got {tuple(x[0].shape)} and {tuple(x[1].shape)}")
        if value_checks_enabled():
            why = f"which the {self.metric} metric divides by (the orbit is degenerate there)"
            check_nonzero(f"{name}[0] (u)", x[0], why)
            check_nonzero(f"{name}[1] (v)", x[1], why)
        return x

    # ------------------------------------------------------------------ closed forms
    def _rate(self, x: Tensors, u: Tensors) -> torch.Tensor:
        """The horizontal rate ``b = (xi_u / u + xi_v / v) / 2``."""
        return 0.5 * (u[0] / x[0] + u[1] / x[1])

    def horizontal_projection(self, x: Tensors, u: Tensors) -> Tensors:
        x = self.check_point(x)
        u = self.check_tangent(x, u)
        b = self._rate(x, u)
        return b * x[0], b * x[1]

    def vertical_projection(self, x: Tensors, u: Tensors) -> Tensors:
        x = self.check_point(x)
        u = self.check_tangent(x, u)
        c = 0.5 * (u[0] / x[0] - u[1] / x[1])
        return c * x[0], -c * x[1]

    def horizontality_error(self, x: Tensors, u: Tensors) -> torch.Tensor:
        # <V_i, u> / (|V_i| |u|) per coordinate; V_i = (u_i, -v_i) e_i
        if self.metric == "inv":
            dots = u[0] / x[0] - u[1] / x[1]
            vnorm = torch.full_like(dots, 2.0).sqrt()
        else:
            p = x[0] * x[1]
            dots = p * (u[0] * x[1] - u[1] * x[0])
            vnorm = (2.0 * p.square()).sqrt()
        unorm = self.norm(x, u).unsqueeze(-1)
        tiny = torch.finfo(dots.dtype).tiny
        return (dots.abs() / (vnorm * unorm).clamp_min(tiny)).amax(-1)

    def euclidean_to_riemannian_gradient(self, x: Tensors, egrad: Tensors) -> Tensors:
        x = self.check_point(x)
        egrad = self.check_tangent(x, egrad, name="egrad")
        a, b = x
        if self.metric == "inv":
            raised = (egrad[0] * a.square(), egrad[1] * b.square())
        else:
            raised = (egrad[0] / b.square(), egrad[1] / a.square())
        r = self._rate(x, raised)
        return r * a, r * b

    def christoffel(self, x: Tensors, u: Tensors, v: Tensors | None = None) -> Tensors:
        x = self.check_point(x)
        u = self.check_tangent(x, u)
        v = u if v is None else self.check_tangent(x, v, name="v")
        a, b = x
        if self.metric == "inv":
            return -u[0] * v[0] / a, -u[1] * v[1] / b
        cross = u[0] * v[1] + v[0] * u[1]
        return (cross / b - a * u[1] * v[1] / b.square(),
                cross / a - b * u[0] * v[0] / a.square())

    def geodesic_exact(self, x: Tensors, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        alpha, beta = u[0] / x[0], u[1] / x[1]
        if self.metric == "inv":
            return x[0] * torch.exp(t * alpha), x[1] * torch.exp(t * beta)
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
        return x[0] * root * half, x[1] * root / half

    # ------------------------------------------------------------------ sampling
    def random_point(self, batch_shape: Sequence[int] = (), *,
                     shapes: Sequence[Sequence[int]] | None = None,
                     generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> Tensors:
        """Entries of random sign with log-uniform magnitudes in ``[1e-1, 1e1]``.

        The device is ``device``, else the generator's, else torch's default device.
        """
        if device is None and generator is not None:
            device = generator.device
        out = []
        for s in self._shapes(shapes):
            mag = torch.rand(*batch_shape, *s, generator=generator, dtype=dtype, device=device)
            sign = torch.randint(0, 2, (*batch_shape, *s), generator=generator,
                                 device=device).to(mag.dtype) * 2 - 1
            out.append(sign * torch.pow(10.0, 2.0 * mag - 1.0))
        return tuple(out)

    def random_group_element(self, x: Tensors, *, scale: float = 1.0,
                             generator: torch.Generator | None = None) -> torch.Tensor:
        """Nonzero rescalings of random sign, ``|a| = exp(scale * N(0, 1))``."""
        g = super().random_group_element(x, scale=scale, generator=generator)
        sign = torch.randint(0, 2, g.shape, generator=generator, device=g.device).to(g.dtype)
        return g * (2 * sign - 1)

    def extra_repr(self) -> str:
        return f"metric={self.metric!r}"
