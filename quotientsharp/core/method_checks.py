"""Check the outputs of a quotient's methods at a point: counts, shapes, dtypes, finiteness and a
positive definite ``inner``, each failure naming the method.

A user's quotient with a malformed output otherwise fails far from the cause (a Cholesky, an
``IndexError`` inside ``inner``) or not at all (a negative metric passes a symmetry check). The
draws come from their own generator: a check changes no other random stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core import reference
from quotientsharp.core.frozen import FrozenPoint
from quotientsharp.core.quotient import SymmetryQuotient

Tensors = tuple[torch.Tensor, ...]

#: Seed of the check's own generator.
METHOD_CHECK_SEED = 12345
#: Batch size of the generic point :func:`diagnose` compares with.
GENERIC_BATCH = 2
#: Units in the last place, per basis element, below which an eigenvalue of the vertical Gram
#: matrix at a generic point is rounding (:func:`_check_vertical_injective`): an exactly
#: dependent basis gives about one.
INJECTIVE_ULPS = 16
#: Largest ``batch size x N^2`` (``N`` coordinates of a point) for which :func:`check_methods`
#: forms the dense metric to check its eigenvalues; above it, random vectors only.
DENSE_METRIC_BUDGET = 4_000_000


class QuotientMethodError(ValueError):
    """A method of a quotient returns an output of the wrong kind, or raises."""


class IndefiniteMetricError(QuotientMethodError):
    """``inner`` is negative in some direction, beyond rounding: wrong at any point (a degenerate
    point makes a metric singular or infinite, never negative)."""


class DegeneratePointError(ValueError):
    """The quotient's methods are well formed at a generic point but not at this one."""


def builtin_quotient(quotient: SymmetryQuotient) -> bool:
    """Whether ``quotient`` is one of the package's own classes (a product: of them only),
    whose contract the test suite verifies; a subclass defined elsewhere is not."""
    from quotientsharp.core.product import ProductQuotient

    if not type(quotient).__module__.startswith("quotientsharp."):
        return False
    if isinstance(quotient, ProductQuotient):
        return all(builtin_quotient(factor) for factor in quotient.factors)
    return True


