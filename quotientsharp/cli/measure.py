"""``quotientsharp measure MODEL DATA``: sharpness of a saved model on a dataset.

MODEL is a HuggingFace model directory (``config.json`` and the weights, as ``save_pretrained``
writes them; the class of its ``architectures`` is loaded offline with eager attention, and a
missing weight, such as an untrained classification head, is an error) or a file written by
``torch.save(module)`` (loaded with ``weights_only=False``: only load files you trust).

DATA is a JSON-lines file (``.jsonl``) of text rows ``{"text": "...", "label": 1}`` (optional
``"text_pair"``), tokenised offline with the tokenizer of the MODEL directory (or
``--tokenizer DIR``), or of pre-tokenised rows ``{"input_ids": [101, 7592, 102], "label": 1}``
(optional ``"attention_mask"`` and ``"token_type_ids"``; padded per batch with the config's
``pad_token_id``, else 0, under attention mask 0), which need no tokenizer. Labels are integers
(cross-entropy) or numbers (``--loss mse``), under ``"label"`` or ``"labels"``. Or DATA is a
file written by ``torch.save``: ``(X, Y)``, ``{"x": X, "y": Y}`` or a ``TensorDataset`` (the
last tensor is the target, the others are positional inputs); a batch is ``model(X[i:i + B])``
against ``Y[i:i + B]``.

Every measure runs on the same consecutive batches of ``--batch-size`` (the last may be
smaller; at most ``--max-batches``) and reports their mean (``quotientsharp.sharpness``). A
table goes to stdout; ``--json OUT`` also writes the settings, every per-batch value and, for
the ascent measures, the solver's convergence trace per batch. Exit status 0, or 2 on bad input
(one line on stderr).

Diagnostics of the ascent measures: ``--blockwise`` tables the blocks of the best perturbation
(attention head pairs, diagonal pairs, parameters) with their norm share and the loss change
when only that block's part is applied (``--plot PNG`` draws it); ``--reference-n-iter N`` /
``--reference-restarts R`` run a stronger reference solve per batch and report the gap to it.

``--symmetry MODULE:FUNCTION`` measures geodesic sharpness with a symmetry of your own:
``FUNCTION(model)`` returns a ``QuotientBinding`` or a list of them (MODULE is imported from the
working directory or sys.path), as ``symmetries=`` in the API, each checked against the model
on the first batch. Where no symmetry is found or bound, a note under the table says that
geodesic equals adaptive sharpness there.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from quotientsharp.cli import plain_text, warning_notes
from quotientsharp.cli.measure_output import (
    blocks_table,
    environment,
    measure_label,
    reference_lines,
    results_table,
    solver_quality,
    write_json,
)
from quotientsharp.cli.output_errors import check_output_file
from quotientsharp.cli.sharpness_options import (
    add_sharpness_options,
    add_solver_options,
    sharpness_config,
)
from quotientsharp.workflows.data import load_batches
from quotientsharp.workflows.devices import check_device
from quotientsharp.workflows.locks import OutputLock
from quotientsharp.workflows.measuring import sharpness_noting_symmetry
from quotientsharp.workflows.options import (
    InputError,
    MeasureRun,
    SharpnessConfig,
    measure_runs,
    options_for,
)
from quotientsharp.workflows.saved_models import load_measured_model
from quotientsharp.workflows.user_objects import load_symmetry

if TYPE_CHECKING:
    import torch

    from quotientsharp.engine import SharpnessResult

PROG = "quotientsharp measure"


def _check_plot(args: argparse.Namespace) -> None:
    """``--plot`` draws the blocks of ``--blockwise``, with matplotlib."""
    if args.plot is None:
        return
    if not args.blockwise:
        raise InputError("--plot draws the loss change per block: add --blockwise")
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib: pip install 'quotientsharp[plot]'")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``quotientsharp measure``, its arguments and options, on an ``argparse``
    subparsers object."""
    parser = subparsers.add_parser(
        "measure", help="sharpness of a saved model (HuggingFace directory or torch.save'd "
        "module) on a dataset (JSONL or torch.save'd tensors)", description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="HuggingFace model directory or torch.save'd nn.Module")
    parser.add_argument("data", help="JSONL file (text or input_ids rows) or torch.save'd "
                        "(X, Y) / {'x', 'y'} / TensorDataset")
    add_sharpness_options(parser)
    add_solver_options(parser)
    # a string, not a Path: Path("") is ".", and an empty --json must be refused as such
    parser.add_argument("--json", default=None, metavar="OUT",
                        help="also write settings, per-batch values and values to OUT")


