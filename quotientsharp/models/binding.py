"""Attach any :class:`~quotientsharp.SymmetryQuotient` to parameters of a model.

A :class:`QuotientBinding` says which parameters form a point of a quotient and how they map to
and from it (differentiable, mutually inverse maps); ``quotientsharp.sharpness(...,
symmetries=[binding, ...])`` then measures with that quotient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from quotientsharp.core.quotient import SymmetryQuotient

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class QuotientBinding:
    """A quotient attached to named parameters of a model.

    Attributes
    ----------
    quotient
        The quotient (its metric is the one measured; the ``metric`` option of
        :func:`~quotientsharp.sharpness` applies to discovered symmetries only).
    parameters
        Names (as in ``model.named_parameters()``) of the parameters the point is made of;
        no parameter may belong to two bindings.
    to_point
        ``params -> point``: from a dict of those parameters (by name) to the quotient's point,
        a tuple of tensors. Default: ``tuple(params[name] for name in parameters)``.
    from_point
        ``point -> params``: the inverse, a dict with every name in ``parameters``. Default:
        ``dict(zip(parameters, point))``.
    folded
        Leading dimensions of the point that are part of it (summed by the norm), such as a
        stack of independent units or heads of one network; ``0`` when the point has no batch
        dimensions.
    name
        Label of this binding in the per-block norms of the result.
    """

    quotient: SymmetryQuotient
    parameters: Sequence[str]
    to_point: Callable[[Mapping[str, torch.Tensor]], Tensors] | None = None
    from_point: Callable[[Tensors], Mapping[str, torch.Tensor]] | None = None
    folded: int = 0
    name: str = "custom"

    def __post_init__(self) -> None:
        if not isinstance(self.quotient, SymmetryQuotient):
            raise TypeError(f"quotient must be a SymmetryQuotient, got "
                            f"{type(self.quotient).__name__}")
        if isinstance(self.parameters, str) or not all(isinstance(n, str)
                                                       for n in self.parameters):
            raise TypeError("parameters must be a sequence of parameter names")
        if not self.parameters:
            raise ValueError("parameters must name at least one parameter")
        if isinstance(self.folded, bool) or not isinstance(self.folded, int) or self.folded < 0:
            raise ValueError(f"folded must be an integer >= 0, got {self.folded!r}")
        object.__setattr__(self, "parameters", tuple(self.parameters))

    def point(self, params: Mapping[str, torch.Tensor]) -> Tensors:
        """The quotient's point made of ``params`` (a dict holding at least :attr:`parameters`)."""
        own = {name: params[name] for name in self.parameters}
        if self.to_point is None:
            return tuple(own[name] for name in self.parameters)
        try:
            point = self.to_point(own)
        except KeyError as err:
            # a bare KeyError reaches the command line as its key alone ("error: 0.wieght")
            raise ValueError(f"binding {self.name!r}: to_point looked up {err}, which is not one "
                             f"of the binding's parameters {list(self.parameters)} (the only "
                             "entries it is given)") from err
        # tuple() of a dict gives its keys: refuse anything but a sequence of tensors here
        if not isinstance(point, (tuple, list)) or not all(isinstance(t, torch.Tensor)
                                                           for t in point):
            raise TypeError(f"binding {self.name!r}: to_point must return a tuple of tensors "
                            f"(the quotient's point), got {_describe(point)}")
        return tuple(point)

    def parameters_of(self, point: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parameters (by name) of a point of the quotient."""
        if self.from_point is None:
            return dict(zip(self.parameters, point, strict=True))
        result = dict(self.from_point(tuple(point)))
        missing = [n for n in self.parameters if n not in result]
        if missing:
            raise ValueError(f"from_point of binding {self.name!r} returned no tensor for "
                             f"{missing}")
        return {name: result[name] for name in self.parameters}

    def check_round_trip(self, params: Mapping[str, torch.Tensor]) -> None:
        """Raise unless ``from_point(to_point(params))`` gives back ``params``."""
        back = self.parameters_of(self.point(params))
        for name in self.parameters:
            original, returned = params[name], back[name]
            if returned.shape != original.shape:
                raise ValueError(f"binding {self.name!r}: from_point(to_point(theta)) gives "
                                 f"{name!r} the shape {tuple(returned.shape)}, expected "
                                 f"{tuple(original.shape)}")
            scale = float(original.abs().max()) if original.numel() else 0.0
            error = float((returned - original).abs().max()) if original.numel() else 0.0
            if error > 1e-6 * max(scale, 1e-30):
                raise ValueError(f"binding {self.name!r}: from_point is not the inverse of "
                                 f"to_point on {name!r} (largest difference {error:.3g})")


def check_binding_list(symmetries: Sequence[object]) -> None:
    """Raise a ``TypeError`` unless ``symmetries`` (a list or tuple) holds at least one
    :class:`QuotientBinding` and nothing else (``sharpness`` and the optimisers alike)."""
    if not symmetries or not all(isinstance(b, QuotientBinding) for b in symmetries):
        raise TypeError(f"symmetries: a list of symmetries must hold QuotientBinding "
                        f"objects only (at least one), got {symmetries!r}")


def _describe(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {[type(v).__name__ for v in value]}"
    return type(value).__name__


#: Block labels of the result that a binding may not take as its name.
RESERVED_LABELS = frozenset({"gl", "diagonal", "other", "total"})


def _check_parameters(bindings: Sequence[QuotientBinding],
                      trainable: Mapping[str, torch.Tensor]) -> None:
    """Each bound name a trainable parameter, in one binding only; each binding round-trips."""
    seen: dict[str, str] = {}
    for binding in bindings:
        for name in binding.parameters:
            if name not in trainable:
                raise ValueError(f"binding {binding.name!r} names {name!r}, which is not a "
                                 "trainable parameter of the model")
            if name in seen:
                raise ValueError(f"parameter {name!r} is in two bindings ({seen[name]!r} "
                                 f"and {binding.name!r})")
            seen[name] = binding.name
        binding.check_round_trip(trainable)


def validate_bindings(bindings: Sequence[QuotientBinding],
                      trainable: Mapping[str, torch.Tensor]) -> list[Tensors]:
    """Each binding's point at ``theta`` (``trainable``), detached, after the rules that
    ``sharpness()`` and the quotient optimisers share (a ``ValueError`` naming the binding for
    each): names unique and not reserved, bound names trainable and in one binding only, a
    round trip through the point, the quotient's number of tensors with ``folded`` dimensions.
    """
    labels = [b.name for b in bindings]
    for label in labels:
        if label in RESERVED_LABELS:
            raise ValueError(f"a binding may not be named {label!r}: the name labels a block "
                             f"of its own in the result (reserved: {sorted(RESERVED_LABELS)})")
        if labels.count(label) > 1:
            raise ValueError(f"two bindings are named {label!r}: give each its own name, "
                             "the per-block norms of the result are reported by name")
    _check_parameters(bindings, trainable)
    bases = [tuple(t.detach() for t in binding.point(trainable)) for binding in bindings]
    for binding, base in zip(bindings, bases, strict=True):
        ndims = binding.quotient.point_ndims
        if len(base) != len(ndims):
            raise ValueError(f"binding {binding.name!r}: to_point returned {len(base)} "
                             f"tensors, the quotient's point has {len(ndims)}")
        leading = {t.dim() - k for t, k in zip(base, ndims, strict=True)}
        if leading != {binding.folded}:
            raise ValueError(f"binding {binding.name!r}: the point has {sorted(leading)} "
                             f"leading (batch) dimension(s) beyond the quotient's "
                             f"point_ndims {tuple(ndims)}, but folded={binding.folded}; "
                             "folded must count them (e.g. 1 for a stack of units)")
    return bases
