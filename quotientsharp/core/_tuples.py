"""Arithmetic on points, tangent vectors and gradients stored as tuples of tensors: leading
dimensions are batch dimensions, the trailing ``point_ndims[i]`` belong to the point itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Tensors = tuple[torch.Tensor, ...]


def add(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Tensors:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def sub(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Tensors:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def scale(c: torch.Tensor | float, a: Sequence[torch.Tensor], ndims: Sequence[int]) -> Tensors:
    """Multiply every component by ``c`` (a scalar, or a tensor of batch shape)."""
    if not isinstance(c, torch.Tensor) or c.dim() == 0:
        return tuple(c * x for x in a)
    return tuple(c.reshape(c.shape + (1,) * k) * x for x, k in zip(a, ndims, strict=True))


def axpy(alpha: torch.Tensor | float, x: Sequence[torch.Tensor], y: Sequence[torch.Tensor],
         ndims: Sequence[int]) -> Tensors:
    """``alpha * x + y`` componentwise, ``alpha`` a scalar or of batch shape."""
    return add(scale(alpha, x, ndims), y)


def zeros_like(a: Sequence[torch.Tensor]) -> Tensors:
    return tuple(torch.zeros_like(x) for x in a)


def batch_shape(a: Sequence[torch.Tensor], ndims: Sequence[int]) -> torch.Size:
    """Broadcast of the leading (batch) shapes of all components."""
    shapes = [x.shape[: x.dim() - k] for x, k in zip(a, ndims, strict=True)]
    return torch.broadcast_shapes(*shapes)


def first_element(a: Sequence[torch.Tensor], ndims: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """The point of the first index of every batch dimension of ``a`` (no batch dimension)."""
    batch = batch_shape(a, ndims)
    return tuple(x.expand(*batch, *x.shape[x.dim() - k:])[(0,) * len(batch)]
                 for x, k in zip(a, ndims, strict=True))


def flatten(a: Sequence[torch.Tensor], ndims: Sequence[int], batch: torch.Size) -> torch.Tensor:
    """Concatenate the components into one ``shape=[*batch, N]`` tensor."""
    parts = []
    for x, k in zip(a, ndims, strict=True):
        trailing = x.shape[x.dim() - k:]
        parts.append(x.expand(*batch, *trailing).reshape(*batch, -1))
    return torch.cat(parts, dim=-1)


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor], ndims: Sequence[int]) -> Tensors:
    """Inverse of :func:`flatten`: split ``shape=[*batch, N]`` into components like ``like``."""
    batch = flat.shape[:-1]
    out, start = [], 0
    for x, k in zip(like, ndims, strict=True):
        trailing = x.shape[x.dim() - k:]
        size = trailing.numel()
        out.append(flat[..., start:start + size].reshape(*batch, *trailing))
        start += size
    return tuple(out)


def total_size(a: Sequence[torch.Tensor], ndims: Sequence[int]) -> int:
    return sum(x.shape[x.dim() - k:].numel() for x, k in zip(a, ndims, strict=True))


def sum_trailing(t: torch.Tensor, k: int) -> torch.Tensor:
    """``t`` summed over its last ``k`` dimensions (``t`` itself for ``k = 0``)."""
    return t.sum(tuple(range(-k, 0))) if k else t


# ---------------------------------------------------------------------------- fused (foreach)
# A network's tangent vector is one tensor per parameter (hundreds for a BERT). A Python loop
# dispatches one operator per tensor, which on a GPU is one kernel launch each; torch's
# ``_foreach`` operators take the whole list in one dispatch (a few fused kernels on CUDA, one
# C++ loop on the CPU). Each helper below computes exactly what the per-tensor loop would,
# bit for bit: the same operation on the same operands, in the same order.
Factor = torch.Tensor | float | Sequence[torch.Tensor]


def _factor(factor: Factor) -> torch.Tensor | float | list[torch.Tensor]:
    # a number or one tensor passes as it is; a sequence of tensors becomes the list _foreach takes
    return factor if isinstance(factor, (torch.Tensor, int, float)) else list(factor)


def fused_mul(a: Sequence[torch.Tensor], factor: Factor) -> Tensors:
    """``x * c`` for every ``x`` in ``a``: ``c`` a number, a 0-dim tensor or one per tensor."""
    return tuple(torch._foreach_mul(list(a), _factor(factor))) if a else ()


def fused_div(a: Sequence[torch.Tensor], factor: Factor) -> Tensors:
    """``x / c`` for every ``x`` in ``a`` (``c`` as in :func:`fused_mul`)."""
    return tuple(torch._foreach_div(list(a), _factor(factor))) if a else ()


def fused_add(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Tensors:
    """``x + y`` componentwise."""
    if len(a) != len(b):
        raise ValueError(f"tuples of different lengths: {len(a)} and {len(b)}")
    return tuple(torch._foreach_add(list(a), list(b))) if a else ()


def fused_square_norms(a: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_i ||x_i||^2`` over every entry of every tensor, 0-dim (one reduction per tensor,
    fused; the sum order differs from a Python loop's, so it agrees to rounding, not bits)."""
    if not a:
        raise ValueError("no tensors to take the norm of")
    return torch.stack(torch._foreach_norm(list(a))).square().sum()


def under_function_transform(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether any tensor is wrapped by a ``torch.func`` transform (``grad``, ``vmap``, ...).

    The fused autograd functions of the order-2 points have a backward of their own, which
    ``torch.func`` transforms cannot see through; their callers take the elementary form then.
    """
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return wrapped is not None and any(wrapped(t) for t in tensors)


def cut_to_rows(tensors: Sequence[torch.Tensor], rows: Mapping[int, torch.Tensor],
                what: str) -> Tensors:
    """``tensors`` with tensor ``i`` cut to ``rows[i]`` of its first dimension (the others as
    they are, shared): the one row cut of every ``on_rows``.

    Raises
    ------
    ValueError
        For a slot of ``rows`` out of range or naming a 0-dim tensor; ``what`` names the
        tuple in the message.
    """
    for slot in rows:
        if not 0 <= slot < len(tensors) or tensors[slot].dim() < 1:
            raise ValueError(f"on_rows: slot {slot} is not a tensor of rows of the {what} "
                             f"({len(tensors)} tensors)")
    return tuple(t.index_select(0, rows[i]) if i in rows else t for i, t in enumerate(tensors))
