"""Generic numerical defaults of every quotient operation, from the metric and the action alone.

These functions need only ``quotient.inner``, ``quotient.vertical``, ``quotient.algebra_shape``
and ``quotient.point_ndims``. :class:`~quotientsharp.SymmetryQuotient` uses them as its default
methods; built-in quotients override the methods with closed forms, and the check tools compare
those closed forms against the functions here. They favour generality over speed: the metric is
assembled densely per batch element (``N x N`` for ``N`` coordinates of a point), which is fine
for checks and small user quotients but not for a whole transformer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, overload

import torch

from quotientsharp.core import _tuples as T

Tensors = tuple[torch.Tensor, ...]


class Quotient(Protocol):
    """What these defaults read of a quotient (a protocol: the quotient module imports this one)."""

    @property
    def point_ndims(self) -> tuple[int, ...]: ...
    def inner(self, x: Tensors, u: Tensors, v: Tensors) -> torch.Tensor: ...
    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors: ...
    def algebra_shape(self, x: Tensors) -> tuple[int, ...]: ...


def jvp_pair(function: Callable[..., Any], primals: tuple[Any, ...],
             tangents: tuple[Any, ...]) -> tuple[Any, Any]:
    """``(function(*primals), d function(*primals)[tangents])`` by reverse mode twice.

    ``J t`` is the vector-Jacobian product of the linear map ``c -> J^T c`` (itself a
    ``torch.func.vjp``) with cotangent ``t``. Forward-mode AD (``torch.func.jvp``) is not used:
    its first call in a process makes torch script its jvp decompositions, a
    ``DeprecationWarning`` (``torch.jit.script``) that reaches the user and fails
    ``pytest -W error``.
    """
    # torch.func.vjp is annotated as a pair or (with has_aux) a triple: indexed, not unpacked
    first = torch.func.vjp(function, *primals)
    output, pull = first[0], first[1]
    dummy = torch.utils._pytree.tree_map(torch.zeros_like, output)
    (pushed,) = torch.func.vjp(pull, dummy)[1](tuple(tangents))
    return output, pushed


def _algebra_basis(q: Quotient, x: Tensors) -> tuple[torch.Tensor, torch.Size]:
    """Standard basis of the Lie algebra, ``shape=[K, *batch, *algebra_shape]``."""
    batch = T.batch_shape(x, q.point_ndims)
    shape = torch.Size(q.algebra_shape(x))
    k = shape.numel()
    eye = torch.eye(k, dtype=x[0].dtype, device=x[0].device)
    basis = eye.reshape(k, *([1] * len(batch)), *shape).expand(k, *batch, *shape)
    return basis, batch


def vertical_basis(q: Quotient, x: Tensors) -> Tensors:
    """The vertical vectors of the algebra's basis, each component ``shape=[K, *batch, ...]``."""
    basis, _ = _algebra_basis(q, x)
    return torch.vmap(lambda a: q.vertical(x, a))(basis)


def _vertical_gram(q: Quotient, x: Tensors, basis: Tensors) -> torch.Tensor:
    """``M[..., k, l] = <V_k, V_l>_x``, ``shape=[*batch, K, K]``."""
    gram = torch.vmap(lambda vk: torch.vmap(lambda vl: q.inner(x, vk, vl))(basis))(basis)
    dims = gram.dim()
    return gram.permute(*range(2, dims), 0, 1)


def vertical_gram(q: Quotient, x: Tensors) -> torch.Tensor:
    """The Gram matrix ``<V_k, V_l>_x`` of the vertical vectors of the algebra's basis,
    ``shape=[*batch, K, K]``."""
    return _vertical_gram(q, x, vertical_basis(q, x))


def vertical_coefficients(q: Quotient, x: Tensors, u: Tensors) -> torch.Tensor:
    """Coefficients ``a`` of the metric-orthogonal projection of ``u`` onto the vertical space.

    Solves the normal equations ``M a = b`` with ``M_kl = <V_k, V_l>`` and ``b_k = <V_k, u>``.
    Returns ``shape=[*batch, K]``.
    """
    basis = vertical_basis(q, x)
    gram = _vertical_gram(q, x, basis)
    rhs = torch.vmap(lambda vk: q.inner(x, vk, u))(basis)
    rhs = rhs.movedim(0, -1)
    gram, rhs = torch.broadcast_tensors(gram, rhs.unsqueeze(-1))
    chol, info = torch.linalg.cholesky_ex(gram)
    if not torch.compiler.is_compiling() and bool((info != 0).any()):
        raise ValueError(
            "the vertical directions at x are linearly dependent under the metric (a degenerate "
            "orbit: a zero or rank-deficient factor); move x off the singular set (for the "
            "attention quotients: eps > 0)"
        )
    return torch.cholesky_solve(rhs[..., :1], chol).squeeze(-1)


def _trivial_group(q: Quotient, x: Tensors) -> bool:
    """Whether the algebra at ``x`` is zero-dimensional (no vertical space)."""
    return torch.Size(q.algebra_shape(x)).numel() == 0


