"""The product of quotients: a network's parameters as one point of ``Q_1 x ... x Q_k``."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import cast

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core.frozen import ClosedFormPoint, check_order
from quotientsharp.core.quotient import ClosedFormQuotient, SymmetryQuotient, declares_invariant

Tensors = tuple[torch.Tensor, ...]
Order = int | str


class QuotientList(torch.nn.ModuleList):
    """The factors of a product: a ``ModuleList`` (so that ``.to()`` and ``state_dict`` reach
    them) whose iteration is typed as quotients, which ``ModuleList`` types as plain modules."""

    def __iter__(self) -> Iterator[SymmetryQuotient]:
        return cast(Iterator[SymmetryQuotient], super().__iter__())


class ProductPoint(ClosedFormPoint):
    """The product's geometry at a frozen point: one frozen point per factor.

    Every tangent vector is a flat tuple (the factors' tensors in factor order).
    """

    quotient: ProductQuotient

    def __init__(self, quotient: ProductQuotient, x: Sequence[torch.Tensor]) -> None:
        super().__init__(quotient, x)
        self.factors = [q.frozen_point(part) for q, part in zip(quotient.factors,
                                                                 quotient.split(self.x),
                                                                 strict=True)]
        self.folded = quotient.folded
        self.names = quotient.names
        self.new_gradients = all(frozen.new_gradients for frozen in self.factors)

    def split(self, u: Sequence[torch.Tensor]) -> list[Tensors]:
        return self.quotient.split(u)

    def factorise(self) -> None:
        for frozen in self.factors:
            frozen.factorise()

    def _map(self, method: str, *vectors: Sequence[torch.Tensor]) -> Tensors:
        """Each factor's ``method`` on its parts of ``vectors``, flattened."""
        parts = zip(self.factors, *(self.split(v) for v in vectors), strict=True)
        return tuple(t for frozen, *args in parts for t in getattr(frozen, method)(*args))

    def _orders(self, order: Order | Sequence[Order]) -> list[Order]:
        """One validated geodesic order per factor (``order`` is one for all, or one each)."""
        orders = ([check_order(order)] * len(self.factors) if isinstance(order, (int, str))
                  else [check_order(o) for o in order])
        if len(orders) != len(self.factors):
            raise ValueError(f"order needs one entry per factor ({len(self.factors)}), got "
                             f"{len(orders)}")
        return orders

    # ------------------------------------------------------------------ metric
    def factor_squared_norms(self, u: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``||u_i||^2`` of each factor, ``shape=[*batch]`` each."""
        return [T.sum_trailing(frozen.squared_norm(part), f)
                for frozen, part, f in zip(self.factors, self.split(u), self.folded, strict=True)]

    def inner(self, u: Tensors, v: Tensors) -> torch.Tensor:
        terms = [T.sum_trailing(frozen.inner(a, b), f) for frozen, a, b, f in
                 zip(self.factors, self.split(u), self.split(v), self.folded, strict=True)]
        return sum(terms[1:], terms[0])

    def squared_norm(self, u: Tensors) -> torch.Tensor:
        squares = self.factor_squared_norms(u)
        return sum(squares[1:], squares[0]).clamp_min(0)

    def named_norms(self, u: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{"total": ||u||, name: norm of the factors of that name}`` (device tensors)."""
        squares: dict[str, torch.Tensor] = {}
        for name, square in zip(self.names, self.factor_squared_norms(u), strict=True):
            squares[name] = squares[name] + square if name in squares else square
        total = sum(list(squares.values())[1:], list(squares.values())[0])
        return {"total": total.clamp_min(0).sqrt(),
                **{k: v.clamp_min(0).sqrt() for k, v in squares.items()}}

    # ------------------------------------------------------------------ factor by factor
    def horizontal_projection(self, u: Tensors) -> Tensors:
        return self._map("horizontal_projection", u)

    def vertical_projection(self, u: Tensors) -> Tensors:
        return self._map("vertical_projection", u)

    def horizontality_error(self, u: Tensors) -> torch.Tensor:
        """``max |<V, u>| / (||V|| ||u||)`` over the vertical directions of every factor.

        A factor's own measure is normalised by its own norm ``||u_i||``; rescaled by
        ``||u_i|| / ||u||`` it is the product's.
        """
        unnormalised = []
        for frozen, part, f in zip(self.factors, self.split(u), self.folded, strict=True):
            scaled = frozen.horizontality_error(part) * frozen.norm(part)
            unnormalised.append(scaled.amax(tuple(range(-f, 0))) if f else scaled)
        largest = torch.stack(torch.broadcast_tensors(*unnormalised)).amax(0)
        return largest / self.norm(u).clamp_min(torch.finfo(largest.dtype).tiny)

    def raise_index(self, egrad: Tensors) -> Tensors:
        return self._map("raise_index", egrad)

    def riemannian_gradient(self, egrad: Tensors) -> Tensors:
        return self._map("riemannian_gradient", egrad)

    def riemannian_gradient_and_squared_norm(self, egrad: Tensors
                                             ) -> tuple[Tensors, torch.Tensor]:
        """Each factor's gradient and squared norm (its own shortcut, if it has one), the
        squares summed over folded dimensions and factors."""
        gradient: list[torch.Tensor] = []
        squares = []
        for frozen, part, f in zip(self.factors, self.split(egrad), self.folded, strict=True):
            factor_gradient, square = frozen.riemannian_gradient_and_squared_norm(part)
            gradient.extend(factor_gradient)
            squares.append(T.sum_trailing(square, f))
        return tuple(gradient), sum(squares[1:], squares[0]).clamp_min(0)

    def christoffel(self, u: Tensors, v: Tensors | None = None) -> Tensors:
        return self._map("christoffel", u) if v is None else self._map("christoffel", u, v)

    def geodesic(self, u: Tensors, t: float = 1.0, order: Order | Sequence[Order] = 2,
                 steps: int = 64) -> Tensors:
        """The geodesic of every factor; ``order`` may give one order per factor."""
        return tuple(p for frozen, part, o in zip(self.factors, self.split(u), self._orders(order),
                                                  strict=True)
                     for p in frozen.geodesic(part, t, o, steps))

    def geodesic_exact(self, u: Tensors, t: float = 1.0, steps: int = 64) -> Tensors:
        return self.geodesic(u, t, "exact", steps)

    def check_ball(self, radius: float, order: Order | Sequence[Order]) -> None:
        for frozen, o in zip(self.factors, self._orders(order), strict=True):
            frozen.check_ball(radius, o)

    def isotropic(self, generator: torch.Generator | None = None) -> Tensors:
        return tuple(t for frozen in self.factors for t in frozen.isotropic(generator))

    def on_rows(self, rows: Mapping[int, torch.Tensor]) -> ProductPoint:
        """The product with the factors that hold the slots of ``rows`` (positions in the flat
        tuple) cut to those rows (:meth:`FrozenPoint.on_rows`, factor by factor)."""
        per_factor: list[dict[int, torch.Tensor]] = [{} for _ in self.factors]
        start = 0
        for index, frozen in enumerate(self.factors):
            size = len(frozen.x)
            for slot, selected in rows.items():
                if start <= slot < start + size:
                    per_factor[index][slot - start] = selected
            start += size
        if sum(len(part) for part in per_factor) != len(rows):
            raise ValueError(f"on_rows: slots {sorted(rows)} are not all in the product's "
                             f"{start} tensors")
        cut = copy.copy(self)
        cut.factors = [frozen.on_rows(part) if part else frozen
                       for frozen, part in zip(self.factors, per_factor, strict=True)]
        cut.x = tuple(t for frozen in cut.factors for t in frozen.x)
        return cut


class ProductQuotient(ClosedFormQuotient):
    """The product ``Q_1 x ... x Q_k`` of quotients, in the spirit of geoopt's
    ``ProductManifold``.

    A point is the concatenation of the factors' points (a flat tuple of tensors), the metric is
    the sum of the factors' metrics, the group is the product of the groups, and every operation
    acts factor by factor. The algebra is flattened: an algebra (or group) element is
    ``shape=[*batch, K]``, ``K`` the sum of the factors' flattened sizes.

    Parameters
    ----------
    factors
        The quotients.
    folded
        Per factor, how many leading dimensions of its components belong to the point rather
        than to the batch (default 0 each); the metric sums over them. ``P`` attention heads of
        one network are a GL(h) point of batch shape ``[P]``, but one point of the product with
        ``folded=1``. The other leading dimensions are batch dimensions shared by all factors.
    names
        Per factor, a label for :meth:`ProductPoint.named_norms` (default the factor's
        ``name``); factors may share a label.
    """

    point_type = ProductPoint

    def __init__(self, factors: Sequence[SymmetryQuotient], folded: Sequence[int] | None = None,
                 names: Sequence[str] | None = None) -> None:
        factors = list(factors)
        if not factors or not all(isinstance(q, SymmetryQuotient) for q in factors):
            raise TypeError("factors must be a non-empty sequence of SymmetryQuotient")
        folded = [0] * len(factors) if folded is None else [int(f) for f in folded]
        names = [q.name for q in factors] if names is None else list(names)
        if len(folded) != len(factors) or len(names) != len(factors):
            raise ValueError("folded and names need one entry per factor")
        if any(f < 0 for f in folded):
            raise ValueError(f"folded must hold integers >= 0, got {folded}")
        self.point_ndims = tuple(k + f for q, f in zip(factors, folded, strict=True)
                                 for k in q.point_ndims)
        # the factors' own shapes, where every factor has them and none folds dimensions
        shapes = [q.point_shapes or getattr(q, "check_shapes", None) for q in factors]
        own_shapes = [s for own in shapes if own is not None for s in own]
        known = all(s is not None for s in shapes) and not any(folded)
        super().__init__(own_shapes if known else None)
        self.factors = QuotientList(factors)
        self.folded = folded
        self.names = names
        self.name = " x ".join(q.name for q in factors)
        self.invariant = all(declares_invariant(q) for q in factors)
        self._sizes = [len(q.point_ndims) for q in factors]

    def split(self, x: Sequence[torch.Tensor]) -> list[Tensors]:
        """The flat tuple ``x`` as one tuple per factor."""
        x = tuple(x)
        if len(x) != sum(self._sizes):
            raise ValueError(f"a point of the product has {sum(self._sizes)} tensors, got "
                             f"{len(x)}")
        parts, start = [], 0
        for size in self._sizes:
            parts.append(x[start:start + size])
            start += size
        return parts

    def check_point(self, x: object, name: str = "x") -> Tensors:
        x = super().check_point(x, name)
        for i, (q, part) in enumerate(zip(self.factors, self.split(x), strict=True)):
            q.check_point(part, f"{name} (factor {i}, {q.name})")
        return x

    # ------------------------------------------------------------------ the product group
    def _layout(self, x: Tensors, group: bool = False) -> list[tuple[torch.Size, torch.Size]]:
        """Per factor: the folded shape and the factor's algebra (or group element) shape."""
        layout = []
        for q, part, f in zip(self.factors, self.split(x), self.folded, strict=True):
            batch = T.batch_shape(part, q.point_ndims)
            shape = q.group_shape(part) if group else q.algebra_shape(part)
            layout.append((batch[len(batch) - f:] if f else torch.Size(), torch.Size(shape)))
        return layout

    def algebra_shape(self, x: Tensors) -> tuple[int, ...]:
        return (sum(fold.numel() * alg.numel() for fold, alg in self._layout(x)),)

    def group_shape(self, x: Tensors) -> tuple[int, ...]:
        return (sum(fold.numel() * shape.numel() for fold, shape in self._layout(x, True)),)

    def _split(self, x: Tensors, a: torch.Tensor, group: bool = False) -> list[torch.Tensor]:
        """A flat algebra (or group) element as one element per factor."""
        pieces, start = [], 0
        for fold, shape in self._layout(x, group):
            size = fold.numel() * shape.numel()
            pieces.append(a[..., start:start + size].reshape(*a.shape[:-1], *fold, *shape)
                          .contiguous())
            start += size
        return pieces

    @staticmethod
    def _flat(pieces: Sequence[torch.Tensor], batch: torch.Size,
              layout: Sequence[tuple[torch.Size, torch.Size]]) -> torch.Tensor:
        return torch.cat([p.expand(*batch, *fold, *shape).reshape(*batch, -1)
                          for p, (fold, shape) in zip(pieces, layout, strict=True)], dim=-1)

    def _per_factor(self, method: str, x: Tensors, *arguments: Sequence[object]) -> Tensors:
        """Each factor's ``method`` at its part of ``x`` with its parts of ``arguments``
        (flat tuples, or algebra/group elements already split), flattened."""
        parts = zip(self.factors, self.split(x), *arguments, strict=True)
        return tuple(t for q, *args in parts for t in getattr(q, method)(*args))

    def vertical(self, x: Tensors, a: torch.Tensor) -> Tensors:
        return self._per_factor("vertical", x, self._split(x, a))

    def act(self, x: Tensors, g: torch.Tensor) -> Tensors:
        return self._per_factor("act", x, self._split(x, g, group=True))

    def act_tangent(self, x: Tensors, u: Tensors, g: torch.Tensor) -> Tensors:
        return self._per_factor("act_tangent", x, self.split(u), self._split(x, g, group=True))

    def group_exp(self, a: torch.Tensor) -> torch.Tensor:
        """Needs the layout of a point: use :meth:`group_exp_at`."""
        raise NotImplementedError("the product's algebra layout depends on the point: call "
                                  "group_exp_at(x, a)")

    def group_exp_at(self, x: Tensors, a: torch.Tensor) -> torch.Tensor:
        """The group element ``exp(a)`` of the product, factor by factor, flattened."""
        pieces = [q.group_exp_at(part, piece) for q, part, piece
                  in zip(self.factors, self.split(x), self._split(x, a), strict=True)]
        return self._flat(pieces, a.shape[:-1], self._layout(x, group=True))

    def random_group_element(self, x: Tensors, *, scale: float = 1.0,
                             generator: torch.Generator | None = None) -> torch.Tensor:
        """Each factor's random group element (over its folded dimensions), flattened."""
        pieces = [q.random_group_element(part, scale=scale, generator=generator)
                  for q, part in zip(self.factors, self.split(x), strict=True)]
        return self._flat(pieces, T.batch_shape(x, self.point_ndims),
                          self._layout(x, group=True))

    def random_point(self, batch_shape: Sequence[int] = (), *,
                     shapes: Sequence[Sequence[int]] | None = None,
                     generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> Tensors:
        """Each factor's random point (its folded dimensions leading its shapes)."""
        resolved = self._shapes(shapes)
        parts: list[torch.Tensor] = []
        start = 0
        for q, f, size in zip(self.factors, self.folded, self._sizes, strict=True):
            own = resolved[start:start + size]
            start += size
            fold = own[0][:f]
            parts.extend(q.random_point((*batch_shape, *fold), shapes=[s[f:] for s in own],
                                        generator=generator, dtype=dtype, device=device))
        return tuple(parts)

    def extra_repr(self) -> str:
        return f"folded={self.folded}, names={self.names}"
