"""Layout stage: a model's parameters as the factors of a product quotient.

Each class lists ``theta`` as :class:`Factor` s, maps a point of the product back to
parameters by name (``updates``) and lists its :class:`~.blocks.Block` s:
:class:`PlainCoordinates` (one trivial-group factor), :class:`LayoutCoordinates` (discovered
symmetries) and :class:`BoundCoordinates` (:class:`~quotientsharp.models.QuotientBinding` s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from quotientsharp.core.adaptive import AdaptiveQuotient
from quotientsharp.core.diagonal import DiagonalQuotient
from quotientsharp.core.gl import GLQuotient, RotaryQuotient
from quotientsharp.core.quotient import SymmetryQuotient
from quotientsharp.engine.blocks import Block
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.models.binding import validate_bindings

Tensors = tuple[torch.Tensor, ...]


@dataclass
class Factor:
    """One factor of the product: a quotient at its base point.

    Attributes
    ----------
    quotient
        The quotient.
    base
        Its base point, from ``theta``.
    name
        Label in the per-block norms (``"gl"``, ``"diagonal"``, ``"other"``, a binding's name).
    folded
        Leading dimensions of the base point that belong to the point (stacked heads).
    curved
        Whether the path follows the geodesic at the requested order (``False``: a straight
        line whatever the order, as for the other parameters by default).
    labels
        Readable name per folded entry (for error messages), e.g. one per attention head.
    """

    quotient: SymmetryQuotient
    base: Tensors
    name: str
    folded: int = 0
    curved: bool = True
    labels: list[str] = field(default_factory=list)


def pair_quotient(metric: str, eps: float, pairs: Sequence[Any]) -> GLQuotient:
    """The quotient of one bucket of attention pairs: ``GLQuotient``, or ``RotaryQuotient``
    for rotary query/key pairs (``pair.rotary`` is ``(rotary_dims, layout)``)."""
    rotary = getattr(pairs[0], "rotary", None) if pairs else None
    if rotary is None:
        return GLQuotient(metric, eps)
    return RotaryQuotient(metric, eps, head_dim=pairs[0].h, rotary_dims=rotary[0],
                          layout=rotary[1])


def other_factor(tensors: Sequence[torch.Tensor], other_metric: str,
                 other_path: str) -> Factor:
    """The parameters outside any symmetry: the adaptive (or Euclidean) trivial-group factor."""
    return Factor(AdaptiveQuotient.of(tensors, other_metric), tuple(tensors), "other",
                  curved=other_path == "geodesic")


class PlainCoordinates:
    """Each perturbed parameter is its own coordinate tensor, in one trivial-group factor."""

    def __init__(self, model: FunctionalModel, names: Sequence[str]) -> None:
        self.names = list(names)
        self.base = tuple(model.theta_geometry[n] for n in self.names)

    def factors(self, other_metric: str = "adaptive", other_path: str = "line",
                **_: Any) -> list[Factor]:
        return [other_factor(self.base, other_metric, other_path)]

    def updates(self, point: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, point, strict=True))

    def other_slot(self, name: str) -> int | None:
        """Position of parameter ``name`` in the point, if it is a tensor of its own in the
        parameters-outside-any-symmetry factor; else ``None``."""
        return self.names.index(name) if name in self.names else None

    def blocks(self) -> list[Block]:
        """One block per parameter, by name (all in factor 0)."""
        return [Block(name, "parameter", 0, (i,)) for i, name in enumerate(self.names)]


class LayoutCoordinates:
    """Symmetry coordinates of a :class:`~quotientsharp.models.ParameterLayout`."""

    def __init__(self, model: FunctionalModel, layout: Any, excluded: set[str]) -> None:
        self.layout = layout
        self.coords = layout.to_coordinates(model.theta_geometry)
        self.gl = [tuple(pair) for pair in self.coords.gl]
        self.gl_pairs = list(self.coords.gl_pairs)
        self.diagonal = self.coords.diagonal
        self.other_names = [n for n in self.coords.other if n not in excluded]
        self._fixed_other = [n for n in self.coords.other if n in excluded]

    def factors(self, metric: str = "inv", eps: float = 0.0, other_metric: str = "adaptive",
                other_path: str = "line", **_: Any) -> list[Factor]:
        factors = [Factor(pair_quotient(metric, eps, pairs), (G, H), "gl", folded=1,
                          labels=[f"{p.module} {p.kind} head {p.head}" for p in pairs])
                   for (G, H), pairs in zip(self.gl, self.gl_pairs, strict=True)]
        if self.diagonal is not None:
            factors.append(Factor(DiagonalQuotient(metric), tuple(self.diagonal), "diagonal"))
        if self.other_names:
            factors.append(other_factor([self.coords.other[n] for n in self.other_names],
                                        other_metric, other_path))
        return factors

    def other_slot(self, name: str) -> int | None:
        """Position of parameter ``name`` in the point, if it is a tensor of its own in the
        parameters-outside-any-symmetry factor; else ``None``."""
        if name not in self.other_names:
            return None
        start = 2 * len(self.gl) + (2 if self.diagonal is not None else 0)
        return start + self.other_names.index(name)

    def updates(self, point: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        point = list(point)
        gl = [(point[2 * i], point[2 * i + 1]) for i in range(len(self.gl))]
        rest = point[2 * len(self.gl):]
        diagonal = None
        if self.diagonal is not None:
            diagonal, rest = (rest[0], rest[1]), rest[2:]
        other = dict(self.coords.other)
        other.update(zip(self.other_names, rest, strict=True))
        parameters = self.layout.to_parameters(self.coords.replace(gl=gl, diagonal=diagonal,
                                                                   other=other))
        # unperturbed other parameters would be the base tensors themselves: leave them to the
        # functional model, which passes a private copy
        for name in self._fixed_other:
            parameters.pop(name, None)
        return parameters

    def blocks(self) -> list[Block]:
        """Every attention head pair, every diagonal pair, every other parameter.

        Factor order as in :meth:`factors`: the buckets of heads (tensors ``G, H``, one block per
        head, the entry of the folded dimension), the diagonal factor (one block per
        :class:`~quotientsharp.models.DiagonalPair`, a range of the concatenated coordinates;
        one block ``"diagonal"`` when the layout does not say which pairs it holds), then one
        block per other parameter.
        """
        blocks: list[Block] = []
        for bucket, pairs in enumerate(self.gl_pairs):
            tensors = (2 * bucket, 2 * bucket + 1)
            blocks.extend(Block(f"{p.module} {p.kind} head {p.head}".strip(), "head", bucket,
                                tensors, index=i) for i, p in enumerate(pairs))
        factor, position = len(self.gl), 2 * len(self.gl)
        if self.diagonal is not None:
            tensors = (position, position + 1)
            report = getattr(self.layout, "report", None)
            pairs = list(getattr(report, "diagonal", None) or [])
            if sum(p.size for p in pairs) == self.diagonal[0].shape[-1]:
                start = 0
                for p in pairs:
                    blocks.append(Block(f"diagonal {p.u_name} * {p.v_name}", "diagonal",
                                        factor, tensors, span=(start, start + p.size)))
                    start += p.size
            else:
                blocks.append(Block("diagonal", "diagonal", factor, tensors))
            factor, position = factor + 1, position + 2
        blocks.extend(Block(name, "parameter", factor, (position + i,))
                      for i, name in enumerate(self.other_names))
        return blocks


class BoundCoordinates:
    """Quotients attached by :class:`~quotientsharp.models.QuotientBinding`, then the rest."""

    def __init__(self, model: FunctionalModel, bindings: Sequence[Any],
                 excluded: set[str]) -> None:
        self.bindings = list(bindings)
        # the rules QuotientSGD applies too (quotientsharp.models.binding)
        self.bases = validate_bindings(self.bindings, model.theta_geometry)
        seen = {name for binding in self.bindings for name in binding.parameters}
        self.other_names = [n for n in model.trainable if n not in seen and n not in excluded]
        self.other_base = tuple(model.theta_geometry[n] for n in self.other_names)

    def factors(self, other_metric: str = "adaptive", other_path: str = "line",
                **_: Any) -> list[Factor]:
        factors = [Factor(b.quotient, base, b.name, folded=b.folded)
                   for b, base in zip(self.bindings, self.bases, strict=True)]
        if self.other_names:
            factors.append(other_factor(self.other_base, other_metric, other_path))
        return factors

    def other_slot(self, name: str) -> int | None:
        """Position of parameter ``name`` in the point, if it is a tensor of its own in the
        parameters-outside-any-symmetry factor; else ``None``."""
        if name not in self.other_names:
            return None
        return sum(len(base) for base in self.bases) + self.other_names.index(name)

    def updates(self, point: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        point = list(point)
        parameters: dict[str, torch.Tensor] = {}
        for binding, base in zip(self.bindings, self.bases, strict=True):
            part, point = point[:len(base)], point[len(base):]
            parameters.update(binding.parameters_of(part))
        parameters.update(zip(self.other_names, point, strict=True))
        return parameters

    def blocks(self) -> list[Block]:
        """One block per binding (as a whole), then one per other parameter."""
        blocks: list[Block] = []
        position = 0
        for factor, (binding, base) in enumerate(zip(self.bindings, self.bases, strict=True)):
            blocks.append(Block(binding.name, "binding", factor,
                                tuple(range(position, position + len(base)))))
            position += len(base)
        factor = len(self.bindings)
        blocks.extend(Block(name, "parameter", factor, (position + i,))
                      for i, name in enumerate(self.other_names))
        return blocks
