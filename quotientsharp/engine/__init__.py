"""Sharpness: average, worst-case, adaptive, geodesic and relative sharpness.

>>> from quotientsharp import sharpness
>>> result = sharpness(model, batches, measure="geodesic", rho=0.1, metric="inv", order=2)
>>> result = sharpness(model, batches, GeodesicSpec(rho=0.1, metric="inv", order=2))  # the same
>>> result.value, result.per_batch

:func:`sharpness` runs visible stages, each public and returning a typed object (``docs/
sharpness.md``, "The pipeline, stage by stage"): validation (a :class:`MeasureSpec`, or
:func:`measure_from` for the string form), discovery and layout (:class:`LayoutCoordinates`),
geometry (:func:`build_geometry` -> :class:`GeodesicBall`), the solver (:func:`ascend` on
:func:`perturbed_objective` -> :class:`AscentOutcome`), the measure per batch
(:class:`Measure`) and the result (:class:`SharpnessResult`). Solver quality and block-wise
sharpness: ``result.traces``, ``reference_solve=...`` (checked against the exact
:func:`trust_region_maximum` in the tests) and ``blockwise=True`` (:func:`plot_blocks`).
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
from quotientsharp.engine.layouts import NoSymmetryWarning, UnboundSymmetryWarning
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
           "PlainCoordinates", "ReachWarning", "SharpnessResult", "TrustRegionMaximum",
           "UnboundSymmetryWarning", "ascend",
           "blockwise", "build_geometry", "checkpoints", "perturbed_objective", "plot_blocks",
           "reference_settings", "resolve_loss", "sharpness", "split_batch",
           "trust_region_maximum"]
