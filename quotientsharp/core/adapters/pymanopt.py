"""A pymanopt ``Manifold`` presenting any symmetry quotient on tuples of numpy arrays.

A point is a tuple of float64 arrays, one per component (the cost takes them as separate
arguments, ``cost(G, H)`` for GL(h)); every operation calls the quotient in torch float64
(``docs/adapters.md``). pymanopt is an optional extra: ``pip install quotientsharp[pymanopt]``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core import reference
from quotientsharp.core.adapters.shapes import adapter_shapes
from quotientsharp.core.checks import check_user_quotient
from quotientsharp.core.quotient import SymmetryQuotient
from quotientsharp.core.validation import check_count, value_checks

try:
    from pymanopt.manifolds.manifold import Manifold as _PymanoptManifold
except ImportError as err:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "quotientsharp.core.adapters.pymanopt needs the optional dependency pymanopt: "
        "pip install quotientsharp[pymanopt]"
    ) from err

Tensors = tuple[torch.Tensor, ...]


class QuotientTangentVector(tuple):
    """A tangent vector: a tuple of numpy arrays with vector-space arithmetic.

    ``+``, ``-`` (with another tangent vector), ``*`` and ``/`` (by a scalar) and negation act
    componentwise, unlike plain tuples (where ``+`` concatenates and ``*`` repeats).
    """

    # make numpy scalars (np.float64 * vector) defer to our __rmul__ instead of broadcasting
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __new__(cls, parts: Sequence[np.ndarray]) -> QuotientTangentVector:
        return super().__new__(cls, tuple(parts))

    def _combine(self, other: object, op: str,
                 combine: Callable[[Any, Any], np.ndarray]) -> QuotientTangentVector:
        if not isinstance(other, (tuple, list)) or len(other) != len(self):
            raise TypeError(f"cannot {op} a tangent vector of {len(self)} components and "
                            f"{type(other).__name__}")
        return QuotientTangentVector([combine(a, b) for a, b in zip(self, other, strict=True)])

    def __add__(self, other: object) -> QuotientTangentVector:
        return self._combine(other, "add", operator.add)

    __radd__ = __add__

    def __sub__(self, other: object) -> QuotientTangentVector:
        return self._combine(other, "subtract", operator.sub)

    def __rsub__(self, other: object) -> QuotientTangentVector:
        return self._combine(other, "subtract", lambda a, b: b - a)

    def __mul__(self, scalar: object) -> QuotientTangentVector:
        if not np.isscalar(scalar) and not (isinstance(scalar, np.ndarray) and scalar.ndim == 0):
            raise TypeError(f"a tangent vector can only be scaled by a scalar, got "
                            f"{type(scalar).__name__}")
        return QuotientTangentVector([scalar * a for a in self])

    __rmul__ = __mul__

    def __truediv__(self, scalar: object) -> QuotientTangentVector:
        return self * (1.0 / scalar)  # type: ignore[operator]

    def __neg__(self) -> QuotientTangentVector:
        return QuotientTangentVector([-a for a in self])

    def __pos__(self) -> QuotientTangentVector:
        return self


def riemannian_hessian(quotient: SymmetryQuotient, x: Tensors, egrad: Tensors, ehess: Tensors,
                       xi: Tensors) -> Tensors:
    """Riemannian Hessian of the quotient applied to the horizontal vector ``xi``.

    For a cost ``f`` invariant under the group, with Riemannian gradient
    ``grad f(x) = P_h(x) g(x)^{-1} egrad(x)`` (the quotient's
    ``euclidean_to_riemannian_gradient``), the horizontal lift of the quotient's Hessian is

        Hess f(x)[xi] = P_h( D(grad f)(x)[xi] + Gamma_x(grad f(x), xi) )

    the horizontal part of the Levi-Civita derivative upstairs. ``D(grad f)(x)[xi]`` is the
    derivative of ``(y, e) -> euclidean_to_riemannian_gradient(y, e)`` along ``(xi, ehess)``:
    the point moves along ``xi`` and the Euclidean gradient along its own derivative, the
    Euclidean Hessian-vector product ``ehess = D(egrad)(x)[xi]``. It is one forward-mode
    (``torch.func.jvp``) pass through the quotient's closed forms.

    Parameters
    ----------
    x, egrad, ehess, xi
        Point, Euclidean gradient, Euclidean Hessian-vector product along ``xi``, and the
        horizontal direction ``xi``; tuples in the quotient's layout.
    """
    x = quotient.check_point(x)
    egrad = quotient.check_tangent(x, egrad, name="egrad")
    ehess = quotient.check_tangent(x, ehess, name="ehess")
    xi = quotient.check_tangent(x, xi, name="xi")
    with value_checks(False):  # inputs validated above; forward-mode duals need no host syncs
        rgrad, drgrad = reference.jvp_pair(quotient.euclidean_to_riemannian_gradient,
                                           (tuple(x), tuple(egrad)), (tuple(xi), tuple(ehess)))
        connection = quotient.christoffel(x, rgrad, xi)
        return quotient.horizontal_projection(x, T.add(drgrad, connection))


def _check_batch_shape(batch_shape: Sequence[int] | None) -> tuple[int, ...]:
    """``batch_shape`` as a tuple of sizes ``>= 1`` (``None``: no batch)."""
    if batch_shape is not None and (isinstance(batch_shape, (str, bytes))
                                    or not isinstance(batch_shape, Sequence)):
        raise TypeError(f"batch_shape must be a sequence of sizes, e.g. (6,), got "
                        f"{batch_shape!r}")
    return () if batch_shape is None else tuple(check_count("batch_shape entries", s)
                                                for s in batch_shape)


def _check_typical_dist(value: object) -> float | None:
    """``None`` or a finite positive number (a trust-region radius of 0, NaN or < 0 stalls)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"typical_dist must be a positive number or None, got "
                        f"{type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"typical_dist must be a finite number > 0, got {value!r}")
    return float(value)


