"""The GL(h) quotient of attention factor pairs ``(G, H)``, seen by the network only as ``G H^T``.

``A`` in GL(h) acts by ``(G A^{-1}, H A^T)``, tangent vectors likewise, and the algebra element
``X`` generates the vertical vector ``(-G X, H X^T)``; leading dimensions are batch dimensions,
so all heads of one shape go through one call. Each metric's formulas are in its own module:
:mod:`.inv`, :mod:`.mix`, :mod:`.euclidean`.

Degenerate points. With ``eps = 0``, inv and mix need full-rank factors; a rank-deficient factor
is a ``ValueError`` suggesting ``eps > 0`` (a test on values, which
:func:`quotientsharp.value_checks` can switch off; the free shape test ``h > n`` or ``h > m``
always runs). When both factors are rank-deficient (``eps > 0`` or euclidean) the vertical
vectors are linearly dependent (``X = a b^T`` with ``G a = 0``, ``H b = 0`` generates zero); the
projections stay well defined, through the pseudo-inverse of the Gram operator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quotientsharp.core.gl.euclidean import EuclideanMetric
from quotientsharp.core.gl.inv import InvMetric
from quotientsharp.core.gl.mix import MixMetric
from quotientsharp.core.gl.point import GLMetric, GLPoint, vertical_vector
from quotientsharp.core.metric import MetricRegistry
from quotientsharp.core.quotient import MetricFamilyQuotient
from quotientsharp.core.validation import value_checks_enabled

Tensors = tuple[torch.Tensor, ...]

#: The built-in metrics, the registry :class:`GLQuotient` resolves ``metric=`` in.
GL_METRICS: MetricRegistry[GLMetric] = MetricRegistry("GLQuotient", GLMetric,
                                                      [InvMetric, MixMetric, EuclideanMetric])
#: The built-in metrics by name (a copy of ``GL_METRICS.types``).
METRIC_TYPES: dict[str, type[GLMetric]] = dict(GL_METRICS.types)
METRICS = GL_METRICS.names
GROUP_ELEMENT_KINDS = ("exp", "svd", "gaussian")


def check_condition(condition: float | None) -> float:
    """A condition number as a float: finite and ``>= 1`` (``None``: 1)."""
    condition = 1.0 if condition is None else float(condition)
    if not condition >= 1.0 or condition == float("inf"):
        raise ValueError(f"condition must be a finite number >= 1, got {condition}")
    return condition


def haar_orthogonal(batch: Sequence[int], h: int, generator: torch.Generator | None,
                    dtype: torch.dtype | None, device: torch.device | None) -> torch.Tensor:
    """A Haar-random orthogonal ``h x h`` matrix per batch element, ``shape=[*batch, h, h]``."""
    q, r = torch.linalg.qr(torch.randn(*batch, h, h, generator=generator, dtype=dtype,
                                       device=device))
    # fixing the signs of R's diagonal makes Q Haar-distributed
    signs = torch.sign(r.diagonal(dim1=-2, dim2=-1))
    return q * torch.where(signs == 0, torch.ones_like(signs), signs).unsqueeze(-2)


class GLQuotient(MetricFamilyQuotient):
    """Attention factor pairs ``(G, H)`` modulo ``GL(h)``, ``(G, H) ~ (G A^{-1}, H A^T)``.

    Parameters
    ----------
    metric
        A :class:`~quotientsharp.core.gl.GLMetric` or its name: ``"inv"``
        (:class:`~quotientsharp.core.gl.inv.InvMetric`), ``"mix"``
        (:class:`~quotientsharp.core.gl.mix.MixMetric`) or ``"euclidean"``
        (:class:`~quotientsharp.core.gl.euclidean.EuclideanMetric`).
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
    metric
        The selected :class:`~quotientsharp.core.gl.GLMetric`; ``metric.name`` is its
        name.
    invariant
        Whether the metric is invariant under the whole group (``True`` for inv and mix with
        ``eps = 0``), i.e. whether it descends to the quotient.

    Notes
    -----
    The instance holds no state that depends on a point. Each quotient-level operation freezes
    its point (:meth:`at`), which factorises the Gram matrices once; a caller applying several
    operations at one point keeps ``frozen = quotient.at(x)`` and calls its methods, which reuse
    the factorisations (the sharpness engine does this at ``theta``).
    """

    metrics = GL_METRICS
    metric: GLMetric
    point_ndims = (2, 2)
    #: Default ``((n, h), (m, h))`` of the random points of
    #: :func:`quotientsharp.core.checks.check_all`
    #: for an instance built without ``n, m, h``.
    check_shapes = ((5, 3), (4, 3))

    def __init__(self, metric: str | GLMetric = "inv", eps: float = 0.0, *, n: int | None = None,
                 m: int | None = None, h: int | None = None) -> None:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"eps must be a number >= 0, got {type(eps).__name__} {eps!r}")
        eps = float(eps)
        if not eps >= 0.0 or eps == float("inf"):
            raise ValueError(f"eps must be a finite number >= 0, got {eps}")
        dims = (n, m, h)
        if any(d is None for d in dims) and not all(d is None for d in dims):
            raise ValueError(f"pass all of n, m, h or none of them, got n={n}, m={m}, h={h}")
        shapes = None if n is None or m is None or h is None else ((n, h), (m, h))
        super().__init__(metric, shapes)
        self.eps = eps
        self.name = f"gl-{self.metric.name}"

    @property
    def invariant(self) -> bool:
        """Whether the metric descends to the quotient: a GL(h)-invariant metric at ``eps = 0``
        (``eps > 0`` keeps invariance under the orthogonal subgroup only)."""
        return self.metric.group_invariant and self.eps == 0.0

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

    def rank_error(self, which: str, name: str, rows: int, h: int,
                   dtype: torch.dtype) -> ValueError:
        """The error for a singular Gram matrix of factor ``which`` (``"g"`` or ``"h"``)."""
        factor = "G" if which == "g" else "H"
        index = 0 if which == "g" else 1
        if self.eps == 0.0:
            return ValueError(
                f"{name}[{index}] ({factor}, {rows} x {h}) is rank-deficient (a zero or linearly "
                f"dependent column, or more columns than rows) or singular to working precision "
                f"in {dtype}, so {factor}^T {factor} is singular and the {self.metric.name} metric "
                f"is undefined there; use eps > 0, e.g. "
                f"GLQuotient({self.metric.name!r}, eps=1e-6), which relaxes {factor}^T {factor} to "
                f"{factor}^T {factor} + eps I"
            )
        return ValueError(
            f"eps={self.eps} is too small relative to {name}[{index}] ({factor}): "
            f"{factor}^T {factor} + eps I is numerically singular; use a larger eps"
        )

    # ------------------------------------------------------------------ definition
    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        h = x[0].shape[-1]
        return (h, h)

    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        """Vertical vector ``(-G X, H X^T)`` of ``X = a``, ``shape=[..., h, h]``."""
        self._check_head_dims(x)
        self._check_algebra(x, a, "a")
        return vertical_vector(x[0], x[1], a)

    def frozen_point(self, x: Tensors, name: str = "x") -> GLPoint:
        """The metric's formulas at ``(G, H)`` (Gram matrices factorised once, rank checked)."""
        self._check_head_dims(x, name)
        return self.metric.point_type(self, x, name)

    def at(self, x: Tensors, name: str = "x") -> GLPoint:
        return self.frozen_point(self.check_point(x, name), name)

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
        return self.act(u, g)

    def group_exp(self, a: torch.Tensor) -> torch.Tensor:
        """Matrix exponential of ``a``, ``shape=[..., h, h]``."""
        return torch.linalg.matrix_exp(a)

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
        if self.metric.point_type.needs_factors and self.eps == 0.0 and (n < h_g or m < h_g):
            raise ValueError(f"shapes {resolved} give rank-deficient factors (h={h_g} > n or m), "
                             f"where the {self.metric.name} metric needs eps > 0")
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
        condition = check_condition(condition)
        exponents = (torch.linspace(-0.5, 0.5, h, dtype=dtype, device=device) if h > 1
                     else torch.zeros(1, dtype=dtype, device=device))
        singular = scale * torch.pow(torch.tensor(condition, dtype=dtype, device=device),
                                     exponents)
        first = haar_orthogonal(batch, h, generator, dtype, device)
        return first * singular @ haar_orthogonal(batch, h, generator, dtype, device).mT

    def extra_repr(self) -> str:
        return f"metric={self.metric.name!r}, eps={self.eps}"
