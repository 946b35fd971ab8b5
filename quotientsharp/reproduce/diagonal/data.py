"""``reproduce diagonal``: the seeded draws, each from a seed of its own (:func:`derived_seed`),
of the regression problem and the per-net hyperparameters."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from quotientsharp.reproduce.diagonal.settings import DiagonalSettings


def derived_seed(seed: int, tag: str) -> int:
    """An independent 63-bit seed per purpose, so one stream never shifts another."""
    digest = hashlib.sha256(f"quotientsharp-diagonal:{seed}:{tag}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _generator(seed: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(derived_seed(seed, tag))


@dataclass
class DiagonalProblem:
    """The regression problem: ``x_train`` ``shape=[n, d]`` (shared by every net) or
    ``shape=[nets, n, d]`` (a training set per net), ``beta_star`` ``shape=[d]``, ``x_test``
    ``shape=[n_test, d]``, noiseless targets (``y_train`` ``shape=x_train.shape[:-1]``),
    float64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    beta_star: torch.Tensor
    support: list[int]

    @property
    def per_net(self) -> bool:
        """Whether every net has a training set of its own."""
        return self.x_train.dim() == 3


def make_problem(settings: DiagonalSettings) -> DiagonalProblem:
    """Draw the training and test inputs and the sparse ground truth (with a training set per
    net, net ``i``'s from the stream ``data:net<i>``)."""
    dtype = torch.float64
    seed = settings.problem_seed
    data = _generator(seed, "data")
    x_train = torch.randn(settings.n_train, settings.d, generator=data, dtype=dtype)
    support = torch.randperm(settings.d, generator=data)[:settings.support].sort().values
    beta_star = torch.zeros(settings.d, dtype=dtype)
    beta_star[support] = torch.randn(settings.support, generator=data, dtype=dtype)
    beta_star = beta_star / beta_star.norm()
    if settings.training_sets == "per_net":
        x_train = torch.stack([
            torch.randn(settings.n_train, settings.d, generator=_generator(seed, f"data:net{i}"),
                        dtype=dtype) for i in range(settings.nets)])
    x_test = torch.randn(settings.n_test, settings.d, generator=_generator(seed, "test"),
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
                            derived_seed(settings.seed, f"schedule:{i}")) for i in range(nets)]

