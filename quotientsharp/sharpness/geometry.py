"""Product geometry of a network's parameters: GL buckets, the diagonal block, the other block.

The tangent space at ``theta`` splits into blocks (SPEC sections 2-4):

- :class:`GLBlock`: one bucket of attention pairs, ``G`` ``shape=[P, n, h]`` and ``H``
  ``shape=[P, m, h]``, every head of every layer with those shapes stacked on dim 0. Every
  operation is one batched call over the whole bucket;
- :class:`DiagonalBlock`: all diagonal-network coordinates ``(u, v)``, ``shape=[D]`` each;
- :class:`ScaledBlock`: the remaining parameters with the metric ``diag(1 / c^2)``: the adaptive
  metric of SPEC section 4 (``c = |w|``) or the Euclidean one (``c = 1``). Coordinates with
  ``c = 0`` have no room to move: every operation keeps them at exactly zero, never NaN.

The metric of the product is the sum of the blocks' metrics, so squared norms add.

The sharpness solver moves only inside the tangent space at one base point ``theta``: the metric,
the horizontal projection and the gradient raising are always evaluated at ``theta``. Each block
therefore factorises its Gram matrices once, on construction (:attr:`GLBlock.gram_g`, their
eigendecompositions, inverses and square roots), and the hot loop only multiplies by the cached
factors. The closed forms are those of SPEC section 3 with ``G^T G -> G^T G + eps I``; the tests
compare them with the autograd reference of :mod:`quotientsharp.reference` and with
``GLQuotient`` / :class:`~quotientsharp.DiagonalQuotient`.

Exact geodesics: a GL bucket integrates the geodesic equation by RK4 (through
``GLQuotient.geodesic_exact`` where that class is available, otherwise with this module's own
closed-form Christoffel contraction evaluated along the path); the diagonal block uses the closed
forms of :class:`~quotientsharp.DiagonalQuotient`; the adaptive block's exact geodesic is
``w * exp(xi / w)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .. import reference
from ..diagonal import DiagonalQuotient

Tensors = tuple[torch.Tensor, ...]

GL_METRICS = ("inv", "mix", "euclidean")
DIAGONAL_METRICS = ("inv", "mix", "euclidean")
ORDERS = (1, 2, "exact")
OTHER_PATHS = ("line", "geodesic")


def check_order(order: object) -> int | str:
    """Validate a geodesic order: ``1``, ``2`` or ``"exact"``."""
    if isinstance(order, bool) or order not in ORDERS:
        raise ValueError(f"order must be 1, 2 or 'exact', got {order!r}")
    return order  # type: ignore[return-value]


def _spectral(vectors: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``V diag(values) V^T``, batched."""
    return (vectors * values.unsqueeze(-2)) @ vectors.mT


class Block(Protocol):
    """Interface of one block of the product geometry (all arguments are tuples of tensors)."""

    name: str
    base: Tensors

    def norm_sq(self, xi: Tensors) -> torch.Tensor: ...
    def horizontal(self, xi: Tensors) -> Tensors: ...
    def raise_gradient(self, egrad: Tensors) -> Tensors: ...
    def christoffel(self, xi: Tensors) -> Tensors: ...
    def point(self, xi: Tensors, order: int | str) -> Tensors: ...
    def isotropic(self, generator: torch.Generator | None) -> Tensors: ...


# ---------------------------------------------------------------------------- GL(h) buckets
def gl_christoffel(G: torch.Tensor, H: torch.Tensor, xi_g: torch.Tensor, xi_h: torch.Tensor,
                   metric: str, eps: float) -> Tensors:
    """Christoffel contraction ``Gamma(xi, xi)`` of a GL bucket at an arbitrary point.

    Parameters
    ----------
    G, H
        The point, ``shape=[..., n, h]`` and ``shape=[..., m, h]``.
    xi_g, xi_h
        The velocity, same shapes.
    metric
        ``"inv"``, ``"mix"`` or ``"euclidean"``.
    eps
        Gram relaxation ``G^T G + eps I``.

    Used along exact geodesics, where the point moves and no Gram can be cached.
    """
    if metric == "euclidean":
        return torch.zeros_like(xi_g), torch.zeros_like(xi_h)
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    inv_g = torch.linalg.inv(G.mT @ G + eps * eye)
    inv_h = torch.linalg.inv(H.mT @ H + eps * eye)
    return _christoffel_with(G, H, xi_g, xi_h, inv_g, inv_h, metric)


