"""Determinism of a measurement: the caller's global random state, and a forward that draws.

Stage: functional model (around the whole call, after the first batch's clean evaluation and
after every batch's ascent).

A sharpness value is a maximum (or a mean) of loss differences: a forward that draws random
numbers (``F.dropout(x, training=True)``, ``torch.rand`` in ``forward``) makes every one of
them noise, and the value changes from run to run without a warning. :func:`check_deterministic`
detects it by the states of the generators a forward can draw from, compared before and after:

- the global ones: torch's CPU generator and every initialised CUDA one, Python's ``random``,
  NumPy's legacy global generator (``np.random.rand``, ``np.random.seed``);
- the generators the model owns (:func:`owned_generators`): every attribute of one of its
  modules that is a ``torch.Generator``, a ``numpy.random.Generator`` (``default_rng``) or a
  ``numpy.random.RandomState``.

It runs after batch 0's clean evaluation and after each batch's whole ascent (every forward of
it): reading the states costs about 10 microseconds per generator plus a walk over the modules'
attributes (measured: under 1 ms for a BERT-base-sized module tree), against at least one
forward and backward per batch, so every batch is checked.

What it does not see: a generator that is neither global nor an attribute of a module (a
``default_rng()`` made inside ``forward``, one in a closure, a list or a dict, a module-level
variable of the user's code, ``secrets`` or ``os.urandom``), draws on the CUDA generator of a
device CUDA had not initialised before the call, and randomness that draws from no generator
(a race in a custom kernel, nondeterministic atomics of CUDA reductions, which change values
by rounding).

:func:`kept_global_random_state` makes :func:`~.api.sharpness` leave the caller's global
random state (torch's CPU generator, the CUDA generators where CUDA is initialised, Python's
``random`` and NumPy's legacy global generator) as it found it, whether the call returns or
raises: the engine draws from its own seeded generator only, but a user's forward or loss may
draw from the global ones.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Iterator
from typing import Any

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


def _set_torch_states(states: list[torch.Tensor]) -> None:
    torch.set_rng_state(states[0])
    if len(states) > 1:
        torch.cuda.set_rng_state_all(states[1:])


@contextlib.contextmanager
def kept_global_random_state() -> Iterator[None]:
    """The caller's global random state restored on leaving the block (module docstring),
    whether it returns or raises."""
    torch_states = global_torch_states()
    python_state = random.getstate()
    numpy_state = _numpy_state()
    try:
        yield
    finally:
        # CUDA may have been initialised inside: only the generators that existed before are
        # restored (a new one's state is then the caller's first use of it anyway)
        _set_torch_states(torch_states)
        random.setstate(python_state)
        if numpy_state is not None:
            import numpy

            numpy.random.set_state(numpy_state)  # noqa: NPY002 (the caller's own)


def _numpy_state() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency
        return None
    return numpy.random.get_state()  # noqa: NPY002 (the legacy global one is the caller's)


def owned_generators(model: nn.Module | None) -> list[tuple[str, Any]]:
    """The random generators ``model`` owns: ``(module.attribute, generator)`` for every
    attribute of one of its modules that is a ``torch.Generator``, a
    ``numpy.random.Generator`` or a ``numpy.random.RandomState`` (each generator once)."""
    if model is None:
        return []
    try:
        import numpy
        kinds: tuple[type, ...] = (torch.Generator, numpy.random.Generator,
                                   numpy.random.RandomState)
    except ImportError:  # pragma: no cover - numpy is a dependency
        kinds = (torch.Generator,)
    found: dict[int, tuple[str, Any]] = {}
    for prefix, module in model.named_modules():
        for attribute, value in vars(module).items():
            if isinstance(value, kinds) and id(value) not in found:
                found[id(value)] = (f"{prefix}.{attribute}" if prefix else attribute, value)
    return list(found.values())


def _state_of(generator: Any) -> Any:
    if isinstance(generator, torch.Generator):
        return generator.get_state()
    if hasattr(generator, "bit_generator"):     # numpy.random.Generator
        return copy.deepcopy(generator.bit_generator.state)
    return generator.get_state()                # numpy.random.RandomState


def _restore(generator: Any, state: Any) -> None:
    if isinstance(generator, torch.Generator):
        generator.set_state(state)
    elif hasattr(generator, "bit_generator"):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, tuple):                    # RandomState: (name, keys, pos, gauss, cached)
        return _numpy_states_equal(a, b)
    return _nested_equal(a, b)


def _nested_equal(a: Any, b: Any) -> bool:
    """Equality of bit-generator states (dicts of ints and arrays)."""
    if isinstance(a, dict):
        return (isinstance(b, dict) and a.keys() == b.keys()
                and all(_nested_equal(a[k], b[k]) for k in a))
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
    return global_torch_states(), random.getstate(), _numpy_state(), owned


def _numpy_states_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    # ("MT19937", keys array, position, has_gauss, cached_gaussian)
    return (a[0] == b[0] and bool((a[1] == b[1]).all()) and a[2:] == b[2:])


def check_deterministic(before: tuple[list[torch.Tensor], Any, Any, list[OwnedState]],
                        batch: Batch, what: str = "its clean evaluation") -> None:
    """Raise :class:`NondeterministicForwardError` if the evaluations just made drew from a
    global random generator or from one the model owns.

    Parameters
    ----------
    before
        :func:`global_states` (of the model) taken just before the evaluations.
    batch
        The batch, named in the message.
    what
        The evaluations, named in the message (``"its clean evaluation"``, ``"its ascent"``).

    Notes
    -----
    A draw is detected by the generators' states, not by evaluating the loss twice: no extra
    forward, and a user's loss that counts its calls sees the same sequence as before. A
    generator the model owns that drew is set back to its state before, so that the refused
    call leaves the model's random state as it found it.
    """
    torch_before, python_before, numpy_before, owned_before = before
    torch_after, python_after, numpy_after = (global_torch_states(), random.getstate(),
                                              _numpy_state())
    drawn = []
    if len(torch_after) != len(torch_before) or any(
            not torch.equal(a, b) for a, b in zip(torch_before, torch_after, strict=False)):
        drawn.append("torch's global generator (e.g. F.dropout(..., training=True), torch.rand "
                     "or torch.randn_like in forward)")
    if python_after != python_before:
        drawn.append("Python's random module")
    if not _numpy_states_equal(numpy_before, numpy_after):
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
