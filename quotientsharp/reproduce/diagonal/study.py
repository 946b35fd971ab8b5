"""``reproduce diagonal``: the study driver (training on rank 0, measures over the ranks)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from quotientsharp.core.scalars import check_int
from quotientsharp.reproduce.diagonal.data import (
    DiagonalProblem,
    Hyperparameters,
    derived_seed,
    draw_hyperparameters,
    make_problem,
)
from quotientsharp.reproduce.diagonal.exact import extra_values
from quotientsharp.reproduce.diagonal.measures import (
    MEASURE_NAMES,
    MEASURES,
    measure_nets,
    sharpness_batches,
)
from quotientsharp.reproduce.diagonal.report import (
    CSV_COLUMNS,
    CSV_FILE,
    EXTRA_NAMES,
    MODEL_FILE,
    PAGE_FILE,
    STUDY,
    TRAINED_FILE,
    StudyResult,
    analyse,
    csv_row,
    kendall_taus,
    model_record,
    page_data,
    scatter_measures,
)
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.training import TrainedNet, compute_test_losses, train_nets
from quotientsharp.reproduce.results_page import check_renderer, page_document, write_page
from quotientsharp.workflows.files import write_json_atomic
from quotientsharp.workflows.records import ResultsDirectory
from quotientsharp.workflows.resumable import ResumableRun, rank0_value


def diagonal_study(settings: DiagonalSettings, out: Path, *, resume: bool = False,
                   progress: bool | None = None, plots: bool = True, docs: Path | None = None,
                   threads: int | None = 1,
                   on_record: Callable[[str, int], None] | None = None) -> StudyResult:
    """Run (or resume) the study and write every output; ``threads`` ``None`` leaves torch's
    threads as they are; ``on_record`` is called on rank 0 with ``("trained" | "model", index)``
    after each record.

    Under torchrun call it on every rank: training runs on rank 0 alone (a net's rounding
    depends on the shape of the batch it trains in), the measures are dealt over the ranks and
    all-gathered, so every rank returns one process's result bit for bit.
    """
    if docs is not None:
        check_renderer(docs)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads, 1))
    owned = [MODEL_FILE, TRAINED_FILE, CSV_FILE, PAGE_FILE,
             *[f"scatter_{name}.{kind}" for name in (*MEASURE_NAMES, "panels")
               for kind in ("png", "svg")]]

    def mirror(folder: ResultsDirectory, records: Mapping[int, dict[str, Any]]) -> None:
        folder.write_csv(CSV_FILE, CSV_COLUMNS, [csv_row(record) for record in records.values()])

    # the records are made from batched values, instantly: no bar of their own
    run = ResumableRun(Path(out), range(settings.nets), study=STUDY,
                       settings=settings.as_dict(), resume=resume, owned=owned,
                       records=MODEL_FILE, key="model", unit="net",
                       description="diagonal records", progress=False, mirror=mirror)
    try:
        # rank 0 alone opens (and on --resume checks) the folder; its errors reach every rank
        finished = run.open()
        result = _run(settings, run, finished, progress if run.rank == 0 else False, plots,
                      docs, on_record)
    except BaseException as err:
        if run.folder is not None:
            run.folder.save_run_info(status="interrupted" if isinstance(err, KeyboardInterrupt)
                                     else f"failed: {type(err).__name__}: {err}")
        raise
    finally:
        torch.set_num_threads(previous_threads)
    return result


def _run(settings: DiagonalSettings, run: ResumableRun[int],
         finished_records: dict[int, dict[str, Any]], progress: bool | None, plots: bool,
         docs: Path | None, on_record: Callable[[str, int], None] | None) -> StudyResult:
    """The study after the folder is open (``run.folder`` is ``None`` on ranks other than 0)."""
    problem = make_problem(settings)
    hyper = draw_hyperparameters(settings)
    trained, to_train, train_seconds = rank0_value(
        lambda: _train(settings, run, problem, hyper, finished_records, progress, on_record))

    to_measure = [i for i in range(settings.nets) if i not in finished_records]
    measure_start = time.perf_counter()
    healthy = [i for i in to_measure if not trained[i].diverged]
    per_batch = (_measure(settings, problem, [trained[i] for i in healthy], healthy, progress)
                 if healthy else {})
    measure_seconds = time.perf_counter() - measure_start

    def record(i: int, status: Callable[[str], None]) -> dict[str, Any]:
        # the test loss is one product per net: computed here, on the rank making the record
        [test_loss] = compute_test_losses(problem, [trained[i]])
        return model_record(hyper[i], trained[i], test_loss, per_batch.get(i))

    def saved(i: int) -> None:
        if on_record is not None:
            on_record("model", i)

    records = run.run(record, saved)

    def finish(directory: ResultsDirectory, wall: float) -> StudyResult:
        return _finish(settings, directory, list(records.values()), to_train, to_measure,
                       train_seconds, measure_seconds, plots, docs, wall, run.world_size)

    return run.finish(finish)


def _train(settings: DiagonalSettings, run: ResumableRun[int], problem: DiagonalProblem,
           hyper: list[Hyperparameters], finished_records: dict[int, dict[str, Any]],
           progress: bool | None, on_record: Callable[[str, int], None] | None
           ) -> tuple[dict[int, TrainedNet], list[int], float]:
    """Rank 0: record the draws, train every net with neither a record nor a trained state;
    every net's trained state, the nets trained now and the training time."""
    directory = run.rank0_folder()
    directory.save_run_info(
        hyperparameters=[asdict(h) for h in hyper],
        seeds={"seed": settings.seed,
               **{tag: derived_seed(settings.seed, tag)
                  for tag in ("data", "test", "hyperparameters")}},
        beta_star_support=problem.support,
        measures=[asdict(m) for m in MEASURES])
    trained = {int(r["model"]): TrainedNet.from_record(r)
               for r in directory.records(TRAINED_FILE)}

    def saved(net: TrainedNet) -> None:
        directory.append(TRAINED_FILE, asdict(net))
        if on_record is not None:
            on_record("trained", net.model)

    to_train = [i for i in range(settings.nets)
                if i not in finished_records and i not in trained]
    train_start = time.perf_counter()
    if to_train:
        frozen = dict(trained)
        for i in finished_records:
            if i not in frozen:
                raise ValueError(f"--resume: model {i} is in {MODEL_FILE} but not in "
                                 f"{TRAINED_FILE}; the folder is inconsistent, rerun "
                                 "without --resume")
        trained.update(train_nets(problem, hyper, settings, frozen, saved, progress))
    return trained, to_train, time.perf_counter() - train_start