def _christoffel_with(G: torch.Tensor, H: torch.Tensor, xi_g: torch.Tensor, xi_h: torch.Tensor,
                      inv_g: torch.Tensor, inv_h: torch.Tensor, metric: str) -> Tensors:
    """SPEC section 3 Christoffel contractions given the inverse (relaxed) Grams."""
    cross_g = xi_g.mT @ G
    cross_g = cross_g + cross_g.mT            # xi_G^T G + G^T xi_G
    cross_h = xi_h.mT @ H
    cross_h = cross_h + cross_h.mT
    if metric == "inv":
        gamma_g = -(xi_g @ inv_g) @ cross_g + (G @ inv_g) @ (xi_g.mT @ xi_g)
        gamma_h = -(xi_h @ inv_h) @ cross_h + (H @ inv_h) @ (xi_h.mT @ xi_h)
        return gamma_g, gamma_h
    # mix: G and H are coupled
    gamma_g = (xi_g @ cross_h - G @ (xi_h.mT @ xi_h)) @ inv_h
    gamma_h = (xi_h @ cross_g - H @ (xi_g.mT @ xi_g)) @ inv_g
    return gamma_g, gamma_h


def _gl_quotient_class() -> type | None:
    try:
        from ..gl import GLQuotient
    except ImportError:
        return None
    return GLQuotient


