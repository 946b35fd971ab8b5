"""The base classes of every symmetry quotient.

The built-in quotients derive from :class:`ClosedFormQuotient`: their closed forms live in their
frozen-point classes, so the sharpness engine runs exactly what ``check_all`` verifies.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core import reference
from quotientsharp.core.frozen import ClosedFormPoint, FrozenPoint
from quotientsharp.core.metric import Metric, MetricRegistry
from quotientsharp.core.validation import (
    check_finite,
    check_same_layout,
    check_sequence,
    check_tensors,
    check_time,
)

Tensors = tuple[torch.Tensor, ...]
QuotientT = TypeVar("QuotientT", bound="SymmetryQuotient")

#: Where a user reads how to write a quotient (named in the instantiation error).
TUTORIAL = "docs/tutorial-custom-symmetry.md"

#: What each abstract method of :class:`SymmetryQuotient` is, for the instantiation error.
REQUIRED_METHODS = {
    "inner": "inner(x, u, v): the metric <u, v>_x, shape=[*batch]",
    "vertical": "vertical(x, a): the vertical vector of the Lie-algebra element a",
    "act": "act(x, g): the group element g applied to the point x",
    "algebra_shape": "algebra_shape(x): the trailing shape of a Lie-algebra element at x",
}
#: The members a subclass of :class:`ClosedFormQuotient` or :class:`MetricFamilyQuotient`
#: must set besides, for the instantiation error.
REQUIRED_ATTRIBUTES = {
    "point_type": "point_type: the ClosedFormPoint subclass that holds the closed forms (or "
                  "override frozen_point)",
    "metrics": "metrics: the MetricRegistry of the family's metrics, by name",
}


def _dimension(size: object) -> int:
    """A ``point_shapes`` entry: an integer >= 0 (int() would turn 4.5 into 4 and True into 1)."""
    if isinstance(size, bool):
        raise TypeError(f"point_shapes entries must be integers, got the bool {size!r}")
    try:
        value = operator.index(size)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"point_shapes entries must be integers, got {type(size).__name__} "
                        f"{size!r}") from None
    if value < 0:
        raise ValueError(f"point_shapes entries must be >= 0, got {value}")
    return value


def unimplemented_message(cls: type, missing: Sequence[str]) -> str:
    """The instantiation error of a quotient class that lacks ``missing`` members."""
    lines = [f"Can't instantiate abstract class {cls.__name__}: it does not implement "
             f"{', '.join(missing)}. Define in {cls.__name__}:"]
    for name in missing:
        if name in REQUIRED_METHODS or name in REQUIRED_ATTRIBUTES:
            lines.append(f"  - {REQUIRED_METHODS.get(name) or REQUIRED_ATTRIBUTES[name]}")
        else:
            owner = next((base.__name__ for base in cls.__mro__
                          if name in getattr(base, "__abstractmethods__", ())
                          and name in vars(base)), "a base class")
            lines.append(f"  - {name} (abstract in {owner})")
    lines.append("A SymmetryQuotient needs inner, vertical, act and algebra_shape (and "
                 f"point_ndims); everything else has a generic default. See {TUTORIAL}.")
    return "\n".join(lines)


def declares_invariant(quotient: object) -> bool:
    """A quotient's ``invariant`` attribute: ``True`` (the default) where its metric is meant to
    be invariant under the group, ``False`` where the class opts out of that check.

    Raises
    ------
    TypeError
        For any other value (``None`` or ``0`` would turn the check off without the warning
        that ``False`` gives).
    """
    value = getattr(quotient, "invariant", True)
    if not isinstance(value, bool):
        raise TypeError(f"{type(quotient).__name__}.invariant must be True or False, got "
                        f"{value!r}: leave it out for a metric meant to be invariant under the "
                        "group, set it to False for one that is not")
    return value


class SymmetryQuotient(torch.nn.Module, abc.ABC):
    """A manifold of parameters modulo a group of symmetries, with a Riemannian metric.

    A subclass defines :meth:`inner`, :meth:`vertical`, :meth:`act`, :meth:`algebra_shape`
    (abstract: instantiating a subclass without one raises a ``TypeError`` naming it) and
    :attr:`point_ndims`.

    Parameters
    ----------
    point_shapes
        Optional trailing shape of each component of a point, used by :meth:`random_point`.

    Raises
    ------
    TypeError
        At instantiation, for a subclass that lacks an abstract method or ``point_ndims``.
    """

    #: Short name used in tables and error messages.
    name: str = "quotient"
    #: Number of trailing (non-batch) dimensions of each component of a point.
    point_ndims: tuple[int, ...] = ()

    def __new__(cls: type[QuotientT], *args: Any, **kwargs: Any) -> QuotientT:
        # Python's own error ("Can't instantiate abstract class X with abstract methods act")
        # says neither what the methods are nor where to read about them: this one does both
        missing = cls.unimplemented_members()
        if missing:
            raise TypeError(unimplemented_message(cls, missing))
        # object.__new__ rejects the constructor's arguments once __new__ is overridden
        return super().__new__(cls)

    @classmethod
    def unimplemented_members(cls) -> list[str]:
        """The abstract members ``cls`` lacks, the required methods first (empty if none)."""
        abstract = set(getattr(cls, "__abstractmethods__", ()))
        return ([name for name in REQUIRED_METHODS if name in abstract]
                + sorted(abstract - set(REQUIRED_METHODS)))

    def __init__(self, point_shapes: Sequence[Sequence[int]] | None = None) -> None:
        super().__init__()
        if not self.point_ndims:
            raise TypeError(f"{type(self).__name__} must set point_ndims (the number of trailing "
                            "dimensions of each component of a point, e.g. (2, 2) for a pair "
                            "of matrices) as a class attribute or before super().__init__(); "
                            f"see {TUTORIAL}")
        shapes: tuple[tuple[int, ...], ...] | None = None
        if point_shapes is not None:
            shapes = tuple(tuple(_dimension(s) for s in shape) for shape in point_shapes)
            if len(shapes) != len(self.point_ndims):
                raise ValueError(f"point_shapes must have {len(self.point_ndims)} entries, got "
                                 f"{len(shapes)}")
            for shape, k in zip(shapes, self.point_ndims, strict=True):
                if len(shape) != k:
                    raise ValueError(f"point_shapes entry {shape} must have {k} dimensions")
        self.point_shapes = shapes

    # ------------------------------------------------------------------ to be supplied
    @abc.abstractmethod
    def inner(self, x: Tensors, u: Tensors, v: Tensors) -> torch.Tensor:
        """Metric ``<u, v>_x``, ``shape=[*batch]`` (abstract).

        Invariant under :meth:`act` if the metric is to descend to the quotient. It must be
        differentiable by ``torch.func``: the generic defaults differentiate it.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        """Vertical vector generated by the algebra element ``a``,
        ``shape=[*batch, *algebra_shape(x)]`` (abstract).

        The velocity of ``act(x, group_exp(s a))`` at ``s = 0``; linear in ``a``.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def act(self, x: Tensors, g: torch.Tensor) -> Tensors:
        """The group element ``g``, ``shape=[*batch, *group_shape(x)]``, applied to the point
        ``x`` (abstract)."""
        raise NotImplementedError

    @abc.abstractmethod
    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        """Trailing shape of a Lie-algebra element at ``x`` (abstract); also of a group element
        unless :meth:`group_shape` says otherwise."""
        raise NotImplementedError

    # ------------------------------------------------------------------ validation
    def check_point(self, x: object, name: str = "x") -> Tensors:
        """Validate a point: layout, dtype, device, finiteness (plus subclass conditions)."""
        x = check_tensors(name, x, self.point_ndims)
        try:
            T.batch_shape(x, self.point_ndims)
        except RuntimeError as err:
            raise ValueError(f"the batch shapes of the components of {name} do not broadcast: "
                             f"{[tuple(c.shape) for c in x]}") from err
        check_finite(name, x)
        return x

    def check_tangent(self, x: Tensors, u: object, name: str = "u", x_name: str = "x") -> Tensors:
        """Validate a tangent vector (or gradient) against the point it is attached to."""
        u = check_tensors(name, u, self.point_ndims)
        check_same_layout(name, u, x_name, x, self.point_ndims)
        check_finite(name, u)
        return u

    def _checked(self, x: object, u: object, name: str = "u") -> tuple[Tensors, Tensors]:
        x = self.check_point(x)
        return x, self.check_tangent(x, u, name=name)

    # ------------------------------------------------------------------ frozen base point
    def at(self, x: Tensors) -> FrozenPoint:
        """The geometry at the base point ``x`` (validated), with its point-only work cached.

        See :mod:`quotientsharp.core.frozen`. ``shape=[*batch, ...]`` per component; every
        operation of the result broadcasts over the batch dimensions.
        """
        return self.frozen_point(self.check_point(x))

    def frozen_point(self, x: Tensors) -> FrozenPoint:
        """:meth:`at` without validating ``x`` (for callers that validated it already)."""
        return FrozenPoint(self, x)

    # ------------------------------------------------------------------ generic defaults
    def act_tangent(self, x: Tensors, u: Tensors, g: torch.Tensor) -> Tensors:
        """Push a tangent vector forward by the action of ``g`` (the differential of ``act``)."""
        _, pushed = reference.jvp_pair(lambda y: self.act(y, g), (tuple(x),), (tuple(u),))
        return tuple(pushed)

    def group_exp(self, a: torch.Tensor) -> torch.Tensor:
        """Group element ``exp(a)`` of an algebra element (default: elementwise exp)."""
        return reference.group_exp(a)

    def group_shape(self, x: Tensors) -> tuple[int, ...]:
        """Trailing shape of a group element at ``x`` (default: the algebra's shape; a matrix
        subgroup given by algebra coordinates has ``h x h`` elements)."""
        return tuple(self.algebra_shape(x))

    def group_exp_at(self, x: Tensors, a: torch.Tensor) -> torch.Tensor:
        """``group_exp(a)`` for an algebra element at ``x`` (a product needs the point's layout)."""
        return self.group_exp(a)

    def norm(self, x: Tensors, u: Tensors) -> torch.Tensor:
        """Riemannian norm ``||u||_x``, ``shape=[*batch]``."""
        x, u = self._checked(x, u)
        return self.frozen_point(x).norm(u)

    def vertical_projection(self, x: Tensors, u: Tensors) -> Tensors:
        """Metric-orthogonal projection onto the vertical space (tangent to the orbit)."""
        x, u = self._checked(x, u)
        return reference.vertical_projection(self, x, u)

    def horizontal_projection(self, x: Tensors, u: Tensors) -> Tensors:
        """Metric-orthogonal projection onto the horizontal space (orthogonal to the orbit)."""
        x, u = self._checked(x, u)
        return reference.horizontal_projection(self, x, u)

    def horizontality_error(self, x: Tensors, u: Tensors) -> torch.Tensor:
        """Largest normalised metric product of ``u`` with a vertical vector, ``shape=[*batch]``."""
        return reference.horizontality_error(self, x, u)

    def is_horizontal(self, x: Tensors, u: Tensors, atol: float = 1e-6) -> torch.Tensor:
        """Whether ``u`` is horizontal to relative tolerance ``atol``, ``shape=[*batch]`` bool."""
        return self.horizontality_error(x, u) <= atol

    def raise_index(self, x: Tensors, egrad: Tensors) -> Tensors:
        """The vector ``g(x)^{-1} egrad`` of a covector (a Euclidean gradient); not projected."""
        x, egrad = self._checked(x, egrad, "egrad")
        return reference.raise_index(self, x, egrad)

    def euclidean_to_riemannian_gradient(self, x: Tensors, egrad: Tensors) -> Tensors:
        """Metric-raised Euclidean gradient, projected to the horizontal space."""
        x, egrad = self._checked(x, egrad, "egrad")
        return reference.euclidean_to_riemannian_gradient(self, x, egrad)

    def christoffel(self, x: Tensors, u: Tensors, v: Tensors | None = None) -> Tensors:
        """Christoffel contraction ``Gamma_x(u, v)`` (``v`` defaults to ``u``)."""
        x, u = self._checked(x, u)
        return reference.christoffel(self, x, u, v)

    def geodesic(self, x: Tensors, u: Tensors, t: float = 1.0, order: int | str = 2,
                 steps: int = 64) -> Tensors:
        """Point at time ``t`` on the geodesic from ``x`` with initial velocity ``u``.

        Parameters
        ----------
        order
            ``1``: ``x + t u``; ``2``: ``x + t u - t^2/2 Gamma(u, u)``; ``"exact"``: the exact
            geodesic (closed form where a subclass has one, otherwise RK4 integration of the
            geodesic equation with this quotient's own Christoffel contraction).
        steps
            RK4 steps for ``order="exact"`` when integrating.
        """
        t = check_time(t)
        x, u = self._checked(x, u)
        return self.frozen_point(x).geodesic(u, t, order, steps)

    def geodesic_exact(self, x: Tensors, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        """Exact geodesic; default: RK4 on ``x'' = -Gamma(x', x')`` with this class's Gamma."""
        t = check_time(t)
        return reference.geodesic_ode(x, u, t, self.point_ndims,
                                      lambda p, w: self.christoffel(p, w), steps)

    # ------------------------------------------------------------------ sampling
    def _shapes(self, shapes: Sequence[Sequence[int]] | None) -> tuple[tuple[int, ...], ...]:
        shapes = shapes if shapes is not None else self.point_shapes
        if shapes is None:
            raise ValueError(f"{type(self).__name__} has no point_shapes: pass shapes=...")
        return tuple(tuple(s) for s in shapes)

    def random_point(self, batch_shape: Sequence[int] = (), *,
                     shapes: Sequence[Sequence[int]] | None = None,
                     generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> Tensors:
        """A random point with standard Gaussian entries, ``shape=[*batch_shape, ...]``.

        The device is ``device``, else the generator's, else torch's default device.
        """
        if device is None and generator is not None:
            device = generator.device
        if dtype is not None and not dtype.is_floating_point:
            # torch's own message ("normal_kernel_cpu" not implemented for 'Long') names no
            # argument
            raise TypeError(f"random_point: dtype must be a floating dtype (a Gaussian draw), "
                            f"got {dtype}")
        return tuple(torch.randn(*batch_shape, *s, generator=generator, dtype=dtype,
                                 device=device) for s in self._shapes(shapes))

    def random_tangent(self, x: Tensors, *, generator: torch.Generator | None = None) -> Tensors:
        """A random horizontal tangent vector of unit norm at ``x``."""
        _check_floating_point("random_tangent", x)
        batch = T.batch_shape(x, self.point_ndims)
        u = tuple(torch.randn(*batch, *c.shape[c.dim() - k:], generator=generator,
                              dtype=c.dtype, device=c.device)
                  for c, k in zip(x, self.point_ndims, strict=True))
        u = self.horizontal_projection(x, u)
        return T.scale(1.0 / self.norm(x, u), u, self.point_ndims)

    def random_group_element(self, x: Tensors, *, scale: float = 1.0,
                             generator: torch.Generator | None = None) -> torch.Tensor:
        """A random group element, ``group_exp`` of a Gaussian algebra element times ``scale``."""
        _check_floating_point("random_group_element", x)
        a = torch.randn(*T.batch_shape(x, self.point_ndims), *self.algebra_shape(x),
                        generator=generator, dtype=x[0].dtype, device=x[0].device)
        return self.group_exp(scale * a)

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


class ClosedFormQuotient(SymmetryQuotient):
    """A quotient whose closed forms live in its frozen-point class.

    A subclass sets :attr:`point_type` to a :class:`~quotientsharp.core.frozen.ClosedFormPoint`
    subclass (or overrides :meth:`frozen_point`; without either it cannot be instantiated).
    Every operation below validates its arguments and delegates to the frozen point, so the
    quotient-level methods and ``quotient.at(x)`` run the same formula. :meth:`inner` is
    defined here (the frozen point's); ``vertical``, ``act`` and ``algebra_shape`` remain
    abstract.
    """

    #: The frozen-point class that holds the closed forms (``None``: :meth:`frozen_point` is
    #: overridden instead).
    point_type: ClassVar[type[ClosedFormPoint] | None] = None

    @classmethod
    def unimplemented_members(cls) -> list[str]:
        missing = super().unimplemented_members()
        if cls.point_type is None and cls.frozen_point is ClosedFormQuotient.frozen_point:
            # without it every operation would fail at its first call, not here
            missing.append("point_type")
        return missing

    def frozen_point(self, x: Tensors) -> ClosedFormPoint:
        # unimplemented_members guarantees a point_type wherever this is not overridden
        assert self.point_type is not None
        return self.point_type(self, x)

    def inner(self, x: Tensors, u: Tensors, v: Tensors) -> torch.Tensor:
        """Metric ``<u, v>_x``, ``shape=[*batch]``.

        Only shapes are checked (this method is called inside ``torch.func`` transforms by
        :mod:`quotientsharp.core.reference`).
        """
        for name, value in (("x", x), ("u", u), ("v", v)):
            # a tensor would be unpacked row by row ("too many values to unpack") far from here
            check_sequence(name, value, self.point_ndims, " (one per factor)")
        return self.frozen_point(x).inner(u, v)

    def vertical_projection(self, x: Tensors, u: Tensors) -> Tensors:
        x, u = self._checked(x, u)
        return self.frozen_point(x).vertical_projection(u)

    def horizontal_projection(self, x: Tensors, u: Tensors) -> Tensors:
        x, u = self._checked(x, u)
        return self.frozen_point(x).horizontal_projection(u)

    def horizontality_error(self, x: Tensors, u: Tensors) -> torch.Tensor:
        x, u = self._checked(x, u)
        return self.frozen_point(x).horizontality_error(u)

    def raise_index(self, x: Tensors, egrad: Tensors) -> Tensors:
        x, egrad = self._checked(x, egrad, "egrad")
        return self.frozen_point(x).raise_index(egrad)

    def euclidean_to_riemannian_gradient(self, x: Tensors, egrad: Tensors) -> Tensors:
        x, egrad = self._checked(x, egrad, "egrad")
        return self.frozen_point(x).riemannian_gradient(egrad)

    def christoffel(self, x: Tensors, u: Tensors, v: Tensors | None = None) -> Tensors:
        x, u = self._checked(x, u)
        v = None if v is None else self.check_tangent(x, v, name="v")
        return self.frozen_point(x).christoffel(u, v)

    def geodesic_exact(self, x: Tensors, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        return self.frozen_point(x).geodesic_exact(u, check_time(t), steps)


class MetricFamilyQuotient(ClosedFormQuotient):
    """A closed-form quotient with a family of metrics, one selected by name at construction.

    Every built-in quotient with several metrics (GL, diagonal, adaptive) selects it the same
    way: ``metric=`` is a name of the class's :attr:`metrics` registry or a metric object of its
    family, resolved once into :attr:`metric`; the metric object names the frozen-point class
    that holds its formulas, so no method compares metric names.

    Parameters
    ----------
    metric
        A name in :attr:`metrics` (``metrics.names``) or an instance of ``metrics.base``.
    point_shapes
        As for :class:`SymmetryQuotient`.

    Raises
    ------
    ValueError
        For an unknown metric name (the message lists the names).
    TypeError
        For a metric object of another family.
    """

    #: The metrics of the family, by name (each subclass sets its own registry).
    metrics: ClassVar[MetricRegistry[Metric]]
    #: The selected metric object; ``metric.name`` is its name.
    metric: Metric

    def __init__(self, metric: str | Metric,
                 point_shapes: Sequence[Sequence[int]] | None = None) -> None:
        # the one place a metric name is read; methods use the object's classes and flags
        self.metric = self.metrics.resolve(metric)
        super().__init__(point_shapes)

    @classmethod
    def unimplemented_members(cls) -> list[str]:
        missing = super().unimplemented_members()
        if "point_type" in missing:
            missing.remove("point_type")     # the metric object names it
        if not isinstance(getattr(cls, "metrics", None), MetricRegistry):
            missing.append("metrics")
        return missing

    @property
    def invariant(self) -> bool:
        """Whether the metric is invariant under the whole group (descends to the quotient)."""
        return self.metric.group_invariant

    def frozen_point(self, x: Tensors) -> ClosedFormPoint:
        """The selected metric's formulas at ``x`` (``metric.point_type``), not validated."""
        return self.metric.point_type(self, x)


def _check_floating_point(method: str, x: object) -> None:
    """A Gaussian draw shaped like ``x`` needs floating tensors (integer ones would reach
    ``torch.randn`` with an integer dtype, whose error names no argument)."""
    if isinstance(x, torch.Tensor):
        raise TypeError(f"{method}: x must be a tuple of tensors (one per factor), got one "
                        "tensor")
    for i, c in enumerate(x if isinstance(x, (tuple, list)) else ()):
        if isinstance(c, torch.Tensor) and not c.is_floating_point():
            raise TypeError(f"{method}: x[{i}] has dtype {c.dtype}; a point has floating "
                            "entries (a Gaussian draw of its shape and dtype)")

