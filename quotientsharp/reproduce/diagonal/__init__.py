"""The diagonal-network study (paper Sec. 5.1): ``quotientsharp reproduce diagonal``.

:mod:`.entry` is the command (its docstring the ``--help`` text); :mod:`.settings` holds what
determines the numbers, :mod:`.data` the seeded draws, :mod:`.training` trains all nets at
once, :mod:`.measures` measures them batched (:mod:`.batched_ascent`), :mod:`.exact` gives the
exact and strong maxima, :mod:`.analysis` the numbers of one run, :mod:`.report` the records,
plots and page data, :mod:`.study` the driver and :mod:`.full` the ``--full`` sweep.
"""
