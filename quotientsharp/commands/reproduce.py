"""``quotientsharp reproduce STUDY``: rerun one of the paper's studies.

The studies are listed in :data:`quotientsharp.experiments.STUDIES` (name -> module path); each
study module supplies ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``, so a new study
needs one registry line and no change here.
"""

from __future__ import annotations

import argparse
import importlib


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``reproduce`` and one sub-subcommand per registered study."""
    from ..experiments import STUDIES

    parser = subparsers.add_parser(
        "reproduce", help="rerun one of the paper's studies (Kendall tau of generalisation "
        "against sharpness, next to the paper's numbers)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    studies = parser.add_subparsers(dest="study", required=True, metavar="STUDY")
    for name, module_path in STUDIES.items():
        try:
            module = importlib.import_module(module_path)
        except ImportError as err:
            # a study whose module (or optional dependency) is missing is left out, not fatal
            if getattr(err, "name", None) and str(err.name).startswith("quotientsharp"):
                continue
            raise
        study_parser = studies.add_parser(
            name, help=getattr(module, "HELP", None), description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(study_parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..experiments import load_study

    return int(load_study(args.study).run(args) or 0)
