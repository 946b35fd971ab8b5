"""``quotientsharp reproduce diagonal``: sharpness against generalisation on diagonal networks.

The paper's Sec. 5.1 (tau = -0.68 adaptive, -0.83 geodesic inv, -0.86 geodesic mix): 50 diagonal
nets ``y = x^T (u * v)`` from ``u_0 = a 1``, ``v_0 = 0`` fit one noiseless sparse regression
(``d = 200``, ``n = 100`` training and 5000 test inputs ``N(0, I_d)``, ``beta*`` 20-sparse with
``||beta*|| = 1``), each with its own initialisation scale, learning rate and batch size (drawn
once, seeded; our choices, fixed before looking at any correlation), trained together until the
training loss is below ``1e-5`` (nets that never get there are reported, not counted). The
Kendall tau of the test loss against each measure (adaptive; geodesic inv and mix with exact,
first- and second-order paths; rho 0.1, 20 Auto-PGD steps on 4 batches of 25) comes with a 95 %
bootstrap interval, next to the exact maximum of mix exact and a strong reference ascent.
``docs/results/diagonal.md`` describes the protocol in full.

Outputs in ``--out`` (default ``results/diagonal``): ``run.json``, ``trained.jsonl``,
``models.jsonl``, ``models.csv`` (written as nets finish; ``--resume`` continues, with identical
results), ``scatter_<measure>.png`` and ``page.json``; with ``--docs DIR`` the page
``DIR/results/diagonal.md`` rendered from it. ``--full`` adds 3 data seeds at rho 0.03, 0.1 and
0.3 and a training set per net (``OUT/full/<run>/``). ``--quick``: 12 nets, 10 ascent steps,
2000 test inputs, at most 40000 training steps. Under torchrun the nets train on rank 0 and the
measures are dealt over the ranks, with the values of one process bit for bit.
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
    """Run ``quotientsharp reproduce diagonal`` as ``config`` (a
    :class:`~quotientsharp.reproduce.config.DiagonalConfig`, else a ``TypeError``) says; the
    exit status of :func:`~quotientsharp.reproduce.config.run_study_command`."""
    check_config(config, DiagonalConfig, "diagonal")
    settings = settings_from_config(config)     # nets and seed were checked by the config
    out = config.out if config.out is not None else Path(default_out(settings))
    return run_study_command("diagonal", "nets", out,
                             lambda: _run_settings(settings, out, config),
                             lambda result: _print_result(result, settings, config.docs))
