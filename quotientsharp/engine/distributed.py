"""Sharpness over many batches and many models, spread over the ranks of ``torch.distributed``.

Stage: above the pipeline (it calls :func:`~.api.sharpness` per rank and gathers the results);
it touches process groups and results, never the stages' internals.

Launch with ``torchrun`` (``gloo`` on CPU, ``nccl`` on GPUs)::

    # measure.py, run as: torchrun --nproc_per_node 4 measure.py
    import quotientsharp.engine.distributed as qd
    rank, world = qd.init_distributed()             # reads torchrun's environment
    model = ...                                     # the same weights on every rank
    result = qd.distributed_sharpness(model, batches, measure="geodesic", rho=0.1)
    if rank == 0:
        print(result.value, result.per_batch)       # every rank holds the full result

Batches are dealt round-robin (batch ``i`` to rank ``i % world_size``), every rank measures
its own with :func:`quotientsharp.sharpness`, and the per-batch outcomes are all-gathered and
put back in batch order, so the result has the layout of a single-process one.

Equality with a single process. Sharpness is computed on each batch separately, then averaged
over the batches (see ``docs/sharpness.md``); a batch's value depends on the model, the batch,
the options and, for randomised measures, the random stream. ``quotientsharp.sharpness``
draws from one generator seeded once per call, so the draws a batch sees depend on the batches
before it. Here the stream of batch ``i`` is instead seeded with :func:`batch_seed`
``(seed, i)``, which depends on the batch index and never on the rank:

- measures without randomness (ascent measures with ``random_init=False`` and
  ``restarts=0``, the defaults, and relative flatness): each rank makes one ``sharpness`` call
  on its share; per-batch values are bit-identical to those of
  ``quotientsharp.sharpness(model, batches, ...)`` in one process (same device, same threads);
- randomised measures (``average``, ``random_init=True`` or ``restarts > 0``, or a
  ``reference_solve`` with random restarts, its default): one ``sharpness`` call per batch
  with ``seed=batch_seed(seed, i)``; per-batch values are bit-identical to this function's in
  a single process (no process group, or world size 1) and independent of the number of
  ranks, but not equal to one ``quotientsharp.sharpness`` call over all batches (whose draws
  are sequential). The setup (symmetry discovery, Gram factorisations) is then
  repeated per batch.

Parameters without gradient are detected on the first batch of each ``sharpness`` call (on each
rank's first batch, or on every batch for randomised measures); they agree with a single
process unless some batch leaves a parameter without gradient that another batch uses.

Many models: :func:`shard` deals any list (models, checkpoints, configurations) over the ranks,
:func:`gather_indexed` and :func:`distributed_map` put per-item results back in order on every
rank, and :func:`models_sharpness` measures a list of models, each whole on one rank.

Whole programs: :func:`torchrun_world_size` reads whether torchrun asked for several processes,
and :func:`run_on_rank0` runs a step (writing files, checking a results folder) on rank 0 only
and hands its value, or its exception, to every rank; ``quotientsharp reproduce STUDY`` uses
both (see ``docs/cli.md``, "Running studies under torchrun").
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pickle
import re
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from quotientsharp.engine import MEASURES, SharpnessResult, sharpness
from quotientsharp.engine.api import REFERENCE_RESTARTS

__all__ = [
    "batch_seed",
    "describe_collective_failure",
    "distributed_map",
    "distributed_sharpness",
    "gather_indexed",
    "init_distributed",
    "is_randomised",
    "models_sharpness",
    "rank_and_world_size",
    "run_on_rank0",
    "shard",
    "split_models",
    "torchrun_world_size",
]

Item = TypeVar("Item")
Value = TypeVar("Value")


# ---------------------------------------------------------------------------- process group
def init_distributed(backend: str | None = None,
                     timeout: float | datetime.timedelta | None = None) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment, if not yet done.

    Parameters
    ----------
    backend
        ``"gloo"`` or ``"nccl"``; default ``"nccl"`` when CUDA is available, else ``"gloo"``.
        With NCCL the current CUDA device is set to ``LOCAL_RANK``.
    timeout
        Seconds (or a ``timedelta``) that the rendezvous and every collective may wait before
        raising; ``None``: torch's default (30 minutes for gloo, 10 for NCCL).

    Returns
    -------
    tuple
        ``(rank, world_size)``.
    """
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch")
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]
        if missing:
            raise RuntimeError(f"init_distributed reads torchrun's environment, but {missing} "
                               "are not set: launch with torchrun, or call "
                               "torch.distributed.init_process_group yourself")
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if timeout is None:
            dist.init_process_group(backend)
        else:
            if not isinstance(timeout, datetime.timedelta):
                if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                        or not timeout > 0:
                    raise ValueError(f"timeout must be a number of seconds > 0 or a "
                                     f"timedelta, got {timeout!r}")
                timeout = datetime.timedelta(seconds=float(timeout))
            dist.init_process_group(backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def torchrun_world_size(environ: Mapping[str, str] | None = None) -> int:
    """The world size torchrun asks for: ``WORLD_SIZE`` when ``RANK`` and it are set, else 1.

    A value above 1 means "initialise a process group" (:func:`init_distributed`); 1 (no
    torchrun, or ``--nproc_per_node 1``) means "run in this process alone".
    """
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


def rank_and_world_size(group: Any = None) -> tuple[int, int]:
    """``(rank, world_size)`` in ``group``; ``(0, 1)`` without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _check_rank(rank: int | None, world_size: int | None, group: Any) -> tuple[int, int]:
    if rank is None and world_size is None:
        return rank_and_world_size(group)
    if rank is None or world_size is None:
        raise ValueError("pass both rank and world_size, or neither")
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, "
                         f"world_size={world_size}")
    return rank, world_size


_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_LOST = re.compile(r"connection (closed|reset) by peer|pair closure|broken pipe|"
                   r"communicator was aborted|socket closed", re.IGNORECASE)


def describe_collective_failure(error: BaseException,
                                timeout: float | datetime.timedelta | None = None) -> str | None:
    """One readable line for a collective that timed out or lost a rank; ``None`` for others.

    The backends report these as raw messages (gloo: ``[.../unbound_buffer.cc:81] Timed out
    waiting 1800000ms for recv operation to complete``); this says what happened, what to look
    at and that ``--resume`` continues a study where it stopped.
    """
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
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


# ---------------------------------------------------------------------------- dealing and gathering
def shard(items: Iterable[Item], rank: int | None = None, world_size: int | None = None,
          group: Any = None) -> list[tuple[int, Item]]:
    """This rank's share of ``items``: ``(index, item)`` for every ``index % world_size == rank``.

    Round-robin dealing balances ranks when item costs are similar. A sequence (``len`` and
    indexing) is only indexed at this rank's positions; any other iterable is iterated in full
    on every rank (it must yield the same items in the same order everywhere).

    Parameters
    ----------
    items
        Models, batches, configurations...
    rank, world_size
        Default: those of the process group (``0, 1`` without one).
    group
        Process group (default: the world).
    """
    rank, world_size = _check_rank(rank, world_size, group)
    if isinstance(items, (str, bytes, torch.Tensor, Mapping)):
        raise TypeError(f"items must be an iterable of items (not a mapping, string or "
                        f"tensor), got {type(items).__name__}")
    if isinstance(items, Sequence):
        return [(i, items[i]) for i in range(rank, len(items), world_size)]
    if isinstance(items, Sized) and hasattr(items, "__getitem__"):
        # indexable without being a Sequence (a torch Dataset with a length)
        indexable: Any = items
        return [(i, indexable[i]) for i in range(rank, len(items), world_size)]
    if not isinstance(items, Iterable):
        raise TypeError(f"items must be an iterable, got {type(items).__name__}")
    return [(i, item) for i, item in enumerate(items) if i % world_size == rank]


def split_models(models: Sequence[Item], rank: int | None = None,
                 world_size: int | None = None, group: Any = None) -> list[tuple[int, Item]]:
    """This rank's models, ``(index, model)``, dealt round-robin (see :func:`shard`)."""
    return shard(models, rank, world_size, group)


def gather_indexed(local: Sequence[tuple[int, Value]], group: Any = None) -> list[Value]:
    """All-gather ``(index, value)`` pairs from every rank; the values in index order.

    Values travel pickled (``all_gather_object``): move tensors to the CPU first when ranks
    hold different devices. With NCCL each rank's current CUDA device must be its own
    (:func:`init_distributed` sets it). Indices must be distinct and, together, ``0 .. N-1``.
    """
    pairs = list(local)
    rank, world_size = rank_and_world_size(group)
    if world_size > 1:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, pairs, group=group)
        pairs = [pair for part in gathered for pair in part]
    indices = sorted(i for i, _ in pairs)
    if indices != list(range(len(indices))):
        raise ValueError(f"gathered indices are not 0..{len(indices) - 1} exactly once each "
                         f"(got {indices[:10]}{'...' if len(indices) > 10 else ''}); was every "
                         "rank given the same items?")
    by_index = dict(pairs)
    return [by_index[i] for i in range(len(indices))]


