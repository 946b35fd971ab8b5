"""The published LoRA optimisers on the library's geometry: Riemannian preconditioned AdamW
(Zhang & Pilanci, 2024) and LoRA+ (Hayou, Ghosh & Yu, 2024).

Both act on the pairs that the library's discovery finds (:func:`~quotientsharp.models.
find_symmetries`, with ``degenerate="pair"`` so that a fresh adapter with ``B = 0`` is a pair):
a LoRA adapter is the pair ``(G, H) = (B, A^T)``; attention heads are query/key and value/output
pairs; :class:`~quotientsharp.models.QuotientBinding` s bind any other quotient.

Riemannian preconditioned AdamW. Zhang & Pilanci replace the gradients of each adapter by the
scaled gradients

    ``dL/dB (A A^T + delta I)^{-1}``,  ``(B^T B + delta I)^{-1} dL/dA``,

and feed them to AdamW (first and second moments, bias correction, decoupled weight decay).
In the pair's coordinates this is ``(dL/dG S_H^{-1}, dL/dH S_G^{-1})`` with ``S = K + delta I``:
the gradient raised by the damped ``mix`` metric of :class:`~quotientsharp.core.gl.GLQuotient`
(its frozen point's ``raise_index``, the formula of :mod:`quotientsharp.core.gl.mix`). For a loss
invariant under the pair's group this is already horizontal at every damping (its moment is
``dL/dH^T H - G^T dL/dG = 0``), so it is the direction of
:class:`~quotientsharp.models.QuotientSGD` with ``metric="mix"``; no projection is applied, as in
the paper. It works for every pair the library binds, attention heads included. The moments are
taken entrywise on the raised gradients, as in the paper and in PEFT's
``create_riemannian_optimizer``: the step is not invariant under the pair's group (only the raise
is), which is what :class:`~quotientsharp.models.quotient_adamw.QuotientAdamW` changes.

LoRA+. The factor ``B`` of every adapter (``G`` of the pair) gets the learning rate ``ratio``
times that of ``A``; every other trainable parameter keeps the base rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from quotientsharp.core.gl import GLQuotient
from quotientsharp.core.reference import jvp_pair
from quotientsharp.models.binding import QuotientBinding, validate_bindings
from quotientsharp.models.layout import ParameterLayout
from quotientsharp.models.optim import (
    begin_step,
    check_betas,
    check_number,
    param_groups,
    report_quotients,
    resolve_symmetries,
    warn_without_pairs,
)
from quotientsharp.models.report import PAIR_KINDS, SymmetryReport
from quotientsharp.models.symmetry_check import check_structure

Symmetries = str | SymmetryReport | QuotientBinding | Sequence[QuotientBinding]


def _check_model(model: object) -> dict[str, nn.Parameter]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return dict(model.named_parameters())


class _PairRaise:
    """The metric-raised gradients of every bound pair, by parameter name (parameter space).

    One quotient per bucket of the report's layout (the damped ``mix`` metric), or the bindings'
    own quotients; the raise is the core's ``raise_index`` at the frozen point.
    """

    def __init__(self, named: dict[str, nn.Parameter],
                 resolved: SymmetryReport | list[QuotientBinding], eps: float) -> None:
        self.named = named
        self.layout: ParameterLayout | None = None
        self.quotients: list[GLQuotient] = []
        self.bindings: list[QuotientBinding] = []
        if isinstance(resolved, SymmetryReport):
            # one damped mix quotient per bucket, built as QuotientSGD builds them
            self.layout, self.quotients, _, self.names = report_quotients(
                resolved, named, "mix", eps)
        else:
            self.bindings = resolved
            trainable = {n: t.detach() for n, t in named.items() if t.requires_grad}
            validate_bindings(self.bindings, trainable)
            for binding in self.bindings:
                check_structure(binding, trainable)
            self.names = list(dict.fromkeys(n for b in self.bindings for n in b.parameters))

    def _gradients(self) -> dict[str, torch.Tensor]:
        # in a pair a missing gradient counts as zero (the other factor may have one)
        result = {}
        for name in self.names:
            gradient = self.named[name].grad
            result[name] = torch.zeros_like(self.named[name]) if gradient is None else gradient
        return result

    def raised(self) -> dict[str, torch.Tensor]:
        """``{name: raised gradient}`` for every pair parameter."""
        if self.layout is None:
            return self._raised_bindings()
        values = {n: t.detach() for n, t in self.named.items() if n in self.layout.names}
        gradients = dict(values)
        gradients.update(self._gradients())
        coords = self.layout.to_coordinates(values)
        egrads = self.layout.to_coordinates(gradients)
        raised = []
        for index, (point, egrad, quotient) in enumerate(zip(coords.gl, egrads.gl,
                                                             self.quotients, strict=True)):
            frozen = _frozen(quotient, point, f"bucket {index}")
            raised.append(tuple(frozen.raise_index(egrad)))
        directions = self.layout.to_parameters(coords.replace(gl=raised))
        return {n: directions[n] for n in self.names}

    def _raised_bindings(self) -> dict[str, torch.Tensor]:
        gradients = self._gradients()
        values = {n: self.named[n].detach() for n in self.names}
        result: dict[str, torch.Tensor] = {}
        for binding in self.bindings:
            with torch.enable_grad():
                point = tuple(t.detach().requires_grad_(True) for t in binding.point(values))
                # the gradient on the point: the adjoint of from_point applied to the
                # parameters' gradient (autograd, so any differentiable binding map works)
                back = binding.parameters_of(point)
                inner = torch.stack([(back[n] * gradients[n]).sum()
                                     for n in binding.parameters]).sum()
                raw = torch.autograd.grad(inner, point, allow_unused=True)
            egrad = tuple(torch.zeros_like(p) if g is None else g
                          for p, g in zip(point, raw, strict=True))
            detached = tuple(t.detach() for t in point)
            direction = tuple(_frozen(binding.quotient, detached, binding.name)
                              .raise_index(egrad))
            # a tangent vector maps by the differential of from_point
            _, pushed = jvp_pair(binding.parameters_of, (detached,), (direction,))
            result.update({n: t.detach() for n, t in pushed.items()})
        return result


def _frozen(quotient: Any, point: tuple[torch.Tensor, ...], where: str) -> Any:
    try:
        return quotient.at(point)
    except ValueError as err:
        raise ValueError(f"RiemannianAdamW: the pairs of {where} are degenerate for the damping "
                         f"eps={getattr(quotient, 'eps', None)}: {err}. A fresh LoRA adapter has "
                         "B = 0; pass eps > 0") from err


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
        AdamW's moment decays (each in ``[0, 1)``) and its denominator's ``eps`` (``> 0``).
    symmetries
        ``"auto"`` (:func:`~quotientsharp.models.find_symmetries` with ``degenerate="pair"``),
        a :class:`~quotientsharp.models.SymmetryReport`, or
        :class:`~quotientsharp.models.QuotientBinding` (s), checked as by
        :class:`~quotientsharp.models.QuotientSGD` (a binding's quotient raises with its own
        metric).

    Notes
    -----
    A subclass of ``torch.optim.AdamW``: ``param_groups[0]`` holds the pairs' parameters
    (``"kind": "pairs"``), ``param_groups[1]`` the others (``"kind": "other"``), stepped exactly
    as by ``torch.optim.AdamW``. At every :meth:`step` the pairs' gradients are raised, AdamW
    steps on them, and the parameters' ``.grad`` are given back unchanged (PEFT's optimiser
    leaves the preconditioned gradients there instead). A pair parameter without a gradient is
    skipped, as AdamW does; its partner's raise reads it as zero. A step on a NaN or inf
    gradient (or pair value) raises a ``ValueError`` naming the parameters before anything
    changes, where ``torch.optim.AdamW`` would write the NaN into the parameters.
    """

    def __init__(self, model: nn.Module, lr: float, *, eps: float = 1e-2,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 adam_eps: float = 1e-8, symmetries: Symmetries = "auto") -> None:
        named = _check_model(model)
        lr = check_number("lr", lr, 0.0, strict=True)
        eps = check_number("eps", eps, 0.0)
        weight_decay = check_number("weight_decay", weight_decay, 0.0)
        beta_pair = check_betas(betas)
        adam_eps = check_number("adam_eps", adam_eps, 0.0, strict=True)
        self._raise = _PairRaise(named, resolve_symmetries(model, symmetries), eps)
        warn_without_pairs("RiemannianAdamW", self._raise.names, "AdamW")
        super().__init__(param_groups(named, self._raise.names), lr=lr, betas=beta_pair,
                         eps=adam_eps, weight_decay=weight_decay)
        self.damping = eps

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step; ``closure`` (re-evaluating the loss with gradients) as in ``torch.optim``."""
        named = self._raise.named
        loss = begin_step("RiemannianAdamW", closure, named, self._raise.names)
        with_grad = [n for n in self._raise.names if named[n].grad is not None]
        saved: dict[str, torch.Tensor | None] = {}
        if with_grad:
            raised = self._raise.raised()
            for name in with_grad:
                saved[name] = named[name].grad
                named[name].grad = raised[name].to(named[name].dtype)
        try:
            super().step()
        finally:
            for name, gradient in saved.items():
                named[name].grad = gradient
        return loss


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
    named = _check_model(model)
    lr = check_number("lr", lr, 0.0, strict=True)
    ratio = check_number("ratio", ratio, 0.0, strict=True)
    weight_decay = check_number("weight_decay", weight_decay, 0.0)
    if kinds is not None and (isinstance(kinds, str) or not all(isinstance(k, str)
                                                                 for k in kinds)):
        raise ValueError(f"kinds must be a sequence of pair kinds (e.g. ('lora',)) or None, "
                         f"got {kinds!r}")
    if isinstance(symmetries, QuotientBinding) or (not isinstance(symmetries, str) and isinstance(
            symmetries, Sequence)):
        raise TypeError("symmetries must be 'auto' or a SymmetryReport: a binding does not say "
                        "which factor is B")
    resolved = resolve_symmetries(model, symmetries)
    assert isinstance(resolved, SymmetryReport)
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
    """``torch.optim.AdamW`` over :func:`loraplus_param_groups` (LoRA+ on AdamW)."""
    beta_pair = check_betas(betas)
    adam_eps = check_number("adam_eps", adam_eps, 0.0, strict=True)
    groups = loraplus_param_groups(model, lr, ratio=ratio, weight_decay=weight_decay,
                                   kinds=kinds, symmetries=symmetries)
    # every group carries its own lr (the default only fills groups added later)
    return torch.optim.AdamW(groups, lr=lr, betas=beta_pair, eps=adam_eps)
