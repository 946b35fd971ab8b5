"""Kendall rank correlations between generalisation and sharpness, with bootstrap intervals:
the one module every study takes its taus from.

A pair of two copies of one model in a resample carries no ranking information: it is left out
of every count (pairs, concordance, ties), for tau-a and tau-b alike (counted as a tie it would
pull tau-a towards 0 by about ``1/M``: a perfect ranking of 12 models got ``(0.83, 0.97)``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: Resamples are processed in chunks of this many (bounds the ``[chunk, n, n]`` pair arrays).
_CHUNK = 256


def _column(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray([float(value) for value in values], dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(np.isnan(array))
    if bad.size:
        raise ValueError(f"{name} contains NaN at positions {bad[:5].tolist()}: rank it or "
                         "drop it first")
    return array


def without_nan(x: Sequence[float], y: Sequence[float]) -> tuple[list[float], list[float]]:
    """The pairs ``(x_i, y_i)`` with neither value NaN, as two lists (a model whose value is
    missing is left out of the taus)."""
    kept = [(float(a), float(b)) for a, b in zip(x, y, strict=True)
            if not (math.isnan(float(a)) or math.isnan(float(b)))]
    return [a for a, _ in kept], [b for _, b in kept]


def _paired(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` as float64 arrays of equal length (at least 2), NaN refused."""
    xs, ys = _column("x", x), _column("y", y)
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    if xs.size < 2:
        raise ValueError(f"Kendall tau needs at least 2 pairs, got {xs.size}")
    return xs, ys


def _signs(values: np.ndarray) -> np.ndarray:
    """``sign(v_i - v_j)`` over the last axis, ``shape=[..., n, n]``; equal infinities tie."""
    with np.errstate(invalid="ignore"):
        signs = np.sign(values[..., :, None] - values[..., None, :])
    signs[np.isnan(signs)] = 0.0
    return signs


