"""The ``quotientsharp`` console script: the top layer, one module per subcommand.

Building the parser imports no torch (the subcommands import it when they run), so
``quotientsharp --help`` and every subcommand's ``--help`` answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from quotientsharp.cli.output_errors import OUTPUT_ERRORS, output_error_message

#: Subcommand -> its module. Every module exposes ``add_parser(subparsers)`` and
#: ``run(args) -> int`` and imports torch inside ``run``, so ``--help`` stays fast.
COMMANDS = {
    "verify": "quotientsharp.cli.verify",
    "symmetries": "quotientsharp.cli.symmetries",
    "measure": "quotientsharp.cli.measure",
    "reproduce": "quotientsharp.cli.reproduce",
    "study": "quotientsharp.cli.study",
}

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1)
    titled = re.fullmatch(r"(.+?)\s*<[^>]+>", text, re.DOTALL)
    if titled:
        return titled.group(1)
    return text[1:].rsplit(".", 1)[-1] if text.startswith("~") else text


def plain_text(text: str | None) -> str | None:
    """A docstring as terminal help: RST roles (``:func:`~a.b```) and double backticks
    stripped to their text."""
    if text is None:
        return None
    return _LITERAL.sub(r"\1", _ROLE.sub(_role_text, text))


__all__ = ["main"]

#: Exit status after the reader of stdout went away (``... | head``): 128 + SIGPIPE.
BROKEN_PIPE_STATUS = 141


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``PROG: error: MESSAGE (see PROG
    --help)``, and exit status 2, as every other error (its subparsers are of its class)."""

    def error(self, message: str) -> NoReturn:
        # argparse's messages are one line; a newline in a value the user gave is not
        line = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="quotientsharp",
        description="Riemannian geometry on symmetry quotients of neural networks, and "
                    "geodesic sharpness.")
    from quotientsharp import __version__

    parser.add_argument("--version", action="version", version=f"quotientsharp {__version__}")
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


def _report_output_error(args: argparse.Namespace, err: BaseException) -> None:
    """Print ``quotientsharp COMMAND: error: MESSAGE`` (:mod:`.output_errors`), on rank 0 or
    on the rank that raised it."""
    from quotientsharp.workflows.records import is_main_rank

    if is_main_rank() or getattr(err, "raised_on_this_rank", False):
        study = getattr(args, "study", None) if args.command == "reproduce" else None
        print(f"quotientsharp {args.command}{f' {study}' if study else ''}: error: "
              f"{output_error_message(err)}", file=sys.stderr)


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
    except OUTPUT_ERRORS as err:
        # a locked, read-only or full output, from any command and stage: one line
        _report_output_error(args, err)
        return 2
    except (SystemExit, KeyboardInterrupt) as err:
        # sys.exit or an interrupt in the user's code: one line naming its module, non-zero
        from quotientsharp.cli.user_exits import exit_status, user_exit_message

        message = user_exit_message(err)
        if message is None:
            raise
        print(f"quotientsharp {args.command}: error: {message}", file=sys.stderr)
        return exit_status(err)
    return status


if __name__ == "__main__":
    sys.exit(main())
