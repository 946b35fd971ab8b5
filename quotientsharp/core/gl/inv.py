"""The inv metric on GL(h) factor pairs: ``<u, v> = Tr(S_G^{-1} u_G^T v_G + S_H^{-1} u_H^T v_H)``.

With ``S_G = G^T G + eps I`` and ``S_H = H^T H + eps I`` (``derivations/gl_attention.py``
derives every formula below with sympy and checks it in exact arithmetic). At ``eps = 0`` the
metric is GL(h)-invariant: ``(G A^{-1})^T (G A^{-1}) = A^{-T} K_G A^{-1}`` and ``u_G -> u_G A^{-1}``
cancel in the trace.

- Moment: ``M(u) = S_H^{-1} u_H^T H - G^T u_G S_G^{-1}``; vertical norms
  ``||V(E_kl)||^2 = (K_G)_kk (S_G^{-1})_ll + (S_H^{-1})_kk (K_H)_ll``.
- Vertical part: ``Gram(L) = S_H^{-1} L K_H + K_G L S_G^{-1} = M(u)``. Multiplying by ``S_H`` on
  the left and ``S_G`` on the right gives the Sylvester equation
  ``(S_H K_G) L + L (K_H S_G) = u_H^T H S_G - S_H G^T u_G`` with coefficients similar to SPD
  ones. With Cholesky factors ``S_G = E E^T``, ``S_H = F F^T`` and ``L = F Y E^T`` it is the SPD
  equation ``(B_G^T B_G) Y + Y (B_H^T B_H) = F^{-1} C E^{-T}``, ``B_G = G F``, ``B_H = H E``.
  ``B_G`` and ``B_H`` are invariant under the action (``F -> A F``, ``E -> A^{-T} E`` up to
  orthogonal factors), so an ill-conditioned ``A`` costs accuracy once, not squared. The
  vertical part is ``V(L) = (-B_G Y E^T, B_H Y^T F^T) = (-G L, H L^T)`` with
  ``L = F Y E^T``; the right-hand side is ``F^{-1} (u_H^T H) E - F^T (G^T u_G) E^{-T}``, so that
  only two products of each kind meet the factors' ``n`` rows.
- Raised gradient: ``(dL/dG S_G, dL/dH S_H)``.
- Christoffel contraction (polarised; ``D_G(w) = w^T G + G^T w``, ``sym(W) = (W + W^T) / 2``):
  ``Gamma_G(u, v) = -(u_G S_G^{-1} D_G(v) + v_G S_G^{-1} D_G(u)) / 2 + G S_G^{-1} sym(u_G^T v_G)``,
  ``Gamma_H`` likewise. ``eps`` is a constant shift, so the derivative of ``S_G`` is still
  ``D_G`` and the forms stay exact for any ``eps >= 0``.
"""

from __future__ import annotations

from functools import cached_property

import torch

from quotientsharp.core.gl.point import (
    GLMetric,
    GLPoint,
    moved,
    solve_sylvester_eig,
    symmetric_part,
    vertical_vector,
)

Tensors = tuple[torch.Tensor, ...]


