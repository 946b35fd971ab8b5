"""Thin adapters presenting any :class:`~quotientsharp.SymmetryQuotient` to other libraries.

:class:`QuotientManifold` is a ``geoopt.Manifold`` on one stacked tensor, for
``geoopt.ManifoldParameter`` with ``RiemannianSGD`` / ``RiemannianAdam``;
:class:`PymanoptQuotient` a pymanopt ``Manifold`` on tuples of numpy float64 arrays, for
``SteepestDescent``, ``ConjugateGradient`` and ``TrustRegions``. Both take ``shapes``, the
trailing shapes of one point's components (``quotient.point_shapes``). geoopt and pymanopt are
optional extras, imported on first access to an adapter's name; a missing extra raises an
:class:`ImportError` that names the ``pip install`` command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quotientsharp.core.adapters.geoopt import QuotientManifold, StackedLayout
    from quotientsharp.core.adapters.pymanopt import PymanoptQuotient, QuotientTangentVector

_LAZY_NAMES = {
    "QuotientManifold": "geoopt",
    "StackedLayout": "geoopt",
    "PymanoptQuotient": "pymanopt",
    "QuotientTangentVector": "pymanopt",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_NAMES])


__all__ = ["PymanoptQuotient", "QuotientManifold", "QuotientTangentVector", "StackedLayout"]
