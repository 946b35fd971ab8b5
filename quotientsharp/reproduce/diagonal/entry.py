"""``quotientsharp reproduce diagonal``: sharpness against generalisation on diagonal networks.

The study of the paper's Sec. 5.1: many diagonal networks ``y = x^T (u * v)`` fit the same
sparse regression problem with different hyperparameters; the Kendall rank correlation between
their test loss and each sharpness measure says which measure tracks generalisation. The paper
reports tau = -0.68 (adaptive), -0.83 (geodesic inv) and -0.86 (geodesic mix). It does not
state ``n``, ``rho``, or what varies across its 50 nets; the choices below are ours, fixed
before looking at any correlation (no tuning, no seed picking).

Problem (one draw, seeded, shared by every net)
    ``d = 200`` features, ``n = 100 < d`` training inputs and 5000 fresh test inputs, all
    ``N(0, I_d)``. Ground truth ``beta*`` is 90% sparse: 20 coordinates chosen at random carry
    ``N(0, 1)`` values, rescaled to ``||beta*||_2 = 1``. Targets are noiseless,
    ``y = X beta*``, so every net can interpolate.

Nets and training
    ``u_0 = a 1``, ``v_0 = 0`` (the ``u * v`` form of ``w_+^2 - w_-^2`` with equal initial
    weights, the standard setting of the implicit-bias literature: small ``a`` leads to
    sparse, large ``a`` to dense interpolants). Loss ``||X (u * v) - y||^2 / n`` on minibatches.
    Per net, drawn once from a seeded generator: the initialisation scale ``a`` log-uniform in
    ``[1e-3, 1]``, the learning rate log-uniform in ``[0.02, 0.2]``, the batch size uniform
    in ``{10, 20, 25, 50, 100}`` (100 = full batch). Each net partitions the training set into
    batches of its size in a random order of its own, reshuffled for each of 4 epochs, and this
    4-epoch schedule repeats. All nets train together as one ``[nets, d]`` tensor (one matrix
    product per step for all of them, per-net learning rates and batch masks); a net stops at
    the first check (every 50 steps) where its full training loss is below ``1e-5``, and is
    frozen from then on. Nets that have not reached ``1e-5`` after 100000 steps (or diverge)
    are reported and left out of the correlations.

Generalisation
    Test loss ``||X_test (u * v) - y_test||^2 / 5000`` (equal to the generalisation gap up to
    the training loss, which is below ``1e-5`` for every counted net).

Sharpness (the measures of ``docs/sharpness.md``, Auto-PGD ascent)
    On the training set, in 4 fixed batches of 25 (contiguous blocks of the i.i.d. inputs):
    Auto-PGD per batch, ``N = 20`` steps, ``eta_0 = 2 rho``, ``alpha = 0.75``, start
    ``xi = 0``, no restarts; the per-batch best loss minus the clean loss, averaged over the 4
    batches. Measures:

    - ``adaptive``: worst-case adaptive L2 sharpness on ``(u, v)``,
      ``||xi_u / |u| ||^2 + ||xi_v / |v| ||^2 <= rho^2`` (the paper's baseline);
    - ``geodesic_{inv,mix}_exact``: geodesic sharpness on the ``GL(1)^d`` quotient with the exact
      geodesics (``beta exp(2 b)`` for inv, ``beta (1 + 2 b)`` for mix, continued through
      ``beta_i = 0``: see :mod:`quotientsharp.reproduce.diagonal.batched_ascent`);
    - ``geodesic_{inv,mix}_order{1,2}``: the same with the first- and second-order paths
      (order 2 is the path of the paper's Alg. 1).

    The radius is ``rho = 0.1`` for every measure. It is comparable across them: a horizontal
    ``xi = (b u, b v)`` has the same norm ``sqrt(2) ||b||`` under the adaptive and the inv
    metric, so those balls share their horizontal part, and with ``||beta*|| = 1`` the mix ball
    ``sqrt(2) ||beta b|| <= rho`` moves ``beta`` by up to ``sqrt(2) rho`` in L2, while the inv
    ball moves it by up to ``sqrt(2) rho max_i |beta_i| <= sqrt(2) rho``, to first order.
    All measures of all nets run batched over ``[nets, batches]``
    (:func:`~quotientsharp.reproduce.diagonal.batched_ascent.batched_ascend`).

Outputs (``--out``, default ``results/diagonal``)
    ``run.json`` (settings, per-net hyperparameters, seeds, package versions, timings, taus),
    ``trained.jsonl`` (each net's final ``u``, ``v`` as soon as it stops), ``models.jsonl``
    and ``models.csv`` (per-net values, appended as nets are finished), one
    ``scatter_<measure>.png`` per measure, ``page.json`` (the page's data; with ``--docs DIR``
    also written to ``DIR/results/data/pages/diagonal.json``, the page ``DIR/results/diagonal.md``
    rendered from it and ``DIR/results.md`` regenerated). ``--resume`` skips every net already
    in ``models.jsonl`` and retrains none in
    ``trained.jsonl``; results are identical to an uninterrupted run.

Beside each Auto-PGD value (``diagonal_exact``): the exact maximum of mix exact (the
trust-region subproblem), a strong reference ascent for adaptive, inv exact and mix exact (4
runs of 400 steps: from ``xi = 0``, for adaptive and inv from the maximiser of the loss's
quadratic model and its negative, the rest from random points), the value of mix exact at
interpolation ``2 rho^2 lambda_max``, and the measures of the population loss
``||beta - beta*||^2``. The page reports every tau with a 95 %
bootstrap interval, Auto-PGD as a percentage of the maximum, the confound taus of the
hyperparameters, and the mix order-1/2 rows as diagnostics (``diagonal.analysis``; the
page is rendered from the page data by ``docs/_hooks/results_pages/diagonal.py``).

``--full``: the default run, then the same hyperparameters on 3 data seeds at rho 0.03, 0.1 and
0.3, and with a training set per net, each in ``OUT/full/<run>/``; the page gets the taus per
data seed, their mean over seeds with intervals, and the rho sweep (``diagonal_full``).

``--quick``: 12 nets, 10 ascent steps, 2000 test inputs, at most 40000 training steps, a
100-step reference ascent with 2 restarts, 300 bootstrap resamples.

Under torchrun (``torchrun --nproc_per_node N -m quotientsharp reproduce diagonal``) the nets
train on rank 0 (one batch, as in one process), the measures are dealt over the ranks and rank 0
writes every file; the values are those of one process, bit for bit (:func:`diagonal_study`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from quotientsharp.reproduce.command import run_study_command
from quotientsharp.reproduce.config import DiagonalConfig, check_config
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
    return (DiagonalSettings.quick(**overrides) if config.quick
            else replace(DiagonalSettings(), **overrides))


def _run_settings(settings: DiagonalSettings, out: Path, config: DiagonalConfig) -> StudyResult:
    """The default run, or with ``config.full`` the full sweep too; the default run's result."""
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
    """Run ``quotientsharp reproduce diagonal`` as ``config`` says; the exit status.

    Returns
    -------
    int
        0 done; 2 for a setting refused when the study runs (e.g. ``rhos`` without the
        study's 0.1, another run's ``--resume`` settings) or an unusable results folder, the
        reason printed to stderr; 130 when interrupted (the finished nets are kept).

    Raises
    ------
    TypeError
        ``config`` is not a :class:`~quotientsharp.reproduce.config.DiagonalConfig` (what can
        be checked early is checked when the configuration is made).
    """
    check_config(config, DiagonalConfig, "diagonal")
    settings = settings_from_config(config)     # nets and seed were checked by the config
    out = config.out if config.out is not None else Path(default_out(settings))
    return run_study_command("diagonal", "nets", out,
                             lambda: _run_settings(settings, out, config),
                             lambda result: _print_result(result, settings, config.docs))
