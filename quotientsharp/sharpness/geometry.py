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
therefore factorises its Gram matrices once, on construction (Cholesky factors, inverses, the
eigenbases of the horizontal projection's Sylvester equation), and the hot loop only multiplies
by the cached factors. The operations are those of ``GLQuotient`` and
:class:`~quotientsharp.DiagonalQuotient`; the tests compare them with those classes and with the
autograd reference of :mod:`quotientsharp.reference`.

Exact geodesics: a GL bucket integrates the geodesic equation by RK4 through
``GLQuotient.geodesic_exact`` (the point moves, so the Grams are recomputed along the path); the
diagonal block uses the closed forms of :class:`~quotientsharp.DiagonalQuotient`; the adaptive
block's exact geodesic is ``w * exp(xi / w)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch

from .. import _tuples as T
from ..diagonal import DiagonalQuotient
from ..gl import GLQuotient
from ..linalg import solve_sylvester_eig

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

    def validate(self, radius: float, order: int | str) -> None: ...
    def norm_sq(self, xi: Tensors) -> torch.Tensor: ...
    def horizontal(self, xi: Tensors) -> Tensors: ...
    def raise_gradient(self, egrad: Tensors) -> Tensors: ...
    def christoffel(self, xi: Tensors) -> Tensors: ...
    def point(self, xi: Tensors, order: int | str) -> Tensors: ...
    def isotropic(self, generator: torch.Generator | None) -> Tensors: ...


# ---------------------------------------------------------------------------- GL(h) buckets
def _christoffel_with(G: torch.Tensor, H: torch.Tensor, xi_g: torch.Tensor, xi_h: torch.Tensor,
                      inv_g: torch.Tensor, inv_h: torch.Tensor, metric: str) -> Tensors:
    """SPEC section 3 contractions ``Gamma(xi, xi)`` given ``S_G^{-1}`` and ``S_H^{-1}``."""
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


class GLBlock:
    """One bucket of ``GL(h)`` pairs at a fixed base point, every factorisation done once.

    The operations are those of :class:`~quotientsharp.gl.GLQuotient` (same metric, same
    ``eps`` convention, same exact horizontal projection; the tests compare them), rearranged so
    that everything depending only on the base point is computed on construction: the Gram
    matrices and Cholesky factors (from ``GLQuotient.gram_cache``, which also rejects
    rank-deficient factors), ``S_G^{-1}``, ``S_H^{-1}``, and the eigenbases and eigenvalue sums
    of the Sylvester equation of the horizontal projection. A step then costs a few batched
    matrix products per bucket and no factorisation.

    Parameters
    ----------
    G, H
        Base point, ``shape=[P, n, h]`` and ``shape=[P, m, h]``.
    metric
        ``"inv"``, ``"mix"`` or ``"euclidean"`` (SPEC section 3).
    eps
        Relaxation ``G^T G -> G^T G + eps I`` (and for ``H``); the euclidean metric ignores it.
    exact_steps
        RK4 steps of the exact geodesic (``GLQuotient.geodesic_exact``).
    pair_names
        Optional readable name per pair (for error messages), ``len == P``.
    """

    def __init__(self, G: torch.Tensor, H: torch.Tensor, metric: str = "inv", eps: float = 0.0,
                 exact_steps: int = 16, pair_names: Sequence[str] | None = None,
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
        self.pair_names = list(pair_names) if pair_names is not None else None
        self.quotient = GLQuotient(metric=metric, eps=self.eps)
        try:
            grams = self.quotient.gram_cache(self.base)
        except ValueError as err:
            raise ValueError(f"GL bucket {self.name!r} of shape n={G.shape[1]}, m={H.shape[1]}, "
                             f"h={G.shape[2]}{self._culprits()}: {err}") from err
        self.grams = grams
        if metric == "euclidean":
            values_g, vectors_g = torch.linalg.eigh(grams.gram_g)
            values_h, vectors_h = torch.linalg.eigh(grams.gram_h)
            self._bases = (vectors_g, vectors_h)
            self._denominators = values_g.unsqueeze(-1) + values_h.unsqueeze(-2)
            return
        self.inv_g = torch.cholesky_inverse(grams.cholesky_g)      # S_G^{-1}, [P, h, h]
        self.inv_h = torch.cholesky_inverse(grams.cholesky_h)
        factor_g, factor_h = grams.cholesky_g, grams.cholesky_h     # S_G = E E^T, S_H = F F^T
        eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
        inv_factor_g = torch.linalg.solve_triangular(factor_g, eye, upper=False)   # E^{-1}
        inv_factor_h = torch.linalg.solve_triangular(factor_h, eye, upper=False)   # F^{-1}
        if metric == "inv":
            # (S_H K_G) L + L (K_H S_G) = u_H^T H S_G - S_H G^T u_G; with L = F Y E^T it is
            # the SPD Sylvester equation (B_G^T B_G) Y + Y (B_H^T B_H) = F^{-1} C E^{-T},
            # B_G = G F and B_H = H E invariant under the action (GLQuotient's formulation)
            self._b_g, self._b_h = G @ factor_h, H @ factor_g
            values_p, vectors_p = torch.linalg.eigh(self._b_g.mT @ self._b_g)
            values_q, vectors_q = torch.linalg.eigh(self._b_h.mT @ self._b_h)
            self._bases = (vectors_p, vectors_q)
            self._denominators = values_p.unsqueeze(-1) + values_q.unsqueeze(-2)
            self._scale_g, self._scale_h = inv_factor_g.mT, inv_factor_h.mT   # E^{-T}, F^{-T}
            self._factor_g_t, self._factor_h_t = factor_g.mT, factor_h.mT
            self._iso_g, self._iso_h = factor_g.mT, factor_h.mT
        else:
            # mix: the Gram operator is diagonal in the eigenbases of K_G and K_H
            values_g, vectors_g = torch.linalg.eigh(grams.gram_g)
            values_h, vectors_h = torch.linalg.eigh(grams.gram_h)
            values_g, values_h = values_g.clamp_min(0), values_h.clamp_min(0)
            col, row = values_g.unsqueeze(-1), values_h.unsqueeze(-2)
            self._bases = (vectors_g, vectors_h)
            self._denominators = 2 * col * row + self.eps * (col + row)
            self._iso_g, self._iso_h = inv_factor_h, inv_factor_g

    def _culprits(self) -> str:
        """`` (pairs ...)``: the pairs whose Gram matrices are singular to rounding."""
        if self.pair_names is None:
            return ""
        bad: set[int] = set()
        for factor in self.base:
            values = torch.linalg.eigvalsh(factor.mT @ factor)
            limit = 8 * factor.shape[-1] * torch.finfo(values.dtype).eps
            singular = values[..., 0] <= limit * values[..., -1].clamp_min(0)
            bad.update(singular.nonzero().flatten().tolist())
        names = [self.pair_names[i] for i in sorted(bad)]
        return f" (pairs {names[:5]})" if names else ""

    def validate(self, radius: float, order: int | str) -> None:
        """Singular Grams were rejected on construction (``GLQuotient.gram_cache``)."""

    # ------------------------------------------------------------------ metric
    def norm_sq(self, xi: Tensors) -> torch.Tensor:
        xi_g, xi_h = xi
        if self.metric == "inv":
            return ((xi_g @ self.inv_g) * xi_g).sum() + ((xi_h @ self.inv_h) * xi_h).sum()
        if self.metric == "mix":
            return (((xi_g @ self.grams.relaxed_h) * xi_g).sum()
                    + ((xi_h @ self.grams.relaxed_g) * xi_h).sum())
        return xi_g.square().sum() + xi_h.square().sum()

    def horizontal(self, xi: Tensors) -> Tensors:
        G, H = self.base
        xi_g, xi_h = xi
        if self.metric == "inv":
            rhs = (xi_h @ self._scale_h).mT @ self._b_h - self._b_g.mT @ (xi_g @ self._scale_g)
            y = solve_sylvester_eig(*self._bases, self._denominators, rhs)
            return (xi_g + (self._b_g @ y) @ self._factor_g_t,
                    xi_h - (self._b_h @ y.mT) @ self._factor_h_t)
        g_u, u_h = G.mT @ xi_g, xi_h.mT @ H
        if self.metric == "mix":
            moment = self.grams.relaxed_g @ u_h - g_u @ self.grams.relaxed_h
        else:
            moment = u_h - g_u
        lag = solve_sylvester_eig(*self._bases, self._denominators, moment)
        return xi_g + G @ lag, xi_h - H @ lag.mT

    def raise_gradient(self, egrad: Tensors) -> Tensors:
        e_g, e_h = egrad
        if self.metric == "inv":
            return e_g @ self.grams.relaxed_g, e_h @ self.grams.relaxed_h
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
        return tuple(self.quotient.geodesic_exact(self.base, tuple(xi), 1.0,
                                                  steps=self.exact_steps))

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

    def validate(self, radius: float, order: int | str) -> None:
        """Reject degenerate coordinates, and exact mix geodesics that leave the manifold.

        A horizontal ``xi = (b u, b v)`` has ``|xi|_mix^2 = 2 |u v b|^2``, so the ball allows
        ``|b_i|`` up to ``rho / (sqrt(2) |u_i v_i|)``; the exact mix geodesic
        ``sqrt(1 + 2 b t)`` reaches ``u v = 0`` before ``t = 1`` once ``b_i <= -1/2``.
        """
        u, v = self.base
        if self.metric == "mix" and order == "exact":
            limit = float((u * v).abs().min()) / math.sqrt(2.0)
            if radius >= limit:
                raise ValueError(f"order='exact' with the mix metric: rho={radius:g} lets the "
                                 "exact geodesic of a diagonal coordinate leave the manifold "
                                 f"(reach u * v = 0) before t = 1; use rho < {limit:.6g} "
                                 "(min |u v| / sqrt(2)) or order=2")
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
        ``"adaptive"`` (``c = |w|``), ``"euclidean"`` (``c = 1``) or ``c`` itself, one tensor
        per parameter of the same shape. Coordinates with ``c = 0`` stay at exactly zero
        displacement.
    path
        ``"line"``: ``w + xi`` for every order (the paper's default); ``"geodesic"``: the
        metric's own geodesic, ``w + xi + xi^2 / (2 w)`` at order 2 and ``w * exp(xi / w)``
        exactly (only for the adaptive scale ``c = |w|``).

    Notes
    -----
    The block holds one parameter-sized cache, ``1 / c`` (0 where ``c = 0``), for the norm;
    ``c^2`` for the gradient raising is formed on the fly (``w^2`` for the adaptive scale,
    nothing for the Euclidean one), and ``1 / w`` only for the geodesic path. This block spans
    nearly every parameter of a network, so each cache it keeps costs the size of the model.
    """

    SCALES = ("adaptive", "euclidean")

    def __init__(self, base: Sequence[torch.Tensor], scale: str | Sequence[torch.Tensor],
                 path: str = "line", name: str = "other") -> None:
        if path not in OTHER_PATHS:
            raise ValueError(f"the other-parameter path must be one of {OTHER_PATHS}, got "
                             f"{path!r}")
        self.name = name
        self.base = tuple(base)
        self.path = path
        if isinstance(scale, str):
            if scale not in self.SCALES:
                raise ValueError(f"scale must be one of {self.SCALES} or tensors, got {scale!r}")
            self.scale_kind = scale
            self._given_scale: Tensors = ()
        else:
            self.scale_kind = "given"
            self._given_scale = tuple(scale)
            if len(self._given_scale) != len(self.base) or any(
                    c.shape != w.shape for c, w in zip(self._given_scale, self.base, strict=True)):
                raise ValueError("scale needs one tensor per parameter, of the parameter's "
                                 "shape")
        # 1/c where c > 0 and 0 where c = 0: the fixed coordinates contribute nothing, never 0/0
        self._inv_scale: Tensors = () if self.scale_kind == "euclidean" else tuple(
            _safe_reciprocal(c) for c in self.scale)
        self._inv_base_cache: Tensors | None = None
        self._dtype = self.base[0].dtype if self.base else torch.get_default_dtype()
        self._device = self.base[0].device if self.base else torch.device("cpu")

    @property
    def scale(self) -> Tensors:
        """``c`` per parameter (formed on demand for the adaptive and Euclidean scales)."""
        if self.scale_kind == "adaptive":
            return tuple(w.abs() for w in self.base)
        if self.scale_kind == "euclidean":
            return tuple(torch.ones_like(w) for w in self.base)
        return self._given_scale

    @property
    def _inv_base(self) -> Tensors:
        if self._inv_base_cache is None:
            self._inv_base_cache = tuple(_safe_reciprocal(w) for w in self.base)
        return self._inv_base_cache

    def validate(self, radius: float, order: int | str) -> None:
        """Nothing can be singular: zero scales are fixed coordinates."""

    def norm_sq(self, xi: Tensors) -> torch.Tensor:
        if not xi:
            return torch.zeros((), dtype=self._dtype, device=self._device)
        if self.scale_kind == "euclidean":
            return T.fused_square_norms(xi)
        return T.fused_square_norms(T.fused_mul(xi, self._inv_scale))

    def horizontal(self, xi: Tensors) -> Tensors:
        return tuple(xi)

    def raise_gradient(self, egrad: Tensors) -> Tensors:
        if self.scale_kind == "euclidean" or not egrad:
            return tuple(egrad)
        scale = self.base if self.scale_kind == "adaptive" else self._given_scale
        # e * c^2 with c^2 = c * c (what square computes): fused, formed per call, no cache
        raised = T.fused_mul(scale, scale)
        torch._foreach_mul_(list(raised), list(egrad))
        return raised

    def christoffel(self, xi: Tensors) -> Tensors:
        if self.path == "line":
            return tuple(torch.zeros_like(d) for d in xi)
        return tuple(-d.square() * inv_w for d, inv_w in zip(xi, self._inv_base, strict=True))

    def point(self, xi: Tensors, order: int | str) -> Tensors:
        if self.path == "line" or order == 1:
            return T.fused_add(self.base, xi)
        if order == 2:
            return tuple(w + d + 0.5 * d.square() * inv_w
                         for w, d, inv_w in zip(self.base, xi, self._inv_base, strict=True))
        return tuple(w * torch.exp(d * inv_w)
                     for w, d, inv_w in zip(self.base, xi, self._inv_base, strict=True))

    def isotropic(self, generator: torch.Generator | None) -> Tensors:
        return tuple(c * torch.randn(c.shape, generator=generator, dtype=c.dtype, device=c.device)
                     for c in self.scale)


def _safe_reciprocal(c: torch.Tensor) -> torch.Tensor:
    """``1 / c`` where ``c != 0`` and ``0`` where ``c = 0``."""
    return torch.where(c == 0, torch.zeros_like(c), 1.0 / c.masked_fill(c == 0, 1.0))


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
        """Up-front checks on values (host syncs): singular points, paths leaving the manifold."""
        for block in self.blocks:
            block.validate(self.radius, self.order)

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
        return T.fused_mul(xi, factor)

    # ------------------------------------------------------------------ solver interface
    def project(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``P_S``: horizontal projection, then radial rescale into ``||xi||_g <= rho``."""
        return self.clip(self.horizontal(xi))

    def clip(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``P_S`` of a vector that is horizontal already: the radial rescale alone."""
        return self._rescale(tuple(xi), self.norm(xi), self.radius)

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        """The Riemannian gradient normalised by its g-norm (zero stays zero)."""
        rgrad = self.riemannian_gradient(egrad)
        norm = self.norm(rgrad).clamp_min(torch.finfo(self.dtype).tiny)
        return T.fused_div(rgrad, norm)

    def random_start(self, generator: torch.Generator | None) -> Tensors:
        """Horizontal projection of a metric-isotropic Gaussian, radius ``rho * U(0, 1)``."""
        direction = self.horizontal(tuple(t for block in self.blocks
                                          for t in block.isotropic(generator)))
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

    def clip(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """There is no quotient here: the clamp of :meth:`project`."""
        return self.project(xi)

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        return tuple(c * torch.sign(e) for c, e in zip(self.scale, egrad, strict=True))

    def random_start(self, generator: torch.Generator | None) -> Tensors:
        return tuple(b * (2 * torch.rand(b.shape, generator=generator, dtype=b.dtype,
                                         device=b.device) - 1) for b in self._bounds)

    def block_norms(self, xi: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        largest = torch.stack([(d * inv).abs().amax() if d.numel() else d.new_zeros(())
                               for d, inv in zip(xi, self._inv_scale, strict=True)]).amax()
        return {"total": largest}