def vertical_projection(q: Quotient, x: Tensors, u: Tensors) -> Tensors:
    """Metric-orthogonal projection of ``u`` onto the vertical space at ``x``."""
    if _trivial_group(q, x):
        return tuple(torch.zeros_like(c) for c in u)
    coeffs = vertical_coefficients(q, x, u)
    shape = torch.Size(q.algebra_shape(x))
    return q.vertical(x, coeffs.reshape(*coeffs.shape[:-1], *shape))


def horizontal_projection(q: Quotient, x: Tensors, u: Tensors) -> Tensors:
    """Metric-orthogonal projection of ``u`` onto the horizontal space at ``x``."""
    return T.sub(u, vertical_projection(q, x, u))


def largest_normalised_product(products: torch.Tensor, vertical_norms: torch.Tensor,
                               norm: torch.Tensor) -> torch.Tensor:
    """``max_k |<V_k, u>| / (||V_k|| ||u||)`` from ``products`` and ``vertical_norms``
    (``shape=[*batch, K]``) and ``norm`` ``= ||u||`` (``shape=[*batch]``): the horizontality
    measure of every quotient, in ``[0, 1]`` and zero exactly for horizontal ``u``."""
    tiny = torch.finfo(products.dtype).tiny
    return (products.abs() / (vertical_norms * norm.unsqueeze(-1)).clamp_min(tiny)).amax(-1)


def horizontality_error(q: Quotient, x: Tensors, u: Tensors) -> torch.Tensor:
    """:func:`largest_normalised_product` over the vertical basis; ``shape=[*batch]``."""
    if _trivial_group(q, x):
        return torch.zeros_like(q.inner(x, u, u))
    basis = vertical_basis(q, x)
    dots = torch.vmap(lambda vk: q.inner(x, vk, u))(basis)
    norms_v = torch.vmap(lambda vk: q.inner(x, vk, vk))(basis).clamp_min(0).sqrt()
    return largest_normalised_product(dots.movedim(0, -1), norms_v.movedim(0, -1),
                                      q.inner(x, u, u).clamp_min(0).sqrt())


def lower(q: Quotient, x: Tensors, u: Tensors) -> Tensors:
    """The covector ``g(x) u`` (index lowered), by autograd of the bilinear metric."""
    zero = T.zeros_like(u)
    return torch.func.grad(lambda w: q.inner(x, u, w).sum())(zero)


def metric_matrix(q: Quotient, x: Tensors) -> torch.Tensor:
    """The metric over the flattened coordinates of a point, ``shape=[*batch, N, N]``."""
    ndims = q.point_ndims
    batch = T.batch_shape(x, ndims)
    n = T.total_size(x, ndims)
    eye = torch.eye(n, dtype=x[0].dtype, device=x[0].device)
    basis = eye.reshape(n, *([1] * len(batch)), n).expand(n, *batch, n)

    def row(e: torch.Tensor) -> torch.Tensor:
        # unflatten takes the batch shape from e, only the trailing shapes from x
        return T.flatten(lower(q, x, T.unflatten(e, x, ndims)), ndims, batch)

    rows = torch.vmap(row)(basis)
    return rows.movedim(0, -2)


def raise_index(q: Quotient, x: Tensors, covector: Tensors) -> Tensors:
    """Solve ``g(x) r = covector`` for the vector ``r``."""
    ndims = q.point_ndims
    batch = torch.broadcast_shapes(T.batch_shape(x, ndims), T.batch_shape(covector, ndims))
    gmat = metric_matrix(q, x)
    flat = T.flatten(covector, ndims, batch)
    gmat = gmat.expand(*batch, *gmat.shape[-2:])
    chol, info = torch.linalg.cholesky_ex(gmat)
    if not torch.compiler.is_compiling() and bool((info != 0).any()):
        raise ValueError("the metric is not positive definite at x (a zero entry or a "
                         "rank-deficient factor where the metric divides); move x off the "
                         "singular set (for the attention quotients: eps > 0)")
    sol = torch.cholesky_solve(flat.unsqueeze(-1), chol).squeeze(-1)
    return T.unflatten(sol, x, ndims)


def euclidean_to_riemannian_gradient(q: Quotient, x: Tensors, egrad: Tensors) -> Tensors:
    """Metric-raised Euclidean gradient, projected onto the horizontal space."""
    return horizontal_projection(q, x, raise_index(q, x, egrad))


def christoffel_covector(q: Quotient, x: Tensors, v: Tensors) -> Tensors:
    """``D(g(x) v)[v] - 1/2 grad_x <v, v>_x``: the lowered Christoffel contraction."""
    # jvp needs primal and tangent of one shape, and dense (non-expanded) memory
    ndims = q.point_ndims
    batch = torch.broadcast_shapes(T.batch_shape(x, ndims), T.batch_shape(v, ndims))
    x, v = (tuple(c.expand(*batch, *c.shape[c.dim() - k:]).contiguous()
                  for c, k in zip(tensors, ndims, strict=True)) for tensors in (x, v))
    _, dgv = jvp_pair(lambda y: lower(q, y, v), (x,), (v,))
    dquad = torch.func.grad(lambda y: q.inner(y, v, v).sum())(x)
    return tuple(a - 0.5 * b for a, b in zip(dgv, dquad, strict=True))


