"""``quotientsharp reproduce diagonal``: sharpness against generalisation on diagonal networks.

The paper's Sec. 5.1 (tau = -0.68 adaptive, -0.83 geodesic inv, -0.86 geodesic mix): 50 diagonal
nets ``y = x^T (u * v)`` fit one noiseless sparse regression, each with its own drawn
initialisation scale, learning rate and batch size; the Kendall tau of the test loss against
each measure, with a bootstrap interval, next to the exact maximum of mix exact and a strong
reference ascent (``docs/results/diagonal.md`` gives the protocol). Outputs in ``--out``
(default ``results/diagonal``; ``--resume`` continues): ``run.json``, ``trained.jsonl``,
``models.jsonl``, ``models.csv``, ``scatter_<measure>.png`` and ``page.json``. ``--full`` adds 3
data seeds at rho 0.03, 0.1 and 0.3 and a training set per net; ``--quick``: 12 nets, 10 ascent
steps. Under torchrun the nets train on rank 0 and the measures are dealt over the ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quotientsharp.reproduce.config import DiagonalConfig, check_config, run_study_command
from quotientsharp.reproduce.diagonal.full import FULL_RHOS, run_full
from quotientsharp.reproduce.diagonal.report import StudyResult, default_out, tau_lines
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.reproduce.diagonal.study import diagonal_study

HELP = ("diagonal networks (paper Sec. 5.1): 50 nets trained and measured batched, Kendall tau "
        "of test loss against adaptive and geodesic sharpness")
#: What the taus rank sharpness against (the console's sign convention).
GENERALISATION = "test loss"


def settings_from_config(config: DiagonalConfig) -> DiagonalSettings:
    """The study's settings: the full or quick variant, with the config's seed and nets."""
    overrides: dict[str, Any] = {"seed": config.seed}
    if config.nets is not None:
        overrides["nets"] = config.nets
    return DiagonalSettings.quick(**overrides) if config.quick else DiagonalSettings(**overrides)


def _run_settings(settings: DiagonalSettings, out: Path, config: DiagonalConfig) -> StudyResult:
    """The default run (and with ``config.full`` the full sweep); the default run's result."""
    common: dict[str, Any] = {"resume": config.resume, "progress": config.progress,
                              "plots": config.plots, "docs": config.docs,
                              "threads": config.threads}
    if not config.full:
        return diagonal_study(settings, out, **common)
    result, _ = run_full(settings, out, rhos=FULL_RHOS if config.rhos is None else config.rhos,
                         per_net_seeds=config.per_net_seeds, **common)
    return result


def _print_result(result: StudyResult, settings: DiagonalSettings, docs: Path | None) -> None:
    """The console report of rank 0: the taus, the counted nets, what ran now."""
    print("\n".join(tau_lines(result)))
    print(f"\n{len(result.counted)}/{settings.nets} nets counted; not converged: "
          f"{result.unconverged or 'none'}; diverged: {result.diverged or 'none'}")
    print(f"trained now: {len(result.trained_now)}, measured now: {len(result.measured_now)}, "
          f"wall time {result.wall_seconds:.1f} s")
    print(f"results in {result.out}" + ("" if docs is None else
                                        f"; docs page in {docs}/results/diagonal.md"))


def run(config: DiagonalConfig) -> int:
    """Run ``quotientsharp reproduce diagonal`` as ``config`` says; the exit status."""
    check_config(config, DiagonalConfig, "diagonal")
    settings = settings_from_config(config)     # nets and seed were checked by the config
    out = config.out if config.out is not None else Path(default_out(settings))
    return run_study_command("diagonal", "nets", out,
                             lambda: _run_settings(settings, out, config),
                             lambda result: _print_result(result, settings, config.docs))
