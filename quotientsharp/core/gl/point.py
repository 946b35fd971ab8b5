"""What every GL(h) metric shares at a frozen point ``(G, H)``, and the base of the metric objects.

:class:`GLPoint` holds the Gram matrices ``K_G = G^T G``, ``K_H = H^T H``, their relaxations
``S = K + eps I`` and the Cholesky factors of the relaxations, computed once (and checked for
rank there, which is the point's validation). Everything else is computed on first use and
kept: ``S^{-1}``, inverse Cholesky factors, the eigenbases of the Sylvester equation of the
horizontal projection. The metric subclasses (:mod:`.inv`, :mod:`.mix`, :mod:`.euclidean`) hold
the formulas.

The vertical space is spanned by ``V(X) = (-G X, H X^T)``, ``X`` in ``gl(h)``. Writing
``<V(X), u> = <X, M(u)>_F`` (the moment ``M`` of ``u``), ``u`` is horizontal iff ``M(u) = 0``,
and the vertical part of ``u`` is ``V(L)`` with ``Gram(L) = M(u)``, where
``Gram(L) = M(V(L))``. Each metric supplies ``M``, the diagonal of ``Gram`` (for the
horizontality measure) and a solver of ``Gram(L) = M(u)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any, ClassVar, Protocol

import torch

from quotientsharp.core import frozen
from quotientsharp.core._tuples import under_function_transform
from quotientsharp.core.frozen import ClosedFormPoint, check_order
from quotientsharp.core.metric import Metric
from quotientsharp.core.reference import largest_normalised_product
from quotientsharp.core.validation import check_time, value_checks_enabled

Tensors = tuple[torch.Tensor, ...]

#: Dtypes whose points get their h x h algebra in float64.
LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16)


def vertical_vector(G: torch.Tensor, H: torch.Tensor, X: torch.Tensor) -> Tensors:
    """``V(X) = (-G X, H X^T)``: the orbit velocity of ``X`` in ``gl(h)``."""
    # the sign on the h x h side: negating G would cost a pass over the n x h factor
    return G @ -X, H @ X.mT


class GLQuotientMembers(frozen.Quotient, Protocol):
    """What a GL(h) point reads of its :class:`~quotientsharp.core.gl.GLQuotient` (a protocol:
    that class's module imports this one)."""

    @property
    def eps(self) -> float: ...
    def rank_error(self, which: str, name: str, rows: int, h: int,
                   dtype: torch.dtype) -> ValueError: ...


def cholesky_or_raise(quotient: GLQuotientMembers, G: torch.Tensor, H: torch.Tensor,
                      relaxed: tuple[torch.Tensor, torch.Tensor], name: str) -> Tensors:
    """Lower Cholesky factors of ``(S_G, S_H)``; a clear error where one is singular (the test
    on values, a host sync, only while value checks are on)."""
    h = G.shape[-1]
    if quotient.eps == 0.0:
        for which, rows in (("g", G.shape[-2]), ("h", H.shape[-2])):
            if rows < h:
                raise quotient.rank_error(which, name, rows, h, G.dtype)
    factors, infos = zip(*(torch.linalg.cholesky_ex(s) for s in relaxed), strict=True)
    if value_checks_enabled() and not torch.compiler.is_compiling():
        # a Cholesky pivot p_k satisfies p_k^2 >= lambda_min; a pivot at rounding level of
        # the largest diagonal entry means the Gram matrix is singular to working precision
        tolerance = 8 * h * torch.finfo(G.dtype).eps
        flags = []
        for chol, info, s in zip(factors, infos, relaxed, strict=True):
            pivots = chol.diagonal(dim1=-2, dim2=-1).square().amin(-1)
            scale = s.diagonal(dim1=-2, dim2=-1).amax(-1)
            flags.append(((info != 0) | ~(pivots > tolerance * scale)).any())
        bad = torch.stack(flags).tolist()
        for which, rows, is_bad in (("g", G.shape[-2], bad[0]), ("h", H.shape[-2], bad[1])):
            if is_bad:
                raise quotient.rank_error(which, name, rows, h, G.dtype)
    return tuple(factors)


class OrderTwoGLPath(torch.autograd.Function):
    """The order-2 point ``F + u_F (t I - a A_F) + F (a B_F)``, ``a = t^2 / 2``, of a GL(h) pair
    (:meth:`GLPoint.christoffel_coefficients`), with its backward written out the same way: about
    eight passes over ``n x h`` tensors fewer than autograd on the elementary form. Inputs: ``t``,
    the frozen point, ``u_G``, ``u_H``."""

    @staticmethod
    def forward(ctx: Any, t: float, point: GLPoint, u_g: torch.Tensor, u_h: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        u = (u_g, u_h)
        reductions = point.christoffel_reductions(u)
        coefficients = point.christoffel_coefficients(reductions)
        half = 0.5 * t * t
        eye = torch.eye(u_g.shape[-1], dtype=u_g.dtype, device=u_g.device)
        velocity = [t * eye - half * a for a, _ in coefficients]   # t I - a A_F
        outputs = []
        for factor, tangent, scale, (_, b) in zip(point.x, u, velocity, coefficients,
                                                  strict=True):
            # F + u_F (t I - a A_F) + F (a B_F): the base carried exactly, one new tensor
            moved = torch.matmul(tangent, scale).add_(factor)
            outputs.append(moved.add_(factor @ (half * b)))
        ctx.t, ctx.point = t, point
        ctx.save_for_backward(u_g, u_h, *velocity, *(r for pair in reductions for r in pair))
        return outputs[0], outputs[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_g: torch.Tensor, grad_h: torch.Tensor
                 ) -> tuple[None, None, torch.Tensor, torch.Tensor]:
        point: GLPoint = ctx.point
        u_g, u_h, scale_g, scale_h, *flat = ctx.saved_tensors
        half = 0.5 * ctx.t * ctx.t
        grads, u = (grad_g, grad_h), (u_g, u_h)
        # d/dA_F = -a u_F^T g_F, d/dB_F = a F^T g_F: h x h reductions of the upstream gradient
        adjoint_coefficients = [((-half) * (tangent.mT @ g), half * (factor.mT @ g))
                                for factor, tangent, g in zip(point.x, u, grads, strict=True)]
        leaves = [r.detach().requires_grad_(True) for r in flat]
        with torch.enable_grad():
            coefficients = point.christoffel_coefficients([(leaves[0], leaves[1]),
                                                           (leaves[2], leaves[3])])
            adjoints = torch.autograd.grad([c for pair in coefficients for c in pair], leaves,
                                           [c for pair in adjoint_coefficients for c in pair],
                                           allow_unused=True)
        result = []
        for i, (factor, tangent, g, scale) in enumerate(zip(point.x, u, grads,
                                                             (scale_g, scale_h), strict=True)):
            out = g @ scale.mT
            moved_adjoint, square_adjoint = adjoints[2 * i], adjoints[2 * i + 1]
            if moved_adjoint is not None:        # D(u) = u^T F + F^T u: F (X + X^T)
                out.add_(factor @ (moved_adjoint + moved_adjoint.mT))
            if square_adjoint is not None:       # u^T u: u (Y + Y^T)
                out.add_(tangent @ (square_adjoint + square_adjoint.mT))
            result.append(out)
        return None, None, result[0], result[1]


class GLPoint(ClosedFormPoint):
    """A GL(h) factor pair ``(G, H)``, ``shape=[..., n, h]`` and ``[..., m, h]``, frozen.

    Parameters
    ----------
    quotient
        The :class:`~quotientsharp.core.gl.GLQuotient` (its metric object and ``eps``).
    x
        ``(G, H)``, validated for layout by the quotient.
    name
        Name of the point in error messages.
    """

    new_gradients = True

    #: Whether the metric needs the Cholesky factors of ``S_G`` and ``S_H``.
    needs_factors: ClassVar[bool] = True

    def __init__(self, quotient: GLQuotientMembers, x: Tensors, name: str = "x") -> None:
        super().__init__(quotient, x)
        self.eps = quotient.eps
        G, H = self.x
        self.dtype = G.dtype
        # The h x h algebra runs in float64 for float32 and half-precision points: a Gram
        # matrix squares the condition of its factor, and a group element of condition 1e3
        # already makes K_G singular to float32 working precision. It is cheap next to a
        # forward pass; results are cast back to the point's dtype where they meet tangents.
        self.work_dtype = torch.float64 if G.dtype in LOW_PRECISION else G.dtype
        G_work, H_work = G.to(self.work_dtype), H.to(self.work_dtype)
        self._work_x = (G_work, H_work)
        gram_g, gram_h = G_work.mT @ G_work, H_work.mT @ H_work
        if self.eps == 0.0:
            relaxed_g, relaxed_h = gram_g, gram_h
        else:
            eye = torch.eye(G.shape[-1], dtype=self.work_dtype, device=G.device)
            relaxed_g, relaxed_h = gram_g + self.eps * eye, gram_h + self.eps * eye
        self._work_grams = (gram_g, gram_h)
        self._work_relaxed = (relaxed_g, relaxed_h)
        self.gram_g, self.gram_h = self._cast(gram_g), self._cast(gram_h)
        self.relaxed_g, self.relaxed_h = self._cast(relaxed_g), self._cast(relaxed_h)
        self._work_cholesky: tuple[torch.Tensor, ...] = ()
        self._cholesky: tuple[torch.Tensor, ...] = ()
        if self.needs_factors:
            self._work_cholesky = cholesky_or_raise(quotient, G_work, H_work,
                                                    (relaxed_g, relaxed_h), name)
            self._cholesky = tuple(self._cast(c) for c in self._work_cholesky)

    @property
    def cholesky_g(self) -> torch.Tensor:
        """Lower Cholesky factor ``E`` of ``S_G = E E^T``, ``shape=[..., h, h]``, in the point's
        dtype (only for a metric with :attr:`needs_factors`)."""
        return self._cholesky_factor(0)

    @property
    def cholesky_h(self) -> torch.Tensor:
        """Lower Cholesky factor ``F`` of ``S_H = F F^T``, ``shape=[..., h, h]``."""
        return self._cholesky_factor(1)

    def _cholesky_factor(self, index: int) -> torch.Tensor:
        if not self._cholesky:
            # a metric without a Gram matrix in its formulas (euclidean) never factorises
            raise AttributeError(f"{type(self).__name__} has no Cholesky factors "
                                 "(needs_factors is False)")
        return self._cholesky[index]

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        """An h x h result of the float64 algebra in the point's dtype."""
        return t.to(self.dtype)

    # ------------------------------------------------------------------ random draws
    def mixed_noise(self, rows: int, factor: torch.Tensor,
                    generator: torch.Generator | None) -> torch.Tensor:
        """``W F + sqrt(eps) Z`` for ``F = factor`` (``shape=[..., m, h]``), with ``W``
        (``shape=[..., rows, m]``) and ``Z`` (``shape=[..., rows, h]``) standard Gaussian.

        Its rows have covariance ``F^T F + eps I``. The noise ``W`` mixes the rows of ``F``
        and never touches its columns, where the group acts: under ``F -> F A`` the draw
        becomes ``W F A`` from the same generator state (at ``eps = 0``), which makes the
        metric-isotropic draws of the metrics equivariant. ``W`` is drawn a few heads at a
        time, so its memory stays below about 16M entries.
        """
        m, h = factor.shape[-2:]
        flat = factor.reshape(-1, m, h)
        chunk = max(1, (1 << 24) // max(1, rows * m))
        parts = [torch.randn(len(piece), rows, m, generator=generator, dtype=factor.dtype,
                             device=factor.device) @ piece for piece in flat.split(chunk)]
        mixed = torch.cat(parts).reshape(*factor.shape[:-2], rows, h)
        if self.eps != 0.0:
            mixed = mixed + self.eps ** 0.5 * torch.randn(mixed.shape, generator=generator,
                                                          dtype=mixed.dtype,
                                                          device=mixed.device)
        return mixed

    # ------------------------------------------------------------------ cached factors
    # S^{-1} by a Cholesky solve against a batch of identities rather than
    # torch.cholesky_inverse or a broadcast identity: in torch 2.13 the forward-mode derivative
    # (jvp) of both is wrong, and the autograd references differentiate the metric by jvp
    @staticmethod
    def _inverse(cholesky: torch.Tensor) -> torch.Tensor:
        return torch.cholesky_solve(_identities(cholesky), cholesky)

    @staticmethod
    def _inverse_factor(cholesky: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve_triangular(cholesky, _identities(cholesky), upper=False)

    @cached_property
    def work_inverses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``S_G^{-1}`` and ``S_H^{-1}`` in the working dtype."""
        return self._inverse(self._work_cholesky[0]), self._inverse(self._work_cholesky[1])

    @cached_property
    def inverse_g(self) -> torch.Tensor:
        """``S_G^{-1}``, ``shape=[..., h, h]``."""
        return self._cast(self._inverse(self._work_cholesky[0]))

    @cached_property
    def inverse_h(self) -> torch.Tensor:
        """``S_H^{-1}``."""
        return self._cast(self._inverse(self._work_cholesky[1]))

    @cached_property
    def inverse_factor_g(self) -> torch.Tensor:
        """``E^{-1}`` for the Cholesky factor ``S_G = E E^T``."""
        return self._cast(self._inverse_factor(self._work_cholesky[0]))

    @cached_property
    def inverse_factor_h(self) -> torch.Tensor:
        """``F^{-1}`` for the Cholesky factor ``S_H = F F^T``."""
        return self._cast(self._inverse_factor(self._work_cholesky[1]))

    @cached_property
    def gram_roots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Upper triangular ``R_G``, ``R_H`` with ``R_F^T R_F = S_F = F^T F + eps I``,
        ``shape=[..., h, h]``, in the working dtype: from the QR factorisation of ``F`` (stacked
        over ``sqrt(eps) I`` when ``eps > 0``), never from the formed Gram matrix, so that their
        rounding follows the condition of ``F``, not its square."""
        roots = []
        for factor in self._work_x:
            if self.eps != 0.0:
                eye = torch.eye(factor.shape[-1], dtype=factor.dtype, device=factor.device)
                factor = torch.cat([factor, self.eps ** 0.5 * eye.expand(
                    *factor.shape[:-2], -1, -1)], dim=-2)
            roots.append(torch.linalg.qr(factor, mode="r").R)
        return roots[0], roots[1]

    def raise_roots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Square roots ``C_G``, ``C_H`` of the factorwise raise operators, ``C_F C_F^T = P_F``
        with ``raise_index((I, I)) = (P_G, P_H)``, ``shape=[..., h, h]``, in the working dtype.

        An orthonormal frame of the metric at the point: ``u_F = w_F C_F^T`` has squared norm
        ``||w_F||^2``. The group rotates it (``C_F -> M C_F O``, ``O`` orthogonal). Each metric
        writes it from :attr:`gram_roots`, so that it is as accurate as the factors allow.
        """
        raise NotImplementedError(f"{type(self).__name__} has no raise_roots")

    @cached_property
    def gram_eigen(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Eigenvalues (clamped at 0: PSD) and eigenvectors of ``K_G`` and ``K_H``, in the
        working dtype (the Sylvester solves on ``h x h`` matrices run there too)."""
        values_g, vectors_g = torch.linalg.eigh(self._work_grams[0])
        values_h, vectors_h = torch.linalg.eigh(self._work_grams[1])
        return values_g.clamp_min(0), vectors_g, values_h.clamp_min(0), vectors_h

    def solve_in_eigenbases(self, bases: tuple[torch.Tensor, torch.Tensor],
                            denominators: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
        """:func:`solve_sylvester_eig` of an ``h x h`` right-hand side in
        the working dtype, the solution cast back to the point's dtype."""
        return self._cast(solve_sylvester_eig(*bases, denominators,
                                              rhs.to(self.work_dtype)))

    # ------------------------------------------------------------------ per metric
    def moment(self, u: Tensors) -> torch.Tensor:
        """``M(u)`` with ``<V(X), u> = <X, M(u)>_F``, ``shape=[..., h, h]``."""
        raise NotImplementedError

    def vertical_norms_squared(self) -> torch.Tensor:
        """``||V(E_kl)||^2`` for the basis ``E_kl`` of ``gl(h)``, ``shape=[..., h, h]``."""
        raise NotImplementedError

    def gram_operator_terms(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(A_1, B_1), (A_2, B_2)]`` with ``Gram(L) = A_1 L B_1 + A_2 L B_2`` (working dtype).

        ``Gram(L) = M(V(L))``, so ``<V(X), V(L)> = <X, Gram(L)>_F``: the metric restricted to
        the vertical space, in closed form from the Gram matrices (``h x h`` work only).
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ connection
    #: Whether the metric's contraction has the coefficient form of
    #: :meth:`christoffel_coefficients` (then order-2 points take :class:`OrderTwoGLPath`).
    coefficient_christoffel: ClassVar[bool] = False

    def christoffel_reductions(self, u: Sequence[torch.Tensor]
                               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(D_G(u_G), u_G^T u_G), (D_H(u_H), u_H^T u_H)]`` with ``D_F(w) = w^T F + F^T w``:
        what the contraction ``Gamma(u, u)`` of either metric reads of ``u``, ``h x h``."""
        return [(moved(tangent, factor), tangent.mT @ tangent)
                for tangent, factor in zip(u, self.x, strict=True)]

    def christoffel_coefficients(self, reductions: list[tuple[torch.Tensor, torch.Tensor]]
                                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(A_G, B_G), (A_H, B_H)]`` with ``Gamma_F(u, u) = u_F A_F - F B_F``, ``h x h``,
        from :meth:`christoffel_reductions` (only for :attr:`coefficient_christoffel`)."""
        raise NotImplementedError

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        if v is not None or not self.coefficient_christoffel:
            return super().christoffel(u, v)
        # Gamma(u, u) = u_F A_F - F B_F: the h x h coefficients first, so that only four
        # products meet the factors' n rows; the difference written into the first product
        coefficients = self.christoffel_coefficients(self.christoffel_reductions(u))
        return tuple((tangent @ a).sub_(factor @ b) for tangent, factor, (a, b)
                     in zip(u, self.x, coefficients, strict=True))

    def geodesic(self, u: Tensors, t: float = 1.0, order: int | str = 2,
                 steps: int = 64) -> Tensors:
        order, t = check_order(order), check_time(t)
        if (order == 2 and self.coefficient_christoffel and isinstance(t, float)
                and len(u) == 2 and not under_function_transform(u)
                and all(a.shape == f.shape for a, f in zip(u, self.x, strict=True))):
            return OrderTwoGLPath.apply(t, self, u[0], u[1])
        return super().geodesic(u, t, order, steps)

    # ------------------------------------------------------------------ shared
    def vertical(self, X: torch.Tensor) -> Tensors:
        G, H = self.x
        return vertical_vector(G, H, X)

    def horizontal_projection(self, u: Tensors) -> Tensors:
        vertical = self.vertical_projection(u)
        # u - V as -V + u written into the vertical part, which is new: the same values, one
        # factor-sized allocation less per component
        return vertical[0].neg_().add_(u[0]), vertical[1].neg_().add_(u[1])

    def riemannian_gradient(self, egrad: Tensors) -> Tensors:
        return self.horizontal_projection(self.raise_index(egrad))

    def horizontality_error(self, u: Tensors) -> torch.Tensor:
        """``max_{k,l} |<V_kl, u>| / (||V_kl|| ||u||)`` over the basis ``E_kl`` of gl(h).

        The quantity of :func:`quotientsharp.core.reference.horizontality_error` in closed form:
        ``<V_kl, u> = M(u)_kl``. Zero exactly for horizontal ``u``, in ``[0, 1]``, unchanged
        when ``u`` is rescaled. ``shape=[*batch]``.
        """
        return largest_normalised_product(
            self.moment(u).flatten(-2),
            self.vertical_norms_squared().clamp_min(0).sqrt().flatten(-2), self.norm(u))

    @staticmethod
    def diagonal(a: torch.Tensor) -> torch.Tensor:
        return a.diagonal(dim1=-2, dim2=-1)


def solve_sylvester_eig(eigvecs_p: torch.Tensor, eigvecs_q: torch.Tensor,
                        denominators: torch.Tensor, rhs: torch.Tensor,
                        rcond: float | None = None) -> torch.Tensor:
    """Solve a Sylvester-type equation that is diagonal in two orthonormal bases (the batched
    solver of the GL(h) horizontal projections).

    Returns ``X = U [(U^T C V) / D] V^T``: the solution of any linear equation whose operator
    maps ``u_i v_j^T`` to ``D_ij u_i v_j^T``. ``P X + X Q = C`` with ``P = U diag(lambda) U^T``
    and ``Q = V diag(mu) V^T`` is the case ``D_ij = lambda_i + mu_j``.

    Parameters
    ----------
    eigvecs_p
        Orthonormal basis ``U``, ``shape=[..., p, p]`` (columns are the basis vectors).
    eigvecs_q
        Orthonormal basis ``V``, ``shape=[..., q, q]``.
    denominators
        The operator's eigenvalues ``D``, ``shape=[..., p, q]``, expected non-negative.
    rhs
        Right-hand side ``C``, ``shape=[..., p, q]``.
    rcond
        Entries with ``D_ij <= rcond * max(D)`` (per batch element) are treated as zero and
        give zero components: the minimum-norm least-squares solution (a pseudo-inverse), exact
        whenever ``C`` lies in the operator's range. Default ``max(p, q) * eps`` of the dtype.

    Returns
    -------
    torch.Tensor
        ``X``, ``shape=[..., p, q]`` (batch dimensions broadcast).
    """
    p, q = denominators.shape[-2], denominators.shape[-1]
    if rcond is None:
        rcond = max(p, q) * torch.finfo(denominators.dtype).eps
    if rcond < 0:
        raise ValueError(f"rcond must be non-negative, got {rcond}")
    largest = denominators.abs().amax(dim=(-2, -1), keepdim=True)
    keep = denominators > rcond * largest
    # where() on both the divisor and the quotient keeps the dropped entries out of the
    # gradient too (a 1/0 there would poison backward with NaN)
    safe = torch.where(keep, denominators, torch.ones_like(denominators))
    rotated = eigvecs_p.mT @ rhs @ eigvecs_q
    scaled = torch.where(keep, rotated / safe, torch.zeros_like(rotated))
    return eigvecs_p @ scaled @ eigvecs_q.mT


def _identities(like: torch.Tensor) -> torch.Tensor:
    """A batch of identities of the square ``like``'s shape (materialised: see the caches)."""
    return torch.diag_embed(torch.ones(like.shape[:-1], dtype=like.dtype, device=like.device))


def inverse_triangular(upper: torch.Tensor) -> torch.Tensor:
    """``R^{-1}`` of upper triangular ``R``, ``shape=[..., h, h]`` (a triangular solve)."""
    return torch.linalg.solve_triangular(upper, _identities(upper), upper=True)


def moved(w: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``D(w) = w^T F + F^T w``: the derivative of ``F^T F`` along ``w``."""
    cross = w.mT @ factor
    return cross + cross.mT


def symmetric_part(a: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a + a.mT)


class GLMetric(Metric):
    """A metric on GL(h) factor pairs ``(G, H)``; a new metric names a :class:`GLPoint` subclass
    that holds its formulas.

    Attributes
    ----------
    name
        Short name (``"inv"``, ``"mix"``, ``"euclidean"``).
    point_type
        The :class:`~quotientsharp.core.gl.point.GLPoint` subclass holding the formulas.
    group_invariant
        Whether the metric is invariant under all of GL(h) at ``eps = 0`` (so that it descends
        to the quotient).
    """

    name: ClassVar[str] = "gl"
    point_type: ClassVar[type[GLPoint]] = GLPoint
    group_invariant: ClassVar[bool] = True
