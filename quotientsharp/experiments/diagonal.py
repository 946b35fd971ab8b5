"""``quotientsharp reproduce diagonal``: sharpness against generalisation on diagonal networks.

The study of the paper's Sec. 5.1 (SPEC section 7): many diagonal networks
``y = x^T (u * v)`` fit the same sparse regression problem with different hyperparameters; the
Kendall rank correlation between their test loss and each sharpness measure says which measure
tracks generalisation. The paper reports tau = -0.68 (adaptive), -0.83 (geodesic inv) and
-0.86 (geodesic mix). It does not state ``n``, ``rho``, or what varies across its 50 nets; the
choices below are ours, fixed before looking at any correlation (no tuning, no seed picking).

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

Sharpness (SPEC sections 5-6)
    On the training set, in 4 fixed batches of 25 (contiguous blocks of the i.i.d. inputs):
    Auto-PGD per batch, ``N = 20`` steps, ``eta_0 = 2 rho``, ``alpha = 0.75``, start
    ``xi = 0``, no restarts; the per-batch best loss minus the clean loss, averaged over the 4
    batches. Measures:

    - ``adaptive``: worst-case adaptive L2 sharpness on ``(u, v)``,
      ``||xi_u / |u| ||^2 + ||xi_v / |v| ||^2 <= rho^2`` (the paper's baseline);
    - ``geodesic_{inv,mix}_exact``: geodesic sharpness on the ``GL(1)^d`` quotient with the exact
      geodesics (``beta exp(2 b)`` for inv, ``beta (1 + 2 b)`` for mix, continued through
      ``beta_i = 0``: see :mod:`quotientsharp.experiments.batched_ascent`);
    - ``geodesic_{inv,mix}_order{1,2}``: the same with the first- and second-order paths
      (order 2 is the path of the paper's Alg. 1).

    The radius is ``rho = 0.1`` for every measure. It is comparable across them: a horizontal
    ``xi = (b u, b v)`` has the same norm ``sqrt(2) ||b||`` under the adaptive and the inv
    metric, so those balls share their horizontal part, and with ``||beta*|| = 1`` the mix ball
    ``sqrt(2) ||beta b|| <= rho`` moves ``beta`` by up to ``sqrt(2) rho`` in L2, while the inv
    ball moves it by up to ``sqrt(2) rho max_i |beta_i| <= sqrt(2) rho``, to first order.
    All measures of all nets run batched over ``[nets, batches]``
    (:func:`~quotientsharp.experiments.batched_ascent.batched_ascend`).

Outputs (``--out``, default ``results/diagonal``)
    ``run.json`` (settings, per-net hyperparameters, seeds, package versions, timings, taus),
    ``trained.jsonl`` (each net's final ``u``, ``v`` as soon as it stops), ``models.jsonl``
    and ``models.csv`` (per-net values, appended as nets are finished), one
    ``scatter_<measure>.png`` per measure, ``diagonal.md`` (the docs section; with
    ``--docs DIR`` also written to ``DIR/results/diagonal.md`` and ``DIR/results.md``
    regenerated). ``--resume`` skips every net already in ``models.jsonl`` and retrains none in
    ``trained.jsonl``; results are identical to an uninterrupted run.

``--quick``: 12 nets, 10 ascent steps, 2000 test inputs, at most 40000 training steps.

Under torchrun (``torchrun --nproc_per_node N -m quotientsharp reproduce diagonal``) the nets
train on rank 0 (one batch, as in one process), the measures are dealt over the ranks and rank 0
writes every file; the values are those of one process, bit for bit (:func:`run_study`).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..sharpness.solver import AscentSettings, checkpoints
from .batched_ascent import (
    PATH_NAMES,
    AdaptiveGeometry,
    DiagonalHorizontalGeometry,
    batched_ascend,
    mse_objective,
)
from .common import (
    ResultsDirectory,
    TauRow,
    is_main_rank,
    kendall_tau_a,
    kendall_tau_b,
    progress_bar,
    regenerate_results_page,
    scatter_plots,
    tau_table,
    write_section,
)

STUDY = "diagonal"
HELP = ("diagonal networks (paper Sec. 5.1): 50 nets trained and measured batched, Kendall tau "
        "of test loss against adaptive and geodesic sharpness")

__all__ = [
    "HELP",
    "MEASURES",
    "DiagonalProblem",
    "DiagonalSettings",
    "Hyperparameters",
    "MeasureSpec",
    "StudyResult",
    "TrainedNet",
    "add_arguments",
    "draw_hyperparameters",
    "make_problem",
    "measure_nets",
    "run",
    "run_study",
    "compute_test_losses",
    "train_nets",
]


@dataclass(frozen=True)
class MeasureSpec:
    """One sharpness measure of the study: ``kind`` ``"adaptive"`` or ``"geodesic"``."""

    name: str
    kind: str
    metric: str | None = None
    order: int | str = 1
    paper: float | None = None
    note: str = ""


MEASURES: tuple[MeasureSpec, ...] = (
    MeasureSpec("adaptive", "adaptive", paper=-0.68,
                note="worst-case adaptive L2 on (u, v), the paper's baseline"),
    MeasureSpec("geodesic_inv_exact", "geodesic", "inv", "exact", -0.83,
                "exact geodesic, beta exp(2b)"),
    MeasureSpec("geodesic_mix_exact", "geodesic", "mix", "exact", -0.86,
                "exact geodesic, beta (1 + 2b)"),
    MeasureSpec("geodesic_inv_order1", "geodesic", "inv", 1, note="first-order path"),
    MeasureSpec("geodesic_inv_order2", "geodesic", "inv", 2,
                note="second-order path (paper's Alg. 1)"),
    MeasureSpec("geodesic_mix_order1", "geodesic", "mix", 1, note="first-order path"),
    MeasureSpec("geodesic_mix_order2", "geodesic", "mix", 2,
                note="second-order path (paper's Alg. 1)"),
)
_MEASURE_NAMES = tuple(m.name for m in MEASURES)


def _positive_range(name: str, value: Sequence[float]) -> tuple[float, float]:
    low, high = (float(x) for x in value)
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"{name} must be a range 0 < low <= high, got {tuple(value)}")
    return low, high


@dataclass(frozen=True)
class DiagonalSettings:
    """Everything that determines the study's numbers (see the module docstring).

    Attributes
    ----------
    nets, d, n_train, n_test, support
        Number of nets, input dimension, training and test set sizes, nonzeros of ``beta*``.
    init_scale, learning_rate
        Log-uniform ranges of the per-net initialisation scale ``a`` and learning rate.
    batch_sizes
        Per-net batch size, uniform over these (each must divide ``n_train``).
    target_loss, max_steps, check_every, schedule_epochs
        Stopping rule (full training loss below ``target_loss``, checked every ``check_every``
        steps, at most ``max_steps``) and length of the repeating minibatch schedule.
    rho, n_iter, sharpness_batch_size
        Radius of every measure, Auto-PGD steps, size of the training batches of the measure.
    seed
        Seeds every random draw (data, hyperparameters, schedules).
    variant
        ``"full"`` or ``"quick"`` (only recorded).
    """

    nets: int = 50
    d: int = 200
    n_train: int = 100
    n_test: int = 5000
    support: int = 20
    init_scale: tuple[float, float] = (1e-3, 1.0)
    learning_rate: tuple[float, float] = (0.02, 0.2)
    batch_sizes: tuple[int, ...] = (10, 20, 25, 50, 100)
    target_loss: float = 1e-5
    max_steps: int = 100_000
    check_every: int = 50
    schedule_epochs: int = 4
    rho: float = 0.1
    n_iter: int = 20
    sharpness_batch_size: int = 25
    seed: int = 0
    variant: str = "full"

    def __post_init__(self) -> None:
        for name in ("nets", "d", "n_train", "n_test", "support", "max_steps", "check_every",
                     "schedule_epochs", "n_iter", "sharpness_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.nets < 2:
            raise ValueError(f"nets must be at least 2 (a rank correlation needs pairs), got "
                             f"{self.nets}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.support >= self.d:
            raise ValueError(f"support must be smaller than d={self.d}, got {self.support}")
        object.__setattr__(self, "init_scale", _positive_range("init_scale", self.init_scale))
        object.__setattr__(self, "learning_rate",
                           _positive_range("learning_rate", self.learning_rate))
        sizes = tuple(int(b) for b in self.batch_sizes)
        if not sizes or any(b < 1 or self.n_train % b for b in sizes):
            raise ValueError(f"batch_sizes must be positive divisors of n_train={self.n_train}, "
                             f"got {self.batch_sizes}")
        object.__setattr__(self, "batch_sizes", sizes)
        if self.n_train % self.sharpness_batch_size:
            raise ValueError(f"sharpness_batch_size must divide n_train={self.n_train}, got "
                             f"{self.sharpness_batch_size}")
        for name in ("target_loss", "rho"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")

    @classmethod
    def quick(cls, **overrides: Any) -> DiagonalSettings:
        """The reduced variant of ``--quick``."""
        base = dict(nets=12, n_iter=10, n_test=2000, max_steps=40_000, variant="quick")
        return cls(**{**base, **overrides})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ascent(self) -> AscentSettings:
        return AscentSettings(n_iter=self.n_iter)


# ---------------------------------------------------------------------------- random draws
def _derived_seed(seed: int, tag: str) -> int:
    """An independent 63-bit seed per purpose, so one stream never shifts another."""
    digest = hashlib.sha256(f"quotientsharp-diagonal:{seed}:{tag}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _generator(seed: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(_derived_seed(seed, tag))


@dataclass
class DiagonalProblem:
    """The shared regression problem: ``x_train`` ``shape=[n, d]``, ``beta_star`` ``shape=[d]``,
    ``x_test`` ``shape=[n_test, d]``, noiseless targets, float64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    beta_star: torch.Tensor
    support: list[int]


