"""The GL(1)^d quotient of diagonal networks ``y = x^T (u * v)``.

The rescaling ``(a * u, v / a)``, ``a`` in ``(R \\ {0})^d``, leaves ``beta = u * v`` and hence the
network unchanged. Each metric's formulas are in its own module and frozen-point class,
:mod:`.inv`, :mod:`.mix` (both invariant, with closed-form exact geodesics for any velocity)
and :mod:`.euclidean`; ``derivations/diagonal.py`` derives and checks them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quotientsharp.core._tuples import under_function_transform
from quotientsharp.core.diagonal.euclidean import DiagonalEuclideanMetric
from quotientsharp.core.diagonal.inv import DiagonalInvMetric
from quotientsharp.core.diagonal.mix import DiagonalMixMetric
from quotientsharp.core.diagonal.point import DiagonalMetric, DiagonalPoint
from quotientsharp.core.metric import MetricRegistry
from quotientsharp.core.quotient import MetricFamilyQuotient
from quotientsharp.core.validation import value_checks_enabled

Tensors = tuple[torch.Tensor, ...]

#: The built-in metrics, the registry :class:`DiagonalQuotient` resolves ``metric=`` in.
DIAGONAL_METRICS: MetricRegistry[DiagonalMetric] = MetricRegistry(
    "DiagonalQuotient", DiagonalMetric,
    [DiagonalInvMetric, DiagonalMixMetric, DiagonalEuclideanMetric])
#: The built-in metrics by name (a copy of ``DIAGONAL_METRICS.types``).
METRIC_TYPES: dict[str, type[DiagonalMetric]] = dict(DIAGONAL_METRICS.types)
METRICS = DIAGONAL_METRICS.names


def _zero_coordinates(zero: torch.Tensor) -> list[int]:
    """The first five coordinates (last dimension) where ``zero`` holds in some batch element."""
    if not bool(zero.any()):
        return []
    return zero.reshape(-1, zero.shape[-1]).any(0).nonzero().flatten().tolist()[:5]


class DiagonalQuotient(MetricFamilyQuotient):
    """Diagonal networks ``(u, v)``, ``shape=[..., d]`` each, modulo coordinatewise rescaling.

    Parameters
    ----------
    metric
        A :class:`~quotientsharp.core.diagonal.DiagonalMetric` or its name: ``"inv"``,
        ``"mix"`` (both invariant) or ``"euclidean"`` (the GL(1) case of the Euclidean metric
        on attention pairs).
    d
        Optional width, used only by :meth:`random_point`.

    Attributes
    ----------
    metric
        The selected :class:`~quotientsharp.core.diagonal.DiagonalMetric`;
        ``metric.name`` is its name.
    invariant
        Whether the metric is invariant under the rescalings (inv and mix).
    """

    metrics = DIAGONAL_METRICS
    metric: DiagonalMetric
    point_ndims = (1, 1)
    #: Default ``((d,), (d,))`` of the random points of
    #: :func:`quotientsharp.core.checks.check_all` for an instance built without ``d``.
    check_shapes = ((6,), (6,))

    def __init__(self, metric: str | DiagonalMetric = "inv", d: int | None = None) -> None:
        super().__init__(metric, None if d is None else ((d,), (d,)))
        self.name = f"diagonal-{self.metric.name}"

    def frozen_point(self, x: Tensors) -> DiagonalPoint:
        return self.metric.point_type(self, x)

    # ------------------------------------------------------------------ definition
    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        return a * x[0], -a * x[1]

    def act(self, x: Tensors, g: torch.Tensor) -> Tensors:
        return g * x[0], x[1] / g

    def act_tangent(self, x: Tensors, u: Tensors, g: torch.Tensor) -> Tensors:
        return g * u[0], u[1] / g

    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        return (x[0].shape[-1],)

    def check_point(self, x: object, name: str = "x") -> Tensors:
        x = super().check_point(x, name)
        if x[0].shape[-1] != x[1].shape[-1]:
            raise ValueError(f"{name}[0] (u) and {name}[1] (v) must have the same last dimension, "
                             f"got {tuple(x[0].shape)} and {tuple(x[1].shape)}")
        if not value_checks_enabled():
            return x
        if not self.metric.group_invariant:
            where = _zero_coordinates((x[0] == 0) & (x[1] == 0))
            if where:
                raise ValueError(f"{name} has u = v = 0 at coordinates {where}: the orbit is "
                                 "degenerate there")
            return x
        for index, label in ((0, "u"), (1, "v")):
            where = _zero_coordinates(x[index] == 0)
            if where:
                raise ValueError(f"{name}[{index}] ({label}) has zero entries ({label} = 0 at "
                                 f"coordinates {where}), which the {self.metric.name} metric "
                                 "divides by (the orbit is degenerate there)")
        return x

    def inner(self, x: Tensors, u: Tensors, v: Tensors) -> torch.Tensor:
        """Metric ``<u, v>_x``; with value checks on, zero coordinates of an invariant metric
        raise as in :meth:`check_point` (the inv metric divides by them, the mix metric is
        degenerate there). Skipped inside ``torch.func`` transforms, where the point was
        checked by the caller."""
        self._check_metric_defined(x)
        return super().inner(x, u, v)

    def norm(self, x: Tensors, u: Tensors) -> torch.Tensor:
        """Riemannian norm ``||u||_x``; zero coordinates raise as in :meth:`inner`."""
        self._check_metric_defined(x)
        return super().norm(x, u)

    def _check_metric_defined(self, x: Tensors) -> None:
        if isinstance(x, (tuple, list)) and under_function_transform(
                [t for t in x if isinstance(t, torch.Tensor)]):
            return
        if value_checks_enabled() and self.metric.group_invariant:
            self.check_point(x)
        else:
            super().check_point(x)      # a tuple of floating tensors: free checks only

    def submersion(self, x: Tensors) -> torch.Tensor:
        """The quotient map ``pi(u, v) = u v``, ``shape=[..., d]``: what the network sees."""
        return self.frozen_point(x).submersion()

    # ------------------------------------------------------------------ sampling
    def random_point(self, batch_shape: Sequence[int] = (), *,
                     shapes: Sequence[Sequence[int]] | None = None,
                     generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> Tensors:
        """Entries of random sign with log-uniform magnitudes in ``[1e-1, 1e1]``.

        The device is ``device``, else the generator's, else torch's default device.
        """
        if device is None and generator is not None:
            device = generator.device
        out = []
        for s in self._shapes(shapes):
            mag = torch.rand(*batch_shape, *s, generator=generator, dtype=dtype, device=device)
            sign = torch.randint(0, 2, (*batch_shape, *s), generator=generator,
                                 device=device).to(mag.dtype) * 2 - 1
            out.append(sign * torch.pow(10.0, 2.0 * mag - 1.0))
        return tuple(out)

    def random_group_element(self, x: Tensors, *, scale: float = 1.0,
                             generator: torch.Generator | None = None) -> torch.Tensor:
        """Nonzero rescalings of random sign, ``|a| = exp(scale * N(0, 1))``."""
        g = super().random_group_element(x, scale=scale, generator=generator)
        sign = torch.randint(0, 2, g.shape, generator=generator, device=g.device).to(g.dtype)
        return g * (2 * sign - 1)

    def extra_repr(self) -> str:
        return f"metric={self.metric.name!r}"
