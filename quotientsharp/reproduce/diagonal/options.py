"""Command-line options of ``quotientsharp reproduce diagonal``, without torch.

``reproduce diagonal --help`` imports this module only (the study module names it in
``OPTIONS``), so the help answers without loading torch.
"""

from __future__ import annotations

import argparse

from quotientsharp.reproduce.options import add_common_options

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce diagonal``."""
    add_common_options(parser, "diagonal", "nets")
    parser.add_argument("--quick", action="store_true",
                        help="reduced run: 12 nets, 10 ascent steps, 2000 test inputs")
    parser.add_argument("--full", action="store_true",
                        help="also run 3 data seeds, the rho sweep 0.03, 0.1, 0.3 and a "
                        "training set per net, each in OUT/full/<run>/, and write the pooled "
                        "tables (about 10 to 20 minutes on one core)")
    parser.add_argument("--rhos", default=None, metavar="LIST",
                        help="with --full: the radii of the rho sweep, comma-separated "
                             "(default 0.03,0.1,0.3; must contain the study's 0.1); fewer "
                             "radii make a shorter run")
    parser.add_argument("--per-net-seeds", type=int, default=None, metavar="N",
                        help="with --full: run the training-set-per-net variant on the first "
                             "N seeds only (default all 3; 0 for none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    parser.add_argument("--nets", type=int, default=None,
                        help="number of nets (default 50, or 12 with --quick)")
