"""The geometry core: quotients, their metrics, frozen points, products and their checks.

Nothing here knows about models or sharpness; every layer above builds on it. The abstract base
is :class:`~quotientsharp.core.quotient.SymmetryQuotient`; :mod:`.gl`, :mod:`.diagonal` and
:mod:`.adaptive` hold the built-in quotients (one metric object per file), :mod:`.product` their
products, :mod:`.checks` and :mod:`.symbolic` the checks of closed forms against the generic
defaults of :mod:`.reference` and against sympy, :mod:`.adapters` geoopt and pymanopt.
"""
