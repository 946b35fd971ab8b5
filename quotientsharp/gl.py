"""The GL(h) quotient of attention factor pairs ``(G, H)``, seen by the network only as ``G H^T``.

A point is a pair ``G``, ``shape=[..., n, h]``, and ``H``, ``shape=[..., m, h]`` (a query/key
or value/output pair of one attention head, SPEC section 3); leading dimensions are batch
dimensions, so all heads of all layers go through one call when stacked (pad nothing: heads of
different shapes need separate calls). ``A`` in GL(h) acts by ``(G A^{-1}, H A^T)``, tangent
vectors likewise, and the algebra element ``X`` in ``R^{h x h}`` generates the vertical vector
``(-G X, H X^T)``.

Notation: ``K_G = G^T G``, ``K_H = H^T H`` and the relaxed Gram matrices
``S_G = K_G + eps I``, ``S_H = K_H + eps I``. Metrics:

- ``euclidean``: ``Tr(u_G^T v_G + u_H^T v_H)`` (not invariant; has no Gram matrix, so ``eps``
  does not change it);
- ``inv``: ``Tr(S_G^{-1} u_G^T v_G + S_H^{-1} u_H^T v_H)``;
- ``mix``: ``Tr(S_H u_G^T v_G + S_G u_H^T v_H)``.

With ``eps = 0`` the inv and mix metrics are GL(h)-invariant and descend to the quotient; with
``eps > 0`` they are still metrics (the ones :meth:`GLQuotient.inner` defines, which every other
operation here is consistent with) but only invariant under the orthogonal subgroup.

Closed forms, derived for any ``eps >= 0`` (``derivations`` in the comments below). Write
``<V(X), u> = <X, M(u)>_F`` (the moment of ``u``) and ``Gram(L) = M(V(L))`` (the Gram operator of
the vertical space):

===========  ===============================================  =====================================
metric       ``M(u)``                                         ``Gram(L)``
===========  ===============================================  =====================================
euclidean    ``u_H^T H - G^T u_G``                            ``K_G L + L K_H``
inv          ``S_H^{-1} u_H^T H - G^T u_G S_G^{-1}``          ``S_H^{-1} L K_H + K_G L S_G^{-1}``
mix          ``S_G u_H^T H - G^T u_G S_H``                    ``S_G L K_H + K_G L S_H``
===========  ===============================================  =====================================

``u`` is horizontal iff ``M(u) = 0`` (for ``eps = 0`` these are SPEC's conditions, inv in its
corrected form ``u_G^T G H^T H = G^T G H^T u_H``). The vertical part of ``u`` is ``V(L)`` with
``Gram(L) = M(u)``, and the horizontal projection is ``(u_G + G L, u_H - H L^T)``:

- euclidean: the SPD-coefficient Sylvester equation ``K_G L + L K_H = M``;
- mix: with ``eps = 0`` the closed form ``L = (u_H^T H K_H^{-1} - K_G^{-1} G^T u_G) / 2``; with
  ``eps > 0`` the Gram operator is diagonal in the eigenbases of ``K_G`` (eigenvalues ``g``) and
  ``K_H`` (``k``) with eigenvalues ``2 g_i k_j + eps (g_i + k_j)``, an equally closed form;
- inv: multiplying by ``S_H`` on the left and ``S_G`` on the right gives the Sylvester equation
  ``(S_H K_G) L + L (K_H S_G) = u_H^T H S_G - S_H G^T u_G``, whose coefficients are products of
  SPD matrices and similar to SPD ones (for ``eps = 0`` it is SPEC's erratum equation
  ``A L^T + L^T A = B``, transposed), solved in the SPD form that the Cholesky factors of
  ``S_H`` and ``S_G`` give (the similarity behind
  :func:`~quotientsharp.linalg.solve_sylvester_product_spd`).

The metric-raised gradient is ``(dL/dG S_G, dL/dH S_H)`` (inv) and
``(dL/dG S_H^{-1}, dL/dH S_G^{-1})`` (mix). The Christoffel contractions are SPEC's with
``(G^T G)^{-1}`` replaced by ``S_G^{-1}``: ``eps`` is a constant shift, so the derivative of
``S_G`` is still ``dG^T G + G^T dG`` and the forms stay exact (the bilinear forms used here are
their polarisations). ``euclidean`` is flat (``Gamma = 0``).

Degenerate points. With ``eps = 0``, inv and mix need full-rank factors (``K_G``, ``K_H``
positive definite); a rank-deficient factor is reported as a ``ValueError`` suggesting
``eps > 0`` (value checks: see :func:`quotientsharp.value_checks`). With ``eps > 0`` (or the
euclidean metric) one rank-deficient factor is fine. When both factors are rank-deficient the
vertical vectors ``(-G X, H X^T)`` are linearly dependent (``X = a b^T`` with ``G a = 0``,
``H b = 0`` generates zero); the projections stay well defined and are computed with the
pseudo-inverse of the Gram operator. Inside ``value_checks(False)`` only the free shape test
(``h > n`` or ``h > m`` with ``eps = 0``) still runs: a rank-deficient point that the caller
did not validate beforehand then gives undefined, possibly non-finite, results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .linalg import solve_sylvester_eig, solve_sylvester_spd
from .quotient import SymmetryQuotient
from .validation import value_checks_enabled

Tensors = tuple[torch.Tensor, ...]

METRICS = ("inv", "mix", "euclidean")
GROUP_ELEMENT_KINDS = ("exp", "svd", "gaussian")


class GLGrams(NamedTuple):
    """Gram matrices of a point ``(G, H)`` and their factorisations, computed once per call.

    Attributes
    ----------
    gram_g, gram_h
        ``K_G = G^T G`` and ``K_H = H^T H``, ``shape=[..., h, h]``.
    relaxed_g, relaxed_h
        ``S_G = K_G + eps I`` and ``S_H = K_H + eps I`` (the same tensors as ``gram_*`` when
        ``eps = 0`` or for the euclidean metric).
    cholesky_g, cholesky_h
        Lower Cholesky factors of ``S_G`` and ``S_H`` (inv and mix only; ``None`` for euclidean).
    """

    gram_g: torch.Tensor
    gram_h: torch.Tensor
    relaxed_g: torch.Tensor
    relaxed_h: torch.Tensor
    cholesky_g: torch.Tensor | None
    cholesky_h: torch.Tensor | None


def _symmetric_part(a: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a + a.mT)


def _sum_trailing(a: torch.Tensor) -> torch.Tensor:
    return a.sum(dim=(-2, -1))


class GLQuotient(SymmetryQuotient):
    """Attention factor pairs ``(G, H)`` modulo ``GL(h)``, ``(G, H) ~ (G A^{-1}, H A^T)``.

    Parameters
    ----------
    metric
        ``"inv"``, ``"mix"`` or ``"euclidean"`` (see the module docstring).
    eps
        Relaxation ``G^T G -> G^T G + eps I`` (and for ``H``) used consistently by the metric
        and every operation; ``eps > 0`` allows rank-deficient factors but breaks exact
        invariance under non-orthogonal ``A``. The euclidean metric has no Gram matrix and is
        unaffected by ``eps``.
    n, m, h
        Optional shapes ``G: n x h`` and ``H: m x h``, used only by :meth:`random_point`
        (all three or none).

    Attributes
    ----------
    invariant
        Whether the metric is invariant under the whole group (``True`` for inv and mix with
        ``eps = 0``), i.e. whether it descends to the quotient.

    Notes
    -----
    The instance holds no state that depends on a point. Each operation computes the Gram
    matrices and their factorisations once; :meth:`gram_cache` returns them so that a caller
    applying several operations at one point can pass ``grams=`` and skip the recomputation
    (the caller is responsible for passing the grams of the same ``x``).
    """

    point_ndims = (2, 2)
    #: Default ``((n, h), (m, h))`` of the random points of :func:`quotientsharp.checks.check_all`
    #: for an instance built without ``n, m, h``.
    check_shapes = ((5, 3), (4, 3))

    def __init__(self, metric: str = "inv", eps: float = 0.0, *, n: int | None = None,
                 m: int | None = None, h: int | None = None) -> None:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        eps = float(eps)
        if not eps >= 0.0 or eps == float("inf"):
            raise ValueError(f"eps must be a finite number >= 0, got {eps}")
        dims = (n, m, h)
        if any(d is None for d in dims) and not all(d is None for d in dims):
            raise ValueError(f"pass all of n, m, h or none of them, got n={n}, m={m}, h={h}")
        shapes = None if n is None else ((n, h), (m, h))
        super().__init__(shapes)
        self.metric = metric
        self.eps = eps
        self.name = f"gl-{metric}"
        self.invariant = metric != "euclidean" and eps == 0.0

    # ------------------------------------------------------------------ validation
    def check_point(self, x: object, name: str = "x") -> Tensors:
        x = super().check_point(x, name)
        self._check_head_dims(x, name)
        return x

    @staticmethod
    def _check_head_dims(x: Tensors, name: str = "x") -> None:
        if x[0].shape[-1] != x[1].shape[-1]:
            raise ValueError(
                f"{name}[0] (G, shape {tuple(x[0].shape)}) and {name}[1] (H, shape "
                f"{tuple(x[1].shape)}) must have the same head dimension h (last dimension): "
                f"got h={x[0].shape[-1]} for G and h={x[1].shape[-1]} for H"
            )

    def _check_algebra(self, x: Tensors, a: torch.Tensor, name: str) -> None:
        h = x[0].shape[-1]
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(a).__name__}")
        if a.dim() < 2 or tuple(a.shape[-2:]) != (h, h):
            raise ValueError(f"{name} must end in shape ({h}, {h}) (h x h for h={h}), got "
                             f"{tuple(a.shape)}")

    def _rank_error(self, which: str, name: str, rows: int, h: int,
                    dtype: torch.dtype) -> ValueError:
        factor = "G" if which == "g" else "H"
        index = 0 if which == "g" else 1
        if self.eps == 0.0:
            return ValueError(
                f"{name}[{index}] ({factor}, {rows} x {h}) is rank-deficient (a zero or linearly "
                f"dependent column, or more columns than rows) or singular to working precision "
                f"in {dtype}, so {factor}^T {factor} is singular and the {self.metric} metric "
                f"is undefined there; use eps > 0, e.g. "
                f"GLQuotient({self.metric!r}, eps=1e-6), which relaxes {factor}^T {factor} to "
                f"{factor}^T {factor} + eps I"
            )
        return ValueError(
            f"eps={self.eps} is too small relative to {name}[{index}] ({factor}): "
            f"{factor}^T {factor} + eps I is numerically singular; use a larger eps"
        )

    def gram_cache(self, x: Tensors, name: str = "x") -> GLGrams:
        """Validate ``x`` and return its Gram matrices and factorisations (see :class:`GLGrams`)."""
        x = self.check_point(x, name)
        return self._grams(x, name)

    def _grams(self, x: Tensors, name: str = "x") -> GLGrams:
        """Gram matrices of ``x``; raises for rank-deficient factors where the metric needs them.

        The shape test (more columns than rows) is free and always runs; the test on values
        (Cholesky failure or a pivot at rounding level) syncs with the host and runs only while
        value checks are on.
        """
        self._check_head_dims(x, name)
        G, H = x
        gram_g, gram_h = G.mT @ G, H.mT @ H
        if self.metric == "euclidean":
            return GLGrams(gram_g, gram_h, gram_g, gram_h, None, None)
        h = G.shape[-1]
        if self.eps == 0.0:
            for which, rows in (("g", G.shape[-2]), ("h", H.shape[-2])):
                if rows < h:
                    raise self._rank_error(which, name, rows, h, G.dtype)
            relaxed_g, relaxed_h = gram_g, gram_h
        else:
            eye = torch.eye(h, dtype=G.dtype, device=G.device)
            relaxed_g, relaxed_h = gram_g + self.eps * eye, gram_h + self.eps * eye
        cholesky_g, info_g = torch.linalg.cholesky_ex(relaxed_g)
        cholesky_h, info_h = torch.linalg.cholesky_ex(relaxed_h)
        if value_checks_enabled() and not torch.compiler.is_compiling():
            # a Cholesky pivot p_k satisfies p_k^2 >= lambda_min; a pivot at rounding level of
            # the largest diagonal entry means the Gram matrix is singular to working precision
            tolerance = 8 * h * torch.finfo(G.dtype).eps
            flags = []
            for chol, info, relaxed in ((cholesky_g, info_g, relaxed_g),
                                        (cholesky_h, info_h, relaxed_h)):
                pivots = chol.diagonal(dim1=-2, dim2=-1).square().amin(-1)
                scale = relaxed.diagonal(dim1=-2, dim2=-1).amax(-1)
                flags.append(((info != 0) | ~(pivots > tolerance * scale)).any())
            bad = torch.stack(flags).tolist()
            for which, rows, is_bad in (("g", G.shape[-2], bad[0]), ("h", H.shape[-2], bad[1])):
                if is_bad:
                    raise self._rank_error(which, name, rows, h, G.dtype)
        return GLGrams(gram_g, gram_h, relaxed_g, relaxed_h, cholesky_g, cholesky_h)

    def _resolve(self, x: Tensors, u: object, grams: GLGrams | None,
                 u_name: str = "u") -> tuple[Tensors, Tensors, GLGrams]:
        x = self.check_point(x)
        u = self.check_tangent(x, u, name=u_name)
        return x, u, self._grams(x) if grams is None else grams

    # ------------------------------------------------------------------ definition
    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        h = x[0].shape[-1]
        return (h, h)

    def inner(self, x: Tensors, u: Tensors, v: Tensors, *,
              grams: GLGrams | None = None) -> torch.Tensor:
        """Metric ``<u, v>_x``, ``shape=[*batch]`` (see the module docstring).

        Only shapes and the rank of ``x`` are checked (this method is called inside
        ``torch.func`` transforms by :mod:`quotientsharp.reference`).
        """
        if self.metric == "euclidean":
            return _sum_trailing(u[0] * v[0]) + _sum_trailing(u[1] * v[1])
        grams = self._grams(x) if grams is None else grams
        cross_g = u[0].mT @ v[0]
        cross_h = u[1].mT @ v[1]
        if self.metric == "inv":
            # Tr(S^{-1} W) through the Cholesky factor: no explicit inverse
            return (torch.cholesky_solve(cross_g, grams.cholesky_g).diagonal(dim1=-2, dim2=-1)
                    .sum(-1)
                    + torch.cholesky_solve(cross_h, grams.cholesky_h).diagonal(dim1=-2, dim2=-1)
                    .sum(-1))
        return (_sum_trailing(grams.relaxed_h * cross_g.mT)
                + _sum_trailing(grams.relaxed_g * cross_h.mT))

    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        """Vertical vector ``(-G X, H X^T)`` of ``X = a``, ``shape=[..., h, h]``."""
        self._check_head_dims(x)
        self._check_algebra(x, a, "a")
        return -x[0] @ a, x[1] @ a.mT

    def _right_inverse(self, factor: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``factor @ g^{-1}`` by a solve, with a clear error for singular ``g``."""
        result, info = torch.linalg.solve_ex(g, factor, left=False)
        if value_checks_enabled() and not torch.compiler.is_compiling():
            if bool((info != 0).any()):
                raise ValueError("the group element g is singular (not in GL(h))")
        return result

    def act(self, x: Tensors, g: torch.Tensor) -> Tensors:
        """``(G A^{-1}, H A^T)`` for ``A = g`` in GL(h), ``shape=[..., h, h]``."""
        self._check_head_dims(x)
        self._check_algebra(x, g, "g")
        return self._right_inverse(x[0], g), x[1] @ g.mT

    def act_tangent(self, x: Tensors, u: Tensors, g: torch.Tensor) -> Tensors:
        """``(u_G A^{-1}, u_H A^T)``: the action is linear, so tangents move like points."""
        self._check_head_dims(x)
        self._check_algebra(x, g, "g")
        return self._right_inverse(u[0], g), u[1] @ g.mT

    def group_exp(self, a: torch.Tensor) -> torch.Tensor:
        """Matrix exponential of ``a``, ``shape=[..., h, h]``."""
        return torch.linalg.matrix_exp(a)

    # ------------------------------------------------------------------ closed forms
    def _moment(self, x: Tensors, u: Tensors, grams: GLGrams) -> torch.Tensor:
        """``M(u)`` with ``<V(X), u> = <X, M(u)>_F``, ``shape=[..., h, h]``."""
        G, H = x
        g_u = G.mT @ u[0]            # G^T u_G
        u_h = u[1].mT @ H            # u_H^T H
        if self.metric == "euclidean":
            return u_h - g_u
        if self.metric == "inv":
            # G^T u_G S_G^{-1} = (S_G^{-1} u_G^T G)^T
            return (torch.cholesky_solve(u_h, grams.cholesky_h)
                    - torch.cholesky_solve(g_u.mT, grams.cholesky_g).mT)
        return grams.relaxed_g @ u_h - g_u @ grams.relaxed_h

    def _vertical_part(self, x: Tensors, u: Tensors, grams: GLGrams) -> Tensors:
        """The vertical part ``V(L) = (-G L, H L^T)`` of ``u``, where ``Gram(L) = M(u)``."""
        G, H = x
        if self.metric == "inv":
            return self._vertical_part_inv(x, u, grams)
        g_u = G.mT @ u[0]
        u_h = u[1].mT @ H
        if self.metric == "euclidean":
            coeffs = solve_sylvester_spd(grams.gram_g, grams.gram_h, u_h - g_u)
        elif self.eps == 0.0:
            coeffs = 0.5 * (torch.cholesky_solve(u_h.mT, grams.cholesky_h).mT
                            - torch.cholesky_solve(g_u, grams.cholesky_g))
        else:
            eigvals_g, eigvecs_g = torch.linalg.eigh(grams.gram_g)
            eigvals_h, eigvecs_h = torch.linalg.eigh(grams.gram_h)
            # Gram matrices are PSD; eigh may return -O(eps) for a zero eigenvalue
            eigvals_g, eigvals_h = eigvals_g.clamp_min(0), eigvals_h.clamp_min(0)
            g_col, k_row = eigvals_g.unsqueeze(-1), eigvals_h.unsqueeze(-2)
            denominators = 2 * g_col * k_row + self.eps * (g_col + k_row)
            moment = grams.relaxed_g @ u_h - g_u @ grams.relaxed_h
            coeffs = solve_sylvester_eig(eigvecs_g, eigvecs_h, denominators, moment)
        return -G @ coeffs, H @ coeffs.mT

    @staticmethod
    def _vertical_part_inv(x: Tensors, u: Tensors, grams: GLGrams) -> Tensors:
        """Vertical part for inv: ``(S_H K_G) L + L (K_H S_G) = u_H^T H S_G - S_H G^T u_G``.

        With Cholesky factors ``S_H = F F^T``, ``S_G = E E^T`` and ``L = F Y E^T`` this is the
        SPD Sylvester equation ``(F^T K_G F) Y + Y (E^T K_H E) = F^{-1} C E^{-T}`` (the
        similarity of SPEC, with Cholesky factors for square roots; see
        :func:`~quotientsharp.linalg.solve_sylvester_product_spd`). Every matrix is formed from
        the products ``B_G = G F`` and ``B_H = H E`` rather than from ``K_G``, ``F``, ``E``
        separately: under the group action ``F -> A F``, ``E -> A^{-T} E`` (up to orthogonal
        factors), so ``B_G``, ``B_H`` and the coefficients are invariant and an ill-conditioned
        ``A`` costs accuracy only once, not squared.
        """
        G, H = x
        factor_h, factor_g = grams.cholesky_h, grams.cholesky_g
        b_g = G @ factor_h
        b_h = H @ factor_g
        # u_G E^{-T} and u_H F^{-T}: right triangular solves
        u_g_scaled = torch.linalg.solve_triangular(factor_g.mT, u[0], upper=True, left=False)
        u_h_scaled = torch.linalg.solve_triangular(factor_h.mT, u[1], upper=True, left=False)
        rhs = u_h_scaled.mT @ b_h - b_g.mT @ u_g_scaled
        coeffs = solve_sylvester_spd(b_g.mT @ b_g, b_h.mT @ b_h, rhs)
        # G L = B_G Y E^T and H L^T = B_H Y^T F^T
        return -(b_g @ coeffs) @ factor_g.mT, (b_h @ coeffs.mT) @ factor_h.mT

    def vertical_projection(self, x: Tensors, u: Tensors, *,
                            grams: GLGrams | None = None) -> Tensors:
        x, u, grams = self._resolve(x, u, grams)
        return self._vertical_part(x, u, grams)

    def horizontal_projection(self, x: Tensors, u: Tensors, *,
                              grams: GLGrams | None = None) -> Tensors:
        x, u, grams = self._resolve(x, u, grams)
        vertical = self._vertical_part(x, u, grams)
        return u[0] - vertical[0], u[1] - vertical[1]

    def horizontality_error(self, x: Tensors, u: Tensors, *,
                            grams: GLGrams | None = None) -> torch.Tensor:
        """``max_{k,l} |<V_kl, u>| / (||V_kl|| ||u||)`` over the basis ``E_kl`` of gl(h).

        The same quantity as :func:`quotientsharp.reference.horizontality_error`, in closed
        form: ``<V_kl, u> = M(u)_kl`` and ``||V_kl||^2 = Gram(E_kl)_kl``, which only needs the
        diagonals of the Gram matrices (and of ``S^{-1}`` for inv). Zero exactly for horizontal
        ``u``, in ``[0, 1]``, unchanged when ``u`` is rescaled. ``shape=[*batch]``.
        """
        x, u, grams = self._resolve(x, u, grams)
        moment = self._moment(x, u, grams)

        def diag(a: torch.Tensor) -> torch.Tensor:
            return a.diagonal(dim1=-2, dim2=-1)

        k_g, k_h = diag(grams.gram_g), diag(grams.gram_h)
        if self.metric == "euclidean":
            squared = k_g.unsqueeze(-1) + k_h.unsqueeze(-2)
        elif self.metric == "inv":
            inv_g = diag(torch.cholesky_inverse(grams.cholesky_g))
            inv_h = diag(torch.cholesky_inverse(grams.cholesky_h))
            squared = (k_g.unsqueeze(-1) * inv_g.unsqueeze(-2)
                       + inv_h.unsqueeze(-1) * k_h.unsqueeze(-2))
        else:
            s_g, s_h = diag(grams.relaxed_g), diag(grams.relaxed_h)
            squared = k_g.unsqueeze(-1) * s_h.unsqueeze(-2) + s_g.unsqueeze(-1) * k_h.unsqueeze(-2)
        norm_u = self.inner(x, u, u, grams=grams).clamp_min(0).sqrt()
        denominators = squared.clamp_min(0).sqrt() * norm_u.unsqueeze(-1).unsqueeze(-1)
        tiny = torch.finfo(moment.dtype).tiny
        return (moment.abs() / denominators.clamp_min(tiny)).amax(dim=(-2, -1))

    def euclidean_to_riemannian_gradient(self, x: Tensors, egrad: Tensors, *,
                                         grams: GLGrams | None = None) -> Tensors:
        x, egrad, grams = self._resolve(x, egrad, grams, u_name="egrad")
        if self.metric == "euclidean":
            raised = egrad
        elif self.metric == "inv":
            raised = egrad[0] @ grams.relaxed_g, egrad[1] @ grams.relaxed_h
        else:
            # e S^{-1} = (S^{-1} e^T)^T
            raised = (torch.cholesky_solve(egrad[0].mT, grams.cholesky_h).mT,
                      torch.cholesky_solve(egrad[1].mT, grams.cholesky_g).mT)
        vertical = self._vertical_part(x, raised, grams)
        return raised[0] - vertical[0], raised[1] - vertical[1]

    def christoffel(self, x: Tensors, u: Tensors, v: Tensors | None = None, *,
                    grams: GLGrams | None = None) -> Tensors:
        """Christoffel contraction ``Gamma_x(u, v)``, symmetric and bilinear in ``(u, v)``.

        ``Gamma(u, v)`` is the polarisation of SPEC's ``Gamma(xi, xi)`` (with ``S_G``, ``S_H``
        for the Gram matrices). With ``D_G(w) = w^T G + G^T w``, ``sym(W) = (W + W^T) / 2``:

        - inv: ``Gamma_G = -(u_G S_G^{-1} D_G(v) + v_G S_G^{-1} D_G(u)) / 2
          + G S_G^{-1} sym(u_G^T v_G)`` (``H`` likewise);
        - mix: ``Gamma_G = (u_G D_H(v) + v_G D_H(u)) S_H^{-1} / 2 - G sym(u_H^T v_H) S_H^{-1}``,
          ``Gamma_H`` with ``G`` and ``H`` exchanged;
        - euclidean: ``0``.
        """
        x, u, grams = self._resolve(x, u, grams)
        v = u if v is None else self.check_tangent(x, v, name="v")
        if self.metric == "euclidean":
            shapes = [torch.broadcast_shapes(a.shape, b.shape, c.shape)
                      for a, b, c in zip(x, u, v, strict=True)]
            return tuple(torch.zeros(s, dtype=x[0].dtype, device=x[0].device) for s in shapes)
        G, H = x

        def moved(w: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
            cross = w.mT @ factor
            return cross + cross.mT

        d_g_u, d_g_v = moved(u[0], G), moved(v[0], G)
        d_h_u, d_h_v = moved(u[1], H), moved(v[1], H)
        sym_g = _symmetric_part(u[0].mT @ v[0])
        sym_h = _symmetric_part(u[1].mT @ v[1])
        chol_g, chol_h = grams.cholesky_g, grams.cholesky_h
        if self.metric == "inv":
            gamma_g = (-0.5 * (u[0] @ torch.cholesky_solve(d_g_v, chol_g)
                               + v[0] @ torch.cholesky_solve(d_g_u, chol_g))
                       + G @ torch.cholesky_solve(sym_g, chol_g))
            gamma_h = (-0.5 * (u[1] @ torch.cholesky_solve(d_h_v, chol_h)
                               + v[1] @ torch.cholesky_solve(d_h_u, chol_h))
                       + H @ torch.cholesky_solve(sym_h, chol_h))
            return gamma_g, gamma_h
        # right multiplication by S^{-1} of a symmetric W: W S^{-1} = (S^{-1} W)^T
        gamma_g = (0.5 * (u[0] @ torch.cholesky_solve(d_h_v, chol_h).mT
                          + v[0] @ torch.cholesky_solve(d_h_u, chol_h).mT)
                   - G @ torch.cholesky_solve(sym_h, chol_h).mT)
        gamma_h = (0.5 * (u[1] @ torch.cholesky_solve(d_g_v, chol_g).mT
                          + v[1] @ torch.cholesky_solve(d_g_u, chol_g).mT)
                   - H @ torch.cholesky_solve(sym_g, chol_g).mT)
        return gamma_g, gamma_h

    # ------------------------------------------------------------------ sampling
    def random_point(self, batch_shape: Sequence[int] = (), *,
                     shapes: Sequence[Sequence[int]] | None = None,
                     generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> Tensors:
        """Standard Gaussian factors, ``G: [*batch_shape, n, h]``, ``H: [*batch_shape, m, h]``.

        Full rank with probability one when ``n >= h`` and ``m >= h``; otherwise (only allowed
        with ``eps > 0`` or the euclidean metric) rank ``min(n, h)`` and ``min(m, h)``.
        """
        resolved = self._shapes(shapes)
        if len(resolved) != 2 or any(len(s) != 2 for s in resolved):
            raise ValueError(f"shapes must be ((n, h), (m, h)), got {resolved}")
        (n, h_g), (m, h_h) = resolved
        if h_g != h_h:
            raise ValueError(f"shapes must share the head dimension h, got {resolved}")
        if self.metric != "euclidean" and self.eps == 0.0 and (n < h_g or m < h_g):
            raise ValueError(f"shapes {resolved} give rank-deficient factors (h={h_g} > n or m), "
                             f"where the {self.metric} metric needs eps > 0")
        return super().random_point(batch_shape, shapes=resolved, generator=generator,
                                    dtype=dtype, device=device)

    def random_group_element(self, x: Tensors, *, scale: float = 1.0,
                             condition: float | None = None, kind: str | None = None,
                             generator: torch.Generator | None = None) -> torch.Tensor:
        """A random invertible ``h x h`` matrix per batch element, ``shape=[*batch, h, h]``.

        Parameters
        ----------
        scale
            ``kind="exp"``: the algebra element is ``scale`` times a standard Gaussian;
            ``"svd"``: the geometric mean of the singular values; ``"gaussian"``: the factor
            ``a`` of ``a * N``.
        condition
            Condition number (``>= 1``) of an ``"svd"`` element; giving it selects ``"svd"``.
        kind
            ``"exp"`` (default without ``condition``): ``matrix_exp`` of a Gaussian, in the
            identity component. ``"svd"``: ``scale * U diag(s) V^T`` with Haar-random orthogonal
            ``U``, ``V`` (either determinant sign) and singular values ``s`` log-spaced from
            ``condition^{-1/2}`` to ``condition^{1/2}`` (so the condition number is exactly
            ``condition``; for ``h = 1`` every element has condition ``1``). ``"gaussian"``:
            ``a * N`` with ``N`` standard Gaussian, the reparametrisation of the paper's
            invariance study (invertible with probability one, condition number random).
        generator
            Random generator on the device of ``x``.
        """
        if kind is None:
            kind = "exp" if condition is None else "svd"
        if kind not in GROUP_ELEMENT_KINDS:
            raise ValueError(f"kind must be one of {GROUP_ELEMENT_KINDS}, got {kind!r}")
        if condition is not None and kind != "svd":
            raise ValueError(f"condition is only supported with kind='svd', got kind={kind!r}")
        if not scale > 0 and kind != "exp":
            raise ValueError(f"scale must be > 0 for kind={kind!r}, got {scale}")
        self._check_head_dims(x)
        batch = torch.broadcast_shapes(x[0].shape[:-2], x[1].shape[:-2])
        h = x[0].shape[-1]
        dtype, device = x[0].dtype, x[0].device
        if kind == "exp":
            return super().random_group_element(x, scale=scale, generator=generator)
        if kind == "gaussian":
            return scale * torch.randn(*batch, h, h, generator=generator, dtype=dtype,
                                       device=device)
        condition = 1.0 if condition is None else float(condition)
        if not condition >= 1.0 or condition == float("inf"):
            raise ValueError(f"condition must be a finite number >= 1, got {condition}")

        def haar_orthogonal() -> torch.Tensor:
            q, r = torch.linalg.qr(torch.randn(*batch, h, h, generator=generator, dtype=dtype,
                                               device=device))
            # fixing the signs of R's diagonal makes Q Haar-distributed
            signs = torch.sign(r.diagonal(dim1=-2, dim2=-1))
            return q * torch.where(signs == 0, torch.ones_like(signs), signs).unsqueeze(-2)

        if h == 1:
            exponents = torch.zeros(1, dtype=dtype, device=device)
        else:
            exponents = torch.linspace(-0.5, 0.5, h, dtype=dtype, device=device)
        singular = scale * torch.pow(torch.tensor(condition, dtype=dtype, device=device),
                                     exponents)
        return haar_orthogonal() * singular @ haar_orthogonal().mT

    def extra_repr(self) -> str:
        return f"metric={self.metric!r}, eps={self.eps}"


__all__ = ["GLGrams", "GLQuotient", "METRICS"]
