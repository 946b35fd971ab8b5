"""The invariance study: ``quotientsharp reproduce invariance`` (:mod:`.study`), and its page
(:mod:`.report`)."""
