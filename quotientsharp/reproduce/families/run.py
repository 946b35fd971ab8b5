"""The driver of every family study: train and measure each model as a unit of the runner of
every study, then write the taus, plots and page data (the protocol: :mod:`.families`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from quotientsharp.core.scalars import check_int
from quotientsharp.reproduce.config import FamilyConfig, check_config, run_study_command
from quotientsharp.reproduce.families.data import (
    ClassificationData,
    sharpness_batches,
    shuffled_pool,
    take,
)
from quotientsharp.reproduce.families.measures import (
    MeasureSpec,
    eps_sweep_measures,
    family_measures,
    measure_model,
)
from quotientsharp.reproduce.families.report import (
    confound_rows,
    csv_columns,
    page_data,
    spec_label,
    tau_rows,
)
from quotientsharp.reproduce.families.seeds_report import headline_rows, seeded_statistics
from quotientsharp.reproduce.families.settings import FamilySettings, FamilyStudy, study_settings
from quotientsharp.reproduce.families.training import (
    draw_hyperparameters,
    error_rate,
    mean_loss,
    train_classifier,
)
from quotientsharp.workflows.records import ResultsDirectory
from quotientsharp.workflows.resumable import ResumableRun


def default_out(name: str, quick: bool, study_seeds: int | None) -> Path:
    """Default results folder: ``results/<name>[-seeds][-quick]``."""
    return Path(f"results/{name}" + ("" if study_seeds is None else "-seeds")
                + ("-quick" if quick else ""))


def train_family_model(study: FamilyStudy, data: ClassificationData, variant: FamilySettings,
                       seed: int, index: int, status: Callable[[str], None],
                       start_weights: Any = None) -> tuple[torch.nn.Module | None,
                                                           dict[str, Any]]:
    """Model ``index`` of study seed ``seed`` trained: ``(model, record)``, the model ``None``
    when training diverged (the record says why)."""
    hyper = draw_hyperparameters(variant.space, seed, index)
    torch.manual_seed(hyper.init_seed)
    model = (study.build_model(data.num_labels) if study.pretrained is None
             else study.build_model(data.num_labels, start_weights))
    if study.adapt is not None:
        model = study.adapt(model, hyper)
    model = model.to(data.train_labels.device)
    record: dict[str, Any] = {"index": index, **hyper.as_dict(), "diverged": False}
    record["parameters"] = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    status(f"model {index}: training {hyper.epochs} epochs")
    try:
        record["final_train_objective"] = train_classifier(model, data, hyper,
                                                           variant.train_batch_size)
    except FloatingPointError as err:
        # kept in the records (and out of the taus) so that no model is silently dropped
        record.update(diverged=True, reason=str(err), train_seconds=time.perf_counter() - start)
        return None, record
    record["train_seconds"] = time.perf_counter() - start
    train_inputs = take(data.train_inputs, slice(0, hyper.train_size))
    train_labels = data.train_labels[:hyper.train_size]
    record["train_error"] = error_rate(model, train_inputs, train_labels)
    record["test_error"] = error_rate(model, data.test_inputs, data.test_labels)
    record["gap"] = record["test_error"] - record["train_error"]
    record["train_loss"] = mean_loss(model, train_inputs, train_labels)
    record["test_loss"] = mean_loss(model, data.test_inputs, data.test_labels)
    return model, record


def _model_record(study: FamilyStudy, data: ClassificationData, variant: FamilySettings,
                  specs: Sequence[MeasureSpec], batches: Sequence[Any], seed: int,
                  index: int, status: Callable[[str], None],
                  start_weights: Any = None) -> dict[str, Any]:
    """Train and measure model ``index``; a diverged training is recorded, not retried."""
    model, record = train_family_model(study, data, variant, seed, index, status,
                                       start_weights)
    if model is None:
        return record
    start = time.perf_counter()
    measured = measure_model(model, batches, specs, variant.n_iter,
                             tick=lambda key: status(f"model {index}: {key} done"))
    for key, result in measured.items():
        record[key] = result["value"]
        for field in ("per_batch", "seconds", "reach", "locality", "evaluations"):
            record[f"{key}_{field}"] = result[field]
    record["measure_seconds"] = time.perf_counter() - start
    return record


@dataclass
class FamilyOutcome:
    """What :func:`family_study` did: the records, the taus, the units computed now, the page."""

    out: Path
    records: list[dict[str, Any]]
    taus: list[dict[str, Any]]
    computed_now: list[int]
    page: dict[str, Any]
    wall_seconds: float


def family_study(study: FamilyStudy, out: Path | None = None, *, quick: bool = False,
                 models: int | None = None, seed: int = 0, study_seeds: int | None = None,
                 resume: bool = False,
                 progress: bool | None = None, plots: bool = True, docs: Path | None = None,
                 threads: int = 1, device: str = "cpu",
                 measuring: Mapping[str, int | None] | None = None) -> FamilyOutcome:
    """Run (or resume) a family study and write every output (call it on every rank).

    ``study_seeds`` ``S``: the study seeds ``seed, ..., seed + S - 1``, each with its own order
    of the training pool, the taus pooled (:mod:`.seeds_report`); ``measuring`` overrides the
    variant's ``n_iter``, ``sharpness_points`` and ``sharpness_batch_size``; ``device`` is no
    setting (a run may be resumed on another).
    """
    from quotientsharp.reproduce.results_page import check_renderer
    from quotientsharp.workflows.process_group import rank_and_world_size

    if docs is not None:
        check_renderer(docs)
    variant = _measured_variant(study.quick if quick else study.full, measuring)
    models = check_int("models", models if models is not None else variant.models, 1)
    threads = check_int("threads", threads, 1)
    seed = check_int("seed", seed, 0)
    seeds = [seed] if study_seeds is None else [
        seed + k for k in range(check_int("study-seeds", study_seeds, 1))]
    out = Path(out) if out is not None else default_out(study.name, quick, study_seeds)
    rank, world_size = rank_and_world_size()
    plan = _FamilyPlan(study, variant, quick, models, seeds, study_seeds is not None, out,
                       _rank_device(device, rank, world_size), threads)
    data = study.load_data(quick)
    specs = _study_specs(study)
    settings = study_settings(study, variant, models, seed, specs, data, quick)
    if plan.seeded:
        # only in the seeded study, so that run.json of a single-seed study is unchanged
        settings["study_seeds"] = seeds
        settings["pool_order"] = ("per study seed s, the training pool permuted by "
                                  "torch.randperm with torch.Generator().manual_seed(s)")
    run = _resumable_run(plan, specs, settings, resume, progress)
    records, start_weights = _train_and_measure_all(plan, run, data, specs)
    ordered = list(records.values())
    counted = [r for r in ordered if not r["diverged"]]
    # with several study seeds, the pooled taus replace those over all models (which would
    # ignore the seeds)
    seed_stats = seeded_statistics(counted, specs, study.paper) if plan.seeded else None
    taus = tau_rows(counted, specs, study.paper) if seed_stats is None else seed_stats["pooled"]
    confounds = confound_rows(counted) if seed_stats is None else seed_stats["confounds"]
    pretrained_note = ("" if study.pretrained is None or study.pretrained.describe is None
                       else study.pretrained.describe(start_weights))

    def finish(results: ResultsDirectory, wall: float) -> tuple[dict[str, Any], float]:
        page = page_data(study, settings, ordered, taus, wall, threads,
                         int(results.run_info.get("resumed", 0)), world_size,
                         confounds, plan.device, pretrained_note, specs, seeded=seed_stats)
        _write_family_outputs(results, study, settings, specs, counted, taus, confounds,
                              seed_stats, page, plots=plots, docs=docs)
        return page, wall

    page, wall = run.finish(finish)
    return FamilyOutcome(out, ordered, taus, run.computed_now, page, wall)


@dataclass(frozen=True)
class _FamilyPlan:
    """What one run of a family study does: the variant, its models and seeds, where and how."""

    study: FamilyStudy
    variant: FamilySettings
    quick: bool
    models: int
    seeds: list[int]
    seeded: bool
    out: Path
    device: str
    threads: int


def _measured_variant(variant: FamilySettings,
                      measuring: Mapping[str, int | None] | None) -> FamilySettings:
    """``variant`` with the measurement sizes of ``measuring`` that are given (checked)."""
    overrides: dict[str, Any] = {k: v for k, v in (measuring or {}).items() if v is not None}
    unknown = set(overrides) - {"n_iter", "sharpness_points", "sharpness_batch_size"}
    if unknown:
        raise ValueError(f"measuring overrides {sorted(unknown)} are not sizes of a variant")
    for name, value in overrides.items():
        check_int(name.replace("_", "-"), value, 1)
    return replace(variant, **overrides)


def _rank_device(device: str, rank: int, world_size: int) -> str:
    """The torch device of this rank, checked: ``"cuda"`` under torchrun is one GPU per rank."""
    try:
        device = str(torch.device(device))
    except RuntimeError as err:
        raise ValueError(f"device must be a torch device, got {device!r} ({err})") from err
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available")
    if device == "cuda" and world_size > 1:
        import os

        device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank)) % torch.cuda.device_count()}"
    return device


def _study_specs(study: FamilyStudy) -> list[MeasureSpec]:
    """The family measures and its eps sweep, restricted to its ``measure_keys`` if any."""
    specs = family_measures(study.rhos["adaptive"], study.rhos["worst_case"],
                            study.rhos["inv"], study.rhos["mix"])
    specs += eps_sweep_measures(study.rhos["inv"], study.rhos["mix"], study.eps_sweep)
    if study.measure_keys is None:
        return specs
    unknown_keys = set(study.measure_keys) - {spec.key for spec in specs}
    if unknown_keys:
        raise ValueError(f"measure_keys {sorted(unknown_keys)} are not family measures")
    return [spec for spec in specs if spec.key in study.measure_keys]


def _resumable_run(plan: _FamilyPlan, specs: Sequence[MeasureSpec], settings: dict[str, Any],
                   resume: bool, progress: bool | None) -> ResumableRun[int]:
    """The runner: one unit per (study seed, model), ``models.csv`` mirroring the finished."""
    space = plan.variant.space
    names = ["models.jsonl", "models.csv", "taus.json", "confounds.json", "page.json"]
    names += ["seeds.json"] if plan.seeded else []
    names += [f"scatter_{spec.key}.png" for spec in specs]
    drawn = [name for name, bounds in (("batch_size", space.batch_size),
                                       ("warmup_fraction", space.warmup),
                                       ("rank", space.rank))
             if bounds is not None]
    columns = (["unit", "study_seed"] if plan.seeded else []) + csv_columns(specs, drawn)

    def mirror(folder: ResultsDirectory, records: Mapping[int, dict[str, Any]]) -> None:
        folder.write_csv("models.csv", columns, records.values())

    name = plan.study.name
    return ResumableRun(plan.out, range(plan.models * len(plan.seeds)), study=name,
                        settings=settings, resume=resume, owned=names, records="models.jsonl",
                        key="unit" if plan.seeded else "index", unit="model",
                        description=f"{name} models", progress=progress, mirror=mirror)


def _start_weights(plan: _FamilyPlan, rank: int) -> Any:
    """The pretrained start (``None`` from scratch): rank 0 computes and caches it first."""
    from quotientsharp.workflows.process_group import run_on_rank0

    pretrained = plan.study.pretrained
    if pretrained is None:
        return None
    start_weights = run_on_rank0(lambda: pretrained.load(plan.out, plan.quick), share=False)
    if rank != 0:
        start_weights = pretrained.load(plan.out, plan.quick)
    return start_weights


def _train_and_measure_all(plan: _FamilyPlan, run: ResumableRun[int], data: ClassificationData,
                           specs: Sequence[MeasureSpec]
                           ) -> tuple[Mapping[int, dict[str, Any]], Any]:
    """Compute the missing models; every model's record and the pretrained start."""
    saved_threads = torch.get_num_threads()
    # set before the folder is opened, so that run.json records the thread count the run uses
    torch.set_num_threads(plan.threads)
    try:
        run.open()
        start_weights = _start_weights(plan, run.rank)
        if run.folder is not None:
            run.folder.save_run_info(device=plan.device)
        data = data.to(plan.device)
        variant, models, seeds = plan.variant, plan.models, plan.seeds

        # per study seed its data and batches, built with its first model (units run in
        # order: one seed's data alive at a time, whatever --study-seeds)
        @functools.lru_cache(maxsize=1)
        def seed_inputs(study_seed: int) -> tuple[Any, Any]:
            pool = shuffled_pool(data, study_seed) if plan.seeded else data
            return pool, sharpness_batches(pool, variant.sharpness_points,
                                           variant.sharpness_batch_size)

        def train_and_measure(unit: int, status: Callable[[str], None]) -> dict[str, Any]:
            study_seed, index = seeds[unit // models], unit % models
            pool, batches = seed_inputs(study_seed)
            record = _model_record(plan.study, pool, variant, specs, batches, study_seed, index,
                                   status, start_weights)
            return {"unit": unit, "study_seed": study_seed, **record} if plan.seeded else record

        records = run.run(train_and_measure)
    finally:
        torch.set_num_threads(saved_threads)
    return records, start_weights


def _write_family_outputs(results: ResultsDirectory, study: FamilyStudy,
                          settings: dict[str, Any], specs: Sequence[MeasureSpec],
                          counted: Sequence[dict[str, Any]], taus: list[dict[str, Any]],
                          confounds: Any, seed_stats: dict[str, Any] | None,
                          page: dict[str, Any], *, plots: bool, docs: Path | None) -> None:
    """Rank 0: the taus, confounds, plots, page data, headline and docs page of the study."""
    from quotientsharp.reproduce.headline import write_headline
    from quotientsharp.reproduce.results_page import page_document, write_page
    from quotientsharp.workflows.files import write_json_atomic

    write_json_atomic(results.file("taus.json"), taus)
    write_json_atomic(results.file("confounds.json"), confounds)
    if seed_stats is not None:
        write_json_atomic(results.file("seeds.json"), seed_stats)
    if plots and counted:
        _scatter(results.path, counted, specs, taus)
    if docs is not None:
        headline = seed_stats or {"pooled": taus, "confounds": confounds}
        write_headline(Path(docs), study.name, headline_rows(study, settings, headline))
    document = page_document(study.name, page)
    write_json_atomic(results.file("page.json"), document)
    if docs is not None:
        write_page(Path(docs), document)
    results.save_run_info(taus=taus, confounds=confounds)


def _scatter(folder: Path, counted: Sequence[dict[str, Any]], specs: Sequence[MeasureSpec],
             taus: Sequence[dict[str, Any]]) -> None:
    """One scatter plot per measure: gap against measure, coloured by training-set size."""
    from quotientsharp.workflows.labels import tau_title
    from quotientsharp.workflows.plots import scatter_plots

    scatter_plots([r["gap"] for r in counted],
                  {spec.key: [r[spec.key] for r in counted] for spec in specs},
                  folder, x_label="generalisation gap (test error - train error)",
                  color=[r["train_size"] for r in counted],
                  color_label="training-set size",
                  titles={row["key"]: tau_title(row["tau_a"], row["tau_b"],
                                                paper=row["paper"],
                                                interval=row["tau_b_interval"],
                                                paper_label="paper (other setting)")
                          for row in taus},
                  y_labels={spec.key: spec_label(spec) for spec in specs})


def tau_lines(taus: Sequence[Mapping[str, Any]]) -> list[str]:
    """The console's taus: per measure its tau-b and interval (pooled over study seeds)."""
    lines = []
    for row in taus:
        name = row["measure"] if row["rho"] is None else f"{row['measure']} (rho {row['rho']:g})"
        tau, interval = row["tau_b"], row["tau_b_interval"]
        text = "undefined" if tau is None else f"{tau:+.2f}" + (
            "" if interval is None else f" [{interval[0]:+.2f}, {interval[1]:+.2f}]")
        lines.append(f"{name}: Kendall tau-b {text}")
    return lines


def run_family_study(study: FamilyStudy, config: FamilyConfig) -> int:
    """Run family study ``study`` as ``config`` says; the exit status."""
    check_config(config, FamilyConfig, study.name)
    out = config.out if config.out is not None else default_out(
        study.name, config.quick, config.study_seeds)

    def compute() -> FamilyOutcome:
        return family_study(study, out, quick=config.quick, models=config.models,
                            seed=config.seed, study_seeds=config.study_seeds,
                            resume=config.resume, progress=config.progress,
                            plots=config.plots, docs=config.docs, threads=config.threads,
                            device=config.device,
                            measuring={"n_iter": config.n_iter,
                                       "sharpness_points": config.sharpness_points,
                                       "sharpness_batch_size": config.sharpness_batch_size})

    def report(outcome: FamilyOutcome) -> None:
        print("\n".join(tau_lines(outcome.taus)))
        print(f"computed now: {len(outcome.computed_now)} model(s), wall time "
              f"{outcome.wall_seconds:.1f} s; results in {outcome.out}"
              + ("" if config.docs is None else
                 f"; docs page in {config.docs}/results/{study.name}.md"))

    return run_study_command(study.name, "models", out, compute, report)
