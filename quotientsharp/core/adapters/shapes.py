"""The arguments both optimiser adapters take (``QuotientManifold``, ``PymanoptQuotient``),
checked once: in a module of its own, so that neither adapter imports the package that
imports them lazily."""

from __future__ import annotations

from collections.abc import Sequence

from quotientsharp.core.quotient import SymmetryQuotient
from quotientsharp.core.scalars import ORDERS


def adapter_shapes(quotient: object, shapes: Sequence[Sequence[int]] | None,
                   retraction: object) -> tuple[tuple[int, ...], ...]:
    """The arguments both adapters take, checked; returns ``shapes`` (default
    ``quotient.point_shapes``) as tuples of ``point_ndims[i]`` positive sizes each. Shapes with
    the batch in front (0.1's spelling) are refused, naming the trailing shapes to pass."""
    if not isinstance(quotient, SymmetryQuotient):
        raise TypeError(f"quotient must be a SymmetryQuotient, got {type(quotient).__name__}")
    shapes = quotient.point_shapes if shapes is None else shapes
    if shapes is None:
        raise ValueError(f"{type(quotient).__name__} has no point_shapes: pass shapes=")
    if retraction not in ORDERS:
        raise ValueError(f"retraction must be one of {ORDERS}, got {retraction!r}")
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence) or not all(
            isinstance(s, Sequence) and not isinstance(s, (str, bytes)) for s in shapes):
        raise TypeError(f"shapes must be a sequence of shapes (sequences of ints), got "
                        f"{shapes!r}")
    parsed = tuple(tuple(int(s) for s in shape) for shape in shapes)
    ndims = tuple(quotient.point_ndims)
    if len(parsed) != len(ndims) or any(len(s) < k or any(n < 1 for n in s)
                                        for s, k in zip(parsed, ndims, strict=False)):
        raise ValueError(f"shapes {parsed} do not match the point layout of "
                         f"{type(quotient).__name__} ({len(ndims)} components with {ndims} "
                         f"trailing dimensions of positive sizes)")
    trailing = tuple(s[len(s) - k:] for s, k in zip(parsed, ndims, strict=True))
    if trailing != parsed:
        raise ValueError(f"shapes {parsed} carry leading batch dimensions: shapes are the "
                         f"trailing shapes of one point (point_ndims {ndims}): pass "
                         f"shapes={trailing}, and the leading (batch) dimensions as batch_shape= "
                         "(PymanoptQuotient; QuotientManifold takes them with the tensor)")
    return trailing
