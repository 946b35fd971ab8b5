"""quotientsharp: Riemannian geometry on the symmetry quotients of neural networks.

The names below are imported on first use (PEP 562), so that ``import quotientsharp`` and the
``quotientsharp`` console script's ``--help`` do not import torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it (a submodule itself where the value is ``None``).
_EXPORTS: dict[str, str | None] = {
    "AdaptiveQuotient": ".adaptive",
    "ClosedFormQuotient": ".quotient",
    "DiagonalQuotient": ".diagonal",
    "FrozenPoint": ".frozen",
    "GLQuotient": ".gl",
    "ProductQuotient": ".product",
    "QuotientBinding": ".models",
    "RotaryQuotient": ".gl",
    "SharpnessResult": ".sharpness",
    "SymmetryQuotient": ".quotient",
    "checks": None,
    "models": None,
    "find_symmetries": ".models",
    "reference": None,
    "sharpness": ".sharpness",
    "value_checks": ".validation",
}

__all__ = ["AdaptiveQuotient", "ClosedFormQuotient", "DiagonalQuotient", "FrozenPoint",
           "GLQuotient", "ProductQuotient", "QuotientBinding", "RotaryQuotient", "SharpnessResult",
           "SymmetryQuotient", "checks", "find_symmetries", "models", "reference", "sharpness",
           "value_checks", "__version__"]

if TYPE_CHECKING:
    from . import checks, models, reference
    from .adaptive import AdaptiveQuotient
    from .diagonal import DiagonalQuotient
    from .frozen import FrozenPoint
    from .gl import GLQuotient, RotaryQuotient
    from .models import QuotientBinding, find_symmetries
    from .product import ProductQuotient
    from .quotient import ClosedFormQuotient, SymmetryQuotient
    from .sharpness import SharpnessResult, sharpness
    from .validation import value_checks


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    source = _EXPORTS[name]
    if source is None:
        value: Any = importlib.import_module(f".{name}", __name__)
    else:
        value = getattr(importlib.import_module(source, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    """Keeps ``quotientsharp.sharpness`` the function, as the eager import made it.

    Importing the subpackage ``quotientsharp.sharpness`` (e.g. ``from quotientsharp.sharpness
    import ascend``) sets the package attribute ``sharpness`` to the subpackage; the public
    name is the function of the same name, so the function takes its place.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "sharpness" and isinstance(value, types.ModuleType) \
                and hasattr(value, "sharpness"):
            value = value.sharpness
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
