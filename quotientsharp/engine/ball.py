"""Geometry stage: the feasible sets of the ascent, a geodesic ball or an L-infinity box.

Both satisfy :class:`~.solver.AscentGeometry` and touch only a frozen point of a quotient and
tangent tuples. :class:`GeodesicBall` is ``{xi horizontal at theta : ||xi||_theta <= rho}``
for any frozen point (a product over a network, one quotient, a stack of problems);
:class:`BoxGeometry` is ``|delta / c| <= rho``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from functools import cached_property

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core.adaptive import safe_reciprocal
from quotientsharp.core.frozen import FrozenPoint
from quotientsharp.engine.solver import ON_DEVICE, Decisions, Tensors, lift

Order = int | str


class GeodesicBall:
    """The ball of radius ``radius`` in the horizontal space at a frozen point.

    Parameters
    ----------
    frozen
        The frozen base point (``quotient.at(theta)``).
    radius
        ``rho``; a number, or a tensor of ``shape=problem_shape``.
    order
        Path from the base point: ``1``, ``2`` or ``"exact"``; for a product, optionally one
        per factor.
    steps
        RK4 steps of exact geodesics without a closed form.
    problem_shape
        Leading shape of independent problems (``()``: one problem). Tangent vectors have it as
        their leading shape; norms have ``shape=problem_shape``.
    """

    def __init__(self, frozen: FrozenPoint, radius: float | torch.Tensor,
                 order: Order | Sequence[Order] = 1, steps: int = 16,
                 problem_shape: Sequence[int] = ()) -> None:
        self.frozen = frozen
        self.base: Tensors = frozen.x
        if not self.base:
            raise ValueError("the geometry has no coordinates to perturb")
        self.radius = radius if isinstance(radius, torch.Tensor) else float(radius)
        self.order = order
        self.steps = int(steps)
        self.problem_shape = tuple(int(s) for s in problem_shape)
        #: :meth:`direction` returns new tensors: the solver may overwrite them
        self.new_directions = True
        self.dtype = self.base[0].dtype
        self.device = self.base[0].device

    def validate(self) -> None:
        """Up-front checks on values (host syncs): paths that may leave the manifold."""
        radius = self.radius
        if isinstance(radius, torch.Tensor):
            radius = float(radius.max())
        # a product's frozen point takes one order per factor; FrozenPoint (core) names one
        self.frozen.check_ball(radius, self.order)  # type: ignore[arg-type]
        self.frozen.factorise()     # now, so that the ascent loop never waits for the device

    def on_rows(self, rows: dict[int, torch.Tensor]) -> GeodesicBall:
        """The same ball for tangent vectors that vanish outside ``rows[i]`` of tensor ``i``,
        with those tensors cut to their rows (the frozen point's ``on_rows``)."""
        return GeodesicBall(self.frozen.on_rows(rows), self.radius, self.order, self.steps,
                            self.problem_shape)

    def with_radius(self, radius: float | torch.Tensor) -> GeodesicBall:
        """The same ball at another radius (sharing the frozen point and its factorisations)."""
        ball = copy.copy(self)
        ball.radius = radius if isinstance(radius, torch.Tensor) else float(radius)
        return ball

    def zeros(self) -> Tensors:
        shapes = []
        for t, k in zip(self.base, self.frozen.point_ndims, strict=True):
            batch = torch.broadcast_shapes(t.shape[:t.dim() - k], self.problem_shape)
            shapes.append((*batch, *t.shape[t.dim() - k:]))
        return tuple(torch.zeros(s, dtype=t.dtype, device=t.device)
                     for s, t in zip(shapes, self.base, strict=True))

    def norm(self, xi: Sequence[torch.Tensor]) -> torch.Tensor:
        """``||xi||_theta``, ``shape=problem_shape``."""
        return self.frozen.norm(tuple(xi))

    def block_norms(self, xi: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{"total": ||xi||}`` and, for a product, the norm per factor label."""
        named = getattr(self.frozen, "named_norms", None)
        return named(tuple(xi)) if named is not None else {"total": self.norm(xi)}

    def _scale(self, xi: Sequence[torch.Tensor], factor: torch.Tensor,
               fresh: bool = False) -> Tensors:
        """``xi`` times ``factor`` (``shape=problem_shape``); in place where ``fresh``."""
        if fresh:
            # the same products written into xi: no parameter-sized allocation
            if factor.dim() == 0:
                torch._foreach_mul_(list(xi), factor)
            else:
                for t in xi:
                    t.mul_(lift(factor, t))
            return tuple(xi)
        if factor.dim() == 0:
            return T.fused_mul(tuple(xi), factor)
        return tuple(lift(factor, t) * t for t in xi)

    def point(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``gamma_xi(1)``: the perturbed parameters in the quotient's coordinates."""
        # a product's frozen point takes one order per factor; FrozenPoint (core) names one
        return self.frozen.geodesic(tuple(xi), 1.0, self.order,  # type: ignore[arg-type]
                                    self.steps)

    @property
    def orders(self) -> list[Order]:
        """The path order of each factor (one entry where the ball has a single order)."""
        order = self.order
        return list(order) if isinstance(order, (list, tuple)) else [order]  # type: ignore[list-item]

    @property
    def extrapolates(self) -> bool:
        """Whether some factor follows the order-2 Taylor path (the approximation of its
        geodesic that :meth:`exact_point` checks)."""
        return 2 in self.orders

    def exact_point(self, xi: Sequence[torch.Tensor], steps: int | None = None) -> Tensors:
        """``gamma_xi(1)`` with every order-2 factor on its exact geodesic instead (closed form,
        or RK4 of ``steps`` steps, by default the ball's), the other factors on their own
        path: the point the order-2 path approximates."""
        exact: list[Order] = ["exact" if o == 2 else o for o in self.orders]
        orders = exact if isinstance(self.order, (list, tuple)) else exact[0]
        return self.frozen.geodesic(tuple(xi), 1.0, orders,  # type: ignore[arg-type]
                                    self.steps if steps is None else steps)

    def line(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``theta + xi`` in the quotient's coordinates: the path of order 1.

        Every path of the ball starts at ``theta`` with velocity ``xi`` (``gamma(0) = theta``,
        ``gamma'(0) = xi``; the order-2 term is quadratic in ``xi``), so its Jacobian at
        ``xi = 0`` is the identity, as the line's is: a gradient at ``xi = 0`` may be taken
        through the line, without the path's second-order term and its backward.
        """
        return self.frozen.geodesic(tuple(xi), 1.0, 1, self.steps)

    def clip(self, xi: Sequence[torch.Tensor], decisions: Decisions = ON_DEVICE,
             fresh: bool = False) -> Tensors:
        """``P_S`` of a vector that is horizontal already: the radial rescale into the ball.

        With ``decisions`` on the host (:class:`~.solver.OnHost`) a rescale by exactly 1 (``xi``
        inside the ball) is skipped, where the test is free; the values are the same.
        ``fresh``: the caller made ``xi`` and holds no other reference to it, so it is
        rescaled in place (same values, no new parameter-sized tuple).
        """
        norm = self.norm(xi)
        factor = (self.radius / norm.clamp_min(torch.finfo(norm.dtype).tiny)).clamp(max=1.0)
        if (decisions.skips_unit_rescale and factor.dim() == 0
                and factor.device.type == "cpu" and bool(factor == 1.0)):
            return tuple(xi)
        return self._scale(xi, factor, fresh)

    def project(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``P_S``: horizontal projection, then the radial rescale."""
        return self.clip(self.frozen.horizontal_projection(tuple(xi)))

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        """The Riemannian gradient (raised, then projected) normalised by its norm."""
        # the gradient and its norm in one call: a metric may get the norm on the way
        rgrad, squared = self.frozen.riemannian_gradient_and_squared_norm(tuple(egrad))
        norm = squared.sqrt().clamp_min(torch.finfo(self.dtype).tiny)
        if torch.compiler.is_compiling():
            # a graph makes new tensors anyway (and cannot read storage addresses)
            return tuple(t / lift(norm, t) for t in rgrad)
        # the gradient's new tensors are divided in place (same values, no new tuple); one
        # that is the gradient's own tensor or a view is divided into a new one, so that a
        # gradient the caller lent is never written
        lent = {e.untyped_storage().data_ptr() for e in egrad}
        mine = [self.frozen.new_gradients and t._base is None and not t.requires_grad
                and t.untyped_storage().data_ptr() not in lent for t in rgrad]
        if norm.dim() == 0:
            owned = [t for t, m in zip(rgrad, mine, strict=True) if m]
            if owned:
                torch._foreach_div_(owned, norm)
            others = iter(T.fused_div([t for t, m in zip(rgrad, mine, strict=True) if not m],
                                      norm))
            return tuple(t if m else next(others) for t, m in zip(rgrad, mine, strict=True))
        return tuple(t.div_(lift(norm, t)) if m else t / lift(norm, t)
                     for t, m in zip(rgrad, mine, strict=True))

    def random_start(self, generator: torch.Generator | None) -> Tensors:
        """Horizontal projection of a metric-isotropic Gaussian, radius ``rho * U(0, 1)``."""
        direction = self.frozen.horizontal_projection(self.frozen.isotropic(generator))
        if self.problem_shape:
            direction = tuple(d + z for d, z in zip(direction, self.zeros(), strict=True))
        radius = self.radius * torch.rand(self.problem_shape, generator=generator,
                                          dtype=self.dtype, device=self.device)
        norm = self.norm(direction).clamp_min(torch.finfo(self.dtype).tiny)
        return self._scale(direction, radius / norm)


class BoxGeometry:
    """The L-infinity ball ``|delta / c| <= rho`` (elementwise) around the parameters.

    Straight lines only; the ascent direction is ``c * sign(gradient)`` (sign ascent in the
    scaled variable ``delta / c``), the projection is a clamp. ``c = 0`` coordinates are fixed.

    Every per-iteration operation is one fused (``torch._foreach_*``) call over the tuple: on a
    device each per-tensor operation would be a kernel launch per parameter tensor (the clamp,
    taken twice a step, was three).
    """

    def __init__(self, base: Sequence[torch.Tensor], scale: Sequence[torch.Tensor],
                 radius: float) -> None:
        self.base = tuple(base)
        if not self.base:
            raise ValueError("the geometry has no coordinates to perturb")
        self.scale = tuple(scale)
        self.radius = float(radius)
        self.order = 1
        #: :meth:`direction` returns new tensors (``c * sign(g)``): the solver may overwrite them
        self.new_directions = True
        self.dtype = self.base[0].dtype
        self.device = self.base[0].device
        self._bounds = tuple(self.radius * c for c in self.scale)
        self._lower = tuple(torch._foreach_neg(list(self._bounds)))

    @cached_property
    def _inv_scale(self) -> Tensors:
        """``1 / c`` per tensor (``0`` where ``c = 0``), for the block norms."""
        return tuple(safe_reciprocal(c) for c in self.scale)

    def validate(self) -> None:
        """Nothing can be singular."""

    def on_rows(self, rows: Mapping[int, torch.Tensor]) -> BoxGeometry:
        """The same box for tangent vectors that vanish outside ``rows[i]`` of tensor ``i`` (its
        first dimension), with those tensors cut to their rows.

        Every operation of the box is elementwise, and the sign of a zero gradient is zero: an
        ascent from ``xi = 0`` never moves a row whose gradient vanishes, so solving on the rows
        visits the same iterates. The other tensors, their bounds included, are shared with
        this box, not copied.

        Raises
        ------
        ValueError
            For a slot out of range or a 0-dim tensor (no rows).
        """
        cut = copy.copy(self)
        cut.base, cut.scale, cut._bounds, cut._lower = (
            T.cut_to_rows(tensors, rows, "box")
            for tensors in (self.base, self.scale, self._bounds, self._lower))
        if "_inv_scale" in self.__dict__:
            cut.__dict__["_inv_scale"] = T.cut_to_rows(self.__dict__["_inv_scale"], rows, "box")
        return cut

    def with_radius(self, radius: float | torch.Tensor) -> BoxGeometry:
        """The same box at another radius (sharing its base and scale)."""
        box = copy.copy(self)
        box.radius = float(radius)
        box._bounds = tuple(box.radius * c for c in self.scale)
        box._lower = tuple(torch._foreach_neg(list(box._bounds)))
        return box

    def zeros(self) -> Tensors:
        return tuple(torch.zeros_like(t) for t in self.base)

    def point(self, xi: Sequence[torch.Tensor]) -> Tensors:
        _check_length(xi, self.base, "xi")
        return tuple(torch._foreach_add(list(self.base), list(xi)))

    def line(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``theta + xi``: the box's only path (:meth:`point`)."""
        return self.point(xi)

    def project(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """``max(min(xi, rho c), -rho c)`` per tensor, into new tensors."""
        _check_length(xi, self.base, "xi")
        clamped = torch._foreach_minimum(list(xi), list(self._bounds))
        torch._foreach_maximum_(clamped, list(self._lower))
        return tuple(clamped)

    def clip(self, xi: Sequence[torch.Tensor], decisions: Decisions = ON_DEVICE,
             fresh: bool = False) -> Tensors:
        """There is no quotient here: the clamp of :meth:`project` (no decision to take); in
        place when ``fresh`` (the caller made ``xi`` and gives it up)."""
        if not fresh or any(d.shape != b.shape for d, b in zip(xi, self._bounds, strict=True)):
            return self.project(xi)
        torch._foreach_minimum_(list(xi), list(self._bounds))
        torch._foreach_maximum_(list(xi), list(self._lower))
        return tuple(xi)

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        _check_length(egrad, self.base, "egrad")
        signs = torch._foreach_sign(list(egrad))
        torch._foreach_mul_(signs, list(self.scale))
        return tuple(signs)

    def random_start(self, generator: torch.Generator | None) -> Tensors:
        return tuple(b * (2 * torch.rand(b.shape, generator=generator, dtype=b.dtype,
                                         device=b.device) - 1) for b in self._bounds)

    def block_norms(self, xi: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        largest = torch.stack([(d * inv).abs().amax() if d.numel() else d.new_zeros(())
                               for d, inv in zip(xi, self._inv_scale, strict=True)]).amax()
        return {"total": largest}


def _check_length(tensors: Sequence[torch.Tensor], base: Sequence[torch.Tensor],
                  name: str) -> None:
    """Refuse a tuple of another length (the fused calls do not check, as strict zips would)."""
    if len(tensors) != len(base):
        raise ValueError(f"{name} has {len(tensors)} tensors, the geometry {len(base)}")

