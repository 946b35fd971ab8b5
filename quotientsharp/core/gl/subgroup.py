"""Attention pairs modulo a subgroup of GL(h): the rotary quotient of query/key pairs.

With rotary embeddings only the centraliser of the rotations keeps the scores: a complex scalar
``[[a, -b], [b, a]]`` on each rotation plane and any matrix on the dimensions without rotation,
``GL(1, C)^{R/2} x GL(h - R)`` for ``R`` rotary dimensions (``docs/attention-variants.md``;
``derivations/rotary.py`` derives it with sympy). The points, metrics, index raising,
Christoffel contraction and geodesics are GL(h)'s; only the vertical space is smaller:
``V(X) = (-G X, H X^T)`` for ``X`` in the subalgebra, spanned by a Frobenius-orthonormal basis
``E_1..E_K`` (``K = R + (h - R)^2``). The vertical part of ``u`` is ``V(L)``,
``L = sum_k c_k E_k`` with ``sum_l <E_k, Gram(E_l)>_F c_l = <E_k, M(u)>_F`` for the metric's
moment ``M`` and Gram operator (:mod:`.point`): a ``K x K`` SPD system per pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property

import torch

from quotientsharp.core.gl.point import GLMetric, GLPoint
from quotientsharp.core.gl.quotient import GLQuotient, check_condition, haar_orthogonal
from quotientsharp.core.reference import largest_normalised_product

Tensors = tuple[torch.Tensor, ...]

LAYOUTS = ("rotate_half", "interleaved")


def rotary_planes(head_dim: int, rotary_dims: int, layout: str) -> list[tuple[int, int]]:
    """The dimension pairs ``(i, j)`` rotated together, one per frequency."""
    half = rotary_dims // 2
    if layout == "rotate_half":
        return [(d, d + half) for d in range(half)]
    return [(2 * d, 2 * d + 1) for d in range(half)]


def rotary_algebra_basis(head_dim: int, rotary_dims: int, layout: str,
                         dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A Frobenius-orthonormal basis of the centraliser's Lie algebra, ``shape=[K, h, h]``.

    Per plane ``(i, j)``: ``(e_i e_i^T + e_j e_j^T) / sqrt 2`` (the real part of a complex
    scalar) and ``(e_j e_i^T - e_i e_j^T) / sqrt 2`` (its imaginary part); then every
    ``e_a e_b^T`` with ``a, b >= rotary_dims`` (the GL block of the non-rotary dimensions).
    """
    elements = []
    root = 1.0 / math.sqrt(2.0)
    for i, j in rotary_planes(head_dim, rotary_dims, layout):
        real = torch.zeros(head_dim, head_dim, dtype=dtype)
        real[i, i] = real[j, j] = root
        imaginary = torch.zeros(head_dim, head_dim, dtype=dtype)
        imaginary[j, i], imaginary[i, j] = root, -root
        elements += [real, imaginary]
    for a in range(rotary_dims, head_dim):
        for b in range(rotary_dims, head_dim):
            unit = torch.zeros(head_dim, head_dim, dtype=dtype)
            unit[a, b] = 1.0
            elements.append(unit)
    return torch.stack(elements)


