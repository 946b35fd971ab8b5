"""The :func:`find_symmetries` walker: the recognisers (:mod:`.recognisers`) claim modules and
their subtrees; candidate pair groups (attention and LoRA, :mod:`.lora`) whose parameters are
frozen, shared, adapted or of mixed dtype or device are dropped; the rest, the diagonal pairs
and every other trainable parameter make the :class:`SymmetryReport`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from quotientsharp.models.lora import LoraFinding, find_lora_adapters, mark_dropped
from quotientsharp.models.recognisers import (
    HANDLERS,
    QKV_LIKE_NAMES,
    Finding,
    Unsupported,
    looks_like_attention,
    own_qkv_like_count,
)
from quotientsharp.models.report import AttentionModule, DiagonalPair, PairGroup, SymmetryReport


@dataclass
class _Recognised:
    """The first pass: each recognised module's finding, the roots of the subtrees a recogniser
    handled or rejected (``claimed``), and the ``(u, v)`` of the ``diagonal = True`` modules."""

    findings: list[tuple[str, nn.Module, Finding]] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    diagonal: list[tuple[str, str]] = field(default_factory=list)

    def claims(self, module_name: str) -> bool:
        """Whether ``module_name`` lies in a subtree a recogniser already handled or rejected."""
        return any(_inside(module_name, prefix) for prefix in self.claimed)


def _inside(name: str, prefix: str) -> bool:
    """Whether module ``name`` lies in the subtree rooted at ``prefix``."""
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _dropped(module_name: str, group: PairGroup, reason: str) -> str:
    """The note that the pairs of ``group`` are dropped, and why."""
    return f"{module_name or '<root>'}: {group.kind} pairs dropped, {reason}"


# ---------------------------------------------------------------------- pass 1: recognise
def _own_diagonal_pair(module: nn.Module, names: dict[int, str]) -> tuple[str, str] | None:
    """``(u, v)`` names of a ``diagonal = True`` module's own parameters ``u`` and ``v``."""
    if getattr(module, "diagonal", False) is not True:
        return None
    u, v = module._parameters.get("u"), module._parameters.get("v")
    if isinstance(u, nn.Parameter) and isinstance(v, nn.Parameter):
        return names[id(u)], names[id(v)]
    return None


def _recognise(model: nn.Module, names: dict[int, str], report: SymmetryReport) -> _Recognised:
    """Run the recognisers over every module not inside a claimed subtree: the first that
    understands or rejects (``report.unknown``) a module claims its whole subtree."""
    found = _Recognised()
    for module_name, module in model.named_modules():
        if found.claims(module_name):
            continue
        if (pair := _own_diagonal_pair(module, names)) is not None:
            found.diagonal.append(pair)
        for handler in HANDLERS:
            try:
                finding = handler(module_name, module, names)
            except Unsupported as reason:
                found.claimed.append(module_name)
                report.unknown.append(module_name)
                report.unknown_reasons[module_name] = f"{type(module).__name__}: {reason}"
                break
            if finding is not None:
                found.claimed.append(module_name)
                found.findings.append((module_name, module, finding))
                break
    return found


def _list_unrecognised_attention(model: nn.Module, found: _Recognised,
                                 report: SymmetryReport) -> None:
    """Add the unclaimed modules with parameters that look like attention to ``report.unknown``
    (not one whose recognised descendants own all its q/k/v-like children), in module order."""
    for module_name, module in model.named_modules():
        if (found.claims(module_name) or not looks_like_attention(module)
                or next(module.parameters(), None) is None):
            continue
        has_handled_descendant = any(_inside(h, module_name) for h, _, _ in found.findings)
        if has_handled_descendant and own_qkv_like_count(module) == 0:
            continue
        report.unknown.append(module_name)
        report.unknown_reasons[module_name] = (
            f"{type(module).__name__}: attention-like (class name or q/k/v-looking children: "
            f"{sorted(c for c in module._modules if c.lower() in QKV_LIKE_NAMES) or 'none'}) "
            "but no supported layout (nn.MultiheadAttention, BERT/ViT query/key/value + "
            "output.dense, "
            "q_proj/k_proj/v_proj/o_proj|out_proj|dense, query/key/value/out_proj|o_proj|dense, "
            "q/k/v/o or q_lin/k_lin/v_lin/out_lin with a head count, GPT-2 c_attn/c_proj, "
            "GPT-NeoX/BLOOM query_key_value/dense)")
    module_order = {module_name: i for i, (module_name, _) in enumerate(model.named_modules())}
    report.unknown.sort(key=module_order.__getitem__)


