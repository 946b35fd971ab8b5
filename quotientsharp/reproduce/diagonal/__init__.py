"""The diagonal-network study (paper Sec. 5.1): ``quotientsharp reproduce diagonal``.

:mod:`.entry` is the study's command interface; :mod:`.training` trains the nets batched,
:mod:`.batched_ascent` and :mod:`.measures` measure them, :mod:`.exact` gives exact or strong
maxima, :mod:`.study` runs a setting, :mod:`.full` the full sweep, :mod:`.report` writes the results
and the page data (the page itself is rendered by ``docs/_hooks/results_pages/diagonal.py``).
"""
