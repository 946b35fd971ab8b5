"""``quotientsharp measure MODEL DATA``: sharpness of a saved model on a dataset.

MODEL is a HuggingFace model directory (as ``save_pretrained`` writes it; the class of its
``architectures`` is loaded offline with eager attention, and a missing weight is an error) or a
``torch.save``'d module (loaded with ``weights_only=False``: only load files you trust).

DATA is a JSON-lines file (``.jsonl``) of text rows ``{"text": "...", "label": 1}`` (optional
``"text_pair"``; tokenised offline with the MODEL directory's tokenizer or ``--tokenizer DIR``)
or of pre-tokenised rows ``{"input_ids": [101, 7592, 102], "label": 1}`` (optional
``"attention_mask"`` and ``"token_type_ids"``; padded with the config's ``pad_token_id``, else
0); labels are integers (cross-entropy) or numbers (``--loss mse``), under ``"label"`` or
``"labels"``. Or DATA is a ``torch.save``'d ``(X, Y)``, ``{"x": X, "y": Y}`` or
``TensorDataset`` (the last tensor the target); a batch is ``model(X[i:i + B])``.

Every measure runs on the same consecutive batches of ``--batch-size`` (at most
``--max-batches``) and reports their mean. A table goes to stdout; ``--json OUT`` also writes
the settings, every per-batch value and the solver's traces. ``--blockwise`` tables the blocks
of the best perturbation with their norm share and loss change (``--plot PNG`` draws it);
``--reference-n-iter N`` / ``--reference-restarts R`` run a stronger reference solve per batch
and report the gap to it. ``--symmetry MODULE:FUNCTION`` measures geodesic sharpness with a
symmetry of your own: ``FUNCTION(model)`` returns a ``QuotientBinding`` or a list of them, as
``symmetries=`` in the API. Exit status 0, or 2 on bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.cli import plain_text, warning_notes
from quotientsharp.cli.output_errors import check_output_file
from quotientsharp.cli.sharpness_options import (
    add_sharpness_options,
    add_solver_options,
    sharpness_config,
)
from quotientsharp.workflows.data import load_batches
from quotientsharp.workflows.files import write_text_atomic, writes_over
from quotientsharp.workflows.labels import bindings_metric
from quotientsharp.workflows.locks import OutputLock
from quotientsharp.workflows.measuring import sharpness_noting_symmetry
from quotientsharp.workflows.options import (
    InputError,
    MeasureRun,
    SharpnessConfig,
    measure_runs,
    options_for,
)
from quotientsharp.workflows.saved_models import check_device, load_measured_model
from quotientsharp.workflows.user_objects import load_symmetry

if TYPE_CHECKING:
    import torch

    from quotientsharp.engine import SharpnessResult

PROG = "quotientsharp measure"


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """What the numbers were computed with: versions of Python, torch, quotientsharp and
    transformers, the platform, the device (and its name on CUDA) and torch's thread counts."""
    import torch

    from quotientsharp import __version__

    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "quotientsharp": __version__, "transformers": _installed("transformers"),
        "numpy": _installed("numpy"), "platform": platform.platform(), "device": str(device),
        "cuda": torch.version.cuda, "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info


def measure_label(measure: str, settings: dict[str, Any]) -> str:
    """The name of ``measure`` in the table, with the settings that tell its variants apart."""
    if measure == "geodesic":
        # a user's bindings measure with their own quotients' metric: named by binding
        bindings = settings.get("bindings")
        metric = (f"{bindings_metric(bindings)} metric" if bindings
                  else settings.get("metric"))
        return f"geodesic ({metric}, order {settings['order']})"
    if measure in ("worst_case", "adaptive") and settings.get("p") == "inf":
        return f"{measure} (Linf)"
    return measure


