"""Validation stage: the checks of the options every measure shares that need torch; each
returns the option resolved, or raises naming it (the torch-free ones are in
:mod:`quotientsharp.core.scalars`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from quotientsharp.core.scalars import as_integer, as_real, check_finite


def check_batches(batches: object) -> Iterable[Any]:
    """``batches`` if it is an iterable of batches (not a tensor, a string or a mapping)."""
    if isinstance(batches, (torch.Tensor, str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of batches, got {type(batches).__name__}")
    if isinstance(batches, Mapping):
        # iterating a dict gives its keys: each would be refused as a batch of type str
        raise TypeError(f"batches must be an iterable of batches, got a {type(batches).__name__} "
                        f"(keys {sorted(map(str, batches))[:5]}): one batch? pass [batch]")
    return batches


def check_rho(rho: object, needed: bool) -> float | None:
    """``rho`` as a float (a one-element tensor, an integer or a NumPy number converted)."""
    if not needed:
        if rho is not None:
            raise ValueError("relative_flatness has no radius: leave rho unset")
        return None
    if rho is None:
        raise ValueError("rho is required (the radius of the perturbation)")
    if isinstance(rho, torch.Tensor) and rho.numel() == 1:
        rho = float(rho)
    integer = as_integer(rho)
    if integer is not None and abs(integer) > 2 ** 1023:
        raise ValueError(f"rho must be a finite number > 0 that fits in a float64, got an "
                         f"integer of {len(str(abs(integer)))} digits")
    if as_real(rho) is None:
        raise TypeError(f"rho must be a number, got {type(rho).__name__}")
    return check_finite("rho", rho)


def check_radius_fits(rho: float | None, eta0: float | None, dtype: torch.dtype) -> None:
    """Raise when ``rho`` (or the step ``eta0``) is so large that the squared norm of a
    perturbation overflows the geometry's dtype (the ball's rescale would silently return 0),
    or so small that it underflows (``rho`` itself zero or subnormal there, or its square)."""
    for label, value in (("rho", rho), ("eta0", eta0)):
        if value is not None:
            _check_size(label, value, dtype)


def _check_size(label: str, value: float, dtype: torch.dtype) -> None:
    finfo, name = torch.finfo(dtype), str(dtype).removeprefix("torch.")
    largest = math.sqrt(finfo.max) / 16
    if value >= largest:
        raise ValueError(f"{label}={value:g} is too large for the geometry's {name}: the "
                         f"squared norm of a perturbation that size overflows (largest "
                         f"finite {name}: {finfo.max:.3g}), which would silently shrink every "
                         f"step to zero; use {label} < {largest:.3g}")
    # the mirror of the bound above: below sqrt(tiny) the squared norm of a perturbation is
    # zero or subnormal, so the ball's clip cannot tell a point inside from one outside
    smallest = math.sqrt(finfo.tiny) * 16
    if value <= smallest:
        cast = float(torch.tensor(value, dtype=torch.float64).to(dtype))
        what = ("it rounds to zero" if cast == 0.0 else "it is subnormal" if cast < finfo.tiny
                else "its square underflows")
        raise ValueError(f"{label}={value:g} is too small for the geometry's {name}: {what} "
                         f"there (smallest normal {name}: {finfo.tiny:.3g}), so the norm of a "
                         f"perturbation that size reads zero and the ball is lost; "
                         f"use {label} > {smallest:.3g}")


def check_geometry_dtype(dtype: object) -> torch.dtype | None:
    if dtype is None:
        return None
    named = {"float32": torch.float32, "float64": torch.float64}
    if isinstance(dtype, str) and dtype in named:
        return named[dtype]
    if dtype in (torch.float32, torch.float64):
        return dtype
    raise ValueError(f"geometry_dtype must be None, torch.float32 or torch.float64 (or their "
                     f"names), got {dtype!r}")
