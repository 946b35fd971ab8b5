"""A ``geoopt.Manifold`` presenting any symmetry quotient on one stacked tensor.

The components of a point sit side by side in one tensor (:class:`StackedLayout`); leading
dimensions are batch dimensions. ``docs/adapters.md`` describes each operation, the checks on
values (``quotientsharp.value_checks(False)`` skips them) and the measured step sizes. geoopt is
an optional extra: ``pip install quotientsharp[geoopt]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from quotientsharp.core._tuples import batch_shape
from quotientsharp.core.adapters.shapes import adapter_shapes
from quotientsharp.core.checks import check_user_quotient
from quotientsharp.core.method_checks import GENERIC_BATCH
from quotientsharp.core.quotient import SymmetryQuotient
from quotientsharp.core.validation import value_checks_enabled

try:
    import geoopt
except ImportError as err:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "quotientsharp.core.adapters.geoopt needs the optional dependency geoopt: "
        "pip install quotientsharp[geoopt]"
    ) from err

Tensors = tuple[torch.Tensor, ...]

LAYOUTS = ("concat", "stack", "flat")


def _parse_shapes(shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """``shapes`` as tuples of ints, each non-empty with positive sizes."""
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence) or not shapes:
        raise TypeError(f"shapes must be a non-empty sequence of shapes, got {shapes!r}")
    parsed = []
    for i, shape in enumerate(shapes):
        if not isinstance(shape, Sequence) or isinstance(shape, (str, bytes)):
            raise TypeError(f"shapes[{i}] must be a sequence of ints, got {shape!r}")
        shape = tuple(int(s) for s in shape)
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"shapes[{i}] must be a non-empty shape of positive sizes, "
                             f"got {shape}")
        parsed.append(shape)
    return tuple(parsed)


def _resolve_layout(shapes: tuple[tuple[int, ...], ...], layout: str | None) -> str:
    """``layout`` checked against ``shapes``; for ``None``, ``"concat"`` where the shapes allow
    it, else ``"flat"``."""
    concat_ok = len({len(s) for s in shapes}) == 1 and len({s[1:] for s in shapes}) == 1
    if layout is None:
        return "concat" if concat_ok else "flat"
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "concat" and not concat_ok:
        raise ValueError(f"layout='concat' needs components of one rank whose shapes agree "
                         f"beyond their first dimension, got shapes {shapes}")
    if layout == "stack" and len(set(shapes)) != 1:
        raise ValueError(f"layout='stack' needs components of identical shape, got shapes "
                         f"{shapes}")
    return layout


class StackedLayout:
    """How the components of a quotient point sit side by side in one tensor.

    Parameters
    ----------
    shapes
        Trailing (non-batch) shape of each component, e.g. ``((n, h), (m, h))`` for GL(h).
    layout
        ``"concat"``: components of equal rank ``k`` whose shapes agree beyond their first
        dimension, concatenated along dimension ``-k`` (GL pairs ``[..., n, h]``,
        ``[..., m, h]`` become ``[G; H]``, ``shape=[..., n + m, h]``). ``"stack"``: components
        of identical shape, stacked along a new dimension ``-(k + 1)``. ``"flat"``: every
        component flattened, concatenated along the last dimension (any quotient). ``None``
        picks ``"concat"`` when the shapes allow it and ``"flat"`` otherwise.
    """

    def __init__(self, shapes: Sequence[Sequence[int]], layout: str | None = None) -> None:
        self.shapes: tuple[tuple[int, ...], ...] = _parse_shapes(shapes)
        self.layout = layout = _resolve_layout(self.shapes, layout)
        rank = len(self.shapes[0])
        if layout == "concat":
            self.stacked_shape = (sum(s[0] for s in self.shapes), *self.shapes[0][1:])
        elif layout == "stack":
            self.stacked_shape = (len(self.shapes), *self.shapes[0])
        else:
            self.stacked_shape = (sum(math.prod(s) for s in self.shapes),)
        self.ndim = {"concat": rank, "stack": rank + 1, "flat": 1}[layout]

    def split(self, stacked: torch.Tensor) -> Tensors:
        """The components of a stacked tensor (views, no copy), ``shape=[*batch, *shapes[i]]``."""
        if not isinstance(stacked, torch.Tensor):
            raise TypeError(f"stacked must be a torch.Tensor, got {type(stacked).__name__}")
        trailing = tuple(stacked.shape[stacked.dim() - self.ndim:])
        if stacked.dim() < self.ndim or trailing != self.stacked_shape:
            raise ValueError(f"stacked must end in shape {self.stacked_shape} (layout "
                             f"{self.layout!r} of component shapes {self.shapes}), got "
                             f"{tuple(stacked.shape)}")
        batch = stacked.shape[:stacked.dim() - self.ndim]
        if self.layout == "concat":
            return tuple(torch.split(stacked, [s[0] for s in self.shapes], dim=-self.ndim))
        if self.layout == "stack":
            return tuple(torch.unbind(stacked, dim=-self.ndim))
        sizes = [math.prod(s) for s in self.shapes]
        return tuple(part.reshape(*batch, *s) for part, s in
                     zip(torch.split(stacked, sizes, dim=-1), self.shapes, strict=True))

    def merge(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Stack components (batch shapes broadcast) into one tensor."""
        if isinstance(parts, torch.Tensor) or len(parts) != len(self.shapes):
            raise ValueError(f"parts must be a tuple of {len(self.shapes)} tensors")
        ndims = [len(s) for s in self.shapes]
        batch = batch_shape(parts, ndims)
        for i, (p, s) in enumerate(zip(parts, self.shapes, strict=True)):
            if tuple(p.shape[p.dim() - len(s):]) != s:
                raise ValueError(f"parts[{i}] must end in shape {s}, got {tuple(p.shape)}")
        full = [p.expand(*batch, *s) for p, s in zip(parts, self.shapes, strict=True)]
        if self.layout == "concat":
            return torch.cat(full, dim=-self.ndim)
        if self.layout == "stack":
            return torch.stack(full, dim=-self.ndim)
        return torch.cat([p.reshape(*batch, -1) for p in full], dim=-1)

    def __repr__(self) -> str:
        return f"StackedLayout(shapes={self.shapes}, layout={self.layout!r})"