def _sharpness(model: Any, batches: list, measure_run: MeasureRun, config: SharpnessConfig,
               bindings: list[Any] | None, args: argparse.Namespace
               ) -> tuple[SharpnessResult, bool]:
    """One measure's result, and whether it found no symmetry (a note under the table)."""
    from quotientsharp.engine import ReachWarning, measure_from

    measure = measure_run.measure
    rho = None if measure == "relative_flatness" else args.rho
    try:
        # the engine's typed measure, as the study's grid points make theirs
        spec = measure_from(measure, rho, options_for(measure_run, config, bindings))
        # a value short of its maximum is said under the table, with the options to use
        result, no_symmetry = sharpness_noting_symmetry(model, batches, spec, (ReachWarning,))
    except (TypeError, ValueError, IndexError, RuntimeError) as err:
        # the model and the data do not fit together (or an option does not fit the model)
        # named as the table would name it: with the user's bindings, not the default metric
        named = {**(measure_run.variant or {}), "bindings": bindings}
        raise InputError(f"{measure_label(measure, named)} sharpness "
                         f"of MODEL {args.model} on DATA {args.data} failed: {err}") from err
    return result, no_symmetry


def _print_notes(args: argparse.Namespace, config: SharpnessConfig, no_symmetry: bool,
                 measured: dict[str, SharpnessResult]) -> None:
    """The notes under the table: no symmetry found, an unused ``--metric``, values that may
    fall short of their maximum."""
    from quotientsharp.engine.layouts import NO_SYMMETRY_NOTE

    if no_symmetry:
        print(f"note: {NO_SYMMETRY_NOTE}")
    if config.symmetry is not None and "geodesic" in config.measures and args.metric is not None:
        print(f"note: --metric {args.metric} did not apply: with --symmetry {config.symmetry} "
              "geodesic sharpness measures with the metric of each binding's own quotient "
              "(named in its row)")
    short = {label: result.shortfalls() for label, result in measured.items()}
    for label, notes in short.items():
        for note in notes:
            print(f"note: {label}, {note}")
    if any(short.values()):
        print("note: a value whose reach is below 0.99 may not be the maximum: search longer "
              f"(--chains 8 --n-iter 50){_locality_advice(measured)} (docs/sharpness.md, "
              "'Reach and locality')")


def _locality_advice(measured: dict[str, SharpnessResult]) -> str:
    """What keeps the balls that are not local local, for the measures whose balls are not
    (the options of other measures would be refused: ``--metric`` without geodesic)."""
    wide = {result.measure for result in measured.values() if result.local is False}
    if not wide:
        return ""
    options = (["--order exact", "--metric inv"] if "geodesic" in wide else []) + (
        ["--measure adaptive (its ball moves every weight in proportion to its size)"]
        if "worst_case" in wide else [])
    either = f"{', '.join(options)}, or " if options else ""
    return f"; where the ball is not local, use {either}a smaller --rho"


def _print_diagnostics(args: argparse.Namespace, measured: dict[str, SharpnessResult]) -> None:
    """The solver's diagnostics after the notes: the reference solves' gaps, the blocks (and
    their plot)."""
    gaps = reference_lines(list(measured.items()))
    if gaps:
        print(gaps)
    blockwise = {label: result for label, result in measured.items() if result.blocks}
    for label, result in blockwise.items():
        print()
        print(blocks_table(label, result.block_summary()))
    if args.plot is not None:
        from quotientsharp.engine.blocks import plot_blocks

        print(f"wrote {plot_blocks(list(blockwise.values()), args.plot)}")