def _measure(settings: DiagonalSettings, problem: DiagonalProblem, nets: list[TrainedNet],
             indices: list[int], progress: bool | None) -> dict[int, dict[str, list[float]]]:
    """Per net index of ``indices``, the per-batch values of every measure (dealt over the
    ranks) and extra (rank 0's, shared), on every rank."""
    from quotientsharp.workflows.process_group import gather_indexed, run_on_rank0, shard

    u = torch.tensor([net.u for net in nets], dtype=torch.float64)
    v = torch.tensor([net.v for net in nets], dtype=torch.float64)
    inputs, targets = sharpness_batches(problem, settings)
    if problem.per_net:
        inputs, targets = inputs[indices], targets[indices]
    mine = shard(MEASURES)       # every measure in one process
    local: list[tuple[int, list[list[float]]]] = []
    if mine:
        values = measure_nets(u, v, inputs, targets, settings.rho, settings.ascent,
                              measures=[spec for _, spec in mine], progress=progress)
        local = [(position, values[spec.name].tolist()) for position, spec in mine]
    rows = dict(zip(MEASURE_NAMES, gather_indexed(local), strict=True))
    # the exact maxima, the strong reference ascent and the population loss: on rank 0,
    # shared, since each rank makes the records of its share of the nets
    extras = run_on_rank0(lambda: {
        name: value.tolist() for name, value in extra_values(
            u, v, inputs, targets, problem.beta_star, settings.rho, settings.ascent,
            settings.reference_ascent,
            [derived_seed(settings.seed, f"reference:{i}") for i in indices],
            progress).items()})
    per_batch: dict[int, dict[str, list[float]]] = {}
    for row, i in enumerate(indices):
        per_batch[i] = {name: rows[name][row] for name in MEASURE_NAMES}
        if extras is not None:
            per_batch[i].update({name: extras[name][row] for name in EXTRA_NAMES})
    return per_batch


def _finish(settings: DiagonalSettings, directory: ResultsDirectory,
            records: list[dict[str, Any]], to_train: list[int], to_measure: list[int],
            train_seconds: float, measure_seconds: float, plots: bool, docs: Path | None,
            wall: float, world_size: int) -> StudyResult:
    """Rank 0: the taus, plots and sections of every net's record."""
    diverged = [r["model"] for r in records if r["diverged"]]
    unconverged = [r["model"] for r in records if not r["converged"] and not r["diverged"]]
    counted = [r["model"] for r in records if r["converged"]
               and math.isfinite(r["test_loss"])]
    taus = kendall_taus(records, counted)
    analysis = analyse(records, counted, settings) if len(counted) >= 2 else None

    if plots:
        scatter_measures(records, counted, analysis, directory.path, settings.rho)
    result = StudyResult(records, taus, counted, unconverged, diverged, to_train, to_measure,
                         wall, {}, directory.path, analysis)
    result.page = page_document(STUDY, page_data(
        settings, result, records, wall, directory.run_info.get("resumed", 0),
        torch.get_num_threads(), world_size))
    write_json_atomic(directory.file(PAGE_FILE), result.page)
    if docs is not None:
        write_page(Path(docs), result.page)
    directory.save_run_info(
        train_seconds=train_seconds,
        measure_seconds=measure_seconds, trained_now=to_train, measured_now=to_measure,
        counted=counted, unconverged=unconverged, diverged=diverged, taus=taus,
        analysis=analysis, threads=torch.get_num_threads())
    return result
