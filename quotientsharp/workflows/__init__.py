"""``quotientsharp study MANIFEST``: the paper's workflow on your own models (``docs/study.md``).

:func:`run_study` measures every model of a manifest on a grid of sharpness measures
(:class:`StudyConfig`) and reports the Kendall rank correlation between the generalisation gap
and each measure (:func:`tau_interval`), with bootstrap intervals, plots and a report, resumably
and over the ranks of torchrun. Nothing here imports torch until a model is measured.
"""

from __future__ import annotations

from quotientsharp.workflows.manifest import ManifestEntry, read_manifest
from quotientsharp.workflows.options import (
    BatchSettings,
    BootstrapSettings,
    InputError,
    SolverSettings,
    StudyConfig,
)
from quotientsharp.workflows.runner import StudyOutcome, run_study
from quotientsharp.workflows.taus import TauInterval, tau_interval

__all__ = [
    "BatchSettings",
    "BootstrapSettings",
    "InputError",
    "ManifestEntry",
    "SolverSettings",
    "StudyConfig",
    "StudyOutcome",
    "TauInterval",
    "read_manifest",
    "run_study",
    "tau_interval",
]
