"""The diagonal-network study (paper Sec. 5.1): ``quotientsharp reproduce diagonal``
(:mod:`.entry`; the driver :mod:`.study`, the ``--full`` sweep :mod:`.full`)."""
