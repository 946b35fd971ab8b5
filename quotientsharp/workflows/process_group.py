"""Running under torchrun: the process group, dealing work over its ranks, and its failures
(torch is imported only when a function runs, so that ``--help`` never imports it)."""

from __future__ import annotations

import datetime
import os
import pickle
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

Item = TypeVar("Item")
Value = TypeVar("Value")

#: Seconds a rank may wait in one collective (torch's gloo default): the longest waits are one
#: unit of work (a model, a grid point) or the diagonal training on rank 0.
DEFAULT_DIST_TIMEOUT = 1800.0


def run_in_process_group(command: Callable[[], int], prefix: str,
                         timeout: float = DEFAULT_DIST_TIMEOUT) -> int:
    """``command()``'s exit status, on every rank of torchrun's process group where torchrun
    asked for several; 2 when the group cannot start, 1 after a collective that timed out
    (``timeout`` seconds) or lost a rank, with one line on stderr starting with ``prefix``."""
    try:
        world_size = torchrun_world_size()
    except ValueError as err:
        print(f"{prefix} {err}", file=sys.stderr)
        return 2
    if world_size == 1:
        return int(command() or 0)
    import torch.distributed as dist

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
        message = describe_collective_failure(err, timeout)
        if message is None:
            raise
        print(f"{prefix} {message}", file=sys.stderr)
        return 1
    finally:
        dist.destroy_process_group()


def init_distributed(timeout: float | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, initialised from torchrun's
    environment if not yet done: NCCL (on the ``LOCAL_RANK`` device) with CUDA, else gloo;
    ``timeout``: seconds a collective may wait (``None``: torch's default)."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch")
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]
        if missing:
            raise RuntimeError(f"init_distributed reads torchrun's environment, but {missing} "
                               "are not set: launch with torchrun, or call "
                               "torch.distributed.init_process_group yourself")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float)) or not timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=None if timeout is None
                                else datetime.timedelta(seconds=float(timeout)))
    return dist.get_rank(), dist.get_world_size()


def torchrun_world_size(environ: Mapping[str, str] | None = None) -> int:
    """The world size torchrun asks for: ``WORLD_SIZE`` when ``RANK`` and it are set, else 1
    (no torchrun, or ``--nproc_per_node 1``: run in this process alone)."""
    environ = os.environ if environ is None else environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return 1
    try:
        world_size = int(environ["WORLD_SIZE"])
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, got {environ['WORLD_SIZE']!r}") from None
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE must be >= 1, got {world_size}")
    return world_size


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` without an initialised process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_LOST = re.compile(r"connection (closed|reset) by peer|pair closure|broken pipe|"
                   r"communicator was aborted|socket closed", re.IGNORECASE)


def describe_collective_failure(error: BaseException,
                                timeout: float | None = None) -> str | None:
    """One readable line for a collective that timed out or lost a rank (the backends' own
    say neither what to look at nor that ``--resume`` continues); ``None`` for others."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    rank, world_size = rank_and_world_size()
    who = f"rank {rank} of {world_size}"
    resume = ("Every unit of work finished so far is saved: rerun the same command with "
              "--resume to continue where it stopped")
    if _TIMED_OUT.search(text):
        limit = f" (--dist-timeout {timeout:g} s)" if timeout else ""
        return (f"{who} timed out waiting for the other ranks in a collective operation"
                f"{limit}: another rank probably failed (see its error above) or is still "
                f"busy with one long unit of work. {resume}, with a larger --dist-timeout if a "
                f"single unit takes longer. [backend: {first}]")
    if _LOST.search(text):
        return (f"{who} lost contact with another rank during a collective operation: that "
                f"rank probably stopped (see its error above). {resume}. [backend: {first}]")
    return None


def shard(items: Sequence[Item]) -> list[tuple[int, Item]]:
    """This rank's share of ``items``, dealt round-robin: ``(index, item)`` for every
    ``index % world_size == rank`` (every item without a process group)."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise TypeError(f"items must be a sequence of items (a list or a tuple; not a "
                        f"mapping, string, tensor or iterator), got {type(items).__name__}")
    rank, world_size = rank_and_world_size()
    return [(i, items[i]) for i in range(rank, len(items), world_size)]


def gather_indexed(local: Sequence[tuple[int, Value]]) -> list[Value]:
    """All-gather ``(index, value)`` pairs from every rank; the values in index order (indices
    ``0 .. N-1``, once each). Values travel pickled (tensors best on the CPU)."""
    import torch.distributed as dist

    pairs = list(local)
    world_size = rank_and_world_size()[1]
    if world_size > 1:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, pairs)
        pairs = [pair for part in gathered for pair in part]
    indices = sorted(i for i, _ in pairs)
    if indices != list(range(len(indices))):
        raise ValueError(f"gathered indices are not 0..{len(indices) - 1} exactly once each "
                         f"(got {indices[:10]}{'...' if len(indices) > 10 else ''}); was every "
                         "rank given the same items?")
    by_index = dict(pairs)
    return [by_index[i] for i in range(len(indices))]


def _portable_error(error: Exception) -> Exception:
    """``error`` if it survives pickling, else a RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def run_on_rank0(function: Callable[[], Value], *, share: bool = True) -> Value | None:
    """``function()`` called on rank 0 only; its value (picklable, unless not ``share``d) or
    its exception reaches every rank in one broadcast, so that no rank waits in a later one."""
    import torch.distributed as dist

    rank, world_size = rank_and_world_size()
    if world_size == 1:
        return function()
    box: list[Any] = [None]
    if rank == 0:
        try:
            value = function()
        except Exception as error:
            box[0] = ("error", _portable_error(error))
            dist.broadcast_object_list(box, src=0)
            raise
        box[0] = ("ok", value if share else None)
        dist.broadcast_object_list(box, src=0)
        return value
    dist.broadcast_object_list(box, src=0)
    status, payload = box[0]
    if status == "error":
        raise payload
    return payload
