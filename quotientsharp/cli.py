"""The ``quotientsharp`` console script."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quotientsharp",
        description="Riemannian geometry on symmetry quotients of neural networks, and "
                    "geodesic sharpness.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in COMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            # a subcommand whose optional extra is missing is left out, not fatal
            if getattr(err, "name", None) and str(err.name).startswith("quotientsharp"):
                continue
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