def _add_explicit_diagonals(found: list[tuple[str, str]],
                            explicit_pairs: Sequence[tuple[str, str]] | None,
                            named: dict[str, nn.Parameter]) -> None:
    """Check the user's ``diagonal`` pairs and append the new ones to ``found``."""
    for explicit in explicit_pairs or ():
        if (not isinstance(explicit, (tuple, list)) or len(explicit) != 2
                or not all(isinstance(s, str) for s in explicit)):
            raise TypeError(f"diagonal must be a list of (u_name, v_name) string pairs, got "
                            f"{explicit!r}")
        for item in explicit:
            if item not in named:
                raise ValueError(f"diagonal: no parameter named {item!r} in the model")
        if (explicit[0], explicit[1]) not in found:  # may repeat a diagonal=True module
            found.append((explicit[0], explicit[1]))


# ---------------------------------------------------------------------- pass 2: keep or drop
@dataclass
class _Usability:
    """What decides whether a candidate pair group can be kept (see :func:`_drop_reason`)."""

    named: dict[str, nn.Parameter]
    frozen: set[str]
    owners: dict[str, set[str]]       # parameter -> modules whose candidate groups read it
    diagonal_names: set[str]
    rotary_sizes: set[int]
    adapted_bases: dict[str, str]     # base weights that carry LoRA adapters


def _drop_reason(group: PairGroup, usable: _Usability) -> str | None:
    """Why the pairs of ``group`` cannot be kept on their own, or ``None`` if they can."""
    rotary_sizes = usable.rotary_sizes
    if group.rotary is not None and rotary_sizes and group.rotary[0] not in rotary_sizes:
        return (f"the module declares {group.rotary[0]} rotary dimensions but the model's "
                f"rotary embedding(s) rotate {sorted(rotary_sizes)}")
    if frozen_here := [p for p in group.parameters if p in usable.frozen]:
        return f"frozen parameter(s) {', '.join(frozen_here)}"
    if adapted := [p for p in group.parameters if p in usable.adapted_bases]:
        return (f"parameter(s) {', '.join(adapted)} carry LoRA adapters (the weight is "
                "W0 + s B A, which the pairs' action does not move)")
    if shared := [p for p in group.parameters
                  if len(usable.owners[p]) > 1 or p in usable.diagonal_names]:
        return f"parameter(s) {', '.join(shared)} shared with another symmetry"
    dtypes = {usable.named[p].dtype for p in group.parameters}
    devices = {usable.named[p].device for p in group.parameters}
    if len(dtypes) > 1 or len(devices) > 1:
        return "its parameters mix dtypes or devices"
    return None


def _drop_unusable(candidates: list[tuple[str, PairGroup]], usable: _Usability,
                   notes: list[str]) -> set[int]:
    """Indices of the candidate groups to drop (with a note each): those that cannot be kept
    on their own, then, to a fixed point, those with a parameter that feeds a dropped group."""
    touching: dict[str, set[int]] = defaultdict(set)
    for index, (_, group) in enumerate(candidates):
        for parameter in group.parameters:
            touching[parameter].add(index)
    dropped: set[int] = set()
    for index, (module_name, group) in enumerate(candidates):
        if (reason := _drop_reason(group, usable)) is not None:
            notes.append(_dropped(module_name, group, reason))
            dropped.add(index)
    changed = True
    while changed:
        changed = False
        for index, (module_name, group) in enumerate(candidates):
            if index in dropped:
                continue
            if blocking := [p for p in group.parameters if touching[p] & dropped]:
                dropped.add(index)
                changed = True
                notes.append(_dropped(module_name, group, f"parameter(s) {', '.join(blocking)} "
                                                          "also feed dropped pairs"))
    return dropped


# ---------------------------------------------------------------------- pass 3: report
def _record_groups(report: SymmetryReport, recognised: _Recognised, lora: LoraFinding,
                   candidates: list[tuple[str, PairGroup]], dropped: set[int]) -> None:
    """Write the kept groups, the recognised modules, the adapters and notes to ``report``."""
    kept_by_module: dict[str, list[PairGroup]] = defaultdict(list)
    for index, (module_name, group) in enumerate(candidates):
        if index not in dropped:
            kept_by_module[module_name].append(group)
    for module_name, module, finding in recognised.findings:
        kept = kept_by_module.get(module_name, [])
        report.groups.extend(kept)
        report.notes.extend(finding.notes)
        report.modules.append(AttentionModule(module_name, type(module).__name__, finding.layout,
                                              finding.heads, tuple(g.kind for g in kept),
                                              finding.kv_heads))
    kept_lora = [group for group in lora.groups if group in kept_by_module.get(group.module, [])]
    report.groups.extend(kept_lora)
    report.notes.extend(lora.notes)
    report.adapters = mark_dropped(lora.adapters, {group.module for group in kept_lora})
    report.pairs = [pair for group in report.groups for pair in group.pairs()]


