"""Metric objects and the one registry through which every quotient selects its metric.

A quotient with several metrics resolves ``metric=`` (a :class:`Metric` or its name) once, in
its family's :class:`MetricRegistry`; no method compares metric names afterwards: what differs
between metrics is in their frozen-point classes and their metric objects' class attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from quotientsharp.core.frozen import ClosedFormPoint


class Metric:
    """A metric of a family of quotients: the name, the formulas' class, and invariance.

    Attributes
    ----------
    name
        Short name (``"inv"``, ``"mix"``, ``"euclidean"``, ``"adaptive"``), unique in its
        family's :class:`MetricRegistry`.
    point_type
        The :class:`~quotientsharp.core.frozen.ClosedFormPoint` subclass holding the formulas.
    group_invariant
        Whether the metric is invariant under the whole group (so that it descends to the
        quotient), for the relaxation ``eps = 0`` where there is one.

    Notes
    -----
    Metric objects carry no state: two are equal when they are of the same class. A metric
    never equals a string (compare ``metric.name``; 0.1's ``AdaptiveQuotient.metric`` was the
    name itself).
    """

    name: ClassVar[str] = "metric"
    point_type: ClassVar[type[ClosedFormPoint]]
    group_invariant: ClassVar[bool] = True

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __str__(self) -> str:
        return self.name


# covariant: a registry of GL metrics is a registry of metrics (it only hands metrics out)
MetricT_co = TypeVar("MetricT_co", bound=Metric, covariant=True)


class MetricRegistry(Generic[MetricT_co]):
    """The metrics of one family of quotients, by name.

    Parameters
    ----------
    family
        The quotient class's name, for error messages (``"GLQuotient"``).
    base
        The metric class of the family: a metric object passed to the quotient must be an
        instance of it (a GL metric has no formulas for diagonal networks).
    metrics
        The metric classes, each with a distinct :attr:`Metric.name`.

    Examples
    --------
    >>> from quotientsharp import GLQuotient
    >>> GLQuotient.metrics.names
    ('inv', 'mix', 'euclidean')
    >>> GLQuotient.metrics.resolve("mix")
    MixMetric()
    """

    def __init__(self, family: str, base: type[MetricT_co],
                 metrics: Sequence[type[MetricT_co]]) -> None:
        types = {metric.name: metric for metric in metrics}
        if len(types) != len(metrics):
            raise ValueError(f"the metrics of {family} must have distinct names, got "
                             f"{[metric.name for metric in metrics]}")
        self.family = family
        self.base = base
        self._types: dict[str, type[MetricT_co]] = types

    @property
    def names(self) -> tuple[str, ...]:
        """The metric names, in registration order."""
        return tuple(self._types)

    @property
    def types(self) -> Mapping[str, type[MetricT_co]]:
        """The metric classes by name (read-only)."""
        return dict(self._types)

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def resolve(self, metric: object) -> MetricT_co:
        """The metric object for ``metric``: one of :attr:`names` or an instance of the base.

        Raises
        ------
        ValueError
            For a name that is not registered (the message lists the names).
        TypeError
            For anything else than a name or a metric object of this family.
        """
        if isinstance(metric, str):
            if metric not in self._types:
                raise ValueError(f"metric must be one of {self.names} for {self.family}, got "
                                 f"{metric!r}")
            return self._types[metric]()
        if not isinstance(metric, self.base):
            raise TypeError(f"metric must be a metric name {self.names} or a "
                            f"{self.base.__name__} for {self.family}, got "
                            f"{type(metric).__name__}")
        return metric

    def __repr__(self) -> str:
        return f"MetricRegistry({self.family!r}, {self.names})"
