"""Command-line options of the family studies (``reproduce vit|bert``), without torch.

``reproduce vit --help`` imports only the study's options module (``vit_options``), which
calls :func:`add_family_arguments` with the study's sizes, so the help answers without
loading torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_family_arguments"]


def add_family_arguments(parser: argparse.ArgumentParser, name: str, full_models: int,
                         quick_models: int, quick_n_iter: int) -> None:
    """Command-line options of a family study (the conventions of ``reproduce diagonal``).

    Parameters
    ----------
    parser
        The study's subparser.
    name
        Study name (``"vit"``): the results folder and docs section.
    full_models, quick_models
        Number of models of the full and ``--quick`` variants.
    quick_n_iter
        Ascent steps of the ``--quick`` variant.
    """
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results folder (default results/{name}, or "
                             f"results/{name}-quick with --quick)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the models already in the results folder and compute only "
                             "the missing ones (the settings must match)")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced run ({quick_models} models, tiny training, "
                             f"{quick_n_iter} ascent steps): a smoke test, not a result")
    parser.add_argument("--seed", type=int, default=0,
                        help="study seed: hyperparameters and initialisation of model i are "
                             "drawn from (seed, i) (default 0)")
    parser.add_argument("--models", type=int, default=None,
                        help=f"number of models (default {full_models}, or "
                             f"{quick_models} with --quick)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the scatter plots")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress bars (default: on a terminal)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help=f"also write DIR/results/{name}.md and regenerate "
                             "DIR/results.md")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1: fastest for these tiny "
                             "models)")
