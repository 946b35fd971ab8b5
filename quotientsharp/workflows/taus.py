"""Kendall rank correlations between generalisation and sharpness, and how to read them.

:func:`kendall_tau_a` is the statistic the paper reports (our implementation);
:func:`kendall_tau_b` is SciPy's ``kendalltau`` when SciPy is installed, otherwise
:func:`kendall_tau_b_reference`, our own tie-corrected implementation. :func:`tau_table`
formats taus next to the paper's, :func:`sign_convention` says how to read their sign. The
bootstrap intervals are in :mod:`quotientsharp.workflows.tau_intervals` (one or several
samples) and :mod:`quotientsharp.workflows.bootstrap` (the study's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "TauRow",
    "kendall_tau_a",
    "kendall_tau_b",
    "kendall_tau_b_reference",
    "sign_convention",
    "tau_table",
]


def _check_pairs(x: Sequence[float], y: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = [float(value) for value in x]
    ys = [float(value) for value in y]
    if len(xs) != len(ys):
        raise ValueError(f"x and y must have the same length, got {len(xs)} and {len(ys)}")
    if len(xs) < 2:
        raise ValueError(f"Kendall tau needs at least 2 pairs, got {len(xs)}")
    for name, values in (("x", xs), ("y", ys)):
        bad = [i for i, value in enumerate(values) if math.isnan(value)]
        if bad:
            raise ValueError(f"{name} contains NaN at positions {bad[:5]}: rank it or drop it "
                             "first")
    return xs, ys


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def _pair_counts(xs: list[float], ys: list[float]) -> tuple[int, int, int, int]:
    """``(sum_{i<j} sign(dx) sign(dy), pairs, pairs tied in x, pairs tied in y)``."""
    total = tied_x = tied_y = 0
    count = len(xs)
    for i in range(count):
        for j in range(i + 1, count):
            sx, sy = _sign(xs[i] - xs[j]), _sign(ys[i] - ys[j])
            total += sx * sy
            tied_x += sx == 0
            tied_y += sy == 0
    return total, count * (count - 1) // 2, tied_x, tied_y


def kendall_tau_a(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall tau-a: ``2 / (M (M - 1)) sum_{i<j} sign(x_i - x_j) sign(y_i - y_j)``.

    Ties count zero and are not corrected for (unlike tau-b, SciPy's default). ``inf`` values
    are ranked (two equal infinities tie); NaN is rejected.
    """
    xs, ys = _check_pairs(x, y)
    total, pairs, _, _ = _pair_counts(xs, ys)
    return total / pairs


def kendall_tau_b_reference(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall tau-b, our implementation: ``S / sqrt((P - T_x)(P - T_y))``.

    ``S`` is the tau-a numerator, ``P = M (M - 1) / 2`` the number of pairs, ``T_x`` and ``T_y``
    the pairs tied in ``x`` and in ``y``. ``None`` when one of the variables is constant (the
    statistic is undefined there).
    """
    xs, ys = _check_pairs(x, y)
    total, pairs, tied_x, tied_y = _pair_counts(xs, ys)
    if tied_x == pairs or tied_y == pairs:
        return None
    return total / math.sqrt((pairs - tied_x) * (pairs - tied_y))


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall tau-b (scipy's default variant): ``scipy.stats.kendalltau`` when SciPy is
    installed, otherwise :func:`kendall_tau_b_reference`. ``None`` for a constant variable."""
    xs, ys = _check_pairs(x, y)
    if len(set(xs)) == 1 or len(set(ys)) == 1:
        return None
    try:
        from scipy.stats import kendalltau
    except ImportError:
        return kendall_tau_b_reference(xs, ys)
    return float(kendalltau(xs, ys).statistic)


@dataclass(frozen=True)
class TauRow:
    """One line of a tau table: our tau-a and tau-b for a measure, the paper's value if any."""

    measure: str
    tau_a: float | None
    tau_b: float | None
    paper: float | None = None
    note: str = ""


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:+.{digits}f}"


def tau_table(rows: Sequence[TauRow], digits: int = 2) -> str:
    """A markdown table ``measure | tau-a | tau-b | paper | note``."""
    lines = ["| measure | Kendall tau-a (ours) | Kendall tau-b (ours) | paper | note |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.measure} | {_fmt(row.tau_a, digits)} | {_fmt(row.tau_b, digits)} "
                     f"| {_fmt(row.paper, digits)} | {row.note} |")
    return "\n".join(lines)


def sign_convention(generalisation: str) -> str:
    """The console's reading guide of a tau table.

    Parameters
    ----------
    generalisation
        What the taus rank sharpness against (``"test loss"``, ``"the generalisation gap"``).
    """
    return (f"Sign convention: Kendall tau between {generalisation} and sharpness. Positive "
            f"tau: sharpness and {generalisation} rank alike, sharper models generalise worse; "
            "negative tau: sharper models generalise better; near 0: no relation.")
