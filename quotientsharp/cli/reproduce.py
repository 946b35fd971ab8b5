"""``quotientsharp reproduce STUDY``: rerun one of the paper's studies.

The studies are listed in :data:`quotientsharp.reproduce.STUDIES` (name -> module path); each
study module supplies ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``, so a new study
needs one registry line and no change here. A study module that imports torch names a torch-free
module declaring its options in the string constant ``OPTIONS`` (``"module.path"`` for its
``add_arguments``, or ``"module.path:function"``); ``reproduce STUDY --help`` then imports only
that module (and reads ``HELP`` and the docstring from the study's source).

Under torchrun (``torchrun --nproc_per_node N -m quotientsharp reproduce STUDY ...``) the
command initialises the process group (gloo on CPU, NCCL with CUDA; ``--dist-timeout`` seconds
for every collective) before the study and destroys it afterwards; each study splits its work
over the ranks and rank 0 alone writes the results (docs/cli.md, "Running studies under
torchrun"). Without torchrun nothing changes: no process group, one process.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

from quotientsharp.cli import plain_text
from quotientsharp.workflows.process_group import DEFAULT_DIST_TIMEOUT, run_in_process_group

#: What ``quotientsharp reproduce --help`` says (the module docstring is for developers).
DESCRIPTION = """\
Rerun one of the paper's studies: train (or load) a family of models, measure their sharpness
and write the Kendall rank correlation between generalisation and each measure next to the
paper's numbers, with per-model files, plots and a summary under results/STUDY/.

quotientsharp reproduce STUDY --help describes a study's design and options. --resume keeps
what the results folder already holds and computes only what is missing.

Under torchrun (torchrun --nproc_per_node N -m quotientsharp reproduce STUDY ...) the work is
spread over the ranks and the results are those of one process; --dist-timeout bounds how long
a rank waits for the others."""


class _LazyStudies(argparse._SubParsersAction):
    """Study subparsers whose options are declared only when the study is chosen, so that
    ``reproduce --help`` lists the studies without importing them (nor torch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending: dict[str, Callable[[argparse.ArgumentParser], None]] = {}

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        fill = self.pending.pop(values[0], None) if values else None
        if fill is not None:
            fill(self._name_parser_map[values[0]])
        super().__call__(parser, namespace, values, option_string)


def _source_tree(module_path: str) -> ast.Module | None:
    """The parsed source of a module, without importing it; ``None`` when it has no source."""
    try:
        spec = importlib.util.find_spec(module_path)
    except ImportError:
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as handle:
        return ast.parse(handle.read())


def _constant(module_path: str, name: str) -> str | None:
    """The string constant ``name`` of a module, read from its source without importing it;
    ``None`` when the module or a literal ``name`` is missing."""
    tree = _source_tree(module_path)
    if tree is None:
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, str) else None
    return None


def _study_filler(module_path: str) -> Callable[[argparse.ArgumentParser], None]:
    """Declares a study's options when it is chosen: from the torch-free module its ``OPTIONS``
    names (so ``reproduce STUDY --help`` loads no torch), else from the study module itself;
    the description is the study module's docstring, read from its source."""
    def fill(study_parser: argparse.ArgumentParser) -> None:
        # "module.path" or "module.path:function" (default function: add_arguments)
        options, _, function = (_constant(module_path, "OPTIONS") or module_path).partition(":")
        try:
            module = importlib.import_module(options)
        except ImportError as err:
            study_parser.error(f"this study needs a package that is not installed: {err}")
        tree = _source_tree(module_path)
        docstring = ast.get_docstring(tree, clean=False) if tree is not None else None
        study_parser.description = plain_text(docstring if docstring is not None
                                              else module.__doc__)
        getattr(module, function or "add_arguments")(study_parser)
        study_parser.add_argument(
            "--dist-timeout", type=float, default=DEFAULT_DIST_TIMEOUT, metavar="SECONDS",
            help="under torchrun: how long a rank may wait for the others in one collective "
                 f"before failing (default {DEFAULT_DIST_TIMEOUT:g} s); ignored without torchrun")

    return fill


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``reproduce`` and one sub-subcommand per registered study.

    A study's module is imported (with torch) only when that study is chosen; its one-line
    ``HELP`` is read from the module's source for ``reproduce --help``.
    """
    from quotientsharp.reproduce import STUDIES

    parser = subparsers.add_parser(
        "reproduce", help="rerun one of the paper's studies (Kendall tau of generalisation "
        "against sharpness, next to the paper's numbers)", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    studies = parser.add_subparsers(dest="study", required=True, metavar="STUDY",
                                    action=_LazyStudies)
    for name, module_path in STUDIES.items():
        if importlib.util.find_spec(module_path) is None:
            continue            # a study whose module is missing is left out, not fatal
        studies.add_parser(name, help=_constant(module_path, "HELP"),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        studies.pending[name] = _study_filler(module_path)
    return parser


def _with_note(module: ModuleType, args: argparse.Namespace) -> int:
    """Run the study; after a successful one, rank 0 prints the sign convention of its taus
    and where the results page is (:func:`~quotientsharp.reproduce.results_page.reading_guide`;
    a study module's ``GENERALISATION`` says what its taus rank sharpness against)."""
    from quotientsharp.cli.output_errors import check_output_folder
    from quotientsharp.reproduce.results_page import reading_guide
    from quotientsharp.workflows.records import is_main_rank

    # a folder another run holds is refused before the study computes anything (by rank 0
    # alone: under torchrun the other ranks would find rank 0's own lock)
    if is_main_rank():
        check_output_folder(getattr(args, "out", None))
    status = int(module.run(args) or 0)
    if status == 0 and is_main_rank():
        print(f"\n{reading_guide(getattr(module, 'GENERALISATION', None))}")
    return status


def run(args: argparse.Namespace) -> int:
    """Run the chosen study, in torchrun's process group when torchrun started several ranks
    (:func:`~quotientsharp.workflows.process_group.run_in_process_group`)."""
    from quotientsharp.reproduce import load_study

    module = load_study(args.study)
    return run_in_process_group(lambda: _with_note(module, args),
                                f"quotientsharp reproduce {args.study}: error:",
                                getattr(args, "dist_timeout", DEFAULT_DIST_TIMEOUT))
