"""The batched solver of the Sylvester equations of the GL(h) horizontal projections.

For symmetric positive semi-definite ``P`` and ``Q`` the operator ``X -> P X + X Q`` is symmetric
for the Frobenius product, with eigenvectors ``u_i v_j^T`` and eigenvalues ``lambda_i + mu_j``.
Dropping the sums at or below ``rcond`` times the largest gives the minimum-norm least-squares
solution (a pseudo-inverse), exact whenever the right-hand side lies in the operator's range.
"""

from __future__ import annotations

import torch


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
