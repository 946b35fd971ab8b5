"""The ``quotientsharp`` console script.

Building the parser imports no torch (the subcommands import it when they run), so
``quotientsharp --help`` and every subcommand's ``--help`` answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from .commands import COMMANDS

#: Exit status after the reader of stdout went away (``... | head``): 128 + SIGPIPE.
BROKEN_PIPE_STATUS = 141


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


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's final flush cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command])
    try:
        status = int(module.run(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``quotientsharp symmetries --json | head``): stop quietly
        _quiet_stdout()
        return BROKEN_PIPE_STATUS
    return status


if __name__ == "__main__":
    sys.exit(main())
