"""Parameters outside any symmetry: the trivial-group quotient with the metric ``diag(1 / c^2)``.

A point is any tuple of tensors ``w``; every tangent vector is horizontal. The metric is
``<u, v>_w = sum u v / c^2``:

- ``"adaptive"``: ``c = |w|``, the metric of adaptive sharpness (Kwon et al. 2021), invariant
  under the elementwise rescalings ``w -> a w``. Each coordinate is the flat line ``log |w|``:
  ``Gamma(u, v) = -u v / w``, the exact geodesic is ``w exp(t u / w)``, and the order-2 point
  is ``w + u + u^2 / (2 w)``;
- ``"euclidean"``: ``c = 1``, flat (``Gamma = 0``, straight geodesics).

Coordinates with ``c = 0`` (a zero weight under the adaptive metric) do not move and add nothing
to the norm, never NaN (``1 / c`` is taken as 0).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, ClassVar

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core.frozen import ClosedFormPoint
from quotientsharp.core.metric import Metric, MetricRegistry
from quotientsharp.core.quotient import MetricFamilyQuotient

Tensors = tuple[torch.Tensor, ...]


def safe_reciprocal(c: torch.Tensor, absolute: bool = False) -> torch.Tensor:
    """``1 / c`` (``1 / |c|`` with ``absolute``) where ``c != 0``, and ``0`` where ``c = 0``.

    Computed per call over nearly every parameter (the adaptive metric's ``1 / |w|``), so
    without autograd it makes one new tensor, written in place (the reciprocal, then the zeros
    filled in): the same values as the differentiable form, which keeps ``1 / 0`` out of the
    graph.
    """
    if torch.is_grad_enabled() and c.requires_grad:
        base = c.abs() if absolute else c
        return torch.where(base == 0, torch.zeros_like(base),
                           1.0 / base.masked_fill(base == 0, 1.0))
    inverse = c.abs().reciprocal_() if absolute else torch.reciprocal(c)
    return inverse.masked_fill_(c == 0, 0.0)


class OrderTwoAdaptivePath(torch.autograd.Function):
    """``p = w + t u + t^2 u^2 / (2 w)`` with its backward ``dp/du = t + t^2 u / w``, fused: two
    parameter-sized tuples forward and one backward, where autograd makes about six each way.
    Inputs: ``t``, the count ``k``, then ``w``, ``1 / w`` and ``u``, ``k`` tensors each."""

    @staticmethod
    def forward(ctx: Any, t: float, count: int, *tensors: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        base = list(tensors[:count])
        inverse = list(tensors[count:2 * count])
        u = list(tensors[2 * count:])
        ratio = torch._foreach_mul(u, inverse)                  # u / w
        point = torch._foreach_addcmul(base, u, ratio, value=0.5 * t * t)
        torch._foreach_add_(point, u, alpha=t)
        ctx.t, ctx.count = t, count
        ctx.save_for_backward(*ratio)
        return tuple(point)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        t, ratio = ctx.t, list(ctx.saved_tensors)
        scaled = list(grads) if t == 1.0 else torch._foreach_mul(list(grads), t)
        du = torch._foreach_addcmul(scaled, list(grads), ratio, value=t * t)
        return (None, None, *([None] * (2 * ctx.count)), *du)


class AdaptivePoint(ClosedFormPoint):
    """The metric ``diag(1 / c^2)`` at frozen parameters ``w`` (module docstring): ``c = |w|``
    here, ``c = 1`` in :class:`AdaptiveEuclideanPoint`.

    Both scales share every formula below (``c = 1`` drops the factor ``1 / c`` and the
    curvature), so the scale is a class constant of the metric's point class, :attr:`unit`,
    rather than a second copy of each formula.
    """

    new_gradients = True

    #: Whether the scale is ``c = 1`` (the Euclidean metric) rather than ``c = |w|``.
    unit: ClassVar[bool] = False

    #: Devices on which the norm goes tensor by tensor through :attr:`_scratch`. On a CPU a
    #: new parameter-sized tuple costs more than a dispatch per tensor; on a GPU each dispatch
    #: is a kernel launch and the caching allocator makes new tensors cheap, so the fused form
    #: (a fixed number of launches however many tensors) stays there.
    scratch_norm_devices: ClassVar[frozenset[str]] = frozenset({"cpu"})

    def __init__(self, quotient: AdaptiveQuotient, x: Sequence[torch.Tensor]) -> None:
        super().__init__(quotient, x)
        # unbatched points (the engine's) reduce every tensor fully: fused operators apply
        self.unbatched = quotient.fused and all(
            t.dim() == k for t, k in zip(self.x, self.point_ndims, strict=True))

    @cached_property
    def inverse_scale(self) -> Tensors:
        """``1 / c`` per tensor (``0`` where ``c = 0``)."""
        return tuple(safe_reciprocal(w, absolute=True) for w in self.x)

    @cached_property
    def inverse_base(self) -> Tensors:
        """``1 / w`` per tensor (``0`` where ``w = 0``): the curvature of the adaptive metric."""
        return tuple(safe_reciprocal(w) for w in self.x)

    # ------------------------------------------------------------------ metric
    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        terms = []
        for i, (a, b, k) in enumerate(zip(u, v, self.point_ndims, strict=True)):
            product = a * b if self.unit else a * b * self.inverse_scale[i].square()
            terms.append(T.sum_trailing(product, k))
        return sum(terms[1:], terms[0])

    def squared_norm(self, u: Tensors) -> torch.Tensor:
        """``sum (u / c)^2``: ``u / c`` first, the form that rounds alike batched or not."""
        if self.unbatched and all(a.dim() == t.dim() for a, t in zip(u, self.x, strict=True)):
            if self.unit:
                return T.fused_square_norms(u)
            if self._fits_scratch(u):
                return self._scratch_square_norms(u)
            return T.fused_square_norms(T.fused_mul(u, self.inverse_scale))
        scaled = u if self.unit else tuple(a * r for a, r in zip(u, self.inverse_scale,
                                                                 strict=True))
        terms = [T.sum_trailing(a.square(), k) for a, k in zip(scaled, self.point_ndims,
                                                               strict=True)]
        return sum(terms[1:], terms[0]).clamp_min(0)

    @cached_property
    def _scratch(self) -> torch.Tensor:
        """One flat buffer the size of the largest parameter tensor, reused by every norm: on a
        CPU a new tuple ``u / c`` per norm costs more than its arithmetic (the allocator returns
        it to the kernel and page-faults it again at the next step)."""
        largest = max(self.x, key=lambda t: t.numel())
        return torch.empty(largest.numel(), dtype=largest.dtype, device=largest.device)

    def _fits_scratch(self, u: Tensors) -> bool:
        # out= takes no autograd history, and the buffer has one dtype and device; a compiled
        # graph fuses the product into the reduction, with no buffer to write
        if torch.compiler.is_compiling():
            return False
        if torch.is_grad_enabled() and any(a.requires_grad for a in u):
            return False
        if any(r.requires_grad for r in self.inverse_scale):
            return False
        first = self.x[0]
        if first.device.type not in self.scratch_norm_devices:
            return False
        return all(a.dtype == first.dtype == w.dtype and a.device == first.device == w.device
                   and a.shape == w.shape for a, w in zip(u, self.x, strict=True))

    def _scratch_square_norms(self, u: Tensors) -> torch.Tensor:
        """``sum ||u / c||^2`` with each product written into :attr:`_scratch` in turn (the
        same products and reductions as the fused form, so the same value bit for bit)."""
        norms = []
        for a, r in zip(u, self.inverse_scale, strict=True):
            product = self._scratch[:a.numel()].view(a.shape)
            torch.mul(a, r, out=product)
            norms.append(torch.linalg.vector_norm(product))
        return torch.stack(norms).square().sum()

    # ------------------------------------------------------------------ trivial group
    def horizontal_projection(self, u: Tensors) -> Tensors:
        return tuple(u)

    def vertical_projection(self, u: Tensors) -> Tensors:
        return tuple(torch.zeros_like(a) for a in u)

    def horizontality_error(self, u: Tensors) -> torch.Tensor:
        return torch.zeros_like(self.squared_norm(u))

    def raise_index(self, egrad: Tensors) -> Tensors:
        if len(egrad) != len(self.x):
            # the Euclidean raise pairs nothing with the point: a tuple of another length
            # would pass through it unnoticed
            raise ValueError(f"raise_index: {len(egrad)} gradient tensors for a point of "
                             f"{len(self.x)}")
        if self.unit or not egrad:
            return tuple(egrad)
        if not self.unbatched or any(e.shape != w.shape
                                     for e, w in zip(egrad, self.x, strict=True)):
            # a batch of gradients at one point broadcasts; the in-place fused form cannot
            return tuple(e * (w * w) for e, w in zip(egrad, self.x, strict=True))
        # e * c^2 with c^2 = w * w: fused, formed per call, no parameter-sized cache
        raised = T.fused_mul(self.x, self.x)
        torch._foreach_mul_(list(raised), list(egrad))
        return raised

    def riemannian_gradient(self, egrad: Tensors) -> Tensors:
        return self.raise_index(egrad)

    def riemannian_gradient_and_squared_norm(self, egrad: Tensors
                                             ) -> tuple[Tensors, torch.Tensor]:
        """``c^2 e`` and ``sum (c^2 e / c)^2 = sum (w e)^2`` (``c = |w|``) from ``w e``, formed
        once: three passes over the parameters fewer than the gradient and then its norm, equal
        to rounding (0 where ``c = 0``, as there)."""
        if self.unit or not egrad or not self.unbatched or any(
                e.shape != w.shape for e, w in zip(egrad, self.x, strict=True)):
            return super().riemannian_gradient_and_squared_norm(egrad)
        gradient = T.fused_mul(egrad, self.x)
        squared = T.fused_square_norms(gradient)
        torch._foreach_mul_(list(gradient), list(self.x))
        return gradient, squared

    # ------------------------------------------------------------------ connection
    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        if self.unit:
            return tuple(torch.zeros_like(a) for a in u)
        if v is None:
            return tuple(-a.square() * r for a, r in zip(u, self.inverse_base, strict=True))
        return tuple(-a * b * r for a, b, r in zip(u, v, self.inverse_base, strict=True))

    def geodesic(self, u: Tensors, t: float = 1.0, order: int | str = 2,
                 steps: int = 64) -> Tensors:
        if order == 1 or self.unit:
            if t == 1.0 and self.unbatched:
                return T.fused_add(self.x, u)
            return tuple(w + t * a for w, a in zip(self.x, u, strict=True))
        if order == 2:
            # w + t u - t^2/2 Gamma(u, u) = w + t u + t^2 u^2 / (2 w)
            if (self.unbatched and u and not T.under_function_transform(u)
                    and all(a.shape == w.shape for a, w in zip(u, self.x, strict=True))):
                return OrderTwoAdaptivePath.apply(float(t), len(u), *self.x,
                                                  *self.inverse_base, *u)
            return tuple(w + t * a + 0.5 * t * t * a.square() * r
                         for w, a, r in zip(self.x, u, self.inverse_base, strict=True))
        return super().geodesic(u, t, order, steps)

    def geodesic_exact(self, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        if self.unit:
            return tuple(w + t * a for w, a in zip(self.x, u, strict=True))
        return tuple(w * torch.exp(t * a * r)
                     for w, a, r in zip(self.x, u, self.inverse_base, strict=True))

    # ------------------------------------------------------------------ coordinate subspaces
    def on_rows(self, rows: Mapping[int, torch.Tensor]) -> AdaptivePoint:
        """:meth:`FrozenPoint.on_rows`, exact here (the metric is diagonal): the point and the
        caches computed so far cut to the rows. A batched point (its first dimension is not a
        row of the point) or a slot out of range raises a ``ValueError``."""
        if not self.unbatched and not all(t.dim() == k for t, k in zip(self.x, self.point_ndims,
                                                                         strict=True)):
            raise ValueError("on_rows needs an unbatched point (rows of the point itself)")
        cut = copy.copy(self)
        cut.x = T.cut_to_rows(self.x, rows, "point")
        for cache in ("inverse_scale", "inverse_base"):
            if cache in self.__dict__:
                cut.__dict__[cache] = T.cut_to_rows(self.__dict__[cache], rows, "point")
        return cut

    # ------------------------------------------------------------------ sampling
    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        noise = tuple(torch.randn(w.shape, generator=generator, dtype=w.dtype, device=w.device)
                      for w in self.x)
        return noise if self.unit else tuple(n * w.abs() for n, w in zip(noise, self.x,
                                                                          strict=True))


class AdaptiveEuclideanPoint(AdaptivePoint):
    """The Euclidean metric ``sum u v`` (``c = 1``) at frozen parameters ``w``: flat, straight
    geodesics, the raised gradient is the Euclidean one."""

    unit = True


class ScaledEuclideanMetric(Metric):
    """A metric ``diag(1 / c^2)`` on parameters with the trivial group.

    Attributes
    ----------
    name
        ``"adaptive"`` or ``"euclidean"``.
    point_type
        The :class:`AdaptivePoint` class holding the formulas.
    group_invariant
        ``True``: the trivial group leaves every metric invariant.
    """

    name: ClassVar[str] = "scaled"
    point_type: ClassVar[type[AdaptivePoint]] = AdaptivePoint
    group_invariant: ClassVar[bool] = True


class AdaptiveMetric(ScaledEuclideanMetric):
    """``c = |w|``: the metric of adaptive sharpness, flat in ``log |w|``."""

    name = "adaptive"
    point_type = AdaptivePoint


class AdaptiveEuclideanMetric(ScaledEuclideanMetric):
    """``c = 1``: the Euclidean metric, flat."""

    name = "euclidean"
    point_type = AdaptiveEuclideanPoint


#: The metrics :class:`AdaptiveQuotient` resolves ``metric=`` in.
ADAPTIVE_METRICS: MetricRegistry[ScaledEuclideanMetric] = MetricRegistry(
    "AdaptiveQuotient", ScaledEuclideanMetric, [AdaptiveMetric, AdaptiveEuclideanMetric])
#: The metric names.
METRICS = ADAPTIVE_METRICS.names


class AdaptiveQuotient(MetricFamilyQuotient):
    """Parameters ``w`` with the metric ``diag(1 / c^2)`` and the trivial group.

    Parameters
    ----------
    metric
        A :class:`ScaledEuclideanMetric` or its name: ``"adaptive"`` (``c = |w|``,
        :class:`AdaptiveMetric`) or ``"euclidean"`` (``c = 1``,
        :class:`AdaptiveEuclideanMetric`).
    point_ndims
        Trailing point dimensions of each component (one per parameter tensor); leading
        dimensions beyond them are batch dimensions. Default: from ``shapes``.
    shapes
        Optional trailing shape of each component (sets ``point_ndims`` and is used by
        :meth:`random_point`).
    fused
        Use torch's ``_foreach`` operators on unbatched points (one dispatch for all tensors).
        A fused norm sums in another order than the per-tensor loop, so a caller that must
        round alike for a point alone and the same point inside a batch passes ``False``.

    Attributes
    ----------
    metric
        The selected :class:`ScaledEuclideanMetric`; ``metric.name`` is its name.
    """

    metrics = ADAPTIVE_METRICS
    metric: ScaledEuclideanMetric

    def __init__(self, metric: str | ScaledEuclideanMetric = "adaptive",
                 point_ndims: Sequence[int] | None = None,
                 shapes: Sequence[Sequence[int]] | None = None, fused: bool = True) -> None:
        if point_ndims is None:
            if shapes is None:
                raise ValueError("pass point_ndims or shapes")
            point_ndims = tuple(len(s) for s in shapes)
        self.point_ndims = tuple(int(k) for k in point_ndims)
        if not self.point_ndims or any(k < 0 for k in self.point_ndims):
            raise ValueError(f"point_ndims must be non-empty and >= 0, got {point_ndims}")
        super().__init__(metric, shapes)
        self.name = self.metric.name
        self.fused = bool(fused)

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor],
           metric: str | ScaledEuclideanMetric = "adaptive") -> AdaptiveQuotient:
        """The quotient whose point is ``tensors`` as they are (no batch dimensions)."""
        return cls(metric, point_ndims=[t.dim() for t in tensors])

    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        return (0,)

    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        batch = a.shape[:-1]
        return tuple(torch.zeros(torch.broadcast_shapes(batch, c.shape[:c.dim() - k])
                                 + c.shape[c.dim() - k:], dtype=c.dtype, device=c.device)
                     for c, k in zip(x, self.point_ndims, strict=True))

    def act(self, x: Tensors, g: torch.Tensor) -> Tensors:
        return tuple(x)

    def act_tangent(self, x: Tensors, u: Tensors, g: torch.Tensor) -> Tensors:
        return tuple(u)

    def extra_repr(self) -> str:
        return f"metric={self.metric.name!r}, point_ndims={self.point_ndims}"
