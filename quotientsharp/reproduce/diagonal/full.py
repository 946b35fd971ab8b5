"""``reproduce diagonal --full``: the study over data seeds, a rho sweep and a training set per net.

:func:`run_full` runs the default study in the results folder, then in subfolders
``full/<name>/`` the same hyperparameter draws on other data seeds at every radius of
:data:`FULL_RHOS`, and a training set per net at the study's radius; the page gets the taus per
seed, pooled over the seeds (cluster bootstrap) and per radius (:func:`full_statistics`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from quotientsharp.reproduce.diagonal.analysis import MAXIMUM_OF, spread
from quotientsharp.reproduce.diagonal.data import derived_seed
from quotientsharp.reproduce.diagonal.measures import MEASURES
from quotientsharp.reproduce.diagonal.report import (
    PAGE_FILE,
    STUDY,
    StudyResult,
    _canonical_command,
    page_data,
)
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.study import diagonal_study
from quotientsharp.reproduce.headline import write_headline
from quotientsharp.reproduce.results_page import check_renderer, page_document, write_page
from quotientsharp.workflows.files import write_json_atomic
from quotientsharp.workflows.taus import cluster_bootstrap_tau, tau_interval

Record = Mapping[str, Any]

@dataclass(frozen=True)
class Row:
    """One row of the sweep tables: a label and the per-record value it ranks."""

    label: str
    value: Callable[[Record], float]


def _sharpness(key: str) -> Callable[[Record], float]:
    return lambda record: float(record["sharpness"][key])


def _field(key: str) -> Callable[[Record], float]:
    return lambda record: float(record[key])


def _maximum_label(name: str) -> str:
    """The sweep row of the maximum of measure ``name`` (:data:`MAXIMUM_OF`)."""
    return f"{name} ({'exact' if MAXIMUM_OF[name].startswith('exact') else 'strong'} maximum)"


#: The rows of the sweep tables: the measures, their maxima, the population loss, the
#: confounds.
SWEEP_ROWS: tuple[Row, ...] = (
    *(Row(f"{spec.name} (Auto-PGD)", _sharpness(spec.name)) for spec in MEASURES
      if not spec.diagnostic),
    *(Row(_maximum_label(name), _sharpness(key)) for name, key in MAXIMUM_OF.items()),
    Row("population: adaptive (Auto-PGD)", _sharpness("population:adaptive")),
    Row("population: geodesic_inv_exact (Auto-PGD)",
        _sharpness("population:geodesic_inv_exact")),
    Row("population: geodesic_mix_exact (exact maximum)",
        _sharpness("population_exact:geodesic_mix_exact")),
    Row("population: geodesic_mix_exact_rateball (exact maximum)",
        _sharpness("population_exact:geodesic_mix_exact_rateball")),
    Row("confound: init_scale", _field("init_scale")),
    Row("confound: learning_rate", _field("learning_rate")),
    Row("confound: batch_size", _field("batch_size")),
)


@dataclass(frozen=True)
class SweepRun:
    """One run of ``--full``: its label and the counted records."""

    label: str
    records: Sequence[Record]


def _pairs(run: SweepRun, row: Row) -> tuple[list[float], list[float]]:
    return [r["test_loss"] for r in run.records], [row.value(r) for r in run.records]


def pooled_over_seeds(runs: Sequence[SweepRun], row: Row, samples: int, seed: int
                      ) -> dict[str, Any]:
    """The mean over the runs (seeds) of their tau-b with its two-stage cluster bootstrap
    interval, as ``{"tau_b", "b_low", "b_high"}``."""
    xs, ys, clusters = [], [], []
    for index, run in enumerate(runs):
        x, y = _pairs(run, row)
        xs += x
        ys += y
        clusters += [index] * len(x)
    tau, low, high = cluster_bootstrap_tau(xs, ys, clusters, samples, seed)
    return {"tau_b": tau, "b_low": low, "b_high": high}


def seed_table(runs: Sequence[SweepRun], samples: int, seed: int) -> dict[str, Any]:
    """One setting's statistics: the ``labels`` and ``counts`` (nets) of its runs, and per
    :data:`SWEEP_ROWS` entry its ``label``, tau-b per run (seed) with its bootstrap interval
    (``runs``) and ``pooled`` over the runs (:func:`pooled_over_seeds`)."""
    return {"labels": [run.label for run in runs],
            "counts": [len(run.records) for run in runs],
            "rows": [{"label": row.label,
                      "runs": [tau_interval(*_pairs(run, row), samples, seed).as_dict()
                               for run in runs],
                      "pooled": pooled_over_seeds(runs, row, samples, seed)}
                     for row in SWEEP_ROWS]}


def rho_sweep(groups: Mapping[float, Sequence[SweepRun]], samples: int, seed: int
              ) -> dict[str, Any]:
    """Per radius (``rhos``, sorted): the tau-b of every sweep row pooled over the seeds
    (``rows``, a ``label`` and ``cells``), and Auto-PGD as a percentage of the maximum, its
    spread over the nets of every seed (``percent``, per measure a ``name`` and ``cells``)."""
    rhos = sorted(groups)
    rows = [{"label": row.label,
             "cells": [pooled_over_seeds(groups[rho], row, samples, seed) for rho in rhos]}
            for row in SWEEP_ROWS]
    percent = [{"name": name,
                "cells": [spread([100.0 * r["sharpness"][name] / r["sharpness"][key]
                                  for run in groups[rho] for r in run.records])
                          for rho in rhos]}
               for name, key in MAXIMUM_OF.items()]
    return {"rhos": rhos, "rows": rows, "percent": percent}


#: Radii of the rho sweep, and the number of data draws per setting.
FULL_RHOS = (0.03, 0.1, 0.3)
FULL_DATA_SEEDS = 3


@dataclass(frozen=True)
class Configuration:
    """One run of ``--full``: its subfolder (``""``: the results folder itself), the setting it
    belongs to, its label in that setting's tables, and its settings."""

    folder: str
    group: str
    label: str
    settings: DiagonalSettings