def christoffel(q: Quotient, x: Tensors, u: Tensors, v: Tensors | None = None) -> Tensors:
    """Christoffel contraction ``Gamma_x(u, v)`` of the Levi-Civita connection, by autograd.

    ``Gamma(v, v) = g^{-1} [D(g(x) v)[v] - 1/2 grad_x(v^T g(x) v)]``; the bilinear form follows
    by polarisation, ``Gamma(u, v) = (Gamma(u+v, u+v) - Gamma(u-v, u-v)) / 4``. The full
    Christoffel array is never formed.
    """
    if v is None:
        return raise_index(q, x, christoffel_covector(q, x, u))
    plus = christoffel_covector(q, x, T.add(u, v))
    minus = christoffel_covector(q, x, T.sub(u, v))
    return raise_index(q, x, tuple(0.25 * (a - b) for a, b in zip(plus, minus, strict=True)))


@overload
def geodesic_ode(x: Tensors, u: Tensors, t: float | torch.Tensor, ndims: tuple[int, ...],
                 gamma: Callable[[Tensors, Tensors], Tensors], steps: int = 64,
                 return_velocity: Literal[False] = False) -> Tensors: ...


@overload
def geodesic_ode(x: Tensors, u: Tensors, t: float | torch.Tensor, ndims: tuple[int, ...],
                 gamma: Callable[[Tensors, Tensors], Tensors], steps: int = 64, *,
                 return_velocity: Literal[True]) -> tuple[Tensors, Tensors]: ...


def geodesic_ode(x: Tensors, u: Tensors, t: float | torch.Tensor, ndims: tuple[int, ...],
                 gamma: Callable[[Tensors, Tensors], Tensors], steps: int = 64,
                 return_velocity: bool = False) -> Tensors | tuple[Tensors, Tensors]:
    """Integrate the geodesic equation ``x'' = -Gamma_x(x', x')`` from ``(x, u)`` to time ``t``.

    Classical fourth-order Runge-Kutta with ``steps`` equal steps; the global error is
    ``O((t / steps)^4)``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    h = t / steps
    pos, vel = tuple(x), tuple(u)

    def rhs(p: Tensors, w: Tensors) -> tuple[Tensors, Tensors]:
        return w, tuple(-g for g in gamma(p, w))

    for _ in range(steps):
        k1p, k1v = rhs(pos, vel)
        k2p, k2v = rhs(T.axpy(h / 2, k1p, pos, ndims), T.axpy(h / 2, k1v, vel, ndims))
        k3p, k3v = rhs(T.axpy(h / 2, k2p, pos, ndims), T.axpy(h / 2, k2v, vel, ndims))
        k4p, k4v = rhs(T.axpy(h, k3p, pos, ndims), T.axpy(h, k3v, vel, ndims))
        pos = tuple(p + h / 6 * (a + 2 * b + 2 * c + d)
                    for p, a, b, c, d in zip(pos, k1p, k2p, k3p, k4p, strict=True))
        vel = tuple(w + h / 6 * (a + 2 * b + 2 * c + d)
                    for w, a, b, c, d in zip(vel, k1v, k2v, k3v, k4v, strict=True))
    return (pos, vel) if return_velocity else pos


def geodesic(q: Quotient, x: Tensors, u: Tensors, t: float = 1.0, order: int | str = 2,
             steps: int = 64) -> Tensors:
    """Geodesic from ``x`` with velocity ``u`` at time ``t``, from the autograd Christoffel.

    ``order=1``: ``x + t u``; ``order=2``: ``x + t u - t^2/2 Gamma(u, u)``; ``order="exact"``:
    RK4 integration of the geodesic equation.
    """
    if order == 1:
        return T.axpy(t, u, x, q.point_ndims)
    if order == 2:
        g = christoffel(q, x, u)
        return tuple(a + t * b - 0.5 * t * t * c for a, b, c in zip(x, u, g, strict=True))
    if order == "exact":
        return geodesic_ode(x, u, t, q.point_ndims, lambda p, w: christoffel(q, p, w), steps)
    raise ValueError(f"order must be 1, 2 or 'exact', got {order!r}")


def group_exp(a: torch.Tensor) -> torch.Tensor:
    """Default group exponential of an abelian algebra element: elementwise ``exp``."""
    return torch.exp(a)


def taylor_slope(ts: torch.Tensor, errors: torch.Tensor) -> float:
    """Least-squares slope of ``log(error)`` against ``log(t)``."""
    lt, le = torch.log(ts.double()), torch.log(errors.double().clamp_min(1e-300))
    lt = lt - lt.mean()
    return float((lt * (le - le.mean())).sum() / (lt * lt).sum())
