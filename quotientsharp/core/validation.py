"""Input checks shared by every quotient: shape, dtype and device checks always run; checks on
values (a host sync) can be switched off inside a hot loop with :func:`value_checks`."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import overload

import torch

from quotientsharp.core.scalars import check_int

#: The package's own folder: a warning points at the first frame outside it.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` reported at the line of the code that called into the package (the
    user's call of :func:`quotientsharp.sharpness` or :func:`quotientsharp.find_symmetries`),
    however many of the package's frames lie between: a counted ``stacklevel`` breaks with
    every wrapper added."""
    frame = sys._getframe(1)
    level = 2                   # the caller of this function
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


_VALUE_CHECKS = True


@contextlib.contextmanager
def value_checks(enabled: bool) -> Iterator[None]:
    """Switch the (host-syncing) checks on values on or off inside a block."""
    global _VALUE_CHECKS
    previous, _VALUE_CHECKS = _VALUE_CHECKS, enabled
    try:
        yield
    finally:
        _VALUE_CHECKS = previous


def value_checks_enabled() -> bool:
    return _VALUE_CHECKS


def check_sequence(name: str, value: object, ndims: Sequence[int], what: str = ""
                   ) -> Sequence[object]:
    """Check that ``value`` is a tuple or list of ``len(ndims)`` items (``what``: a note after
    "tensors" in the message)."""
    # one tensor for a tuple would iterate over its rows: zip's "argument 2 is shorter"
    if isinstance(value, torch.Tensor) or not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of {len(ndims)} tensors{what}, got "
                        f"{type(value).__name__}")
    if len(value) != len(ndims):
        raise ValueError(f"{name} must have {len(ndims)} components, got {len(value)}")
    return value


def _check_component(name: str, i: int, t: object, k: int, first: torch.Tensor | None
                     ) -> torch.Tensor:
    """Check component ``i``: a floating tensor with at least ``k`` dimensions, of the dtype and
    device of component 0, ``first`` (``None`` for component 0 itself)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}[{i}] must have a floating dtype, got {t.dtype}")
    if t.dim() < k:
        raise ValueError(f"{name}[{i}] must have at least {k} dimensions, got shape "
                         f"{tuple(t.shape)}")
    if first is None:
        return t
    if t.dtype != first.dtype:
        raise TypeError(f"{name}[{i}] has dtype {t.dtype} but {name}[0] has {first.dtype}")
    if t.device != first.device:
        raise ValueError(f"{name}[{i}] is on {t.device} but {name}[0] is on {first.device}")
    return t


def check_tensors(name: str, tensors: object, ndims: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """Check that ``tensors`` (the argument ``name``) is a tuple of floating tensors of one dtype
    and device, with at least ``ndims[i]`` dimensions each."""
    checked: list[torch.Tensor] = []
    for i, (item, k) in enumerate(zip(check_sequence(name, tensors, ndims), ndims, strict=True)):
        checked.append(_check_component(name, i, item, k, checked[0] if checked else None))
    return tuple(checked)


def check_same_layout(name: str, u: Sequence[torch.Tensor], x_name: str,
                      x: Sequence[torch.Tensor], ndims: Sequence[int]) -> None:
    """Check that tangent ``u`` matches point ``x`` in trailing shapes, dtype and device."""
    for label, value in ((name, u), (x_name, x)):
        check_sequence(label, value, ndims, " (one per factor)")
    for i, (a, b, k) in enumerate(zip(u, x, ndims, strict=True)):
        if tuple(a.shape[a.dim() - k:]) != tuple(b.shape[b.dim() - k:]):
            raise ValueError(f"{name}[{i}] has shape {tuple(a.shape)}, incompatible with "
                             f"{x_name}[{i}] of shape {tuple(b.shape)}")
        if a.dtype != b.dtype:
            raise TypeError(f"{name}[{i}] has dtype {a.dtype} but {x_name}[{i}] has {b.dtype}")
        if a.device != b.device:
            raise ValueError(f"{name}[{i}] is on {a.device} but {x_name}[{i}] is on {b.device}")
    try:
        torch.broadcast_shapes(*[a.shape[: a.dim() - k] for a, k in zip(u, ndims, strict=True)],
                               *[b.shape[: b.dim() - k] for b, k in zip(x, ndims, strict=True)])
    except RuntimeError as err:
        raise ValueError(f"batch shapes of {name} and {x_name} do not broadcast") from err


def check_finite(name: str, tensors: Sequence[torch.Tensor]) -> None:
    if not _VALUE_CHECKS:
        return
    for i, t in enumerate(tensors):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name}[{i}] contains non-finite values (NaN or inf)")


@overload
def check_time(t: float, name: str = "t") -> float: ...


@overload
def check_time(t: torch.Tensor, name: str = "t") -> torch.Tensor: ...


@overload
def check_time(t: object, name: str = "t") -> float | torch.Tensor: ...


def check_time(t: object, name: str = "t") -> float | torch.Tensor:
    """Check a geodesic time: a finite real number (or a floating tensor of finite values).

    A tensor's values are checked only when value checks are on (a host sync). A number is
    returned as a Python ``float``.
    """
    if isinstance(t, torch.Tensor):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a real number or a floating tensor, got a tensor "
                            f"of dtype {t.dtype}")
        if _VALUE_CHECKS and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite, got {t}")
        return t
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(t).__name__} {t!r}")
    if not math.isfinite(t):
        raise ValueError(f"{name} must be finite, got {t!r}")
    # int, numpy scalars, ...: the formulas are written for a Python float (the same value)
    return float(t)


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """:func:`~quotientsharp.core.scalars.check_int` with a count's minimum, 1: a count below
    its minimum makes a check vacuous (zero seeds, samples or models pass anything)."""
    return check_int(name, value, minimum)
