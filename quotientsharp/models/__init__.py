"""Symmetry discovery in torch models and the parameter layout the sharpness engine works in.

>>> report = find_symmetries(model)
>>> layout = ParameterLayout(report, dict(model.named_parameters()))
>>> coords = layout.to_coordinates(dict(model.named_parameters()))
>>> params = layout.to_parameters(coords)          # bit-identical, differentiable
>>> moved = reparametrize(model, report, scale=2.0) # same function, other parameters

Any other symmetry: attach its quotient to named parameters with :class:`QuotientBinding`, and
check it against the model with :func:`check_symmetry`.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

#: Public name -> its module; imported on first use, so that the ``symmetries`` subcommand's
#: parser (:mod:`.cli`) is built without importing torch.
_EXPORTS = {
    "AttentionModule": ".report",
    "AttentionPair": ".report",
    "Coordinates": ".layout",
    "DiagonalPair": ".report",
    "FactorSource": ".report",
    "LoraAdapter": ".lora",
    "PairGroup": ".report",
    "ParameterLayout": ".layout",
    "QuotientBinding": ".binding",
    "QuotientSGD": ".optim",
    "SymmetryCheck": ".symmetry_check",
    "SymmetryCheckError": ".symmetry_check",
    "SymmetryReport": ".report",
    "check_symmetry": ".symmetry_check",
    "find_symmetries": ".walker",
    "reparametrize": ".reparametrize",
}

if TYPE_CHECKING:
    from quotientsharp.models.binding import QuotientBinding
    from quotientsharp.models.layout import Coordinates, ParameterLayout
    from quotientsharp.models.lora import LoraAdapter
    from quotientsharp.models.optim import QuotientSGD
    from quotientsharp.models.reparametrize import reparametrize
    from quotientsharp.models.report import (
        AttentionModule,
        AttentionPair,
        DiagonalPair,
        FactorSource,
        PairGroup,
        SymmetryReport,
    )
    from quotientsharp.models.symmetry_check import (
        SymmetryCheck,
        SymmetryCheckError,
        check_symmetry,
    )
    from quotientsharp.models.walker import find_symmetries


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    """Keeps ``quotientsharp.models.reparametrize`` the function when its module is imported
    (the import system sets the package attribute to the submodule of the same name)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType) and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "AttentionModule",
    "AttentionPair",
    "Coordinates",
    "DiagonalPair",
    "FactorSource",
    "LoraAdapter",
    "PairGroup",
    "ParameterLayout",
    "QuotientBinding",
    "QuotientSGD",
    "SymmetryCheck",
    "SymmetryCheckError",
    "SymmetryReport",
    "check_symmetry",
    "find_symmetries",
    "reparametrize",
]
