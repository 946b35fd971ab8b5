"""``quotientsharp reproduce STUDY``: rerun one of the paper's studies.

The studies are listed in :data:`quotientsharp.experiments.STUDIES` (name -> module path); each
study module supplies ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``, so a new study
needs one registry line and no change here.

Under torchrun (``torchrun --nproc_per_node N -m quotientsharp reproduce STUDY ...``) the
command initialises the process group (gloo on CPU, NCCL with CUDA; ``--dist-timeout`` seconds
for every collective) before the study and destroys it afterwards; each study splits its work
over the ranks and rank 0 alone writes the results (docs/cli.md, "Running studies under
torchrun"). Without torchrun nothing changes: no process group, one process.
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
        study_parser.add_argument(
            "--dist-timeout", type=float, default=DEFAULT_DIST_TIMEOUT, metavar="SECONDS",
            help="under torchrun: how long a rank may wait for the others in one collective "
                 f"before failing (default {DEFAULT_DIST_TIMEOUT:g} s); ignored without torchrun")
    return parser


#: Seconds a rank may wait in one collective (torch's gloo default). The longest waits of the
#: studies are one unit of work (a model, a grid point) or the diagonal training on rank 0.
DEFAULT_DIST_TIMEOUT = 1800.0


def run(args: argparse.Namespace) -> int:
    import sys

    from ..experiments import load_study

    module = load_study(args.study)
    prefix = f"quotientsharp reproduce {args.study}: error:"
    try:
        from ..distributed import torchrun_world_size

        world_size = torchrun_world_size()
    except ValueError as err:
        print(f"{prefix} {err}", file=sys.stderr)
        return 2
    if world_size == 1:
        return int(module.run(args) or 0)
    import torch.distributed as dist

    from ..distributed import init_distributed

    if dist.is_available() and dist.is_initialized():
        # a caller that set up its own process group keeps it
        return int(module.run(args) or 0)
    timeout = getattr(args, "dist_timeout", DEFAULT_DIST_TIMEOUT)
    try:
        init_distributed(timeout=timeout)
    except (RuntimeError, ValueError) as err:
        print(f"{prefix} cannot start the process group of {world_size} ranks: {err}",
              file=sys.stderr)
        return 2
    try:
        return int(module.run(args) or 0)
    finally:
        dist.destroy_process_group()
