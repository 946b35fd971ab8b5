"""The base of the metric objects of :class:`~quotientsharp.core.diagonal.DiagonalQuotient`."""

from __future__ import annotations

from typing import ClassVar

from quotientsharp.core.diagonal.point import DiagonalPoint
from quotientsharp.core.metric import Metric


class DiagonalMetric(Metric):
    """A metric on diagonal-network coordinates ``(u, v)``.

    Attributes
    ----------
    name
        Short name (``"inv"``, ``"mix"``, ``"euclidean"``).
    point_type
        The :class:`~quotientsharp.core.diagonal.point.DiagonalPoint` subclass holding the formulas.
    group_invariant
        Whether the rescalings ``(a u, v / a)`` leave the metric invariant.
    """

    name: ClassVar[str] = "diagonal"
    point_type: ClassVar[type[DiagonalPoint]] = DiagonalPoint
    group_invariant: ClassVar[bool] = True
