"""quotientsharp study MANIFEST --data DATA: sharpness against generalisation on your own models.

MANIFEST (a CSV file with a header line, or JSON lines) lists one saved model per row: model (a
HuggingFace directory or torch.save'd module, as measure reads MODEL; paths relative to the
manifest's folder); gap, or train and test data to compute it from (--gap-from error: test
error - train error, the default; loss: test loss - train loss); name (optional); any other
column is carried to models.csv (--color KEY colours the plots by one).

DATA is the data every model is measured on, as measure reads it. The grid is given with
measure's options, --rho taking a comma list: --measure adaptive --measure geodesic --rho
0.05,0.1 --metric inv,mix --order 1,2 measures 2 adaptive and 8 geodesic variants per model.

Outputs in --out (default results/<manifest name>): models.csv, models.jsonl (full records),
taus.json and taus.csv (Kendall tau-a and tau-b of each measure against the gap, with bootstrap
intervals), scatter_<measure>.png, report.md, run.json. A killed run loses no finished model;
--resume measures only the missing ones. Under torchrun the models are dealt over the ranks.

Sign convention: positive tau means that sharpness and the gap rank alike (sharper models
generalise worse). Exit status 0, 2 on bad input (one line on stderr), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import sys

from quotientsharp.cli import plain_text, positive_seconds, user_exit_message
from quotientsharp.cli.sharpness_options import add_sharpness_options, sharpness_fields
from quotientsharp.workflows.options import (
    BootstrapSettings,
    StudyConfig,
    command_line_names,
)
from quotientsharp.workflows.process_group import DEFAULT_DIST_TIMEOUT, run_in_process_group

PROG = "quotientsharp study"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments and options of ``quotientsharp study``."""
    parser.add_argument("manifest", help="CSV or JSONL file: one saved model per row, with "
                        "its gap or its train and test data")
    parser.add_argument("--data", required=True, metavar="DATA",
                        help="the data every model is measured on (JSONL or torch.save'd "
                        "tensors, as quotientsharp measure reads DATA)")
    add_sharpness_options(parser, radius_list=True)
    parser.add_argument("--gap-from", choices=["error", "loss"], default=None,
                        help="rows with train and test data: the gap is test - train of the "
                        "0-1 error (default with cross_entropy) or of the loss (default with "
                        "mse)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="results folder (default results/<manifest name>)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the models already measured in --out and measure only the "
                        "missing ones (the settings must match)")
    parser.add_argument("--bootstrap", type=int, default=BootstrapSettings.resamples,
                        metavar="N", help="bootstrap draws of the models for the tau "
                        "intervals (default %(default)s; 0: no intervals)")
    parser.add_argument("--confidence", type=float, default=BootstrapSettings.confidence,
                        help="coverage of the intervals (default %(default)s)")
    parser.add_argument("--bootstrap-seed", type=int, default=BootstrapSettings.seed,
                        help="seed of the bootstrap draws (default %(default)s)")
    parser.add_argument("--color", default=None, metavar="KEY",
                        help="colour the plots by this numeric column of the manifest")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the scatter plots")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads during the run, per rank, at most 4 per CPU "
                        "(default: torch's)")
    parser.add_argument("--dist-timeout", type=positive_seconds, default=DEFAULT_DIST_TIMEOUT,
                        metavar="SECONDS",
                        help="under torchrun: how long a rank may wait for the others "
                        f"(default {DEFAULT_DIST_TIMEOUT:g} s); ignored without torchrun")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``study`` subcommand on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "study", help="Kendall tau of sharpness against the generalisation gap over your own "
        "saved models (a manifest), with bootstrap intervals, plots and a report",
        description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)


def study_config(args: argparse.Namespace) -> StudyConfig:
    """The library's settings of the parsed options (:func:`add_arguments`), checked: a bad
    one raises :class:`~quotientsharp.workflows.options.InputError` naming its option."""
    with command_line_names():
        bootstrap = BootstrapSettings(resamples=args.bootstrap, confidence=args.confidence,
                                      seed=args.bootstrap_seed)
        return StudyConfig(**sharpness_fields(args), data=args.data, gap_from=args.gap_from,
                           out=args.out, resume=args.resume, bootstrap=bootstrap,
                           color=args.color, plots=args.plots, threads=args.threads)


def _study(args: argparse.Namespace) -> int:
    from quotientsharp.workflows.records import is_main_rank
    from quotientsharp.workflows.runner import default_out, run_study

    try:
        outcome = run_study(args.manifest, study_config(args))
    except KeyboardInterrupt as err:
        if is_main_rank():
            # an interrupt from the user's code is named; either way the finished models
            # are kept and --resume continues
            message = user_exit_message(err)
            if message is not None:
                print(f"{PROG}: error: {message}", file=sys.stderr)
            out = args.out if args.out is not None else default_out(args.manifest)
            print(f"\ninterrupted: the models measured so far are kept in {out}; continue "
                  "with --resume", file=sys.stderr)
        return 130
    if is_main_rank():
        print(outcome.summary)
    return 0


def run(args: argparse.Namespace) -> int:
    """Execute the subcommand; returns the process exit status (bad input raises: the
    console script reports it)."""
    return run_in_process_group(lambda: _study(args), f"{PROG}: error:", args.dist_timeout)
