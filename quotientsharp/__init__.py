"""quotientsharp: Riemannian geometry on the symmetry quotients of neural networks.

The package is in layers, each importing only from those below it: ``core``, ``models``,
``engine``, ``workflows``, ``reproduce``, ``cli`` (docs/architecture.md). The names below are
imported on first use (PEP 562): ``import quotientsharp`` and ``--help`` import no torch.
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

from quotientsharp._version import __version__

#: The module that defines them -> public names.
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".core.adaptive": ("AdaptiveQuotient",),
    ".core.diagonal": ("DiagonalQuotient",),
    ".core.frozen": ("FrozenPoint",),
    ".core.gl": ("GLQuotient", "RotaryQuotient"),
    ".core.product": ("ProductQuotient",),
    ".core.quotient": ("ClosedFormQuotient", "SymmetryQuotient"),
    ".core.validation": ("value_checks",),
    ".engine": ("AdaptiveSpec", "AverageSpec", "GeodesicSpec", "NoSymmetryWarning",
                "ReachWarning", "RelativeFlatnessSpec", "SharpnessResult", "UnboundSymmetryWarning",
                "WorstCaseSpec", "measure_from", "sharpness"),
    ".models": ("QuotientBinding", "SymmetryCheckError", "check_symmetry", "find_symmetries"),
}
_DEFINED_IN = {name: module for module, names in _EXPORTS.items() for name in names}
#: Public name -> the module it is.
_MODULES: dict[str, str] = {"checks": ".core.checks", "core": ".core", "engine": ".engine",
                            "models": ".models", "reference": ".core.reference",
                            "workflows": ".workflows"}

__all__ = ["AdaptiveQuotient", "ClosedFormQuotient", "DiagonalQuotient", "FrozenPoint",
           "GLQuotient", "NoSymmetryWarning", "ProductQuotient", "QuotientBinding", "ReachWarning",
           "RotaryQuotient", "SharpnessResult", "SymmetryCheckError", "SymmetryQuotient",
           "UnboundSymmetryWarning",
           "check_symmetry", "checks", "core", "engine", "find_symmetries", "models", "reference",
           "sharpness", "value_checks", "workflows", "__version__",
           "AdaptiveSpec", "AverageSpec", "GeodesicSpec", "RelativeFlatnessSpec", "WorstCaseSpec",
           "measure_from"]

if TYPE_CHECKING:
    from quotientsharp import core, engine, models, workflows
    from quotientsharp.core import checks, reference
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.core.diagonal import DiagonalQuotient
    from quotientsharp.core.frozen import FrozenPoint
    from quotientsharp.core.gl import GLQuotient, RotaryQuotient
    from quotientsharp.core.product import ProductQuotient
    from quotientsharp.core.quotient import ClosedFormQuotient, SymmetryQuotient
    from quotientsharp.core.validation import value_checks
    from quotientsharp.engine import (
        AdaptiveSpec,
        AverageSpec,
        GeodesicSpec,
        NoSymmetryWarning,
        ReachWarning,
        RelativeFlatnessSpec,
        SharpnessResult,
        UnboundSymmetryWarning,
        WorstCaseSpec,
        measure_from,
        sharpness,
    )
    from quotientsharp.models import (
        QuotientBinding,
        SymmetryCheckError,
        check_symmetry,
        find_symmetries,
    )


def __getattr__(name: str) -> object:
    if name in _MODULES:
        value = _import_module(_MODULES[name], __name__)
    elif name in _DEFINED_IN:
        value = getattr(_import_module(_DEFINED_IN[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the public names only: the helpers this module imports for itself are not the API
    return sorted(__all__)
