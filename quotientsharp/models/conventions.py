"""Conventions of an attention module's modeling code: rotary layout and key/value sharing.

Rotary embeddings shrink the query/key group from ``GL(h)`` to ``GL(1,C)^{R/2} x GL(h - R)``,
with planes ``(d, d + R/2)`` (``"rotate_half"``: Llama, Qwen2, Mistral, GPT-NeoX) or
``(2d, 2d + 1)`` (``"interleaved"``: GPT-J, Cohere). The layout, and how ``repeat_kv`` shares
key/value heads in grouped-query attention, are detected by calling the modeling code's own
helper on a small CPU probe (``docs/attention-variants.md``); no model tensor is read.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

#: ``(rotary_dims, layout)`` of a rotary query/key pair.
RotarySpec = tuple[int, str]
#: Names of the module-level helpers that rotate a query's planes, in the order they are tried.
ROTATION_HELPERS = ("rotate_half", "rotate_every_two")
#: Names of the module-level helpers that repeat key/value heads for grouped-query attention.
KV_SHARING_HELPERS = ("repeat_kv",)


def rotary_group_name(head_dim: int, rotary: RotarySpec | None) -> str:
    """The pair's group: ``"GL(h)"``, ``"GL(1,C)^{R/2}"`` or ``"GL(1,C)^{R/2} x GL(h - R)"``."""
    if rotary is None:
        return f"GL({head_dim})"
    rotary_dims = rotary[0]
    parts = [f"GL(1,C)^{rotary_dims // 2}"] if rotary_dims else []
    if rotary_dims < head_dim:
        parts.append(f"GL({head_dim - rotary_dims})")
    return " x ".join(parts)


def rotary_group_dimension(head_dim: int, rotary: RotarySpec | None) -> int:
    """Real dimension of the pair's group: ``h^2``, or ``R + (h - R)^2`` with rotary embeddings."""
    if rotary is None:
        return head_dim * head_dim
    rest = head_dim - rotary[0]
    return rotary[0] + rest * rest


def _expected_rotation(probe: torch.Tensor, layout: str) -> torch.Tensor:
    """A quarter turn in every plane of ``layout``, ``shape`` of ``probe``."""
    if layout == "rotate_half":
        first, second = probe.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    return torch.stack((-probe[..., 1::2], probe[..., ::2]), dim=-1).flatten(-2)


def probe_layout(helper: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """The layout (``"rotate_half"`` or ``"interleaved"``) of a helper that maps a
    ``shape=[batch, heads, length, R]`` tensor to its quarter turn (either direction; ``x * cos +
    helper(x) * sin`` is the embedding); ``None`` for neither convention or a failure."""
    # distinct entries tell the two pairings apart; float64 on the CPU whatever the defaults
    probe = torch.arange(1.0, 9.0, dtype=torch.float64, device="cpu").reshape(1, 1, 1, 8)
    try:
        rotated = helper(probe.clone())
    except Exception:  # any failure means: not a helper of a known convention
        return None
    if not isinstance(rotated, torch.Tensor) or rotated.shape != probe.shape:
        return None
    for layout in ("rotate_half", "interleaved"):
        expected = _expected_rotation(probe, layout)
        if torch.equal(rotated, expected) or torch.equal(rotated, -expected):
            return layout
    return None


def modeling_helper(module: nn.Module, names: tuple[str, ...]) -> tuple[Any, str]:
    """The first module-level callable named in ``names`` next to ``type(module)`` or a base
    (``None`` if there is none), and its qualified name (or what was searched)."""
    searched: list[str] = []
    for cls in type(module).__mro__:
        if cls is nn.Module or cls is object:
            continue
        defining = sys.modules.get(cls.__module__)
        if defining is None or defining.__name__ in searched:
            continue
        searched.append(defining.__name__)
        for helper_name in names:
            helper = getattr(defining, helper_name, None)
            if callable(helper):
                return helper, f"{defining.__name__}.{helper_name}"
    return None, f"no {' or '.join(names)} in {', '.join(searched) or 'any module'}"


def detect_layout(module: nn.Module) -> tuple[str | None, str]:
    """The rotary layout of ``module``'s modeling code (``None`` when no helper of
    :data:`ROTATION_HELPERS` is found, or the first found implements neither convention), and
    which helper was probed (or what was searched)."""
    helper, source = modeling_helper(module, ROTATION_HELPERS)
    return (None if helper is None else probe_layout(helper)), source


def probe_kv_sharing(helper: Callable[[torch.Tensor, int], torch.Tensor]) -> str | None:
    """How a ``repeat_kv(x, g)`` helper shares key/value heads: ``"grouped"`` (query head ``i``
    reads ``i // g``, HF's ``repeat_interleave``), ``"tiled"`` (``i % K``) or ``None``."""
    probe = torch.arange(1.0, 4.0, dtype=torch.float64, device="cpu").reshape(1, 3, 1, 1)
    try:
        repeated = helper(probe.clone(), 2)
    except Exception:  # any failure means: not a helper of a known convention
        return None
    if not isinstance(repeated, torch.Tensor) or repeated.shape != (1, 6, 1, 1):
        return None
    if torch.equal(repeated, probe.repeat_interleave(2, dim=1)):
        return "grouped"
    if torch.equal(repeated, probe.repeat(1, 2, 1, 1)):
        return "tiled"
    return None


def detect_kv_sharing(module: nn.Module) -> tuple[str | None, str]:
    """How ``module``'s modeling code shares key/value heads, and where it was read:
    ``"grouped"`` (HF) when no ``repeat_kv`` helper exists or it implements that convention,
    ``"tiled"`` or ``None`` otherwise."""
    helper, source = modeling_helper(module, KV_SHARING_HELPERS)
    if helper is None:
        return "grouped", f"HF repeat_kv convention assumed ({source})"
    return probe_kv_sharing(helper), source


def _positive_int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def declared_rotary_dims(module: nn.Module, head_dim: int) -> tuple[int, str]:
    """Number of rotated dimensions per head that ``module`` declares, and where it says so.

    Tried in order: the module's ``rotary_ndims`` or ``rotary_dim``; its config's
    ``rope_parameters["partial_rotary_factor"]``, ``partial_rotary_factor`` or ``rotary_pct``
    (``R = int(h * factor)``, as GPT-NeoX computes it) or ``rotary_dim``; else the whole head.
    """
    for attribute in ("rotary_ndims", "rotary_dim"):
        value = _positive_int(getattr(module, attribute, None))
        if value is not None:
            return value, f"{type(module).__name__}.{attribute}={value}"
    config = getattr(module, "config", None)
    if config is not None:
        parameters = getattr(config, "rope_parameters", None)
        factors = [("rope_parameters['partial_rotary_factor']",
                    parameters.get("partial_rotary_factor")
                    if isinstance(parameters, Mapping) else None)]
        factors += [(name, getattr(config, name, None))
                    for name in ("partial_rotary_factor", "rotary_pct")]
        for label, factor in factors:
            if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0:
                return int(head_dim * factor), f"config {label}={factor}"
        value = _positive_int(getattr(config, "rotary_dim", None))
        if value is not None:
            return value, f"config rotary_dim={value}"
    return head_dim, "the whole head: no partial rotary declared"
