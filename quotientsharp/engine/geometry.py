"""The geometry stage of the engine: the product of the layout's factors, frozen at ``theta``.

Stage: geometry (run once per call, from :mod:`.space`). It touches the layout's factors and the
quotient classes of :mod:`quotientsharp.core`; no model, no batch, no solver.

:func:`build_geometry` takes the :class:`~.coordinates.Factor` list of a layout, forms the
:class:`~quotientsharp.core.product.ProductQuotient` of their quotients, freezes it at ``theta``
(every factorisation that depends on ``theta`` alone is done here, once) and returns the
:class:`~.ball.GeodesicBall` of radius ``rho`` that the solver maximises over. Every operation
the ascent runs is a method of the quotient classes, the same code that
:func:`quotientsharp.core.checks.check_all` verifies against autograd.

The metric of the product is the sum of the factors' metrics, so squared norms add; the path
from ``theta`` is each factor's geodesic at the requested order (a straight line for factors
that are not ``curved``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from quotientsharp.core.adaptive import AdaptiveQuotient
from quotientsharp.core.frozen import check_order
from quotientsharp.core.product import ProductPoint, ProductQuotient
from quotientsharp.core.quotient import ClosedFormQuotient
from quotientsharp.core.validation import value_checks
from quotientsharp.engine.ball import GeodesicBall
from quotientsharp.engine.coordinates import Factor

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
        try:
            part.horizontal_projection(tuple(torch.zeros_like(t) for t in factor.base))
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"{factor.name} block ({factor.quotient.name}): the geometry is "
                             f"degenerate at theta (e.g. a zero unit or factor): {err}") from err
    orders = [order if f.curved else 1 for f in factors]
    return GeodesicBall(frozen, radius, orders, steps=exact_steps)


__all__ = ["OTHER_PATHS", "build_geometry"]
