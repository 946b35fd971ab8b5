"""Adaptive sharpness the way the reference protocol computes it: by mutating the model.

A straightforward reimplementation, from SPEC section 6, of the protocol of Andriushchenko et al.
(2023) for adaptive worst-case sharpness (``c = |w|``, L2 ball of radius ``rho``), written the way
that code works: the perturbation ``delta`` is written into the model's parameters before every
forward/backward (``p <- w + delta``, a parameter copy per step), the gradient is read from
``p.grad``, and the original weights are copied back afterwards. It exists only as the baseline
of row 6 of ``benchmarks/run.py``; the library's :func:`quotientsharp.sharpness` evaluates
functionally and never writes to the model.

The ascent is Auto-PGD with the defaults of SPEC section 6 (``xi = 0`` start, ``eta_0 = 2 rho``,
``alpha = 0.75``, checkpoints ``ceil(p_j N)``, halving ``eta`` and restarting from the best
iterate when fewer than 75% of the steps since the last checkpoint increased the loss or neither
``eta`` nor the best loss changed). The defects SPEC lists are avoided: zero weights stay fixed
(no 0/0), parameters without gradient get a zero gradient, a restart resets every iterate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["adaptive_checkpoints", "inplace_adaptive_sharpness"]


def adaptive_checkpoints(n_iter: int) -> list[int]:
    """``w_j = ceil(p_j N)`` for ``p_0 = 0``, ``p_1 = 0.22``,
    ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)`` while ``p_j <= 1``, ``w_j >= 1``.

    The ``p_j`` are multiples of 0.01: they are carried as integer hundredths, so that
    ``0.70 * 20`` is exactly 14.
    """
    previous, current = 0, 22
    marks: list[int] = []
    while current <= 100:
        mark = -((-current * n_iter) // 100)          # ceil(current * n_iter / 100)
        if mark >= 1 and (not marks or mark > marks[-1]):
            marks.append(mark)
        previous, current = current, current + max(current - previous - 3, 6)
    return marks


def _split(batch: Mapping | tuple) -> tuple[dict, torch.Tensor]:
    if isinstance(batch, Mapping):
        return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]
    inputs, target = batch
    return inputs, target


def _logits(model: nn.Module, inputs) -> torch.Tensor:
    output = model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
    return output.logits if hasattr(output, "logits") else output


class _InPlaceProblem:
    """The loss of one batch at ``w + delta``, evaluated by writing into the model."""

    def __init__(self, model: nn.Module, batch) -> None:
        self.model = model
        self.inputs, self.target = _split(batch)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.original = [p.detach().clone() for p in self.parameters]
        self.scale = [w.abs() for w in self.original]
        self.scale_sq = [c.square() for c in self.scale]
        # 1/|w| where w != 0, else 0: such coordinates never move and count for nothing
        self.inv_scale = [torch.where(c == 0, torch.zeros_like(c), 1.0 / c.masked_fill(c == 0, 1.0))
                          for c in self.scale]

    def restore(self) -> None:
        with torch.no_grad():
            for p, w in zip(self.parameters, self.original, strict=True):
                p.copy_(w)

    def clean_loss(self) -> torch.Tensor:
        self.restore()
        with torch.no_grad():
            return F.cross_entropy(_logits(self.model, self.inputs), self.target)

    def loss_and_gradient(self, delta: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
        with torch.no_grad():
            for p, w, d in zip(self.parameters, self.original, delta, strict=True):
                p.copy_(w + d)
        for p in self.parameters:
            p.grad = None
        with torch.enable_grad():
            loss = F.cross_entropy(_logits(self.model, self.inputs), self.target)
            loss.backward()
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.parameters]
        for p in self.parameters:
            p.grad = None
        return loss.detach(), grads

    def norm(self, delta: list[torch.Tensor]) -> torch.Tensor:
        total = delta[0].new_zeros(())
        for d, inv_c in zip(delta, self.inv_scale, strict=True):
            total = total + (d * inv_c).square().sum()
        return total.clamp_min(0).sqrt()

    def direction(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        raised = [g * c2 for g, c2 in zip(grads, self.scale_sq, strict=True)]
        norm = self.norm(raised).clamp_min(torch.finfo(raised[0].dtype).tiny)
        return [r / norm for r in raised]

    def project(self, delta: list[torch.Tensor], rho: float) -> list[torch.Tensor]:
        norm = self.norm(delta)
        factor = (rho / norm.clamp_min(torch.finfo(norm.dtype).tiny)).clamp(max=1.0)
        return [factor * d for d in delta]


def _ascent(problem: _InPlaceProblem, rho: float, n_iter: int, alpha: float,
            eta0: float) -> torch.Tensor:
    """Best loss of Auto-PGD from ``delta = 0`` (SPEC section 6)."""
    marks = [m for m in adaptive_checkpoints(n_iter) if m < n_iter]
    delta = [torch.zeros_like(w) for w in problem.original]
    loss, grads = problem.loss_and_gradient(delta)
    direction = problem.direction(grads)
    best_loss, best_delta, best_direction = loss, delta, direction
    previous, current = delta, loss
    eta = torch.full((), eta0, dtype=loss.dtype, device=loss.device)
    mark_eta, mark_best = eta, best_loss
    increases = torch.zeros((), dtype=loss.dtype, device=loss.device)
    last_mark = 0
    for k in range(n_iter):
        z = problem.project([d + eta * g for d, g in zip(delta, direction, strict=True)], rho)
        if k == 0:
            new = z
        else:
            new = problem.project([d + alpha * (zz - d) + (1 - alpha) * (d - p)
                                   for d, zz, p in zip(delta, z, previous, strict=True)], rho)
        new_loss, grads = problem.loss_and_gradient(new)
        new_direction = problem.direction(grads)
        increases = increases + (new_loss > current).to(increases.dtype)
        improved = new_loss > best_loss
        best_loss = torch.where(improved, new_loss, best_loss)
        best_delta = [torch.where(improved, a, b) for a, b in zip(new, best_delta, strict=True)]
        best_direction = [torch.where(improved, a, b)
                          for a, b in zip(new_direction, best_direction, strict=True)]
        previous, delta, current, direction = delta, new, new_loss, new_direction
        step = k + 1
        if marks and step == marks[0]:
            marks.pop(0)
            restart = ((increases < 0.75 * (step - last_mark))
                       | ((eta == mark_eta) & (best_loss == mark_best)))
            mark_eta, mark_best = eta, best_loss
            eta = torch.where(restart, 0.5 * eta, eta)
            delta = [torch.where(restart, b, d) for b, d in zip(best_delta, delta, strict=True)]
            previous = [torch.where(restart, b, p)
                        for b, p in zip(best_delta, previous, strict=True)]
            direction = [torch.where(restart, b, d)
                         for b, d in zip(best_direction, direction, strict=True)]
            current = torch.where(restart, best_loss, current)
            increases = torch.zeros_like(increases)
            last_mark = step
    return best_loss


def inplace_adaptive_sharpness(model: nn.Module, batches: Iterable, rho: float,
                               n_iter: int = 20, alpha: float = 0.75,
                               eta0: float | None = None) -> tuple[float, list[float]]:
    """Adaptive sharpness (mean over batches of best loss minus clean loss), in place.

    Parameters
    ----------
    model
        Classifier returning logits (or an object with ``.logits``); its parameters are written
        during the call and restored afterwards; it runs in eval mode.
    batches
        ``(inputs, target)`` pairs or HuggingFace dicts with ``"labels"``; cross-entropy loss.
    rho, n_iter, alpha, eta0
        Radius and Auto-PGD settings (``eta0`` defaults to ``2 rho``).

    Returns
    -------
    tuple
        ``(mean sharpness, per-batch sharpness)``.
    """
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    eta0 = 2.0 * rho if eta0 is None else eta0
    modes = {module: module.training for module in model.modules()}
    model.eval()
    values: list[float] = []
    try:
        for batch in batches:
            problem = _InPlaceProblem(model, batch)
            try:
                clean = problem.clean_loss()
                best = _ascent(problem, rho, n_iter, alpha, eta0)
            finally:
                problem.restore()
            values.append(float(best - clean))
    finally:
        for module, training in modes.items():
            module.training = training
    if not values:
        raise ValueError("batches is empty")
    return sum(values) / len(values), values
