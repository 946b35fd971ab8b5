"""The geometry core: quotients, their metrics, frozen points, products and their checks.

Nothing here knows about models or sharpness; every layer above builds on it.

- :mod:`.quotient`: :class:`~quotientsharp.core.quotient.SymmetryQuotient`, the abstract base
  (metric ``inner``, action ``act``, infinitesimal action ``vertical``, ``algebra_shape``: a
  subclass without one fails at instantiation), and the generic defaults of :mod:`.reference`
  (horizontal projection, Riemannian gradient, Christoffel contraction, geodesics by autograd
  and ODE integration); :class:`~quotientsharp.core.quotient.MetricFamilyQuotient`, the base of
  the quotients with several metrics;
- :mod:`.metric`: metric objects and the :class:`~quotientsharp.core.metric.MetricRegistry`
  through which GL, diagonal and adaptive quotients select their metric by name;
- :mod:`.frozen`: the geometry at one base point, batched over leading dimensions;
- :mod:`.gl`, :mod:`.diagonal`, :mod:`.adaptive`: the built-in quotients, one metric object
  per file; :mod:`.product`: products of quotients;
- :mod:`.checks`: assertable checks of a quotient's closed forms against the references;
  :mod:`.symbolic`: sympy derivations; :mod:`.adapters`: geoopt and pymanopt;
- :mod:`.linalg`, :mod:`.validation`, :mod:`._tuples`: shared arithmetic.
"""
