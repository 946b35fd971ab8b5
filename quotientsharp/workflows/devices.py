"""The torch device of ``--device``, checked before any model is loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quotientsharp.workflows.options import InputError

if TYPE_CHECKING:
    import torch


def check_device(text: str) -> torch.device:
    """The device of ``--device``, or an :class:`InputError` when this torch or machine lacks
    it."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as err:
        raise InputError(f"--device {text!r}: {err}") from err
    if device.type == "meta":
        raise InputError("--device meta holds no data: choose cpu or an accelerator")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA device is visible")
            raise InputError(f"--device {text}: CUDA is not available ({why}; torch "
                             f"{torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise InputError(f"--device {text}: this machine has {count} CUDA device(s)")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"--device {text} is not usable here: {first}") from err
    return device
