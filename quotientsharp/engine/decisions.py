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

On a device, a ``torch.where`` per tensor is a kernel launch per tensor: four or five per
parameter tensor and iteration (the best pair kept, a failed step undone), which made the
step launch-bound on a GPU. For a single problem the device path therefore keeps the best pair
in a few flat buffers (:class:`FlatTuple`) and decides over a whole buffer at once: one
``cat`` and one ``where`` per buffer, however many tensors it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

Tensors = tuple[torch.Tensor, ...]


def lift(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (``shape=P``) with trailing singleton dims to broadcast against ``like``."""
    # one shape argument: the unpacked form is an empty call for two 0-dim tensors
    return values.reshape(tuple(values.shape) + (1,) * (like.dim() - values.dim()))


def choose(flag: torch.Tensor, a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Tensors:
    """``where(flag, a, b)`` per tensor, ``flag`` of ``shape=P`` lifted to each tensor."""
    return tuple(torch.where(lift(flag, x), x, y) for x, y in zip(a, b, strict=True))


def choose_into(flag: torch.Tensor, new: Sequence[torch.Tensor],
                best: Sequence[torch.Tensor]) -> None:
    """``best <- where(flag, new, best)`` in place: no second tuple alive while it is chosen."""
    for x, b in zip(new, best, strict=True):
        torch.where(lift(flag, x), x, b, out=b)


class FlatTuple(tuple[torch.Tensor, ...]):
    """A tuple of tensors that are views of a few flat buffers, one per span of the tuple.

    The tensors are contiguous views, shaped as usual: to everything but this module it is a
    tuple. :attr:`spans` are ``(start, stop)`` indices into the tuple and :attr:`buffers` the
    matching 1-D buffers, so that one ``torch.where`` over a buffer decides for all the
    tensors of its span. A span holds tensors of one dtype and device, at most
    :func:`span_limit` elements: a buffer-sized temporary (the other side of a decision,
    concatenated) then stays a fraction of the tuple.
    """

    spans: tuple[tuple[int, int], ...]
    buffers: tuple[torch.Tensor, ...]

    @classmethod
    def copy_of(cls, tensors: Sequence[torch.Tensor]) -> FlatTuple:
        """A copy of ``tensors`` in new flat buffers (``cat`` per span: a few launches)."""
        spans = flat_spans(tensors)
        buffers = tuple(_concatenated(tensors, span) for span in spans)
        return cls._over(tensors, spans, buffers)

    @classmethod
    def _over(cls, like: Sequence[torch.Tensor], spans: tuple[tuple[int, int], ...],
              buffers: tuple[torch.Tensor, ...]) -> FlatTuple:
        views = []
        for (start, stop), buffer in zip(spans, buffers, strict=True):
            offset = 0
            for t in like[start:stop]:
                views.append(buffer[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()
        flat = cls(views)
        flat.spans, flat.buffers = spans, buffers
        return flat


def span_limit(tensors: Sequence[torch.Tensor]) -> int:
    """The most elements a span of :class:`FlatTuple` holds: the largest tensor, or an eighth
    of the tuple if that is more (about eight ``where`` launches per tuple)."""
    sizes = [t.numel() for t in tensors]
    return max(max(sizes, default=0), -(-sum(sizes) // 8))


def flat_spans(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """Consecutive runs of ``tensors`` of one dtype and device, each of at most
    :func:`span_limit` elements: the spans of a :class:`FlatTuple` over them."""
    limit = span_limit(tensors)
    spans: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, t in enumerate(tensors):
        first = tensors[start]
        if i > start and (t.dtype != first.dtype or t.device != first.device
                          or size + t.numel() > limit):
            spans.append((start, i))
            start, size = i, 0
        size += t.numel()
    if tensors:
        spans.append((start, len(tensors)))
    return tuple(spans)


def _concatenated(tensors: Sequence[torch.Tensor], span: tuple[int, int]) -> torch.Tensor:
    """The span's tensors flattened into one new 1-D tensor (one ``cat``)."""
    start, stop = span
    return torch.cat([t.reshape(-1) for t in tensors[start:stop]])


def _flat_compatible(flag: torch.Tensor, a: Sequence[torch.Tensor],
                     b: Sequence[torch.Tensor]) -> bool:
    """Whether a flat decision applies: one problem (a 0-dim flag), and two tuples of the same
    length whose tensors match in shape, dtype and device (no broadcasting)."""
    return (flag.dim() == 0 and len(a) == len(b) > 0
            and all(x.shape == y.shape and x.dtype == y.dtype and x.device == y.device
                    for x, y in zip(a, b, strict=True)))


def _buffer(tensors: Sequence[torch.Tensor], span: tuple[int, int]) -> torch.Tensor:
    """The span of ``tensors`` as one 1-D tensor: their own buffer where ``tensors`` is a
    :class:`FlatTuple` with that span (the shapes are checked equal by the caller), else a
    new concatenation."""
    if isinstance(tensors, FlatTuple) and span in tensors.spans:
        return tensors.buffers[tensors.spans.index(span)]
    return _concatenated(tensors, span)


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

    The best iterate owns its storage and is overwritten in place, so that no second
    parameter-sized tuple is alive while it is chosen. For one problem (a 0-dim flag) it is a
    :class:`FlatTuple` and every decision runs over whole flat buffers: a few launches per
    tuple instead of one per tensor, the same values bit for bit. Batched problems (a flag of
    ``shape=P``) decide per tensor, the flag lifted to each.
    """

    skips_unit_rescale = False

    def own(self, tensors: Sequence[torch.Tensor]) -> Tensors:
        return FlatTuple.copy_of(tensors) if tensors else ()

    def keep(self, flag: torch.Tensor, new: Tensors, best: Tensors) -> Tensors:
        if isinstance(best, FlatTuple) and _flat_compatible(flag, new, best):
            # a span of new at a time: the temporary is at most span_limit elements
            for span, buffer in zip(best.spans, best.buffers, strict=True):
                torch.where(flag, _buffer(new, span), buffer, out=buffer)
            return best
        choose_into(flag, new, best)
        return best

    def pick(self, flag: torch.Tensor, a: Tensors, b: Tensors) -> Tensors:
        if not _flat_compatible(flag, a, b):
            return choose(flag, a, b)
        # b's copy is the result's storage (a new tuple, as choose makes), a decided into it
        result = FlatTuple.copy_of(b)
        for span, buffer in zip(result.spans, result.buffers, strict=True):
            torch.where(flag, _buffer(a, span), buffer, out=buffer)
        return result


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


__all__ = ["ON_DEVICE", "ON_HOST", "Decisions", "FlatTuple", "OnDevice", "OnHost", "choose",
           "choose_into", "decisions_for", "flat_spans", "lift", "span_limit"]