def _call(q: SymmetryQuotient, method: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (QuotientMethodError, DegeneratePointError):
        raise
    except Exception as err:
        message = " ".join(str(err).split())
        raise QuotientMethodError(f"{type(q).__name__}.{method} raised {type(err).__name__}: "
                                  f"{message}") from err


def _same(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Equal entries, a NaN equal to a NaN (a point's NaN is another check's to name)."""
    return bool(((before == after) | (before.isnan() & after.isnan())).all())


def _call_pure(q: SymmetryQuotient, method: str, fn: Callable[[], Any],
               arguments: Sequence[tuple[str, Sequence[torch.Tensor]]]) -> Any:
    """:func:`_call`, then raise unless every tensor of ``arguments`` (name, tensors) is
    unchanged: the engine's point is a view of the model's parameters and its tangent vectors
    are reused, so a method writing into its arguments would change both silently."""
    kept = [(name, [t.detach().clone() for t in tensors]) for name, tensors in arguments]
    out = _call(q, method, fn)
    for (name, before), (_, now) in zip(kept, arguments, strict=True):
        changed = [i for i, (b, a) in enumerate(zip(before, now, strict=True)) if not _same(b, a)]
        if changed:
            raise QuotientMethodError(
                f"{type(q).__name__}.{method} changed its argument {name} in place (component "
                f"{changed[0]}): a method must not write into its inputs (the point is the "
                "model's parameters); compute into new tensors (a - b, not a.sub_(b))")
    return out


def _check_tensors(q: SymmetryQuotient, method: str, out: object, like: Sequence[torch.Tensor],
                   what: str = "the point's") -> Tensors:
    """``out`` is a tuple or list of finite tensors with the shapes and dtypes of ``like``."""
    name = f"{type(q).__name__}.{method}"
    if not isinstance(out, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in out):
        raise QuotientMethodError(f"{name} must return a tuple of tensors, got "
                                  f"{type(out).__name__}")
    if len(out) != len(like):
        raise QuotientMethodError(f"{name} returned {len(out)} tensor(s), expected {len(like)} "
                                  f"(one per component of the point)")
    for i, (t, ref) in enumerate(zip(out, like, strict=True)):
        if t.shape != ref.shape:
            raise QuotientMethodError(f"{name} returned component {i} of shape "
                                      f"{tuple(t.shape)}, expected {what} {tuple(ref.shape)}")
        if t.dtype != ref.dtype:
            raise QuotientMethodError(f"{name} returned component {i} of dtype {t.dtype}, "
                                      f"expected {what} {ref.dtype}")
        if not bool(torch.isfinite(t).all()):
            raise QuotientMethodError(f"{name} returned non-finite values (NaN or inf) in "
                                      f"component {i}")
    return tuple(out)


def _check_inner(q: SymmetryQuotient, x: Tensors, u: Tensors, label: str) -> None:
    """``inner(x, u, u)`` is a finite, positive tensor of the batch shape and the point's dtype."""
    name = f"{type(q).__name__}.inner"
    value = _call_pure(q, "inner", lambda: q.inner(x, u, u), (("x", x), ("u", u)))
    batch = T.batch_shape(x, q.point_ndims)
    if not isinstance(value, torch.Tensor):
        raise QuotientMethodError(f"{name} must return a tensor, got {type(value).__name__}")
    if value.shape != batch:
        raise QuotientMethodError(f"{name} returned shape {tuple(value.shape)}, expected the "
                                  f"batch shape {tuple(batch)} (one value per point)")
    if value.dtype != x[0].dtype:
        raise QuotientMethodError(f"{name} returned dtype {value.dtype}, expected the point's "
                                  f"{x[0].dtype}")
    if not bool(torch.isfinite(value).all()):
        raise QuotientMethodError(f"{name} returned non-finite values (NaN or inf) for {label}")
    if not bool((value > 0).all()):
        lowest = float(value.min())
        negative = lowest < -(torch.finfo(value.dtype).eps ** 0.5) * float(value.abs().max())
        raise (IndefiniteMetricError if negative else QuotientMethodError)(
            f"{name} is not positive definite: <u, u>_x = {lowest:.3g} <= 0 for "
            f"{label} (a metric needs <u, u>_x > 0 for every u != 0)")


def _check_eigenvalues(q: SymmetryQuotient, x: Tensors) -> None:
    """The dense metric at ``x`` (small points only) has no eigenvalue below ``-sqrt(eps)``
    times the largest: random vectors miss a metric negative in one direction, while an
    ill-conditioned valid one has rounding-level eigenvalues only."""
    n = T.total_size(x, q.point_ndims)
    if n == 0 or T.batch_shape(x, q.point_ndims).numel() * n * n > DENSE_METRIC_BUDGET:
        return
    try:
        gmat = reference.metric_matrix(q, x).detach()
    except Exception:  # noqa: BLE001 - only a supplement to the random vectors checked above
        # an inner that torch.func cannot batch (vmap) may still be a valid closed form
        return
    # the symmetric part: an asymmetric inner is reported by the inner_symmetric check
    eig = torch.linalg.eigvalsh(0.5 * (gmat + gmat.mT))
    largest = eig.abs().amax(-1)
    smallest = eig[..., 0]
    bound = -(torch.finfo(eig.dtype).eps ** 0.5) * largest
    if bool((smallest < bound).any()):
        worst = int(torch.argmin(smallest / largest.clamp_min(torch.finfo(eig.dtype).tiny)))
        raise IndefiniteMetricError(
            f"{type(q).__name__}.inner is not positive definite: its metric matrix at the point "
            f"has the eigenvalue {float(smallest.flatten()[worst]):.3g} (largest "
            f"{float(largest.flatten()[worst]):.3g}); a metric needs <u, u>_x > 0 for every "
            "u != 0")


def _check_vertical_injective(q: SymmetryQuotient, x: Tensors, shape: tuple[int, ...]) -> None:
    """The vertical vectors of the algebra's basis are independent under the metric (small
    points only), as the reference projection needs; at a generic point a dependence means
    ``algebra_shape`` counts more directions than ``vertical`` uses."""
    k = torch.Size(shape).numel()
    size = T.batch_shape(x, q.point_ndims).numel() * T.total_size(x, q.point_ndims)
    if k == 0 or k * size > DENSE_METRIC_BUDGET:
        return
    gram = _call(q, "vertical", lambda: reference.vertical_gram(q, x)).detach()
    dependent = bool((torch.linalg.cholesky_ex(gram)[1] != 0).any())
    if not dependent:
        # a Cholesky factor of an exactly singular Gram can still succeed on rounding-level
        # pivots, and no threshold on the eigenvalues at x tells that from a valid orbit at an
        # ill-conditioned point (Gram condition 1e24 at weights of condition 1e6): a generic
        # point shows a class that counts more directions than it uses
        # in float64 whatever the point's dtype: whether vertical uses every direction is a
        # property of the class, and a float32 Gram of a random point (condition ~1e4 for 17 x 16
        # factors) reads as singular at float32's threshold
        wide = tuple(c.to(torch.float64) for c in x)
        generic = _generic_point(q, wide, T.batch_shape(x, q.point_ndims))
        eigenvalues = torch.linalg.eigvalsh(
            _call(q, "vertical", lambda: reference.vertical_gram(q, generic)).detach())
        floor = INJECTIVE_ULPS * k * torch.finfo(eigenvalues.dtype).eps * eigenvalues[..., -1]
        dependent = bool((eigenvalues[..., 0] <= floor).any())
    if dependent:
        raise QuotientMethodError(
            f"{type(q).__name__}.vertical is not injective at the point: the vertical vectors of "
            f"the {k} basis elements of the algebra (algebra_shape {tuple(shape)}) are linearly "
            "dependent under the metric; algebra_shape must be the group's dimension, and "
            "vertical(x, a) must use every entry of a")


def _check_operations(q: SymmetryQuotient, frozen: FrozenPoint, x: Tensors, u: Tensors
                      ) -> None:
    """The operations run on a tangent vector (the quotient's, and its own frozen point's)
    return the point's shapes and dtype (else a later check blames the caller) and leave their
    arguments as they were."""
    operations: list[tuple[str, Callable[[], Any]]] = [
        ("horizontal_projection", lambda: q.horizontal_projection(x, u)),
        ("christoffel", lambda: q.christoffel(x, u)),
        ("euclidean_to_riemannian_gradient", lambda: q.euclidean_to_riemannian_gradient(x, u)),
        ("raise_index", lambda: q.raise_index(x, u))]
    if type(frozen) is not FrozenPoint:
        # a frozen point of its own (what the engine runs) need not call the methods above
        operations += [
            ("frozen_point(x).horizontal_projection", lambda: frozen.horizontal_projection(u)),
            ("frozen_point(x).christoffel", lambda: frozen.christoffel(u)),
            ("frozen_point(x).riemannian_gradient", lambda: frozen.riemannian_gradient(u)),
            ("frozen_point(x).raise_index", lambda: frozen.raise_index(u))]
    for method, operation in operations:
        _check_tensors(q, method, _call_pure(q, method, operation, (("x", x), ("u", u))), x)


def check_methods(q: SymmetryQuotient, x: Tensors) -> None:
    """Raise a :class:`QuotientMethodError` naming the first method of ``q`` whose output at
    the point ``x`` is malformed: ``algebra_shape``, ``vertical``, ``inner`` (positive on a random,
    a one-component and a vertical vector, and no negative eigenvalue of its dense matrix on a
    small point), ``vertical`` injective (on a small point), ``horizontal_projection``,
    ``christoffel``, ``euclidean_to_riemannian_gradient``, ``raise_index`` (and those of an
    overriding frozen point) and an overriding ``isotropic``; and that no method writes into its
    arguments."""
    # a copy: the caller's point may be a view of the model's parameters, which a method that
    # writes into its arguments would change before the check names it
    x = tuple(c.detach().clone() for c in x)
    nd = q.point_ndims
    batch = T.batch_shape(x, nd)
    gen = torch.Generator(device=x[0].device).manual_seed(METHOD_CHECK_SEED)
    shape = _call(q, "algebra_shape", lambda: tuple(q.algebra_shape(x)))
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise QuotientMethodError(f"{type(q).__name__}.algebra_shape must return a tuple of "
                                  f"non-negative ints, got {shape!r}")
    a = torch.randn(*batch, *shape, generator=gen, dtype=x[0].dtype, device=x[0].device)
    v = _check_tensors(q, "vertical", _call_pure(q, "vertical", lambda: q.vertical(x, a),
                                                 (("x", x), ("a", (a,)))), x)
    u = tuple(torch.randn(c.shape, generator=gen, dtype=c.dtype, device=c.device) for c in x)
    _check_inner(q, x, u, "a random tangent vector")
    for i in range(len(x)):
        alone = tuple(c if j == i else torch.zeros_like(c) for j, c in enumerate(u))
        _check_inner(q, x, alone, f"a vector in component {i} only")
    if torch.Size(shape).numel():
        _check_inner(q, x, v, "a vertical vector")
    _check_eigenvalues(q, x)
    _check_vertical_injective(q, x, shape)
    frozen = _call(q, "frozen_point", lambda: q.at(x))
    _check_operations(q, frozen, x, u)
    if type(frozen).isotropic is FrozenPoint.isotropic:
        # the generic draw is the Cholesky factor of the dense metric (inner's, checked above):
        # correct by construction, and quadratic in the point's size
        return
    iso = _check_tensors(q, "frozen_point(x).isotropic",
                         _call_pure(q, "frozen_point(x).isotropic", lambda: frozen.isotropic(gen),
                                    (("x", x),)), x)
    if not any(bool(t.ne(0).any()) for t in iso):
        raise QuotientMethodError(f"{type(q).__name__}.frozen_point(x).isotropic returned zeros: "
                                  "a Gaussian tangent vector is never zero")


def _same_units(q: SymmetryQuotient, point: Tensors, batch: Sequence[int]) -> Tensors:
    """The first unit of ``point`` repeated over the batch shape ``batch``."""
    return tuple(c.expand(*batch, *c.shape).contiguous()
                 for c in T.first_element(point, q.point_ndims))


def _generic_point(q: SymmetryQuotient, x: Tensors, batch: Sequence[int]) -> Tensors:
    """A random point of ``batch`` with the trailing shapes, dtype and device of ``x``."""
    shapes = [tuple(c.shape[c.dim() - k:]) for c, k in zip(x, q.point_ndims, strict=True)]
    generic = q.random_point(tuple(batch), shapes=shapes, dtype=x[0].dtype,
                             generator=torch.Generator().manual_seed(METHOD_CHECK_SEED))
    return tuple(t.to(x[0].device) for t in generic)


def _malformed(q: SymmetryQuotient, x: Tensors) -> bool:
    try:
        check_methods(q, x)
    except QuotientMethodError:
        return True
    return False


def diagnose(q: SymmetryQuotient, x: Tensors) -> None:
    """:func:`check_methods` at ``x``, telling a defective class from a degenerate point.

    Raises
    ------
    QuotientMethodError
        If a method is malformed at ``x`` and at a generic random point of the same shapes too
        (the message says so when it is well formed at a generic point of another batch shape:
        the class does not broadcast over the leading dimensions).
    DegeneratePointError
        If the methods are malformed at ``x`` only (e.g. a zero unit of a scaling symmetry).
    """
    try:
        check_methods(q, x)
    except IndefiniteMetricError:
        raise
    except QuotientMethodError as at_point:
        batch = tuple(T.batch_shape(x, q.point_ndims))
        if not _malformed(q, _generic_point(q, x, batch)):
            raise DegeneratePointError(
                f"the point is degenerate for {type(q).__name__} (e.g. a zero unit or factor): "
                f"{at_point} there, not at a generic point; move the point off the singular set"
            ) from at_point
        others = [b for b in ((GENERIC_BATCH,), ()) if b != batch]
        other = next((b for b in others if not _malformed(q, _generic_point(q, x, b))), None)
        # the shapes are to blame only if the same values fail in this batch shape: a method
        # wrong at some values (a branch on the data) fails at some random points, not others
        if other is not None and _malformed(q, _same_units(q, _generic_point(q, x, other),
                                                           batch)):
            # the shapes, not the values: a reduction over dim=1, an einsum without '...'
            raise QuotientMethodError(
                f"{at_point}, at points of batch shape {batch} but not at points of batch shape "
                f"{other}: {type(q).__name__}'s methods must broadcast over any "
                f"leading (batch) dimensions and work on the trailing point_ndims "
                f"{tuple(q.point_ndims)} only (reduce with dim=-1, index with ..., einsum with "
                "'...')") from at_point
        raise at_point from None


#: Smallest relative move ``max |g.x - x| / max |x|`` of a drawn group element: a random element
#: of scale ``>= 0.1`` moves a generic point by ``~0.1``; one below this is the identity in
#: effect, and a check that applies it tests nothing.
MIN_GROUP_MOVE = 1e-6


def _act(q: SymmetryQuotient, x: Tensors, g: torch.Tensor) -> Tensors:
    """``q.act(x, g)``, raising a :class:`QuotientMethodError` if it wrote into ``x``: a write
    is seen by the tensors' version counters, since acting by the identity leaves equal values
    (and inside a jvp, where the checks call ``act`` next, torch's own error names neither)."""
    versions = [c._version for c in x]
    moved = q.act(x, g)
    if [c._version for c in x] != versions:
        raise QuotientMethodError(
            f"{type(q).__name__}.act changed its argument x in place: a method must not write "
            "into its inputs (the point is the model's parameters); compute into new tensors "
            "(g * x, not x.mul_(g))")
    return moved


def check_group_identity(q: SymmetryQuotient, x: Tensors) -> None:
    """Raise a :class:`QuotientMethodError` unless ``act(x, group_exp_at(x, 0)) = x``: every
    group element the checks draw is ``group_exp`` of an algebra element, and a matrix group
    left with the default elementwise ``exp`` (``exp(0)`` the all-ones matrix, singular) fails
    deep inside ``act`` with an error that names neither."""
    shape = tuple(q.algebra_shape(x))
    if not torch.Size(shape).numel():
        return
    zero = torch.zeros(*T.batch_shape(x, q.point_ndims), *shape, dtype=x[0].dtype,
                       device=x[0].device)
    hint = (f"group_exp(0) must be the group's identity: {type(q).__name__} keeps the default "
            "group_exp, an elementwise exp, which fits a group of positive scalars; a matrix "
            "group needs torch.linalg.matrix_exp (override group_exp, or group_exp_at)"
            if type(q).group_exp is SymmetryQuotient.group_exp
            and type(q).group_exp_at is SymmetryQuotient.group_exp_at
            else f"group_exp(0) must be the group's identity ({type(q).__name__}.group_exp)")
    try:
        moved = _act(q, x, q.group_exp_at(x, zero))
        error = max((float((m.detach() - c.detach()).abs().max()) for m, c
                     in zip(moved, x, strict=True) if c.numel()), default=0.0)
    except QuotientMethodError:
        raise
    except Exception as err:  # noqa: BLE001 - named below, with the original chained
        raise QuotientMethodError(f"act(x, group_exp(0)) raised {type(err).__name__} "
                                  f"({' '.join(str(err).split())}): {hint}") from err
    size = max((float(c.detach().abs().max()) for c in x if c.numel()), default=0.0)
    if not error <= 1e-6 * max(size, torch.finfo(x[0].dtype).tiny):
        raise QuotientMethodError(f"act(x, group_exp(0)) moved the point (largest change "
                                  f"{error:.3g}): {hint}")


def check_group_element_moves(q: SymmetryQuotient, x: Tensors, g: torch.Tensor) -> None:
    """Raise a :class:`QuotientMethodError` if ``act(x, g)`` leaves ``x`` where it is (a
    ``random_group_element`` returning the identity makes every invariance check vacuous).

    A zero point (fixed by every linear action) and a trivial group are not checked.
    """
    if not torch.Size(q.algebra_shape(x)).numel():
        return
    size = max((float(c.detach().abs().max()) for c in x if c.numel()), default=0.0)
    if size == 0.0:
        return
    moved = _act(q, x, g)
    move = max(float((m.detach() - c.detach()).abs().max()) for m, c in zip(moved, x, strict=True)
               if c.numel()) / size
    if not move > MIN_GROUP_MOVE:
        raise QuotientMethodError(
            f"{type(q).__name__}.random_group_element returned an element that does not move the "
            f"point (relative move {move:.3g} <= {MIN_GROUP_MOVE:g}): an invariance check with it "
            "tests nothing; return group_exp of a random algebra element")
