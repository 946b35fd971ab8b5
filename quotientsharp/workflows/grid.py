"""``quotientsharp study``: the grid of measures x radii x metrics and orders, each
:class:`GridPoint` one call of :func:`quotientsharp.sharpness` per model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows.labels import measure_label
from quotientsharp.workflows.options import (
    ASCENT_MEASURES,
    MeasureRun,
    SharpnessConfig,
    measure_runs,
    options_for,
    radius_text,
)

if TYPE_CHECKING:
    from quotientsharp.engine import MeasureSpec

#: ``GridPoint.symmetry`` where some manifest rows bind a symmetry of their own (measured with
#: their bindings' metric, the others with ``metric``).
ROWS_OWN = "rows' own"


def with_row_symmetries(grid: list[GridPoint], any_row_binds: bool) -> list[GridPoint]:
    """``grid`` with its geodesic points labelled for rows with their own symmetry (keys
    unchanged), where some row binds one and ``--symmetry`` is not given."""
    if not any_row_binds:
        return grid
    return [dataclasses.replace(point, symmetry=ROWS_OWN)
            if point.measure == "geodesic" and point.symmetry is None else point
            for point in grid]


@dataclass(frozen=True)
class GridPoint:
    """One measure with one radius (``None`` for relative flatness) and, for geodesic sharpness,
    one metric and order (``p``: ``"2"`` or ``"inf"`` of worst-case and adaptive sharpness).
    ``key`` names its CSV column and its plot ``scatter_{key}.png``; ``symmetry`` is
    ``--symmetry MODULE:FUNCTION``, whose bindings measure with their own quotients' metric."""

    key: str
    measure: str
    rho: float | None
    metric: str | None = None
    order: int | str | None = None
    p: str | None = None
    symmetry: str | None = None

    def label(self, greek: bool = True) -> str:
        """The readable name: measure, metric, order and radius."""
        metric = (self.metric if self.symmetry is None
                  else f"{self.metric} or a row's own symmetry's" if self.symmetry == ROWS_OWN
                  else f"{self.symmetry} bindings'")
        return measure_label(self.measure, metric=metric, order=self.order, rho=self.rho,
                             p=self.p, greek=greek)

    def spec(self, config: SharpnessConfig, symmetries: Sequence[Any] | None = None
             ) -> MeasureSpec:
        """The engine's typed measure of the point, for ``sharpness(model, batches, spec)``
        (without a progress bar of its own)."""
        from quotientsharp.engine import measure_from

        variant = {} if self.metric is None else {"metric": self.metric, "order": self.order}
        options = options_for(MeasureRun(self.key, self.measure, variant), config, symmetries)
        return measure_from(self.measure, self.rho, {**options, "progress": False})

    def as_dict(self) -> dict[str, Any]:
        """The point as plain JSON (``run.json``, ``taus.json``)."""
        point = {"key": self.key, "label": self.label(greek=False), "measure": self.measure,
                 "rho": self.rho, "metric": self.metric, "order": self.order, "p": self.p}
        if self.symmetry is not None:
            point["symmetry"] = self.symmetry
        return point


def _key(measure: str, rho: float | None, variant: dict[str, Any], p: str | None,
         symmetry: str | None = None) -> str:
    parts = [measure]
    if variant:
        # a user's symmetry measures with its own metric: "own", not the unused --metric
        metric = "own" if symmetry is not None else variant["metric"]
        parts.append(f"{metric}_order{variant['order']}")
    if p == "inf":
        parts.append("linf")
    if rho is not None:
        parts.append(f"rho{radius_text(rho)}")
    return "_".join(parts)


def build_grid(config: SharpnessConfig) -> list[GridPoint]:
    """The grid of the settings, ordered by measure (as given), metric and order, radius."""
    rhos: Sequence[float | None] = config.radii or [None]
    grid: list[GridPoint] = []
    for run in measure_runs(config):
        p = config.p if run.measure in ASCENT_MEASURES and run.measure != "geodesic" else None
        own = config.symmetry if run.measure == "geodesic" else None
        for rho in ([None] if run.measure == "relative_flatness" else rhos):
            grid.append(GridPoint(_key(run.measure, rho, run.variant, p, own), run.measure, rho,
                                  run.variant.get("metric"), run.variant.get("order"), p, own))
    return grid
