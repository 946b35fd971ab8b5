"""``quotientsharp study``: the driver, from the manifest to every output, resumable, on ranks;
each model is a unit of work of :class:`~quotientsharp.workflows.resumable.ResumableRun`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows import measuring
from quotientsharp.workflows.data import existing_file
from quotientsharp.workflows.files import write_json_atomic, write_text_atomic, writes_over
from quotientsharp.workflows.fingerprints import content_identity, content_sha256
from quotientsharp.workflows.grid import GridPoint, build_grid, with_row_symmetries
from quotientsharp.workflows.manifest import MANIFEST_KEYS, ManifestEntry, read_manifest
from quotientsharp.workflows.options import InputError, StudyConfig
from quotientsharp.workflows.report import (
    csv_columns,
    csv_row,
    gap_label,
    gap_of,
    reserved_columns,
    solver_quality,
    study_report,
    tau_rows,
    tau_table,
    value_settings,
)

if TYPE_CHECKING:
    from quotientsharp.workflows.records import ResultsDirectory
    from quotientsharp.workflows.resumable import ResumableRun

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


def study_settings(config: StudyConfig, grid: Sequence[GridPoint]) -> dict[str, Any]:
    """Everything that determines the values (saved in ``run.json``, checked on resume)."""
    data = existing_file(config.data, "--data")
    tokenizer = config.batches.tokenizer
    return {"data": {"name": data.name, "sha256": content_sha256(data)},
            "grid": [point.as_dict() for point in grid], "gap_from": config.gap_kind,
            **value_settings(config),
            # only when given, so that the run.json of a study without one still resumes
            **({"symmetry": config.symmetry} if config.symmetry else {}),
            **({"chains": config.solver.chains} if config.solver.chains is not None else {}),
            **({"nonfinite": config.nonfinite} if config.nonfinite != "raise" else {}),
            # a tokenizer folder edited in place tokenises the text otherwise, and torch's
            # thread count changes the order of its reductions (values in the 7th digit)
            # (one that is not a folder is refused when the data are read)
            **({"tokenizer_sha256": content_sha256(tokenizer)}
               if tokenizer and Path(tokenizer).is_dir() else {}),
            **({"threads": config.threads} if config.threads is not None else {})}


def _check_identities(finished: Mapping[str, dict[str, Any]],
                      entries: Sequence[ManifestEntry], folder: Path,
                      config: StudyConfig) -> None:
    for entry in [entry for entry in entries if entry.name in finished]:
        record = finished[entry.name]
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
        if now.get("base_sha256") != saved.get("base_sha256"):
            changed.append(f"the base model of the adapter {paths['model']}")
        if changed:
            raise ValueError(f"--resume: the record of {entry.name!r} in {folder} was measured "
                             f"from other contents of {', '.join(changed)} (SHA-256 differs, "
                             "or the record predates content hashes): it would be stale. Run "
                             "without --resume to remeasure every model, or use another --out")
        if record.get("symmetry"):
            _check_symmetry(entry, record, folder, config)


def _check_symmetry(entry: ManifestEntry, record: Mapping[str, Any], folder: Path,
                    config: StudyConfig) -> None:
    """Refuse a record measured with other code or bindings of the user's symmetry."""
    from quotientsharp.workflows.fingerprints import fingerprint_change
    from quotientsharp.workflows.measuring import entry_symmetry
    from quotientsharp.workflows.saved_models import load_measured_model

    model = load_measured_model(entry.model, dtype=config.dtype)
    bound = entry_symmetry(entry, config.symmetry, model)
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
    """The value of ``key`` (``--color``) of each entry, as a finite number; ``None`` without
    a key."""
    if key is None:
        return None
    if key in MANIFEST_KEYS:
        # such a key is read, not carried to the outputs: "has no such key" would be wrong
        others = sorted({name for entry in entries for name in entry.extra})
        why = ("the gap is the plots' horizontal axis already" if key == "gap"
               else "it is not a number to colour by")
        raise ValueError(f"--color {key}: {key!r} is a manifest key with a meaning ({why}); "
                         "--color colours by one of the manifest's other keys, here "
                         f"{others}")
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
        if not math.isfinite(values[-1]):
            # a point without a colour would be left out of the plots without a word
            raise ValueError(f"--color {key}: model {entry.name!r} (line {entry.line}) has "
                             f"the non-finite value {entry.extra[key]!r}; colour by a key "
                             "that is finite for every model")
    return values


