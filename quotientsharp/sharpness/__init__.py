"""Sharpness: average, worst-case, adaptive, geodesic (SPEC sections 4-6), relative flatness.

>>> from quotientsharp import sharpness
>>> result = sharpness(model, batches, measure="geodesic", rho=0.1, metric="inv", order=2)
>>> result.value, result.per_batch
"""

from .api import MEASURES, SharpnessResult, sharpness
from .solver import AscentSettings, checkpoints

__all__ = ["MEASURES", "AscentSettings", "SharpnessResult", "checkpoints", "sharpness"]
