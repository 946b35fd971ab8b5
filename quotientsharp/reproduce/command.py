"""The one skeleton of a study's ``run(config)``: compute, report on rank 0, exit status.

Every study's run is: open (or resume) its results folder, hand its units to the resumable
runner, summarise, write its outputs (the study's own driver, e.g.
:func:`~quotientsharp.reproduce.families.run.family_study`), then print its report on rank 0.
:func:`run_study_command` is the part they share: what an interrupted or refused run says and
the exit status it ends with.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Outcome = TypeVar("Outcome")


def run_study_command(name: str, units: str, out: Path, compute: Callable[[], Outcome],
                      report: Callable[[Outcome], None]) -> int:
    """Run a study's driver and print its report on rank 0; the exit status.

    Parameters
    ----------
    name
        The study (``quotientsharp reproduce NAME``).
    units
        What ``--resume`` keeps, in words (``"nets"``, ``"models"``, ``"grid points"``).
    out
        The results folder, named when the run is interrupted.
    compute
        The driver: runs the study and returns its outcome.
    report
        Prints the outcome (called on rank 0 only).

    Returns
    -------
    int
        0; 130 when interrupted (finished units kept); 2 for a refused setting or folder
        (under torchrun every rank raises the same error, rank 0 reports it).
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
