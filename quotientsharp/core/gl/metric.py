"""The base of the metric objects of :class:`~quotientsharp.core.gl.GLQuotient` (one per metric).

A new metric on attention pairs is a :class:`GLMetric` subclass naming a
:class:`~quotientsharp.core.gl.point.GLPoint` subclass that holds its formulas.
"""

from __future__ import annotations

from typing import ClassVar

from quotientsharp.core.gl.point import GLPoint
from quotientsharp.core.metric import Metric


class GLMetric(Metric):
    """A metric on GL(h) factor pairs ``(G, H)``.

    Attributes
    ----------
    name
        Short name (``"inv"``, ``"mix"``, ``"euclidean"``).
    point_type
        The :class:`~quotientsharp.core.gl.point.GLPoint` subclass holding the formulas.
    group_invariant
        Whether the metric is invariant under all of GL(h) at ``eps = 0`` (so that it descends
        to the quotient).
    """

    name: ClassVar[str] = "gl"
    point_type: ClassVar[type[GLPoint]] = GLPoint
    group_invariant: ClassVar[bool] = True
