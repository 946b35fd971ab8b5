"""Command-line options every ``quotientsharp reproduce STUDY`` has, without torch.

Each study's options module (``diagonal_options``, ``family_options``, ``invariance``) adds its
own options to these: where the results go, ``--resume``, plots, progress, docs and threads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_common_options"]


def add_common_options(parser: argparse.ArgumentParser, name: str, units: str,
                       out_note: str = "", docs_note: str = "") -> None:
    """``--out``, ``--resume``, ``--no-plots``, ``--progress``, ``--docs`` and ``--threads``.

    Parameters
    ----------
    parser
        The study's subparser.
    name
        Study name: the default results folder ``results/NAME`` and the docs section.
    units
        What the results folder holds, in words (``"nets"``, ``"models"``, ...): ``--resume``
        keeps those already there.
    out_note, docs_note
        Text appended to the help of ``--out`` and ``--docs``.
    """
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results folder (default results/{name}, or "
                             f"results/{name}-quick with --quick){out_note}")
    parser.add_argument("--resume", action="store_true",
                        help=f"keep the {units} already in the results folder and compute only "
                             "the missing ones (the settings must match)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the figures")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress bars (default: on a terminal)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help=f"also write DIR/results/{name}.md{docs_note} and regenerate "
                             "DIR/results.md")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1: fastest for these "
                             "small tensors)")
