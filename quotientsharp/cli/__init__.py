"""The ``quotientsharp`` console script: the top layer, one module per subcommand. Building
the parser imports no torch (the subcommands import it when they run): ``--help`` is instant."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import re
import site
import sys
import sysconfig
import warnings
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any, NoReturn

from quotientsharp.cli.output_errors import OUTPUT_ERRORS, error_message
from quotientsharp.workflows.options import InputError

#: Subcommand -> its module. Every module exposes ``add_parser(subparsers)`` and
#: ``run(args) -> int`` and imports torch inside ``run``, so ``--help`` stays fast.
COMMANDS = {
    "verify": "quotientsharp.cli.verify",
    "symmetries": "quotientsharp.cli.symmetries",
    "measure": "quotientsharp.cli.measure",
    "reproduce": "quotientsharp.cli.reproduce",
    "study": "quotientsharp.cli.study",
}
#: Subcommand -> the errors it reports in one line besides an ``InputError`` and an output
#: error: in ``measure`` and ``study``, those of a model that does not fit its data.
_INPUT_ERRORS = dict.fromkeys(("measure", "study"),
                              (ValueError, TypeError, KeyError, IndexError, RuntimeError))

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1)
    return text[1:].rsplit(".", 1)[-1] if text.startswith("~") else text


def plain_text(text: str | None) -> str | None:
    """A docstring as terminal help: RST roles (``:func:`~a.b```) and double backticks
    stripped to their text."""
    if text is None:
        return None
    return _LITERAL.sub(r"\1", _ROLE.sub(_role_text, text))


__all__ = ["main"]


def positive_seconds(text: str) -> float:
    """``type=`` of a duration option (``--dist-timeout``): a number of seconds a ``timedelta``
    holds and that is not zero there.
    A timeout of 0 or less, or an infinite one, is no timeout torch can wait for; refused
    here even where it is not used (without torchrun), since nothing else would say so."""
    try:
        seconds = float(text)
        # torch waits for a timedelta: one below a microsecond is zero, one of 1e300 s
        # overflows it (raised under torchrun only, as a traceback)
        usable = math.isfinite(seconds) and timedelta(seconds=seconds) > timedelta(0)
    except (ValueError, OverflowError):
        usable = False
    if not usable:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0 (at least a "
                                         f"microsecond, at most {timedelta.max.days} days), "
                                         f"got {text!r}")
    return seconds


class _GivenOnce(argparse.Action):
    """Refuse an option of one value given twice (``--rho 0.1 --rho 0.2``, ``--json a --json
    b``): argparse keeps the last, and the first would be ignored without a word."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = getattr(parser, "given_options", None)
        if option_string is not None and isinstance(given, dict):
            # a flag is its own value: "--progress, then --no-progress"
            shown = (option_string if isinstance(self, argparse.BooleanOptionalAction)
                     else f"{option_string} {values}")
            if self.dest in given:
                parser.error(f"argument {'/'.join(self.option_strings)}: given twice "
                             f"({given[self.dest]}, then {shown}); give it once")
            given[self.dest] = shown
        super().__call__(parser, namespace, values, option_string)


class _StoreOnce(_GivenOnce, argparse._StoreAction):
    """argparse's default action, refusing a repeat."""


class _BooleanOnce(_GivenOnce, argparse.BooleanOptionalAction):
    """``--progress``/``--no-progress``, refusing both (or either twice)."""


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``PROG: error: MESSAGE (see PROG
    --help)``, exit status 2; an option of one value given twice is such an error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        #: option dest -> how it was given, in the parse under way
        self.given_options: dict[str, str] = {}

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if kwargs.get("action") is argparse.BooleanOptionalAction:
            kwargs["action"] = _BooleanOnce
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self.given_options = {}
        return super().parse_known_args(args, namespace)

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
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


@contextlib.contextmanager
def warning_notes() -> Iterator[list[str]]:
    """Record the library's ``UserWarning``\\ s as ``note:`` lines (the list yielded: one line
    each, no repeats, once the block ends) rather than ``<frozen runpy>:88: UserWarning`` on
    stderr; other warnings are issued again."""
    notes: list[str] = []
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            # "always": a warning issued once per measure is one note (repeats dropped below)
            warnings.simplefilter("always", UserWarning)
            yield notes
    finally:
        for warning in caught:
            if issubclass(warning.category, UserWarning):
                notes.append(" ".join(str(warning.message).split()))
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                       warning.lineno)
        notes[:] = dict.fromkeys(notes)


def _library_roots() -> tuple[str, ...]:
    """The folders of the standard library and of the installed packages."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update([*site.getsitepackages(), site.getusersitepackages()])
    return tuple(os.path.realpath(root) + os.sep for root in roots)


def user_exit_message(error: SystemExit | KeyboardInterrupt) -> str | None:
    """One line for a ``SystemExit`` or ``KeyboardInterrupt`` raised in a user's code (a
    pickled model's ``forward``, a ``--symmetry`` module), naming its innermost frame outside
    this package and the installed ones (a ``sys.exit(0)`` there would end the command as if it
    had finished); ``None`` for one raised by this package."""
    roots, found = _library_roots(), None
    traceback = error.__traceback__
    while traceback is not None:
        frame, filename = traceback.tb_frame, traceback.tb_frame.f_code.co_filename
        module = str(frame.f_globals.get("__name__", "?"))
        # "<frozen importlib._bootstrap>", "<string>": no file of the user's
        if (module.partition(".")[0] != "quotientsharp" and not filename.startswith("<")
                and not os.path.realpath(filename).startswith(roots)):
            found = (f"in module {module!r} ({filename}:{traceback.tb_lineno}, in "
                     f"{frame.f_code.co_name})")
        traceback = traceback.tb_next
    if found is None:
        return None
    what = (f"SystemExit({error.code!r}) (sys.exit)" if isinstance(error, SystemExit)
            else "KeyboardInterrupt")
    return f"user code raised {what} {found}; the command stopped there and did not finish"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command])
    try:
        status = int(module.run(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``quotientsharp symmetries --json | head``): stop quietly,
        # with 128 + SIGPIPE, stdout on the null device so that the final flush cannot fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    except (*OUTPUT_ERRORS, InputError, *_INPUT_ERRORS.get(args.command, ())) as err:
        # a locked, read-only or full output, from any command and stage, or bad input: one
        # line, on rank 0 or on the rank that raised it
        from quotientsharp.workflows.records import is_main_rank

        if is_main_rank() or getattr(err, "raised_on_this_rank", False):
            study = getattr(args, "study", None) if args.command == "reproduce" else None
            print(f"quotientsharp {args.command}{f' {study}' if study else ''}: error: "
                  f"{error_message(err)}", file=sys.stderr)
        return 2
    except (SystemExit, KeyboardInterrupt) as err:
        # sys.exit or an interrupt in the user's code: one line naming its module, non-zero
        message = user_exit_message(err)
        if message is None:
            raise
        print(f"quotientsharp {args.command}: error: {message}", file=sys.stderr)
        # as after Ctrl-C; a SystemExit of the user's, whatever its code, is no success
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    return status
