"""Symmetry discovery in torch models and the parameter layout the sharpness engine works in.

>>> report = find_symmetries(model)
>>> layout = ParameterLayout(report, dict(model.named_parameters()))
>>> coords = layout.to_coordinates(dict(model.named_parameters()))
>>> params = layout.to_parameters(coords)          # bit-identical, differentiable
>>> moved = reparametrize(model, report, scale=2.0) # same function, other parameters

Any other symmetry: attach its quotient to named parameters with :class:`QuotientBinding`.
"""

from .binding import QuotientBinding
from .layout import Coordinates, ParameterLayout
from .reparametrize import reparametrize
from .report import (
    AttentionModule,
    AttentionPair,
    DiagonalPair,
    FactorSource,
    PairGroup,
    SymmetryReport,
)
from .walker import find_symmetries

__all__ = [
    "AttentionModule",
    "AttentionPair",
    "Coordinates",
    "DiagonalPair",
    "FactorSource",
    "PairGroup",
    "ParameterLayout",
    "QuotientBinding",
    "SymmetryReport",
    "find_symmetries",
    "reparametrize",
]
