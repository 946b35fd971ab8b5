"""The published LoRA optimisers on the library's geometry, on the pairs discovery finds or
bindings bind: Riemannian preconditioned AdamW (Zhang & Pilanci, 2024; AdamW on the gradients
raised by the damped ``mix`` metric, so not invariant as
:class:`~quotientsharp.models.quotient_adamw.QuotientAdamW` is) and LoRA+ (Hayou, Ghosh & Yu,
2024: ``B`` at ``ratio`` times the learning rate of ``A``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from quotientsharp.models.binding import QuotientBinding
from quotientsharp.models.optim import (
    ADAMW_ENTRIES,
    PairGradients,
    all_or_nothing,
    begin_step,
    check_adam_eps_precision,
    check_added_group,
    check_betas,
    check_loaded_state,
    check_model,
    check_number,
    param_groups,
    resolve_symmetries,
    warn_without_pairs,
)
from quotientsharp.models.report import PAIR_KINDS, SymmetryReport

Symmetries = str | SymmetryReport | QuotientBinding | Sequence[QuotientBinding]


class RiemannianAdamW(torch.optim.AdamW):
    """AdamW on the damped ``mix``-raised gradients of every pair (Zhang & Pilanci, 2024).

    Parameters
    ----------
    model
        The network (e.g. a ``peft.PeftModel``); its trainable parameters are optimised.
    lr
        Learning rate (both groups).
    eps
        The damping ``delta >= 0`` of ``S = K + delta I`` in the raise (PEFT's ``reg``; its
        default ``1e-2``). ``delta > 0`` is needed for degenerate pairs (a fresh adapter's
        ``B = 0``).
    weight_decay
        Decoupled weight decay of AdamW (``p <- p (1 - lr weight_decay)``), on the parameters
        themselves (not raised), for every group. The default ``0`` is the library's (as
        :class:`~quotientsharp.models.QuotientSGD`), not ``torch.optim.AdamW``'s ``1e-2``.
    betas, adam_eps
        AdamW's moment decays (each in ``[0, 1)``) and its denominator's ``eps`` (``> 0``;
        for float16 parameters ``>= 6.1e-5``, float16's smallest normal number).
    symmetries
        ``"auto"`` (:func:`~quotientsharp.models.find_symmetries` with ``degenerate="pair"``),
        a :class:`~quotientsharp.models.SymmetryReport`, or
        :class:`~quotientsharp.models.QuotientBinding` (s), checked as by
        :class:`~quotientsharp.models.QuotientSGD` (a binding's quotient raises with its own
        metric).

    Notes
    -----
    A subclass of ``torch.optim.AdamW``: ``param_groups[0]`` holds the pairs' parameters
    (``"kind": "pairs"``; a report's pairs with their ``"damping"``, ``eps``, recorded and
    checked by ``load_state_dict``), ``param_groups[1]`` the others (``"kind": "other"``; also a
    group added by ``add_param_group``), stepped exactly as by ``torch.optim.AdamW``. At every
    :meth:`step` the pairs' gradients are raised, AdamW steps on them, and the parameters'
    ``.grad`` are given back unchanged (PEFT's optimiser
    leaves the preconditioned gradients there instead). A pair parameter without a gradient is
    skipped, as AdamW does; its partner's raise reads it as zero. A step on a NaN or inf
    gradient (or pair value) raises a ``ValueError`` naming the parameters before anything
    changes, where ``torch.optim.AdamW`` would write the NaN into the parameters.
    """

    def __init__(self, model: nn.Module, lr: float, *, eps: float = 1e-2,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 adam_eps: float = 1e-8, symmetries: Symmetries = "auto") -> None:
        named = check_model(model)
        lr = check_number("lr", lr, 0.0, strict=True)
        eps = check_number("eps", eps, 0.0)
        weight_decay = check_number("weight_decay", weight_decay, 0.0)
        beta_pair = check_betas(betas)
        adam_eps = check_number("adam_eps", adam_eps, 0.0, strict=True)
        check_adam_eps_precision(adam_eps, named)
        self._pairs = PairGradients("RiemannianAdamW", named,
                                    resolve_symmetries(model, symmetries), "mix", eps)
        warn_without_pairs("RiemannianAdamW", self._pairs.names, "AdamW")
        # bindings raise with their quotients' own metric: only a report's pairs use eps
        geometry = {"damping": eps} if self._pairs.layout is not None else {}
        super().__init__(param_groups(named, self._pairs.names, geometry), lr=lr,
                         betas=beta_pair, eps=adam_eps, weight_decay=weight_decay)
        self.damping = eps

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """``torch.optim.AdamW.add_param_group``; a group added after construction is
        ``"kind": "other"`` (plain AdamW),
        :func:`~quotientsharp.models.optim.check_added_group`."""
        check_added_group("RiemannianAdamW", self.param_groups, param_group)
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.AdamW.load_state_dict`` after checking that the state fits (a
        ``ValueError`` naming the parameter otherwise; nothing is loaded then)."""
        check_loaded_state("RiemannianAdamW", self, state_dict,
                           {id(p): n for n, p in self._pairs.named.items()},
                           ("kind", "lr", "betas", "eps", "weight_decay"), ADAMW_ENTRIES,
                           geometry=("damping",))
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step; ``closure`` (re-evaluating the loss with gradients) as in ``torch.optim``."""
        named = self._pairs.named
        loss = begin_step("RiemannianAdamW", closure, named, self._pairs.names)
        all_or_nothing("RiemannianAdamW", self, {id(p): n for n, p in named.items()},
                       self._step_raised)
        return loss

    def _step_raised(self) -> None:
        """AdamW's step on the pairs' raised gradients, unguarded; ``.grad`` given back."""
        named = self._pairs.named
        with_grad = [n for n in self._pairs.names if named[n].grad is not None]
        saved: dict[str, torch.Tensor | None] = {}
        try:
            if with_grad:
                raised = self._pairs.directions("raise_index")
                for name in with_grad:
                    saved[name] = named[name].grad
                    named[name].grad = raised[name].to(named[name].dtype)
            super().step()
        finally:
            for name, gradient in saved.items():
                named[name].grad = gradient


def _factor_sides(report: SymmetryReport, kinds: Sequence[str] | None
                  ) -> tuple[list[str], list[str]]:
    """Names of the parameters on the ``G`` side (LoRA ``B``) and ``H`` side of the pairs."""
    found = {group.kind for group in report.groups}
    if kinds is not None:
        unknown = sorted(set(kinds) - found - {*PAIR_KINDS, "lora"})
        if unknown:
            raise ValueError(f"kinds: unknown pair kind(s) {unknown}; the kinds are "
                             f"{sorted({*PAIR_KINDS, 'lora'})} (this model has "
                             f"{sorted(found)})")
    g_side: dict[str, None] = {}
    h_side: dict[str, None] = {}
    for group in report.groups:
        if kinds is not None and group.kind not in kinds:
            continue
        g_side.update(dict.fromkeys(s.parameter for s in group.g_sources))
        h_side.update(dict.fromkeys(s.parameter for s in group.h_sources))
    both = [n for n in g_side if n in h_side]
    if both:
        raise ValueError(f"symmetries: parameter(s) {both} hold both factors of a pair (a fused "
                         "projection), so one learning rate per parameter cannot give G and H "
                         "different rates; pass kinds without that pair kind")
    if not g_side:
        # LoRA+ without a B factor would be plain AdamW, silently
        wanted = "any kind" if kinds is None else f"kind(s) {list(kinds)}"
        raise ValueError(f"kinds: no trainable pair of {wanted} in this model (its pairs' "
                         f"kinds: {sorted(found) or 'none'}), so no parameter would get the "
                         "rate ratio * lr; a frozen or merged adapter is no pair")
    return list(g_side), list(h_side)


def loraplus_param_groups(model: nn.Module, lr: float, *, ratio: float = 16.0,
                          weight_decay: float = 0.0, kinds: Sequence[str] | None = ("lora",),
                          symmetries: str | SymmetryReport = "auto") -> list[dict[str, Any]]:
    """Param groups of LoRA+: each pair's ``G`` factor (LoRA's ``B``) at ``ratio * lr``.

    Parameters
    ----------
    model
        The network; its trainable parameters are grouped.
    lr
        The learning rate of the ``A`` factors (``H``) and of every parameter outside the pairs.
    ratio
        ``lr_B / lr_A`` (``> 0``; LoRA+ recommends 16 and says it should be ``>= 1``).
    weight_decay
        Every group's ``weight_decay``.
    kinds
        The pair kinds (:class:`~quotientsharp.models.PairGroup` ``.kind``) that get the ratio:
        ``("lora",)`` (default) the adapters only; ``None`` every pair, attention heads
        included (their ``G`` is the query or the output projection's side). An unknown kind,
        or kinds that select no trainable pair of the model, raise a ``ValueError``.
    symmetries
        ``"auto"`` (:func:`~quotientsharp.models.find_symmetries`, ``degenerate="pair"``) or a
        :class:`~quotientsharp.models.SymmetryReport`.

    Returns
    -------
    list[dict]
        The non-empty groups, for any ``torch.optim`` optimiser: ``"kind"`` ``"lora_b"``
        (``lr * ratio``), ``"lora_a"`` (``lr``) and ``"other"`` (``lr``).

    Notes
    -----
    PEFT's ``create_loraplus_optimizer`` (like the reference implementation) also puts every
    1-D trainable parameter (biases, norms) at the ``B`` rate and LoRA on embeddings at a fixed
    ``1e-6``; here both keep ``lr`` and embedding adapters are pairs like any other.
    """
    named = check_model(model)
    lr = check_number("lr", lr, 0.0, strict=True)
    ratio = check_number("ratio", ratio, 0.0, strict=True)
    weight_decay = check_number("weight_decay", weight_decay, 0.0)
    if kinds is not None and (isinstance(kinds, str) or not all(isinstance(k, str)
                                                                 for k in kinds)):
        raise ValueError(f"kinds must be a sequence of pair kinds (e.g. ('lora',)) or None, "
                         f"got {kinds!r}")
    resolved = resolve_symmetries(model, symmetries)
    if not isinstance(resolved, SymmetryReport):
        raise TypeError("symmetries must be 'auto' or a SymmetryReport: a binding does not say "
                        "which factor is B")
    g_side, h_side = _factor_sides(resolved, kinds)
    in_pairs = set(g_side) | set(h_side)
    groups = [
        {"params": [named[n] for n in g_side], "lr": lr * ratio, "kind": "lora_b"},
        {"params": [named[n] for n in h_side], "lr": lr, "kind": "lora_a"},
        {"params": [t for n, t in named.items() if t.requires_grad and n not in in_pairs],
         "lr": lr, "kind": "other"}]
    for group in groups:
        group["weight_decay"] = weight_decay
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("model has no trainable parameter")
    return groups


def loraplus_adamw(model: nn.Module, lr: float, *, ratio: float = 16.0,
                   weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                   adam_eps: float = 1e-8, kinds: Sequence[str] | None = ("lora",),
                   symmetries: str | SymmetryReport = "auto") -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over :func:`loraplus_param_groups` (LoRA+ on AdamW); for float16
    parameters ``adam_eps`` must be ``>= 6.1e-5`` (float16's smallest normal number)."""
    beta_pair = check_betas(betas)
    adam_eps = check_number("adam_eps", adam_eps, 0.0, strict=True)
    groups = loraplus_param_groups(model, lr, ratio=ratio, weight_decay=weight_decay,
                                   kinds=kinds, symmetries=symmetries)
    # torch's AdamW would write NaN into float16 parameters with an eps that is zero there
    check_adam_eps_precision(adam_eps, dict(model.named_parameters()))
    # every group carries its own lr (the default only fills groups added later)
    return torch.optim.AdamW(groups, lr=lr, betas=beta_pair, eps=adam_eps)
