"""Sharpness: average, worst-case, adaptive, geodesic and relative sharpness.

>>> from quotientsharp import sharpness
>>> result = sharpness(model, batches, measure="geodesic", rho=0.1, metric="inv", order=2)
>>> result = sharpness(model, batches, GeodesicSpec(rho=0.1, metric="inv", order=2))  # the same
>>> result.value, result.per_batch

:func:`sharpness` runs visible stages, each public and returning a typed object; every module
of this package belongs to one stage and says which, and what it may touch, in its docstring:

0. validation: the typed measures of :mod:`.registry` (:class:`MeasureSpec`:
   :class:`GeodesicSpec` and the others, frozen dataclasses that check their options when made,
   :func:`measure_from` for the string form, :data:`MEASURE_REGISTRY` by name), each building
   its :class:`Measure` (the checks of the options every measure shares: :mod:`.options`);
1. discovery: :func:`quotientsharp.find_symmetries` -> :class:`~quotientsharp.models.SymmetryReport`
   (or your own :class:`~quotientsharp.models.QuotientBinding`), :mod:`.layouts`;
2. layout: :class:`~quotientsharp.models.ParameterLayout`, and the factors of the product
   quotient, :class:`LayoutCoordinates` (:mod:`.coordinates`);
3. geometry: :func:`build_geometry` -> :class:`GeodesicBall`, the product quotient frozen at
   ``theta`` with the radius (:mod:`.geometry`, :mod:`.ball`), built once before the batch loop
   as an :class:`~.geometry.AscentSpace` (its one per-batch step, the touched rows of
   embedding tables, is :meth:`~.geometry.AscentSpace.on_touched_rows`);
4. solver: :func:`ascend` on :func:`perturbed_objective` -> :class:`AscentOutcome`
   (:mod:`.solver`, one loop, and where its decisions are read), over any
   :class:`AscentGeometry`;
5. measure and result: a :class:`Measure` per batch (:mod:`.measures`), then
   :class:`SharpnessResult` (:mod:`.result`).

Solver quality and block-wise sharpness (ascent measures): ``result.traces`` (the best loss per
iteration), ``reference_solve=...`` (a stronger second solve and its gap, checked against the
exact :func:`trust_region_maximum` in the tests), ``blockwise=True`` (:mod:`.blocks`: norm share
and loss change per block, drawn by :func:`plot_blocks`).
"""

from quotientsharp.engine.api import MEASURES, SharpnessResult, sharpness
from quotientsharp.engine.ball import BoxGeometry, GeodesicBall
from quotientsharp.engine.batches import resolve_loss, split_batch
from quotientsharp.engine.blocks import Block, BlockOutcome, blockwise, plot_blocks
from quotientsharp.engine.coordinates import (
           BoundCoordinates,
           Factor,
           LayoutCoordinates,
           PlainCoordinates,
)
from quotientsharp.engine.exact import TrustRegionMaximum, trust_region_maximum
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.engine.geometry import build_geometry, perturbed_objective
from quotientsharp.engine.layouts import NoSymmetryWarning
from quotientsharp.engine.measures import Measure, NonFiniteLossError
from quotientsharp.engine.registry import (
           MEASURE_REGISTRY,
           AdaptiveSpec,
           AverageSpec,
           GeodesicSpec,
           MeasureSpec,
           RelativeFlatnessSpec,
           WorstCaseSpec,
           measure_from,
           reference_settings,
)
from quotientsharp.engine.result import ReachWarning
from quotientsharp.engine.solver import (
           AscentGeometry,
           AscentOutcome,
           AscentSettings,
           CompiledSteps,
           HandedOver,
           ascend,
           checkpoints,
)

__all__ = ["MEASURES", "MEASURE_REGISTRY", "AscentGeometry", "AscentOutcome", "AscentSettings",
           "Block", "BlockOutcome", "BoundCoordinates", "BoxGeometry", "CompiledSteps", "Factor",
           "FunctionalModel", "GeodesicBall", "HandedOver", "LayoutCoordinates", "Measure",
           "MeasureSpec", "AdaptiveSpec", "AverageSpec", "GeodesicSpec", "RelativeFlatnessSpec",
           "WorstCaseSpec", "measure_from", "NoSymmetryWarning", "NonFiniteLossError",
           "PlainCoordinates",
           "ReachWarning",
           "SharpnessResult",
           "TrustRegionMaximum", "ascend", "blockwise", "build_geometry", "checkpoints",
           "perturbed_objective", "plot_blocks", "reference_settings", "resolve_loss",
           "sharpness", "split_batch", "trust_region_maximum"]