def _document(args: argparse.Namespace, config: SharpnessConfig, runs: list[MeasureRun],
              facts: dict[str, Any], device: torch.device, dtypes: list[str],
              results: dict[str, dict[str, Any]], warnings: list[str]) -> dict[str, Any]:
    """The ``--json`` document: the model and data (``facts``), the settings resolved, the
    environment, the results, the values and the library's warnings (the notes they became)."""
    metrics, orders = list(config.metrics or ()), list(config.orders or ())
    as_given = ("batch_size", "max_batches", "n_iter", "chains", "seed", "blockwise",
                "reference_n_iter", "reference_restarts", "max_length")
    return {
        "model": str(args.model), "data": str(args.data), **facts,
        "settings": {"measures": list(config.measures), "keys": [r.key for r in runs],
                     "rho": args.rho,
                     "metric": metrics[0] if len(metrics) == 1 else metrics,
                     "order": orders[0] if len(orders) == 1 else orders,
                     "eps": config.eps, "p": config.p, "symmetry": config.symmetry,
                     "samples": config.samples, "layer": config.layer, "loss": args.loss,
                     "nonfinite": config.nonfinite,
                     **{option: getattr(args, option) for option in as_given},
                     # --n-iter left out is None (so that one given alone can be refused)
                     "n_iter": config.solver.n_iter,
                     "dtype": args.dtype or dtypes, "device": str(device)},
        "environment": environment(device),
        "results": results,
        "value": {key: result["value"] for key, result in results.items()},
        "warnings": warnings,
    }


def run(args: argparse.Namespace) -> int:
    """Execute the subcommand; returns the process exit status (bad input raises: the
    console script reports it)."""
    config = sharpness_config(args)
    _check_plot(args)
    # the outputs, before minutes of measuring: none may be an input, a folder, a FIFO, ...
    inputs = [("MODEL", args.model), ("DATA", args.data), ("--tokenizer", args.tokenizer)]
    json_path = check_output_file(args.json, "--json", inputs)
    check_output_file(args.plot, "--plot", inputs)
    # one writer per --json file: a second measure to it fails here, at once (held until the
    # function returns, by this name)
    json_lock = None if json_path is None else OutputLock(json_path, "--json").acquire()
    runs = measure_runs(config)
    device = check_device(config.device)
    # the library's warnings (a degenerate LoRA adapter, ...) become notes under the table
    with warning_notes() as notes:
        model = load_measured_model(args.model, device, config.dtype)
        batches, examples, data_kind = load_batches(args.data, model, args.model,
                                                    config.batches)
        bindings = None if config.symmetry is None else load_symmetry(config.symmetry, model)
        parameters = sum(p.numel() for p in model.parameters())
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
        print(f"{PROG}: {type(model).__name__} ({parameters:,} parameters, {', '.join(dtypes)}, "
              f"{device}) on {examples} examples ({data_kind}) in {len(batches)} batch(es) of "
              f"<= {config.batches.batch_size}")

        rows: list[tuple[str, SharpnessResult, float]] = []
        results: dict[str, dict[str, Any]] = {}
        no_symmetry = False
        for measure_run in runs:
            tic = time.perf_counter()
            result, none_found = _sharpness(model, batches, measure_run, config, bindings, args)
            no_symmetry = no_symmetry or none_found
            seconds = time.perf_counter() - tic
            rows.append((measure_label(measure_run.measure, result.settings), result, seconds))
            results[measure_run.key] = {
                "measure": measure_run.measure,
                "value": result.value, "per_batch": result.per_batch,
                "clean_losses": result.clean_losses,
                "perturbed_losses": result.perturbed_losses,
                "perturbation_norms": result.perturbation_norms, "excluded": result.excluded,
                "frozen": result.frozen, "settings": result.settings, "seconds": seconds,
                **solver_quality(result)}
        print(results_table(rows))
        measured = {label: result for label, result, _ in rows}
        _print_notes(args, config, no_symmetry, measured)
    for note in notes:
        print(f"note: {note}")
    _print_diagnostics(args, measured)

    if json_path is not None:
        facts = {"model_class": type(model).__name__, "parameters": parameters,
                 "examples": examples, "data_kind": data_kind, "batches": len(batches)}
        document = _document(args, config, runs, facts, device, dtypes, results, notes)
        write_json(json_path, document)
        print(f"wrote {args.json}")
    if json_lock is not None:
        json_lock.release()
    return 0

