"""``quotientsharp study MANIFEST``: the paper's workflow on your own models.

Given a manifest of saved models with their generalisation gaps (or the train and test data
to compute them) and a shared data file, measure every model on a grid of sharpness measures,
radii, metrics and orders, and report the Kendall rank correlation between the gap and each
measure, with bootstrap intervals, scatter plots and a markdown report. One stage per module:

- :mod:`.manifest`: reading the manifest (:func:`read_manifest`, :class:`ManifestEntry`);
- :mod:`.grid`: the grid of measures from the options of ``quotientsharp measure``
  (:func:`~quotientsharp.workflows.grid.build_grid`,
  :class:`~quotientsharp.workflows.grid.GridPoint`);
- :mod:`.generalisation`: a gap from train and test data (loss and 0-1 error);
- :mod:`.measuring`: one model, from its manifest row to its record;
- :mod:`.taus`: Kendall tau-a and tau-b, with percentile bootstrap intervals
  (:func:`~quotientsharp.workflows.taus.tau_interval`, :class:`TauInterval`; pooled over
  seeds by a two-stage cluster bootstrap);
- :mod:`.report` and :mod:`.plots`: ``models.csv``, the tau table, ``report.md``, the plots;
- :mod:`.runner`: the driver (:func:`run_study`), from the manifest to every output;
- :mod:`.resumable`: the runner of every study, this one and the paper's
  (:class:`~quotientsharp.workflows.resumable.ResumableRun`): records written as units finish,
  ``--resume``, units dealt over the ranks of torchrun;
- the parts it is built from: :mod:`.records` (the results folder, ``run.json``, per-rank
  shards), :mod:`.files` (atomic writes, JSONL), :mod:`.progress`, :mod:`.devices`
  (``--device``).

The command line is :mod:`quotientsharp.cli.study`; ``docs/study.md`` describes the
manifest, the options and the outputs. Nothing here imports torch until a model is measured.
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
