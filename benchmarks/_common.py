"""Shared pieces of the benchmark table: clocks, interleaved median timing, models, memory peaks.

Timing. Every figure of the table is a ratio of two (or more) timings taken in the same run,
interleaved round-robin (A B C A B C ...) so that slow drifts of a shared machine hit every
candidate alike, and reduced to medians. On CPU the clock is the process CPU time
(``time.process_time``): a shared machine that makes the process wait for a core does not
inflate it, which keeps ratios stable under load (with one intra-op thread, the default of
``run.py`` on CPU, it is the work done by that thread). On CUDA the clock is wall time after
``torch.cuda.synchronize``. Wall times are recorded next to the CPU times in the JSON.

Memory. On CUDA: ``torch.cuda.max_memory_allocated`` above the allocation before the call. On
CPU: the torch profiler with ``profile_memory=True`` reports every allocation and free of the
CPU allocator with the running total of bytes allocated since profiling started; the peak of
that total is the peak of torch tensor memory allocated during the call (tensors that existed
before the call are not counted, their frees are ignored). Python objects outside torch are not
counted; they are negligible here.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "Timing",
    "bert_batch",
    "bert_model",
    "device_synchronize",
    "operator_counts",
    "operator_names",
    "peak_memory",
    "tensor_bytes",
    "time_interleaved",
]


@contextlib.contextmanager
def without_path_check() -> Iterator[None]:
    """``quotientsharp.sharpness`` without the exact-path check of order-2 values.

    The check runs once per call, after the ascent, and its work depends on the point found
    (its integration stops where the geodesic leaves the full-rank points): in a difference of
    two calls with different ``n_iter`` it does not cancel, and it is not part of an iteration.
    A checkout without the check is left as it is."""
    import quotientsharp.engine.measures as measures

    saved = getattr(measures, "path_check", None)
    if saved is not None:
        measures.path_check = lambda *args, **kwargs: {}  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if saved is not None:
            measures.path_check = saved  # type: ignore[attr-defined]


def device_synchronize(device: torch.device) -> None:
    """Wait for queued kernels (CUDA); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    """Repeated timings of one callable, in seconds.

    Attributes
    ----------
    samples
        Per repetition, the clock used for ratios (CPU time on CPU, wall time on CUDA).
    wall
        Per repetition, wall time.
    """

    samples: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    def as_dict(self) -> dict[str, float | list[float]]:
        return {"median_s": self.median, "wall_median_s": self.wall_median,
                "samples_s": self.samples}


def time_interleaved(functions: Mapping[str, Callable[[], object]], repeats: int,
                     device: torch.device, warmup: int = 1) -> dict[str, Timing]:
    """Time each callable ``repeats`` times, round-robin, after ``warmup`` untimed rounds.

    Parameters
    ----------
    functions
        Name to a callable without arguments.
    repeats
        Timed rounds (each round calls every callable once, in order).
    device
        Selects the clock (see the module docstring) and what to synchronise.
    warmup
        Untimed rounds first (allocator, lazy initialisation, caches).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    use_wall = device.type == "cuda"
    clock = time.perf_counter if use_wall else time.process_time
    for _ in range(warmup):
        for function in functions.values():
            function()
            device_synchronize(device)
    timings = {name: Timing() for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            device_synchronize(device)
            start, start_wall = clock(), time.perf_counter()
            function()
            device_synchronize(device)
            timings[name].samples.append(clock() - start)
            timings[name].wall.append(time.perf_counter() - start_wall)
    return timings


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (an iterable of tensors)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


#: Operators that launch no kernel although their schema does not mark an alias:
#: ``_unsafe_view`` is a view that autograd does not track as one (``matmul`` folds its batch
#: dimensions with it), and the ``empty`` family only allocates.
NO_KERNEL = frozenset({"_unsafe_view", "empty", "empty_strided", "new_empty",
                       "new_empty_strided", "empty_like"})


def launches_kernel(func) -> bool:
    """Whether an aten operator launches work on a GPU: neither a view (an alias of its input
    that it does not write: view, expand, detach, transpose) nor one of :data:`NO_KERNEL`."""
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return False
    return func.overloadpacket.__name__ not in NO_KERNEL


class _OperatorCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.computing = 0
        self.views = 0
        self.names: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # metadata only (a view) or an allocation: no kernel; every other operator launches work
        if not launches_kernel(func):
            self.views += 1
        else:
            self.computing += 1
            self.names[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def operator_counts(function: Callable[[], object]) -> dict[str, int]:
    """Operators ``function()`` dispatches: ``computing`` (each a kernel launch on a GPU, at
    least one) and ``views`` (metadata only, or an allocation: :func:`launches_kernel`). A
    device-independent measure of launch overhead:
    a Python loop over a model's parameter tensors shows here as operators per tensor.
    """
    counter = _OperatorCounter()
    with counter:
        function()
    return {"computing": counter.computing, "views": counter.views}


def operator_names(function: Callable[[], object]) -> collections.Counter[str]:
    """The computing operators of :func:`operator_counts`, counted by name."""
    counter = _OperatorCounter()
    with counter:
        function()
    return counter.names


def peak_memory(function: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of torch tensors allocated while ``function()`` runs (see the module docstring).

    Returns
    -------
    int
        Peak allocated bytes above what was allocated before the call.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        function()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        function()
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        prof.export_chrome_trace(path)
        with open(path) as stream:
            events = json.load(stream)["traceEvents"]
    finally:
        os.unlink(path)
    totals = [event["args"]["Total Allocated"] for event in events
              if event.get("name") == "[memory]" and event.get("args", {}).get("Device Type") == 0]
    return int(max(totals, default=0))


# ---------------------------------------------------------------------------- models
def bert_model(hidden: int, layers: int, heads: int, seq: int, vocab: int, labels: int,
               dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised ``BertForSequenceClassification`` from a config (eager attention).

    ``intermediate_size = 4 * hidden`` as in BERT; nothing is downloaded.
    """
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=seq,
        num_labels=labels, attn_implementation="eager")
    model = transformers.BertForSequenceClassification(config)
    return model.to(device=device, dtype=dtype).eval()


def bert_batch(batch_size: int, seq: int, vocab: int, labels: int, device: torch.device,
               seed: int = 1) -> dict[str, torch.Tensor]:
    """A HuggingFace-style batch of random tokens and labels (``shape=[batch_size, seq]``)."""
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab, (batch_size, seq), generator=generator)
            .to(device),
            "attention_mask": torch.ones(batch_size, seq, dtype=torch.long, device=device),
            "labels": torch.randint(0, labels, (batch_size,), generator=generator).to(device)}


def benchmark_model(model: str, device: torch.device, tiny: bool = False, sentences: int = 8,
                    tokens: int = 32) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model and batch of rows 7 and 8: ``"minilm"`` (the real pretrained MiniLM) or
    ``"bert-base"`` (a BERT-base-sized model from its config), ``sentences x tokens``;
    ``tiny``: a tiny BERT of 2 x 8 tokens instead (the scripts' smoke tests)."""
    if tiny:
        return (bert_model(32, 1, 2, 64, 100, 2, torch.float32, device),
                bert_batch(2, 8, 100, 2, device))
    if model == "minilm":
        import minilm

        loaded, tokenizer = minilm.load(device)
        return loaded, minilm.make_batch(tokenizer, sentences, tokens, device)
    return (bert_model(768, 12, 12, 512, 30522, 2, torch.float32, device),
            bert_batch(sentences, tokens, 30522, 2, device))