def _resample_taus(xs: np.ndarray, ys: np.ndarray, index: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Tau-a and tau-b, ``shape=[B]``, of the resamples ``index`` (``shape=[B, n]``) without
    the pairs of two copies of one model; NaN where undefined (no pair, a constant variable)."""
    n = index.shape[1]
    sx, sy = _signs(xs[index]), _signs(ys[index])
    counted = (index[:, :, None] != index[:, None, :]) & np.triu(np.ones((n, n), bool), k=1)
    pairs = counted.sum((1, 2)).astype(np.float64)
    total = (sx * sy * counted).sum((1, 2))
    untied_x = ((sx != 0) & counted).sum((1, 2)).astype(np.float64)
    untied_y = ((sy != 0) & counted).sum((1, 2)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau_a = np.where(pairs > 0, total / pairs, np.nan)
        tau_b = np.where(untied_x * untied_y > 0, total / np.sqrt(untied_x * untied_y), np.nan)
    return tau_a, tau_b


def _point(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float | None]:
    """Tau-a and tau-b of the sample itself (the identity resample: every pair counted)."""
    tau_a, tau_b = _resample_taus(xs, ys, np.arange(xs.size)[None, :])
    return float(tau_a[0]), None if np.isnan(tau_b[0]) else float(tau_b[0])


def kendall_tau_a(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall tau-a: ``2 / (M (M - 1)) sum_{i<j} sign(x_i - x_j) sign(y_i - y_j)``; ties
    count zero (unlike tau-b, SciPy's default); ``inf`` is ranked, NaN rejected."""
    return _point(*_paired(x, y))[0]


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall tau-b (SciPy's default), ``S / sqrt((P - T_x)(P - T_y))`` from exact pair counts
    (``S`` the tau-a numerator, ``P`` the pairs, ``T_x``, ``T_y`` those tied in ``x``, ``y``);
    ``None`` for a constant variable."""
    return _point(*_paired(x, y))[1]


@dataclass(frozen=True)
class TauInterval:
    """Kendall tau-a and tau-b with their bootstrap intervals.

    Attributes
    ----------
    tau_a, tau_b
        Point estimates (``tau_b`` ``None`` when a variable is constant).
    a_low, a_high, b_low, b_high
        Percentile interval bounds (``None`` where undefined, or for ``samples=0``).
    count
        Models (pairs of values).
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


def _resampled_taus(xs: np.ndarray, ys: np.ndarray, samples: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Tau-a and tau-b of ``samples`` resamples of the models (:func:`_resample_taus`)."""
    taus_a, taus_b = [np.empty(0)], [np.empty(0)]
    for start in range(0, samples, _CHUNK):
        index = rng.integers(0, xs.size, size=(min(_CHUNK, samples - start), xs.size))
        tau_a, tau_b = _resample_taus(xs, ys, index)
        taus_a.append(tau_a)
        taus_b.append(tau_b)
    return np.concatenate(taus_a), np.concatenate(taus_b)


def _bounds(values: np.ndarray, informative: np.ndarray, level: float
            ) -> tuple[float | None, float | None]:
    """The percentile interval of ``values`` over the ``informative`` resamples (those with a
    pair); ``None`` unless defined on at least 90 % of them."""
    kept = values[informative]
    finite = kept[np.isfinite(kept)]
    if finite.size == 0 or finite.size < 0.9 * kept.size:
        return None, None
    low, high = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def tau_interval(x: Sequence[float], y: Sequence[float], samples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> TauInterval:
    """Kendall tau-a and tau-b of ``x`` against ``y`` with percentile bootstrap intervals
    (the pairs of two copies of one model are left out of each resample).

    Parameters
    ----------
    x, y
        Paired values, ``shape=[n]``, ``n >= 2``; ``inf`` is ranked.
    samples
        Bootstrap resamples; 0 for the point estimates alone.
    seed
        Seed of the resampling (the same seed gives the same interval).
    level
        Coverage of the interval.

    Returns
    -------
    TauInterval
        The intervals are ``None`` for 2 pairs and where ``x`` or ``y`` is constant: a draw
        can only repeat the one pair or the ties, so the bootstrap would return the estimate.

    Raises
    ------
    ValueError
        Naming the argument, for NaN, unequal lengths, fewer than 2 pairs or bad settings.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be an integer >= 0, got {samples!r}")
    if not (isinstance(level, float) and 0 < level < 1):
        raise ValueError(f"level must be a float in (0, 1), got {level!r}")
    xs, ys = _paired(x, y)
    draws_a, draws_b = _resampled_taus(xs, ys, samples, np.random.default_rng(seed))
    informative = np.isfinite(draws_a)
    point = _point(xs, ys)
    if xs.size == 2 or point[1] is None:
        # every draw with a pair repeats the sample's one pair, or only its ties: the
        # "interval" would be the estimate itself, a certainty the data do not give
        return TauInterval(*point, None, None, None, None, int(xs.size), samples, level, seed)
    return TauInterval(*point, *_bounds(draws_a, informative, level),
                       *_bounds(draws_b, informative, level), int(xs.size), samples, level,
                       seed)


# A tau pooled over clusters (seeds): pairs are compared only within a cluster; each resample
# draws the clusters with replacement, then each drawn cluster's members, and averages their
# tau-b (resamples with a constant variable in some drawn cluster are left out). Draw protocol,
# so that a reference can replay it: ``rng = numpy.random.default_rng(seed)``; clusters in
# order of first appearance; per resample ``rng.integers(0, K, size=K)`` picks the clusters,
# then, for each pick in order, ``rng.integers(0, n, size=n)`` its members. A paired
# difference uses the same draws for both measures, so what they share cancels.
def _tau_b(xs: np.ndarray, ys: np.ndarray, idx: np.ndarray) -> float | None:
    """Tau-b of the resample ``idx`` of one cluster, without the pairs of two copies."""
    tau_b = _resample_taus(xs, ys, idx[None, :])[1][0]
    return None if np.isnan(tau_b) else float(tau_b)


#: one cluster: its x, shape=[n], and each y, shape=[n]
_Cluster = tuple[np.ndarray, list[np.ndarray]]


def _checked_values(x: Sequence[float], ys: Sequence[Sequence[float]],
                    clusters: Sequence[Hashable], n_boot: int
                    ) -> tuple[np.ndarray, list[np.ndarray], list[Hashable]]:
    """``x``, each of ``ys`` (float64, ``shape=[M]``) and the ``M`` labels, checked."""
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
    return xs, columns, labels


def _split_clusters(xs: np.ndarray, columns: list[np.ndarray],
                    labels: list[Hashable]) -> list[_Cluster]:
    """The clusters in order of first appearance; each of >= 2 models with a defined tau-b."""
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
    return groups


def _resample(groups: list[_Cluster], rng: np.random.Generator) -> list[list[float | None]]:
    """One two-stage resample (the protocol above): per drawn cluster, each ``y``'s tau-b."""
    picks = rng.integers(0, len(groups), size=len(groups))
    taus = []
    for pick in picks:
        cx, cys = groups[int(pick)]
        idx = rng.integers(0, cx.size, size=cx.size)
        taus.append([_tau_b(cx, cy, idx) for cy in cys])
    return taus


def _cluster_bootstrap(x: Sequence[float], ys: Sequence[Sequence[float]],
                       clusters: Sequence[Hashable], n_boot: int,
                       seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Pooled tau-b of ``x`` against each of ``ys``, ``shape=[len(ys)]``, and, with the same
    draws, those of the ``B <= n_boot`` resamples where all are defined, ``shape=[B, len(ys)]``."""
    xs, columns, labels = _checked_values(x, ys, clusters, n_boot)
    groups = _split_clusters(xs, columns, labels)
    points = np.asarray([np.mean([_tau_b(cx, cys[j], np.arange(cx.size)) for cx, cys in groups])
                         for j in range(len(columns))])
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n_boot):
        taus = _resample(groups, rng)
        if all(t is not None for row in taus for t in row):
            stats.append(np.mean(np.asarray(taus, dtype=np.float64), axis=0))
    if not stats:
        raise ValueError("every bootstrap resample had a constant variable in some cluster: "
                         "no interval (too few distinct values per cluster)")
    return points, np.asarray(stats)


def cluster_bootstrap_tau(x: Sequence[float], y: Sequence[float], clusters: Sequence[Hashable],
                          n_boot: int, seed: int) -> tuple[float, float, float]:
    """Mean within-cluster Kendall tau-b of ``x`` against ``y``, with a 95 % two-stage cluster
    bootstrap interval (the comment above :func:`_tau_b`: protocol and draws).

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
    """Holm's step-down adjusted p-values of ``p_values`` (``shape=[m]``, each in [0, 1]), in
    the input order: with the p-values sorted ascending, the ``k``-th (from 1) becomes ``max
    over j <= k of min(1, (m - j + 1) p_j)``."""
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


def sign_convention(generalisation: str) -> str:
    """The console's reading guide of a tau table; ``generalisation`` is what the taus rank
    sharpness against (``"test loss"``)."""
    return (f"Sign convention: Kendall tau between {generalisation} and sharpness. Positive "
            f"tau: sharpness and {generalisation} rank alike, sharper models generalise worse; "
            "negative tau: sharper models generalise better; near 0: no relation.")
