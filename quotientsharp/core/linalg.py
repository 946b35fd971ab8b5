"""Batched solvers for the Sylvester equations of the GL(h) horizontal projections.

Every solver here works on any device and dtype, broadcasts over leading batch dimensions and
uses only symmetric eigendecompositions (``torch.linalg.eigh``), Cholesky factors and triangular
solves, all of which batch well on a GPU. All are differentiable by autograd.

Singular problems. For symmetric positive semi-definite coefficients the Sylvester operator
``X -> P X + X Q`` is symmetric for the Frobenius product, with eigenvectors ``u_i v_j^T`` and
eigenvalues ``lambda_i + mu_j``. Eigenvalue sums at or below ``rcond`` times the largest are
treated as zero and their components of the solution set to zero: the result is then the
minimum-norm least-squares solution (a pseudo-inverse), which is exact whenever the right-hand
side lies in the operator's range. The default ``rcond`` is ``max(p, q) * eps`` of the dtype, the
usual pseudo-inverse cut-off; it only removes sums that are zero to rounding.
"""

from __future__ import annotations

import torch


def _default_rcond(p: int, q: int, dtype: torch.dtype) -> float:
    return max(p, q) * torch.finfo(dtype).eps


def solve_sylvester_eig(eigvecs_p: torch.Tensor, eigvecs_q: torch.Tensor,
                        denominators: torch.Tensor, rhs: torch.Tensor,
                        rcond: float | None = None) -> torch.Tensor:
    """Solve a Sylvester-type equation that is diagonal in two orthonormal bases.

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
        give zero components (pseudo-inverse). Default ``max(p, q) * eps`` of the dtype.

    Returns
    -------
    torch.Tensor
        ``X``, ``shape=[..., p, q]`` (batch dimensions broadcast).
    """
    p, q = denominators.shape[-2], denominators.shape[-1]
    if rcond is None:
        rcond = _default_rcond(p, q, denominators.dtype)
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


def _check_square(name: str, a: torch.Tensor) -> None:
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"{name} must be a (batch of) square matrices, got shape {tuple(a.shape)}")


