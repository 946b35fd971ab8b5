"""Low-rank adapters (LoRA, as built by PEFT) as ``GL(r)`` pairs ``(G, H) = (B, A^T)`` of kind
``"lora"``: the network sees only ``B A``, on which ``GL(r)`` acts by ``(M A, B M^{-1})``. PEFT's
layers are recognised by their structure (``peft`` is never imported); an adapter is a pair only
when it reaches the output and is a point of the quotient (``docs/lora.md``). Values are read
only for the rank test, skipped on the meta device.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from quotientsharp.core.validation import warn_at_caller
from quotientsharp.models.report import FactorSource, LoraAdapter, PairGroup

#: ``find_symmetries(model, degenerate=...)``: where a rank-deficient adapter goes.
DEGENERATE_POLICIES = ("adaptive", "pair")
#: PEFT LoRA layer classes whose adapters are not a plain product ``B A`` of two factors.
_UNSUPPORTED_LAYERS = frozenset({"MultiheadAttention", "ParamWrapper"})
_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass
class LoraFinding:
    """What :func:`find_lora_adapters` found: the adapters' pair groups, every adapter, notes,
    and the base weights whose adapters reach the output (``W0 + s B A`` does not keep a
    symmetry of ``W0`` alone)."""

    groups: list[PairGroup] = field(default_factory=list)
    adapters: list[LoraAdapter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    adapted_bases: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------- structure
def is_lora_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a PEFT LoRA layer (by structure: ``base_layer``, ``lora_A`` and
    ``lora_B`` module dicts, and the per-adapter dicts ``r`` and ``scaling``)."""
    return (isinstance(getattr(module, "lora_A", None), nn.ModuleDict)
            and isinstance(getattr(module, "lora_B", None), nn.ModuleDict)
            and isinstance(getattr(module, "r", None), dict)
            and isinstance(getattr(module, "scaling", None), dict)
            and isinstance(getattr(module, "base_layer", None), nn.Module))


def base_layer_of(module: nn.Module) -> nn.Module | None:
    """The innermost base layer of a LoRA layer (layers may wrap layers); ``None`` otherwise."""
    if not is_lora_layer(module):
        return None
    base: Any = module.base_layer
    while is_lora_layer(base):
        base = base.base_layer
    return base if isinstance(base, nn.Module) else None


def _names(module: Any) -> list[str]:
    """Adapter names of a LoRA layer, in insertion order (linear/conv first, then embedding)."""
    names = list(module.lora_A.keys())
    embedding = getattr(module, "lora_embedding_A", None)
    if isinstance(embedding, nn.ParameterDict):
        names += [name for name in embedding.keys() if name not in names]
    return names


def _active(module: Any) -> list[str]:
    active = getattr(module, "active_adapters", None)
    if active is None:
        active = getattr(module, "active_adapter", [])
    return [active] if isinstance(active, str) else list(active)


def _numerical_rank(tensor: torch.Tensor) -> int:
    """Rank of a matrix to rounding: singular values above ``max(shape) * eps * s_max``
    (``eps`` of the tensor's dtype), the rule of ``numpy.linalg.matrix_rank``."""
    with torch.no_grad():
        values = torch.linalg.svdvals(tensor.detach().to(torch.float64))
    if values.numel() == 0 or float(values[0]) == 0.0:
        return 0
    tolerance = max(tensor.shape) * torch.finfo(tensor.dtype).eps * float(values[0])
    return int((values > tolerance).sum())


# ---------------------------------------------------------------------- one adapter
@dataclass
class _Factors:
    """The tensors of one adapter and how they form the pair."""

    layer: str
    a: torch.Tensor
    b: torch.Tensor
    a_matrix: torch.Tensor        # shape [r, rows of H]
    b_matrix: torch.Tensor        # shape [rows of G, r]


