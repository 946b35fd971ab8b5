"""The :func:`find_symmetries` walker: from a ``torch.nn.Module`` to a :class:`SymmetryReport`.

It runs the recognisers of :mod:`.recognisers` over every module (a recognised or rejected module
claims its whole subtree), lists the attention-like modules that none understood, adds the
diagonal ``(u, v)`` parameterisations (``diagonal = True`` modules and explicit pairs), keeps only
the pair groups whose parameters are trainable, unshared and of one dtype and device (and, for
rotary query/key groups, whose rotated dimensions match the model's rotary embedding), and sorts
every remaining trainable parameter into "other". LoRA adapters (:mod:`.lora`) become ``GL(r)``
pairs. It never writes the model's tensors, and reads values only for the rank of LoRA factors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from torch import nn

from quotientsharp.models.lora import find_lora_adapters, mark_dropped
from quotientsharp.models.recognisers import (
    HANDLERS,
    QKV_LIKE_NAMES,
    Finding,
    Unsupported,
    looks_like_attention,
    own_qkv_like_count,
)
from quotientsharp.models.report import AttentionModule, DiagonalPair, PairGroup, SymmetryReport

__all__ = ["find_symmetries"]


def _inside(name: str, prefix: str) -> bool:
    """Whether module ``name`` lies in the subtree rooted at ``prefix``."""
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _rotary_embedding_sizes(model: nn.Module) -> set[int]:
    """Dimensions rotated by the model's rotary embeddings: ``2 x`` each ``inv_freq`` buffer's size.

    HF rotary embedding modules keep their frequencies in a buffer ``inv_freq`` (one per plane);
    its shape is known on the meta device too. Empty when the model has none.
    """
    return {2 * buffer.numel() for name, buffer in model.named_buffers()
            if name.rsplit(".", 1)[-1] == "inv_freq"}


# ---------------------------------------------------------------------- entry point
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
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    named = dict(model.named_parameters())
    names = {id(tensor): name for name, tensor in named.items()}
    report = SymmetryReport(model_type=type(model).__name__)
    report.parameter_shapes = {name: tuple(t.shape) for name, t in named.items()}
    report.parameter_dtypes = {name: t.dtype for name, t in named.items()}
    report.frozen = [name for name, t in named.items() if not t.requires_grad]
    frozen = set(report.frozen)

    claimed: list[str] = []            # subtrees handled (or rejected) by a handler
    handled: list[str] = []            # modules recognised by a handler
    findings: list[tuple[str, nn.Module, Finding]] = []
    diagonal_found: list[tuple[str, str]] = []
    for module_name, module in model.named_modules():
        if any(_inside(module_name, prefix) for prefix in claimed):
            continue
        if getattr(module, "diagonal", False) is True:
            u, v = module._parameters.get("u"), module._parameters.get("v")
            if isinstance(u, nn.Parameter) and isinstance(v, nn.Parameter):
                diagonal_found.append((names[id(u)], names[id(v)]))
        for handler in HANDLERS:
            try:
                finding = handler(module_name, module, names)
            except Unsupported as reason:
                claimed.append(module_name)
                report.unknown.append(module_name)
                report.unknown_reasons[module_name] = f"{type(module).__name__}: {reason}"
                break
            if finding is not None:
                claimed.append(module_name)
                handled.append(module_name)
                findings.append((module_name, module, finding))
                break

    lora = find_lora_adapters(model, names, frozen, degenerate)

    # attention-like modules that no handler claimed
    for module_name, module in model.named_modules():
        if any(_inside(module_name, prefix) for prefix in claimed):
            continue
        if not looks_like_attention(module) or next(module.parameters(), None) is None:
            continue
        has_handled_descendant = any(_inside(h, module_name) for h in handled)
        if has_handled_descendant and own_qkv_like_count(module) == 0:
            continue
        report.unknown.append(module_name)
        report.unknown_reasons[module_name] = (
            f"{type(module).__name__}: attention-like (class name or q/k/v-looking children: "
            f"{sorted({c for c in module._modules} & QKV_LIKE_NAMES) or 'none'}) but no "
            "supported layout (nn.MultiheadAttention, BERT/ViT query/key/value + output.dense, "
            "q_proj/k_proj/v_proj/o_proj|out_proj or q_lin/k_lin/v_lin/out_lin with a head "
            "count, GPT-2 c_attn/c_proj, GPT-NeoX/BLOOM query_key_value/dense)")

    module_order = {module_name: i for i, (module_name, _) in enumerate(model.named_modules())}
    report.unknown.sort(key=module_order.__getitem__)

    for explicit in diagonal or ():
        if (not isinstance(explicit, (tuple, list)) or len(explicit) != 2
                or not all(isinstance(s, str) for s in explicit)):
            raise TypeError(f"diagonal must be a list of (u_name, v_name) string pairs, got "
                            f"{explicit!r}")
        for item in explicit:
            if item not in named:
                raise ValueError(f"diagonal: no parameter named {item!r} in the model")
        if (explicit[0], explicit[1]) not in diagonal_found:  # may repeat a diagonal=True module
            diagonal_found.append((explicit[0], explicit[1]))

    # decide which groups survive: all their parameters trainable, not shared with another module
    candidates = [(module_name, group) for module_name, _, finding in findings
                  for group in finding.groups]
    candidates += [(group.module, group) for group in lora.groups]
    touching: dict[str, set[int]] = defaultdict(set)
    owners: dict[str, set[str]] = defaultdict(set)
    for index, (module_name, group) in enumerate(candidates):
        for parameter in group.parameters:
            touching[parameter].add(index)
            owners[parameter].add(module_name)
    diagonal_names = {name for pair in diagonal_found for name in pair}
    rotary_sizes = _rotary_embedding_sizes(model)
    dropped: set[int] = set()
    for index, (module_name, group) in enumerate(candidates):
        frozen_here = [p for p in group.parameters if p in frozen]
        shared = [p for p in group.parameters if len(owners[p]) > 1 or p in diagonal_names]
        dtypes = {report.parameter_dtypes[p] for p in group.parameters}
        devices = {named[p].device for p in group.parameters}
        if group.rotary is not None and rotary_sizes and group.rotary[0] not in rotary_sizes:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, the "
                                f"module declares {group.rotary[0]} rotary dimensions but the "
                                f"model's rotary embedding(s) rotate {sorted(rotary_sizes)}")
        elif frozen_here:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, frozen "
                                f"parameter(s) {', '.join(frozen_here)}")
        elif adapted := [p for p in group.parameters if p in lora.adapted_bases]:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, "
                                f"parameter(s) {', '.join(adapted)} carry LoRA adapters (the "
                                "weight is W0 + s B A, which the pairs' action does not move)")
        elif shared:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, "
                                f"parameter(s) {', '.join(shared)} shared with another symmetry")
        elif len(dtypes) > 1 or len(devices) > 1:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, its "
                                "parameters mix dtypes or devices")
        else:
            continue
        dropped.add(index)
    changed = True
    while changed:  # a parameter is covered only if every group that reads it survives
        changed = False
        for index, (module_name, group) in enumerate(candidates):
            if index in dropped:
                continue
            blocking = [p for p in group.parameters if touching[p] & dropped]
            if blocking:
                dropped.add(index)
                changed = True
                report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, "
                                    f"parameter(s) {', '.join(blocking)} also feed dropped pairs")

    kept_by_module: dict[str, list[PairGroup]] = defaultdict(list)
    for index, (module_name, group) in enumerate(candidates):
        if index not in dropped:
            kept_by_module[module_name].append(group)
    for module_name, module, finding in findings:
        kept = kept_by_module.get(module_name, [])
        report.groups.extend(kept)
        report.notes.extend(finding.notes)
        report.modules.append(AttentionModule(module_name, type(module).__name__, finding.layout,
                                              finding.heads, tuple(g.kind for g in kept),
                                              finding.kv_heads))
    kept_lora = [group for group in lora.groups if group.module in kept_by_module
                 and group in kept_by_module[group.module]]
    report.groups.extend(kept_lora)
    report.notes.extend(lora.notes)
    report.adapters = mark_dropped(lora.adapters, {group.module for group in kept_lora})
    report.pairs = [pair for group in report.groups for pair in group.pairs()]

    covered = set(report.pair_parameters)
    seen_diagonal: set[str] = set()
    for u_name, v_name in diagonal_found:
        if report.parameter_shapes[u_name] != report.parameter_shapes[v_name]:
            raise ValueError(f"diagonal: {u_name!r} has shape {report.parameter_shapes[u_name]} "
                             f"but {v_name!r} has {report.parameter_shapes[v_name]}")
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
        size = 1
        for extent in report.parameter_shapes[u_name]:
            size *= extent
        report.diagonal.append(DiagonalPair(u_name, v_name, size))

    in_symmetry = covered | seen_diagonal
    report.other = [name for name in named if name not in frozen and name not in in_symmetry]
    return report