def jsonable(value: Any) -> Any:
    """Plain JSON types: tuples to lists, dtypes and other objects to strings, inf to 'inf'."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def results_table(rows: Sequence[tuple[str, Any, float]]) -> str:
    """The text table of stdout: one line per ``(label, result, seconds)`` (value, batch range,
    clean loss, the lowest reach estimate over the batches, whether every ball was local,
    time)."""
    from quotientsharp.engine.result import reach_text

    header = (f"{'measure':28s} {'value':>12s} {'min batch':>12s} {'max batch':>12s} "
              f"{'clean loss':>11s} {'reach':>6s} {'local':>5s} {'seconds':>8s}")
    lines = [header, "-" * len(header)]
    for label, result, seconds in rows:
        reach = "-" if result.min_reach is None else reach_text(result.min_reach)
        local = {None: "-", True: "yes", False: "no"}[result.local]
        losses = result.clean_losses
        lines.append(f"{label:28s} {result.value:12.5g} {min(result.per_batch):12.5g} "
                     f"{max(result.per_batch):12.5g} {sum(losses) / len(losses):11.5g} "
                     f"{reach:>6s} {local:>5s} {seconds:8.2f}")
    return "\n".join(lines)


def _json_result(measure: str, result: Any, seconds: float) -> dict[str, Any]:
    """The ``--json`` entry of one measure: its values, settings and time, and an ascent
    measure's diagnostics (reach, chains, evaluations, locality, rounding, traces, reference,
    blocks); average sharpness's rounding and its draws' mean loss change."""
    entries: dict[str, Any] = {
        "measure": measure, "value": result.value, "per_batch": result.per_batch,
        "clean_losses": result.clean_losses, "perturbed_losses": result.perturbed_losses,
        "perturbation_norms": result.perturbation_norms, "excluded": result.excluded,
        "frozen": result.frozen, "settings": result.settings, "seconds": seconds}
    if result.evaluations:
        entries.update(reach=result.reach, min_reach=result.min_reach, chains=result.chains,
                       evaluations=result.evaluations, locality=result.locality,
                       local=result.local, rounding=result.rounding)
    if result.draw_rises:
        # average sharpness: its rounding and the scale it is judged against
        entries.update(rounding=result.rounding, draw_rises=result.draw_rises)
    if result.traces:
        entries["traces"] = result.traces
    if result.reference_per_batch:
        entries.update(reference_value=result.reference_value, gap=result.gap,
                       relative_gap=result.relative_gap,
                       reference_per_batch=result.reference_per_batch,
                       gap_per_batch=result.gap_per_batch,
                       relative_gap_per_batch=result.relative_gap_per_batch,
                       reference_traces=result.reference_traces)
    if result.blocks is not None:
        entries.update(blocks=result.blocks, block_summary=result.block_summary())
    return entries


def blocks_table(label: str, summary: Sequence[dict[str, Any]], top: int = 15) -> str:
    """The block-wise table of one measure: the ``top`` blocks with the largest loss change
    (by absolute value; mean over batches), with kind and norm share."""
    # a loss change that was not finite on any batch (None) sorts last and reads "not finite"
    rows = sorted(summary, key=lambda r: -1.0 if r["loss_change"] is None
                  else abs(r["loss_change"]), reverse=True)
    width = max([28, *(len(r["name"]) for r in rows[:top])])
    header = f"{'block':{width}s} {'kind':>9s} {'norm share':>10s} {'loss change':>12s}"
    lines = [f"block-wise, {label}: loss change with only that block's part of the best "
             "perturbation (mean over batches)", header, "-" * len(header)]
    for row in rows[:top]:
        lines.append(f"{row['name']:{width}s} {row['kind']:>9s} {row['norm_share']:10.3%} "
                     + ("  not finite" if row["loss_change"] is None
                        else f"{row['loss_change']:12.5g}"))
    if len(rows) > top:
        lines.append(f"... {len(rows) - top} more block(s) with smaller loss changes "
                     "(all in --json)")
    return "\n".join(lines)


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` (folders created) as indented JSON of plain types."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # atomic: a reader, or a kill mid-write, sees the old document or the new one
    write_text_atomic(path, json.dumps(jsonable(document), indent=2))


def _check_plot(args: argparse.Namespace) -> None:
    """``--plot`` draws the blocks of ``--blockwise``, with matplotlib."""
    if args.plot is None:
        return
    if not args.blockwise:
        raise InputError("--plot draws the loss change per block: add --blockwise")
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib: pip install 'quotientsharp[plot]'")
    # matplotlib picks the format by the suffix, and refuses an unknown one only when it
    # saves: after the measurement, in a message that names no option, the --json unwritten
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(args.plot).suffix.lower().removeprefix(".")
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if suffix not in formats:
        # without a suffix matplotlib appends '.png': the file written is not the one named,
        # and may be another output's (--json res.png --plot res)
        said = f"matplotlib writes no '.{suffix}' files" if suffix else "it has no suffix"
        raise InputError(f"--plot {args.plot}: {said}; end the path with one of "
                         f"{', '.join('.' + f for f in formats)}")


def _check_distinct_outputs(outputs: list[tuple[str, Path | None]]) -> None:
    """Refuse two options that name one output file: the one written last would replace the
    other without a word."""
    given = [(flag, path) for flag, path in outputs if path is not None]
    for index, (flag, path) in enumerate(given):
        for other_flag, other in given[:index]:
            if writes_over(path, other):
                raise InputError(f"{other_flag} {other} and {flag} {path} are the same file: "
                                 "one output would replace the other; give two paths")


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
    from quotientsharp.engine import measure_from

    measure = measure_run.measure
    rho = None if measure == "relative_flatness" else args.rho
    # a failure is named as the table names the measure: with the user's bindings, if any
    named = {**(measure_run.variant or {}), "bindings": bindings}
    options = options_for(measure_run, config, bindings)
    return sharpness_noting_symmetry(
        model, batches, lambda: measure_from(measure, rho, options),
        f"{measure_label(measure, named)} sharpness of MODEL {args.model} on DATA {args.data}")


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
    # advice for the causes named only (a value within its rounding has its own in its note)
    advice = (["a value whose reach is below 0.99 may not be the maximum: search longer "
               "(--chains 8 --n-iter 50)"]
              if any(result.searched_short() for result in measured.values()) else [])
    local = _locality_advice(measured)
    advice += [local] if local else []
    if advice:
        print(f"note: {'; '.join(advice)} (docs/sharpness.md, 'Reach and locality')")


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
    return f"where the ball is not local, use {either}a smaller --rho"


def _print_diagnostics(args: argparse.Namespace, measured: dict[str, SharpnessResult]) -> None:
    """The solver's diagnostics after the notes: each reference solve's value and gap, the
    blocks (and their plot)."""
    for label, result in measured.items():
        if result.relative_gap is not None:        # None without a reference solve
            reference = result.settings["reference_solve"]
            print(f"{label}: reference solve ({reference['n_iter']} steps, "
                  f"{reference['restarts']} restart(s)) {result.reference_value:.6g}, "
                  f"Auto-PGD {result.value:.6g}: gap {result.gap:.3g} "
                  f"({100 * result.relative_gap:.3g}% of the reference)")
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


def _adapter_bases(model: str) -> list[Path]:
    """The local base models of an adapter directory MODEL (none for another MODEL)."""
    from quotientsharp.models.peft_loading import adapter_bases

    return adapter_bases(model) if Path(model).is_dir() else []


def run(args: argparse.Namespace) -> int:
    """Execute the subcommand; returns the process exit status (bad input raises: the
    console script reports it)."""
    config = sharpness_config(args)
    _check_plot(args)
    # the outputs, before minutes of measuring: none may be an input, a folder, a FIFO, ...
    inputs = [("MODEL", args.model), ("DATA", args.data), ("--tokenizer", args.tokenizer)]
    inputs += [("the base model of MODEL's adapter", base) for base in _adapter_bases(args.model)]
    json_path = check_output_file(args.json, "--json", inputs)
    plot_path = check_output_file(args.plot, "--plot", inputs)
    _check_distinct_outputs([("--json", json_path), ("--plot", plot_path)])
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
            results[measure_run.key] = _json_result(measure_run.measure, result, seconds)
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

