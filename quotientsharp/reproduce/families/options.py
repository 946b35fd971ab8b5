"""Command-line options and sizes of the family studies, without torch.

The studies: ``reproduce vit``, ``bert``, ``vit-finetune``, ``minilm`` and ``lora``.

``reproduce vit --help`` imports only this module (the study names
``family_options:add_vit_arguments`` in ``OPTIONS``), so the help answers without loading
torch. The sizes the options mention are the ones the studies' variants use.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from quotientsharp.reproduce.options import add_common_options

__all__ = ["BERT_SIZES", "LORA_SIZES", "MINILM_SIZES", "VIT_FINETUNE_SIZES", "VIT_SIZES",
           "FamilySizes", "add_bert_arguments", "add_family_arguments", "add_lora_arguments",
           "add_minilm_arguments",
           "add_vit_arguments", "add_vit_finetune_arguments"]


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


def add_family_arguments(parser: argparse.ArgumentParser, name: str, sizes: FamilySizes) -> None:
    """Command-line options of a family study (the conventions of ``reproduce diagonal``)."""
    add_common_options(parser, name, "models")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced run ({sizes.quick_models} models, tiny training, "
                             f"{sizes.quick_n_iter} ascent steps): a smoke test, not a result")
    parser.add_argument("--seed", type=int, default=0,
                        help="study seed: hyperparameters and initialisation of model i are "
                             "drawn from (seed, i) (default 0)")
    parser.add_argument("--study-seeds", type=int, default=None, metavar="S",
                        help="replicate over S study seeds (--seed, --seed + 1, ...): each "
                             "draws new hyperparameters, initialisations and training-pool "
                             "order for its --models models; the page gives per-seed taus, "
                             "taus pooled over the seeds with a cluster bootstrap interval, "
                             "and Holm-corrected paired differences (default: one seed, the "
                             "single-seed study)")
    parser.add_argument("--models", type=int, default=None,
                        help=f"number of models (default {sizes.full_models}, or "
                             f"{sizes.quick_models} with --quick)")
    parser.add_argument("--device", default="cpu",
                        help="torch device of training and measuring, e.g. cuda (default cpu)")
    parser.add_argument("--n-iter", type=int, default=None,
                        help=f"Auto-PGD steps per batch (default {sizes.full_n_iter}, or "
                             f"{sizes.quick_n_iter} with --quick)")
    parser.add_argument("--sharpness-points", type=int, default=None,
                        help=f"training points the sharpness is measured on (default "
                             f"{sizes.full_sharpness_points})")
    parser.add_argument("--sharpness-batch-size", type=int, default=None,
                        help=f"batch of the sharpness measurement (default "
                             f"{sizes.full_sharpness_batch_size})")


def add_vit_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce vit``."""
    add_family_arguments(parser, "vit", VIT_SIZES)


def add_bert_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce bert``."""
    add_family_arguments(parser, "bert", BERT_SIZES)


def add_vit_finetune_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce vit-finetune``."""
    add_family_arguments(parser, "vit-finetune", VIT_FINETUNE_SIZES)


def add_minilm_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce minilm``."""
    add_family_arguments(parser, "minilm", MINILM_SIZES)


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce lora``."""
    add_family_arguments(parser, "lora", LORA_SIZES)
