"""Kendall taus and their bootstrap intervals (``quotientsharp.workflows.taus``), against
independent references: scipy's ``kendalltau``, pair-by-pair loops, and explicitly resampled
lists with the pairs of two copies of one model removed.

The convention under test: a resample's pair of two copies of one model carries no ranking
information and is left out of every count (tau-a and tau-b alike), so a perfect ranking has
the interval (1, 1), and every study reports its intervals that way.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from quotientsharp.reproduce.families.report import confound_rows
from quotientsharp.workflows.grid import GridPoint
from quotientsharp.workflows.report import tau_rows
from quotientsharp.workflows.taus import (
    cluster_bootstrap_tau,
    kendall_tau_a,
    kendall_tau_b,
    tau_interval,
    without_nan,
)

SIZES = [3, 5, 12, 30]


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def _without_copies(index, x, y):
    """The explicitly resampled list ``[(x[k], y[k]) for k in index]``, its pairs of two
    copies of one model removed: the taus over the remaining pairs, pair by pair."""
    total = pairs = untied_x = untied_y = 0
    for a, b in itertools.combinations(range(len(index)), 2):
        if index[a] == index[b]:                                   # two copies: no pair
            continue
        sx = _sign(x[index[a]] - x[index[b]])
        sy = _sign(y[index[a]] - y[index[b]])
        total += sx * sy
        pairs += 1
        untied_x += sx != 0
        untied_y += sy != 0
    tau_a = total / pairs if pairs else None
    tau_b = total / math.sqrt(untied_x * untied_y) if untied_x and untied_y else None
    return tau_a, tau_b


def _brute_taus(x, y) -> tuple[float | None, float | None]:
    """Tau-a and tau-b of the pairs ``(x, y)`` by a loop over ``i < j`` (no copies)."""
    return _without_copies(list(range(len(x))), x, y)


def _tied_sample(seed: int, size: int) -> tuple[list[float], list[float]]:
    gen = np.random.default_rng(seed)
    x = gen.integers(0, max(2, size // 3), size=size).astype(float)     # many ties
    y = np.round(x * gen.uniform(-1, 1) + gen.normal(size=size), 0)
    return x.tolist(), y.tolist()


# ---------------------------------------------------------------------------- perfect rankings
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_a_perfect_ranking_has_the_degenerate_interval_at_its_estimate(size, seed,
                                                                        direction) -> None:
    gen = np.random.default_rng(seed)
    x = gen.normal(size=size)
    y = direction * np.exp(x)                        # strictly monotone: a perfect ranking
    tau = tau_interval(x, y, samples=500, seed=seed)
    assert (tau.tau_a, tau.tau_b) == (direction, direction)
    assert (tau.a_low, tau.a_high, tau.b_low, tau.b_high) == (direction,) * 4
    assert tau.a_low <= tau.tau_a <= tau.a_high and tau.b_low <= tau.tau_b <= tau.b_high


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_models_or_a_constant_variable_have_no_interval(seed) -> None:
    # two models: every draw with a pair repeats it, so the bootstrap gave [+1, +1] (or
    # [-1, -1]) for any two models; a constant gap gave tau-a [0, 0]: certainty from nothing
    gen = np.random.default_rng(seed)
    x, y = gen.normal(size=2), gen.normal(size=2)
    two = tau_interval(x, y, samples=400, seed=seed)
    assert abs(two.tau_a) == 1.0 and two.tau_b == two.tau_a
    assert (two.a_low, two.a_high, two.b_low, two.b_high) == (None,) * 4
    size = int(gen.integers(3, 9))
    varying, constant = gen.normal(size=size), np.full(size, gen.normal())
    for first, second in ((constant, varying), (varying, constant)):
        flat = tau_interval(first, second, samples=400, seed=seed)
        assert (flat.tau_a, flat.tau_b, flat.count) == (0.0, None, size)
        assert (flat.a_low, flat.a_high, flat.b_low, flat.b_high) == (None,) * 4


@pytest.mark.parametrize("size", SIZES)
def test_every_study_reports_the_perfect_ranking_interval(size) -> None:
    gaps = [0.1 * k for k in range(size)]
    # quotientsharp study (workflows.report)
    point = GridPoint("adaptive", "adaptive", 0.1)
    row, = tau_rows(gaps, {"adaptive": gaps}, [point], resamples=300, confidence=0.95, seed=0)
    assert (row["tau_a"], row["tau_a_low"], row["tau_a_high"]) == (1.0, 1.0, 1.0)
    assert (row["tau_b"], row["tau_b_low"], row["tau_b_high"]) == (1.0, 1.0, 1.0)
    # the family studies (reproduce vit, bert, minilm, vit-finetune, lora)
    records = [{"gap": g, "learning_rate": -g} for g in gaps]
    family, = confound_rows(records)
    assert (family["tau_a"], family["tau_a_interval"]) == (-1.0, [-1.0, -1.0])
    assert (family["tau_b"], family["tau_b_interval"]) == (-1.0, [-1.0, -1.0])
    # pooled over seeds (diagonal --full, the families' --study-seeds)
    clusters = [k % 3 for k in range(3 * size)]
    pooled = cluster_bootstrap_tau(list(range(3 * size)), list(range(3 * size)), clusters,
                                   200, 0)
    assert pooled == (1.0, 1.0, 1.0)


# ---------------------------------------------------------------------------- point estimates
@pytest.mark.parametrize("size", [2, 7, 23, 40])
@pytest.mark.parametrize("seed", range(3))
def test_point_estimates_match_scipy_and_a_pair_loop_with_ties(size, seed) -> None:
    x, y = _tied_sample(seed, size)
    tau = tau_interval(x, y, samples=50, seed=seed)
    want_a, want_b = _brute_taus(x, y)
    assert tau.tau_a == pytest.approx(want_a, abs=1e-15) == kendall_tau_a(x, y)
    scipy_b = scipy_stats.kendalltau(x, y).statistic
    if math.isnan(scipy_b):
        assert tau.tau_b is None and kendall_tau_b(x, y) is None
    else:
        assert tau.tau_b == pytest.approx(float(scipy_b), abs=1e-13)
        assert tau.tau_b == pytest.approx(want_b, abs=1e-15) == kendall_tau_b(x, y)


@pytest.mark.parametrize("seed", range(3))
def test_nan_pairs_are_left_out_only_on_request(seed) -> None:
    x, y = _tied_sample(seed, 12)
    y[3] = math.nan
    with pytest.raises(ValueError, match="y contains NaN at positions \\[3\\]"):
        tau_interval(x, y, samples=10)
    kept = without_nan(x, y)
    assert kept == (x[:3] + x[4:], y[:3] + y[4:])
    assert tau_interval(*kept, samples=10).count == 11


# ---------------------------------------------------------------------------- resampling
@pytest.mark.parametrize("size", [4, 12, 30])
@pytest.mark.parametrize("seed", [0, 7, 123])
def test_resampling_is_seeded_and_reproducible(size, seed) -> None:
    gen = np.random.default_rng(1000 + seed)
    x = gen.normal(size=size)
    y = x + 2.0 * gen.normal(size=size)
    first = tau_interval(x, y, samples=300, seed=seed)
    assert first == tau_interval(x.tolist(), y.tolist(), samples=300, seed=seed)
    assert first != tau_interval(x, y, samples=300, seed=seed + 1)
    assert (first.samples, first.seed, first.count) == (300, seed, size)


@pytest.mark.parametrize("size", [3, 6, 15])
@pytest.mark.parametrize("seed", range(4))
def test_interval_is_the_quantile_of_resamples_with_copies_removed_pairwise(size, seed) -> None:
    """Replays the documented draws (``default_rng(seed).integers(0, n, (samples, n))``, one
    block for up to 256 resamples), builds each resampled list explicitly and counts its pairs
    in a loop, skipping the pairs of two copies; resamples without a pair are left out."""
    x, y = _tied_sample(seed, size)
    samples = 200
    got = tau_interval(x, y, samples=samples, seed=seed)
    index = np.random.default_rng(seed).integers(0, size, size=(samples, size))
    draws = [_without_copies(row.tolist(), x, y) for row in index]
    draws_a = [a for a, _ in draws if a is not None]
    draws_b = [b for a, b in draws if a is not None and b is not None]
    if len(set(x)) == 1 or len(set(y)) == 1:
        # a constant variable: every draw gives tau-a 0 back, no interval
        assert (got.a_low, got.a_high, got.b_low, got.b_high) == (None,) * 4
        return
    want_a = np.quantile(draws_a, [0.025, 0.975])
    assert (got.a_low, got.a_high) == pytest.approx(tuple(want_a), abs=1e-12)
    if len(draws_b) >= 0.9 * len(draws_a):
        want_b = np.quantile(draws_b, [0.025, 0.975])
        assert (got.b_low, got.b_high) == pytest.approx(tuple(want_b), abs=1e-12)
    else:
        assert (got.b_low, got.b_high) == (None, None)


@pytest.mark.parametrize("samples", [-1, 2.5, True])
def test_bad_settings_are_refused(samples) -> None:
    with pytest.raises(ValueError, match="samples"):
        tau_interval([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], samples=samples)
