"""Family studies: per-model hyperparameter draws, training and evaluation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from quotientsharp.reproduce.families.data import ClassificationData, Inputs, take


@dataclass(frozen=True)
class HyperparameterSpace:
    """Ranges the per-model hyperparameters are drawn from (bounds inclusive): log-uniform
    learning rate and weight decay, uniform label smoothing and warm-up fraction, uniform
    integers or choices otherwise. ``batch_size``, ``warmup`` and ``rank`` (of an adapter) are
    drawn only when given (``None``: the study's batch size, a 5% warm-up, no adapter)."""

    learning_rate: tuple[float, float]
    weight_decay: tuple[float, float]
    epochs: tuple[int, int]
    label_smoothing: tuple[float, float]
    train_size: tuple[int, int]
    batch_size: tuple[int, ...] | None = None
    warmup: tuple[float, float] | None = None
    rank: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("learning_rate", "weight_decay"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} range must satisfy 0 < low <= high, got {(low, high)}")
        for name in ("epochs", "train_size", "label_smoothing"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} range must satisfy 0 <= low <= high, got "
                                 f"{(low, high)}")
        for name in ("batch_size", "rank"):
            choices = getattr(self, name)
            if choices is not None and (not choices or any(
                    isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in choices)):
                raise ValueError(f"{name} choices must be integers >= 1, got {choices}")
        if self.warmup is not None and not 0 <= self.warmup[0] <= self.warmup[1] < 1:
            raise ValueError(f"warmup range must satisfy 0 <= low <= high < 1, got "
                             f"{self.warmup}")

    def as_dict(self) -> dict[str, list]:
        # the optional ranges only when set: run.json of the older studies stays as it was
        return {name: list(bounds) for name, bounds in asdict(self).items()
                if bounds is not None}


@dataclass(frozen=True)
class Hyperparameters:
    """One model's training settings, drawn by :func:`draw_hyperparameters` (``None``: not
    drawn)."""

    learning_rate: float
    weight_decay: float
    epochs: int
    label_smoothing: float
    train_size: int
    init_seed: int
    batch_size: int | None = None
    warmup_fraction: float | None = None
    rank: int | None = None

    def as_dict(self) -> dict[str, float | int]:
        return {name: value for name, value in asdict(self).items() if value is not None}


def draw_hyperparameters(space: HyperparameterSpace, seed: int, index: int) -> Hyperparameters:
    """The hyperparameters of model ``index``: a function of ``(seed, index)`` only."""
    rng = np.random.default_rng([seed, index])

    def log_uniform(bounds: tuple[float, float]) -> float:
        return float(math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]))))

    drawn: dict[str, Any] = {
        "learning_rate": log_uniform(space.learning_rate),
        "weight_decay": log_uniform(space.weight_decay),
        "epochs": int(rng.integers(space.epochs[0], space.epochs[1], endpoint=True)),
        "label_smoothing": float(rng.uniform(*space.label_smoothing)),
        "train_size": int(rng.integers(space.train_size[0], space.train_size[1],
                                       endpoint=True)),
        "init_seed": int(rng.integers(0, 2**31 - 1)),
    }
    # the optional draws come last, so the ones above do not depend on them
    if space.batch_size is not None:
        drawn["batch_size"] = int(space.batch_size[int(rng.integers(len(space.batch_size)))])
    if space.warmup is not None:
        drawn["warmup_fraction"] = float(rng.uniform(*space.warmup))
    if space.rank is not None:
        drawn["rank"] = int(space.rank[int(rng.integers(len(space.rank)))])
    return Hyperparameters(**drawn)


def _logits(model: nn.Module, inputs: Inputs) -> torch.Tensor:
    output = model(**inputs)
    return output.logits if hasattr(output, "logits") else output


def train_classifier(model: nn.Module, data: ClassificationData, hyper: Hyperparameters,
                     batch_size: int) -> float:
    """Train ``model`` in place on the first ``hyper.train_size`` pool points (AdamW, warm-up
    then cosine decay, label-smoothed cross-entropy, minibatches in an order from the global
    torch generator); the mean training loss of the last epoch."""
    if hyper.train_size > data.pool_size:
        raise ValueError(f"train_size {hyper.train_size} exceeds the training pool "
                         f"({data.pool_size})")
    inputs = take(data.train_inputs, slice(0, hyper.train_size))
    labels = data.train_labels[:hyper.train_size]
    if hyper.batch_size is not None:
        batch_size = hyper.batch_size
    steps_per_epoch = math.ceil(hyper.train_size / batch_size)
    total_steps = max(1, hyper.epochs * steps_per_epoch)
    fraction = 0.05 if hyper.warmup_fraction is None else hyper.warmup_fraction
    warmup = max(1, round(fraction * total_steps))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    optimizer = torch.optim.AdamW(model.parameters(), lr=hyper.learning_rate,
                                  weight_decay=hyper.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    last_epoch_loss = float("nan")
    for _ in range(hyper.epochs):
        order = torch.randperm(hyper.train_size)
        running, count = 0.0, 0
        for start in range(0, hyper.train_size, batch_size):
            index = order[start:start + batch_size]
            loss = F.cross_entropy(_logits(model, take(inputs, index)), labels[index],
                                   label_smoothing=hyper.label_smoothing)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"training diverged (loss {float(loss)}) with "
                                         f"{hyper}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running += loss.detach().item() * index.numel()
            count += index.numel()
        last_epoch_loss = running / count
    model.eval()
    return last_epoch_loss


@torch.no_grad()
def _predict(model: nn.Module, inputs: Inputs, batch_size: int) -> torch.Tensor:
    was_training = model.training
    model.eval()
    size = next(iter(inputs.values())).shape[0]
    logits = torch.cat([_logits(model, take(inputs, slice(start, start + batch_size)))
                        for start in range(0, size, batch_size)])
    model.train(was_training)
    return logits


def error_rate(model: nn.Module, inputs: Inputs, labels: torch.Tensor,
               batch_size: int = 512) -> float:
    """Fraction of misclassified points (0-1 error), eval mode."""
    return float((_predict(model, inputs, batch_size).argmax(-1) != labels).double().mean())


def mean_loss(model: nn.Module, inputs: Inputs, labels: torch.Tensor,
              batch_size: int = 512) -> float:
    """Mean cross-entropy (no label smoothing), eval mode."""
    return float(F.cross_entropy(_predict(model, inputs, batch_size).double(), labels))

