"""Solver stage: where the ascent's per-problem decisions are taken, on the host or the device.

The solver (:mod:`.solver`) decides, per problem, whether a step improved the best loss,
whether a step failed, whether to restart at a checkpoint; the ball (:mod:`.ball`) decides
whether a rescale is by exactly 1. On a device every decision is a ``torch.where`` over the
tensors involved, so that nothing waits for the device. For a single problem on the CPU reading
a decision is free (there is no device to wait for), so it is read and the chosen tensors are
kept by reference instead. Both give the same values bit for bit.

That one difference lives here, in two small strategy objects chosen once per run by
:func:`decisions_for`; the loop itself has one code path. This module touches tangent tuples
only (no geometry, no model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

Tensors = tuple[torch.Tensor, ...]


def lift(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (``shape=P``) with trailing singleton dims to broadcast against ``like``."""
    return values.reshape(*values.shape, *([1] * (like.dim() - values.dim())))


def choose(flag: torch.Tensor, a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Tensors:
    """``where(flag, a, b)`` per tensor, ``flag`` of ``shape=P`` lifted to each tensor."""
    return tuple(torch.where(lift(flag, x), x, y) for x, y in zip(a, b, strict=True))


def choose_into(flag: torch.Tensor, new: Sequence[torch.Tensor],
                best: Sequence[torch.Tensor]) -> None:
    """``best <- where(flag, new, best)`` in place: no second tuple alive while it is chosen."""
    for x, b in zip(new, best, strict=True):
        torch.where(lift(flag, x), x, b, out=b)


class Decisions(Protocol):
    """How the solver applies a per-problem decision (a boolean tensor of ``shape=P``)."""

    #: Whether a rescale by exactly 1 may be skipped after testing the factor on the host
    #: (:meth:`~.ball.GeodesicBall.clip`; a flag, not a call, as it is read on every clip).
    skips_unit_rescale: bool

    def own(self, tensors: Sequence[torch.Tensor]) -> Tensors:
        """The best iterate's first value: storage :meth:`keep` may write to, or a reference."""
        ...

    def keep(self, flag: torch.Tensor, new: Tensors, best: Tensors) -> Tensors:
        """The best iterate after a step: ``new`` where ``flag``, else ``best``."""
        ...

    def pick(self, flag: torch.Tensor, a: Tensors, b: Tensors) -> Tensors:
        """``a`` where ``flag``, else ``b`` (a restart, a failed step)."""
        ...


class OnDevice:
    """Every decision a ``torch.where`` on the device: no host sync, ever.

    The best iterate owns its storage and is overwritten in place (:func:`choose_into`), so
    that no second parameter-sized tuple is alive while it is chosen.
    """

    skips_unit_rescale = False

    def own(self, tensors: Sequence[torch.Tensor]) -> Tensors:
        return tuple(t.clone() for t in tensors)

    def keep(self, flag: torch.Tensor, new: Tensors, best: Tensors) -> Tensors:
        choose_into(flag, new, best)
        return best

    def pick(self, flag: torch.Tensor, a: Tensors, b: Tensors) -> Tensors:
        return choose(flag, a, b)


class OnHost:
    """Decisions of a single problem on the CPU, read on the host (free there).

    The chosen tuple is kept by reference: no tensor the solver holds is ever written in place,
    so sharing is safe, and no parameter-sized ``torch.where`` runs per step.
    """

    skips_unit_rescale = True

    def own(self, tensors: Sequence[torch.Tensor]) -> Tensors:
        return tuple(tensors)

    def keep(self, flag: torch.Tensor, new: Tensors, best: Tensors) -> Tensors:
        return new if bool(flag) else best

    def pick(self, flag: torch.Tensor, a: Tensors, b: Tensors) -> Tensors:
        return a if bool(flag) else b


ON_DEVICE: Decisions = OnDevice()
ON_HOST: Decisions = OnHost()


def decisions_for(loss: torch.Tensor, host_decisions: bool = True) -> Decisions:
    """:data:`ON_HOST` for one problem (a 0-dim ``loss``) on the CPU when ``host_decisions``,
    else :data:`ON_DEVICE` (``host_decisions=False`` runs the device path on the CPU too: the
    CPU stand-in of a CUDA run, with the same values bit for bit)."""
    if host_decisions and loss.device.type == "cpu" and loss.dim() == 0:
        return ON_HOST
    return ON_DEVICE


__all__ = ["ON_DEVICE", "ON_HOST", "Decisions", "OnDevice", "OnHost", "choose", "choose_into",
           "decisions_for", "lift"]