class SubgroupPoint(GLPoint):
    """The vertical space of a subgroup at a frozen ``(G, H)``; combined with a metric's point.

    The metric's closed forms (inner, moment, Gram operator, raising, Christoffel) come from
    the metric class this is mixed into; this class replaces the projections.
    """

    quotient: RotaryQuotient

    def factorise(self) -> None:
        # the subgroup's projections replace the metric's, and their eigendecompositions
        _ = self._subgroup_cholesky

    @cached_property
    def _basis(self) -> torch.Tensor:
        """The algebra basis ``[K, h, h]`` on the point's device, in the working dtype."""
        return self.quotient.algebra_basis.to(device=self.x[0].device, dtype=self.work_dtype)

    @cached_property
    def _subgroup_cholesky(self) -> torch.Tensor:
        """Cholesky factor of ``<E_k, Gram(E_l)>_F``, ``shape=[..., K, K]`` (working dtype).

        ``<E_k, A E_l B>_F = sum c_k c_l A[i, a] B[b, j]`` over the nonzero entries ``c_k`` at
        ``(i, j)`` of ``E_k`` and ``c_l`` at ``(a, b)`` of ``E_l``: gathers over the sparse basis.
        """
        owner, rows, cols, coefficients = self.quotient.algebra_sparse
        device = self.x[0].device
        owner, rows, cols = owner.to(device), rows.to(device), cols.to(device)
        coefficients = coefficients.to(device=device, dtype=self.work_dtype)
        K = self.quotient.algebra_basis.shape[0]
        weights = coefficients[:, None] * coefficients[None, :]               # [Z, Z]
        # A[i_p, a_q] B[b_q, j_p] for every pair (p, q) of nonzero entries, summed over terms
        terms = [a[..., rows[:, None], rows[None, :]] * b[..., cols[None, :], cols[:, None]]
                 for a, b in self.gram_operator_terms()]
        pairs = sum(terms[1:], terms[0]) * weights
        batch = pairs.shape[:-2]
        flat_index = (owner[:, None] * K + owner[None, :]).reshape(-1)
        matrix = torch.zeros(*batch, K * K, dtype=self.work_dtype, device=device)
        matrix.index_add_(-1, flat_index, pairs.reshape(*batch, -1))
        matrix = matrix.reshape(*batch, K, K)
        matrix = 0.5 * (matrix + matrix.mT)
        return torch.linalg.cholesky(matrix)

    def _coordinates(self, moment: torch.Tensor) -> torch.Tensor:
        """``<E_k, M>_F`` for every basis element, ``shape=[..., K]`` (working dtype)."""
        return torch.einsum("kij,...ij->...k", self._basis, moment.to(self.work_dtype))

    def vertical_projection(self, u: Tensors) -> Tensors:
        rhs = self._coordinates(self.moment(u))
        chol = self._subgroup_cholesky
        chol = chol.expand(*rhs.shape[:-1], *chol.shape[-2:])
        coefficients = torch.cholesky_solve(rhs.unsqueeze(-1), chol).squeeze(-1)
        lagrange = torch.einsum("...k,kij->...ij", coefficients, self._basis)
        return self.vertical(self._cast(lagrange))

    def vertical_norms_squared(self) -> torch.Tensor:
        chol = self._subgroup_cholesky
        return self._cast(chol.square().sum(-1))          # diag(C C^T) = ||V(E_k)||^2

    def horizontality_error(self, u: Tensors) -> torch.Tensor:
        """``max_k |<V(E_k), u>| / (||V(E_k)|| ||u||)`` over the subalgebra's basis."""
        return largest_normalised_product(self._cast(self._coordinates(self.moment(u))),
                                          self.vertical_norms_squared().clamp_min(0).sqrt(),
                                          self.norm(u))


_POINT_TYPES: dict[type[GLPoint], type[GLPoint]] = {}


def subgroup_point_type(metric_point: type[GLPoint]) -> type[GLPoint]:
    """The frozen-point class of ``metric_point``'s metric with a subgroup's vertical space."""
    if metric_point not in _POINT_TYPES:
        _POINT_TYPES[metric_point] = type(f"Subgroup{metric_point.__name__}",
                                          (SubgroupPoint, metric_point), {})
    return _POINT_TYPES[metric_point]


