"""The two-stage cluster bootstrap of a pooled Kendall tau, against a brute-force reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quotientsharp.workflows.cluster_bootstrap import cluster_bootstrap_tau
from quotientsharp.workflows.taus import kendall_tau_b_reference


def _tau_b_brute(x: list[float], y: list[float], idx: list[int]) -> float | None:
    """Kendall tau-b of the resample ``idx`` of one cluster, pair by pair, leaving out the
    pairs of two copies of one member."""
    concordance = ties_free_x = ties_free_y = 0.0
    for a in range(len(idx)):
        for b in range(a + 1, len(idx)):
            i, j = idx[a], idx[b]
            if i == j:
                continue
            sx = (x[i] > x[j]) - (x[i] < x[j])
            sy = (y[i] > y[j]) - (y[i] < y[j])
            concordance += sx * sy
            ties_free_x += sx * sx
            ties_free_y += sy * sy
    if ties_free_x == 0 or ties_free_y == 0:
        return None
    return concordance / math.sqrt(ties_free_x * ties_free_y)


def _reference(x, y, clusters, n_boot, seed):
    """The documented protocol, written out with loops: clusters in order of first
    appearance; per resample, draw the clusters with replacement, then each drawn cluster's
    members with replacement; the statistic is the mean of the drawn clusters' tau-b."""
    names = list(dict.fromkeys(clusters))
    members = {c: [k for k, name in enumerate(clusters) if name == c] for c in names}
    sub = {c: ([x[k] for k in members[c]], [y[k] for k in members[c]]) for c in names}
    point = float(np.mean([kendall_tau_b_reference(*sub[c]) for c in names]))
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n_boot):
        picks = rng.integers(0, len(names), size=len(names))
        taus = []
        for p in picks:
            cx, cy = sub[names[p]]
            idx = rng.integers(0, len(cx), size=len(cx)).tolist()
            taus.append(_tau_b_brute(cx, cy, idx))
        if all(t is not None for t in taus):
            stats.append(float(np.mean(taus)))
    low, high = np.quantile(stats, [0.025, 0.975])
    return point, float(low), float(high)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_matches_the_brute_force_reference(seed) -> None:
    rng = np.random.default_rng(100 + seed)
    sizes = [4 + seed, 7, 5]
    clusters = [c for c, n in zip(["s0", "s1", "s2"], sizes, strict=True) for _ in range(n)]
    x = rng.normal(size=len(clusters))
    # ties inside the clusters and a within-cluster trend of changing strength
    y = np.round(x * rng.uniform(-1, 1) + rng.normal(size=len(clusters)), 1)
    x = np.round(x, 1)
    got = cluster_bootstrap_tau(x.tolist(), y.tolist(), clusters, 200, seed)
    want = _reference(x.tolist(), y.tolist(), clusters, 200, seed)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_one_cluster_point_estimate_is_kendall_tau_b() -> None:
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=12), rng.normal(size=12)
    tau, low, high = cluster_bootstrap_tau(x, y, [7] * 12, 300, 0)
    assert tau == pytest.approx(kendall_tau_b_reference(x.tolist(), y.tolist()), abs=1e-15)
    assert low <= high


def test_clusters_that_disagree_widen_the_interval() -> None:
    # three seeds with opposite trends: the pooled interval must cover the spread of the seeds
    x = np.tile(np.arange(10.0), 3)
    y = np.concatenate([np.arange(10.0), np.arange(10.0), -np.arange(10.0)])
    clusters = np.repeat([0, 1, 2], 10)
    tau, low, high = cluster_bootstrap_tau(x, y, clusters, 2000, 1)
    assert tau == pytest.approx(1 / 3)
    assert low < -0.9 and high > 0.99
    # the same data with every seed agreeing: a perfect ranking, a degenerate interval
    agree = cluster_bootstrap_tau(x, np.tile(np.arange(10.0), 3), clusters, 500, 1)
    assert agree == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(("args", "message"), [
    (([1.0, 2.0], [1.0], [0, 0]), "same length"),
    (([1.0, 2.0], [1.0, 2.0], [0]), "same length"),
    (([1.0, math.nan], [1.0, 2.0], [0, 0]), "non-finite"),
    (([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0, 0, 1]), "at least 2 members"),
    (([1.0, 1.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [0, 0, 1, 1]), "constant"),
])
def test_bad_input_is_refused(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_bootstrap_tau(*args, 10, 0)


@pytest.mark.parametrize("n_boot", [0, -1, 2.5, True])
def test_bad_resample_count_is_refused(n_boot) -> None:
    with pytest.raises(ValueError, match="n_boot"):
        cluster_bootstrap_tau([1.0, 2.0], [1.0, 2.0], [0, 0], n_boot, 0)