class GLBlock:
    """One bucket of ``GL(h)`` pairs at a fixed base point, with its Grams factorised once.

    Parameters
    ----------
    G, H
        Base point, ``shape=[P, n, h]`` and ``shape=[P, m, h]``.
    metric
        ``"inv"``, ``"mix"`` or ``"euclidean"`` (SPEC section 3).
    eps
        Relaxation ``G^T G -> G^T G + eps I`` (and for ``H``), used in every formula.
    exact_steps
        RK4 steps of the exact geodesic.
    pair_names
        Optional readable name per pair (for error messages), ``len == P``.
    """

    def __init__(self, G: torch.Tensor, H: torch.Tensor, metric: str = "inv", eps: float = 0.0,
                 exact_steps: int = 32, pair_names: Sequence[str] | None = None,
                 name: str = "gl") -> None:
        if metric not in GL_METRICS:
            raise ValueError(f"metric must be one of {GL_METRICS}, got {metric!r}")
        if G.dim() != 3 or H.dim() != 3 or G.shape[0] != H.shape[0] or G.shape[2] != H.shape[2]:
            raise ValueError(f"a GL bucket needs G [P, n, h] and H [P, m, h], got "
                             f"{tuple(G.shape)} and {tuple(H.shape)}")
        self.name = name
        self.metric = metric
        self.eps = float(eps)
        self.exact_steps = int(exact_steps)
        self.base = (G, H)
        h = G.shape[-1]
        eye = torch.eye(h, dtype=G.dtype, device=G.device)
        self.gram_g = G.mT @ G + self.eps * eye                    # [P, h, h]
        self.gram_h = H.mT @ H + self.eps * eye
        values_g, vectors_g = torch.linalg.eigh(self.gram_g)
        values_h, vectors_h = torch.linalg.eigh(self.gram_h)
        self._spectra = (values_g, values_h)
        self.pair_names = list(pair_names) if pair_names is not None else None
        # Clamping only guards the cached factors against round-off: validate() reports
        # genuinely singular Grams up front.
        tiny = torch.finfo(G.dtype).tiny
        values_g, values_h = values_g.clamp_min(tiny), values_h.clamp_min(tiny)
        self.inv_g = _spectral(vectors_g, 1.0 / values_g)
        self.inv_h = _spectral(vectors_h, 1.0 / values_h)
        if metric == "inv":
            # A = S_G S_H is similar to C = S_G^{1/2} S_H S_G^{1/2} (SPD): solve in C's eigenbasis
            sqrt_g = _spectral(vectors_g, values_g.sqrt())
            inv_sqrt_g = _spectral(vectors_g, values_g.rsqrt())
            lam, q = torch.linalg.eigh(sqrt_g @ self.gram_h @ sqrt_g)
            self._sylvester_left = q.mT @ inv_sqrt_g                 # Q^T S_G^{-1/2}
            self._sylvester_right = sqrt_g @ q                       # S_G^{1/2} Q
            self._sylvester_denominator = lam.unsqueeze(-1) + lam.unsqueeze(-2)
            self._iso_g, self._iso_h = sqrt_g, _spectral(vectors_h, values_h.sqrt())
        elif metric == "mix":
            self._iso_g = _spectral(vectors_h, values_h.rsqrt())
            self._iso_h = _spectral(vectors_g, values_g.rsqrt())
        else:
            self._eig_g, self._eig_h = vectors_g, vectors_h
            self._sylvester_denominator = values_g.unsqueeze(-1) + values_h.unsqueeze(-2)

    # ------------------------------------------------------------------ checks (host sync)
    def validate(self) -> None:
        """Raise if a Gram matrix is singular (rank-deficient factor with ``eps = 0``)."""
        for factor, values in zip("GH", self._spectra, strict=True):
            scale = values.amax(-1).clamp_min(torch.finfo(values.dtype).tiny)
            threshold = 10 * values.shape[-1] * torch.finfo(values.dtype).eps * scale
            bad = (values.amin(-1) <= threshold).nonzero().flatten().tolist()
            if bad:
                where = (", ".join(self.pair_names[i] for i in bad[:5]) if self.pair_names
                         else f"indices {bad[:5]}")
                raise ValueError(f"rank-deficient factor {factor} in GL bucket {self.name!r} "
                                 f"({where}): {factor}^T {factor} + eps I is singular with "
                                 f"eps={self.eps:g}; pass eps > 0")

    # ------------------------------------------------------------------ metric
    def norm_sq(self, xi: Tensors) -> torch.Tensor:
        xi_g, xi_h = xi
        if self.metric == "inv":
            return ((xi_g @ self.inv_g) * xi_g).sum() + ((xi_h @ self.inv_h) * xi_h).sum()
        if self.metric == "mix":
            return ((xi_g @ self.gram_h) * xi_g).sum() + ((xi_h @ self.gram_g) * xi_h).sum()
        return xi_g.square().sum() + xi_h.square().sum()

    def horizontal(self, xi: Tensors) -> Tensors:
        G, H = self.base
        xi_g, xi_h = xi
        if self.metric == "mix":
            lag = 0.5 * ((xi_h.mT @ H) @ self.inv_h - self.inv_g @ (G.mT @ xi_g))
        elif self.metric == "inv":
            # A L^T + L^T A = B, A = S_G S_H, B = S_G H^T xi_H - xi_G^T G S_H (SPEC, ERRATUM)
            rhs = self.gram_g @ (H.mT @ xi_h) - (xi_g.mT @ G) @ self.gram_h
            z = (self._sylvester_left @ rhs @ self._sylvester_right) / self._sylvester_denominator
            lag = (self._sylvester_right @ z @ self._sylvester_left).mT
        else:
            # S_G L + L S_H = xi_H^T H - G^T xi_G
            rhs = xi_h.mT @ H - G.mT @ xi_g
            z = (self._eig_g.mT @ rhs @ self._eig_h) / self._sylvester_denominator
            lag = self._eig_g @ z @ self._eig_h.mT
        return xi_g + G @ lag, xi_h - H @ lag.mT

    def raise_gradient(self, egrad: Tensors) -> Tensors:
        e_g, e_h = egrad
        if self.metric == "inv":
            return e_g @ self.gram_g, e_h @ self.gram_h
        if self.metric == "mix":
            return e_g @ self.inv_h, e_h @ self.inv_g
        return e_g, e_h

    def christoffel(self, xi: Tensors) -> Tensors:
        if self.metric == "euclidean":
            return torch.zeros_like(xi[0]), torch.zeros_like(xi[1])
        G, H = self.base
        return _christoffel_with(G, H, xi[0], xi[1], self.inv_g, self.inv_h, self.metric)

    def point(self, xi: Tensors, order: int | str) -> Tensors:
        G, H = self.base
        if order == 1 or self.metric == "euclidean":
            return G + xi[0], H + xi[1]
        if order == 2:
            gamma_g, gamma_h = self.christoffel(xi)
            return G + xi[0] - 0.5 * gamma_g, H + xi[1] - 0.5 * gamma_h
        quotient_class = _gl_quotient_class()
        if quotient_class is not None:
            quotient = quotient_class(metric=self.metric, eps=self.eps)
            return tuple(quotient.geodesic_exact(self.base, tuple(xi), 1.0,
                                                 steps=self.exact_steps))
        return reference.geodesic_ode(
            self.base, tuple(xi), 1.0, (2, 2),
            lambda p, w: gl_christoffel(p[0], p[1], w[0], w[1], self.metric, self.eps),
            self.exact_steps)

    def isotropic(self, generator: torch.Generator | None) -> Tensors:
        """Gaussian tangent vector with identity covariance in the metric (before projection)."""
        G, H = self.base
        noise_g = torch.randn(G.shape, generator=generator, dtype=G.dtype, device=G.device)
        noise_h = torch.randn(H.shape, generator=generator, dtype=H.dtype, device=H.device)
        if self.metric == "euclidean":
            return noise_g, noise_h
        return noise_g @ self._iso_g, noise_h @ self._iso_h