def _record_diagonals(report: SymmetryReport, diagonal_found: list[tuple[str, str]],
                      named: dict[str, nn.Parameter], frozen: set[str]) -> set[str]:
    """Check the diagonal pairs, add the kept ones to ``report.diagonal``; their parameters."""
    covered = set(report.pair_parameters)
    seen_diagonal: set[str] = set()
    shapes = report.parameter_shapes
    for u_name, v_name in diagonal_found:
        if shapes[u_name] != shapes[v_name]:
            raise ValueError(f"diagonal: {u_name!r} has shape {shapes[u_name]} "
                             f"but {v_name!r} has {shapes[v_name]}")
        if u_name == v_name or {u_name, v_name} & (seen_diagonal | covered):
            raise ValueError(f"diagonal: ({u_name!r}, {v_name!r}) reuses a parameter that is "
                             "already in a symmetry")
        if u_name in frozen or v_name in frozen:
            report.notes.append(f"diagonal ({u_name}, {v_name}) dropped: a factor is frozen")
            continue
        if (named[u_name].dtype != named[v_name].dtype
                or named[u_name].device != named[v_name].device):
            raise ValueError(f"diagonal: {u_name!r} and {v_name!r} differ in dtype or device")
        seen_diagonal.update((u_name, v_name))
        report.diagonal.append(DiagonalPair(u_name, v_name, math.prod(shapes[u_name])))
    return seen_diagonal


# ---------------------------------------------------------------------- entry point
def check_model(model: object, *, functional: bool = False) -> None:
    """Raise a ``TypeError`` naming ``model`` unless it is a ``torch.nn.Module`` of Python
    submodules (not TorchScript) and, with ``functional``, one that
    :func:`torch.func.functional_call` can run with other parameters (not ``nn.DataParallel``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(f"model is a TorchScript module ({type(model).__name__}, made by "
                        "torch.jit.script or torch.jit.trace): its submodules cannot be read "
                        "for attention heads and torch.func.functional_call cannot run it at "
                        "other parameters; pass the Python nn.Module it was made from")
    if functional and isinstance(model, nn.DataParallel):
        raise TypeError("model is wrapped in nn.DataParallel, which torch.func.functional_call "
                        "cannot run at other parameters: pass model.module (the wrapped model)")


def find_symmetries(model: nn.Module,
                    diagonal: Sequence[tuple[str, str]] | None = None,
                    degenerate: str = "adaptive") -> SymmetryReport:
    """Find the attention ``GL(h)`` pairs and diagonal ``GL(1)`` parameterisations of a model.

    Parameters
    ----------
    model
        The network. It is only inspected: no tensor is read for values or written.
    diagonal
        Optional explicit diagonal parameterisations: pairs of parameter names ``(u, v)`` of equal
        shape. Modules with ``diagonal = True`` and own parameters ``u`` and ``v`` are found
        without this.
    degenerate
        LoRA adapters (:mod:`.lora`) that are rank-deficient (a fresh PEFT adapter has
        ``B = 0``): ``"adaptive"`` (default) puts their factors in the adaptive block, with a note
        and a warning; ``"pair"`` keeps them as ``GL(r)`` pairs, to be measured with ``eps > 0``.
        Only this test reads tensor values (the adapters' singular values).

    Returns
    -------
    SymmetryReport
        Each trainable parameter is either fully covered by pairs (or diagonal pairs) or listed
        in ``other``. Frozen parameters (``requires_grad=False``) appear only in ``frozen``.
    """
    check_model(model)
    named = dict(model.named_parameters())
    names = {id(tensor): name for name, tensor in named.items()}
    report = SymmetryReport(model_type=type(model).__name__)
    report.parameter_shapes = {name: tuple(t.shape) for name, t in named.items()}
    report.parameter_dtypes = {name: t.dtype for name, t in named.items()}
    report.frozen = [name for name, t in named.items() if not t.requires_grad]
    frozen = set(report.frozen)

    recognised = _recognise(model, names, report)
    lora = find_lora_adapters(model, names, frozen, degenerate)
    _list_unrecognised_attention(model, recognised, report)
    diagonal_found = recognised.diagonal
    _add_explicit_diagonals(diagonal_found, diagonal, named)

    candidates = [(module_name, group) for module_name, _, finding in recognised.findings
                  for group in finding.groups]
    candidates += [(group.module, group) for group in lora.groups]
    owners: dict[str, set[str]] = defaultdict(set)
    for module_name, group in candidates:
        for parameter in group.parameters:
            owners[parameter].add(module_name)
    # twice the size of each HF inv_freq buffer (one frequency per plane, known on the meta
    # device too; also per layer type, MiMo-V2-Flash's full_attention_inv_freq)
    rotary_sizes = {2 * buffer.numel() for name, buffer in model.named_buffers()
                    if name.rsplit(".", 1)[-1].endswith("inv_freq")}
    usable = _Usability(named, frozen, owners, {name for pair in diagonal_found for name in pair},
                        rotary_sizes, lora.adapted_bases)
    dropped = _drop_unusable(candidates, usable, report.notes)
    _record_groups(report, recognised, lora, candidates, dropped)

    in_symmetry = set(report.pair_parameters) | _record_diagonals(report, diagonal_found, named,
                                                                  frozen)
    report.other = [name for name in named if name not in frozen and name not in in_symmetry]
    return report
