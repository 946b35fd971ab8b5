"""Training and measuring code shared by the ViT and BERT family studies.

A *family study* (``reproduce vit``, ``reproduce bert``) trains ``M`` small transformers whose
hyperparameters are drawn at random per model, measures each model's generalisation gap
(test error minus train error, 0-1 errors) and its sharpness under several measures on one fixed
set of training points, and reports Kendall's tau between gap and sharpness per measure, as
the paper does for its ImageNet (ViT) and MNLI (BERT) fine-tunes.

Protocol, shared by both families:

- a fixed *training pool* and a fixed *test set* (the family's data); model ``i`` trains on the
  first ``train_size_i`` points of the pool. The sharpness points are the first
  ``sharpness_points`` points of the pool, so they lie in every model's training set;
- the hyperparameters of model ``i`` are drawn from ``numpy.random.default_rng([seed, i])``:
  they depend only on the study seed and the index, so a resumed or partial run draws the same
  ones (no seed picking: models are never filtered or redrawn);
- training: AdamW, batch size ``batch_size``, linear warm-up over the first 5% of the steps then
  cosine decay to zero, cross-entropy with label smoothing, dropout off; the initialisation and
  the order of the minibatches come from ``torch.manual_seed(init_seed_i)``;
- sharpness: every measure of :data:`FAMILY_MEASURES` on the same batches, through
  :func:`quotientsharp.sharpness` with ``seed=0`` (deterministic ascent from ``xi = 0``).

Everything runs on the CPU with ``torch.set_num_threads(threads)`` (1 by default: these models
are tiny and several threads only add synchronisation).

The code lives in one module per stage of the protocol; this module re-exports their names:

- :mod:`~quotientsharp.experiments.family_data`: the training pool, the test set and the fixed
  sharpness batches;
- :mod:`~quotientsharp.experiments.family_training`: hyperparameter draws, training, evaluation;
- :mod:`~quotientsharp.experiments.family_measures`: the measures and their radii, run on one
  model;
- :mod:`~quotientsharp.experiments.family_settings`: what defines a study, its variants and its
  command-line options;
- :mod:`~quotientsharp.experiments.family_report`: CSV columns, Kendall taus, the docs section;
- :mod:`~quotientsharp.experiments.family_run`: the study driver and its command-line entry.
"""

from __future__ import annotations

from .family_data import ClassificationData, Inputs, sharpness_batches, take
from .family_measures import FAMILY_MEASURES, MeasureSpec, family_measures, measure_model
from .family_options import add_family_arguments
from .family_report import csv_columns, family_section, tau_rows
from .family_run import FamilyOutcome, family_study, run_family_study
from .family_settings import (
    FamilySettings,
    FamilyStudy,
    study_settings,
)
from .family_training import (
    Hyperparameters,
    HyperparameterSpace,
    draw_hyperparameters,
    error_rate,
    mean_loss,
    train_classifier,
)

__all__ = [
    "FAMILY_MEASURES",
    "ClassificationData",
    "FamilyOutcome",
    "FamilySettings",
    "FamilyStudy",
    "HyperparameterSpace",
    "Hyperparameters",
    "Inputs",
    "MeasureSpec",
    "add_family_arguments",
    "csv_columns",
    "draw_hyperparameters",
    "error_rate",
    "family_measures",
    "family_section",
    "family_study",
    "mean_loss",
    "measure_model",
    "run_family_study",
    "sharpness_batches",
    "study_settings",
    "take",
    "tau_rows",
    "train_classifier",
]
