"""A user's symmetry for the tests: GL(k) of a linear bottleneck ``W2 W1``, as a user writes it.

``bottleneck_model()`` is ``Linear(d, k, bias=False) -> Linear(k, o)``; its function depends on
``W2 W1`` only, so ``(W1, W2) -> (G W1, W2 G^-1)`` for any invertible ``G`` leaves it unchanged.
``bottleneck_binding(model)`` is the FUNCTION of ``--symmetry tests.bottleneck_symmetry:...``.
"""

from __future__ import annotations

import torch
from torch import nn

import quotientsharp as qs


class BottleneckGL(qs.SymmetryQuotient):
    """GL(k) acting on ``(W1 [k, d], W2 [o, k])``, with the invariant metric
    ``tr(U1^T (W1 W1^T)^-1 V1) + tr(U2 (W2^T W2)^-1 V2^T)``."""

    name = "bottleneck-gl"
    point_ndims = (2, 2)

    def inner(self, x, u, v):
        w1, w2 = x
        left = torch.linalg.solve(w1 @ w1.mT, v[0])
        right = torch.linalg.solve(w2.mT @ w2, v[1].mT)
        return (u[0] * left).sum((-2, -1)) + (u[1].mT * right).sum((-2, -1))

    def vertical(self, x, a):
        return a @ x[0], -x[1] @ a

    def act(self, x, g):
        return g @ x[0], torch.linalg.solve(g.mT, x[1].mT).mT

    def algebra_shape(self, x):
        k = x[0].shape[-2]
        return (k, k)

    def group_exp(self, a):
        return torch.linalg.matrix_exp(a)


def bottleneck_model(d: int = 6, k: int = 3, o: int = 4, seed: int = 0) -> nn.Module:
    """``Linear(d, k, bias=False) -> Linear(k, o)`` in float64."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, k, bias=False), nn.Linear(k, o)).double()


def bottleneck_batches(d: int = 6, o: int = 4, n: int = 2, seed: int = 1) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, d, generator=generator, dtype=torch.float64),
             torch.randint(0, o, (16,), generator=generator)) for _ in range(n)]


def bottleneck_binding(model: nn.Module) -> qs.QuotientBinding:
    """The binding of :class:`BottleneckGL` to ``0.weight`` and ``1.weight``."""
    return qs.QuotientBinding(BottleneckGL(), ["0.weight", "1.weight"], name="bottleneck")
