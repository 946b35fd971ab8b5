"""``reproduce diagonal --full``: the study on other data seeds at every radius of
:data:`FULL_RHOS` and with a training set per net (in ``full/<name>/``), and their statistics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from quotientsharp.core.scalars import check_int
from quotientsharp.reproduce.diagonal.data import derived_seed
from quotientsharp.reproduce.diagonal.measures import MEASURES
from quotientsharp.reproduce.diagonal.report import (
    CONFOUNDS,
    MAXIMUM_OF,
    PAGE_FILE,
    STUDY,
    StudyResult,
    _canonical_command,
    page_data,
    spread,
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
    """One row of the sweep tables: a label and the key of the value it ranks, in the record's
    ``sharpness`` (in the record itself for a ``confound``)."""

    label: str
    key: str
    confound: bool = False

    def value(self, record: Record) -> float:
        return float(record[self.key] if self.confound else record["sharpness"][self.key])


def _maximum_label(name: str) -> str:
    """The sweep row of the maximum of measure ``name`` (:data:`MAXIMUM_OF`)."""
    return f"{name} ({'exact' if MAXIMUM_OF[name].startswith('exact') else 'strong'} maximum)"


#: The rows of the sweep tables: the measures, their maxima, the population loss, the
#: confounds.
SWEEP_ROWS: tuple[Row, ...] = (
    *(Row(f"{spec.name} (Auto-PGD)", spec.name) for spec in MEASURES if not spec.diagnostic),
    *(Row(_maximum_label(name), key) for name, key in MAXIMUM_OF.items()),
    *(Row(f"population: {name} (Auto-PGD)", f"population:{name}")
      for name in ("adaptive", "geodesic_inv_exact")),
    *(Row(f"population: {name} (exact maximum)", f"population_exact:{name}")
      for name in ("geodesic_mix_exact", "geodesic_mix_exact_rateball")),
    *(Row(f"confound: {name}", name, confound=True) for name in CONFOUNDS),
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
    """The mean tau-b over the runs (seeds) and its two-stage cluster bootstrap interval."""
    xs, ys, clusters = [], [], []
    for index, run in enumerate(runs):
        x, y = _pairs(run, row)
        xs += x
        ys += y
        clusters += [index] * len(x)
    tau, low, high = cluster_bootstrap_tau(xs, ys, clusters, samples, seed)
    return {"tau_b": tau, "b_low": low, "b_high": high}


def seed_table(runs: Sequence[SweepRun], samples: int, seed: int) -> dict[str, Any]:
    """One setting's statistics: its runs' labels and counts, and per :data:`SWEEP_ROWS` entry
    the tau-b of each run and pooled over them."""
    return {"labels": [run.label for run in runs],
            "counts": [len(run.records) for run in runs],
            "rows": [{"label": row.label,
                      "runs": [tau_interval(*_pairs(run, row), samples, seed).as_dict()
                               for run in runs],
                      "pooled": pooled_over_seeds(runs, row, samples, seed)}
                     for row in SWEEP_ROWS]}


def rho_sweep(groups: Mapping[float, Sequence[SweepRun]], samples: int, seed: int
              ) -> dict[str, Any]:
    """Per radius: the tau-b of every sweep row pooled over the seeds, and the spread of
    Auto-PGD as a percentage of the maximum."""
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
    """The runs of ``--full``, ``settings`` itself first; a training set per net on the first
    ``per_net_seeds`` seeds (default all)."""
    if settings.rho not in rhos:
        raise ValueError(f"rhos must contain the study's rho {settings.rho}, got {tuple(rhos)}")
    check_int("data_seeds", data_seeds, 1)
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
    """Run every configuration of :func:`full_configurations`, write the full page data; the
    default study's result and the others' by folder."""
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
    options = "" if tuple(rhos) == FULL_RHOS else f" --rhos {','.join(f'{r:g}' for r in rhos)}"
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
    """The ``--full`` part of the page from the runs of each group (``"rho = R"``,
    ``"per_net"``): the titled seed tables, the pooled taus and the :func:`rho_sweep`."""
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
    """The study's headline rows from ``pooled`` (``"shared"`` and ``"per_net"`` -> sweep row
    label -> pooled tau) and the seeds per group of runs."""
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
