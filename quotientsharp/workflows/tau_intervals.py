"""Kendall tau-a and tau-b with percentile bootstrap intervals, for one sample or several.

The point estimates are :func:`~quotientsharp.workflows.taus.kendall_tau_a` and
:func:`~quotientsharp.workflows.taus.kendall_tau_b` on the sample itself. The interval
resamples the models with replacement (seeded, so it is reproducible) and takes the
``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the resampled taus. A resample holds
some models twice; a pair of two copies of one model says nothing about the ranking, so such
pairs are left out of every count (otherwise they would count as ties and pull tau-a towards
0: a perfect ranking would get an interval that excludes 1).

Several samples (data seeds): :func:`pooled_tau_intervals` gives the mean of the per-sample
taus, with a stratified bootstrap (each sample resampled within itself, the per-sample taus of
one resample averaged).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from quotientsharp.workflows.taus import kendall_tau_a, kendall_tau_b

__all__ = ["TauInterval", "pooled_tau_intervals", "tau_interval"]

#: Resamples are processed in chunks of this many (bounds the ``[chunk, n, n]`` pair arrays).
_CHUNK = 256


@dataclass(frozen=True)
class TauInterval:
    """Kendall tau-a and tau-b with their bootstrap intervals.

    Attributes
    ----------
    tau_a, tau_b
        Point estimates (``tau_b`` ``None`` when a variable is constant).
    a_low, a_high, b_low, b_high
        Percentile interval bounds (``None`` where undefined).
    count
        Models (pairs of values), summed over the samples when pooled.
    samples, level, seed
        Bootstrap resamples, coverage and seed.
    """

    tau_a: float
    tau_b: float | None
    a_low: float | None
    a_high: float | None
    b_low: float | None
    b_high: float | None
    count: int
    samples: int
    level: float
    seed: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _values(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray([float(v) for v in values], dtype=np.float64)
    if not np.isfinite(array).all():
        bad = np.flatnonzero(~np.isfinite(array))[:5].tolist()
        raise ValueError(f"{name} has non-finite values at positions {bad}: drop them first")
    return array


def _check(x: Sequence[float], y: Sequence[float], samples: int, level: float
           ) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = _values("x", x), _values("y", y)
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    if xs.size < 2:
        raise ValueError(f"a Kendall tau needs at least 2 pairs, got {xs.size}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
    if not (isinstance(level, float) and 0 < level < 1):
        raise ValueError(f"level must be a float in (0, 1), got {level!r}")
    return xs, ys


def _resampled_taus(xs: np.ndarray, ys: np.ndarray, samples: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Tau-a and tau-b of ``samples`` resamples (NaN where tau-b is undefined)."""
    n = xs.size
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    taus_a, taus_b = [], []
    for start in range(0, samples, _CHUNK):
        index = rng.integers(0, n, size=(min(_CHUNK, samples - start), n))
        x, y = xs[index], ys[index]
        sx = np.sign(x[:, :, None] - x[:, None, :])
        sy = np.sign(y[:, :, None] - y[:, None, :])
        distinct = (index[:, :, None] != index[:, None, :]) & upper
        pairs = distinct.sum((1, 2)).astype(np.float64)
        total = (sx * sy * distinct).sum((1, 2))
        untied_x = ((sx != 0) & distinct).sum((1, 2)).astype(np.float64)
        untied_y = ((sy != 0) & distinct).sum((1, 2)).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            taus_a.append(np.where(pairs > 0, total / pairs, np.nan))
            taus_b.append(np.where(untied_x * untied_y > 0,
                                   total / np.sqrt(untied_x * untied_y), np.nan))
    return np.concatenate(taus_a), np.concatenate(taus_b)


def _bounds(values: np.ndarray, level: float) -> tuple[float | None, float | None]:
    finite = values[np.isfinite(values)]
    # an interval from fewer than 90 % of the resamples would not be the stated one
    if finite.size < 0.9 * values.size:
        return None, None
    low, high = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def tau_interval(x: Sequence[float], y: Sequence[float], samples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> TauInterval:
    """Kendall tau-a and tau-b of ``x`` against ``y`` with percentile bootstrap intervals.

    Parameters
    ----------
    x, y
        Paired finite values, ``shape=[n]``, ``n >= 2``.
    samples
        Bootstrap resamples.
    seed
        Seed of the resampling (the same seed gives the same interval).
    level
        Coverage of the interval.

    Raises
    ------
    ValueError
        Naming the argument, for non-finite values, unequal lengths or bad settings.
    """
    xs, ys = _check(x, y, samples, level)
    resampled_a, resampled_b = _resampled_taus(xs, ys, samples, np.random.default_rng(seed))
    return TauInterval(kendall_tau_a(xs.tolist(), ys.tolist()),
                       kendall_tau_b(xs.tolist(), ys.tolist()), *_bounds(resampled_a, level),
                       *_bounds(resampled_b, level), int(xs.size), samples, level, seed)


def pooled_tau_intervals(groups: Sequence[tuple[Sequence[float], Sequence[float]]],
                         samples: int = 2000, seed: int = 0, level: float = 0.95
                         ) -> TauInterval:
    """The mean over samples (e.g. data seeds) of Kendall tau-a and tau-b, with a stratified
    percentile bootstrap interval (each sample resampled within itself).

    Parameters
    ----------
    groups
        ``(x, y)`` per sample.
    """
    if not groups:
        raise ValueError("groups must hold at least one (x, y) sample")
    rng = np.random.default_rng(seed)
    point_a, point_b, draws_a, draws_b, count = [], [], [], [], 0
    for x, y in groups:
        xs, ys = _check(x, y, samples, level)
        point_a.append(kendall_tau_a(xs.tolist(), ys.tolist()))
        point_b.append(kendall_tau_b(xs.tolist(), ys.tolist()))
        resampled_a, resampled_b = _resampled_taus(xs, ys, samples, rng)
        draws_a.append(resampled_a)
        draws_b.append(resampled_b)
        count += int(xs.size)
    known_b = [b for b in point_b if b is not None]
    # undefined for every seed when undefined for one (a constant variable there)
    tau_b = (None if len(known_b) < len(point_b) else math.fsum(known_b) / len(known_b))
    return TauInterval(math.fsum(point_a) / len(point_a), tau_b,
                       *_bounds(np.mean(draws_a, axis=0), level),
                       *_bounds(np.mean(draws_b, axis=0), level), count, samples, level, seed)
