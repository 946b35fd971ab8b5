"""Family studies (ViT, BERT): what defines a study and its variants.

:class:`FamilyStudy` is what distinguishes the ViT and BERT studies (data, model, radii, the
paper's numbers), :class:`FamilySettings` the sizes of its full and ``--quick`` variants
(their sizes, without torch, in :mod:`quotientsharp.reproduce.families.sizes`);
:func:`study_settings` collects everything that determines the results (``run.json``, checked on
``--resume``).
"""

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
class PretrainedStart:
    """The one pretrained network every model of a fine-tuning family starts from.

    Attributes
    ----------
    settings
        ``quick -> dict``: everything that determines the pretrained weights (a model name and
        file, or the pretraining recipe), JSON-serialisable; saved in ``run.json`` and checked
        on ``--resume``.
    load
        ``(results folder, quick) -> start``: the pretrained weights (any object the study's
        ``build_model`` takes as its second argument), computed and cached in the results
        folder the first time if the study pretrains itself, read back afterwards.
    describe
        ``start -> markdown``: a line for the docs section (e.g. the pretraining's own errors).
    """

    settings: Callable[[bool], Mapping[str, Any]]
    load: Callable[[Path, bool], Any]
    describe: Callable[[Any], str] | None = None


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
        ``(num_labels) -> nn.Module``, or ``(num_labels, start) -> nn.Module`` when
        ``pretrained`` is set (``start``: what ``pretrained.load`` returned); called right after
        ``torch.manual_seed(init_seed)``, which seeds any fresh layer (the classifier head).
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
    pretrained
        ``None``: every model trains from scratch; otherwise the common pretrained start of a
        fine-tuning family.
    eps_sweep
        Gram relaxations ``eps > 0`` at which geodesic inv and mix (order 2) are measured as
        well (:func:`~quotientsharp.reproduce.families.measures.eps_sweep_measures`).
    adapt
        ``(model, hyperparameters) -> model``, applied to each built model before training
        (e.g. wrapping it with low-rank adapters of the drawn rank); ``None``: train the model
        as built.
    measure_keys
        The keys of the measures this study runs, a subset of the family measures and the
        eps sweep (``None``: all of them).
    measurement_note
        Sentences for the docs section on what the geodesic measures treat as the quotient and
        how the radii were fixed (``None``: the text of the attention families).
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
    extra: dict[str, Any] = {}
    if study.pretrained is not None:
        extra["pretrained"] = dict(study.pretrained.settings(quick))
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