def _check_sylvester_shapes(p_name: str, p: torch.Tensor, q_name: str, q: torch.Tensor,
                            rhs: torch.Tensor) -> None:
    _check_square(p_name, p)
    _check_square(q_name, q)
    if rhs.dim() < 2 or rhs.shape[-2:] != (p.shape[-1], q.shape[-1]):
        raise ValueError(f"C must end in shape ({p.shape[-1]}, {q.shape[-1]}) to match {p_name} "
                         f"{tuple(p.shape)} and {q_name} {tuple(q.shape)}, got "
                         f"{tuple(rhs.shape)}")
    for name, t in ((p_name, p), (q_name, q), ("C", rhs)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must have a floating dtype, got {t.dtype}")
    if not p.dtype == q.dtype == rhs.dtype:
        raise TypeError(f"{p_name}, {q_name} and C must share a dtype, got {p.dtype}, {q.dtype}, "
                        f"{rhs.dtype}")


def solve_sylvester_spd(P: torch.Tensor, Q: torch.Tensor, C: torch.Tensor,
                        rcond: float | None = None) -> torch.Tensor:
    """Solve ``P X + X Q = C`` for symmetric positive (semi-)definite ``P`` and ``Q``.

    Eigendecomposes both coefficients and divides in their eigenbases by
    ``lambda_i(P) + mu_j(Q)``. Only the lower triangles of ``P`` and ``Q`` are read (as by
    ``torch.linalg.eigh``).

    Parameters
    ----------
    P
        ``shape=[..., p, p]``, symmetric positive semi-definite.
    Q
        ``shape=[..., q, q]``, symmetric positive semi-definite.
    C
        ``shape=[..., p, q]``.
    rcond
        Pseudo-inverse cut-off on ``lambda_i + mu_j`` relative to the largest sum (see the
        module docstring); the solution is unique and exact when all sums are positive.

    Returns
    -------
    torch.Tensor
        ``X``, ``shape=[..., p, q]`` (batch dimensions broadcast).
    """
    _check_sylvester_shapes("P", P, "Q", Q, C)
    eigvals_p, eigvecs_p = torch.linalg.eigh(P)
    eigvals_q, eigvecs_q = torch.linalg.eigh(Q)
    denominators = eigvals_p.unsqueeze(-1) + eigvals_q.unsqueeze(-2)
    return solve_sylvester_eig(eigvecs_p, eigvecs_q, denominators, C, rcond)


def solve_sylvester_product_spd(P_outer: torch.Tensor | None, P_inner: torch.Tensor,
                                Q_inner: torch.Tensor, Q_outer: torch.Tensor | None,
                                C: torch.Tensor,
                                rcond: float | None = None, *,
                                P_outer_cholesky: torch.Tensor | None = None,
                                Q_outer_cholesky: torch.Tensor | None = None) -> torch.Tensor:
    """Solve ``(P_o P_i) X + X (Q_i Q_o) = C`` for coefficients that are products of SPD matrices.

    ``P_o``, ``Q_o`` symmetric positive definite, ``P_i``, ``Q_i`` symmetric positive
    semi-definite. The products are not symmetric, but similar to symmetric matrices: with
    Cholesky factors ``P_o = F F^T`` and ``Q_o = E E^T``,
    ``P_o P_i = F (F^T P_i F) F^{-1}`` and ``Q_i Q_o = E^{-T} (E^T Q_i E) E^T``. Substituting
    ``X = F Y E^T`` gives the symmetric problem ``(F^T P_i F) Y + Y (E^T Q_i E) = F^{-1} C E^{-T}``
    solved by :func:`solve_sylvester_spd`. (Any factor of ``P_o`` works; the Cholesky factor
    replaces the symmetric square root ``P_o^{1/2}`` at lower cost.)

    Parameters
    ----------
    P_outer, P_inner
        ``shape=[..., p, p]``.
    Q_inner, Q_outer
        ``shape=[..., q, q]``.
    C
        ``shape=[..., p, q]``.
    rcond
        Pseudo-inverse cut-off of the symmetric problem (see the module docstring).
    P_outer_cholesky, Q_outer_cholesky
        Optional lower Cholesky factors of ``P_outer`` and ``Q_outer``, when the caller has
        them already (then ``P_outer`` / ``Q_outer`` are not read and may be ``None``).

    Returns
    -------
    torch.Tensor
        ``X``, ``shape=[..., p, q]``.
    """
    _check_sylvester_shapes("P_inner", P_inner, "Q_inner", Q_inner, C)
    if P_outer_cholesky is None:
        if P_outer is None:
            raise ValueError("pass P_outer or P_outer_cholesky")
        P_outer_cholesky = torch.linalg.cholesky(P_outer)
    if Q_outer_cholesky is None:
        if Q_outer is None:
            raise ValueError("pass Q_outer or Q_outer_cholesky")
        Q_outer_cholesky = torch.linalg.cholesky(Q_outer)
    F, E = P_outer_cholesky, Q_outer_cholesky
    if F.shape[-2:] != P_inner.shape[-2:] or E.shape[-2:] != Q_inner.shape[-2:]:
        raise ValueError(f"the outer coefficients (factors of shape {tuple(F.shape)}, "
                         f"{tuple(E.shape)}) must match P_inner {tuple(P_inner.shape)} and "
                         f"Q_inner {tuple(Q_inner.shape)}")
    P_sym = F.mT @ P_inner @ F
    Q_sym = E.mT @ Q_inner @ E
    # F^{-1} C E^{-T}: a left and a right triangular solve
    rhs = torch.linalg.solve_triangular(F, C, upper=False)
    rhs = torch.linalg.solve_triangular(E.mT, rhs, upper=True, left=False)
    Y = solve_sylvester_spd(P_sym, Q_sym, rhs, rcond)
    return F @ Y @ E.mT