# ---------------------------------------------------------------------------- diagonal block
class DiagonalBlock:
    """All diagonal-network coordinates ``(u, v)``, ``shape=[D]`` each: ``GL(1)^D``, elementwise.

    The inv and mix forms are those of :class:`~quotientsharp.DiagonalQuotient` (no ``eps``: a
    zero ``u_i`` or ``v_i`` is rejected by :meth:`validate`). ``"euclidean"`` is the GL(1) case
    of the Euclidean metric of SPEC section 3.
    """

    def __init__(self, u: torch.Tensor, v: torch.Tensor, metric: str = "inv",
                 name: str = "diagonal") -> None:
        if metric not in DIAGONAL_METRICS:
            raise ValueError(f"metric must be one of {DIAGONAL_METRICS}, got {metric!r}")
        self.name = name
        self.metric = metric
        self.base = (u, v)
        self._u_sq, self._v_sq = u.square(), v.square()

    def validate(self) -> None:
        u, v = self.base
        if self.metric == "euclidean":
            bad = ((u == 0) & (v == 0)).nonzero().flatten().tolist()
            if bad:
                raise ValueError(f"diagonal coordinates {bad[:5]} have u = v = 0: the orbit is "
                                 "degenerate there")
            return
        for label, tensor in (("u", u), ("v", v)):
            bad = (tensor == 0).nonzero().flatten().tolist()
            if bad:
                raise ValueError(f"diagonal coordinates {bad[:5]} have {label} = 0, which the "
                                 f"{self.metric} metric divides by (degenerate orbit)")

    def norm_sq(self, xi: Tensors) -> torch.Tensor:
        if self.metric == "inv":
            return (xi[0].square() / self._u_sq + xi[1].square() / self._v_sq).sum()
        if self.metric == "mix":
            return (xi[0].square() * self._v_sq + xi[1].square() * self._u_sq).sum()
        return xi[0].square().sum() + xi[1].square().sum()

    def horizontal(self, xi: Tensors) -> Tensors:
        u, v = self.base
        if self.metric == "euclidean":
            lag = (xi[1] * v - u * xi[0]) / (self._u_sq + self._v_sq)
            return xi[0] + u * lag, xi[1] - v * lag
        rate = 0.5 * (xi[0] / u + xi[1] / v)
        return rate * u, rate * v

    def raise_gradient(self, egrad: Tensors) -> Tensors:
        if self.metric == "inv":
            return egrad[0] * self._u_sq, egrad[1] * self._v_sq
        if self.metric == "mix":
            return egrad[0] / self._v_sq, egrad[1] / self._u_sq
        return tuple(egrad)

    def christoffel(self, xi: Tensors) -> Tensors:
        u, v = self.base
        if self.metric == "inv":
            return -xi[0].square() / u, -xi[1].square() / v
        if self.metric == "mix":
            cross = 2 * xi[0] * xi[1]
            return (cross / v - u * xi[1].square() / self._v_sq,
                    cross / u - v * xi[0].square() / self._u_sq)
        return torch.zeros_like(xi[0]), torch.zeros_like(xi[1])

    def point(self, xi: Tensors, order: int | str) -> Tensors:
        u, v = self.base
        if order == 1 or self.metric == "euclidean":
            return u + xi[0], v + xi[1]
        if order == 2:
            gamma_u, gamma_v = self.christoffel(xi)
            return u + xi[0] - 0.5 * gamma_u, v + xi[1] - 0.5 * gamma_v
        return DiagonalQuotient(self.metric).geodesic_exact(self.base, tuple(xi), 1.0)

    def isotropic(self, generator: torch.Generator | None) -> Tensors:
        u, v = self.base
        noise = tuple(torch.randn(t.shape, generator=generator, dtype=t.dtype, device=t.device)
                      for t in (u, v))
        if self.metric == "inv":
            return noise[0] * u.abs(), noise[1] * v.abs()
        if self.metric == "mix":
            return noise[0] / v.abs(), noise[1] / u.abs()
        return noise


