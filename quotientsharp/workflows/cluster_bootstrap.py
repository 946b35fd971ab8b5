"""A Kendall tau pooled over clusters (seeds), with a two-stage cluster bootstrap interval.

When models come in clusters that share something (the nets of one data seed share their
data; the models of one study seed share its draws), resampling the models as if independent
ignores the variation between clusters, and the interval is too narrow (pseudo-replication).
Here

- the pooled tau is the mean over the clusters of each cluster's Kendall tau-b (pairs are
  compared only within a cluster: a model of one seed is never ranked against another seed's);
- each bootstrap resample draws the clusters with replacement, then, within each drawn
  cluster, its members with replacement (a two-stage, or hierarchical, bootstrap), and
  averages the drawn clusters' tau-b; pairs of two copies of one member are left out of
  every count (they say nothing about the ranking);
- the interval is the 2.5 and 97.5 % quantiles (numpy's default linear interpolation) of the
  resampled statistics. Resamples on which some drawn cluster has a constant variable (tau-b
  undefined) are left out.

Draw protocol (so that a reference can replay it): ``rng = numpy.random.default_rng(seed)``;
clusters in order of first appearance; per resample ``rng.integers(0, K, size=K)`` picks the
clusters, then, for each pick in order, ``rng.integers(0, n, size=n)`` its members.

A paired difference of two measures (:func:`cluster_bootstrap_difference`) uses the same draws
for both: each resample's difference is that of the two measures' pooled taus on the same
drawn clusters and members, so what the measures share (the gaps, the models) cancels.
:func:`holm_adjust` is Holm's step-down correction of p-values over a family of comparisons.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["cluster_bootstrap_difference", "cluster_bootstrap_tau", "holm_adjust"]


def _tau_b(xs: np.ndarray, ys: np.ndarray, idx: np.ndarray) -> float | None:
    """Tau-b of the resample ``idx`` of one cluster, without the pairs of two copies."""
    x, y = xs[idx], ys[idx]
    sx = np.sign(x[:, None] - x[None, :])
    sy = np.sign(y[:, None] - y[None, :])
    # every unordered pair counted twice (i, j) and (j, i): the ratio is unchanged
    keep = idx[:, None] != idx[None, :]
    tied_free_x = float((sx * sx)[keep].sum())
    tied_free_y = float((sy * sy)[keep].sum())
    if tied_free_x == 0.0 or tied_free_y == 0.0:
        return None
    return float((sx * sy)[keep].sum()) / math.sqrt(tied_free_x * tied_free_y)


def _cluster_bootstrap(x: Sequence[float], ys: Sequence[Sequence[float]],
                       clusters: Sequence[Hashable], n_boot: int,
                       seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Pooled tau-b of ``x`` against each of ``ys`` and their resamples, with the same draws.

    Returns
    -------
    points
        ``shape=[len(ys)]``, the pooled taus.
    stats
        ``shape=[B, len(ys)]``, the resampled pooled taus of the ``B <= n_boot`` resamples on
        which every drawn cluster has a defined tau-b for every ``y``.
    """
    xs = np.asarray([float(v) for v in x], dtype=np.float64)
    columns = [np.asarray([float(v) for v in y], dtype=np.float64) for y in ys]
    labels = list(clusters)
    for k, column in enumerate(columns):
        if not (xs.size == column.size == len(labels)):
            raise ValueError(f"x, y and clusters must have the same length, got {xs.size}, "
                             f"{column.size} and {len(labels)}"
                             + ("" if len(columns) == 1 else f" (y number {k})"))
    for which, values in [("x", xs)] + [("y", column) for column in columns]:
        if not np.isfinite(values).all():
            raise ValueError(f"{which} has non-finite values at positions "
                             f"{np.flatnonzero(~np.isfinite(values))[:5].tolist()}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    names = list(dict.fromkeys(labels))
    if not names:
        raise ValueError("clusters is empty: at least one cluster of 2 models is needed")
    groups = []
    for name in names:
        members = np.asarray([k for k, label in enumerate(labels) if label == name])
        if members.size < 2:
            raise ValueError(f"cluster {name!r} has {members.size} model(s): every cluster "
                             "needs at least 2 members")
        cx, cys = xs[members], [column[members] for column in columns]
        if any(_tau_b(cx, cy, np.arange(cx.size)) is None for cy in cys):
            raise ValueError(f"cluster {name!r}: x or y is constant, its tau-b is undefined")
        groups.append((cx, cys))
    points = np.asarray([np.mean([_tau_b(cx, cys[j], np.arange(cx.size)) for cx, cys in groups])
                         for j in range(len(columns))])
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n_boot):
        picks = rng.integers(0, len(groups), size=len(groups))
        taus = []
        for pick in picks:
            cx, cys = groups[int(pick)]
            idx = rng.integers(0, cx.size, size=cx.size)
            taus.append([_tau_b(cx, cy, idx) for cy in cys])
        if all(t is not None for row in taus for t in row):
            stats.append(np.mean(np.asarray(taus, dtype=np.float64), axis=0))
    if not stats:
        raise ValueError("every bootstrap resample had a constant variable in some cluster: "
                         "no interval (too few distinct values per cluster)")
    return points, np.asarray(stats)


