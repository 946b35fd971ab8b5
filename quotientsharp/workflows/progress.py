"""Progress bars of the studies (tqdm)."""

from __future__ import annotations

from typing import Any


def progress_bar(total: int | None, description: str, enabled: bool | None,
                 unit: str = "it") -> Any:
    """A tqdm bar of ``total`` steps (``None``: unknown) named ``unit``, labelled
    ``description``; ``enabled=None`` shows it only when stderr is a terminal."""
    from tqdm.auto import tqdm

    disable = None if enabled is None else not enabled
    return tqdm(total=total, desc=description, unit=unit, disable=disable, leave=False,
                dynamic_ncols=True)
