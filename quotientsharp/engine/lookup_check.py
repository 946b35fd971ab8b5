"""Which embedding table an out-of-range index reached, and through which input.

torch's message for an index outside an embedding table ("IndexError: index out of range in
self") names neither the table nor the input. A model with several tables (word, token-type and
position embeddings in BERT, or two tables of one's own) leaves the user guessing. After such a
failure, :func:`out_of_range_lookup` runs the failed forward once more with a check on every
``nn.Embedding`` and ``nn.EmbeddingBag`` and names the first table whose indices leave its rows,
and the batch input that holds them. Only the failure path pays for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


class _Found(Exception):
    """Raised from inside the forward at the first out-of-range lookup, to stop it there."""


def _source(ids: torch.Tensor, inputs: Sequence[tuple[str, torch.Tensor]]) -> str:
    """The batch input that is ``ids`` (the same tensor, or one equal to it), else a phrase
    saying the forward computed the indices itself."""
    for name, tensor in inputs:
        if tensor is ids:
            return name
    for name, tensor in inputs:
        if (tensor.shape == ids.shape and tensor.dtype == ids.dtype
                and tensor.device == ids.device and bool(torch.equal(tensor, ids))):
            return name
    return "indices the forward computes itself"


def out_of_range_lookup(model: nn.Module, forward: Callable[[], object],
                        inputs: Sequence[tuple[str, torch.Tensor]]) -> str | None:
    """Run ``forward`` (the failed call, again) and describe its first embedding lookup outside
    the table's rows: the table's module name, its row count, the offending index and the input
    holding it. ``None`` when no lookup leaves its table (the failure lies elsewhere).

    Parameters
    ----------
    model
        The network whose ``nn.Embedding``/``nn.EmbeddingBag`` modules are checked.
    forward
        The failed forward, called once more (no gradient is taken).
    inputs
        The batch's tensors by name (``"input 0"``, ``"input_ids"``, ...), to name the source.
    """
    found: list[str] = []

    def check(name: str, rows: int) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def hook(module: nn.Module, args: tuple[object, ...]) -> None:
            ids = args[0] if args else None
            if (not isinstance(ids, torch.Tensor) or ids.is_floating_point()
                    or ids.numel() == 0):
                return
            low, high = torch.stack([ids.min(), ids.max()]).tolist()
            if low < 0 or high >= rows:
                value = low if low < 0 else high
                found.append(f"{_source(ids, inputs)} holds index {value}, outside the "
                             f"embedding table {name!r} (rows [0, {rows}))")
                raise _Found
        return hook

    tables = [(n, m) for n, m in model.named_modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    handles = [m.register_forward_pre_hook(check(n, m.num_embeddings)) for n, m in tables]
    try:
        with torch.no_grad():
            forward()
    except _Found:
        return found[0]
    except Exception:       # noqa: BLE001 - the original error is reported by the caller
        return None
    finally:
        for handle in handles:
            handle.remove()
    return None


__all__ = ["out_of_range_lookup"]
