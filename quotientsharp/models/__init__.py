"""Symmetry discovery in torch models and the parameter layout the sharpness engine works in.

>>> report = find_symmetries(model)
>>> layout = ParameterLayout(report, dict(model.named_parameters()))
>>> coords = layout.to_coordinates(dict(model.named_parameters()))
>>> params = layout.to_parameters(coords)          # bit-identical, differentiable
>>> moved = reparametrize(model, report, scale=2.0) # same function, other parameters

Any other symmetry: attach its quotient to named parameters with :class:`QuotientBinding`, and
check it against the model with :func:`check_symmetry`.
"""

from quotientsharp.models.binding import QuotientBinding
from quotientsharp.models.layout import Coordinates, ParameterLayout
from quotientsharp.models.lora_optimizers import (
    RiemannianAdamW,
    loraplus_adamw,
    loraplus_param_groups,
)
from quotientsharp.models.optim import QuotientSGD
from quotientsharp.models.quotient_adamw import QuotientAdamW

# the function, not its module: loading the submodule binds the package attribute to the
# module, and this import binds it back (later imports of the submodule rebind nothing)
from quotientsharp.models.reparametrize import reparametrize
from quotientsharp.models.report import (
    AttentionModule,
    AttentionPair,
    DiagonalPair,
    FactorSource,
    LoraAdapter,
    PairGroup,
    SymmetryReport,
)
from quotientsharp.models.symmetry_check import SymmetryCheck, SymmetryCheckError, check_symmetry
from quotientsharp.models.walker import find_symmetries

__all__ = [
    "AttentionModule",
    "AttentionPair",
    "Coordinates",
    "DiagonalPair",
    "FactorSource",
    "LoraAdapter",
    "PairGroup",
    "ParameterLayout",
    "QuotientAdamW",
    "QuotientBinding",
    "QuotientSGD",
    "RiemannianAdamW",
    "SymmetryCheck",
    "SymmetryCheckError",
    "SymmetryReport",
    "check_symmetry",
    "find_symmetries",
    "loraplus_adamw",
    "loraplus_param_groups",
    "reparametrize",
]
