"""``quotientsharp study``: the driver, from the manifest to every output, resumable, on ranks.

:func:`run_study` measures every model of the manifest not yet measured, writes each record as
it finishes, then the taus, the plots and the report. Each model is a unit of work of the
runner every study uses (:class:`~quotientsharp.workflows.resumable.ResumableRun`), so the
results folder works as those of ``quotientsharp reproduce``:

- ``models.jsonl`` gets one record per model, appended and synced as the model finishes
  (under torchrun each rank ``r`` appends to its own ``models.rank{r}.jsonl``, folded into
  ``models.jsonl`` at the end); ``models.csv`` is rewritten from the records after each model
  (atomically), so a killed run loses no finished model;
- ``--resume`` keeps the records of the models still in the manifest (same model and data,
  else an error) and measures the others: a manifest may grow between runs. The settings that
  determine the values (the grid, the sharpness data's content, the batches, the loss, ...)
  must equal those saved in ``run.json``; the bootstrap and plot options may change;
- under torchrun the models still missing are dealt round-robin over the ranks
  (:func:`quotientsharp.engine.distributed.shard`), each measured whole on one rank; rank 0 alone
  creates, checks and finishes the folder (:func:`quotientsharp.engine.distributed.run_on_rank0`).
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quotientsharp.workflows import measuring
from quotientsharp.workflows.fingerprints import content_identity
from quotientsharp.workflows.grid import GridPoint, build_grid, with_row_symmetries
from quotientsharp.workflows.manifest import ManifestEntry, read_manifest
from quotientsharp.workflows.report import (
    command_line,
    csv_columns,
    csv_row,
    gap_label,
    gap_of,
    reserved_columns,
    solver_quality,
    study_report,
    tau_rows,
    tau_table,
)

__all__ = ["STUDY", "StudyOutcome", "default_out", "run_study", "study_settings"]

#: The study name in ``run.json`` (checked by ``--resume``).
STUDY = "quotientsharp study"
MODELS, CSV, REPORT = "models.jsonl", "models.csv", "report.md"
TAUS_JSON, TAUS_CSV = "taus.json", "taus.csv"
TAU_COLUMNS = ("key", "label", "measure", "metric", "order", "rho", "p", "count", "tau_a",
               "tau_a_low", "tau_a_high", "tau_b", "tau_b_low", "tau_b_high", "resamples",
               "confidence", "reach_min", "reached", "local", "second_order_max")


@dataclass
class StudyOutcome:
    """What :func:`run_study` did and found.

    Attributes
    ----------
    out
        The results folder.
    rows
        The rows of ``models.csv`` (manifest order).
    taus
        The rows of ``taus.json``.
    computed_now
        Names of the models measured in this session.
    ignored
        Names of records in the folder whose model is no longer in the manifest.
    summary
        The console summary (the tau table, the sign convention, where the files are).
    plots
        The plot files written (``None`` without matplotlib or with ``--no-plots``).
    wall_seconds
        Wall time of every session of the run.
    """

    out: Path
    rows: list[dict[str, Any]]
    taus: list[dict[str, Any]]
    computed_now: list[str]
    ignored: list[str]
    summary: str
    plots: list[Path] | None
    wall_seconds: float


def default_out(manifest: str | Path) -> Path:
    """The default results folder: ``results/<manifest stem>``."""
    return Path("results") / Path(manifest).stem


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def study_settings(args: argparse.Namespace, grid: Sequence[GridPoint],
                   gap_from: str) -> dict[str, Any]:
    """Everything that determines the values (saved in ``run.json``, checked on resume)."""
    data = Path(args.data)
    if not data.is_file():
        raise FileNotFoundError(f"--data {data} does not exist" if not data.exists()
                                else f"--data {data} is not a file")
    return {"data": {"name": data.name, "sha256": _digest(data)},
            "grid": [point.as_dict() for point in grid], "gap_from": gap_from,
            "loss": args.loss, "batch_size": args.batch_size, "max_batches": args.max_batches,
            "n_iter": args.n_iter, "seed": args.seed, "eps": args.eps,
            "samples": args.samples, "layer": args.layer, "max_length": args.max_length,
            "tokenizer": args.tokenizer, "dtype": args.dtype,
            # only when given, so that the run.json of a study without one still resumes
            **({"symmetry": args.symmetry} if getattr(args, "symmetry", None) else {})}


def _check_identities(finished: Mapping[str, dict[str, Any]],
                      entries: Sequence[ManifestEntry], folder: Path,
                      args: argparse.Namespace | None = None) -> None:
    for entry in entries:
        record = finished.get(entry.name)
        if record is None:
            continue
        saved = record.get("identity")
        paths = entry.identity()
        if not isinstance(saved, dict) or {k: saved.get(k) for k in paths} != paths:
            raise ValueError(f"--resume: {folder} holds a record of {entry.name!r} made from "
                             f"{saved}, but the manifest now gives {paths}; rename the model "
                             "in the manifest, use another --out, or run without --resume")
        # the same paths: the same bytes? (a checkpoint replaced in place keeps its path)
        now = content_identity(entry)
        changed = [f"{key} {paths[key]}" for key in ("model", "train", "test")
                   if now[f"{key}_sha256"] != saved.get(f"{key}_sha256")]
        if changed:
            raise ValueError(f"--resume: the record of {entry.name!r} in {folder} was measured "
                             f"from other contents of {', '.join(changed)} (SHA-256 differs, "
                             "or the record predates content hashes): it would be stale. Run "
                             "without --resume to remeasure every model, or use another --out")
        if args is not None and record.get("symmetry"):
            _check_symmetry(entry, record, folder, args)


def _check_symmetry(entry: ManifestEntry, record: Mapping[str, Any], folder: Path,
                    args: argparse.Namespace) -> None:
    """Refuse a record measured with other code or other bindings of the user's symmetry
    than those it would be measured with now (:func:`.fingerprints.fingerprint_change`)."""
    import torch

    from quotientsharp.workflows.fingerprints import fingerprint_change
    from quotientsharp.workflows.measuring import entry_symmetry
    from quotientsharp.workflows.saved_models import load_measured_model

    model = load_measured_model(entry.model)
    if args.dtype is not None:
        model = model.to(dtype=getattr(torch, args.dtype))
    bound = entry_symmetry(entry, args, model)
    spec = None if bound is None else bound[0]
    change = (f"its symmetry is now {spec}, not {record['symmetry']}"
              if spec != record["symmetry"] or bound is None
              else fingerprint_change(record.get("symmetry_fingerprint"), bound[2]))
    if change is not None:
        raise ValueError(f"--resume: the record of {entry.name!r} in {folder} was measured "
                         f"with another symmetry {record['symmetry']}: {change}; values of "
                         "two symmetries would be mixed. Run without --resume to remeasure "
                         "every model, or use another --out")


def _colors(entries: Sequence[ManifestEntry], key: str | None) -> list[float] | None:
    if key is None:
        return None
    values = []
    for entry in entries:
        try:
            values.append(float(entry.extra[key]))
        except KeyError:
            raise ValueError(f"--color {key}: model {entry.name!r} (line {entry.line}) has no "
                             f"such key; the manifest's other keys are "
                             f"{sorted(entry.extra)}") from None
        except ValueError:
            raise ValueError(f"--color {key}: model {entry.name!r} (line {entry.line}) has "
                             f"the non-numeric value {entry.extra[key]!r}") from None
    return values


def run_study(manifest: str | Path, args: argparse.Namespace) -> StudyOutcome:
    """Run (or resume) the study of a manifest and write every output (module docstring).

    Call it on every rank under torchrun, with the same arguments; every rank returns the same
    outcome.

    Parameters
    ----------
    manifest
        The manifest file (:mod:`quotientsharp.workflows.manifest`).
    args
        The options of ``quotientsharp study`` (``data``, the sharpness options of
        ``quotientsharp measure``, ``gap_from``, ``out``, ``resume``, ``bootstrap``,
        ``confidence``, ``bootstrap_seed``, ``color``, ``plots``, ``progress``, ``threads``).
    """
    import torch

    from quotientsharp.workflows.devices import check_device
    from quotientsharp.workflows.files import (
        write_csv_atomic,
        write_json_atomic,
        write_text_atomic,
    )
    from quotientsharp.workflows.generalisation import gap_kind
    from quotientsharp.workflows.plots import study_plots
    from quotientsharp.workflows.records import ResultsDirectory
    from quotientsharp.workflows.resumable import ResumableRun
    from quotientsharp.workflows.taus import sign_convention

    grid = build_grid(args)
    gap_from = gap_kind(args.gap_from, args.loss)
    entries = read_manifest(manifest, reserved=reserved_columns(grid))
    # rows with a symmetry of their own measure with its metric: the labels say so
    grid = with_row_symmetries(grid, any(entry.symmetry for entry in entries))
    colors = _colors(entries, args.color)
    device = check_device(args.device)
    settings = study_settings(args, grid, gap_from)
    out = Path(args.out) if args.out is not None else default_out(manifest)
    columns = csv_columns(entries, grid)
    names = [MODELS, CSV, REPORT, TAUS_JSON, TAUS_CSV, *(f"scatter_{p.key}.png" for p in grid)]
    by_name = {entry.name: entry for entry in entries}

    def mirror(folder: ResultsDirectory, records: Mapping[str, dict[str, Any]]) -> None:
        write_csv_atomic(folder.file(CSV), columns,
                         [csv_row(by_name[name], record, gap_from)
                          for name, record in records.items()])

    def measure(name: str, status: Callable[[str], None]) -> dict[str, Any]:
        return measuring.measure_entry(by_name[name], grid, args, device, gap_from,
                                       lambda text: status(f"{name}: {text}"))

    run = ResumableRun(out, list(by_name), study=STUDY, settings=settings, resume=args.resume,
                       owned=names, records=MODELS, key="name", unit="model",
                       description="study models", progress=args.progress, mirror=mirror,
                       check=lambda finished: _check_identities(finished, entries, out, args))
    saved_threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        run.open()
        records = run.run(measure)
    finally:
        torch.set_num_threads(saved_threads)
    todo = run.computed_now
    world_size = run.world_size

    rows = [csv_row(entry, records[entry.name], gap_from) for entry in entries]
    gaps = [gap_of(entry, records[entry.name]) for entry in entries]
    values = {point.key: [records[e.name]["sharpness"][point.key] for e in entries]
              for point in grid}
    bootstrap = {"resamples": args.bootstrap, "confidence": args.confidence,
                 "seed": args.bootstrap_seed}
    taus = tau_rows(gaps, values, grid, resamples=args.bootstrap, confidence=args.confidence,
                    seed=args.bootstrap_seed)
    for point, row in zip(grid, taus, strict=True):
        row.update(solver_quality([records[e.name] for e in entries], point.key))
    ignored = sorted(run.ignored)

    def finish(results: ResultsDirectory, wall: float) -> tuple[list[Path] | None, float]:
        write_json_atomic(results.file(TAUS_JSON), taus)
        write_csv_atomic(results.file(TAUS_CSV), TAU_COLUMNS, taus)
        plots = None
        if args.plots:
            plots = study_plots(gaps, values, grid, taus, results.path,
                                x_label=gap_label(entries, gap_from), color=colors,
                                color_label=args.color or "")
        report = study_report(
            manifest=str(manifest), data=str(args.data),
            command=command_line(str(manifest), args, grid), entries=entries, records=records,
            grid=grid, taus=taus, settings=settings, gap_from=gap_from,
            plots=[path.name for path in plots or []], bootstrap=bootstrap,
            world_size=world_size, resumed=int(results.run_info.get("resumed", 0)),
            wall_seconds=wall)
        write_text_atomic(results.file(REPORT), report)
        results.save_run_info(ignored_records=ignored, bootstrap=bootstrap, taus=taus)
        return plots, wall

    plots, wall = run.finish(finish)
    summary = "\n".join([
        tau_table(taus, markdown=False), "",
        f"{len(rows)} models, measured now: {len(todo)}"
        + (f"; records of {len(ignored)} model(s) no longer in the manifest left out: "
           f"{ignored[:5]}" if ignored else "")
        + f"; wall time {wall:.1f} s",
        sign_convention("the generalisation gap"),
        f"Report: {out / REPORT} (models.csv, taus.json, plots and run.json beside it)."])
    return StudyOutcome(out, rows, taus, todo, ignored, summary, plots, wall)
