"""``reproduce diagonal --full``: the study over data seeds, a rho sweep and a training set per net.

:func:`run_full` runs the default study (the paper's protocol, in the results folder itself) and
then, each in a subfolder ``full/<name>/`` of its own (with ``--resume`` like the default run):

- the same hyperparameter draws on other data draws (``data_seed``: ``beta*``, training and
  test inputs), at every radius of :data:`FULL_RHOS`;
- a training set per net (``training_sets="per_net"``) at the study's radius, on each data seed.

The page then gets, per setting, the taus with intervals per data seed and their mean over the
seeds (stratified bootstrap), and the rho sweep as one table with a column per radius.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from quotientsharp.reproduce.diagonal.data import derived_seed
from quotientsharp.reproduce.diagonal.page import SweepRun, rho_table, sweep_sections
from quotientsharp.reproduce.diagonal.report import SECTION_FILE, STUDY, StudyResult, study_section
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.study import run_study
from quotientsharp.reproduce.results_page import regenerate_results_page, write_section

__all__ = ["FULL_DATA_SEEDS", "FULL_RHOS", "Configuration", "full_configurations", "run_full"]

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
                        data_seeds: int = FULL_DATA_SEEDS) -> list[Configuration]:
    """The runs of ``--full``: the first is ``settings`` itself (the default study)."""
    if settings.rho not in rhos:
        raise ValueError(f"rhos must contain the study's rho {settings.rho}, got {tuple(rhos)}")
    if isinstance(data_seeds, bool) or not isinstance(data_seeds, int) or data_seeds < 1:
        raise ValueError(f"data_seeds must be an integer >= 1, got {data_seeds!r}")
    first = settings.problem_seed
    seeds = [first + k for k in range(data_seeds)]

    def variant(ds: int, **changes) -> DiagonalSettings:
        return replace(settings, data_seed=None if ds == first else ds, **changes)

    runs = [Configuration("", f"rho = {settings.rho:g}", f"data seed {first}", settings)]
    for rho in rhos:
        for ds in seeds:
            if rho == settings.rho and ds == first:
                continue
            runs.append(Configuration(f"full/rho{rho:g}-data{ds}", f"rho = {rho:g}",
                                      f"data seed {ds}", variant(ds, rho=rho)))
    for ds in seeds:
        runs.append(Configuration(f"full/per_net-data{ds}", "per_net", f"data seed {ds}",
                                  variant(ds, training_sets="per_net")))
    return runs


def run_full(settings: DiagonalSettings, out: Path, *, resume: bool = False,
             progress: bool | None = None, plots: bool = True, docs: Path | None = None,
             threads: int | None = 1, rhos: Sequence[float] = FULL_RHOS,
             data_seeds: int = FULL_DATA_SEEDS) -> tuple[StudyResult, dict[str, StudyResult]]:
    """Run every configuration of :func:`full_configurations` and write the full page.

    Returns
    -------
    tuple
        The default study's result (its ``markdown`` is the full page) and the results of the
        other runs by subfolder.
    """
    configurations = full_configurations(settings, rhos, data_seeds)
    results: dict[str, StudyResult] = {}
    for configuration in configurations:
        folder = Path(out) / configuration.folder if configuration.folder else Path(out)
        results[configuration.folder] = run_study(
            configuration.settings, folder, resume=resume, progress=progress,
            plots=plots and not configuration.folder, docs=None, threads=threads)
    groups: dict[str, list[SweepRun]] = {}
    for configuration in configurations:
        result = results[configuration.folder]
        counted = [r for r in result.records if r["model"] in set(result.counted)]
        groups.setdefault(configuration.group, []).append(
            SweepRun(configuration.label, configuration.settings, counted))
    samples, seed = settings.bootstrap, derived_seed(settings.seed, "bootstrap")
    study_rho = f"rho = {settings.rho:g}"
    lines = [
        "### Over data seeds, the rho sweep and a training set per net (`--full`)",
        "",
        f"Every run below keeps the hyperparameter draws of seed {settings.seed} and draws "
        "the data (β\\*, training and test inputs) from the data seed. 'Mean over seeds' is the "
        "mean of the per-seed taus, its interval a stratified bootstrap (the nets of each seed "
        "resampled within that seed). The maximum rows are the exact (mix exact) or strong "
        "(the others) maxima; the population rows measure the population loss "
        "||β − β\\*||²; the confound rows rank the test loss against a hyperparameter.",
        "",
    ]
    lines += sweep_sections({f"Data seeds, {study_rho.replace('rho', 'ρ')}, the training set "
                             "shared by the nets (the paper's protocol)": groups[study_rho]},
                            samples, seed)
    lines += sweep_sections({f"A training set per net ({study_rho.replace('rho', 'ρ')}): each "
                             "net trains and is measured on its own 100 inputs": groups["per_net"]},
                            samples, seed)
    lines += ["#### The rho sweep", "",
              "Mean over data seeds of Kendall τ-b [95 % CI], and Auto-PGD as a percentage of "
              "the maximum (min / median / max over the nets of every seed):", ""]
    lines += rho_table({rho: groups[f"rho = {rho:g}"] for rho in rhos}, samples, seed)
    lines.append("")
    base = results[""]
    wall = sum(result.wall_seconds for result in results.values())
    base.markdown = study_section(settings, base, base.records, wall, int(resume),
                                  threads or torch.get_num_threads(), full=lines,
                                  runs=len(results))
    (Path(out) / SECTION_FILE).write_text(base.markdown)
    if docs is not None:
        write_section(Path(docs), STUDY, base.markdown)
        regenerate_results_page(Path(docs))
    return base, {k: v for k, v in results.items() if k}
