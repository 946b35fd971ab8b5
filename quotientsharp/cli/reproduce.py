"""``quotientsharp reproduce STUDY``: rerun one of the paper's studies
(:data:`quotientsharp.reproduce.STUDIES`), in torchrun's process group when torchrun started
several ranks. The options are declared in the torch-free
:mod:`quotientsharp.cli.reproduce_options` and each study's ``HELP`` and description are read
from its source, so that ``reproduce STUDY --help`` imports no study.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from types import ModuleType

from quotientsharp.cli import plain_text
from quotientsharp.workflows.process_group import DEFAULT_DIST_TIMEOUT, run_in_process_group

#: What ``quotientsharp reproduce --help`` says (the module docstring is for developers).
DESCRIPTION = """\
Rerun one of the paper's studies: train (or load) a family of models, measure their sharpness
and write the Kendall rank correlation between generalisation and each measure next to the
paper's numbers, with per-model files, plots and the page's data (page.json) under
results/STUDY/; with --docs DIR, the results page rendered from it by the docs folder of a
checkout.

quotientsharp reproduce STUDY --help describes a study's design and options. --resume keeps
what the results folder already holds and computes only what is missing.

Under torchrun (torchrun --nproc_per_node N -m quotientsharp reproduce STUDY ...) the work is
spread over the ranks and the results are those of one process; --dist-timeout bounds how long
a rank waits for the others."""


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


def _constant(tree: ast.Module | None, name: str) -> str | None:
    """The string constant ``name`` of a parsed module; ``None`` when the module or a literal
    ``name`` is missing."""
    for node in tree.body if tree is not None else []:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, str) else None
    return None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``reproduce`` and one sub-subcommand per registered study (none imported)."""
    from quotientsharp.cli.reproduce_options import STUDY_OPTIONS
    from quotientsharp.reproduce import STUDIES

    parser = subparsers.add_parser(
        "reproduce", help="rerun one of the paper's studies (Kendall tau of generalisation "
        "against sharpness, next to the paper's numbers)", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    studies = parser.add_subparsers(dest="study", required=True, metavar="STUDY")
    for name, module_path in STUDIES.items():
        if importlib.util.find_spec(module_path) is None:
            continue            # a study whose module is missing is left out, not fatal
        tree = _source_tree(module_path)
        docstring = ast.get_docstring(tree, clean=False) if tree is not None else None
        study_parser = studies.add_parser(
            name, help=_constant(tree, "HELP"), description=plain_text(docstring or ""),
            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_options, _ = STUDY_OPTIONS[name]
        add_options(study_parser)
        study_parser.add_argument(
            "--dist-timeout", type=float, default=DEFAULT_DIST_TIMEOUT, metavar="SECONDS",
            help="under torchrun: how long a rank may wait for the others in one collective "
                 f"before failing (default {DEFAULT_DIST_TIMEOUT:g} s); ignored without torchrun")
    return parser


def _with_note(module: ModuleType, args: argparse.Namespace) -> int:
    """Run the study on the configuration its options make; after a successful run, rank 0
    prints how to read its taus (:func:`~quotientsharp.reproduce.results_page.reading_guide`)."""
    import sys

    from quotientsharp.cli.output_errors import check_output_folder
    from quotientsharp.cli.reproduce_options import study_config
    from quotientsharp.reproduce.results_page import reading_guide
    from quotientsharp.workflows.records import is_main_rank

    # a folder another run holds is refused before the study computes anything (by rank 0
    # alone: under torchrun the other ranks would find rank 0's own lock)
    if is_main_rank():
        check_output_folder(getattr(args, "out", None))
    try:
        config = study_config(args)
    except ValueError as err:
        if is_main_rank():
            print(f"quotientsharp reproduce {args.study}: error: {err}", file=sys.stderr)
        return 2
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
