"""Determinism of a measurement: the caller's global random state, and a forward that draws.

Stage: functional model (around the whole call and after the first batch's clean evaluation).

A sharpness value is a maximum (or a mean) of loss differences: a forward that draws random
numbers (``F.dropout(x, training=True)``, ``torch.rand`` in ``forward``) makes every one of
them noise, and the value changes from run to run without a warning. :func:`check_deterministic`
detects it after the first batch's clean evaluation: a draw advances a global generator
(torch's CPU or CUDA one, Python's ``random``, NumPy's legacy global generator).

:func:`kept_global_random_state` makes :func:`~.api.sharpness` leave the caller's global
random state (torch's CPU generator, the CUDA generators where CUDA is initialised, Python's
``random`` and NumPy's legacy global generator) as it found it, whether the call returns or
raises: the engine draws from its own seeded generator only, but a user's forward or loss may
draw from the global ones.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import torch

from quotientsharp.engine.batches import Batch

__all__ = ["NondeterministicForwardError", "check_deterministic", "global_states",
           "global_torch_states", "kept_global_random_state"]

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


def global_states() -> tuple[list[torch.Tensor], Any, Any]:
    """Every global random state a forward may draw from: torch's
    (:func:`global_torch_states`), Python's ``random`` and NumPy's legacy global generator."""
    return global_torch_states(), random.getstate(), _numpy_state()


def _numpy_states_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    # ("MT19937", keys array, position, has_gauss, cached_gaussian)
    return (a[0] == b[0] and bool((a[1] == b[1]).all()) and a[2:] == b[2:])


def check_deterministic(before: tuple[list[torch.Tensor], Any, Any], batch: Batch) -> None:
    """Raise :class:`NondeterministicForwardError` if the clean evaluation just made drew
    from a global random generator.

    Parameters
    ----------
    before
        :func:`global_states` taken just before the clean evaluation.
    batch
        The batch, named in the message.

    Notes
    -----
    A draw is detected by the generators' states, not by evaluating the loss twice: no extra
    forward, and a user's loss that counts its calls sees the same sequence as before.
    """
    torch_before, python_before, numpy_before = before
    torch_after, python_after, numpy_after = global_states()
    drawn = []
    if len(torch_after) != len(torch_before) or any(
            not torch.equal(a, b) for a, b in zip(torch_before, torch_after, strict=False)):
        drawn.append("torch's global generator (e.g. F.dropout(..., training=True), torch.rand "
                     "or torch.randn_like in forward)")
    if python_after != python_before:
        drawn.append("Python's random module")
    if not _numpy_states_equal(numpy_before, numpy_after):
        drawn.append("NumPy's global generator")
    if drawn:
        raise NondeterministicForwardError(
            f"the model's forward is not deterministic: its clean evaluation on {batch.label} "
            f"drew random numbers from {' and '.join(drawn)}, in eval mode. Sharpness compares "
            "losses at nearby parameters, so random draws in the forward make the value noise "
            "(and would advance the caller's random state); make the forward deterministic in "
            "eval mode (dropout through nn.Dropout, or F.dropout(x, training=self.training))")
