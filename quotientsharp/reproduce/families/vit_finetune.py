"""``quotientsharp reproduce vit-finetune``: fine-tunes of one small ViT pretrained once.

The ViT of ``reproduce vit`` pretrained once on the digits 0-4 (cached as ``pretrained.pt`` in
the results folder) and fine-tuned 32 times under a fresh head on the digits 5-9, each with its
own drawn recipe; measured as in ``reproduce vit``, plus geodesic inv and mix at Gram
relaxations eps 0.1 and 1 (``docs/results/vit-finetune.md`` gives every setting). ``--quick``: 3
models. Outputs as for ``reproduce vit``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from quotientsharp.reproduce.config import FamilyConfig
from quotientsharp.reproduce.families.data import ClassificationData
from quotientsharp.reproduce.families.run import run_family_study
from quotientsharp.reproduce.families.settings import (
    FamilySettings,
    FamilyStudy,
    PretrainedStart,
    cached_pretraining,
    load_body,
)
from quotientsharp.reproduce.families.sizes import VIT_FINETUNE_SIZES
from quotientsharp.reproduce.families.training import (
    Hyperparameters,
    HyperparameterSpace,
    error_rate,
    train_classifier,
)
from quotientsharp.reproduce.families.vit import (
    DATA_SEED,
    MODEL_CONFIG,
    PAPER,
    PAPER_SETTING,
    RHOS,
    digit_data,
)
from quotientsharp.reproduce.families.vit import build_model as build_vit

HELP = ("fine-tunes of a small ViT pretrained once (digits 0-4 -> 5-9): Kendall tau of "
        "sharpness vs generalisation gap")
#: What the taus rank sharpness against (the console's sign convention).
GENERALISATION = "the generalisation gap"

PRETRAIN_CLASSES, FINETUNE_CLASSES = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9)
PRETRAIN_TRAIN = 720
POOL_SIZE = 600
EPS_SWEEP = (0.1, 1.0)

#: The pretraining recipe (full, quick): the settings of ``pretrained.pt``.
PRETRAINING: dict[bool, dict[str, Any]] = {
    quick: {"learning_rate": 2e-3, "weight_decay": 1e-2, "epochs": 2 if quick else 40,
            "batch_size": 64, "torch_seed": 0}
    for quick in (False, True)}

FULL = FamilySettings(
    models=VIT_FINETUNE_SIZES.full_models,
    space=HyperparameterSpace(learning_rate=(1e-4, 3e-3), weight_decay=(1e-4, 1e-1),
                              epochs=(3, 30), label_smoothing=(0.0, 0.1),
                              train_size=(256, POOL_SIZE), batch_size=(16, 32, 64),
                              warmup=(0.0, 0.2)),
    train_batch_size=64, sharpness_points=VIT_FINETUNE_SIZES.full_sharpness_points,
    sharpness_batch_size=VIT_FINETUNE_SIZES.full_sharpness_batch_size,
    n_iter=VIT_FINETUNE_SIZES.full_n_iter)
QUICK = replace(FULL, models=VIT_FINETUNE_SIZES.quick_models,
                space=replace(FULL.space, epochs=(1, 2), train_size=(64, 96), batch_size=(32, 64)),
                sharpness_points=32, sharpness_batch_size=32,
                n_iter=VIT_FINETUNE_SIZES.quick_n_iter)


def load_data(quick: bool = False) -> ClassificationData:
    """Digits 5-9 (labels 0-4): training pool 600, test set the other 296."""
    return digit_data(FINETUNE_CLASSES, POOL_SIZE, restricted=", restricted to 5-9",
                      classes_note="digits 5-9 as labels 0-4 (pretraining: digits 0-4)")


def pretrained_settings(quick: bool) -> dict[str, Any]:
    """The pretraining recipe (``run.json``, and the key of the cache)."""
    return {"architecture": "the ViT of reproduce vit", "classes": list(PRETRAIN_CLASSES),
            "train_images": PRETRAIN_TRAIN, "data_seed": DATA_SEED, **PRETRAINING[quick],
            "schedule": "5% warm-up then cosine decay, no label smoothing"}


def _pretrain(quick: bool) -> dict[str, Any]:
    """The pretraining on digits 0-4: 720 images, the rest held out."""
    import torch

    data = digit_data(PRETRAIN_CLASSES, PRETRAIN_TRAIN)
    recipe = PRETRAINING[quick]
    torch.manual_seed(recipe["torch_seed"])
    model = build_vit(data.num_labels)
    hyper = Hyperparameters(recipe["learning_rate"], recipe["weight_decay"], recipe["epochs"],
                            0.0, data.pool_size, recipe["torch_seed"])
    start = time.perf_counter()
    train_classifier(model, data, hyper, recipe["batch_size"])
    return {"state": model.state_dict(), "seconds": time.perf_counter() - start,
            "train_error": error_rate(model, data.train_inputs, data.train_labels),
            "test_error": error_rate(model, data.test_inputs, data.test_labels)}


def load_pretrained(folder: Path, quick: bool) -> dict[str, Any]:
    """The pretrained ViT, from ``folder/pretrained.pt`` or pretrained now and cached there."""
    return cached_pretraining(folder, pretrained_settings(quick), lambda: _pretrain(quick))


def describe_pretrained(start: dict[str, Any]) -> str:
    """The pretraining's own result, for the docs section."""
    return (f"Pretrained model on digits 0-4: train error {start['train_error']:.3f}, held-out "
            f"error {start['test_error']:.3f}, {start['seconds']:.0f} s of training when it "
            "was computed.")


def build_model(num_labels: int, start: dict[str, Any]):
    """The ViT of ``reproduce vit`` with the pretrained body and a fresh ``num_labels`` head."""
    model = build_vit(num_labels)
    load_body(model, start["state"], head_prefix="classifier.")
    return model


DESCRIPTION = """
Fine-tunes of one pretrained network: the small ViT of `reproduce vit`, pretrained once on the
digits 0-4 of scikit-learn's bundled 8x8 digits, then fine-tuned under a fresh five-class head
(every weight trained) on the digits 5-9: a different but related task (same images, strokes
and patch statistics; new classes). Training pool: 600 images of 5-9; test set: the other 296.
Each model trains on the first n images of the pool, n drawn per model. Geodesic order 1 is the
ablation "corrected norm only" of the paper (the quotient metric's ball, straight path); order
2 adds the second-order (Christoffel) term; the eps rows relax the Gram matrices of the
attention pairs by eps times the identity.
"""

STUDY = FamilyStudy(
    name="vit-finetune", title="ViT fine-tunes, digits 0-4 to 5-9 (`reproduce vit-finetune`)",
    load_data=load_data, build_model=build_model, model_config=MODEL_CONFIG, full=FULL,
    quick=QUICK, paper=PAPER, paper_setting=PAPER_SETTING, rhos=RHOS, description=DESCRIPTION,
    pretrained=PretrainedStart(pretrained_settings, load_pretrained, describe_pretrained),
    eps_sweep=EPS_SWEEP)


def run(config: FamilyConfig) -> int:
    """Run the study as ``config`` says; the exit status (:func:`.run.run_family_study`)."""
    return run_family_study(STUDY, config)
