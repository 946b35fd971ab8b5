"""The options of what to measure, shared by ``measure`` and ``study``, read into the checked
settings :class:`~quotientsharp.workflows.options.SharpnessConfig`."""

from __future__ import annotations

import argparse
from typing import Any

from quotientsharp.core.scalars import NONFINITE_POLICIES
from quotientsharp.workflows.options import (
    ASCENT_MEASURES,
    BatchSettings,
    InputError,
    SharpnessConfig,
    SolverSettings,
    command_line_names,
    measure_names,
)


def add_sharpness_options(parser: argparse.ArgumentParser, *, radius_list: bool = False) -> None:
    """Declare the options that say what to measure and how to read the data, ``--measure`` to
    ``--progress``; with ``radius_list``, ``--rho`` takes a comma list (text the settings
    read) instead of one number."""
    parser.add_argument("--measure", action="append", default=None, metavar="NAME",
                        help="average, worst_case, adaptive, geodesic or relative_flatness; "
                        "repeat (or give a comma list) for several (default: geodesic)")
    if radius_list:
        parser.add_argument("--rho", default=None, metavar="R[,R...]",
                            help="radius, or a comma list of radii such as 0.05,0.1 (standard "
                            "deviation for average); required except for relative_flatness")
    else:
        parser.add_argument("--rho", type=float, default=None,
                            help="radius (standard deviation for average); required except "
                            "for relative_flatness")
    # options of some measures default to None, "not given": the settings apply their defaults
    # and refuse one given for none of its measures (or note a --metric beside --symmetry)
    parser.add_argument("--metric", default=None,
                        help="geodesic: inv, mix or euclidean, or a comma list such as mix,inv "
                        "for several in one call (default inv)")
    parser.add_argument("--order", default=None, help="geodesic: 1, 2 or exact, or a comma "
                        "list such as 1,2 (default 2)")
    parser.add_argument("--symmetry", default=None, metavar="MODULE:FUNCTION",
                        help="geodesic: a symmetry of your own; FUNCTION(model) returns a "
                        "QuotientBinding or a list of them (MODULE imported from the working "
                        "directory or sys.path); it replaces discovery, as in the API")
    parser.add_argument("--eps", type=float, default=None,
                        help="geodesic: Gram relaxation G^T G + eps I (default 0)")
    parser.add_argument("--p", default=None, help="worst_case and adaptive: 2 or inf "
                        "(default 2)")
    parser.add_argument("--samples", type=int, default=None,
                        help="average: Gaussian draws per batch (default 1)")
    parser.add_argument("--layer", default=None, help="relative_flatness: module name "
                        "(default: the last nn.Linear)")
    parser.add_argument("--loss", default=BatchSettings.loss,
                        help="cross_entropy or mse (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=BatchSettings.batch_size,
                        help="examples per batch (default %(default)s)")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="use at most this many batches (default: all)")
    # None, "not given": an --n-iter without an ascent measure is refused, not ignored
    parser.add_argument("--n-iter", type=int, default=None,
                        help="Auto-PGD steps of the ascent measures (default "
                        f"{SolverSettings.n_iter})")
    parser.add_argument("--chains", type=int, default=None, metavar="N",
                        help="ascent measures: most chains of the search that confirms each "
                        "value (default 4); raise it where the reach column is below 0.99")
    parser.add_argument("--nonfinite", choices=NONFINITE_POLICIES, default=None,
                        help="every measure but relative_flatness: a NaN or inf perturbed "
                        "loss raises an error naming the batch (raise, the default), or that "
                        "evaluation is skipped (skip, counted in --json)")
    parser.add_argument("--seed", type=int, default=SharpnessConfig.seed,
                        help="random seed (default %(default)s)")
    parser.add_argument("--max-length", type=int, default=BatchSettings.max_length,
                        help="text rows: truncate to this many tokens (default %(default)s)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="tokenizer directory for text rows (default: the MODEL directory)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default=None,
                        help="cast the model (default: as saved)")
    parser.add_argument("--device", default=SharpnessConfig.device,
                        help="torch device (default %(default)s)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bars (default: only on a terminal)")


def add_solver_options(parser: argparse.ArgumentParser) -> None:
    """Declare ``measure``'s options of the ascent measures' solver: ``--blockwise``,
    ``--compile-steps``, ``--plot``, ``--reference-n-iter`` and ``--reference-restarts``."""
    parser.add_argument("--blockwise", action="store_true",
                        help="ascent measures: also report, per block (attention head pair, "
                        "diagonal pair, parameter), the norm share of the best perturbation and "
                        "the loss change when only that block's part is applied (one extra "
                        "forward per block and batch)")
    parser.add_argument("--compile-steps", action="store_true",
                        help="ascent measures: run the solver's per-iteration geometry as "
                        "torch.compile graphs (the same values to rounding, faster per "
                        "iteration; the first batch compiles for tens of seconds)")
    # a string, not a Path: Path("") is ".", and an empty --plot must be refused as such
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="with --blockwise: write a bar chart of the loss change per block "
                        "to PNG (needs matplotlib)")
    parser.add_argument("--reference-n-iter", type=int, default=None, metavar="N",
                        help="ascent measures: also run a stronger reference solve of N steps "
                        "per batch and report the gap to it (default with "
                        "--reference-restarts: 10 x --n-iter)")
    parser.add_argument("--reference-restarts", type=int, default=None, metavar="R",
                        help="random restarts of the reference solve (default 4 when "
                        "--reference-n-iter is given)")


def sharpness_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``SharpnessConfig`` from the parsed options (comma lists as text); called
    within ``command_line_names()``, so that errors name options."""
    measures = measure_names(args.measure)  # an unknown measure is the first error
    if args.n_iter is not None and not set(ASCENT_MEASURES) & set(measures):
        raise InputError(f"--n-iter needs an ascent measure (worst_case, adaptive or "
                         f"geodesic); --measure gives {', '.join(measures)}")
    batches = BatchSettings(batch_size=args.batch_size, max_batches=args.max_batches,
                            max_length=args.max_length, tokenizer=args.tokenizer,
                            loss=args.loss)
    # study has no solver options: their defaults
    solver = SolverSettings(
        n_iter=SolverSettings.n_iter if args.n_iter is None else args.n_iter,
        chains=args.chains, blockwise=getattr(args, "blockwise", False),
        compile_steps=getattr(args, "compile_steps", False),
        reference_n_iter=getattr(args, "reference_n_iter", None),
        reference_restarts=getattr(args, "reference_restarts", None))
    # an option left out is None: the settings apply its default
    return {"measures": args.measure, "rho": args.rho, "metrics": args.metric,
            "orders": args.order, "symmetry": args.symmetry, "eps": args.eps, "p": args.p,
            "samples": args.samples, "layer": args.layer, "nonfinite": args.nonfinite,
            "seed": args.seed, "batches": batches, "solver": solver, "dtype": args.dtype,
            "device": args.device, "progress": args.progress}


def sharpness_config(args: argparse.Namespace) -> SharpnessConfig:
    """The settings of ``quotientsharp measure``'s options, checked: a bad one raises
    :class:`~quotientsharp.workflows.options.InputError` naming its option."""
    with command_line_names():
        return SharpnessConfig(**sharpness_fields(args))
