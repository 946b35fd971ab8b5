"""The GL(1)^d quotient of diagonal networks and its metrics (inv, mix, euclidean)."""

from quotientsharp.core.diagonal.euclidean import DiagonalEuclideanMetric, DiagonalEuclideanPoint
from quotientsharp.core.diagonal.inv import DiagonalInvMetric, DiagonalInvPoint
from quotientsharp.core.diagonal.mix import DiagonalMixMetric, DiagonalMixPoint
from quotientsharp.core.diagonal.point import DiagonalMetric, DiagonalPoint
from quotientsharp.core.diagonal.quotient import METRIC_TYPES, METRICS, DiagonalQuotient

__all__ = ["DiagonalEuclideanMetric", "DiagonalEuclideanPoint", "DiagonalInvMetric",
           "DiagonalInvPoint", "DiagonalMetric", "DiagonalMixMetric", "DiagonalMixPoint",
           "DiagonalPoint", "DiagonalQuotient", "METRICS", "METRIC_TYPES"]
