"""Family studies: what defines a study (:class:`FamilyStudy`), its variants, the settings
that determine its results (``run.json``, checked on ``--resume``) and a pretrained start."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quotientsharp.reproduce.families.data import ClassificationData
from quotientsharp.reproduce.families.measures import MeasureSpec
from quotientsharp.reproduce.families.training import Hyperparameters, HyperparameterSpace


@dataclass(frozen=True)
class FamilySettings:
    """Sizes of one variant (full or ``--quick``) of a family study."""

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
    """The one pretrained network every model of a fine-tuning family starts from:
    ``settings(quick)``, what determines it (JSON); ``load(results folder, quick)``, the start
    ``build_model`` takes; ``describe(start)``, a line for the page."""

    settings: Callable[[bool], Mapping[str, Any]]
    load: Callable[[Path, bool], Any]
    describe: Callable[[Any], str] | None = None


@dataclass(frozen=True)
class FamilyStudy:
    """What distinguishes one family study from another.

    ``build_model(num_labels[, start])`` is called right after ``torch.manual_seed(init_seed)``
    (which seeds a fresh head); ``paper`` holds the paper's taus by paper key (``"adaptive"``,
    ``"geodesic_inv"``, ...); ``rhos`` the radii ``adaptive``, ``worst_case``, ``inv``, ``mix``;
    ``eps_sweep`` Gram relaxations at which geodesic inv and mix (order 2) are measured too;
    ``adapt(model, hyperparameters)`` adapts a model before training (e.g. LoRA);
    ``measure_keys`` restricts the measures; ``measurement_note`` replaces the page's text on
    the geodesic measures' quotient and radii.
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


#: File name of a cached pretraining inside a study's results folder.
PRETRAINED_FILE = "pretrained.pt"


def load_body(model: nn.Module, state: Mapping[str, torch.Tensor],
              head_prefix: str | None) -> None:
    """Copy ``state`` into ``model`` but for the fresh head under ``head_prefix`` (``None``:
    every weight); ``ValueError`` for a missing or unexpected weight (a half-loaded body would
    make every fine-tune start from noise)."""
    def in_head(key: str) -> bool:
        return head_prefix is not None and key.startswith(head_prefix)

    body = {k: v for k, v in state.items() if not in_head(k)}
    missing, unexpected = model.load_state_dict(body, strict=False)
    missing = [k for k in missing if not in_head(k)]
    if missing or unexpected:
        raise ValueError(f"pretrained weights do not fit the model: missing {missing[:5]}, "
                         f"unexpected {list(unexpected)[:5]}")


def cached_pretraining(folder: Path, settings: Mapping[str, Any],
                       compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The pretraining of ``settings``, from ``folder/pretrained.pt`` or computed by
    ``compute`` (a dict with the ``"state"``) and saved there, plus ``settings`` and
    ``cached``."""
    path = Path(folder) / PRETRAINED_FILE
    wanted = json.loads(json.dumps(dict(settings)))
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if json.loads(saved.get("settings_json", "null")) == wanted:
            return {**{k: v for k, v in saved.items() if k != "settings_json"},
                    "settings": wanted, "cached": True}
    result = compute()
    if "state" not in result:
        raise ValueError("the pretraining must return its weights under 'state'")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    # written aside then renamed: an interrupted save never leaves a torn cache behind
    torch.save({**result, "settings_json": json.dumps(wanted)}, partial)
    os.replace(partial, path)
    return {**result, "settings": wanted, "cached": False}
