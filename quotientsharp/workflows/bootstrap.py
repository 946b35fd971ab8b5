"""``quotientsharp study``: Kendall tau-a and tau-b with bootstrap intervals over the models.

The point estimates are :func:`~quotientsharp.workflows.taus.kendall_tau_a` and
:func:`~quotientsharp.workflows.taus.kendall_tau_b` (SciPy's, when installed). The interval
is the percentile bootstrap: the models are drawn with replacement ``resamples`` times (a
``numpy`` generator seeded with ``seed``: the same seed, the same draws, and the same draws for
every measure, so that intervals of different measures are paired), both taus are computed on
each draw and the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles are reported.

A draw holds a model several times; its copies tie with each other in both variables. Tau-a
counts tied pairs as zero, so its bootstrap distribution leans towards 0 (by about the share of
tied pairs, ``1/M`` for ``M`` models); tau-b corrects for ties and is the better-calibrated
interval. Draws on which tau-b is undefined (a constant variable) are left out of its interval.

Each draw is computed from the multiplicities ``c`` of the models (``shape=[M]``):
``S = c^T P c / 2`` with ``P_ij = sign(x_i - x_j) sign(y_i - y_j)`` is the tau numerator, and
``(c^T Z c - M) / 2`` with ``Z_ij = [x_i = x_j]`` counts the pairs tied in ``x``; so every draw
costs ``O(M^2)`` without forming the resampled data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["TauEstimate", "bootstrap_taus", "kendall_with_intervals"]


@dataclass(frozen=True)
class TauEstimate:
    """Kendall taus of one measure against the gap, with bootstrap intervals.

    Attributes
    ----------
    tau_a, tau_b
        On all models (``None``: undefined, a constant variable).
    tau_a_interval, tau_b_interval
        ``(low, high)`` bootstrap percentile intervals, or ``None`` (no resampling asked, fewer
        than 3 models, or no draw with the statistic defined).
    count
        Number of models (finite values) the taus use.
    resamples
        Bootstrap draws on which tau-b is defined (of those asked).
    confidence
        The intervals' nominal coverage.
    """

    tau_a: float | None
    tau_b: float | None
    tau_a_interval: tuple[float, float] | None
    tau_b_interval: tuple[float, float] | None
    count: int
    resamples: int
    confidence: float


def bootstrap_taus(x: Sequence[float], y: Sequence[float], resamples: int, seed: int,
                   chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Tau-a and tau-b on ``resamples`` bootstrap draws of the pairs ``(x_i, y_i)``.

    Returns
    -------
    tuple of numpy.ndarray
        ``tau_a`` and ``tau_b`` of every draw, ``shape=[resamples]``; tau-b is NaN on a draw
        where one variable is constant.
    """
    import numpy as np

    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    count = len(xs)
    with np.errstate(invalid="ignore"):
        sign_x = np.sign(xs[:, None] - xs[None, :])
        sign_y = np.sign(ys[:, None] - ys[None, :])
    # infinities: inf - inf is NaN; equal infinities tie, as in kendall_tau_a
    sign_x[np.isnan(sign_x)] = 0.0
    sign_y[np.isnan(sign_y)] = 0.0
    concordance = sign_x * sign_y
    tied_x, tied_y = (sign_x == 0).astype(np.float64), (sign_y == 0).astype(np.float64)
    generator = np.random.default_rng(seed)
    pairs = count * (count - 1) / 2
    tau_a, tau_b = np.empty(resamples), np.empty(resamples)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        counts = generator.multinomial(count, np.full(count, 1.0 / count),
                                       size=stop - start).astype(np.float64)
        numerator = 0.5 * np.einsum("bi,ij,bj->b", counts, concordance, counts)
        ties_x = 0.5 * (np.einsum("bi,ij,bj->b", counts, tied_x, counts) - count)
        ties_y = 0.5 * (np.einsum("bi,ij,bj->b", counts, tied_y, counts) - count)
        tau_a[start:stop] = numerator / pairs
        denominator = np.sqrt((pairs - ties_x) * (pairs - ties_y))
        with np.errstate(invalid="ignore", divide="ignore"):
            tau_b[start:stop] = np.where(denominator > 0, numerator / denominator, np.nan)
    return tau_a, tau_b


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float] | None:
    import numpy as np

    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    low, high = np.quantile(finite, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def kendall_with_intervals(x: Sequence[float], y: Sequence[float], *, resamples: int = 1000,
                           confidence: float = 0.95, seed: int = 0) -> TauEstimate:
    """Kendall tau-a and tau-b of ``(x, y)`` with percentile bootstrap intervals.

    Pairs with a NaN are left out (``count`` says how many remain); with fewer than 2 the taus
    are ``None``.

    Parameters
    ----------
    x, y
        The gap and a measure's values, one per model.
    resamples
        Bootstrap draws; 0 for no intervals.
    confidence
        Nominal coverage of the intervals, in ``(0, 1)``.
    seed
        Seed of the draws.
    """
    from quotientsharp.workflows.taus import kendall_tau_a, kendall_tau_b

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 0:
        raise ValueError(f"resamples must be >= 0, got {resamples}")
    pairs = [(float(a), float(b)) for a, b in zip(x, y, strict=True)
             if not (math.isnan(float(a)) or math.isnan(float(b)))]
    if len(pairs) < 2:
        return TauEstimate(None, None, None, None, len(pairs), 0, confidence)
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    tau_a, tau_b = kendall_tau_a(xs, ys), kendall_tau_b(xs, ys)
    if resamples == 0 or len(pairs) < 3:
        return TauEstimate(tau_a, tau_b, None, None, len(pairs), 0, confidence)
    draws_a, draws_b = bootstrap_taus(xs, ys, resamples, seed)
    import numpy as np

    return TauEstimate(tau_a, tau_b, _interval(draws_a, confidence),
                       _interval(draws_b, confidence), len(pairs),
                       int(np.isfinite(draws_b).sum()), confidence)
