"""The mix metric on GL(h) factor pairs: ``<u, v> = Tr(S_H u_G^T v_G + S_G u_H^T v_H)``.

With ``S_G = G^T G + eps I`` and ``S_H = H^T H + eps I`` (``derivations/gl_attention.py``
derives every formula below with sympy and checks it in exact arithmetic). At ``eps = 0`` the
metric is GL(h)-invariant: ``u_G -> u_G A^{-1}`` is weighted by ``K_H -> A K_H A^T`` and the
factors of ``A`` cancel in the trace.

- Moment: ``M(u) = S_G u_H^T H - G^T u_G S_H``; vertical norms
  ``||V(E_kl)||^2 = (K_G)_kk (S_H)_ll + (S_G)_kk (K_H)_ll``.
- Vertical part: ``Gram(L) = S_G L K_H + K_G L S_H = M(u)``. In the eigenbases of ``K_G``
  (eigenvalues ``g_i``) and ``K_H`` (``k_j``) the operator is diagonal with eigenvalues
  ``2 g_i k_j + eps (g_i + k_j)``: a closed-form solve for any ``eps``. At ``eps = 0`` the
  operator is ``L -> 2 K_G L K_H`` and ``L = (u_H^T H K_H^{-1} - K_G^{-1} G^T u_G) / 2``, which
  keeps equivariance under ill-conditioned group elements far better than the eigenbases (whose
  rounding grows with the condition of ``K_G`` and ``K_H``). ``V(L) = (-G L, H L^T)``.
- Raised gradient: ``(dL/dG S_H^{-1}, dL/dH S_G^{-1})``: ``G`` and ``H`` are coupled.
- Christoffel contraction (polarised; ``D_H(w) = w^T H + H^T w``, ``sym(W) = (W + W^T) / 2``):
  ``Gamma_G(u, v) = (u_G D_H(v) + v_G D_H(u)) S_H^{-1} / 2 - G sym(u_H^T v_H) S_H^{-1}``,
  ``Gamma_H`` with ``G`` and ``H`` exchanged.
"""

from __future__ import annotations

import torch

from quotientsharp.core.gl.point import (
    GLMetric,
    GLPoint,
    inverse_triangular,
    moved,
    symmetric_part,
    vertical_vector,
)

Tensors = tuple[torch.Tensor, ...]


class MixPoint(GLPoint):
    """The mix metric's formulas at a frozen ``(G, H)`` (module docstring)."""

    def factorise(self) -> None:
        if self.eps != 0.0:                 # at eps = 0 the projection solves by Cholesky
            _ = self.gram_eigen

    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        return (((u[0] @ self.relaxed_h) * v[0]).sum((-2, -1))
                + ((u[1] @ self.relaxed_g) * v[1]).sum((-2, -1)))

    def squared_norm(self, u: Tensors) -> torch.Tensor:
        # ||u_G F||^2 + ||u_H E||^2 with S_H = F F^T, S_G = E E^T: a sum of squares, accurate to
        # rounding however ill-conditioned S is (u S u^T summed cancels), so a vector rescaled
        # onto the sphere is on it to rounding
        # (the Frobenius norm of each product, squared: no second factor-sized tensor)
        return (torch.linalg.vector_norm(u[0] @ self.cholesky_h, dim=(-2, -1)).square()
                + torch.linalg.vector_norm(u[1] @ self.cholesky_g, dim=(-2, -1)).square())

    def moment(self, u: Tensors) -> torch.Tensor:
        G, H = self.x
        return self.relaxed_g @ (u[1].mT @ H) - (G.mT @ u[0]) @ self.relaxed_h

    def vertical_norms_squared(self) -> torch.Tensor:
        d = self.diagonal
        return (d(self.gram_g).unsqueeze(-1) * d(self.relaxed_h).unsqueeze(-2)
                + d(self.relaxed_g).unsqueeze(-1) * d(self.gram_h).unsqueeze(-2))

    def gram_operator_terms(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Gram(L) = S_G L K_H + K_G L S_H
        gram_g, gram_h = self._work_grams
        relaxed_g, relaxed_h = self._work_relaxed
        return [(relaxed_g, gram_h), (gram_g, relaxed_h)]

    def vertical_projection(self, u: Tensors) -> Tensors:
        G, H = self.x
        if self.eps == 0.0:
            # h x h solves in the working dtype (float64 for float32 points)
            chol_g, chol_h = self._work_cholesky
            u_h, g_u = (u[1].mT @ H).to(self.work_dtype), (G.mT @ u[0]).to(self.work_dtype)
            lagrange = 0.5 * (torch.cholesky_solve(u_h.mT, chol_h).mT
                              - torch.cholesky_solve(g_u, chol_g))
            return vertical_vector(G, H, self._cast(lagrange))
        values_g, vectors_g, values_h, vectors_h = self.gram_eigen
        col, row = values_g.unsqueeze(-1), values_h.unsqueeze(-2)
        denominators = 2 * col * row + self.eps * (col + row)
        lagrange = self.solve_in_eigenbases((vectors_g, vectors_h), denominators, self.moment(u))
        return vertical_vector(G, H, lagrange)

    def raise_index(self, egrad: Tensors) -> Tensors:
        return egrad[0] @ self.inverse_h, egrad[1] @ self.inverse_g

    def raise_roots(self) -> tuple[torch.Tensor, torch.Tensor]:
        # P_G = S_H^{-1} = R_H^{-1} R_H^{-T}: C_G = R_H^{-1}, so H C_G is orthonormal at eps = 0
        root_g, root_h = self.gram_roots
        return inverse_triangular(root_h), inverse_triangular(root_g)

    coefficient_christoffel = True

    def christoffel_coefficients(self, reductions: list[tuple[torch.Tensor, torch.Tensor]]
                                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Gamma_G(u, u) = u_G D_H(u_H) S_H^{-1} - G (u_H^T u_H) S_H^{-1}, H with G exchanged
        (moved_g, square_g), (moved_h, square_h) = reductions
        return [(moved_h @ self.inverse_h, square_h @ self.inverse_h),
                (moved_g @ self.inverse_g, square_g @ self.inverse_g)]

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        if v is None:
            return super().christoffel(u)          # the coefficient form above
        G, H = self.x
        return ((0.5 * (u[0] @ moved(v[1], H) + v[0] @ moved(u[1], H))
                 - G @ symmetric_part(u[1].mT @ v[1])) @ self.inverse_h,
                (0.5 * (u[1] @ moved(v[0], G) + v[1] @ moved(u[0], G))
                 - H @ symmetric_part(u[0].mT @ v[0])) @ self.inverse_g)

    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        # rows of u_G have the metric S_H: covariance S_H^{-1} = S_H^{-1} (H^T H + eps I)
        # S_H^{-1}, so u_G = (W H + sqrt(eps) Z) S_H^{-1}, equivariant like H S_H^{-1}
        G, H = self.x
        return (self.mixed_noise(G.shape[-2], H, generator) @ self.inverse_h,
                self.mixed_noise(H.shape[-2], G, generator) @ self.inverse_g)


class MixMetric(GLMetric):
    """``Tr(S_H u_G^T v_G + S_G u_H^T v_H)``: GL(h)-invariant at ``eps = 0``."""

    name = "mix"
    point_type = MixPoint