@dataclass
class _Plan:
    """A study's units and what they are measured and written with."""

    manifest: str | Path
    config: StudyConfig
    entries: list[ManifestEntry]
    grid: list[GridPoint]
    colors: list[float] | None
    device: Any
    settings: dict[str, Any]
    out: Path

    @property
    def by_name(self) -> dict[str, ManifestEntry]:
        return {entry.name: entry for entry in self.entries}


def _plan(manifest: str | Path, config: StudyConfig) -> _Plan:
    """Read the manifest and check everything that can be checked before a model is loaded."""
    from quotientsharp.workflows.saved_models import check_device

    grid = build_grid(config)
    entries = read_manifest(manifest, reserved=reserved_columns(grid))
    bound = [entry for entry in entries if entry.symmetry]
    if bound and "geodesic" not in config.measures:
        # as --symmetry, a row's symmetry applies to geodesic sharpness only
        raise InputError(f"MANIFEST {manifest}, line {bound[0].line}: symmetry "
                         f"{bound[0].symmetry} applies to geodesic only, and the measures "
                         f"are {', '.join(config.measures)}: add geodesic to the measures "
                         "(--measure), or leave the row's symmetry out")
    if config.gap_from is not None and not any(entry.computes_gap for entry in entries):
        # --gap-from says how a gap is computed from train and test data: with every gap
        # given it would change nothing
        raise InputError(f"--gap-from {config.gap_from}: every row of MANIFEST {manifest} "
                         "gives its gap, so none is computed from train and test data: leave "
                         "--gap-from out, or give train and test instead of gap")
    # rows with a symmetry of their own measure with its metric: the labels say so
    grid = with_row_symmetries(grid, bool(bound))
    out = Path(config.out) if config.out is not None else default_out(manifest)
    _check_inputs_kept(out, manifest, config, entries, grid)
    return _Plan(manifest, config, entries, grid, colors=_colors(entries, config.color),
                 device=check_device(config.device), settings=study_settings(config, grid),
                 out=out)


def _check_inputs_kept(out: Path, manifest: str | Path, config: StudyConfig,
                       entries: Sequence[ManifestEntry], grid: Sequence[GridPoint]) -> None:
    """Refuse an output folder where a file the study writes is one of its inputs (``--out .``
    beside a manifest named ``models.csv`` would replace the manifest by the results)."""
    inputs = [("MANIFEST", Path(manifest)), ("--data", config.data)] + [
        (f"MANIFEST {manifest}, line {entry.line}: {role}", path) for entry in entries
        for role, path in (("model", entry.model), ("train", entry.train), ("test", entry.test))]
    written = [MODELS, CSV, REPORT, TAUS_JSON, TAUS_CSV, "run.json",
               *(f"scatter_{point.key}.png" for point in grid)]
    for name in written:
        for role, source in inputs:
            if source is not None and writes_over(out / name, Path(source)):
                raise InputError(f"--out {out}: the study would write {name} over {role} "
                                 f"{source}; choose another output folder")


def _measure_units(plan: _Plan) -> tuple[dict[str, dict[str, Any]], ResumableRun]:
    """Measure the models not yet measured; every record, in manifest order, and the run."""
    import torch

    from quotientsharp.workflows.resumable import ResumableRun

    config, by_name, gap_from = plan.config, plan.by_name, plan.config.gap_kind
    columns = csv_columns(plan.entries, plan.grid)
    owned = [MODELS, CSV, REPORT, TAUS_JSON, TAUS_CSV,
             *(f"scatter_{p.key}.png" for p in plan.grid)]

    def mirror(folder: ResultsDirectory, records: Mapping[str, dict[str, Any]]) -> None:
        folder.write_csv(CSV, columns, [csv_row(by_name[name], record, gap_from)
                                        for name, record in records.items()])

    def measure(name: str, status: Callable[[str], None]) -> dict[str, Any]:
        return measuring.measure_entry(by_name[name], plan.grid, config, plan.device,
                                       lambda text: status(f"{name}: {text}"))

    run = ResumableRun(plan.out, list(by_name), study=STUDY, settings=plan.settings,
                       resume=config.resume, owned=owned, records=MODELS, key="name",
                       unit="model", description="study models", progress=config.progress,
                       mirror=mirror,
                       check=lambda done: _check_identities(done, plan.entries, plan.out, config))
    saved_threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        run.open()
        records = run.run(measure)
    finally:
        torch.set_num_threads(saved_threads)
    return records, run


