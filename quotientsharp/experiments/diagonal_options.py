"""Command-line options of ``quotientsharp reproduce diagonal``, without torch.

``reproduce diagonal --help`` imports this module only (the study module names it in
``OPTIONS``), so the help answers without loading torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce diagonal``."""
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default results/diagonal, or "
                        "results/diagonal-quick with --quick)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the nets already in the results folder and compute only the "
                        "missing ones (the settings must match)")
    parser.add_argument("--quick", action="store_true",
                        help="reduced run: 12 nets, 10 ascent steps, 2000 test inputs")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    parser.add_argument("--nets", type=int, default=None,
                        help="number of nets (default 50, or 12 with --quick)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the scatter plots")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress bars (default: on a terminal)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help="also write DIR/results/diagonal.md and regenerate DIR/results.md")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1: fastest for these small "
                        "tensors)")