class RotaryQuotient(GLQuotient):
    """Query/key pairs ``(G, H)`` with rotary embeddings, modulo the rotations' centraliser.

    Parameters
    ----------
    metric, eps
        As for :class:`~quotientsharp.GLQuotient` (the metric on the total space).
    head_dim
        ``h``.
    rotary_dims
        Number of rotated dimensions ``R`` (even; default ``h``: all of them, as in Llama).
        GPT-NeoX's partial rotary uses ``R = int(h * rotary_pct)``.
    layout
        ``"rotate_half"`` (HF Llama, Qwen2, Mistral, GPT-NeoX: plane ``d`` is dims
        ``(d, d + R/2)``) or ``"interleaved"`` (GPT-J: dims ``(2d, 2d + 1)``).
    n, m
        Optional rows of ``G`` and ``H`` for :meth:`random_point`.
    """

    #: The Frobenius-orthonormal basis ``E_1..E_K`` of the subalgebra, ``shape=[K, h, h]``.
    algebra_basis: torch.Tensor
    #: The basis as its nonzero entries: (element index, row, column, value), ``shape=[Z]``.
    algebra_sparse: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

    def __init__(self, metric: str | GLMetric = "inv", eps: float = 0.0, *, head_dim: int,
                 rotary_dims: int | None = None, layout: str = "rotate_half",
                 n: int | None = None, m: int | None = None) -> None:
        head_dim = int(head_dim)
        rotary_dims = head_dim if rotary_dims is None else int(rotary_dims)
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        if not 0 <= rotary_dims <= head_dim or rotary_dims % 2:
            raise ValueError(f"rotary_dims must be even and in [0, head_dim={head_dim}], got "
                             f"{rotary_dims}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if (n is None) != (m is None):
            raise ValueError(f"pass both n and m or neither, got n={n}, m={m}")
        super().__init__(metric, eps, n=n, m=m, h=None if n is None else head_dim)
        self.head_dim, self.rotary_dims, self.layout = head_dim, rotary_dims, layout
        self.algebra_basis = rotary_algebra_basis(head_dim, rotary_dims, layout)
        owner, rows, cols = self.algebra_basis.nonzero(as_tuple=True)
        self.algebra_sparse = (owner, rows, cols, self.algebra_basis[owner, rows, cols])
        self.name = f"rotary-{self.metric.name}"
        self.check_shapes = ((head_dim + 2, head_dim), (head_dim + 1, head_dim))

    @property
    def group_name(self) -> str:
        """The symmetry group, e.g. ``"GL(1,C)^32"`` or ``"GL(1,C)^8 x GL(16)"``."""
        parts = []
        if self.rotary_dims:
            parts.append(f"GL(1,C)^{self.rotary_dims // 2}")
        if self.rotary_dims < self.head_dim:
            parts.append(f"GL({self.head_dim - self.rotary_dims})")
        return " x ".join(parts)

    def _check_head(self, x: Tensors, name: str = "x") -> None:
        self._check_head_dims(x, name)
        if x[0].shape[-1] != self.head_dim:
            raise ValueError(f"{name} has head dimension {x[0].shape[-1]}, this rotary quotient "
                             f"was built for head_dim={self.head_dim}")

    def frozen_point(self, x: Tensors, name: str = "x") -> GLPoint:
        self._check_head(x, name)
        return subgroup_point_type(self.metric.point_type)(self, x, name)

    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        return (self.algebra_basis.shape[0],)

    def group_shape(self, x: Tensors) -> tuple[int, ...]:
        return (self.head_dim, self.head_dim)

    def algebra_element(self, a: torch.Tensor) -> torch.Tensor:
        """``X = sum_k a_k E_k``, ``shape=[..., h, h]``, of coordinates ``a``,
        ``shape=[..., K]``."""
        basis = self.algebra_basis.to(device=a.device, dtype=a.dtype)
        return torch.einsum("...k,kij->...ij", a, basis)

    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        """``(-G X, H X^T)`` for ``X = sum_k a_k E_k``, ``a`` of ``shape=[..., K]``."""
        self._check_head(x)
        if not isinstance(a, torch.Tensor) or a.shape[-1:] != self.algebra_basis.shape[:1]:
            raise ValueError(f"a must end in the algebra dimension {self.algebra_basis.shape[0]}"
                             f", got {tuple(a.shape) if isinstance(a, torch.Tensor) else a!r}")
        return super().vertical(x, self.algebra_element(a))

    def group_exp(self, a: torch.Tensor) -> torch.Tensor:
        """``matrix_exp(sum_k a_k E_k)``: an element of the centraliser, ``shape=[..., h, h]``."""
        return torch.linalg.matrix_exp(self.algebra_element(a))

    def random_group_element(self, x: Tensors, *, scale: float = 1.0,
                             condition: float | None = None, kind: str | None = None,
                             generator: torch.Generator | None = None) -> torch.Tensor:
        """A random element of the centraliser, ``shape=[*batch, h, h]``.

        Without ``condition``: ``group_exp`` of ``scale`` times a Gaussian algebra element.
        With ``condition``: complex scalars of random phase on the planes and an SVD-built block
        on the non-rotary dimensions, all moduli and singular values log-spaced so that the
        element's condition number is ``condition``.
        """
        if kind not in (None, "exp", "svd"):
            raise ValueError(f"kind must be 'exp' or 'svd' for the rotary quotient, got {kind!r}")
        batch = torch.broadcast_shapes(x[0].shape[:-2], x[1].shape[:-2])
        dtype, device = x[0].dtype, x[0].device
        if condition is None and kind != "svd":
            a = torch.randn(*batch, self.algebra_basis.shape[0], generator=generator,
                            dtype=dtype, device=generator.device if generator else device)
            return self.group_exp(scale * a.to(device))
        condition = check_condition(condition)
        planes = rotary_planes(self.head_dim, self.rotary_dims, self.layout)
        rest = self.head_dim - self.rotary_dims
        count = len(planes) + rest
        exponents = (torch.linspace(-0.5, 0.5, count, dtype=torch.float64) if count > 1
                     else torch.zeros(1, dtype=torch.float64))
        values = scale * condition ** exponents[torch.randperm(count, generator=generator)]
        g = torch.zeros(*batch, self.head_dim, self.head_dim, dtype=torch.float64)
        for (i, j), modulus in zip(planes, values, strict=False):
            phase = 2 * math.pi * torch.rand(batch, generator=generator, dtype=torch.float64)
            g[..., i, i] = g[..., j, j] = modulus * torch.cos(phase)
            g[..., j, i] = modulus * torch.sin(phase)
            g[..., i, j] = -g[..., j, i]
        if rest:
            first = haar_orthogonal(batch, rest, generator, torch.float64, None)
            block = first * values[len(planes):] @ haar_orthogonal(batch, rest, generator,
                                                                   torch.float64, None).mT
            g[..., self.rotary_dims:, self.rotary_dims:] = block
        return g.to(dtype=dtype, device=device)

    def random_point(self, batch_shape: Sequence[int] = (), *,
                     shapes: Sequence[Sequence[int]] | None = None,
                     generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> Tensors:
        return super().random_point(batch_shape, shapes=shapes or self.point_shapes
                                    or self.check_shapes, generator=generator, dtype=dtype,
                                    device=device)

    def extra_repr(self) -> str:
        return (f"metric={self.metric.name!r}, eps={self.eps}, head_dim={self.head_dim}, "
                f"rotary_dims={self.rotary_dims}, layout={self.layout!r}")