def full_configurations(settings: DiagonalSettings, rhos: Sequence[float] = FULL_RHOS,
                        data_seeds: int = FULL_DATA_SEEDS,
                        per_net_seeds: int | None = None) -> list[Configuration]:
    """The runs of ``--full``: the first is ``settings`` itself (the default study); the
    training-set-per-net variant runs on the first ``per_net_seeds`` seeds (default all,
    ``0`` for none)."""
    if settings.rho not in rhos:
        raise ValueError(f"rhos must contain the study's rho {settings.rho}, got {tuple(rhos)}")
    if isinstance(data_seeds, bool) or not isinstance(data_seeds, int) or data_seeds < 1:
        raise ValueError(f"data_seeds must be an integer >= 1, got {data_seeds!r}")
    first = settings.problem_seed
    seeds = [first + k for k in range(data_seeds)]

    def variant(ds: int, **changes) -> DiagonalSettings:
        # each seed draws its own hyperparameters as well as its own data: seeds that shared
        # the draws would be pseudo-replicates of one design
        shift = ds - first
        return replace(settings, seed=settings.seed + shift,
                       data_seed=None if settings.data_seed is None else ds, **changes)

    runs = [Configuration("", f"rho = {settings.rho:g}", f"seed {first}", settings)]
    for rho in rhos:
        for ds in seeds:
            if rho == settings.rho and ds == first:
                continue
            runs.append(Configuration(f"full/rho{rho:g}-seed{ds}", f"rho = {rho:g}",
                                      f"seed {ds}", variant(ds, rho=rho)))
    count = data_seeds if per_net_seeds is None else per_net_seeds
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= data_seeds:
        raise ValueError(f"per_net_seeds must be an integer from 0 to data_seeds={data_seeds}, "
                         f"got {per_net_seeds!r}")
    for ds in seeds[:count]:
        runs.append(Configuration(f"full/per_net-seed{ds}", "per_net", f"seed {ds}",
                                  variant(ds, training_sets="per_net")))
    return runs


def run_full(settings: DiagonalSettings, out: Path, *, resume: bool = False,
             progress: bool | None = None, plots: bool = True, docs: Path | None = None,
             threads: int | None = 1, rhos: Sequence[float] = FULL_RHOS,
             data_seeds: int = FULL_DATA_SEEDS, per_net_seeds: int | None = None
             ) -> tuple[StudyResult, dict[str, StudyResult]]:
    """Run every configuration of :func:`full_configurations` and write the full page data;
    the default study's result (its ``page`` the full page data) and the others' by folder."""
    if docs is not None:
        check_renderer(docs)
    configurations = full_configurations(settings, rhos, data_seeds, per_net_seeds)
    results: dict[str, StudyResult] = {}
    for configuration in configurations:
        folder = Path(out) / configuration.folder if configuration.folder else Path(out)
        results[configuration.folder] = diagonal_study(
            configuration.settings, folder, resume=resume, progress=progress,
            plots=plots and not configuration.folder, docs=None, threads=threads)
    groups: dict[str, list[SweepRun]] = {}
    for configuration in configurations:
        result = results[configuration.folder]
        counted = [r for r in result.records if r["model"] in set(result.counted)]
        groups.setdefault(configuration.group, []).append(SweepRun(configuration.label, counted))
    samples, seed = settings.bootstrap, derived_seed(settings.seed, "bootstrap")
    full = full_statistics(groups, settings.rho, rhos, samples, seed)
    base = results[""]
    wall = sum(result.wall_seconds for result in results.values())
    options = ("" if tuple(rhos) == FULL_RHOS
               else f" --rhos {','.join(f'{r:g}' for r in rhos)}")
    options += ("" if per_net_seeds is None or per_net_seeds == data_seeds
                else f" --per-net-seeds {per_net_seeds}")
    command = _canonical_command(settings, full=True).replace(
        "reproduce diagonal --full", f"reproduce diagonal --full{options}", 1)
    base.page = page_document(STUDY, page_data(
        settings, base, base.records, wall, int(resume), threads or torch.get_num_threads(),
        full=full, runs=len(results), command=command))
    write_json_atomic(Path(out) / PAGE_FILE, base.page)
    if docs is not None:
        pooled = {"shared": full["ball"], **({"per_net": full["per_net_pooled"]}
                                             if "per_net_pooled" in full else {})}
        write_headline(Path(docs), STUDY, headline_rows(
            pooled, {key: len(runs) for key, runs in groups.items()}, settings.rho))
        write_page(Path(docs), base.page)
    return base, {k: v for k, v in results.items() if k}


