"""The GL(1)^d quotient of diagonal networks and its metrics (inv, mix, euclidean)."""

from .euclidean import DiagonalEuclideanMetric, DiagonalEuclideanPoint
from .inv import DiagonalInvMetric, DiagonalInvPoint
from .metric import DiagonalMetric
from .mix import DiagonalMixMetric, DiagonalMixPoint
from .point import DiagonalPoint
from .quotient import METRIC_TYPES, METRICS, DiagonalQuotient

__all__ = ["DiagonalEuclideanMetric", "DiagonalEuclideanPoint", "DiagonalInvMetric",
           "DiagonalInvPoint", "DiagonalMetric", "DiagonalMixMetric", "DiagonalMixPoint",
           "DiagonalPoint", "DiagonalQuotient", "METRICS", "METRIC_TYPES"]
