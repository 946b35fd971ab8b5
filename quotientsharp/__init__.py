"""quotientsharp: Riemannian geometry on the symmetry quotients of neural networks.

The package is in layers, each a folder that imports only from the layers below it (checked by
``tests/test_layers.py``):

1. :mod:`quotientsharp.core`: the geometry (quotients, metrics, frozen points, products,
   checks, symbolic derivations, geoopt and pymanopt adapters);
2. :mod:`quotientsharp.models`: symmetry discovery in torch models, parameter layouts,
   bindings of a quotient to named parameters;
3. :mod:`quotientsharp.engine`: the sharpness measures, the ascent solver, the result;
4. :mod:`quotientsharp.workflows`: the study runner (manifests, grids, resumable records,
   taus with intervals, reports, plots);
5. :mod:`quotientsharp.reproduce`: the paper's studies, one sub-package each;
6. :mod:`quotientsharp.cli`: the ``quotientsharp`` console script.

The names below are imported on first use (PEP 562), so that ``import quotientsharp`` and the
console script's ``--help`` do not import torch.
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

__version__ = "0.3.0"

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "AdaptiveQuotient": ".core.adaptive",
    "ClosedFormQuotient": ".core.quotient",
    "DiagonalQuotient": ".core.diagonal",
    "FrozenPoint": ".core.frozen",
    "NoSymmetryWarning": ".engine",
    "ReachWarning": ".engine",
    "GLQuotient": ".core.gl",
    "ProductQuotient": ".core.product",
    "QuotientBinding": ".models",
    "RotaryQuotient": ".core.gl",
    "SharpnessResult": ".engine",
    "SymmetryCheckError": ".models",
    "SymmetryQuotient": ".core.quotient",
    "check_symmetry": ".models",
    "find_symmetries": ".models",
    "sharpness": ".engine",
    "AverageSpec": ".engine",
    "WorstCaseSpec": ".engine",
    "AdaptiveSpec": ".engine",
    "GeodesicSpec": ".engine",
    "RelativeFlatnessSpec": ".engine",
    "measure_from": ".engine",
    "value_checks": ".core.validation",
}
#: Public name -> the module it is.
_MODULES: dict[str, str] = {
    "checks": ".core.checks",
    "core": ".core",
    "engine": ".engine",
    "models": ".models",
    "reference": ".core.reference",
    "workflows": ".workflows",
}

__all__ = ["AdaptiveQuotient", "ClosedFormQuotient", "DiagonalQuotient", "FrozenPoint",
           "GLQuotient", "NoSymmetryWarning", "ProductQuotient", "QuotientBinding", "ReachWarning",
           "RotaryQuotient", "SharpnessResult", "SymmetryCheckError", "SymmetryQuotient",
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
    elif name in _EXPORTS:
        value = getattr(_import_module(_EXPORTS[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the public names only: the helpers this module imports for itself are not the API
    return sorted(__all__)
