"""``quotientsharp measure``: the command-line options and their checks.

:func:`add_arguments` declares the options of the subcommand, :func:`check_options` and
:func:`measure_names` validate them before anything is loaded, and :func:`options_for` turns
them into the keyword options of :func:`quotientsharp.sharpness` for one measure. Bad input of
any stage (options, model, data) raises :class:`InputError`: one line on stderr, exit status 2
(:func:`quotientsharp.cli.measure.run`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ASCENT_MEASURES",
    "PROG",
    "InputError",
    "MEASURE_NAMES",
    "METRICS",
    "MeasureRun",
    "add_arguments",
    "add_sharpness_options",
    "add_solver_options",
    "check_options",
    "check_solver_options",
    "measure_names",
    "measure_runs",
    "options_for",
    "radii",
]

PROG = "quotientsharp measure"
ASCENT_MEASURES = ("worst_case", "adaptive", "geodesic")
#: The measures of :func:`quotientsharp.sharpness` (``tests/test_bad_inputs.py`` holds this
#: list to ``quotientsharp.engine.MEASURES``; it is repeated here so that checking
#: ``--measure`` imports no torch).
MEASURE_NAMES = ("average", "worst_case", "adaptive", "geodesic", "relative_flatness")
METRICS = ("inv", "mix", "euclidean")


class InputError(ValueError):
    """Bad user input: reported as one line on stderr, exit status 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the positional arguments and options of ``quotientsharp measure``."""
    parser.add_argument("model", help="HuggingFace model directory or torch.save'd nn.Module")
    parser.add_argument("data", help="JSONL file (text or input_ids rows) or torch.save'd "
                        "(X, Y) / {'x', 'y'} / TensorDataset")
    add_sharpness_options(parser)
    add_solver_options(parser)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="also write settings, per-batch values and values to OUT")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bars (default: only on a terminal)")


def add_sharpness_options(parser: argparse.ArgumentParser, *, radius_list: bool = False) -> None:
    """Declare the options that say what to measure and how to read the data: ``--measure``,
    ``--rho``, ``--metric``, ``--order``, ..., ``--device`` (shared by ``quotientsharp measure``
    and ``quotientsharp study``).

    Parameters
    ----------
    parser
        The subcommand's parser.
    radius_list
        ``--rho`` takes a comma list of radii (kept as text; :func:`radii` reads it) instead of
        one number.
    """
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
    # None: not given (inv), so that a note can say when a given --metric did not apply
    parser.add_argument("--metric", default=None,
                        help="geodesic: inv, mix or euclidean, or a comma list such as mix,inv "
                        "for several in one call (default inv)")
    parser.add_argument("--order", default="2", help="geodesic: 1, 2 or exact, or a comma list "
                        "such as 1,2 (default 2)")
    parser.add_argument("--symmetry", default=None, metavar="MODULE:FUNCTION",
                        help="geodesic: a symmetry of your own; FUNCTION(model) returns a "
                        "QuotientBinding or a list of them (MODULE imported from the working "
                        "directory or sys.path); it replaces discovery, as in the API")
    parser.add_argument("--eps", type=float, default=0.0,
                        help="geodesic: Gram relaxation G^T G + eps I (default 0)")
    parser.add_argument("--p", default="2", help="worst_case and adaptive: 2 or inf "
                        "(default 2)")
    parser.add_argument("--samples", type=int, default=1,
                        help="average: Gaussian draws per batch (default 1)")
    parser.add_argument("--layer", default=None, help="relative_flatness: module name "
                        "(default: the last nn.Linear)")
    parser.add_argument("--loss", default="cross_entropy",
                        help="cross_entropy (default) or mse")
    parser.add_argument("--batch-size", type=int, default=32, help="examples per batch "
                        "(default 32)")
    parser.add_argument("--max-batches", type=int, default=None,
                        help="use at most this many batches (default: all)")
    parser.add_argument("--n-iter", type=int, default=20,
                        help="Auto-PGD steps of the ascent measures (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--max-length", type=int, default=128,
                        help="text rows: truncate to this many tokens (default 128)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="tokenizer directory for text rows (default: the MODEL directory)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default=None,
                        help="cast the model (default: as saved)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")


def add_solver_options(parser: argparse.ArgumentParser) -> None:
    """Declare the options of the ascent measures' diagnostics: ``--blockwise``, ``--plot``,
    ``--reference-n-iter`` and ``--reference-restarts``, and ``--compile-steps``
    (``quotientsharp measure``)."""
    parser.add_argument("--blockwise", action="store_true",
                        help="ascent measures: also report, per block (attention head pair, "
                        "diagonal pair, parameter), the norm share of the best perturbation and "
                        "the loss change when only that block's part is applied (one extra "
                        "forward per block and batch)")
    parser.add_argument("--compile-steps", action="store_true",
                        help="ascent measures: run the solver's per-iteration geometry as "
                        "torch.compile graphs (the same values to rounding, faster per "
                        "iteration; the first batch compiles for tens of seconds)")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG",
                        help="with --blockwise: write a bar chart of the loss change per block "
                        "to PNG (needs matplotlib)")
    parser.add_argument("--reference-n-iter", type=int, default=None, metavar="N",
                        help="ascent measures: also run a stronger reference solve of N steps "
                        "per batch and report the gap to it (default with "
                        "--reference-restarts: 10 x --n-iter)")
    parser.add_argument("--reference-restarts", type=int, default=None, metavar="R",
                        help="random restarts of the reference solve (default 4 when "
                        "--reference-n-iter is given)")


def check_solver_options(args: argparse.Namespace, measures: Sequence[str]) -> None:
    """Check ``--blockwise``, ``--plot``, ``--compile-steps`` and the reference-solve options
    against the measures (they need an ascent measure; ``--plot`` needs ``--blockwise`` and
    matplotlib)."""
    blockwise = getattr(args, "blockwise", False)
    plot = getattr(args, "plot", None)
    reference_n_iter = getattr(args, "reference_n_iter", None)
    reference_restarts = getattr(args, "reference_restarts", None)
    ascent = [m for m in measures if m in ASCENT_MEASURES]
    for given, option in ((blockwise, "--blockwise"),
                          (getattr(args, "compile_steps", False), "--compile-steps"),
                          (reference_n_iter is not None, "--reference-n-iter"),
                          (reference_restarts is not None, "--reference-restarts")):
        if given and not ascent:
            raise InputError(f"{option} needs an ascent measure (worst_case, adaptive or "
                             f"geodesic); --measure gives {', '.join(measures)}")
    _positive_int(reference_n_iter, "--reference-n-iter")
    if reference_restarts is not None and reference_restarts < 0:
        raise InputError(f"--reference-restarts must be an integer >= 0, got "
                         f"{reference_restarts}")
    if plot is not None:
        if not blockwise:
            raise InputError("--plot draws the loss change per block: add --blockwise")
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise InputError("--plot needs matplotlib: pip install 'quotientsharp[plot]'")


def radii(text: str | None) -> list[float]:
    """The radii of a comma list (``"0.05,0.1"``), in order, without repeats; ``[]`` for
    ``None``. Each is checked by :func:`check_options`."""
    if text is None:
        return []
    values: list[float] = []
    for part in _items(text):
        try:
            value = float(part)
        except ValueError:
            raise InputError(f"--rho must be a number or a comma list of numbers, got "
                             f"{part!r}") from None
        if value not in values:
            values.append(value)
    return values


def measure_names(requested: Sequence[str] | None) -> list[str]:
    """The measures of ``--measure`` (repeated or comma lists, aliases), in order, no repeats."""
    aliases = {"worst-case": "worst_case", "relative-flatness": "relative_flatness"}
    names: list[str] = []
    for item in requested or ["geodesic"]:
        for part in item.split(","):
            part = part.strip()
            name = aliases.get(part, part)
            if name not in MEASURE_NAMES:
                raise InputError(f"--measure: unknown measure {part!r}; choose from "
                                 f"{', '.join(sorted(MEASURE_NAMES))}")
            if name not in names:
                names.append(name)
    return names


def _positive_int(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise InputError(f"{option} must be an integer >= 1, got {value}")


def _items(text: str) -> list[str]:
    """The entries of a comma list, stripped, in order, without repeats."""
    items: list[str] = []
    for part in str(text).split(","):
        part = part.strip()
        if part not in items:
            items.append(part)
    return items


def _order(text: str) -> int | str:
    if text in ("1", "2"):
        return int(text)
    if text == "exact":
        return text
    raise InputError(f"--order must be 1, 2 or exact (or a comma list of them), got {text!r}")


@dataclass(frozen=True)
class MeasureRun:
    """One call of :func:`quotientsharp.sharpness`: a measure and, for geodesic sharpness, one
    metric and order. ``key`` names its entry in the JSON document."""

    key: str
    measure: str
    variant: dict[str, Any] = field(default_factory=dict)


def measure_runs(measures: Sequence[str], checked: dict[str, Any]) -> list[MeasureRun]:
    """The calls to make: one per measure, and one per metric and order for geodesic.

    The JSON key is the measure's name, except for geodesic sharpness with several metrics or
    orders: ``geodesic_{metric}_order{order}`` (e.g. ``geodesic_mix_order2``) for each.
    """
    runs: list[MeasureRun] = []
    for measure in measures:
        if measure != "geodesic":
            runs.append(MeasureRun(measure, measure))
            continue
        variants = [(m, o) for m in checked["metrics"] for o in checked["orders"]]
        for metric, order in variants:
            key = "geodesic" if len(variants) == 1 else f"geodesic_{metric}_order{order}"
            runs.append(MeasureRun(key, measure, {"metric": metric, "order": order}))
    return runs


def check_options(args: argparse.Namespace, measures: Sequence[str]) -> dict[str, Any]:
    """Validated options shared by all measures."""
    if args.loss not in ("cross_entropy", "mse"):
        raise InputError(f"--loss must be cross_entropy or mse, got {args.loss!r}")
    metrics = _items(args.metric if args.metric is not None else "inv")
    for metric in metrics:
        if metric not in METRICS:
            raise InputError(f"--metric must be inv, mix or euclidean (or a comma list of "
                             f"them), got {metric!r}")
    symmetry = getattr(args, "symmetry", None)
    if symmetry is not None and "geodesic" in measures and len(metrics) > 1:
        # each metric would give the same value under a different label
        raise InputError(f"--metric {args.metric}: with --symmetry {symmetry} geodesic "
                         "sharpness measures with the metric of each binding's own quotient, "
                         "so every --metric gives the same value; leave --metric out (or give "
                         "one)")
    if args.p not in ("2", "inf"):
        raise InputError(f"--p must be 2 or inf, got {args.p!r}")
    for value, option in ((args.batch_size, "--batch-size"), (args.max_batches, "--max-batches"),
                          (args.n_iter, "--n-iter"), (args.samples, "--samples"),
                          (args.max_length, "--max-length")):
        _positive_int(value, option)
    if args.seed < 0:
        raise InputError(f"--seed must be >= 0, got {args.seed}")
    needs_radius = [m for m in measures if m != "relative_flatness"]
    if needs_radius and args.rho is None:
        raise InputError(f"--rho is required for {', '.join(needs_radius)}")
    if args.rho is not None and not (math.isfinite(args.rho) and args.rho > 0):
        raise InputError(f"--rho must be a finite number > 0, got {args.rho}")
    if not (math.isfinite(args.eps) and args.eps >= 0):
        raise InputError(f"--eps must be a finite number >= 0, got {args.eps}")
    return {"metrics": metrics, "orders": [_order(o) for o in _items(args.order)]}


def options_for(run: MeasureRun, args: argparse.Namespace) -> dict[str, Any]:
    """Keyword options of :func:`quotientsharp.sharpness` for one run from the arguments."""
    measure = run.measure
    options: dict[str, Any] = {"loss": args.loss, "seed": args.seed, "progress": args.progress}
    if measure in ASCENT_MEASURES:
        options["n_iter"] = args.n_iter
        if getattr(args, "blockwise", False):
            options["blockwise"] = True
        if getattr(args, "compile_steps", False):
            options["compile_steps"] = True
        reference = {key: value for key, value in (
            ("n_iter", getattr(args, "reference_n_iter", None)),
            ("restarts", getattr(args, "reference_restarts", None))) if value is not None}
        if reference:
            options["reference_solve"] = reference
    if measure == "geodesic":
        options.update(metric=run.variant["metric"], order=run.variant["order"], eps=args.eps)
        bindings = getattr(args, "bindings", None)
        if bindings:
            # the bindings' quotients bring their own metric (the API warns about the option)
            options["symmetries"] = bindings
            del options["metric"], options["eps"]
    if measure in ("worst_case", "adaptive"):
        options["p"] = 2 if args.p == "2" else "inf"
    if measure == "average":
        options["samples"] = args.samples
    if measure == "relative_flatness" and args.layer is not None:
        options["layer"] = args.layer
    return options

