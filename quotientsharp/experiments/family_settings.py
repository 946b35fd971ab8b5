"""Family studies (ViT, BERT): what defines a study and its variants.

:class:`FamilyStudy` is what distinguishes the ViT and BERT studies (data, model, radii, the
paper's numbers), :class:`FamilySettings` the sizes of its full and ``--quick`` variants;
the options of ``quotientsharp reproduce vit|bert`` are declared, without torch, in
:mod:`quotientsharp.experiments.family_options`;
:func:`study_settings` collects everything that determines the results (``run.json``, checked on
``--resume``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from .family_data import ClassificationData
from .family_measures import MeasureSpec
from .family_training import HyperparameterSpace

__all__ = [
    "FamilySettings",
    "FamilyStudy",
    "study_settings",
]


@dataclass(frozen=True)
class FamilySettings:
    """Sizes of one variant (full or ``--quick``) of a family study.

    Attributes
    ----------
    models
        Number of models ``M``.
    space
        Hyperparameter ranges.
    train_batch_size
        Minibatch size of training.
    sharpness_points, sharpness_batch_size
        The fixed sharpness set: the first ``sharpness_points`` pool points, in batches.
    n_iter
        Auto-PGD steps per batch.
    """

    models: int
    space: HyperparameterSpace
    train_batch_size: int
    sharpness_points: int
    sharpness_batch_size: int
    n_iter: int

    def as_dict(self) -> dict[str, Any]:
        return {"models": self.models, "hyperparameter_space": self.space.as_dict(),
                "train_batch_size": self.train_batch_size,
                "sharpness_points": self.sharpness_points,
                "sharpness_batch_size": self.sharpness_batch_size, "n_iter": self.n_iter}


@dataclass(frozen=True)
class FamilyStudy:
    """What distinguishes the ViT and BERT studies; the protocol is :func:`run_family_study`.

    Attributes
    ----------
    name
        Study name (``"vit"``), also the results folder and docs section name.
    title
        Section title.
    load_data
        ``quick -> ClassificationData`` (deterministic, offline).
    build_model
        ``(num_labels) -> nn.Module``; called right after ``torch.manual_seed(init_seed)``.
    model_config
        The architecture, for ``run.json`` and the docs.
    full, quick
        The two variants.
    paper
        The paper's taus by paper key (``"adaptive"``, ``"geodesic_inv"``, ...).
    paper_setting
        The paper's setting of those numbers, in words.
    rhos
        Radii ``adaptive``, ``worst_case``, ``inv``, ``mix``.
    description
        Markdown paragraph(s) for the docs section: the protocol in words.
    """

    name: str
    title: str
    load_data: Callable[[bool], ClassificationData]
    build_model: Callable[[int], nn.Module]
    model_config: Mapping[str, Any]
    full: FamilySettings
    quick: FamilySettings
    paper: Mapping[str, float]
    paper_setting: str
    rhos: Mapping[str, float]
    description: str


def study_settings(study: FamilyStudy, variant: FamilySettings, models: int, seed: int,
                   specs: Sequence[MeasureSpec], data: ClassificationData,
                   quick: bool) -> dict[str, Any]:
    """Everything that determines the results (saved in ``run.json``, checked on resume)."""
    return {
        "study": study.name, "quick": quick, "seed": seed, **variant.as_dict(), "models": models,
        "model_config": dict(study.model_config), "data": dict(data.description),
        "measures": [spec.as_dict() for spec in specs], "sharpness_seed": 0,
        "gap": "test error - train error (0-1 errors; train error on the model's own training "
               "set)",
        "optimizer": "AdamW, 5% linear warm-up then cosine decay to 0, label-smoothed "
                     "cross-entropy, dropout 0",
    }
