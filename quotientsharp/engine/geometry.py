"""Geometry stage: the space an ascent runs in, built once per call before the batch loop.

:func:`build_geometry` freezes the product quotient of a layout's :class:`~.coordinates.Factor` s
at ``theta`` as a :class:`~.ball.GeodesicBall`; an :class:`AscentSpace` pairs the feasible set
with the coordinates that map its points to parameters, built by a plan (:class:`PlainGeometry`,
:class:`GeodesicGeometry`) once batch 0 has told which parameters receive no gradient.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quotientsharp.core.adaptive import AdaptiveQuotient
from quotientsharp.core.frozen import check_order
from quotientsharp.core.method_checks import DegeneratePointError, QuotientMethodError, diagnose
from quotientsharp.core.product import ProductPoint, ProductQuotient
from quotientsharp.core.quotient import ClosedFormQuotient
from quotientsharp.core.validation import value_checks
from quotientsharp.engine.ball import BoxGeometry, GeodesicBall
from quotientsharp.engine.batches import Batch
from quotientsharp.engine.coordinates import (
    BoundCoordinates,
    Factor,
    LayoutCoordinates,
    PlainCoordinates,
)
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.engine.touched_rows import RestrictedTable, TouchedRowCoordinates
from quotientsharp.models.symmetry_check import SymmetryCheckError, spread_point

OTHER_PATHS = ("line", "geodesic")


def _culprits(factor: Factor) -> str:
    """`` (pairs ...)``: the folded entries whose Gram matrices are singular to rounding."""
    if not factor.labels or factor.folded != 1:
        return ""
    bad: set[int] = set()
    for tensor in factor.base:
        values = torch.linalg.eigvalsh(tensor.mT @ tensor)
        limit = 8 * tensor.shape[-1] * torch.finfo(values.dtype).eps
        singular = values[..., 0] <= limit * values[..., -1].clamp_min(0)
        bad.update(singular.nonzero().flatten().tolist())
    names = [factor.labels[i] for i in sorted(bad)]
    return f" (pairs {names[:5]})" if names else ""


def build_geometry(factors: Sequence[Factor], radius: float, order: int | str = 1,
                   exact_steps: int = 16, finite_checked: bool = False) -> GeodesicBall:
    """The ball ``||xi||_theta <= radius`` of the product of ``factors`` at their base points.

    Parameters
    ----------
    factors
        The layout's factors (quotient, base point, folded dimensions, label).
    radius
        ``rho``.
    order
        ``1``, ``2`` or ``"exact"``: the path of every curved factor.
    exact_steps
        RK4 steps of exact geodesics without a closed form (attention pairs).
    finite_checked
        The parameters were checked for NaN and inf already (the functional model does): the
        trivial-group factors, which are the parameters themselves, are not read again.

    Raises
    ------
    ValueError
        If a factor's base point is degenerate for its metric (a rank-deficient attention
        factor with ``eps = 0``, a zero diagonal coordinate), naming the factor and, for
        attention, the heads.
    """
    order = check_order(order)
    factors = list(factors)
    if not factors:
        raise ValueError("the geometry has no coordinates to perturb")
    product = ProductQuotient([f.quotient for f in factors], [f.folded for f in factors],
                              [f.name for f in factors])
    for factor in factors:
        # the factor of the parameters outside any symmetry is the parameters themselves: when
        # the caller has checked them for NaN and inf, reading all of them again is skipped
        skip = finite_checked and isinstance(factor.quotient, AdaptiveQuotient)
        try:
            with value_checks(False) if skip else contextlib.nullcontext():
                factor.quotient.check_point(factor.base, "x")
        except ValueError as err:
            shapes = ", ".join(str(tuple(t.shape)) for t in factor.base)
            raise ValueError(f"{factor.name} block ({factor.quotient.name}, shapes "
                             f"{shapes}){_culprits(factor)}: {err}") from err
    base = tuple(t for factor in factors for t in factor.base)
    try:
        frozen = product.frozen_point(base)
    except ValueError as err:
        culprits = "".join(_culprits(f) for f in factors)
        raise ValueError(f"the symmetry geometry at theta is degenerate{culprits}: {err}") from err
    # a product's frozen point has one part per factor
    assert isinstance(frozen, ProductPoint)
    for factor, part in zip(factors, frozen.factors, strict=True):
        if isinstance(factor.quotient, ClosedFormQuotient):
            continue
        # a user's quotient has no validation of its own beyond check_point: one projection at
        # theta finds a degenerate orbit now, named, rather than inside the ascent
        _check_user_factor(factor, part)
    orders = [order if f.curved else 1 for f in factors]
    return GeodesicBall(frozen, radius, orders, steps=exact_steps)


def _check_user_factor(factor: Factor, part: Any) -> None:
    """One projection at theta, and the methods' outputs on the units of the factor's point
    (:func:`~quotientsharp.core.method_checks.diagnose` on
    :func:`~quotientsharp.models.symmetry_check.spread_point`): a malformed method or a metric
    that is not positive definite is named here, and told apart from a degenerate orbit, rather
    than failing inside the ascent."""
    base = tuple(t.detach() for t in factor.base)
    try:
        diagnose(factor.quotient, spread_point(base, factor.folded) or base)
        part.horizontal_projection(tuple(torch.zeros_like(t) for t in factor.base))
    except QuotientMethodError as err:
        # a method of the user's class is wrong: the binding's failure, as the other checks'
        raise SymmetryCheckError(f"{factor.name} block: {err}") from err
    except DegeneratePointError as err:
        # its message says what is degenerate already
        raise ValueError(f"{factor.name} block: at theta, {err}") from err
    except (ValueError, RuntimeError) as err:
        raise ValueError(f"{factor.name} block ({factor.quotient.name}): the geometry is "
                         f"degenerate at theta (e.g. a zero unit or factor): {err}") from err


Tensors = tuple[torch.Tensor, ...]
Objective = Callable[[Tensors], tuple[torch.Tensor, Tensors]]
#: The layout's coordinates of a full space (a touched-row space has its own).
Coordinates = PlainCoordinates | LayoutCoordinates | BoundCoordinates


def perturbed_objective(model: FunctionalModel, coordinates: Any, geometry: Any,
                        batch: Batch) -> Objective:
    """``xi -> (L(theta'), dL/dxi)``: the solver's objective on one batch.

    ``theta'`` is the end of the geometry's path along ``xi`` (``geometry.point``), mapped to
    parameters by the layout (``coordinates.updates``); the gradient flows back through both.
    Parameters the loss does not reach get a zero gradient.
    """

    def objective(xi: Tensors) -> tuple[torch.Tensor, Tensors]:
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            loss = model.loss(batch, coordinates.updates(geometry.point(leaves)))
            raw: Sequence[torch.Tensor | None] = (
                torch.autograd.grad(loss, leaves, allow_unused=True) if loss.requires_grad
                else (None,) * len(leaves))
        grads = tuple(torch.zeros_like(leaf) if g is None else g
                      for leaf, g in zip(leaves, raw, strict=True))
        return loss.detach(), grads

    return objective


@dataclass
class AscentSpace:
    """A feasible set (the ball or box the solver maximises over) and the coordinates that
    map its points to parameters by name."""

    geometry: GeodesicBall | BoxGeometry
    coordinates: Coordinates

    def objective(self, model: FunctionalModel, batch: Batch) -> Objective:
        """The solver's objective on ``batch`` (:func:`perturbed_objective`)."""
        return perturbed_objective(model, self.coordinates, self.geometry, batch)

    def gradient_at_zero(self, gradients: Mapping[str, torch.Tensor | None]) -> Tensors:
        """The gradient in ``xi`` at ``xi = 0`` from the gradients in the parameters (``None``:
        nothing): the chain rule through the cheap map ``xi -> parameters``, not the model."""
        leaves = tuple(t.detach().requires_grad_(True) for t in self.geometry.zeros())
        with torch.enable_grad():
            # at xi = 0 every path has the line's Jacobian, the identity (``line``): the same
            # gradient without the order-2 term's products and their backward
            moved = self.coordinates.updates(self.geometry.line(leaves))
            pairs = [(moved[n], g) for n, g in gradients.items()
                     if g is not None and n in moved and moved[n].requires_grad]
            grads: Sequence[torch.Tensor | None] = (
                torch.autograd.grad([t for t, _ in pairs], leaves,
                                    grad_outputs=[g for _, g in pairs], allow_unused=True)
                if pairs else (None,) * len(leaves))
        return tuple(torch.zeros_like(leaf) if g is None else g
                     for leaf, g in zip(leaves, grads, strict=True))

    def parameters(self, xi: Sequence[torch.Tensor]) -> dict[str, Any]:
        """The perturbed parameters at ``xi`` by name (no gradient)."""
        with torch.no_grad():
            return self.coordinates.updates(self.geometry.point(tuple(xi)))

    def on_touched_rows(self, model: FunctionalModel, rows: Mapping[str, torch.Tensor]
                        ) -> TouchedSpace | None:
        """This space with each table of ``rows`` cut to those rows; ``None`` where no table can
        be cut (not in the diagonal-metric factor, or the geometry cannot)."""
        # first every table's slot in the diagonal-metric factor, then the cut tables
        slots = {name: self.coordinates.other_slot(name) for name in rows}
        tables = {name: RestrictedTable.of(slot, model.tables[name], rows[name],
                                           model.theta_geometry[name].shape)
                  for name, slot in slots.items() if slot is not None}
        if not tables:
            return None
        try:
            ball = self.geometry.on_rows({t.slot: t.rows for t in tables.values()})
        except (NotImplementedError, ValueError):
            return None
        return TouchedSpace(ball, TouchedRowCoordinates(self.coordinates, tables))


@dataclass
class TouchedSpace:
    """An :class:`AscentSpace` cut to the rows of the embedding tables a batch touches."""

    geometry: GeodesicBall | BoxGeometry
    coordinates: TouchedRowCoordinates

    def objective(self, model: FunctionalModel, batch: Batch) -> Objective:
        """The solver's objective on ``batch``, on the rows (:func:`perturbed_objective`)."""
        return perturbed_objective(model, self.coordinates, self.geometry, batch)


def plain_coordinates(model: FunctionalModel, excluded: set[str]) -> PlainCoordinates:
    """Every trainable parameter but ``excluded``, each its own coordinate."""
    names = [n for n in model.trainable if n not in excluded]
    if not names:
        raise ValueError("no parameter is left to perturb")
    return PlainCoordinates(model, names)


@dataclass(frozen=True)
class PlainGeometry:
    """The worst-case geometry: an L2 ball (``p = 2``) or an L-infinity box (``p = inf``),
    with ``c = |theta|`` (``adaptive``) or ``c = 1``."""

    radius: float
    p: float
    adaptive: bool

    def build(self, model: FunctionalModel, excluded: set[str]) -> AscentSpace:
        coordinates = plain_coordinates(model, excluded)
        if math.isinf(self.p):
            scale = [w.abs() if self.adaptive else torch.ones_like(w) for w in coordinates.base]
            return AscentSpace(BoxGeometry(coordinates.base, scale, self.radius), coordinates)
        factors = coordinates.factors(other_metric="adaptive" if self.adaptive else "euclidean")
        return AscentSpace(build_geometry(factors, self.radius, order=1, finite_checked=True),
                           coordinates)


@dataclass(frozen=True)
class GeodesicGeometry:
    """The geodesic geometry over ``symmetries`` (``None``, a layout or a list of bindings);
    the other fields are the options of geodesic sharpness."""

    radius: float
    symmetries: Any
    metric: str
    order: int | str
    eps: float
    exact_steps: int
    other_metric: str
    other_path: str

    def build(self, model: FunctionalModel, excluded: set[str]) -> AscentSpace:
        coordinates: PlainCoordinates | LayoutCoordinates | BoundCoordinates
        if self.symmetries is None:
            coordinates = plain_coordinates(model, excluded)
        elif isinstance(self.symmetries, list):
            coordinates = BoundCoordinates(model, self.symmetries, excluded)
        else:
            coordinates = LayoutCoordinates(model, self.symmetries, excluded)
        factors = coordinates.factors(metric=self.metric, eps=self.eps,
                                      other_metric=self.other_metric,
                                      other_path=self.other_path)
        return AscentSpace(build_geometry(factors, self.radius, self.order, self.exact_steps,
                                          finite_checked=True), coordinates)


#: How to build an :class:`AscentSpace` once the parameters without gradient are known.
GeometryPlan = PlainGeometry | GeodesicGeometry
