"""``reproduce diagonal``: the settings, everything that determines the study's numbers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from quotientsharp.core.scalars import check_finite, check_int
from quotientsharp.engine.solver import AscentSettings


def _positive_range(name: str, value: Sequence[float]) -> tuple[float, float]:
    low, high = (float(x) for x in value)
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"{name} must be a range 0 < low <= high, got {tuple(value)}")
    return low, high


@dataclass(frozen=True)
class DiagonalSettings:
    """Everything that determines the study's numbers: sizes, the per-net draws, the stopping
    rule (training loss below ``target_loss``, checked every ``check_every`` steps), the
    measures, ``seed`` of every draw and ``data_seed`` of the problem alone (``None``:
    ``seed``), ``training_sets`` ``"shared"`` or ``"per_net"``, the reference ascent, the
    bootstrap resamples and the ``variant`` name."""

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
    data_seed: int | None = None
    training_sets: str = "shared"
    reference_iterations: int = 400
    reference_restarts: int = 3
    bootstrap: int = 2000
    variant: str = "full"

    def __post_init__(self) -> None:
        minimums = dict.fromkeys(("d", "n_train", "n_test", "support", "max_steps",
                                  "check_every", "schedule_epochs", "n_iter",
                                  "sharpness_batch_size", "reference_iterations", "bootstrap"), 1)
        # nets: a rank correlation needs pairs
        for name, minimum in {**minimums, "nets": 2, "seed": 0, "reference_restarts": 0}.items():
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum))
        if self.data_seed is not None:
            object.__setattr__(self, "data_seed", check_int("data_seed", self.data_seed, 0))
        if self.training_sets not in ("shared", "per_net"):
            raise ValueError(f"training_sets must be 'shared' or 'per_net', got "
                             f"{self.training_sets!r}")
        if self.support >= self.d:
            raise ValueError(f"support must be smaller than d={self.d}, got {self.support}")
        self._check_draws_and_batches()
        for name in ("target_loss", "rho"):
            check_finite(name, getattr(self, name))

    def _check_draws_and_batches(self) -> None:
        """Check the drawn ranges and the batch sizes, stored as tuples."""
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

    @classmethod
    def quick(cls, **overrides: Any) -> DiagonalSettings:
        """The reduced variant of ``--quick``."""
        base = dict(nets=12, n_iter=10, n_test=2000, max_steps=40_000, reference_iterations=100,
                    reference_restarts=2, bootstrap=300, variant="quick")
        return cls(**{**base, **overrides})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ascent(self) -> AscentSettings:
        return AscentSettings(n_iter=self.n_iter)

    @property
    def reference_ascent(self) -> AscentSettings:
        """The strong reference ascent: longer runs and random restarts."""
        return AscentSettings(n_iter=self.reference_iterations,
                              restarts=self.reference_restarts)

    @property
    def problem_seed(self) -> int:
        """The seed of the regression problem (``data_seed``, or ``seed`` when unset)."""
        return self.seed if self.data_seed is None else self.data_seed
