"""The GL(h) quotient of attention factor pairs and its metrics (inv, mix, euclidean)."""

from quotientsharp.core.gl.euclidean import EuclideanMetric, EuclideanPoint
from quotientsharp.core.gl.inv import InvMetric, InvPoint
from quotientsharp.core.gl.mix import MixMetric, MixPoint
from quotientsharp.core.gl.point import GLMetric, GLPoint
from quotientsharp.core.gl.quotient import GROUP_ELEMENT_KINDS, METRIC_TYPES, METRICS, GLQuotient
from quotientsharp.core.gl.subgroup import RotaryQuotient, rotary_algebra_basis, rotary_planes

__all__ = ["EuclideanMetric", "EuclideanPoint", "GLMetric", "GLPoint", "GLQuotient",
           "GROUP_ELEMENT_KINDS", "InvMetric", "InvPoint", "METRICS", "METRIC_TYPES",
           "MixMetric", "MixPoint", "RotaryQuotient", "rotary_algebra_basis", "rotary_planes"]