def _tau_rows(plan: _Plan, records: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``taus.json``: each grid point's taus and the solver's quality."""
    gaps = [gap_of(entry, records[entry.name]) for entry in plan.entries]
    bootstrap = plan.config.bootstrap
    taus = tau_rows(gaps, _values(plan, records), plan.grid, resamples=bootstrap.resamples,
                    confidence=bootstrap.confidence, seed=bootstrap.seed)
    for point, row in zip(plan.grid, taus, strict=True):
        row.update(solver_quality([records[e.name] for e in plan.entries], point.key))
    return taus


def _values(plan: _Plan, records: Mapping[str, dict[str, Any]]) -> dict[str, list[float]]:
    return {point.key: [records[e.name]["sharpness"][point.key] for e in plan.entries]
            for point in plan.grid}


def _write_outputs(plan: _Plan, records: Mapping[str, dict[str, Any]],
                   taus: list[dict[str, Any]], ignored: list[str], world_size: int,
                   results: ResultsDirectory, wall: float) -> tuple[list[Path] | None, float]:
    """Write the taus, the plots, the report and ``run.json`` (rank 0, at the end)."""
    from quotientsharp.workflows.plots import study_plots

    config, entries = plan.config, plan.entries
    write_json_atomic(results.file(TAUS_JSON), taus)
    results.write_csv(TAUS_CSV, TAU_COLUMNS, taus)
    # the plots of an earlier run (of another grid or manifest, or before --no-plots) would sit
    # beside the new taus with titles and points of other data
    for path in [*results.path.glob("scatter_*.png"), *results.path.glob("scatter_*.svg")]:
        path.unlink(missing_ok=True)
    plots = None
    if config.plots:
        gaps = [gap_of(entry, records[entry.name]) for entry in entries]
        plots = study_plots(gaps, _values(plan, records), plan.grid, taus, results.path,
                            x_label=gap_label(entries, config.gap_kind), color=plan.colors,
                            color_label=config.color or "")
    report = study_report(str(plan.manifest), config, entries, records, plan.grid, taus,
                          [path.name for path in plots or []], world_size=world_size,
                          resumed=int(results.run_info.get("resumed", 0)), wall_seconds=wall)
    write_text_atomic(results.file(REPORT), report)
    results.save_run_info(ignored_records=ignored, bootstrap=dataclasses.asdict(config.bootstrap),
                          taus=taus)
    return plots, wall


def run_study(manifest: str | Path, config: StudyConfig) -> StudyOutcome:
    """Run (or resume) the study of a manifest and write every output
    (:mod:`quotientsharp.workflows.runner`).

    Call it on every rank under torchrun, with the same arguments; every rank returns the same
    outcome.

    Parameters
    ----------
    manifest
        The manifest file (:mod:`quotientsharp.workflows.manifest`).
    config
        The data, the grid of measures and the study's options
        (:class:`~quotientsharp.workflows.options.StudyConfig`).

    Examples
    --------
    >>> from quotientsharp.workflows import StudyConfig, run_study
    >>> outcome = run_study("models.csv", StudyConfig(
    ...     data="data.pt", measures=["adaptive", "geodesic"], rho=[0.05, 0.1],
    ...     out="results/mine"))                                    # doctest: +SKIP
    >>> print(outcome.summary)                                     # doctest: +SKIP
    """
    from quotientsharp.workflows.taus import sign_convention

    if not isinstance(config, StudyConfig):     # e.g. the argparse.Namespace of the command
        raise TypeError(f"run_study takes a StudyConfig, got {type(config).__name__}")
    plan = _plan(manifest, config)
    records, run = _measure_units(plan)
    gap_from = config.gap_kind
    rows = [csv_row(entry, records[entry.name], gap_from) for entry in plan.entries]
    taus = _tau_rows(plan, records)
    ignored = sorted(run.ignored)
    plots, wall = run.finish(lambda results, wall: _write_outputs(
        plan, records, taus, ignored, run.world_size, results, wall))
    todo = run.computed_now
    summary = "\n".join([
        tau_table(taus, markdown=False), "",
        f"{len(rows)} models, measured now: {len(todo)}"
        + (f"; records of {len(ignored)} model(s) no longer in the manifest left out: "
           f"{ignored[:5]}" if ignored else "")
        + f"; wall time {wall:.1f} s",
        sign_convention("the generalisation gap"),
        f"Report: {plan.out / REPORT} (models.csv, taus.json, plots and run.json beside it)."])
    return StudyOutcome(plan.out, rows, taus, todo, ignored, summary, plots, wall)