# ---------------------------------------------------------------------------- other block
class ScaledBlock:
    """Parameters outside any symmetry, metric ``diag(1 / c^2)`` (SPEC section 4).

    Parameters
    ----------
    base
        The parameters ``w``, any shapes.
    scale
        ``c`` per parameter, same shapes: ``|w|`` (adaptive) or ones (Euclidean). Coordinates
        with ``c = 0`` stay at exactly zero displacement.
    path
        ``"line"``: ``w + xi`` for every order (the paper's default); ``"geodesic"``: the
        metric's own geodesic, ``w + xi + xi^2 / (2 w)`` at order 2 and ``w * exp(xi / w)``
        exactly (only for the adaptive scale ``c = |w|``).
    """

    def __init__(self, base: Sequence[torch.Tensor], scale: Sequence[torch.Tensor],
                 path: str = "line", name: str = "other") -> None:
        if path not in OTHER_PATHS:
            raise ValueError(f"the other-parameter path must be one of {OTHER_PATHS}, got "
                             f"{path!r}")
        self.name = name
        self.base = tuple(base)
        self.path = path
        self.scale = tuple(scale)
        self._scale_sq = tuple(c.square() for c in self.scale)
        # 1/c where c > 0 and 0 where c = 0: the fixed coordinates contribute nothing, never 0/0
        self._inv_scale = tuple(torch.where(c == 0, torch.zeros_like(c), 1.0 / c.masked_fill(
            c == 0, 1.0)) for c in self.scale)
        self._inv_base = tuple(torch.where(w == 0, torch.zeros_like(w), 1.0 / w.masked_fill(
            w == 0, 1.0)) for w in self.base)

    def validate(self) -> None:
        """Nothing can be singular: zero scales are fixed coordinates."""

    def norm_sq(self, xi: Tensors) -> torch.Tensor:
        total = xi[0].new_zeros(()) if xi else torch.zeros(())
        for d, inv_c in zip(xi, self._inv_scale, strict=True):
            total = total + (d * inv_c).square().sum()
        return total

    def horizontal(self, xi: Tensors) -> Tensors:
        return tuple(xi)

    def raise_gradient(self, egrad: Tensors) -> Tensors:
        return tuple(e * c2 for e, c2 in zip(egrad, self._scale_sq, strict=True))

    def christoffel(self, xi: Tensors) -> Tensors:
        if self.path == "line":
            return tuple(torch.zeros_like(d) for d in xi)
        return tuple(-d.square() * inv_w for d, inv_w in zip(xi, self._inv_base, strict=True))

    def point(self, xi: Tensors, order: int | str) -> Tensors:
        if self.path == "line" or order == 1:
            return tuple(w + d for w, d in zip(self.base, xi, strict=True))
        if order == 2:
            return tuple(w + d + 0.5 * d.square() * inv_w
                         for w, d, inv_w in zip(self.base, xi, self._inv_base, strict=True))
        return tuple(w * torch.exp(d * inv_w)
                     for w, d, inv_w in zip(self.base, xi, self._inv_base, strict=True))

    def isotropic(self, generator: torch.Generator | None) -> Tensors:
        return tuple(c * torch.randn(c.shape, generator=generator, dtype=c.dtype, device=c.device)
                     for c in self.scale)