class InvPoint(GLPoint):
    """The inv metric's formulas at a frozen ``(G, H)`` (module docstring)."""

    def factorise(self) -> None:
        _ = self._sylvester                 # eigendecompositions of the projection

    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        return (((u[0] @ self.inverse_g) * v[0]).sum((-2, -1))
                + ((u[1] @ self.inverse_h) * v[1]).sum((-2, -1)))

    def squared_norm(self, u: Tensors) -> torch.Tensor:
        # ||u_G E^{-T}||^2 + ||u_H F^{-T}||^2 with S_G = E E^T, S_H = F F^T: a sum of squares,
        # accurate to rounding however ill-conditioned S is, unlike u S^{-1} u^T summed
        # (the Frobenius norm of each product, squared: no second factor-sized tensor)
        return (torch.linalg.vector_norm(u[0] @ self.inverse_factor_g.mT, dim=(-2, -1)).square()
                + torch.linalg.vector_norm(u[1] @ self.inverse_factor_h.mT,
                                           dim=(-2, -1)).square())

    def moment(self, u: Tensors) -> torch.Tensor:
        G, H = self.x
        return self.inverse_h @ (u[1].mT @ H) - (G.mT @ u[0]) @ self.inverse_g

    def vertical_norms_squared(self) -> torch.Tensor:
        d = self.diagonal
        return (d(self.gram_g).unsqueeze(-1) * d(self.inverse_g).unsqueeze(-2)
                + d(self.inverse_h).unsqueeze(-1) * d(self.gram_h).unsqueeze(-2))

    def gram_operator_terms(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Gram(L) = S_H^{-1} L K_H + K_G L S_G^{-1}
        inverse_g, inverse_h = self.work_inverses
        gram_g, gram_h = self._work_grams
        return [(inverse_h, gram_h), (gram_g, inverse_g)]

    @cached_property
    def _sylvester(self) -> tuple[torch.Tensor, ...]:
        """The eigen-solution of the Gram matrices of ``B_G = G F`` and ``B_H = H E`` and the
        inverse Cholesky factors ``E^{-1}``, ``F^{-1}``, all in the working dtype."""
        G, H = self._work_x
        chol_g, chol_h = self._work_cholesky
        b_g, b_h = G @ chol_h, H @ chol_g
        values_p, vectors_p = torch.linalg.eigh(b_g.mT @ b_g)
        values_q, vectors_q = torch.linalg.eigh(b_h.mT @ b_h)
        return (vectors_p, vectors_q, values_p.unsqueeze(-1) + values_q.unsqueeze(-2),
                self._inverse_factor(chol_g), self._inverse_factor(chol_h))

    def vertical_projection(self, u: Tensors) -> Tensors:
        vectors_p, vectors_q, denominators, inverse_e, inverse_f = self._sylvester
        chol_g, chol_h = self._work_cholesky
        G, H = self.x
        # F^{-1} C E^{-T} with C = u_H^T H S_G - S_H G^T u_G is
        # F^{-1} (u_H^T H) E - F^T (G^T u_G) E^{-T}: the two products with the factors' n rows
        # come first (in the point's dtype, as everywhere a tangent meets a factor) and the
        # rest is h x h algebra in the working dtype
        cross_h = (u[1].mT @ H).to(self.work_dtype)
        cross_g = (G.mT @ u[0]).to(self.work_dtype)
        rhs = inverse_f @ cross_h @ chol_g - chol_h.mT @ cross_g @ inverse_e.mT
        y = solve_sylvester_eig(vectors_p, vectors_q, denominators, rhs)
        # V(L) with L = F Y E^T: (-B_G Y E^T, B_H Y^T F^T) = (-G L, H L^T), two n-row products
        return vertical_vector(G, H, self._cast(chol_h @ y @ chol_g.mT))

    def raise_index(self, egrad: Tensors) -> Tensors:
        return egrad[0] @ self.relaxed_g, egrad[1] @ self.relaxed_h

    def raise_roots(self) -> tuple[torch.Tensor, torch.Tensor]:
        # P_F = S_F = R_F^T R_F: C_F = R_F^T
        root_g, root_h = self.gram_roots
        return root_g.mT, root_h.mT

    coefficient_christoffel = True

    def christoffel_coefficients(self, reductions: list[tuple[torch.Tensor, torch.Tensor]]
                                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Gamma_F(u, u) = -u_F S_F^{-1} D_F(u_F) + F S_F^{-1} u_F^T u_F for F = G, H
        return [(-(inverse @ moved_), -(inverse @ square))
                for (moved_, square), inverse in zip(reductions,
                                                     (self.inverse_g, self.inverse_h),
                                                     strict=True)]

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        if v is None:
            return super().christoffel(u)          # the coefficient form above
        G, H = self.x
        gammas = []
        for i, (factor, inverse) in enumerate(((G, self.inverse_g), (H, self.inverse_h))):
            gammas.append(-0.5 * ((u[i] @ inverse) @ moved(v[i], factor)
                                  + (v[i] @ inverse) @ moved(u[i], factor))
                          + (factor @ inverse) @ symmetric_part(u[i].mT @ v[i]))
        return tuple(gammas)

    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        # rows of u_G have the metric S_G^{-1}, so covariance S_G = G^T G + eps I: u_G =
        # W G + sqrt(eps) Z, equivariant (u_G A^{-1} at G A^{-1} from the same draws)
        G, H = self.x
        return (self.mixed_noise(G.shape[-2], G, generator),
                self.mixed_noise(H.shape[-2], H, generator))


class InvMetric(GLMetric):
    """``Tr(S_G^{-1} u_G^T v_G + S_H^{-1} u_H^T v_H)``: GL(h)-invariant at ``eps = 0``."""

    name = "inv"
    point_type = InvPoint
