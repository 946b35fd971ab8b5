"""Progress bars of the studies (tqdm)."""

from __future__ import annotations

from typing import Any


def progress_bar(total: int | None, description: str, enabled: bool | None,
                 unit: str = "it") -> Any:
    """A tqdm bar; ``enabled=None`` shows it only on a terminal.

    Parameters
    ----------
    total
        Number of steps (``None``: unknown).
    description
        The bar's label.
    enabled
        Show it (``None``: only when stderr is a terminal).
    unit
        Name of one step.
    """
    from tqdm.auto import tqdm

    disable = None if enabled is None else not enabled
    return tqdm(total=total, desc=description, unit=unit, disable=disable, leave=False,
                dynamic_ncols=True)