def make_problem(settings: DiagonalSettings) -> DiagonalProblem:
    """Draw the training and test inputs and the sparse ground truth."""
    dtype = torch.float64
    data = _generator(settings.seed, "data")
    x_train = torch.randn(settings.n_train, settings.d, generator=data, dtype=dtype)
    support = torch.randperm(settings.d, generator=data)[:settings.support].sort().values
    beta_star = torch.zeros(settings.d, dtype=dtype)
    beta_star[support] = torch.randn(settings.support, generator=data, dtype=dtype)
    beta_star = beta_star / beta_star.norm()
    x_test = torch.randn(settings.n_test, settings.d, generator=_generator(settings.seed, "test"),
                         dtype=dtype)
    return DiagonalProblem(x_train, x_train @ beta_star, x_test, x_test @ beta_star, beta_star,
                           support.tolist())


@dataclass(frozen=True)
class Hyperparameters:
    """One net's draw."""

    model: int
    init_scale: float
    learning_rate: float
    batch_size: int
    schedule_seed: int


def draw_hyperparameters(settings: DiagonalSettings) -> list[Hyperparameters]:
    """Per-net initialisation scale, learning rate, batch size and schedule seed."""
    gen = _generator(settings.seed, "hyperparameters")
    nets = settings.nets

    def log_uniform(low: float, high: float) -> list[float]:
        unit = torch.rand(nets, generator=gen, dtype=torch.float64)
        return torch.exp(math.log(low) + unit * (math.log(high) - math.log(low))).tolist()

    scales = log_uniform(*settings.init_scale)
    rates = log_uniform(*settings.learning_rate)
    picks = torch.randint(len(settings.batch_sizes), (nets,), generator=gen).tolist()
    return [Hyperparameters(i, scales[i], rates[i], settings.batch_sizes[picks[i]],
                            _derived_seed(settings.seed, f"schedule:{i}")) for i in range(nets)]


