"""The base of metric objects: a metric names the frozen-point class that holds its formulas.

A quotient with several metrics (:class:`~quotientsharp.GLQuotient`,
:class:`~quotientsharp.DiagonalQuotient`) takes a metric object or its name; each metric is a
small class (:class:`Metric` subclass) with its formulas in a frozen-point class of its own
module, so that each file reads as one derivation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar


class Metric:
    """A metric of a family of quotients.

    Attributes
    ----------
    name
        Short name (``"inv"``, ``"mix"``, ``"euclidean"``).
    point_type
        The frozen-point class holding the formulas.
    group_invariant
        Whether the metric is invariant under the whole group (so that it descends to the
        quotient), for the relaxation ``eps = 0`` where there is one.
    """

    name: ClassVar[str] = "metric"
    point_type: ClassVar[type]
    group_invariant: ClassVar[bool] = True

    @classmethod
    def resolve(cls, metric: object, types: Mapping[str, type[Metric]]) -> Metric:
        """The metric object for ``metric``: an instance of ``cls`` or a key of ``types``."""
        if isinstance(metric, str):
            if metric not in types:
                raise ValueError(f"metric must be one of {tuple(types)}, got {metric!r}")
            return types[metric]()
        if not isinstance(metric, cls):
            raise TypeError(f"metric must be a metric name {tuple(types)} or a {cls.__name__}, "
                            f"got {type(metric).__name__}")
        return metric

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __str__(self) -> str:
        return self.name


__all__ = ["Metric"]
