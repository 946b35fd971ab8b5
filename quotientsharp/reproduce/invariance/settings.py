"""What the invariance study measures and in which precisions (its variants :data:`FULL` and
:data:`QUICK`), and one precision's run: read by :mod:`.study`, :mod:`.report` and
``reproduce.config`` (torch-free)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MEASURES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("adaptive", "adaptive", {"measure": "adaptive"}),
    ("worst_case", "worst-case (L2)", {"measure": "worst_case"}),
    *((f"geodesic_{metric}_o{order}", f"geodesic {metric} (order {order})",
       {"measure": "geodesic", "metric": metric, "order": order})
      for metric in ("inv", "mix") for order in (1, 2)),
)
#: Precisions of the model (weights and forward); the geometry runs in float64 for a float64
#: model and in float32 otherwise (its h x h algebra in float64).
DTYPES = ("float64", "float32", "bfloat16")
RHO = 0.1


@dataclass(frozen=True)
class InvarianceSettings:
    """One variant of the study: orbit scales ``a``, sentences, Auto-PGD steps, and the keys of
    :data:`MEASURES` to run."""

    grid: tuple[float, ...]
    sentences: int
    n_iter: int
    measures: tuple[str, ...] = tuple(key for key, _, _ in MEASURES)

    def __post_init__(self) -> None:
        check_measures(self.measures)
        if not self.grid or any(not (a > 0 and math.isfinite(a)) for a in self.grid):
            raise ValueError(f"grid must hold finite scales a > 0, got {list(self.grid)}")

    def selected(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The entries of :data:`MEASURES` this variant runs."""
        return [entry for entry in MEASURES if entry[0] in self.measures]

    def as_dict(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "sentences": self.sentences, "n_iter": self.n_iter}


def check_measures(measures: Sequence[str]) -> None:
    """``ValueError`` unless ``measures`` is a non-empty subset of the keys of :data:`MEASURES`."""
    known = [key for key, _, _ in MEASURES]
    if not measures or not set(measures) <= set(known):
        raise ValueError(f"measures must be a non-empty subset of {known}, got "
                         f"{list(measures)}")


def log_grid(low: float, high: float, points: int) -> tuple[float, ...]:
    """``points`` values ``10^t``, ``t`` evenly spaced from ``log10 low`` to ``log10 high``."""
    start, stop = math.log10(low), math.log10(high)
    return tuple(float(10 ** (start + (stop - start) * k / (points - 1)))
                 for k in range(points))


FULL = InvarianceSettings(grid=log_grid(1e-2, 1e2, 9), sentences=8, n_iter=8)
QUICK = InvarianceSettings(grid=log_grid(1e-2, 1e2, 3), sentences=4, n_iter=2,
                           measures=("adaptive", "geodesic_inv_o2", "geodesic_mix_o2"))


def parse_dtypes(text: str | Sequence[str]) -> tuple[str, ...]:
    """The model precisions ``"float64,float32"`` (or a sequence of names), checked."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    if not names or any(not isinstance(n, str) or not n for n in names):
        raise ValueError(f"dtypes must be a comma-separated list of {', '.join(DTYPES)}, "
                         f"got {text!r}")
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise ValueError(f"dtypes: unknown precision(s) {unknown}; choose from "
                         f"{', '.join(DTYPES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"dtypes: a precision is listed twice in {text!r}")
    return tuple(names)


@dataclass
class DtypeRun:
    """One precision's run of the study (:func:`.study._dtype_study`)."""

    original: dict[str, Any]
    points: list[dict[str, Any]]
    computed_now: list[int]
    wall: float
    resumed: int
    world_size: int
