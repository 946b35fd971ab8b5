"""The geometry of a quotient at one frozen base point: what an optimiser at ``x`` needs.

What depends on ``x`` alone (Gram matrices, factorisations, ``1 / |w|``) is computed once, on
first use, and kept. Tangent arguments are not validated here (no host synchronisation in a hot
loop): the quotient validates before delegating.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core import reference
from quotientsharp.core.scalars import check_order
from quotientsharp.core.validation import check_time

Tensors = tuple[torch.Tensor, ...]


class Quotient(reference.Quotient, Protocol):
    """What a frozen point calls of its quotient (a protocol: the quotient module imports this)."""

    def horizontal_projection(self, x: Tensors, u: Tensors) -> Tensors: ...
    def vertical_projection(self, x: Tensors, u: Tensors) -> Tensors: ...
    def horizontality_error(self, x: Tensors, u: Tensors) -> torch.Tensor: ...
    def raise_index(self, x: Tensors, egrad: Tensors) -> Tensors: ...
    def euclidean_to_riemannian_gradient(self, x: Tensors, egrad: Tensors) -> Tensors: ...
    def christoffel(self, x: Tensors, u: Tensors, v: Tensors | None = None) -> Tensors: ...
    def geodesic_exact(self, x: Tensors, u: Tensors, t: float = 1.0, steps: int = 64
                       ) -> Tensors: ...
    def frozen_point(self, x: Tensors) -> FrozenPoint: ...
    def at(self, x: Tensors) -> FrozenPoint: ...


class FrozenPoint:
    """A quotient's geometry at the base point ``x``, batched over its leading dimensions.

    ``quotient.at(x)`` returns one. This class is the generic default: every operation calls
    the quotient's own method (a closed form, or the numerical default of
    :mod:`quotientsharp.core.reference`); the built-in quotients return subclasses that hold
    their closed forms, and their quotient-level methods delegate to them.

    Parameters
    ----------
    quotient
        The quotient.
    x
        The base point, already validated by the quotient (tuple of tensors,
        ``shape=[*batch, ...]`` each).
    """

    #: Whether :meth:`riemannian_gradient` returns tensors made by the call (or the gradient's
    #: own), never a tensor the point keeps: the caller may then overwrite them in place. The
    #: built-in closed forms say so; a user's frozen point is not assumed to.
    new_gradients: bool = False

    def __init__(self, quotient: Quotient, x: Sequence[torch.Tensor]) -> None:
        self.quotient = quotient
        self.x: Tensors = tuple(x)

    @property
    def point_ndims(self) -> tuple[int, ...]:
        return tuple(self.quotient.point_ndims)

    @property
    def batch_shape(self) -> torch.Size:
        """Leading (batch) shape of the base point."""
        return T.batch_shape(self.x, self.point_ndims)

    def factorise(self) -> None:
        """Compute now the factorisations that the operations at this point share.

        They are otherwise computed at first use. Some of them wait for the device: an
        eigendecomposition or a checked Cholesky factorisation on CUDA copies its convergence
        flag to the host. Calling this before a loop of operations (the sharpness ascent) keeps
        those waits out of the loop. Values do not change. The default has nothing to compute.
        """

    # ------------------------------------------------------------------ metric
    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        """``<u, v>_x``, ``shape=[*batch]``."""
        return self.quotient.inner(self.x, u, v)

    def squared_norm(self, u: Tensors) -> torch.Tensor:
        """``||u||_x^2``, ``shape=[*batch]``."""
        return self.inner(u, u).clamp_min(0)

    def norm(self, u: Tensors) -> torch.Tensor:
        """``||u||_x``, ``shape=[*batch]``."""
        return self.squared_norm(u).sqrt()

    # ------------------------------------------------------------------ fiber-bundle split
    def horizontal_projection(self, u: Tensors) -> Tensors:
        """Metric-orthogonal projection onto the horizontal space (orthogonal to the orbit)."""
        return self.quotient.horizontal_projection(self.x, u)

    def vertical_projection(self, u: Tensors) -> Tensors:
        """Metric-orthogonal projection onto the vertical space (tangent to the orbit)."""
        return self.quotient.vertical_projection(self.x, u)

    def horizontality_error(self, u: Tensors) -> torch.Tensor:
        """Largest normalised metric product of ``u`` with a vertical vector, ``shape=[*batch]``."""
        return self.quotient.horizontality_error(self.x, u)

    # ------------------------------------------------------------------ gradients
    def raise_index(self, egrad: Tensors) -> Tensors:
        """The vector ``g(x)^{-1} egrad`` (not projected)."""
        return self.quotient.raise_index(self.x, egrad)

    def riemannian_gradient(self, egrad: Tensors) -> Tensors:
        """The metric-raised Euclidean gradient, projected onto the horizontal space."""
        return self.quotient.euclidean_to_riemannian_gradient(self.x, egrad)

    def riemannian_gradient_and_squared_norm(self, egrad: Tensors
                                             ) -> tuple[Tensors, torch.Tensor]:
        """The Riemannian gradient and its squared norm, ``shape=[*batch]``.

        The ascent needs both at every step (its direction is the gradient over its norm). The
        default is :meth:`riemannian_gradient`, then :meth:`squared_norm`; a point whose metric
        gives the norm on the way to the gradient overrides it (same values, to rounding).
        """
        gradient = self.riemannian_gradient(egrad)
        return gradient, self.squared_norm(gradient)

    # ------------------------------------------------------------------ connection
    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        """Christoffel contraction ``Gamma_x(u, v)`` (``v`` defaults to ``u``)."""
        return self.quotient.christoffel(self.x, u, v)

    def geodesic(self, u: Tensors, t: float = 1.0, order: int | str = 2,
                 steps: int = 64) -> Tensors:
        """Point at time ``t`` on the geodesic from ``x`` with initial velocity ``u``.

        ``order=1``: ``x + t u``; ``2``: ``x + t u - t^2/2 Gamma(u, u)``; ``"exact"``:
        :meth:`geodesic_exact` (``steps`` RK4 steps where there is no closed form).
        """
        order = check_order(order)
        t = check_time(t)
        if order == 1:
            return T.axpy(t, u, self.x, self.point_ndims)
        if order == 2:
            gamma = self.christoffel(u)
            # x + t u - (t^2 / 2) Gamma, with the subtraction written into the new sum: one
            # tensor allocated per component instead of four (t u is skipped at t = 1, where
            # it is u exactly; at t = 1 the scaled subtraction is bit for bit the same)
            half = 0.5 * t * t
            return tuple((a + b if t == 1.0 else a + t * b).sub_(c, alpha=half)
                         for a, b, c in zip(self.x, u, gamma, strict=True))
        return self.geodesic_exact(u, t, steps)

    def geodesic_exact(self, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        """The exact geodesic (the point moves, so this integrates with the quotient's Gamma)."""
        return self.quotient.geodesic_exact(self.x, u, t, steps=steps)

    def check_ball(self, radius: float, order: int | str) -> None:
        """Raise if a path of this order with ``||u|| <= radius`` may leave the manifold.

        Called once before an ascent (it may synchronise with the host). Default: nothing to
        check.
        """

    # ------------------------------------------------------------------ coordinate subspaces
    def on_rows(self, rows: Mapping[int, torch.Tensor]) -> FrozenPoint:
        """The geometry on tangent vectors that vanish outside rows ``rows[i]`` (of the first
        point dimension) of tensor ``i``, with those tensors cut to their rows.

        Exact only where the metric is diagonal, so that such vectors form a subspace that
        every operation keeps (the raised gradient of a gradient that vanishes off the rows
        vanishes there too). A geometry without that property raises.
        """
        raise NotImplementedError(f"{type(self).__name__} has no coordinate-subspace form "
                                  "(on_rows): its metric is not diagonal")

    # ------------------------------------------------------------------ sampling
    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        """A Gaussian tangent vector with covariance ``g(x)^{-1}`` (identity in the metric).

        Not projected: apply :meth:`horizontal_projection` for a horizontal one. Generic
        default: the Cholesky factor ``L`` of the dense metric, ``u = L^{-T} z``.
        """
        x = self.x
        gram = reference.metric_matrix(self.quotient, x)
        chol = torch.linalg.cholesky(gram)
        noise = torch.randn(*self.batch_shape, gram.shape[-1], 1, generator=generator,
                            dtype=x[0].dtype, device=x[0].device)
        flat = torch.linalg.solve_triangular(chol.mT, noise, upper=True).squeeze(-1)
        return T.unflatten(flat, x, self.point_ndims)      # flat's batch, x's trailing shapes


class ClosedFormPoint(FrozenPoint):
    """Base of the frozen points of quotients that delegate their methods to the frozen point.

    Such a quotient's methods call this object, so its defaults must not call them back: an
    operation a subclass does not override falls back to :mod:`quotientsharp.core.reference`
    directly, and the exact geodesic integrates the geodesic equation by RK4 with the
    subclass's own Christoffel contraction at the moving point.
    """

    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define inner(u, v)")

    def horizontal_projection(self, u: Tensors) -> Tensors:
        return reference.horizontal_projection(self.quotient, self.x, u)

    def vertical_projection(self, u: Tensors) -> Tensors:
        return reference.vertical_projection(self.quotient, self.x, u)

    def horizontality_error(self, u: Tensors) -> torch.Tensor:
        return reference.horizontality_error(self.quotient, self.x, u)

    def raise_index(self, egrad: Tensors) -> Tensors:
        return reference.raise_index(self.quotient, self.x, egrad)

    def riemannian_gradient(self, egrad: Tensors) -> Tensors:
        return self.horizontal_projection(self.raise_index(egrad))

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        return reference.christoffel(self.quotient, self.x, u, v)

    def geodesic_exact(self, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        def gamma(p: Tensors, w: Tensors) -> Tensors:
            try:
                return self.quotient.frozen_point(p).christoffel(w)
            except ValueError as err:
                raise ValueError(f"the exact geodesic left the regular points of the manifold "
                                 f"while integrating ({steps} RK4 steps to t={t}): shorten the "
                                 f"velocity or t, or use more steps. At the moving point: {err}"
                                 ) from err

        return reference.geodesic_ode(self.x, u, t, self.point_ndims, gamma, steps)


class EuclideanMetricPoint(ClosedFormPoint):
    """The formulas of the Euclidean metric ``<u, v> = sum u v``, for any quotient.

    Flat: ``Gamma = 0`` and geodesics are straight lines; the index raising is the identity
    and an isotropic draw is standard normal. A quotient's Euclidean frozen point adds only its
    projections (which depend on the group).
    """

    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        terms = [T.sum_trailing(a * b, k) for a, b, k in zip(u, v, self.point_ndims, strict=True)]
        return sum(terms[1:], terms[0])

    def raise_index(self, egrad: Tensors) -> Tensors:
        return tuple(egrad)

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        v = u if v is None else v
        return tuple(torch.zeros(torch.broadcast_shapes(a.shape, b.shape, c.shape),
                                 dtype=a.dtype, device=a.device)
                     for a, b, c in zip(self.x, u, v, strict=True))

    def geodesic_exact(self, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        return tuple(a + t * b for a, b in zip(self.x, u, strict=True))

    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        return tuple(torch.randn(c.shape, generator=generator, dtype=c.dtype, device=c.device)
                     for c in self.x)