def _factors(module: Any, adapter: str) -> _Factors | str:
    """The adapter's ``A`` and ``B`` (and their matrix views), or why it is not a pair."""
    kind = type(module).__name__
    if kind in _UNSUPPORTED_LAYERS:
        return (f"PEFT's LoRA {kind} layer does not add a plain product B A of two factors "
                "on its own output")
    embedding_a = getattr(module, "lora_embedding_A", None)
    if isinstance(embedding_a, nn.ParameterDict) and adapter in embedding_a:
        a, b = embedding_a[adapter], module.lora_embedding_B[adapter]
        if a.dim() != 2 or b.dim() != 2:
            return f"embedding factors of shapes {tuple(a.shape)}, {tuple(b.shape)}"
        return _Factors("embedding", a, b, a, b)
    lora_a, lora_b = module.lora_A[adapter], module.lora_B[adapter]
    if isinstance(lora_a, nn.Linear) and isinstance(lora_b, nn.Linear):
        return _Factors("linear", lora_a.weight, lora_b.weight, lora_a.weight, lora_b.weight)
    if isinstance(lora_a, _CONVOLUTIONS) and isinstance(lora_b, _CONVOLUTIONS):
        if lora_b.groups != 1 or lora_a.groups != 1:
            return (f"grouped convolution (groups={lora_b.groups}): B mixes the r channels only "
                    "within each group, so the symmetry shrinks to a block-diagonal subgroup of "
                    "GL(r), not supported")
        a, b = lora_a.weight, lora_b.weight
        if any(size != 1 for size in b.shape[2:]):
            return f"B is a convolution with kernel {tuple(b.shape[2:])}, not 1 x 1"
        return _Factors("conv", a, b, a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1))
    return (f"lora_A / lora_B are {type(lora_a).__name__} / {type(lora_b).__name__}, not "
            "Linear or convolution layers")