def _schedule(hyper: Sequence[Hyperparameters], settings: DiagonalSettings
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-net minibatch weights ``shape=[nets, L, n]`` (``1/B`` on the batch, 0 elsewhere)
    and period ``shape=[nets]``: ``schedule_epochs`` reshuffled epochs per net."""
    n = settings.n_train
    longest = settings.schedule_epochs * n // min(h.batch_size for h in hyper)
    table = torch.zeros(len(hyper), longest, n, dtype=torch.float64)
    period = torch.zeros(len(hyper), dtype=torch.long)
    for row, h in enumerate(hyper):
        gen = torch.Generator().manual_seed(h.schedule_seed)
        per_epoch = n // h.batch_size
        for epoch in range(settings.schedule_epochs):
            order = torch.randperm(n, generator=gen)
            for j in range(per_epoch):
                chunk = order[j * h.batch_size:(j + 1) * h.batch_size]
                table[row, epoch * per_epoch + j, chunk] = 1.0 / h.batch_size
        period[row] = settings.schedule_epochs * per_epoch
    return table, period


# ---------------------------------------------------------------------------- training
@dataclass
class TrainedNet:
    """A net at the step it stopped: ``u``, ``v`` as float lists (exact in JSON)."""

    model: int
    steps: int
    train_loss: float
    converged: bool
    diverged: bool
    u: list[float]
    v: list[float]

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrainedNet:
        return cls(int(record["model"]), int(record["steps"]), float(record["train_loss"]),
                   bool(record["converged"]), bool(record["diverged"]),
                   [float(x) for x in record["u"]], [float(x) for x in record["v"]])


#: A training loss above this (or not finite) counts as divergence.
DIVERGENCE_LOSS = 1e6


def train_nets(problem: DiagonalProblem, hyper: Sequence[Hyperparameters],
               settings: DiagonalSettings, finished: dict[int, TrainedNet] | None = None,
               on_trained: Callable[[TrainedNet], None] | None = None,
               progress: bool | None = False) -> dict[int, TrainedNet]:
    """Train every net not in ``finished``, all together (leading dimension = all nets).

    Nets in ``finished`` sit in the batch frozen at their saved values, so every other net's
    rows go through exactly the same matrix products as in an uninterrupted run (a product's
    rounding depends on its shapes, not on the other rows' values). ``on_trained`` is called
    with each net as soon as it stops.

    Returns
    -------
    dict
        Model index -> :class:`TrainedNet`, for the nets trained here.
    """
    finished = finished or {}
    nets, dtype = len(hyper), torch.float64
    x, y = problem.x_train, problem.y_train
    x_t = x.T.contiguous()
    scale = torch.tensor([h.init_scale for h in hyper], dtype=dtype)
    rate = torch.tensor([h.learning_rate for h in hyper], dtype=dtype).unsqueeze(-1)
    u = scale.unsqueeze(-1).expand(nets, settings.d).clone()
    v = torch.zeros(nets, settings.d, dtype=dtype)
    active = torch.ones(nets, dtype=torch.bool)
    for index, net in finished.items():
        u[index] = torch.tensor(net.u, dtype=dtype)
        v[index] = torch.tensor(net.v, dtype=dtype)
        active[index] = False
    table, period = _schedule(hyper, settings)
    rows = torch.arange(nets)
    negative_y = y.neg().expand(nets, -1)
    done: dict[int, TrainedNet] = {}
    remaining = int(active.sum())
    bar = progress_bar(settings.max_steps, "training nets", progress if remaining else False,
                       unit="step")
    try:
        for step in range(settings.max_steps + 1):
            residual = torch.addmm(negative_y, u * v, x_t)               # [nets, n]
            if step % settings.check_every == 0 or step == settings.max_steps:
                loss = residual.square().mean(-1)
                healthy = torch.isfinite(loss) & (loss < DIVERGENCE_LOSS)
                reached = active & (loss < settings.target_loss)
                failed = active & ~healthy
                stop = reached | failed
                if step == settings.max_steps:
                    stop = stop | active
                for index in stop.nonzero().flatten().tolist():
                    net = TrainedNet(index, step, float(loss[index]), bool(reached[index]),
                                     bool(failed[index]), u[index].tolist(), v[index].tolist())
                    done[index] = net
                    if on_trained is not None:
                        on_trained(net)
                active = active & ~stop
                remaining = int(active.sum())
                if step:
                    bar.update(settings.check_every)
                bar.set_postfix(stopped=f"{nets - remaining}/{nets}")
                if remaining == 0 or step == settings.max_steps:
                    break
            weights = table[rows, step % period]                          # [nets, n]
            gradient = (weights * residual) @ x                           # dL/dbeta / 2
            gradient = (2.0 * rate) * gradient
            mask = active.unsqueeze(-1)
            u, v = torch.where(mask, u - gradient * v, u), torch.where(mask, v - gradient * u, v)
    finally:
        bar.close()
    return done


def compute_test_losses(problem: DiagonalProblem, nets: Sequence[TrainedNet]) -> list[float]:
    """``||X_test (u * v) - y_test||^2 / n_test`` per net (one product per net)."""
    out = []
    for net in nets:
        beta = torch.tensor(net.u, dtype=torch.float64) * torch.tensor(net.v,
                                                                        dtype=torch.float64)
        out.append(float((problem.x_test @ beta - problem.y_test).square().mean()))
    return out


# ---------------------------------------------------------------------------- sharpness
def sharpness_batches(problem: DiagonalProblem, settings: DiagonalSettings
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The training set as ``K`` contiguous batches: ``shape=[K, B, d]`` and ``shape=[K, B]``."""
    size = settings.sharpness_batch_size
    count = settings.n_train // size
    return (problem.x_train.reshape(count, size, settings.d),
            problem.y_train.reshape(count, size))


def measure_nets(u: torch.Tensor, v: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor,
                 rho: float, ascent: AscentSettings, measures: Sequence[MeasureSpec] = MEASURES,
                 progress: bool | None = False) -> dict[str, torch.Tensor]:
    """Every measure for every net and batch at once.

    Parameters
    ----------
    u, v
        The nets, ``shape=[M, d]``.
    inputs, targets
        Batches, ``shape=[K, B, d]`` and ``shape=[K, B]``.

    Returns
    -------
    dict
        Measure name -> per-batch sharpness ``shape=[M, K]`` (best minus clean loss).
    """
    problem_shape = (u.shape[0], inputs.shape[0])
    base_u, base_v = u.unsqueeze(1), v.unsqueeze(1)
    total = len(measures) * ascent.evaluations_per_run
    out = {}
    bar = progress_bar(total, "measuring sharpness", progress, unit="eval")
    try:
        for spec in measures:
            if spec.kind == "adaptive":
                geometry = AdaptiveGeometry(base_u, base_v, rho, problem_shape)
            else:
                geometry = DiagonalHorizontalGeometry(base_u, base_v, spec.metric, spec.order,
                                                      rho, problem_shape)
            bar.set_postfix(measure=spec.name)
            outcome = batched_ascend(geometry, mse_objective(geometry, inputs, targets), ascent,
                                     bar.update)
            out[spec.name] = outcome.sharpness
    finally:
        bar.close()
    return out


# ---------------------------------------------------------------------------- the study
MODEL_FILE, TRAINED_FILE, CSV_FILE = "models.jsonl", "trained.jsonl", "models.csv"
SECTION_FILE = f"{STUDY}.md"
CSV_COLUMNS = ("model", "init_scale", "learning_rate", "batch_size", "steps", "train_loss",
               "converged", "diverged", "test_loss", *_MEASURE_NAMES)


@dataclass
class StudyResult:
    """What :func:`run_study` did and found."""

    records: list[dict[str, Any]]
    taus: dict[str, dict[str, float | None]]
    counted: list[int]
    unconverged: list[int]
    diverged: list[int]
    trained_now: list[int]
    measured_now: list[int]
    wall_seconds: float
    markdown: str
    table: str
    out: Path
    plots: list[Path] | None = field(default=None)


def _model_record(hyper: Hyperparameters, net: TrainedNet, test_loss: float,
                  per_batch: dict[str, list[float]] | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "model": hyper.model, "init_scale": hyper.init_scale,
        "learning_rate": hyper.learning_rate, "batch_size": hyper.batch_size,
        "schedule_seed": hyper.schedule_seed, "steps": net.steps, "train_loss": net.train_loss,
        "converged": net.converged, "diverged": net.diverged, "test_loss": test_loss,
        "beta_l1": float(sum(abs(a * b) for a, b in zip(net.u, net.v, strict=True))),
        "min_abs_beta": float(min(abs(a * b) for a, b in zip(net.u, net.v, strict=True))),
    }
    record["sharpness"] = ({k: sum(vals) / len(vals) for k, vals in per_batch.items()}
                           if per_batch is not None else None)
    record["sharpness_per_batch"] = per_batch
    return record


def _csv_row(record: dict[str, Any]) -> dict[str, Any]:
    row = {k: record.get(k) for k in CSV_COLUMNS if k not in _MEASURE_NAMES}
    for name in _MEASURE_NAMES:
        row[name] = (record["sharpness"] or {}).get(name, "")
    return row


def _canonical_command(settings: DiagonalSettings) -> str:
    parts = ["quotientsharp reproduce diagonal"]
    default = DiagonalSettings.quick() if settings.variant == "quick" else DiagonalSettings()
    if settings.variant == "quick":
        parts.append("--quick")
    if settings.seed != default.seed:
        parts.append(f"--seed {settings.seed}")
    if settings.nets != default.nets:
        parts.append(f"--nets {settings.nets}")
    return " ".join(parts)


def _default_out(settings: DiagonalSettings) -> str:
    return "results/diagonal-quick" if settings.variant == "quick" else "results/diagonal"


def _summary_stats(values: Sequence[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = (ordered[middle] if len(ordered) % 2
              else 0.5 * (ordered[middle - 1] + ordered[middle]))
    return ordered[0], median, ordered[-1]


def _section(settings: DiagonalSettings, result: StudyResult, records: list[dict[str, Any]],
             wall: float, resumed: int, threads: int, world_size: int = 1) -> str:
    counted = [r for r in records if r["model"] in result.counted]
    test = [r["test_loss"] for r in counted]
    lines = [
        "## Diagonal networks (paper Sec. 5.1)",
        "",
        f"Reproduce: `{_canonical_command(settings)}` (outputs in `{_default_out(settings)}/`; add "
        "`--docs docs` to rewrite this section and regenerate this page). "
        f"This run: {len(records)} nets, {len(counted)} counted, wall time {wall:.1f} s "
        f"({threads} torch thread(s)"
        + (f" per rank, {world_size} ranks under torchrun: training on rank 0, the measures "
           "dealt over the ranks" if world_size > 1 else "")
        + f"{', resumed' if resumed else ''}).",
        "",
        f"Setup (ours; the paper does not state n, rho or what varies): d = {settings.d}, "
        f"n = {settings.n_train} Gaussian training inputs, {settings.n_test} test inputs, "
        f"beta* with {settings.support} nonzero N(0, 1) entries rescaled to unit norm, "
        f"noiseless targets; u0 = a 1, v0 = 0; per net a ~ logU{list(settings.init_scale)}, "
        f"learning rate ~ logU{list(settings.learning_rate)}, batch size ~ "
        f"U{list(settings.batch_sizes)}; minibatch gradient descent to training loss "
        f"< {settings.target_loss:g} (at most {settings.max_steps} steps). Sharpness on the "
        f"training set in {settings.n_train // settings.sharpness_batch_size} batches of "
        f"{settings.sharpness_batch_size} (per batch, then averaged), rho = {settings.rho:g} "
        f"for every measure, Auto-PGD with N = {settings.n_iter}, "
        f"checkpoints {checkpoints(settings.n_iter)}. Generalisation: test loss. "
        f"Seed {settings.seed}.",
        "",
        "Kendall tau between test loss and sharpness (negative: sharper nets generalise "
        "better):",
        "",
        result.table,
        "",
        "The paper's geodesic numbers are placed on the exact-geodesic rows; its Alg. 1 uses "
        "the second-order path (order-2 rows).",
        "",
        "Spread of each measure over the counted nets:",
        "",
        "| measure | path | min | median | max |",
        "|---|---|---|---|---|",
    ]
    for spec in MEASURES:
        values = [r["sharpness"][spec.name] for r in counted]
        low, mid, high = _summary_stats(values) if values else (math.nan,) * 3
        path = ("(u + xi_u)(v + xi_v)" if spec.kind == "adaptive"
                else PATH_NAMES[(spec.metric, spec.order)])
        lines.append(f"| {spec.name} | {path} | {low:.3g} | {mid:.3g} | {high:.3g} |")
    lines += [
        "",
        "Facts that hold whatever the numbers, to read the table by:",
        "",
        "- From `xi = 0`, the adaptive ascent on `(u, v)` never leaves the horizontal space "
        "(its raised gradient `dL/dbeta' (1 + b) beta (u, v)` is horizontal at every iterate), "
        "so it coincides with the order-1 inv geodesic ascent: those two rows agree up to "
        "rounding (SPEC: order 1 under the GL(1) inv metric is adaptive sharpness).",
        "- The exact mix path `beta (1 + 2b)` is a straight line in `beta` with "
        "`||d beta|| <= sqrt(2) rho`: plain L2 worst-case sharpness of the linear model in "
        "`beta`. On data shared by all nets it is about `2 rho^2 lambda_max(X_B^T X_B / B)` "
        "plus a gradient term that vanishes at interpolation, so it barely varies between "
        "nets.",
        "- The mix ball allows rates `|b_i|` up to `rho / (sqrt(2) |beta_i|)`: the order-1 and "
        "order-2 mix values are dominated by the smallest `|beta_i|` and spread over many "
        "decades.",
    ]
    if test:
        low, mid, high = _summary_stats(test)
        lines += ["", f"Test loss over the counted nets: min {low:.3g}, median {mid:.3g}, "
                  f"max {high:.3g}."]
    if result.unconverged or result.diverged:
        missed = []
        if result.unconverged:
            missed.append(f"net(s) {result.unconverged} still above the target loss after "
                          f"{settings.max_steps} steps")
        if result.diverged:
            missed.append(f"net(s) {result.diverged} diverged")
        lines += ["", f"Not counted in the correlations: {'; '.join(missed)}."]
    else:
        lines += ["", "Every net reached the target training loss."]
    return "\n".join(lines) + "\n"


def run_study(settings: DiagonalSettings, out: Path, *, resume: bool = False,
              progress: bool | None = None, plots: bool = True, docs: Path | None = None,
              threads: int | None = 1,
              on_record: Callable[[str, int], None] | None = None) -> StudyResult:
    """Run (or resume) the study and write every output (see the module docstring).

    Parameters
    ----------
    settings
        :class:`DiagonalSettings`.
    out
        Results folder.
    resume
        Keep finished nets (settings must match ``run.json``).
    progress
        tqdm bars (``None``: on a terminal only).
    plots
        Write the scatter plots (needs matplotlib).
    docs
        A docs folder: write ``docs/results/diagonal.md`` and regenerate ``docs/results.md``.
    threads
        torch threads during the run (restored afterwards; ``None`` leaves them). The tensors
        are small: one thread was measured fastest on a shared 2-core machine.
    on_record
        Called with ``("trained" | "model", index)`` after each record is written (on rank 0).

    Under torchrun (an initialised process group of ``W > 1`` ranks) call it on every rank with
    the same arguments; every rank returns the same result, and the values equal those of one
    process bit for bit. How the work is split, and why there:

    - training runs on rank 0 alone, as one batched computation over every net still to train
      (exactly as in one process), and the trained nets are broadcast. It is not split over
      nets because each net's rounding depends on the shape of the batch it trains in (the
      matrix products take other code paths for other row counts: training the 12 quick nets
      in batches of 1 to 3 instead of 12 changes the last bits of ``u``, ``v`` and the final
      loss), and splitting while keeping the full batch shape would not shorten the training,
      whose length is set by the slowest net;
    - the measures are dealt over the ranks (:func:`~quotientsharp.distributed.shard` over
      :data:`MEASURES`): each rank calls :func:`measure_nets` for its measures on every net,
      so each measure runs on the same ``[nets, batches]`` problem as in one process, and the
      per-measure values are all-gathered;
    - rank 0 alone writes: ``run.json``, ``trained.jsonl`` (each net as it stops),
      ``models.jsonl`` and ``models.csv`` (once the nets are measured, as in one process),
      plots and sections. A finished record is on disk as soon as it is in one process, so an
      interrupted run resumes, under any number of ranks or none, exactly as an interrupted
      single-process run does.
    """
    from ..distributed import rank_and_world_size, run_on_rank0

    start = time.perf_counter()
    previous_threads = torch.get_num_threads()
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        torch.set_num_threads(threads)
    owned = [MODEL_FILE, TRAINED_FILE, CSV_FILE, SECTION_FILE,
             *[f"scatter_{name}.png" for name in _MEASURE_NAMES]]
    rank, _ = rank_and_world_size()
    directory = None
    try:
        # rank 0 alone opens (and on --resume checks) the folder; its errors reach every rank
        directory = run_on_rank0(lambda: ResultsDirectory(Path(out), STUDY, settings.as_dict(),
                                                          resume, owned), share=False)
        result = _run(settings, directory, progress if rank == 0 else False, plots, docs,
                      on_record, start)
    except BaseException as err:
        if directory is not None:
            directory.save_run_info(status="interrupted" if isinstance(err, KeyboardInterrupt)
                                    else f"failed: {type(err).__name__}: {err}")
        raise
    finally:
        torch.set_num_threads(previous_threads)
    return result


def _run(settings: DiagonalSettings, directory: ResultsDirectory | None,
         progress: bool | None, plots: bool, docs: Path | None,
         on_record: Callable[[str, int], None] | None, start: float) -> StudyResult:
    """The study; ``directory`` is rank 0's (``None`` on the other ranks under torchrun)."""
    from ..distributed import gather_indexed, rank_and_world_size, run_on_rank0, shard

    _, world_size = rank_and_world_size()
    problem = make_problem(settings)
    hyper = draw_hyperparameters(settings)

    def train() -> tuple[dict[int, dict[str, Any]], dict[int, TrainedNet], list[int], float]:
        directory.save_run_info(
            hyperparameters=[asdict(h) for h in hyper],
            seeds={"seed": settings.seed,
                   **{tag: _derived_seed(settings.seed, tag)
                      for tag in ("data", "test", "hyperparameters")}},
            beta_star_support=problem.support,
            measures=[asdict(m) for m in MEASURES])
        finished_records = {int(r["model"]): r for r in directory.records(MODEL_FILE)}
        trained = {int(r["model"]): TrainedNet.from_record(r)
                   for r in directory.records(TRAINED_FILE)}
        directory.write_csv(CSV_FILE, CSV_COLUMNS,
                            [_csv_row(finished_records[i]) for i in sorted(finished_records)])

        def saved(net: TrainedNet) -> None:
            directory.append(TRAINED_FILE, net.record())
            if on_record is not None:
                on_record("trained", net.model)

        to_train = [i for i in range(settings.nets)
                    if i not in finished_records and i not in trained]
        train_start = time.perf_counter()
        if to_train:
            frozen = {i: net for i, net in trained.items()}
            for i in finished_records:
                if i not in frozen:
                    raise ValueError(f"--resume: model {i} is in {MODEL_FILE} but not in "
                                     f"{TRAINED_FILE}; the folder is inconsistent, rerun "
                                     "without --resume")
            trained.update(train_nets(problem, hyper, settings, frozen, saved, progress))
        return finished_records, trained, to_train, time.perf_counter() - train_start

    finished_records, trained, to_train, train_seconds = run_on_rank0(train)

    to_measure = [i for i in range(settings.nets) if i not in finished_records]
    measure_start = time.perf_counter()
    healthy = [i for i in to_measure if not trained[i].diverged]
    per_batch: dict[int, dict[str, list[float]]] = {}
    if healthy:
        u = torch.tensor([trained[i].u for i in healthy], dtype=torch.float64)
        v = torch.tensor([trained[i].v for i in healthy], dtype=torch.float64)
        inputs, targets = sharpness_batches(problem, settings)
        if world_size == 1:
            values = measure_nets(u, v, inputs, targets, settings.rho, settings.ascent,
                                  progress=progress)
            rows = {name: values[name].tolist() for name in _MEASURE_NAMES}
        else:
            mine = shard(MEASURES)
            local: list[tuple[int, list[list[float]]]] = []
            if mine:
                values = measure_nets(u, v, inputs, targets, settings.rho, settings.ascent,
                                      measures=[spec for _, spec in mine], progress=progress)
                local = [(position, values[spec.name].tolist()) for position, spec in mine]
            rows = dict(zip(_MEASURE_NAMES, gather_indexed(local), strict=True))
        for row, i in enumerate(healthy):
            per_batch[i] = {name: rows[name][row] for name in _MEASURE_NAMES}
    measure_seconds = time.perf_counter() - measure_start

    def finish() -> StudyResult:
        return _finish(settings, directory, problem, hyper, trained, finished_records,
                       per_batch, to_train, to_measure, train_seconds, measure_seconds, plots,
                       docs, on_record, start, world_size)

    return run_on_rank0(finish)


def _finish(settings: DiagonalSettings, directory: ResultsDirectory, problem: DiagonalProblem,
            hyper: Sequence[Hyperparameters], trained: dict[int, TrainedNet],
            finished_records: dict[int, dict[str, Any]],
            per_batch: dict[int, dict[str, list[float]]], to_train: list[int],
            to_measure: list[int], train_seconds: float, measure_seconds: float, plots: bool,
            docs: Path | None, on_record: Callable[[str, int], None] | None, start: float,
            world_size: int) -> StudyResult:
    """Rank 0: the records of the nets measured now, the taus, plots and sections."""
    losses = dict(zip(to_measure, compute_test_losses(problem, [trained[i] for i in to_measure]),
                      strict=True))
    for i in to_measure:
        record = _model_record(hyper[i], trained[i], losses[i], per_batch.get(i))
        directory.append(MODEL_FILE, record)
        directory.append_csv(CSV_FILE, CSV_COLUMNS, _csv_row(record))
        finished_records[i] = record
        if on_record is not None:
            on_record("model", i)

    records = [finished_records[i] for i in range(settings.nets)]
    diverged = [r["model"] for r in records if r["diverged"]]
    unconverged = [r["model"] for r in records if not r["converged"] and not r["diverged"]]
    counted = [r["model"] for r in records if r["converged"]
               and math.isfinite(r["test_loss"])]
    taus: dict[str, dict[str, float | None]] = {}
    rows = []
    for spec in MEASURES:
        pairs = [(r["test_loss"], r["sharpness"][spec.name]) for r in records
                 if r["model"] in counted and not math.isnan(r["sharpness"][spec.name])]
        if len(pairs) >= 2:
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            tau_a, tau_b = kendall_tau_a(xs, ys), kendall_tau_b(xs, ys)
        else:
            tau_a = tau_b = None
        taus[spec.name] = {"tau_a": tau_a, "tau_b": tau_b, "paper": spec.paper,
                           "count": len(pairs)}
        rows.append(TauRow(spec.name, tau_a, tau_b, spec.paper, spec.note))
    table = tau_table(rows)

    figure_paths: list[Path] | None = None
    if plots:
        counted_records = [r for r in records if r["model"] in counted]
        figure_paths = scatter_plots(
            [r["test_loss"] for r in counted_records],
            {spec.name: [r["sharpness"][spec.name] for r in counted_records]
             for spec in MEASURES},
            directory.path, x_label="test loss",
            color=[math.log10(r["init_scale"]) for r in counted_records],
            color_label="log10 init scale a",
            titles={name: f"{name}: tau-a {_tau_text(t['tau_a'])}, tau-b "
                          f"{_tau_text(t['tau_b'])}" for name, t in taus.items()})

    wall = time.perf_counter() - start
    result = StudyResult(records, taus, counted, unconverged, diverged, to_train, to_measure,
                         wall, "", table, directory.path, figure_paths)
    result.markdown = _section(settings, result, records, wall,
                               directory.run_info.get("resumed", 0), torch.get_num_threads(),
                               world_size)
    (directory.file(SECTION_FILE)).write_text(result.markdown)
    if docs is not None:
        write_section(Path(docs), STUDY, result.markdown)
        regenerate_results_page(Path(docs))
    directory.save_run_info(
        status="complete", wall_seconds=wall, train_seconds=train_seconds,
        measure_seconds=measure_seconds, trained_now=to_train, measured_now=to_measure,
        counted=counted, unconverged=unconverged, diverged=diverged, taus=taus,
        threads=torch.get_num_threads())
    return result


def _tau_text(value: float | None) -> str:
    return "undefined" if value is None else f"{value:+.2f}"


# ---------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce diagonal``."""
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default results/diagonal, or "
                        "results/diagonal-quick with --quick)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the nets already in the results folder and compute only the "
                        "missing ones (the settings must match)")
    parser.add_argument("--quick", action="store_true",
                        help="reduced run: 12 nets, 10 ascent steps, 2000 test inputs")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    parser.add_argument("--nets", type=int, default=None,
                        help="number of nets (default 50, or 12 with --quick)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the scatter plots")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show progress bars (default: on a terminal)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help="also write DIR/results/diagonal.md and regenerate DIR/results.md")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1: fastest for these small "
                        "tensors)")


def settings_from_args(args: argparse.Namespace) -> DiagonalSettings:
    overrides: dict[str, Any] = {"seed": args.seed}
    if args.nets is not None:
        overrides["nets"] = args.nets
    return DiagonalSettings.quick(**overrides) if args.quick else replace(DiagonalSettings(),
                                                                          **overrides)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``quotientsharp reproduce diagonal``."""
    try:
        settings = settings_from_args(args)
    except ValueError as err:
        print(f"quotientsharp reproduce diagonal: error: {err}", file=sys.stderr)
        return 2
    out = args.out if args.out is not None else Path(_default_out(settings))
    try:
        result = run_study(settings, out, resume=args.resume, progress=args.progress,
                           plots=args.plots, docs=args.docs, threads=args.threads)
    except KeyboardInterrupt:
        if is_main_rank():
            print(f"\ninterrupted: finished nets are kept in {out}; continue with --resume",
                  file=sys.stderr)
        return 130
    except (ValueError, NotADirectoryError) as err:
        # under torchrun every rank raises the same error (run_on_rank0): rank 0 reports it
        if is_main_rank():
            print(f"quotientsharp reproduce diagonal: error: {err}", file=sys.stderr)
        return 2
    if not is_main_rank():
        return 0
    print(result.table)
    print(f"\n{len(result.counted)}/{settings.nets} nets counted; not converged: "
          f"{result.unconverged or 'none'}; diverged: {result.diverged or 'none'}")
    print(f"trained now: {len(result.trained_now)}, measured now: {len(result.measured_now)}, "
          f"wall time {result.wall_seconds:.1f} s")
    print(f"results in {result.out}" + ("" if args.docs is None else
                                        f"; docs section in {args.docs}/results/diagonal.md"))
    return 0
