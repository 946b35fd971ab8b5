"""The two-stage cluster bootstrap of a pooled Kendall tau, against a brute-force reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quotientsharp.workflows.taus import (
    cluster_bootstrap_difference,
    cluster_bootstrap_tau,
    holm_adjust,
)


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


def _tau_b(x: list[float], y: list[float]) -> float | None:
    """Kendall tau-b of a whole cluster, pair by pair."""
    return _tau_b_brute(x, y, list(range(len(x))))


def _reference(x, y, clusters, n_boot, seed):
    """The documented protocol, written out with loops: clusters in order of first
    appearance; per resample, draw the clusters with replacement, then each drawn cluster's
    members with replacement; the statistic is the mean of the drawn clusters' tau-b."""
    names = list(dict.fromkeys(clusters))
    members = {c: [k for k, name in enumerate(clusters) if name == c] for c in names}
    sub = {c: ([x[k] for k in members[c]], [y[k] for k in members[c]]) for c in names}
    point = float(np.mean([_tau_b(*sub[c]) for c in names]))
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
    assert tau == pytest.approx(_tau_b(x.tolist(), y.tolist()), abs=1e-15)
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


def _difference_reference(x, y1, y2, clusters, n_boot, seed):
    """The paired protocol with loops: the draws of the single-measure protocol, each drawn
    cluster's members used for both measures; resamples where any drawn tau-b is undefined
    are left out; p = 2 min(share <= 0, share >= 0), capped at 1."""
    names = list(dict.fromkeys(clusters))
    members = {c: [k for k, name in enumerate(clusters) if name == c] for c in names}
    sub = {c: ([x[k] for k in members[c]], [y1[k] for k in members[c]],
               [y2[k] for k in members[c]]) for c in names}
    point = float(np.mean([_tau_b(sub[c][0], sub[c][1]) for c in names])
                  - np.mean([_tau_b(sub[c][0], sub[c][2]) for c in names]))
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n_boot):
        picks = rng.integers(0, len(names), size=len(names))
        first, second = [], []
        for p in picks:
            cx, c1, c2 = sub[names[p]]
            idx = rng.integers(0, len(cx), size=len(cx)).tolist()
            first.append(_tau_b_brute(cx, c1, idx))
            second.append(_tau_b_brute(cx, c2, idx))
        if all(t is not None for t in first + second):
            diffs.append(float(np.mean(first)) - float(np.mean(second)))
    low, high = np.quantile(diffs, [0.025, 0.975])
    below = sum(d <= 0 for d in diffs) / len(diffs)
    above = sum(d >= 0 for d in diffs) / len(diffs)
    return point, float(low), float(high), min(1.0, 2 * min(below, above))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_difference_matches_the_brute_force_reference(seed) -> None:
    rng = np.random.default_rng(200 + seed)
    sizes = [5, 6 + seed, 4]
    clusters = [c for c, n in zip(["a", "b", "c"], sizes, strict=True) for _ in range(n)]
    x = np.round(rng.normal(size=len(clusters)), 1)
    y1 = np.round(x + rng.normal(scale=0.5, size=len(clusters)), 1)
    y2 = np.round(rng.normal(size=len(clusters)), 1)
    got = cluster_bootstrap_difference(x.tolist(), y1.tolist(), y2.tolist(), clusters, 150,
                                       seed)
    want = _difference_reference(x.tolist(), y1.tolist(), y2.tolist(), clusters, 150, seed)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_difference_of_a_measure_with_itself_is_zero() -> None:
    rng = np.random.default_rng(7)
    clusters = [0] * 6 + [1] * 6
    x, y = rng.normal(size=12).tolist(), rng.normal(size=12).tolist()
    value, low, high, p_value = cluster_bootstrap_difference(x, y, y, clusters, 100, 0)
    assert (value, low, high, p_value) == (0.0, 0.0, 0.0, 1.0)


def test_difference_tau_matches_the_single_measure_taus() -> None:
    rng = np.random.default_rng(8)
    clusters = [0] * 7 + [1] * 5 + [2] * 6
    x, y1, y2 = (rng.normal(size=18).tolist() for _ in range(3))
    value = cluster_bootstrap_difference(x, y1, y2, clusters, 50, 3)[0]
    first = cluster_bootstrap_tau(x, y1, clusters, 50, 3)[0]
    second = cluster_bootstrap_tau(x, y2, clusters, 50, 3)[0]
    assert value == pytest.approx(first - second, abs=1e-14)


def _holm_reference(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's procedure as a sequence of tests: reject in ascending order while
    p_(k) <= alpha / (m - k + 1), stop at the first that fails."""
    order = sorted(range(len(p_values)), key=lambda k: p_values[k])
    rejected = [False] * len(p_values)
    for step, k in enumerate(order):
        if p_values[k] > alpha / (len(p_values) - step):
            break
        rejected[k] = True
    return rejected


@pytest.mark.parametrize("seed", range(20))
def test_holm_adjusted_p_values_reject_what_the_step_down_test_rejects(seed) -> None:
    rng = np.random.default_rng(seed)
    p_values = rng.uniform(0, 0.2, size=int(rng.integers(1, 7))).tolist()
    adjusted = holm_adjust(p_values)
    for alpha in (0.01, 0.05, 0.1):
        assert [a <= alpha for a in adjusted] == _holm_reference(p_values, alpha)
    assert all(a >= p for a, p in zip(adjusted, p_values, strict=True))
    assert all(a <= 1.0 for a in adjusted)


def test_holm_refuses_p_values_outside_0_1() -> None:
    with pytest.raises(ValueError, match=r"p_values\[1\]"):
        holm_adjust([0.1, 1.5])
