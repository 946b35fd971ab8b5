"""Sizes of the family studies' variants, without torch: the studies' options
(:mod:`quotientsharp.cli.reproduce_options`) quote them in their help, which loads no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FamilySizes:
    """Models of the full and ``--quick`` variants, their ascent steps, and the sharpness
    points and batch of the full variant."""

    full_models: int
    quick_models: int
    quick_n_iter: int
    full_n_iter: int = 20
    full_sharpness_points: int = 256
    full_sharpness_batch_size: int = 64


VIT_SIZES = FamilySizes(full_models=32, quick_models=6, quick_n_iter=3)
BERT_SIZES = FamilySizes(full_models=32, quick_models=6, quick_n_iter=3)
VIT_FINETUNE_SIZES = FamilySizes(full_models=32, quick_models=3, quick_n_iter=2)
#: the MiniLM family's default measurement is reduced to run on a CPU (its results page)
MINILM_SIZES = FamilySizes(full_models=30, quick_models=3, quick_n_iter=2, full_n_iter=2,
                           full_sharpness_points=8, full_sharpness_batch_size=8)
#: the LoRA family's default is reduced too (20 models, 16 points, 3 steps): one CPU core
LORA_SIZES = FamilySizes(full_models=20, quick_models=3, quick_n_iter=2, full_n_iter=3,
                         full_sharpness_points=16, full_sharpness_batch_size=16)
