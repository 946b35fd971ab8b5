"""Determinism of a measurement: the caller's global random state, and a forward that draws.

:func:`check_deterministic` compares the states of the generators a forward can draw from
(torch's, Python's ``random``, NumPy's legacy global one, and those the model's modules hold:
:func:`owned_generators`) before and after a batch's evaluations; it cannot see generators made
inside ``forward`` nor nondeterministic kernels. :func:`kept_global_random_state` leaves the
caller's global random state as it found it.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy
import torch
from torch import nn

from quotientsharp.engine.batches import Batch

#: ``(where, generator, state)`` of a generator a model owns.
OwnedState = tuple[str, Any, Any]


class NondeterministicForwardError(ValueError):
    """The model's forward (or the loss) is not deterministic at fixed parameters."""


def global_torch_states() -> list[torch.Tensor]:
    """torch's global generator states: the CPU one, and every CUDA one where CUDA is
    initialised (never initialised here: reading a state would start it)."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += list(torch.cuda.get_rng_state_all())
    return states


@dataclass
class _GlobalRandomState:
    """torch's, Python's and NumPy's legacy global random states."""

    torch_states: list[torch.Tensor]
    python: Any
    numpy: Any

    @classmethod
    def read(cls) -> _GlobalRandomState:
        return cls(global_torch_states(), random.getstate(),
                   numpy.random.get_state())  # noqa: NPY002 (the caller's legacy global one)

    def write(self) -> None:
        # CUDA may have been initialised inside: only the generators that existed before are
        # restored (a new one's state is then the caller's first use of it anyway)
        torch.set_rng_state(self.torch_states[0])
        if len(self.torch_states) > 1:
            torch.cuda.set_rng_state_all(self.torch_states[1:])
        random.setstate(self.python)
        numpy.random.set_state(self.numpy)  # noqa: NPY002 (the caller's own)


#: The caller's state of the measurement running in this context (``None`` outside one).
_CALLER: contextvars.ContextVar[_GlobalRandomState | None] = contextvars.ContextVar(
    "quotientsharp_caller_random_state", default=None)


@contextlib.contextmanager
def kept_global_random_state() -> Iterator[None]:
    """The caller's global random state restored on leaving the block (module docstring),
    whether it returns or raises; draws made while the caller's batches are iterated
    (:func:`caller_iteration`) are the caller's and stay."""
    caller = _GlobalRandomState.read()
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)
        caller.write()


def caller_iteration(batches: Iterable[Any]) -> Iterator[Any]:
    """``batches`` iterated in the caller's global random state, each of its draws kept in it
    (a ``DataLoader`` with ``shuffle=True`` draws its permutation from torch's global
    generator: rewound with the rest, the caller's next epoch would repeat it), the
    measurement's own state around them left as it was."""
    caller = _CALLER.get()
    if caller is None:
        yield from batches
        return
    iterator = _in_state(caller, lambda: iter(batches))
    while True:
        try:
            item = _in_state(caller, lambda: next(iterator))
        except StopIteration:
            return
        yield item


def _in_state(caller: _GlobalRandomState, step: Callable[[], Any]) -> Any:
    """``step()`` run in the caller's global random state, which then holds its draws."""
    own = _GlobalRandomState.read()
    caller.write()
    try:
        return step()
    finally:
        fresh = _GlobalRandomState.read()
        caller.torch_states, caller.python, caller.numpy = (fresh.torch_states, fresh.python,
                                                            fresh.numpy)
        own.write()


def owned_generators(model: nn.Module | None) -> list[tuple[str, Any]]:
    """The random generators ``model`` owns: ``(module.attribute, generator)`` for every
    attribute of one of its modules that is a ``torch.Generator``, a
    ``numpy.random.Generator`` or a ``numpy.random.RandomState`` (each generator once)."""
    if model is None:
        return []
    kinds = (torch.Generator, numpy.random.Generator, numpy.random.RandomState)
    found: dict[int, tuple[str, Any]] = {}
    for prefix, module in model.named_modules():
        for attribute, value in vars(module).items():
            if isinstance(value, kinds) and id(value) not in found:
                found[id(value)] = (f"{prefix}.{attribute}" if prefix else attribute, value)
    return list(found.values())


def _state_of(generator: Any) -> Any:
    if isinstance(generator, numpy.random.Generator):
        return copy.deepcopy(generator.bit_generator.state)
    return generator.get_state()                # a torch.Generator or a RandomState


def _restore(generator: Any, state: Any) -> None:
    if isinstance(generator, numpy.random.Generator):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


def _same_state(a: Any, b: Any) -> bool:
    """Equality of two generator states: tensors, and lists, tuples and dicts of numbers and
    arrays (a RandomState's is ``(name, keys, pos, has_gauss, cached_gaussian)``)."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return (isinstance(b, dict) and a.keys() == b.keys()
                and all(_same_state(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_same_state(x, y) for x, y in zip(a, b, strict=True)))
    if hasattr(a, "shape"):
        return bool((a == b).all())
    return bool(a == b)


def global_states(model: nn.Module | None = None
                  ) -> tuple[list[torch.Tensor], Any, Any, list[OwnedState]]:
    """Every random state a forward may draw from: torch's (:func:`global_torch_states`),
    Python's ``random``, NumPy's legacy global generator, and the generators ``model`` owns
    (:func:`owned_generators`)."""
    owned = [(where, generator, _state_of(generator))
             for where, generator in owned_generators(model)]
    return (global_torch_states(), random.getstate(),
            numpy.random.get_state(), owned)  # noqa: NPY002 (the caller's legacy global one)


def check_deterministic(before: tuple[list[torch.Tensor], Any, Any, list[OwnedState]],
                        batch: Batch, what: str = "its clean evaluation") -> None:
    """Raise :class:`NondeterministicForwardError`, naming ``batch`` and ``what`` ran, if the
    evaluations since ``before`` (:func:`global_states`) drew from a generator; one the model
    owns is set back first. States, not a second forward: a loss that counts its calls sees
    the same sequence."""
    torch_before, python_before, numpy_before, owned_before = before
    drawn = []
    if not _same_state(torch_before, global_torch_states()):
        drawn.append("torch's global generator (e.g. F.dropout(..., training=True), torch.rand "
                     "or torch.randn_like in forward)")
    if random.getstate() != python_before:
        drawn.append("Python's random module")
    if not _same_state(numpy_before, numpy.random.get_state()):  # noqa: NPY002
        drawn.append("NumPy's global generator")
    for where, generator, state in owned_before:
        if not _same_state(state, _state_of(generator)):
            _restore(generator, state)
            kind = ("torch.Generator" if isinstance(generator, torch.Generator)
                    else f"numpy.random.{type(generator).__name__}")
            drawn.append(f"the generator the model owns at {where} ({kind})")
    if drawn:
        raise NondeterministicForwardError(
            f"the model's forward is not deterministic: {what} on {batch.label} "
            f"drew random numbers from {' and '.join(drawn)}, in eval mode. Sharpness compares "
            "losses at nearby parameters, so random draws in the forward make the value noise "
            "(and would advance the caller's random state); make the forward deterministic in "
            "eval mode (dropout through nn.Dropout, or F.dropout(x, training=self.training))")
