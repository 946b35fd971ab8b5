"""Running a command under torchrun: the process group around it, and its failures in one line.

:func:`run_in_process_group` is shared by ``quotientsharp reproduce`` and ``quotientsharp
study``. Without torchrun (or with one process) it calls the command as it is; with ``W > 1``
processes it initialises the default process group (gloo on CPU, NCCL with CUDA; ``timeout``
seconds for every collective), runs the command, reports a collective that timed out or lost a
rank as one line on stderr (exit status 1), and destroys the group at the end. A caller that
set up its own process group keeps it. torch is imported only when the command runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["DEFAULT_DIST_TIMEOUT", "run_in_process_group"]

#: Seconds a rank may wait in one collective (torch's gloo default). The longest waits of the
#: commands are one unit of work (a model, a grid point) or the diagonal training on rank 0.
DEFAULT_DIST_TIMEOUT = 1800.0


def run_in_process_group(command: Callable[[], int], prefix: str,
                         timeout: float = DEFAULT_DIST_TIMEOUT) -> int:
    """Run ``command()`` in torchrun's process group, if torchrun asked for several processes.

    Parameters
    ----------
    command
        The command's body; returns the exit status. Called on every rank.
    prefix
        How errors start (``"quotientsharp study: error:"``).
    timeout
        Seconds every collective may wait (``--dist-timeout``).

    Returns
    -------
    int
        ``command()``'s status; 2 when torchrun's environment is malformed or the process group
        cannot start; 1 after a collective that timed out or lost a rank.
    """
    from quotientsharp.engine.distributed import torchrun_world_size

    try:
        world_size = torchrun_world_size()
    except ValueError as err:
        print(f"{prefix} {err}", file=sys.stderr)
        return 2
    if world_size == 1:
        return int(command() or 0)
    import torch.distributed as dist

    from quotientsharp.engine.distributed import init_distributed

    if dist.is_available() and dist.is_initialized():
        # a caller that set up its own process group keeps it
        return int(command() or 0)
    try:
        init_distributed(timeout=timeout)
    except (RuntimeError, ValueError) as err:
        print(f"{prefix} cannot start the process group of {world_size} ranks: {err}",
              file=sys.stderr)
        return 2
    try:
        return int(command() or 0)
    except RuntimeError as err:
        from quotientsharp.engine.distributed import describe_collective_failure

        message = describe_collective_failure(err, timeout)
        if message is None:
            raise
        print(f"{prefix} {message}", file=sys.stderr)
        return 1
    finally:
        dist.destroy_process_group()
