"""``quotientsharp reproduce STUDY``: rerun one of the paper's studies, in torchrun's process
group under torchrun. Each study's help is read from its source and its options are declared in
:mod:`quotientsharp.cli.reproduce_options`, so that ``--help`` imports no study."""

from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path
from types import ModuleType

from quotientsharp.cli import plain_text, positive_seconds
from quotientsharp.workflows.process_group import DEFAULT_DIST_TIMEOUT, run_in_process_group

#: What ``quotientsharp reproduce --help`` says (the module docstring is for developers).
DESCRIPTION = """\
Rerun one of the paper's studies: train (or load) a family of models, measure their sharpness
and write the Kendall rank correlation between generalisation and each measure next to the
paper's numbers, with per-model files, plots and the page's data (page.json) under
results/STUDY/; with --docs DIR, also the results page, rendered by the docs folder of a checkout.

quotientsharp reproduce STUDY --help describes a study's design and options. --resume computes
only what the results folder lacks. Under torchrun the work is spread over the ranks, with the
results of one process; --dist-timeout bounds how long a rank waits for the others."""


def _help_and_docstring(module_path: str) -> tuple[str | None, str]:
    """A study module's one-line ``HELP`` and its docstring, read from its source without
    importing it (``reproduce --help`` imports no study)."""
    spec = importlib.util.find_spec(module_path)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None, ""
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    help_text = None
    for node in tree.body:
        # a literal string only: a HELP computed at import cannot be read without importing
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and [getattr(target, "id", None) for target in node.targets] == ["HELP"]):
            help_text = node.value.value
    return help_text, ast.get_docstring(tree, clean=False) or ""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``reproduce`` and one sub-subcommand per registered study (none imported)."""
    from quotientsharp.cli.reproduce_options import STUDY_OPTIONS
    from quotientsharp.reproduce import STUDIES

    parser = subparsers.add_parser(
        "reproduce", help="rerun one of the paper's studies (Kendall tau of generalisation "
        "against sharpness, next to the paper's numbers)", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    studies = parser.add_subparsers(dest="study", required=True, metavar="STUDY")
    for name, module_path in STUDIES.items():
        help_text, docstring = _help_and_docstring(module_path)
        study_parser = studies.add_parser(
            name, help=help_text, description=plain_text(docstring),
            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_options, _ = STUDY_OPTIONS[name]
        add_options(study_parser)
        study_parser.add_argument(
            "--dist-timeout", type=positive_seconds, default=DEFAULT_DIST_TIMEOUT,
            metavar="SECONDS",
            help="under torchrun: how long a rank may wait for the others in one collective "
                 f"before failing (default {DEFAULT_DIST_TIMEOUT:g} s); ignored without torchrun")


def _with_note(module: ModuleType, args: argparse.Namespace) -> int:
    """Run the study on the configuration its options make; after a successful run, rank 0
    prints how to read its taus (:func:`~quotientsharp.reproduce.results_page.reading_guide`)."""
    from quotientsharp.cli.output_errors import check_output_folder
    from quotientsharp.cli.reproduce_options import study_config
    from quotientsharp.reproduce.results_page import reading_guide
    from quotientsharp.workflows.records import is_main_rank

    # a bad option raises an InputError naming it, which the console script reports
    config = study_config(args)
    # a folder another run holds is refused before the study computes anything (by rank 0
    # alone: under torchrun the other ranks would find rank 0's own lock)
    if is_main_rank():
        check_output_folder(getattr(config, "out", None))
    status = int(module.run(config) or 0)
    if status == 0 and is_main_rank():
        print(f"\n{reading_guide(getattr(module, 'GENERALISATION', None))}")
    return status


def run(args: argparse.Namespace) -> int:
    """Run the chosen study (in torchrun's process group under torchrun)."""
    from quotientsharp.reproduce import load_study

    module = load_study(args.study)
    return run_in_process_group(lambda: _with_note(module, args),
                                f"quotientsharp reproduce {args.study}: error:",
                                getattr(args, "dist_timeout", DEFAULT_DIST_TIMEOUT))
