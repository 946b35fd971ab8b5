"""The one skeleton of a study's ``run(config)``: compute, report on rank 0, exit status."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Outcome = TypeVar("Outcome")


def run_study_command(name: str, units: str, out: Path, compute: Callable[[], Outcome],
                      report: Callable[[Outcome], None]) -> int:
    """Run study ``name``'s driver ``compute`` and ``report`` its outcome on rank 0; the exit
    status: 0; 130 when interrupted (the finished ``units``, ``"nets"`` or ``"grid points"``,
    are kept in ``out``); 2 for a refused setting or folder (under torchrun every rank raises
    the same error, rank 0 reports it).
    """
    from quotientsharp.workflows.records import is_main_rank

    try:
        outcome = compute()
    except KeyboardInterrupt:
        if is_main_rank():
            print(f"\ninterrupted: finished {units} are kept in {out}; continue with --resume",
                  file=sys.stderr)
        return 130
    except (ValueError, NotADirectoryError) as err:
        if is_main_rank():
            print(f"quotientsharp reproduce {name}: error: {err}", file=sys.stderr)
        return 2
    if is_main_rank():
        report(outcome)
    return 0
