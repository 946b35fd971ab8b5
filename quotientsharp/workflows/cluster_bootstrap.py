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
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["cluster_bootstrap_tau"]


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
    xs = np.asarray([float(v) for v in x], dtype=np.float64)
    ys = np.asarray([float(v) for v in y], dtype=np.float64)
    labels = list(clusters)
    if not (xs.size == ys.size == len(labels)):
        raise ValueError(f"x, y and clusters must have the same length, got {xs.size}, "
                         f"{ys.size} and {len(labels)}")
    for name, values in (("x", xs), ("y", ys)):
        if not np.isfinite(values).all():
            raise ValueError(f"{name} has non-finite values at positions "
                             f"{np.flatnonzero(~np.isfinite(values))[:5].tolist()}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    names = list(dict.fromkeys(labels))
    if not names:
        raise ValueError("clusters is empty: at least one cluster of 2 models is needed")
    groups, own = [], []
    for cluster in names:
        members = np.asarray([k for k, label in enumerate(labels) if label == cluster])
        if members.size < 2:
            raise ValueError(f"cluster {cluster!r} has {members.size} model(s): every cluster "
                             "needs at least 2 members")
        cx, cy = xs[members], ys[members]
        tau = _tau_b(cx, cy, np.arange(cx.size))
        if tau is None:
            raise ValueError(f"cluster {cluster!r}: x or y is constant, its tau-b is undefined")
        groups.append((cx, cy))
        own.append(tau)
    point = float(np.mean(own))
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n_boot):
        picks = rng.integers(0, len(groups), size=len(groups))
        # every drawn cluster draws its members, even after an undefined tau-b, so that the
        # stream of draws is the protocol's
        drawn = [_tau_b(groups[int(pick)][0], groups[int(pick)][1],
                        rng.integers(0, groups[int(pick)][0].size,
                                     size=groups[int(pick)][0].size))
                 for pick in picks]
        taus = [tau for tau in drawn if tau is not None]
        if len(taus) == len(drawn):
            stats.append(float(np.mean(taus)))
    if not stats:
        raise ValueError("every bootstrap resample had a constant variable in some cluster: "
                         "no interval (too few distinct values per cluster)")
    low, high = np.quantile(np.asarray(stats), [0.025, 0.975])
    return point, float(low), float(high)
