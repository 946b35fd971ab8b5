"""The invariance study: ``quotientsharp reproduce invariance`` (:mod:`.study`), and its
measures, variants and page (:mod:`.report`)."""
