"""The Euclidean metric on GL(h) factor pairs: ``<u, v> = Tr(u_G^T v_G + u_H^T v_H)``.

Not invariant under GL(h) (only under the orthogonal group), and flat: ``Gamma = 0``, every
geodesic is a straight line. It has no Gram matrix, so ``eps`` does not change it.

- Moment: ``M(u) = u_H^T H - G^T u_G``; vertical norms ``||V(E_kl)||^2 = (K_G)_kk + (K_H)_ll``.
- Vertical part: ``Gram(L) = K_G L + L K_H = M(u)``, a Sylvester equation with SPD
  coefficients, diagonal in the eigenbases of ``K_G`` and ``K_H`` with eigenvalues
  ``g_i + k_j``. ``V(L) = (-G L, H L^T)``.
- Raised gradient: the Euclidean gradient itself.
"""

from __future__ import annotations

import torch

from quotientsharp.core.frozen import EuclideanMetricPoint
from quotientsharp.core.gl.point import GLMetric, GLPoint, vertical_vector

Tensors = tuple[torch.Tensor, ...]


class EuclideanPoint(EuclideanMetricPoint, GLPoint):
    """The Euclidean metric's projections at a frozen ``(G, H)`` (module docstring); the
    metric, its flat connection and straight geodesics are :class:`EuclideanMetricPoint`'s."""

    needs_factors = False

    def factorise(self) -> None:
        _ = self.gram_eigen                 # eigendecompositions of the projection

    def moment(self, u: Tensors) -> torch.Tensor:
        G, H = self.x
        return u[1].mT @ H - G.mT @ u[0]

    def vertical_norms_squared(self) -> torch.Tensor:
        d = self.diagonal
        return d(self.gram_g).unsqueeze(-1) + d(self.gram_h).unsqueeze(-2)

    def gram_operator_terms(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Gram(L) = K_G L + L K_H
        gram_g, gram_h = self._work_grams
        eye = torch.eye(gram_g.shape[-1], dtype=gram_g.dtype, device=gram_g.device)
        return [(gram_g, eye), (eye, gram_h)]

    def raise_roots(self) -> tuple[torch.Tensor, torch.Tensor]:
        # the raise operator is the identity
        G = self._work_x[0]
        eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device).expand(*G.shape[:-2], -1, -1)
        return eye, eye

    def vertical_projection(self, u: Tensors) -> Tensors:
        values_g, vectors_g, values_h, vectors_h = self.gram_eigen
        denominators = values_g.unsqueeze(-1) + values_h.unsqueeze(-2)
        lagrange = self.solve_in_eigenbases((vectors_g, vectors_h), denominators, self.moment(u))
        G, H = self.x
        return vertical_vector(G, H, lagrange)


class EuclideanMetric(GLMetric):
    """``Tr(u_G^T v_G + u_H^T v_H)``: flat, invariant only under the orthogonal group."""

    name = "euclidean"
    point_type = EuclideanPoint
    group_invariant = False
