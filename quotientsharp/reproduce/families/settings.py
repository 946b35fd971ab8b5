"""Family studies: what defines a study (:class:`FamilyStudy`), its variants and the settings
that determine its results (``run.json``, checked on ``--resume``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from quotientsharp.reproduce.families.data import ClassificationData
from quotientsharp.reproduce.families.measures import MeasureSpec
from quotientsharp.reproduce.families.training import Hyperparameters, HyperparameterSpace


@dataclass(frozen=True)
class FamilySettings:
    """Sizes of one variant (full or ``--quick``) of a family study: ``models``, the
    hyperparameter ``space``, the training minibatch, the sharpness set (the first
    ``sharpness_points`` pool points, in batches) and the Auto-PGD steps ``n_iter``."""

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
class PretrainedStart:
    """The one pretrained network every model of a fine-tuning family starts from.

    Attributes
    ----------
    settings
        ``quick -> dict``: what determines the pretrained weights (JSON, in ``run.json``).
    load
        ``(results folder, quick) -> start``: what the study's ``build_model`` takes as its
        second argument (a self-pretraining is cached in the results folder).
    describe
        ``start -> markdown``: a line for the docs section (e.g. the pretraining's errors).
    """

    settings: Callable[[bool], Mapping[str, Any]]
    load: Callable[[Path, bool], Any]
    describe: Callable[[Any], str] | None = None


@dataclass(frozen=True)
class FamilyStudy:
    """What distinguishes one family study from another.

    Attributes
    ----------
    name
        Study name (``"vit"``), also the results folder and docs section name.
    title
        Section title.
    load_data
        ``quick -> ClassificationData`` (deterministic, offline).
    build_model
        ``(num_labels) -> nn.Module``, or ``(num_labels, start)`` with a ``pretrained`` start;
        called right after ``torch.manual_seed(init_seed)``, which seeds a fresh head.
    model_config
        The architecture, for ``run.json`` and the docs.
    full, quick
        The two variants.
    paper, paper_setting
        The paper's taus by paper key (``"adaptive"``, ``"geodesic_inv"``, ...), and their
        setting in words.
    rhos
        Radii ``adaptive``, ``worst_case``, ``inv``, ``mix``.
    description
        Markdown paragraph(s) for the docs section: the protocol in words.
    pretrained
        The common start of a fine-tuning family (``None``: every model from scratch).
    eps_sweep
        Gram relaxations ``eps > 0`` at which geodesic inv and mix (order 2) are measured too.
    adapt
        ``(model, hyperparameters) -> model`` before training (e.g. low-rank adapters of the
        drawn rank); ``None``: train the model as built.
    measure_keys
        The measures this study runs (``None``: the family measures and the eps sweep).
    measurement_note
        Docs sentences on what the geodesic measures treat as the quotient and how the radii
        were fixed (``None``: the text of the attention families).
    """

    name: str
    title: str
    load_data: Callable[[bool], ClassificationData]
    build_model: Callable[..., nn.Module]
    model_config: Mapping[str, Any]
    full: FamilySettings
    quick: FamilySettings
    paper: Mapping[str, float]
    paper_setting: str
    rhos: Mapping[str, float]
    description: str
    pretrained: PretrainedStart | None = None
    eps_sweep: tuple[float, ...] = ()
    adapt: Callable[[nn.Module, Hyperparameters], nn.Module] | None = None
    measure_keys: tuple[str, ...] | None = None
    measurement_note: str | None = None


def study_settings(study: FamilyStudy, variant: FamilySettings, models: int, seed: int,
                   specs: Sequence[MeasureSpec], data: ClassificationData,
                   quick: bool) -> dict[str, Any]:
    """Everything that determines the results (saved in ``run.json``, checked on resume)."""
    # the fine-tuning fields only when used: run.json of the from-scratch studies is unchanged
    extra = ({} if study.pretrained is None
             else {"pretrained": dict(study.pretrained.settings(quick))})
    space = variant.space
    warmup = ("warm-up over a fraction of the steps drawn per model" if space.warmup is not None
              else "5% linear warm-up")
    return {
        **extra,
        "study": study.name, "quick": quick, "seed": seed, **variant.as_dict(), "models": models,
        "model_config": dict(study.model_config), "data": dict(data.description),
        "measures": [spec.as_dict() for spec in specs], "sharpness_seed": 0,
        "gap": "test error - train error (0-1 errors; train error on the model's own training "
               "set)",
        "optimizer": f"AdamW, {warmup} then cosine decay to 0, label-smoothed "
                     "cross-entropy, dropout 0",
    }
