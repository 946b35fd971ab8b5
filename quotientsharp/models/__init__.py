"""Symmetry discovery in torch models and the parameter layout the sharpness engine works in.

>>> report = find_symmetries(model)
>>> layout = ParameterLayout(report, dict(model.named_parameters()))
>>> coords = layout.to_coordinates(dict(model.named_parameters()))
>>> params = layout.to_parameters(coords)          # bit-identical, differentiable
>>> moved = reparametrize(model, report, scale=2.0) # same function, other parameters
"""

from .discovery import (
    AttentionModule,
    AttentionPair,
    DiagonalPair,
    FactorSource,
    PairGroup,
    SymmetryReport,
    find_symmetries,
)
from .layout import Coordinates, ParameterLayout
from .reparametrize import reparametrize

__all__ = [
    "AttentionModule",
    "AttentionPair",
    "Coordinates",
    "DiagonalPair",
    "FactorSource",
    "PairGroup",
    "ParameterLayout",
    "SymmetryReport",
    "find_symmetries",
    "reparametrize",
]
