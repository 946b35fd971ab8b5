"""The GL(h) quotient of attention factor pairs and its metrics (inv, mix, euclidean)."""

from .euclidean import EuclideanMetric, EuclideanPoint
from .inv import InvMetric, InvPoint
from .metric import GLMetric
from .mix import MixMetric, MixPoint
from .point import GLPoint
from .quotient import GROUP_ELEMENT_KINDS, METRIC_TYPES, METRICS, GLQuotient
from .subgroup import RotaryQuotient, rotary_algebra_basis, rotary_planes

__all__ = ["EuclideanMetric", "EuclideanPoint", "GLMetric", "GLPoint", "GLQuotient",
           "GROUP_ELEMENT_KINDS", "InvMetric", "InvPoint", "METRICS", "METRIC_TYPES",
           "MixMetric", "MixPoint", "RotaryQuotient", "rotary_algebra_basis", "rotary_planes"]
