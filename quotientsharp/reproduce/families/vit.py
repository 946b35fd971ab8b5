"""``quotientsharp reproduce vit``: sharpness vs generalisation on a family of small ViTs.

The paper's ImageNet study (72 CLIP ViT-B/32 fine-tunes) scaled down to CPU, offline: 32 small
``transformers`` ViTs trained from scratch on scikit-learn's 8x8 digits, each with its own drawn
recipe; the Kendall tau of the generalisation gap against adaptive, worst-case, geodesic inv and
mix and relative flatness (``docs/results/vit.md`` gives every setting). About 15 s of one core
per model; ``--quick``: 6 models, a few epochs, 64 sharpness points, 3 ascent steps. Outputs in
``--out`` (default ``results/vit``): ``models.jsonl``, ``models.csv``, ``taus.json``,
``scatter_<measure>.png``, ``page.json`` and ``run.json``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from quotientsharp.reproduce.config import FamilyConfig
from quotientsharp.reproduce.families.data import ClassificationData
from quotientsharp.reproduce.families.run import run_family_study
from quotientsharp.reproduce.families.settings import FamilySettings, FamilyStudy
from quotientsharp.reproduce.families.sizes import VIT_SIZES
from quotientsharp.reproduce.families.training import HyperparameterSpace

HELP = "small ViTs on scikit-learn's digits: Kendall tau of sharpness vs generalisation gap"
#: What the taus rank sharpness against (the console's sign convention).
GENERALISATION = "the generalisation gap"

#: The paper's Kendall taus on ImageNet (72 CLIP ViT-B/32 fine-tunes).
PAPER = {"adaptive": -0.41, "geodesic_inv": -0.71, "geodesic_mix": -0.70}
PAPER_SETTING = "ImageNet, 72 CLIP ViT-B/32 fine-tunes, 2048 train points in batches of 256"

POOL_SIZE = 1200
DATA_SEED = 0
MODEL_CONFIG: dict[str, Any] = {
    "image_size": 8, "patch_size": 2, "num_channels": 1, "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "attn_implementation": "eager"}
RHOS = {"adaptive": 0.1, "worst_case": 0.02, "inv": 0.1, "mix": 0.02}

FULL = FamilySettings(
    models=VIT_SIZES.full_models,
    space=HyperparameterSpace(learning_rate=(5e-4, 5e-3), weight_decay=(1e-4, 1e-1),
                              epochs=(20, 50), label_smoothing=(0.0, 0.2),
                              train_size=(256, POOL_SIZE)),
    train_batch_size=64, sharpness_points=256, sharpness_batch_size=64, n_iter=20)
QUICK = replace(FULL, models=VIT_SIZES.quick_models,
                space=replace(FULL.space, epochs=(4, 8), train_size=(256, 400)),
                sharpness_points=64, sharpness_batch_size=32, n_iter=VIT_SIZES.quick_n_iter)


def digit_images(classes: tuple[int, ...]):
    """The digits of ``classes`` in the order of the fixed permutation: images
    ``shape=[N, 1, 8, 8]`` in [0, 1] and labels ``classes.index(digit)``."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(DATA_SEED).permutation(len(digits.target))
    order = order[np.isin(digits.target[order], classes)]
    images = torch.tensor(digits.images[order], dtype=torch.float32)[:, None] / 16.0
    labels = torch.tensor([classes.index(int(d)) for d in digits.target[order]])
    return images, labels


def digit_data(classes: tuple[int, ...], pool_size: int, classes_note: Any = None,
               restricted: str = "") -> ClassificationData:
    """The digits of ``classes`` (:func:`digit_images`) split at ``pool_size`` into the training
    pool and the test set; ``classes_note`` and ``restricted`` describe them for ``run.json``."""
    images, labels = digit_images(classes)
    test_size = len(labels) - pool_size
    return ClassificationData(
        train_inputs={"pixel_values": images[:pool_size]}, train_labels=labels[:pool_size],
        test_inputs={"pixel_values": images[pool_size:]}, test_labels=labels[pool_size:],
        num_labels=len(classes),
        description={"source": "sklearn.datasets.load_digits (bundled, offline)",
                     "images": "8x8, 1 channel, pixels / 16", "classes": classes_note,
                     "split": f"numpy permutation seed {DATA_SEED}{restricted}: first "
                              f"{pool_size} = training pool, remaining {test_size} = test set",
                     "pool_size": pool_size, "test_size": test_size})


def load_data(quick: bool = False) -> ClassificationData:
    """Digits as ``pixel_values`` ``shape=[N, 1, 8, 8]`` in [0, 1]; pool 1200, test 597."""
    return digit_data(tuple(range(10)), POOL_SIZE, classes_note=10)


def build_model(num_labels: int):
    """A fresh ``ViTForImageClassification`` of :data:`MODEL_CONFIG` (seed torch first)."""
    from transformers import ViTConfig, ViTForImageClassification

    # num_labels: transformers 5's typed config signature leaves PretrainedConfig's out
    return ViTForImageClassification(ViTConfig(num_labels=num_labels, **MODEL_CONFIG))  # type: ignore[call-arg]


DESCRIPTION = """
A family of small vision transformers (`transformers.ViTForImageClassification`, eager
attention) trained from scratch on scikit-learn's bundled 8x8 digits (1 channel, patch size 2:
16 patches plus the CLS token). Training pool: 1200 images of a fixed permutation; test set: the
other 597. Each model trains on the first n images of the pool, n drawn per model.
"""

STUDY = FamilyStudy(
    name="vit", title="ViT family on digits (`reproduce vit`)", load_data=load_data,
    build_model=build_model, model_config=MODEL_CONFIG, full=FULL, quick=QUICK, paper=PAPER,
    paper_setting=PAPER_SETTING, rhos=RHOS, description=DESCRIPTION)


def run(config: FamilyConfig) -> int:
    """Run the study as ``config`` says; the exit status (:func:`.run.run_family_study`)."""
    return run_family_study(STUDY, config)
