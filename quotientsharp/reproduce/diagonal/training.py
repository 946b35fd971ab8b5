"""``reproduce diagonal``: training every diagonal net at once, and their test losses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quotientsharp.reproduce.diagonal.data import DiagonalProblem, Hyperparameters
from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
from quotientsharp.workflows.progress import progress_bar


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

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrainedNet:
        return cls(int(record["model"]), int(record["steps"]), float(record["train_loss"]),
                   bool(record["converged"]), bool(record["diverged"]),
                   [float(x) for x in record["u"]], [float(x) for x in record["v"]])


#: A training loss above this (or not finite) counts as divergence.
DIVERGENCE_LOSS = 1e6


def _stop_nets(step: int, residual: torch.Tensor, active: torch.Tensor, u: torch.Tensor,
               v: torch.Tensor, settings: DiagonalSettings) -> list[TrainedNet]:
    """At a check of step ``step``: the ``active`` nets that stop now (converged, diverged,
    or at the last step), in index order, from the residuals ``shape=[nets, n]``."""
    loss = residual.square().mean(-1)
    healthy = torch.isfinite(loss) & (loss < DIVERGENCE_LOSS)
    reached = active & (loss < settings.target_loss)
    failed = active & ~healthy
    stop = reached | failed
    if step == settings.max_steps:
        stop = stop | active
    return [TrainedNet(index, step, float(loss[index]), bool(reached[index]),
                       bool(failed[index]), u[index].tolist(), v[index].tolist())
            for index in stop.nonzero().flatten().tolist()]


def train_nets(problem: DiagonalProblem, hyper: Sequence[Hyperparameters],
               settings: DiagonalSettings, finished: dict[int, TrainedNet] | None = None,
               on_trained: Callable[[TrainedNet], None] | None = None,
               progress: bool | None = False) -> dict[int, TrainedNet]:
    """Train every net not in ``finished`` together; the nets trained here by index, each
    passed to ``on_trained`` as it stops. Finished nets sit in the batch frozen, so the others
    go through the same matrix products as in an uninterrupted run."""
    finished = finished or {}
    nets, dtype = len(hyper), torch.float64
    x, y = problem.x_train, problem.y_train
    x_t = x.transpose(-1, -2).contiguous()
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
    per_net = problem.per_net
    done: dict[int, TrainedNet] = {}
    remaining = int(active.sum())
    bar = progress_bar(settings.max_steps, "training nets", progress if remaining else False,
                       unit="step")
    try:
        for step in range(settings.max_steps + 1):
            if per_net:   # each net on its own inputs: x [nets, n, d]
                residual = torch.baddbmm(negative_y.unsqueeze(1), (u * v).unsqueeze(1),
                                         x_t).squeeze(1)                   # [nets, n]
            else:
                residual = torch.addmm(negative_y, u * v, x_t)             # [nets, n]
            if step % settings.check_every == 0 or step == settings.max_steps:
                stopped = _stop_nets(step, residual, active, u, v, settings)
                for net in stopped:
                    done[net.model] = net
                    if on_trained is not None:
                        on_trained(net)
                active[[net.model for net in stopped]] = False
                remaining = int(active.sum())
                if step:
                    bar.update(settings.check_every)
                bar.set_postfix(stopped=f"{nets - remaining}/{nets}")
                if remaining == 0 or step == settings.max_steps:
                    break
            weights = table[rows, step % period]                          # [nets, n]
            if per_net:
                gradient = torch.bmm((weights * residual).unsqueeze(1), x).squeeze(1)
            else:
                gradient = (weights * residual) @ x                       # dL/dbeta / 2
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