def _scalar(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _magnitude_parameter(module: Any, adapter: str, names: dict[int, str]) -> str | None:
    """Name of a DoRA adapter's magnitude vector, if it is a registered parameter."""
    magnitudes = getattr(module, "lora_magnitude_vector", None)
    if not isinstance(magnitudes, nn.ModuleDict) or adapter not in magnitudes:
        return None
    weight = getattr(magnitudes[adapter], "weight", None)
    return names.get(id(weight)) if isinstance(weight, nn.Parameter) else None


def _new_record(module_name: str, module: Any, adapter: str, names: dict[int, str]
                ) -> LoraAdapter:
    """The adapter's settings, before any verdict (status ``"pair"``)."""
    r = module.r.get(adapter)
    variant = getattr(module, "lora_variant", {}).get(adapter)
    use_dora = getattr(module, "use_dora", {})
    dora = bool(use_dora.get(adapter, False)) or (
        variant is not None and type(variant).__name__.startswith("Dora"))
    return LoraAdapter(
        module=module_name, adapter=adapter, layer=type(module).__name__,
        r=r if isinstance(r, int) else -1,
        alpha=_scalar(getattr(module, "lora_alpha", {}).get(adapter)),
        scaling=_scalar(module.scaling.get(adapter)),
        rslora=bool(getattr(module, "use_rslora", {}).get(adapter, False)), dora=dora,
        magnitude_parameter=_magnitude_parameter(module, adapter, names) if dora else None)


def _layer_state(module: Any, adapter: str) -> tuple[str, str] | None:
    """``(status, reason)`` when the layer keeps ``B A`` from reaching its output: a merged
    adapter (this one or another) or an inactive one; ``None`` when it reaches it."""
    merged = list(getattr(module, "merged_adapters", []))
    if adapter in merged:
        return ("merged", "merged into the base weight: B A no longer reaches the output, no "
                          "symmetry is left")
    if merged:
        return ("merged", f"the layer holds merged adapter(s) {merged}, and PEFT's forward then "
                          "skips its other adapters too")
    if getattr(module, "disable_adapters", False) is True:
        return "inactive", "adapters are disabled on this layer"
    if adapter not in _active(module):
        return "inactive", f"not an active adapter (active: {_active(module)})"
    return None


def _with_ranks(record: LoraAdapter, factors: _Factors, r: int) -> LoraAdapter:
    """``record`` with the factors' numerical ranks, ``"degenerate"`` below ``r`` (unchanged
    on the meta device)."""
    if factors.a.is_meta or factors.b.is_meta:
        return record
    rank_a, rank_b = _numerical_rank(factors.a_matrix), _numerical_rank(factors.b_matrix)
    record = replace(record, rank_a=rank_a, rank_b=rank_b)
    if rank_a >= r and rank_b >= r:
        return record
    what = ("B = 0 (a fresh adapter)" if rank_b == 0 else
            "A = 0" if rank_a == 0 else f"rank(B) = {rank_b}, rank(A) = {rank_a} < r = {r}")
    return replace(record, status="degenerate",
                   reason=f"{what}: not a point of the GL({r}) quotient")


def _adapter(module_name: str, module: Any, adapter: str, names: dict[int, str],
             frozen: set[str]) -> tuple[LoraAdapter, _Factors | None]:
    """What one adapter is (a record with its status), and its factors when it may be a pair."""
    record = _new_record(module_name, module, adapter, names)

    def verdict(status: str, reason: str) -> tuple[LoraAdapter, None]:
        return replace(record, status=status, reason=reason), None

    r = module.r.get(adapter)
    variant = getattr(module, "lora_variant", {}).get(adapter)
    if not isinstance(r, int) or r <= 0:
        return verdict("unsupported", f"rank r={r!r} is not a positive integer")
    if variant is not None and not record.dora:
        return verdict("unsupported", f"LoRA variant {type(variant).__name__}: only plain LoRA "
                                      "and DoRA are known to keep B A a product")
    factors = _factors(module, adapter)
    if isinstance(factors, str):
        return verdict("unsupported", factors)
    record = replace(record, layer=factors.layer)
    if id(factors.a) not in names or id(factors.b) not in names:
        return verdict("unsupported", "A or B is not a registered parameter of the model")
    record = replace(record, a_parameter=names[id(factors.a)], b_parameter=names[id(factors.b)])
    if tuple(factors.a_matrix.shape[:1]) != (r,) or factors.b_matrix.shape[1] != r:
        return verdict("unsupported", f"A {tuple(factors.a.shape)} and B "
                                      f"{tuple(factors.b.shape)} do not meet in r={r} channels")
    if (state := _layer_state(module, adapter)) is not None:
        return verdict(*state)
    if record.a_parameter in frozen or record.b_parameter in frozen:
        return verdict("frozen", "A or B does not require gradients")
    return _with_ranks(record, factors, r), factors


def _add_layer(finding: LoraFinding, module_name: str, module: Any, names: dict[int, str],
               frozen: set[str], degenerate: str) -> None:
    """Add the adapters of one LoRA layer, their pairs and the base weights they adapt to
    ``finding``."""
    reaching = False
    for adapter in _names(module):
        record, factors = _adapter(module_name, module, adapter, names, frozen)
        # an active adapter, pair or not, changes what the base weight means
        reaching = reaching or record.status not in ("merged", "inactive")
        if factors is not None and (record.status == "pair" or degenerate == "pair"):
            # G = B, H = A^T (a convolution's input channels and kernel flattened in rows)
            g = FactorSource(names[id(factors.b)], "weight", 1, 0, int(factors.b_matrix.shape[0]))
            h = FactorSource(names[id(factors.a)], "weight", 0, 0, int(factors.a_matrix.shape[1]))
            finding.groups.append(PairGroup(record.label, "lora", 1, record.r, (g,), (h,)))
        finding.adapters.append(record)
    if not reaching:
        return
    base = base_layer_of(module)
    for parameter in (base.parameters() if base is not None else ()):
        if id(parameter) in names:
            finding.adapted_bases[names[id(parameter)]] = module_name


# ---------------------------------------------------------------------- the walk
def find_lora_adapters(model: nn.Module, names: dict[int, str], frozen: Iterable[str],
                       degenerate: str = "adaptive") -> LoraFinding:
    """Every adapter of every LoRA layer of ``model``, and the ``GL(r)`` pairs among them
    (``names``: ``id(parameter)`` to name; ``degenerate``: as :func:`find_symmetries`'s)."""
    if degenerate not in DEGENERATE_POLICIES:
        raise ValueError(f"degenerate must be one of {DEGENERATE_POLICIES}, got {degenerate!r}")
    frozen = set(frozen)
    finding = LoraFinding()
    for module_name, module in model.named_modules():
        if is_lora_layer(module):
            _add_layer(finding, module_name, module, names, frozen, degenerate)
    _summary_notes(finding, degenerate)
    # pairs (kept or not) whose values are on the meta device
    unread = sum(r.status in ("pair", "degenerate") and r.rank_a is None
                 for r in finding.adapters)
    if unread:
        finding.notes.append(f"{unread} LoRA adapter(s) on the meta device (built from "
                             "configs): their values are unknown, so a degenerate adapter "
                             "(B = 0, rank < r) cannot be detected")
    return finding


def _summary_notes(finding: LoraFinding, degenerate: str) -> None:
    """One note per kind of remark (the adapters' own lines list which adapter is which)."""
    relaxed = [r.label for r in finding.adapters if r.status == "degenerate"]
    if relaxed and degenerate == "pair":
        finding.notes.append(f"{len(relaxed)} degenerate LoRA adapter(s) (B = 0 or rank < r) "
                             "kept as GL(r) pairs: measure them with eps > 0, which relaxes "
                             "B^T B and A A^T to B^T B + eps I and A A^T + eps I")
    elif relaxed:
        finding.notes.append(f"{len(relaxed)} degenerate LoRA adapter(s) (B = 0 or rank < r, "
                             "e.g. " + relaxed[0] + "): not points of the GL(r) quotient, their "
                             "factors are in the adaptive block; "
                             "find_symmetries(model, degenerate='pair') keeps them as pairs, to "
                             "be measured with eps > 0")
        warn_at_caller(f"{len(relaxed)} LoRA adapter(s) are degenerate (B = 0 or rank < r: not "
                       f"points of the GL(r) quotient), e.g. {relaxed[0]}: their factors are in "
                       "the adaptive block, not measured as pairs; "
                       "find_symmetries(model, degenerate='pair') with eps > 0 relaxes them "
                       "instead", UserWarning)
    others = Counter(r.status for r in finding.adapters if r.status not in ("pair", "degenerate"))
    if others:
        counts = ", ".join(f"{status}: {count}" for status, count in others.items())
        finding.notes.append(f"{sum(others.values())} LoRA adapter(s) are not pairs ({counts}); "
                             "their trainable factors are in the adaptive block")
    dora = [r for r in finding.adapters if r.dora and r.status in ("pair", "degenerate")]
    if dora:
        finding.notes.append(f"DoRA: the magnitude vectors of {len(dora)} adapter(s) are in the "
                             "adaptive block (the GL(r) action leaves them alone)")


def mark_dropped(adapters: list[LoraAdapter], kept: set[str]) -> list[LoraAdapter]:
    """The adapters with status ``"dropped"`` where a pair did not survive the walker's checks
    (``kept``: labels of the surviving ``lora`` groups)."""
    result = []
    for record in adapters:
        if record.status == "pair" and record.label not in kept:
            record = replace(record, status="dropped",
                             reason="the walker dropped its pair (see the notes)")
        elif record.status == "degenerate" and record.label in kept:
            record = replace(record, reason=record.reason + " (kept as a relaxed pair)")
        result.append(record)
    return result