class PymanoptQuotient(_PymanoptManifold):
    """A symmetry quotient as a pymanopt manifold on tuples of numpy float64 arrays.

    Parameters
    ----------
    quotient
        Any :class:`~quotientsharp.SymmetryQuotient`.
    shapes
        Trailing shape of each component of one point, e.g. ``((n, h), (m, h))`` for GL(h),
        ``point_ndims[i]`` dimensions each (the same ``shapes`` as
        :class:`~quotientsharp.core.adapters.QuotientManifold` takes). Defaults to
        ``quotient.point_shapes``. Shapes with leading batch dimensions
        (``((k, n, h), (k, m, h))``, 0.1) are refused: pass ``shapes=((n, h), (m, h)),
        batch_shape=(k,)``.
    batch_shape
        Leading dimensions shared by all components (default ``()``): the arrays have shape
        ``[*batch_shape, *shapes[i]]``, and inner products sum over the batch.
    retraction
        ``2`` (default): order-2 geodesic; ``1``: ``x + v``; ``"exact"``: exact geodesic.
    typical_dist
        Scale used by ``TrustRegions`` for its default trust-region radius (``Delta_bar``);
        default ``sqrt(dim)``. The right scale depends on the problem (under the mix metric
        lengths are in units of ``G H^T``): pass ``Delta_bar`` to ``TrustRegions.run`` or set
        this for fast convergence.
    rng
        numpy generator (or seed) for :meth:`random_point` and :meth:`random_tangent_vector`;
        default: numpy's global generator, as pymanopt's own manifolds use (so
        ``np.random.seed`` makes runs reproducible).

    Notes
    -----
    The attribute ``shapes`` holds the trailing shapes (since 0.2; before, the arrays' full
    shapes, now ``array_shapes``), ``batch_shape`` the batch shape. ``dim`` is the quotient's
    dimension: the number of coordinates minus the group dimension (``(n + m) h - h^2`` per
    GL(h) pair), which TrustRegions uses as its default inner-iteration cap.
    """

    def __init__(self, quotient: SymmetryQuotient, shapes: Sequence[Sequence[int]] | None = None,
                 *, batch_shape: Sequence[int] | None = None, retraction: int | str = 2,
                 typical_dist: float | None = None,
                 rng: np.random.Generator | int | None = None) -> None:
        trailing = adapter_shapes(quotient, shapes, retraction)
        batch = _check_batch_shape(batch_shape)
        typical_dist = _check_typical_dist(typical_dist)
        # a user's quotient is checked once here (the package's own are verified by the tests)
        check_user_quotient(quotient, "PymanoptQuotient", shapes=trailing, batch_shape=batch)
        self.quotient = quotient
        #: trailing shape of each component, as ``QuotientManifold.shapes``
        self.shapes = trailing
        self.trailing_shapes = trailing
        #: leading dimensions shared by all components
        self.batch_shape = batch
        #: full shape of each component's array, ``(*batch_shape, *shapes[i])``
        self.array_shapes = tuple((*batch, *s) for s in trailing)
        self.retraction_order = retraction
        self._rng = None if rng is None else np.random.default_rng(rng)
        probe = quotient.random_point(self.batch_shape, shapes=self.trailing_shapes,
                                      dtype=torch.float64)
        group_dim = math.prod(quotient.algebra_shape(probe)) * math.prod(self.batch_shape)
        dimension = sum(math.prod(s) for s in self.array_shapes) - group_dim
        if dimension < 0:
            raise ValueError(f"shapes {self.array_shapes} are smaller than the group of "
                             f"{quotient.name}")
        self._typical_dist = math.sqrt(dimension) if typical_dist is None else typical_dist
        super().__init__(f"{quotient.name} quotient of shapes {trailing}, batch shape {batch}",
                         dimension, point_layout=len(trailing))

    # ------------------------------------------------------------------ conversion
    def _torch(self, arrays: object, name: str) -> Tensors:
        if isinstance(arrays, np.ndarray) or not isinstance(arrays, (tuple, list)):
            raise TypeError(f"{name} must be a tuple of {len(self.shapes)} numpy arrays, got "
                            f"{type(arrays).__name__}")
        if len(arrays) != len(self.shapes):
            raise ValueError(f"{name} must have {len(self.shapes)} components, got "
                             f"{len(arrays)}")
        out = []
        for i, (a, shape) in enumerate(zip(arrays, self.array_shapes, strict=True)):
            a = np.ascontiguousarray(a, dtype=np.float64)
            if a.shape != shape:
                raise ValueError(f"{name}[{i}] must have shape {shape}, got {a.shape}")
            out.append(torch.from_numpy(a))
        return tuple(out)

    @staticmethod
    def _vector(tensors: Sequence[torch.Tensor]) -> QuotientTangentVector:
        return QuotientTangentVector([t.detach().numpy() for t in tensors])

    @staticmethod
    def _point(tensors: Sequence[torch.Tensor]) -> tuple[np.ndarray, ...]:
        return tuple(t.detach().numpy() for t in tensors)

    def _xv(self, point: object, vector: object, name: str = "tangent_vector"
            ) -> tuple[Tensors, Tensors]:
        x = self.quotient.check_point(self._torch(point, "point"), name="point")
        v = self.quotient.check_tangent(x, self._torch(vector, name), name=name, x_name="point")
        return x, v

    # ------------------------------------------------------------------ properties
    @property
    def typical_dist(self) -> float:
        return self._typical_dist

    # ------------------------------------------------------------------ metric
    def inner_product(self, point: object, tangent_vector_a: object,
                      tangent_vector_b: object) -> float:
        x, a = self._xv(point, tangent_vector_a, "tangent_vector_a")
        b = self.quotient.check_tangent(x, self._torch(tangent_vector_b, "tangent_vector_b"),
                                        name="tangent_vector_b", x_name="point")
        return float(self.quotient.inner(x, a, b).sum())

    def norm(self, point: object, tangent_vector: object) -> float:
        x, v = self._xv(point, tangent_vector)
        return math.sqrt(max(float(self.quotient.inner(x, v, v).sum()), 0.0))

    def dist(self, point_a: object, point_b: object) -> float:
        raise NotImplementedError(
            "the geodesic distance on a symmetry quotient is a minimisation over the group (no "
            "closed form); PymanoptQuotient provides no dist, so optimizers that need it "
            "(NelderMead, ParticleSwarm) are not supported: use SteepestDescent, "
            "ConjugateGradient or TrustRegions, and compare points through a group-invariant "
            "function of them (for GL pairs, G @ H.T)")

    def log(self, point_a: object, point_b: object) -> QuotientTangentVector:
        raise NotImplementedError(
            "PymanoptQuotient has no log: inverting the geodesic on a symmetry quotient is a "
            "boundary-value problem over the group, with no closed form. For nearby points, the "
            "horizontal projection at point_a of the componentwise difference, projection("
            "point_a, [b - a for a, b in zip(point_a, point_b)]), is a first-order "
            "approximation; exp and retraction go the other way")

    def pair_mean(self, point_a: object, point_b: object) -> tuple[np.ndarray, ...]:
        raise NotImplementedError(
            "PymanoptQuotient has no pair_mean: the geodesic midpoint needs log, which has no "
            "closed form on a symmetry quotient; retraction(point_a, projection(point_a, "
            "[(b - a) / 2 for a, b in zip(point_a, point_b)])) is a first-order "
            "approximation")

    # ------------------------------------------------------------------ tangent spaces
    def projection(self, point: object, vector: object) -> QuotientTangentVector:
        x, v = self._xv(point, vector, "vector")
        return self._vector(self.quotient.horizontal_projection(x, v))

    to_tangent_space = projection

    def zero_vector(self, point: object) -> QuotientTangentVector:
        x = self._torch(point, "point")
        return self._vector(T.zeros_like(x))

    def transport(self, point_a: object, point_b: object,
                  tangent_vector_a: object) -> QuotientTangentVector:
        """Horizontal projection of ``tangent_vector_a`` at ``point_b``."""
        return self.projection(point_b, tangent_vector_a)

    # ------------------------------------------------------------------ derivatives
    def euclidean_to_riemannian_gradient(self, point: object,
                                         euclidean_gradient: object) -> QuotientTangentVector:
        x, g = self._xv(point, euclidean_gradient, "euclidean_gradient")
        return self._vector(self.quotient.euclidean_to_riemannian_gradient(x, g))

    def euclidean_to_riemannian_hessian(self, point: object, euclidean_gradient: object,
                                        euclidean_hessian: object,
                                        tangent_vector: object) -> QuotientTangentVector:
        """Riemannian Hessian along ``tangent_vector``: see :func:`riemannian_hessian`."""
        x = self._torch(point, "point")
        return self._vector(riemannian_hessian(
            self.quotient, x, self._torch(euclidean_gradient, "euclidean_gradient"),
            self._torch(euclidean_hessian, "euclidean_hessian"),
            self._torch(tangent_vector, "tangent_vector")))

    # ------------------------------------------------------------------ moving
    def retraction(self, point: object, tangent_vector: object) -> tuple[np.ndarray, ...]:
        x, v = self._xv(point, tangent_vector)
        return self._point(self.quotient.geodesic(x, v, 1.0, order=self.retraction_order))

    def exp(self, point: object, tangent_vector: object) -> tuple[np.ndarray, ...]:
        x, v = self._xv(point, tangent_vector)
        return self._point(self.quotient.geodesic(x, v, 1.0, order="exact"))

    # ------------------------------------------------------------------ sampling
    def _generator(self) -> torch.Generator:
        if self._rng is not None:
            seed = int(self._rng.integers(0, 2**62))
        else:  # pymanopt's convention: the global numpy generator
            seed = int(np.random.randint(0, 2**62))  # noqa: NPY002
        return torch.Generator().manual_seed(seed)

    def random_point(self) -> tuple[np.ndarray, ...]:
        point = self.quotient.random_point(self.batch_shape, shapes=self.trailing_shapes,
                                           generator=self._generator(), dtype=torch.float64)
        return self._point(point)

    def random_tangent_vector(self, point: object) -> QuotientTangentVector:
        """A random horizontal tangent vector of unit norm (over all batch elements)."""
        x = self.quotient.check_point(self._torch(point, "point"), name="point")
        v = self.quotient.random_tangent(x, generator=self._generator())
        total = self.quotient.inner(x, v, v).sum().clamp_min(0).sqrt()
        return self._vector(tuple(c / total for c in v))