class QuotientManifold(geoopt.Manifold):
    """A symmetry quotient as a ``geoopt.Manifold`` on one stacked tensor.

    Parameters
    ----------
    quotient
        Any :class:`~quotientsharp.SymmetryQuotient` (``GLQuotient``, ``DiagonalQuotient``, ...).
    shapes
        Trailing shape of each component of a point, e.g. ``((n, h), (m, h))`` for GL(h),
        ``point_ndims[i]`` dimensions each (the folded dimensions of a ``ProductQuotient``
        included); defaults to ``quotient.point_shapes``. The same ``shapes`` as
        :class:`~quotientsharp.core.adapters.PymanoptQuotient` takes; shapes with leading batch
        dimensions are refused (the batch comes with the tensor).
    layout
        ``"concat"`` (default where possible), ``"stack"`` or ``"flat"``: see
        :class:`StackedLayout`.
    retraction
        ``1`` (default): ``x + u``; ``2``: the order-2 geodesic ``x + u - Gamma(u, u) / 2`` (a
        second-order retraction, for second-order methods); ``"exact"``: the exact geodesic.
        ``x + u`` converged as fast as the others in every case measured, without the
        Christoffel contraction (``docs/adapters.md``, "Step sizes per metric").

    Examples
    --------
    >>> q = GLQuotient("mix")                                    # doctest: +SKIP
    >>> manifold = QuotientManifold(q, ((n, h), (m, h)))          # doctest: +SKIP
    >>> param = geoopt.ManifoldParameter(manifold.merge((G, H)), manifold=manifold)  # +SKIP
    >>> G, H = manifold.split(param)   # inside the loss          # doctest: +SKIP
    """

    name = "Quotient"
    ndim = 1
    reversible = False

    def __init__(self, quotient: SymmetryQuotient, shapes: Sequence[Sequence[int]] | None = None,
                 *, layout: str | None = None, retraction: int | str = 1) -> None:
        shapes = adapter_shapes(quotient, shapes, retraction)
        super().__init__()
        self.quotient = quotient
        self.stacked = StackedLayout(shapes, layout)
        shapes = self.stacked.shapes
        # a user's quotient is checked once here, at random points of the shapes (the
        # package's own are verified by the tests); a batch of them, since a parameter's
        # leading dimensions are batch dimensions and a method may be right for one point only
        check_user_quotient(quotient, "QuotientManifold", shapes=shapes,
                            batch_shape=(GENERIC_BATCH,))
        self.ndim = self.stacked.ndim
        #: the dtypes the quotient's methods were checked in (a parameter of another dtype is
        #: checked at its first use: a method computing in float64 fails a float32 step with an
        #: error naming neither the quotient nor the method)
        self._checked = {torch.float64}
        self.retraction = retraction
        self.name = f"Quotient[{quotient.name}]"
        # what the last retraction did, for the error on an iterate that diverged
        self._retractions = 0
        self._last_step = math.nan

    # ------------------------------------------------------------------ layout
    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Trailing shape of each component."""
        return self.stacked.shapes

    def split(self, x: torch.Tensor) -> Tensors:
        """The quotient point (tuple of views) stored in the stacked tensor ``x``."""
        return self.stacked.split(x)

    def merge(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """One stacked tensor from a quotient point or tangent vector (a tuple)."""
        return self.stacked.merge(parts)

    def _plain(self, x: torch.Tensor) -> Tensors:
        # ManifoldParameter is a Tensor subclass; the quotient works on plain tensors
        if isinstance(x, torch.Tensor) and type(x) is not torch.Tensor:
            x = x.as_subclass(torch.Tensor)
        if x.dtype not in self._checked and x.dtype in (torch.float32, torch.float64):
            check_user_quotient(self.quotient, "QuotientManifold", shapes=self.shapes,
                                batch_shape=(GENERIC_BATCH,), dtype=x.dtype)
            self._checked.add(x.dtype)
        return self.stacked.split(x)

    def _keep(self, value: torch.Tensor, keepdim: bool) -> torch.Tensor:
        return value.reshape(*value.shape, *([1] * self.ndim)) if keepdim else value

    # ------------------------------------------------------------------ checks
    def _check_shape(self, shape: tuple[int, ...], name: str) -> tuple[bool, str | None]:
        trailing = tuple(shape[len(shape) - self.ndim:]) if len(shape) >= self.ndim else None
        if trailing != self.stacked.stacked_shape:
            return False, (f"'{name}' must end in shape {self.stacked.stacked_shape} (layout "
                           f"{self.stacked.layout!r} of {self.shapes}), got {tuple(shape)}")
        return True, None

    def _check_point_on_manifold(self, x: torch.Tensor, *, atol: float = 1e-5,
                                 rtol: float = 1e-5) -> tuple[bool, str | None]:
        """The quotient's checks on points, plus a projection: a degenerate orbit (a
        rank-deficient GL factor at ``eps = 0``) shows only where the Gram matrices are used."""
        xs = self._plain(x)
        try:
            xs = self.quotient.check_point(xs)
            self.quotient.horizontal_projection(xs, tuple(torch.zeros_like(c) for c in xs))
        except (ValueError, TypeError) as err:
            return False, str(err)
        return True, None

    def _check_vector_on_tangent(self, x: torch.Tensor, u: torch.Tensor, *, atol: float = 1e-5,
                                 rtol: float = 1e-5) -> tuple[bool, str | None]:
        """Horizontality: the normalised (dimensionless) metric product with every vertical
        direction is at most ``atol + rtol``."""
        xs, us = self._plain(x), self._plain(u)
        try:
            us = self.quotient.check_tangent(self.quotient.check_point(xs), us, name="u")
        except (ValueError, TypeError) as err:
            return False, str(err)
        error = float(self.quotient.horizontality_error(xs, us).max())
        if error > atol + rtol:
            return False, (f"u is not horizontal at x: normalised vertical component {error:.3g}"
                           f" > atol + rtol = {atol + rtol:.3g}")
        return True, None

    # ------------------------------------------------------------------ geometry
    def inner(self, x: torch.Tensor, u: torch.Tensor, v: torch.Tensor | None = None, *,
              keepdim: bool = False) -> torch.Tensor:
        """Metric ``<u, v>_x`` (``v`` defaults to ``u``), ``shape=[*batch]`` (or kept dims)."""
        xs, us = self._plain(x), self._plain(u)
        vs = us if v is None else self._plain(v)
        return self._keep(self.quotient.inner(xs, us, vs), keepdim)

    def norm(self, x: torch.Tensor, u: torch.Tensor, *, keepdim: bool = False) -> torch.Tensor:
        return self._keep(self.quotient.norm(self._plain(x), self._plain(u)), keepdim)

    def proju(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Horizontal projection of ``u`` at ``x``."""
        try:
            return self.merge(self.quotient.horizontal_projection(self._plain(x),
                                                                  self._plain(u)))
        except ValueError as err:
            raise self._diverged(err) from err

    def egrad2rgrad(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The quotient's Riemannian gradient from the Euclidean gradient ``u``."""
        try:
            return self.merge(self.quotient.euclidean_to_riemannian_gradient(self._plain(x),
                                                                             self._plain(u)))
        except ValueError as err:
            raise self._diverged(err) from err

    def _step_advice(self) -> str:
        """Which step sizes suit this quotient's metric (measured in docs/adapters.md)."""
        # the built-in quotients are named after their metric: "gl-inv", "diagonal-inv"
        name = str(getattr(self.quotient, "name", ""))
        advice = "use a smaller step size (lr), e.g. 10 times smaller"
        if name == "inv" or name.endswith("-inv"):
            advice += (": the inv metric scales the gradient by the squared size of the weights,"
                       " so its stable lr shrinks as they grow (about 1e-3 where mix takes 0.5 "
                       "on the matrix factorisation of docs/adapters.md)")
        return advice + "; docs/adapters.md, section 'Step sizes', lists measured step sizes"

    def _diverged(self, err: ValueError) -> ValueError:
        """``err`` on an iterate made by retraction steps: name the step, suggest a smaller lr
        (an error on the user's own start is returned unchanged)."""
        if self._retractions == 0:
            return err
        return ValueError(f"the optimizer has diverged: retraction step {self._retractions} on "
                          f"this manifold (retraction={self.retraction!r}) moved the point by "
                          f"{self._last_step:.3g} times its norm, and the point it made fails "
                          f"the quotient's check ({err}); {self._step_advice()}")

    def projx(self, x: torch.Tensor) -> torch.Tensor:
        """The identity (the total space is open); the point is validated."""
        self.quotient.check_point(self._plain(x))
        return x

    def _move(self, x: torch.Tensor, u: torch.Tensor, order: int | str) -> torch.Tensor:
        """The geodesic of ``order`` from ``x`` along ``u``, refusing a non-finite result."""
        xs, us = self._plain(x), self._plain(u)
        self._retractions += 1
        if value_checks_enabled():
            # host syncs, as every check on values; value_checks(False) skips them
            size = math.sqrt(sum(float(c.detach().square().sum()) for c in xs))
            self._last_step = math.sqrt(sum(float(c.detach().square().sum()) for c in us)) / max(
                size, 1e-300)
        try:
            y = self.quotient.geodesic(xs, us, 1.0, order=order)
        except ValueError as err:
            raise self._diverged(err) from err
        if value_checks_enabled() and not all(bool(torch.isfinite(c).all()) for c in y):
            raise ValueError(f"retraction step {self._retractions} on this manifold "
                             f"(retraction={order!r}) produced a non-finite point from a finite "
                             f"one: the step moved the point by {self._last_step:.3g} times its "
                             f"norm; {self._step_advice()}")
        return self.merge(y)

    def retr(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The retraction chosen by ``retraction`` (default ``1``: ``x + u``).

        Raises
        ------
        ValueError
            The step leaves the manifold or gives non-finite values: the message names the
            step and suggests a smaller step size.
        """
        return self._move(x, u, self.retraction)

    def expmap(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The exact geodesic at time 1."""
        return self._move(x, u, "exact")

    def dist(self, x: torch.Tensor, y: torch.Tensor, *, keepdim: bool = False) -> torch.Tensor:
        """Not available: raises ``NotImplementedError`` saying what to use instead."""
        raise NotImplementedError(
            "QuotientManifold has no dist (nor dist2): the geodesic distance on a symmetry "
            "quotient is a minimisation over the group, with no closed form. Compare points "
            "through a group-invariant function of them instead (for GL pairs, G @ H.mT), or "
            "measure a step with manifold.norm(x, u)")

    def logmap(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Not available: raises ``NotImplementedError`` saying what to use instead."""
        raise NotImplementedError(
            "QuotientManifold has no logmap: inverting the geodesic on a symmetry quotient is a "
            "boundary-value problem over the group, with no closed form. For nearby points, "
            "manifold.proju(x, y - x) is a first-order approximation; expmap and retr go the "
            "other way (from a tangent vector to a point)")

    def transp(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Vector transport to ``y``: horizontal projection of ``v`` at ``y``."""
        return self.proju(y, v)

    # ------------------------------------------------------------------ sampling
    def random(self, *size: int, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """A random stacked point from ``quotient.random_point``; ``size`` is the batch shape.

        ``size`` may also be the full shape (batch shape followed by the stacked shape).
        """
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        size = tuple(int(s) for s in size)
        if len(size) >= self.ndim and size[len(size) - self.ndim:] == self.stacked.stacked_shape:
            size = size[:len(size) - self.ndim]
        point = self.quotient.random_point(size, shapes=self.shapes, generator=generator,
                                           dtype=dtype, device=device)
        return self.merge(point)

    def random_tangent(self, x: torch.Tensor, *,
                       generator: torch.Generator | None = None) -> torch.Tensor:
        """A random horizontal tangent vector of unit norm at ``x``."""
        return self.merge(self.quotient.random_tangent(self._plain(x), generator=generator))

    def extra_repr(self) -> str:
        return (f"quotient={self.quotient.name!r}, shapes={self.shapes}, "
                f"layout={self.stacked.layout!r}, retraction={self.retraction!r}")