def full_statistics(groups: Mapping[str, Sequence[SweepRun]], rho: float,
                    rhos: Sequence[float], samples: int, seed: int) -> dict[str, Any]:
    """The statistics of the ``--full`` part of the page, from the runs (one per seed) of
    each group, ``"rho = R"`` per radius of ``rhos`` and ``"per_net"``: ``groups``, the titled
    :func:`seed_table` of the shared training set at the study's ``rho`` and of a training
    set per net (when run); ``ball`` and ``per_net_pooled``, sweep row label -> tau-b pooled
    over their seeds; ``rho``, the :func:`rho_sweep`.
    """
    study_rho = f"rho = {rho:g}"
    titled = [(f"Seeds, {study_rho.replace('rho', 'ρ')}, the training set shared by the nets "
               "(the paper's protocol)", study_rho)]
    if "per_net" in groups:
        titled.append((f"A training set per net ({study_rho.replace('rho', 'ρ')}): each net "
                       "trains and is measured on its own 100 inputs", "per_net"))
    tables = {key: seed_table(groups[key], samples, seed) for _, key in titled}
    full: dict[str, Any] = {
        "groups": [{"title": title, **tables[key]} for title, key in titled],
        "ball": {row["label"]: row["pooled"] for row in tables[study_rho]["rows"]},
        "rho": rho_sweep({r: groups[f"rho = {r:g}"] for r in rhos}, samples, seed)}
    if "per_net" in tables:
        full["per_net_pooled"] = {row["label"]: row["pooled"]
                                  for row in tables["per_net"]["rows"]}
    return full


def headline_rows(pooled: dict[str, dict[str, dict[str, Any]]], seeds: dict[str, int],
                  rho: float) -> list[dict[str, Any]]:
    """The study's rows of ``docs/results/data/diagonal.json``
    (:func:`~quotientsharp.reproduce.headline.write_headline`), pooled over the seeds.

    Parameters
    ----------
    pooled
        ``"shared"`` and ``"per_net"`` -> sweep row label -> pooled tau.
    seeds
        Seeds per group of runs (``"rho = 0.1"``, ``"per_net"``).
    rho
        The study's radius.
    """
    shared = f"{seeds[f'rho = {rho:g}']} seeds, ρ = {rho:g}"
    own = f"{seeds.get('per_net', 0)} seed(s), ρ = {rho:g}"
    settings = (
        ("shared", f"diagonal nets, Auto-PGD, {shared}", " (Auto-PGD)"),
        ("shared", f"diagonal nets, exact or strong maximum, {shared}", None),
        ("per_net", f"diagonal nets, a training set per net, Auto-PGD, {own}", " (Auto-PGD)"),
    )
    # the headline's measure -> the study's measure
    names = {"adaptive": "adaptive", "geodesic_inv": "geodesic_inv_exact",
             "geodesic_mix": "geodesic_mix_exact",
             "geodesic_mix_rateball": "geodesic_mix_exact_rateball"}
    papers = {spec.name: spec.paper for spec in MEASURES}
    notes = {"geodesic_mix": "the mix metric's own ball",
             "geodesic_mix_rateball": "rate ball ||b|| <= rho/sqrt(2)"}
    rows = []
    for group, setting, suffix in settings:
        if group not in pooled:
            continue
        labels = [(measure, _maximum_label(name) if suffix is None else name + suffix,
                   papers[name], notes.get(measure, "")) for measure, name in names.items()]
        if suffix is not None:
            labels.append(("confound: init_scale", "confound: init_scale", None, ""))
        for measure, label, paper, note in labels:
            if label not in pooled[group]:
                raise KeyError(f"no sweep row {label!r}; rows: {sorted(pooled[group])}")
            tau = pooled[group][label]
            rows.append({"setting": setting, "measure": measure, "tau": tau["tau_b"],
                         "low": tau["b_low"], "high": tau["b_high"], "paper": paper,
                         "note": note})
    return rows
