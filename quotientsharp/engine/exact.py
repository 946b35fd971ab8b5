"""Exact maximisers where the maximum is known: the trust-region subproblem (Moré & Sorensen
1983), the reference against which the solver's gap is measured in the tests.

For ``g^T d + d^T A d / 2`` over ``||d / c||_2 <= rho``, with ``M = C A C``, ``h = C g``,
``d = C e``: ``e = (mu I - M)^{-1} h`` with ``mu >= max(0, lambda_max(M))`` the root of
``||e(mu)|| = rho`` (bisection in float64), or ``mu = 0`` for an interior maximum of a concave
``M``, or ``mu = lambda_max`` in the *hard case*, where a top eigenvector fills the ball.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrustRegionMaximum:
    """The exact maximum of a quadratic over a ball.

    Attributes
    ----------
    value
        ``max g^T d + d^T A d / 2`` over the ball.
    d
        A maximiser, ``shape=[n]`` (float64).
    multiplier
        The Lagrange multiplier ``mu`` (``0`` for an interior maximum).
    hard_case
        Whether the maximiser needed the top eigenvector (``g`` orthogonal to it).
    """

    value: float
    d: torch.Tensor
    multiplier: float
    hard_case: bool


def trust_region_maximum(A: torch.Tensor, g: torch.Tensor, rho: float,
                         scale: torch.Tensor | None = None,
                         iterations: int = 200) -> TrustRegionMaximum:
    """``max_{||d / c|| <= rho} g^T d + d^T A d / 2``, exactly (module docstring).

    Parameters
    ----------
    A
        Symmetric matrix, ``shape=[n, n]`` (the Hessian of the quadratic).
    g
        ``shape=[n]``: the gradient at the centre.
    rho
        Radius, ``> 0``.
    scale
        ``c``, ``shape=[n]``, ``>= 0``: the ball ``||d / c||_2 <= rho`` (coordinates with
        ``c = 0`` are fixed); ``None`` for the L2 ball (``c = 1``).
    iterations
        Bisection steps on the multiplier (200 reach float64 resolution).

    Returns
    -------
    TrustRegionMaximum
        In float64 on the CPU.

    Raises
    ------
    ValueError
        If the shapes do not fit, ``A`` is not symmetric, ``rho`` is not a finite number
        ``> 0`` or ``scale`` has negative entries.
    """
    A = torch.as_tensor(A).detach().to("cpu", torch.float64)
    g = torch.as_tensor(g).detach().to("cpu", torch.float64)
    if A.dim() != 2 or A.shape[0] != A.shape[1] or g.shape != (A.shape[0],):
        raise ValueError(f"A must be [n, n] and g [n], got A {tuple(A.shape)} and g "
                         f"{tuple(g.shape)}")
    if not torch.allclose(A, A.T, rtol=1e-10, atol=1e-12 * float(A.abs().max().clamp_min(1))):
        raise ValueError("A must be symmetric")
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not (
            0 < rho < float("inf")):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    c = torch.ones_like(g) if scale is None else torch.as_tensor(scale).detach().to(
        "cpu", torch.float64)
    if c.shape != g.shape:
        raise ValueError(f"scale must have shape {tuple(g.shape)}, got {tuple(c.shape)}")
    if bool((c < 0).any()):
        raise ValueError("scale must be >= 0")
    M = c[:, None] * A * c[None, :]
    h = c * g
    lam, Q = torch.linalg.eigh(0.5 * (M + M.T))
    hh = Q.T @ h
    top = float(lam[-1])
    spread = max(1.0, float(lam.abs().max()))

    def solution(mu: float) -> torch.Tensor:
        return hh / (mu - lam)

    hard = False
    lower = max(0.0, top)
    if top < 0 and float(solution(0.0).norm()) <= rho:
        mu, coefficients = 0.0, solution(0.0)
    else:
        near = lam >= top - 1e-12 * spread
        tiny = float(hh[near].norm()) <= 1e-14 * max(1.0, float(hh.norm()))
        rest = torch.where(near, torch.zeros_like(hh), hh / (lower - lam).masked_fill(near, 1.0))
        if top >= 0 and tiny and float(rest.norm()) <= rho:
            # the hard case: fill the ball along a top eigenvector
            hard, mu = True, top
            coefficients = rest.clone()
            coefficients[-1] = (rho ** 2 - float(rest.square().sum())) ** 0.5
        else:
            low, high = lower, lower + float(hh.norm()) / rho + 1.0
            for _ in range(iterations):
                middle = 0.5 * (low + high)
                if middle <= lower or float(solution(middle).norm()) > rho:
                    low = middle
                else:
                    high = middle
            mu, coefficients = high, solution(high)
    e = Q @ coefficients
    value = float(h @ e + 0.5 * e @ (M @ e))
    return TrustRegionMaximum(value, c * e, float(mu), hard)