# ---------------------------------------------------------------------------- the product
class ProductGeometry:
    """The product of blocks at one base point, with the L2 ball of radius ``radius``.

    Tangent vectors are flat tuples: the tensors of every block, in block order.

    Parameters
    ----------
    blocks
        :class:`GLBlock`, :class:`DiagonalBlock` and :class:`ScaledBlock` instances.
    radius
        ``rho``: the solver's constraint ``||xi||_g <= rho``.
    order
        Path from the base point: ``1``, ``2`` or ``"exact"`` (see the blocks).
    """

    def __init__(self, blocks: Sequence[Block], radius: float, order: int | str = 1) -> None:
        self.blocks = list(blocks)
        self.radius = float(radius)
        self.order = check_order(order)
        self._slices = []
        start = 0
        for block in self.blocks:
            self._slices.append(slice(start, start + len(block.base)))
            start += len(block.base)
        self.base: Tensors = tuple(t for block in self.blocks for t in block.base)
        if not self.base:
            raise ValueError("the geometry has no coordinates to perturb")
        self.dtype = self.base[0].dtype
        self.device = self.base[0].device

    def split(self, xi: Sequence[torch.Tensor]) -> list[Tensors]:
        return [tuple(xi[s]) for s in self._slices]

    def _map(self, method: str, xi: Sequence[torch.Tensor]) -> Tensors:
        return tuple(t for block, part in zip(self.blocks, self.split(xi), strict=True)
                     for t in getattr(block, method)(part))

    def validate(self) -> None:
        for block in self.blocks:
            block.validate()

    def zeros(self) -> Tensors:
        return tuple(torch.zeros_like(t) for t in self.base)

    def block_norms(self, xi: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{"total": ||xi||_g, block name: block norm}``, device tensors (no sync)."""
        squares = {}
        for block, part in zip(self.blocks, self.split(xi), strict=True):
            squares[block.name] = squares.get(block.name, 0) + block.norm_sq(part)
        total = sum(squares.values())
        return {"total": total.sqrt(), **{k: v.sqrt() for k, v in squares.items()}}

    def norm(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        total = sum(block.norm_sq(part)
                    for block, part in zip(self.blocks, self.split(xi), strict=True))
        return total.clamp_min(0).sqrt()

    def horizontal(self, xi: Sequence[torch.Tensor]) -> Tensors:
        return self._map("horizontal", xi)

    def raise_gradient(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        return self._map("raise_gradient", egrad)

    def riemannian_gradient(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        """Metric-raised Euclidean gradient, projected to the horizontal space."""
        return self.horizontal(self.raise_gradient(egrad))

    def christoffel(self, xi: Sequence[torch.Tensor]) -> Tensors:
        return self._map("christoffel", xi)

    def point(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``gamma_xi(1)`` of every block at the configured order."""
        return tuple(t for block, part in zip(self.blocks, self.split(xi), strict=True)
                     for t in block.point(part, self.order))

    def _rescale(self, xi: Tensors, norm: torch.Tensor, radius: torch.Tensor | float) -> Tensors:
        tiny = torch.finfo(norm.dtype).tiny
        factor = (radius / norm.clamp_min(tiny)).clamp(max=1.0)
        return tuple(factor * t for t in xi)

    # ------------------------------------------------------------------ solver interface
    def project(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``P_S``: horizontal projection, then radial rescale into ``||xi||_g <= rho``."""
        horizontal = self.horizontal(xi)
        return self._rescale(horizontal, self.norm(horizontal), self.radius)

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        """The Riemannian gradient normalised by its g-norm (zero stays zero)."""
        rgrad = self.riemannian_gradient(egrad)
        norm = self.norm(rgrad).clamp_min(torch.finfo(self.dtype).tiny)
        return tuple(t / norm for t in rgrad)

    def random_start(self, generator: torch.Generator | None) -> Tensors:
        """Horizontal projection of a metric-isotropic Gaussian, radius ``rho * U(0, 1)``."""
        direction = self.horizontal(self._map("isotropic", self.base))
        radius = self.radius * torch.rand((), generator=generator, dtype=self.dtype,
                                          device=self.device)
        norm = self.norm(direction).clamp_min(torch.finfo(self.dtype).tiny)
        return tuple(t * (radius / norm) for t in direction)


class BoxGeometry:
    """The L-infinity ball ``|delta / c| <= rho`` (elementwise) around the parameters.

    Straight lines only; the ascent direction is ``c * sign(gradient)`` (sign ascent in the
    scaled variable ``delta / c``), the projection is a clamp. ``c = 0`` coordinates are fixed.
    """

    def __init__(self, base: Sequence[torch.Tensor], scale: Sequence[torch.Tensor],
                 radius: float) -> None:
        self.base = tuple(base)
        if not self.base:
            raise ValueError("the geometry has no coordinates to perturb")
        self.scale = tuple(scale)
        self.radius = float(radius)
        self.order = 1
        self.dtype = self.base[0].dtype
        self.device = self.base[0].device
        self._bounds = tuple(self.radius * c for c in self.scale)
        self._inv_scale = tuple(torch.where(c == 0, torch.zeros_like(c), 1.0 / c.masked_fill(
            c == 0, 1.0)) for c in self.scale)

    def validate(self) -> None:
        """Nothing can be singular."""

    def zeros(self) -> Tensors:
        return tuple(torch.zeros_like(t) for t in self.base)

    def point(self, xi: Sequence[torch.Tensor]) -> Tensors:
        return tuple(w + d for w, d in zip(self.base, xi, strict=True))

    def project(self, xi: Sequence[torch.Tensor]) -> Tensors:
        return tuple(torch.maximum(torch.minimum(d, b), -b)
                     for d, b in zip(xi, self._bounds, strict=True))

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        return tuple(c * torch.sign(e) for c, e in zip(self.scale, egrad, strict=True))

    def random_start(self, generator: torch.Generator | None) -> Tensors:
        return tuple(b * (2 * torch.rand(b.shape, generator=generator, dtype=b.dtype,
                                         device=b.device) - 1) for b in self._bounds)

    def block_norms(self, xi: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        largest = torch.stack([(d * inv).abs().amax() if d.numel() else d.new_zeros(())
                               for d, inv in zip(xi, self._inv_scale, strict=True)]).amax()
        return {"total": largest}
