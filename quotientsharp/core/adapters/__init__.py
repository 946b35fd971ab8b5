"""Thin adapters presenting any :class:`~quotientsharp.SymmetryQuotient` to other libraries.

- :class:`QuotientManifold` (:mod:`quotientsharp.core.adapters.geoopt`): a ``geoopt.Manifold`` on
  one stacked tensor, for ``geoopt.ManifoldParameter`` with ``RiemannianSGD`` / ``RiemannianAdam``.
- :class:`PymanoptQuotient` (:mod:`quotientsharp.core.adapters.pymanopt`): a pymanopt ``Manifold``
  on tuples of numpy float64 arrays, for ``SteepestDescent``, ``ConjugateGradient`` and
  ``TrustRegions``.

Both take ``shapes`` as the trailing shapes of one point's components (``quotient.point_shapes``,
e.g. ``((n, h), (m, h))`` for GL(h)); leading dimensions are batch dimensions, read from the
tensor by ``QuotientManifold`` and given as ``batch_shape=`` to ``PymanoptQuotient``.

geoopt and pymanopt are optional extras (``pip install quotientsharp[geoopt]``,
``pip install quotientsharp[pymanopt]``). Importing :mod:`quotientsharp` or this package never
imports them: each adapter's module is imported on first access to its name, and a missing extra
raises an :class:`ImportError` that names the ``pip install`` command.
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
