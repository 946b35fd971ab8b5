"""Command-line options and sizes of the family studies (``reproduce vit|bert``), without torch.

``reproduce vit --help`` imports only this module (the study names
``family_options:add_vit_arguments`` in ``OPTIONS``), so the help answers without loading
torch. The sizes the options mention are the ones the studies' variants use.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .study_options import add_common_options

__all__ = ["BERT_SIZES", "VIT_SIZES", "FamilySizes", "add_bert_arguments",
           "add_family_arguments", "add_vit_arguments"]


@dataclass(frozen=True)
class FamilySizes:
    """Models of the full and ``--quick`` variants, and the quick variant's ascent steps."""

    full_models: int
    quick_models: int
    quick_n_iter: int


VIT_SIZES = FamilySizes(full_models=32, quick_models=6, quick_n_iter=3)
BERT_SIZES = FamilySizes(full_models=32, quick_models=6, quick_n_iter=3)


def add_family_arguments(parser: argparse.ArgumentParser, name: str, sizes: FamilySizes) -> None:
    """Command-line options of a family study (the conventions of ``reproduce diagonal``)."""
    add_common_options(parser, name, "models")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced run ({sizes.quick_models} models, tiny training, "
                             f"{sizes.quick_n_iter} ascent steps): a smoke test, not a result")
    parser.add_argument("--seed", type=int, default=0,
                        help="study seed: hyperparameters and initialisation of model i are "
                             "drawn from (seed, i) (default 0)")
    parser.add_argument("--models", type=int, default=None,
                        help=f"number of models (default {sizes.full_models}, or "
                             f"{sizes.quick_models} with --quick)")


def add_vit_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce vit``."""
    add_family_arguments(parser, "vit", VIT_SIZES)


def add_bert_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce bert``."""
    add_family_arguments(parser, "bert", BERT_SIZES)
