"""Helpers that several test modules share for tangent tuples: counting the operators a call
dispatches, and vectors that vanish off some rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class ComputingOperators(TorchDispatchMode):
    """Counts the computing operators dispatched inside it (each at least one kernel launch on
    a GPU; views, which only alias their input, are not counted) and the largest tensor one of
    them returned (``out=`` forms write into a given tensor and are left out of ``largest``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not all(r.alias_info is not None and not r.alias_info.is_write
                   for r in func._schema.returns):
            self.count += 1
            if isinstance(out, torch.Tensor) and "out" not in func._overloadname:
                self.largest = max(self.largest, out.numel())
        return out


def vanishing_off_rows(vectors: Sequence[torch.Tensor],
                       rows: Mapping[int, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``vectors`` with tensor ``i`` set to zero outside ``rows[i]`` of its first dimension."""
    out = []
    for i, t in enumerate(vectors):
        if i in rows:
            mask = torch.zeros(t.shape[0], dtype=torch.bool)
            mask[rows[i]] = True
            t = t * mask.reshape(-1, *[1] * (t.dim() - 1))
        out.append(t)
    return tuple(out)