def distributed_map(function: Callable[[Item], Value], items: Iterable[Item],
                    group: Any = None) -> list[Value]:
    """``[function(item) for item in items]``, each item on one rank, the list on every rank."""
    return gather_indexed([(i, function(item)) for i, item in shard(items, group=group)],
                          group=group)


def _portable_error(error: Exception) -> Exception:
    """``error`` if it survives pickling, else a RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def run_on_rank0(function: Callable[[], Value], *, share: bool = True,
                 group: Any = None) -> Value | None:
    """Call ``function()`` on rank 0 only; its value, or its exception, reaches every rank.

    The single-writer pattern: rank 0 touches the files (creates a results folder, checks the
    settings of a run being resumed, writes the summary) and the other ranks learn the outcome
    from one ``broadcast_object_list``. An exception raised by ``function`` on rank 0 is raised
    again on every rank (the same type and message, when it can be pickled), so that all ranks
    stop with the same error instead of some of them waiting in a later collective. Without a
    process group (or world size 1) this is ``function()``.

    Parameters
    ----------
    function
        Called with no argument, on rank 0 only.
    share
        Send the value to the other ranks (it must be picklable); otherwise they get ``None``
        (and still learn about an exception).
    group
        Process group (default: the world); ``function`` runs on its rank 0.

    Returns
    -------
    object
        On rank 0 the value itself; on the other ranks an unpickled copy (or ``None``).
    """
    rank, world_size = rank_and_world_size(group)
    if world_size == 1:
        return function()
    source = 0 if group is None else dist.get_global_rank(group, 0)
    box: list[Any] = [None]
    if rank == 0:
        try:
            value = function()
        except Exception as error:
            box[0] = ("error", _portable_error(error))
            dist.broadcast_object_list(box, src=source, group=group)
            raise
        box[0] = ("ok", value if share else None)
        dist.broadcast_object_list(box, src=source, group=group)
        return value
    dist.broadcast_object_list(box, src=source, group=group)
    status, payload = box[0]
    if status == "error":
        raise payload
    return payload


# ---------------------------------------------------------------------------- sharpness
def batch_seed(seed: int, index: int) -> int:
    """The seed of batch ``index`` for base ``seed``: a fixed hash of both, in ``[0, 2^63)``."""
    for name, value in (("seed", seed), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    digest = hashlib.blake2b(f"quotientsharp:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def is_randomised(measure: str, options: dict[str, Any]) -> bool:
    """Whether a measure with these options draws random numbers (see the module docstring)."""
    name = {"worst-case": "worst_case", "relative-flatness": "relative_flatness"}.get(measure,
                                                                                     measure)
    if name == "average":
        return True
    if name == "relative_flatness" or name not in MEASURES:
        return False
    if bool(options.get("random_init", False)) or options.get("restarts", 0) not in (0, None):
        return True
    # a reference solve draws its random restarts (by default 4) from a stream of its own
    reference = options.get("reference_solve")
    if reference is None or reference is False:
        return False
    if isinstance(reference, dict):
        return (bool(reference.get("random_init", False))
                or reference.get("restarts", REFERENCE_RESTARTS) not in (0, None))
    return REFERENCE_RESTARTS != 0


def _parameter_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        if isinstance(tensor, torch.Tensor):
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
                          .tobytes())
    return digest.hexdigest()


def _check_same_model(model: nn.Module, group: Any) -> None:
    rank, world_size = rank_and_world_size(group)
    if world_size == 1:
        return
    digests: list[Any] = [None] * world_size
    dist.all_gather_object(digests, _parameter_digest(model), group=group)
    differing = [r for r, d in enumerate(digests) if d != digests[0]]
    if differing:
        raise ValueError(f"the model's state differs between ranks {differing} and rank 0: "
                         "every rank must measure the same weights (load or seed them the same)")


def _records(result: SharpnessResult, indices: Sequence[int]) -> list[tuple[int, dict]]:
    """Per-batch pieces of a result, tagged with global batch indices (tensors on the CPU)."""
    records = []
    for position, index in enumerate(indices):
        perturbation = None
        kept = None if result.perturbations is None else result.perturbations[position]
        if kept is not None:
            perturbation = {k: v.detach().cpu() for k, v in kept.items()}
        records.append((index, {
            "value": result.per_batch[position],
            "norms": result.perturbation_norms[position],
            "clean": result.clean_losses[position],
            "perturbed": result.perturbed_losses[position],
            "perturbation": perturbation,
            "excluded": list(result.excluded),
            "frozen": list(result.frozen),
            "nonfinite": (result.nonfinite_evaluations[position]
                          if result.nonfinite_evaluations else 0),
            "trace": result.traces[position] if result.traces else None,
            "reference": (result.reference_per_batch[position]
                          if result.reference_per_batch else None),
            "reference_trace": (result.reference_traces[position]
                                if result.reference_traces else None),
            "blocks": result.blocks[position] if result.blocks is not None else None,
            "settings": result.settings if index == indices[0] else None,
        }))
    return records


def distributed_sharpness(model: nn.Module, batches: Iterable, measure: str = "geodesic",
                          rho: float | None = None, *, group: Any = None,
                          check_same_model: bool = True, **options: Any) -> SharpnessResult:
    """:func:`quotientsharp.sharpness` with the batches spread over the ranks.

    Call it on every rank with the same model, batches and options; every rank returns the
    full result (all batches, in order). Without a process group it runs in this process.

    Parameters
    ----------
    model
        The network, with the same weights on every rank (checked by a digest when
        ``check_same_model``); on each rank's own device.
    batches
        Batches as for :func:`quotientsharp.sharpness`; a sequence is only indexed at this
        rank's positions, any other iterable must yield the same batches on every rank.
    measure, rho, **options
        As for :func:`quotientsharp.sharpness`. ``seed`` is the base of the per-batch seeds
        (:func:`batch_seed`) of randomised measures.
    group
        Process group (default: the world).
    check_same_model
        All-gather a digest of the model's state and raise when ranks differ.

    Returns
    -------
    SharpnessResult
        ``settings`` gains ``world_size`` and ``seeding`` (``"per-call"`` for measures without
        randomness, ``"per-batch"`` otherwise); ``excluded`` is the union over ranks.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(batches, (torch.Tensor, str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of batches, got {type(batches).__name__}")
    seed = options.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if check_same_model:
        _check_same_model(model, group)
    _, world_size = rank_and_world_size(group)
    mine = shard(batches, group=group)
    local: list[tuple[int, dict]] = []
    randomised = is_randomised(measure, options)
    if mine and randomised:
        for index, batch in mine:
            result = sharpness(model, [batch], measure, rho, seed=batch_seed(seed, index),
                               **options)
            local.extend(_records(result, [index]))
    elif mine:
        result = sharpness(model, [batch for _, batch in mine], measure, rho, seed=seed,
                           **options)
        local.extend(_records(result, [index for index, _ in mine]))
    records = gather_indexed(local, group=group)
    if not records:
        raise ValueError("batches is empty: sharpness needs at least one batch")
    values = [r["value"] for r in records]
    settings = dict(records[0]["settings"])
    settings.update({"n_batches": len(records), "world_size": world_size,
                     "seeding": "per-batch" if randomised else "per-call", "seed": seed})
    excluded = sorted({name for r in records for name in r["excluded"]})
    keep = records[0]["perturbation"] is not None
    return SharpnessResult(
        measure=settings.get("measure", measure),
        value=sum(values) / len(values),
        per_batch=values,
        settings=settings,
        perturbation_norms=[r["norms"] for r in records],
        clean_losses=[r["clean"] for r in records],
        perturbed_losses=[r["perturbed"] for r in records],
        excluded=excluded,
        perturbations=[r["perturbation"] for r in records] if keep else None,
        frozen=list(records[0]["frozen"]),
        nonfinite_evaluations=[r["nonfinite"] for r in records],
        traces=[r["trace"] for r in records if r.get("trace") is not None],
        reference_per_batch=[r["reference"] for r in records if r.get("reference") is not None],
        reference_traces=[r["reference_trace"] for r in records
                          if r.get("reference_trace") is not None],
        blocks=([r["blocks"] for r in records] if records[0].get("blocks") is not None
                else None),
    )


def models_sharpness(models: Sequence[nn.Module], batches: Sequence, measure: str = "geodesic",
                     rho: float | None = None, *, group: Any = None,
                     **options: Any) -> list[SharpnessResult]:
    """Sharpness of every model (each measured whole on one rank), in order, on every rank.

    ``batches`` must be a sequence (it is iterated once per model). Each model is measured by
    :func:`quotientsharp.sharpness` with the same options, so results are bit-identical to a
    loop in one process. Perturbations kept with ``keep_perturbations=True`` come back on the
    CPU.
    """
    if isinstance(batches, (torch.Tensor, str, bytes)) or not isinstance(batches, Sequence):
        raise TypeError("batches must be a sequence (list or tuple) of batches, got "
                        f"{type(batches).__name__}")

    def measure_one(model: nn.Module) -> SharpnessResult:
        result = sharpness(model, batches, measure, rho, **options)
        if result.perturbations is not None:
            result.perturbations = [None if p is None else {k: v.detach().cpu()
                                                            for k, v in p.items()}
                                    for p in result.perturbations]
        return result

    return distributed_map(measure_one, models, group=group)