def cluster_bootstrap_tau(x: Sequence[float], y: Sequence[float], clusters: Sequence[Hashable],
                          n_boot: int, seed: int) -> tuple[float, float, float]:
    """Mean within-cluster Kendall tau-b of ``x`` against ``y``, with a 95 % two-stage cluster
    bootstrap interval (module docstring).

    Parameters
    ----------
    x, y
        Values per model, ``shape=[M]``, finite.
    clusters
        The cluster (seed) of each model, ``shape=[M]``; every cluster needs at least 2
        members and non-constant ``x`` and ``y``.
    n_boot
        Bootstrap resamples (>= 1).
    seed
        Seed of the numpy generator of the draws.

    Returns
    -------
    tau, low, high
        The pooled tau and its interval.
    """
    points, stats = _cluster_bootstrap(x, [y], clusters, n_boot, seed)
    low, high = np.quantile(stats[:, 0], [0.025, 0.975])
    return float(points[0]), float(low), float(high)


def cluster_bootstrap_difference(x: Sequence[float], y_first: Sequence[float],
                                 y_second: Sequence[float], clusters: Sequence[Hashable],
                                 n_boot: int, seed: int) -> tuple[float, float, float, float]:
    """Paired difference of pooled taus, ``tau(x, y_first) - tau(x, y_second)``, with a 95 %
    two-stage cluster bootstrap interval and a bootstrap p-value (same draws for both).

    Parameters
    ----------
    x, y_first, y_second
        Values per model, ``shape=[M]``, finite (e.g. the gap and two measures).
    clusters, n_boot, seed
        As in :func:`cluster_bootstrap_tau`.

    Returns
    -------
    difference, low, high, p_value
        The difference, its interval, and the two-sided percentile-bootstrap p-value of "no
        difference", ``min(1, 2 min(P*(d <= 0), P*(d >= 0)))`` over the resamples ``d`` (below
        0.05 exactly when 0 lies outside the central 95 % of the resamples, up to the
        interpolation of the quantiles).
    """
    points, stats = _cluster_bootstrap(x, [y_first, y_second], clusters, n_boot, seed)
    diffs = stats[:, 0] - stats[:, 1]
    low, high = np.quantile(diffs, [0.025, 0.975])
    p_value = min(1.0, 2.0 * min(float(np.mean(diffs <= 0.0)), float(np.mean(diffs >= 0.0))))
    return float(points[0] - points[1]), float(low), float(high), p_value


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the input order): with the ``m`` p-values sorted
    ascending, the ``k``-th (from 1) becomes ``max over j <= k of min(1, (m - j + 1) p_j)``.
    A comparison is significant at family-wise level ``alpha`` when its adjusted p-value is
    below ``alpha``.

    Parameters
    ----------
    p_values
        ``shape=[m]``, each in [0, 1].
    """
    values = [float(p) for p in p_values]
    for k, p in enumerate(values):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p_values[{k}] must lie in [0, 1], got {p!r}")
    m = len(values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, position in enumerate(sorted(range(m), key=lambda k: values[k])):
        running = max(running, min(1.0, (m - rank) * values[position]))
        adjusted[position] = running
    return adjusted
