"""Gradient descent on the quotient: :class:`QuotientSGD` steps ``GL`` pairs along their
Riemannian gradient, every other trainable parameter as plain SGD.

For a pair ``(G, H)`` (a LoRA adapter is ``(B, A^T)``, an attention head a query/key or
value/output pair) the step is ``x <- x - lr * grad_R L(x)``, with the Riemannian gradient of the
pair's metric computed by the core's :class:`~quotientsharp.core.gl.GLQuotient` (the metric-raised
Euclidean gradient, projected onto the horizontal space). With the ``mix`` metric and
``S_G = G^T G + eps I``, ``S_H = H^T H + eps I`` it is

    ``grad_G = dL/dG S_H^{-1}``,  ``grad_H = dL/dH S_G^{-1}``,

in LoRA terms ``grad_B = dL/dB (A A^T + eps I)^{-1}`` and ``grad_A = (B^T B + eps I)^{-1} dL/dA``:
the scaled gradient step of ScaledGD (Tong, Ma & Chi, 2021) and, with the damping ``eps > 0``,
of Riemannian preconditioned LoRA (Zhang & Pilanci, 2024). For an invariant loss at ``eps = 0``
the raised gradient is already horizontal, so the projection changes nothing but rounding. The
``inv`` metric gives ``grad_G = dL/dG S_G`` instead.

Equivariance. The Euclidean gradient at ``(G M^{-1}, H M^T)`` is ``(dL/dG M^T, dL/dH M^{-1})``
and the Gram matrices move to ``M^{-T} K_G M^{-1}`` and ``M K_H M^T``, so at ``eps = 0`` the
Riemannian gradient moves as a tangent vector, ``(grad_G M^{-1}, grad_H M^T)``: the iterates
from ``(G, H)`` and from ``(G M^{-1}, H M^T)`` stay on one orbit at every step, and ``G H^T``
(the adapter's ``B A``) is the same. Momentum buffers and weight decay are tangent vectors too
and keep this. With ``eps > 0`` only orthogonal ``M`` commute with the damping.

Degenerate pairs (a fresh PEFT adapter has ``B = 0``) have singular Gram matrices: at
``eps = 0`` the step raises a ``ValueError`` naming the pair; ``eps > 0`` damps them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from quotientsharp.core.gl import GLQuotient, RotaryQuotient
from quotientsharp.core.reference import jvp_pair
from quotientsharp.core.validation import warn_at_caller
from quotientsharp.models.binding import QuotientBinding, validate_bindings
from quotientsharp.models.layout import ParameterLayout
from quotientsharp.models.report import NoSymmetryWarning, SymmetryReport
from quotientsharp.models.symmetry_check import check_structure

_METRICS = ("mix", "inv")


def check_number(name: str, value: object, minimum: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be {relation} {minimum}, got {value!r}")
    return float(value)


def check_betas(betas: object) -> tuple[float, float]:
    """Adam's ``betas``: a pair of numbers in ``[0, 1)``, each error naming its entry."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair of numbers in [0, 1), got {betas!r}")
    checked = tuple(check_number(f"betas[{i}]", b, 0.0) for i, b in enumerate(betas))
    for i, beta in enumerate(checked):
        if beta >= 1.0:
            raise ValueError(f"betas[{i}] must be < 1, got {betas[i]!r}")
    return checked[0], checked[1]


def check_finite_step(owner: str, named: dict[str, nn.Parameter], values: Sequence[str]) -> None:
    """Refuse a step on NaN or inf before anything changes (parameters, moments, step counts).

    ``owner`` names the optimiser in the error, which lists every trainable parameter whose
    gradient, and every parameter of ``values`` (the pairs', whose frames read them) whose
    value, is not finite. One synchronisation per step.
    """
    checked = [(n, "gradient", p.grad) for n, p in named.items()
               if p.requires_grad and p.grad is not None]
    checked += [(n, "value", named[n].detach()) for n in values]
    if not checked:
        return
    flags = [torch.isfinite(t).all() for _, _, t in checked]
    device = flags[0].device
    if bool(torch.stack([f.to(device) for f in flags]).all()):
        return
    bad = [f"{n} ({what})" for (n, what, _), ok in zip(checked, flags, strict=True)
           if not bool(ok)]
    raise ValueError(f"{owner}: NaN or inf in {', '.join(bad)}; the step was refused and "
                     "nothing changed (skip this batch, or lower the learning rate)")


def warn_without_pairs(owner: str, pair_names: Sequence[str], plain: str) -> None:
    """A :class:`~quotientsharp.models.report.NoSymmetryWarning` at the user's line when the
    optimiser found no pair to step: it is then ``plain`` on every parameter."""
    if not pair_names:
        warn_at_caller(f"{owner}: no symmetry pair was found or bound in the model, so every "
                       f"parameter is stepped by plain {plain}; bind a quotient with "
                       "symmetries=QuotientBinding(...) to step one discovery does not know",
                       NoSymmetryWarning)


def begin_step(owner: str, closure: Callable[[], Any] | None, named: dict[str, nn.Parameter],
               values: Sequence[str]) -> Any:
    """The start of every quotient optimiser's step: the closure's loss (re-evaluated with
    gradients, as in ``torch.optim``; ``None`` without one), then :func:`check_finite_step`."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    check_finite_step(owner, named, values)
    return loss


def resolve_symmetries(model: nn.Module, symmetries: object
                       ) -> SymmetryReport | list[QuotientBinding]:
    """The optimisers' ``symmetries`` option resolved: a report (``"auto"`` runs the discovery,
    degenerate pairs kept so that a fresh adapter is found) or a list of bindings."""
    if isinstance(symmetries, QuotientBinding):
        return [symmetries]
    if isinstance(symmetries, str):
        if symmetries != "auto":
            raise ValueError(f"symmetries must be 'auto', a SymmetryReport or "
                             f"QuotientBinding(s), got {symmetries!r}")
        from quotientsharp.models.walker import find_symmetries

        return find_symmetries(model, degenerate="pair")
    if isinstance(symmetries, SymmetryReport):
        return symmetries
    if isinstance(symmetries, Sequence) and all(isinstance(b, QuotientBinding)
                                                for b in symmetries):
        return list(symmetries)
    raise TypeError(f"symmetries must be 'auto', a SymmetryReport or QuotientBinding(s), "
                    f"got {type(symmetries).__name__}")


def param_groups(named: dict[str, nn.Parameter], pair_names: list[str]
                 ) -> list[dict[str, Any]]:
    """The non-empty param groups: the pairs' parameters, then every other trainable one."""
    frozen = [n for n in pair_names if not named[n].requires_grad]
    if frozen:
        raise ValueError(f"symmetries: pair parameter(s) {frozen} do not require gradients")
    in_pairs = set(pair_names)
    other = [t for n, t in named.items() if t.requires_grad and n not in in_pairs]
    groups = [{"params": [named[n] for n in pair_names], "kind": "pairs"},
              {"params": other, "kind": "other"}]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("model has no trainable parameter")
    return groups


def report_quotients(report: SymmetryReport, named: dict[str, nn.Parameter], metric: str,
                     eps: float) -> tuple[ParameterLayout, list[GLQuotient], list[list[str]],
                                          list[str]]:
    """The layout of ``report``'s pairs, one quotient per bucket of it (the metric object of
    the core: no formula here), each bucket's pair labels, and the pairs' parameter names."""
    layout = ParameterLayout(report, named)
    quotients: list[GLQuotient] = []
    labels: list[list[str]] = []
    for shape, rotary, pairs in zip(layout.bucket_shapes, layout.bucket_rotary,
                                    layout.gl_pairs, strict=True):
        if rotary is None:
            quotients.append(GLQuotient(metric, eps))
        else:
            quotients.append(RotaryQuotient(metric, eps, head_dim=shape[2],
                                            rotary_dims=rotary[0], layout=rotary[1]))
        labels.append([f"{p.module} {p.kind} head {p.head}" for p in pairs])
    pair_names = [n for n in layout.names
                  if n not in set(report.other) | set(report.diagonal_parameters)]
    if report.diagonal:
        raise ValueError("symmetries: diagonal GL(1) pairs are not supported by "
                         "QuotientSGD (GL pairs only)")
    return layout, quotients, labels, pair_names


class QuotientSGD(torch.optim.Optimizer):
    """SGD whose ``GL`` pairs step along the quotient's Riemannian gradient.

    Parameters
    ----------
    model
        The network (e.g. a ``peft.PeftModel``). Its trainable parameters are optimised: the
        pairs' by their Riemannian gradient, all others by plain SGD.
    lr
        Step size (both groups; an LR scheduler may change each group's ``"lr"``).
    metric
        ``"mix"`` (the scaled gradient step) or ``"inv"``.
    eps
        Damping of the Gram matrices, ``S = K + eps I`` (``>= 0``); ``eps > 0`` is needed for
        degenerate pairs such as a fresh LoRA adapter (``B = 0``).
    momentum, weight_decay
        Heavy-ball momentum and (coupled) weight decay, as in ``torch.optim.SGD``, for both
        groups.
    symmetries
        ``"auto"``: :func:`~quotientsharp.models.find_symmetries` with
        ``degenerate="pair"`` (fresh adapters are pairs; use ``eps > 0``); a
        :class:`~quotientsharp.models.SymmetryReport`; or a list of
        :class:`~quotientsharp.models.QuotientBinding`: exactly those
        :func:`~quotientsharp.sharpness` accepts (the same rules,
        :func:`~quotientsharp.models.binding.validate_bindings`, and the same structure check,
        :func:`~quotientsharp.models.symmetry_check.check_structure`: overlapping bindings, a
        name that is no trainable parameter, a broken quotient are refused with the same
        messages), any quotient, stepped with its own metric (a ``GLQuotient``'s own ``eps``);
        the direction reaches the parameters through the differential of ``from_point``.

    Notes
    -----
    Param groups: ``param_groups[0]`` holds the pairs' parameters (``"kind": "pairs"``),
    ``param_groups[1]`` every other trainable parameter (``"kind": "other"``). Momentum buffers
    live in ``state[p]["momentum_buffer"]`` in parameter space (the layout's map is a linear
    bijection), so ``state_dict`` works as for ``torch.optim.SGD``. A parameter without gradient
    is skipped; in a pair a missing gradient counts as zero.
    """

    def __init__(self, model: nn.Module, lr: float, *, metric: str = "mix", eps: float = 0.0,
                 momentum: float = 0.0, weight_decay: float = 0.0,
                 symmetries: str | SymmetryReport | Sequence[QuotientBinding] = "auto") -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        lr = check_number("lr", lr, 0.0, strict=True)
        if metric not in _METRICS:
            raise ValueError(f"metric must be one of {_METRICS}, got {metric!r}")
        eps = check_number("eps", eps, 0.0)
        momentum = check_number("momentum", momentum, 0.0)
        if momentum >= 1.0:
            raise ValueError(f"momentum must be < 1, got {momentum!r}")
        weight_decay = check_number("weight_decay", weight_decay, 0.0)
        named = dict(model.named_parameters())
        self._named = named
        self._layout: ParameterLayout | None = None
        self._bindings: list[QuotientBinding] = []
        self._quotients: list[GLQuotient] = []
        self._labels: list[list[str]] = []
        resolved = resolve_symmetries(model, symmetries)
        if isinstance(resolved, SymmetryReport):
            pair_names = self._use_report(resolved, metric, eps)
        else:
            pair_names = self._use_bindings(resolved)
        warn_without_pairs("QuotientSGD", pair_names, "SGD")
        groups = param_groups(named, pair_names)
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        super().__init__(groups, defaults)
        self.metric, self.eps = metric, eps
        self._pair_names = pair_names

    def _use_report(self, report: SymmetryReport, metric: str, eps: float) -> list[str]:
        """Step the pairs of ``report`` (:func:`report_quotients`); the pairs' parameter names."""
        self._layout, self._quotients, self._labels, pair_names = report_quotients(
            report, self._named, metric, eps)
        return pair_names

    def _use_bindings(self, bindings: Sequence[object]) -> list[str]:
        """Step ``bindings``, refused by the rules and the structure check of sharpness() (what
        it refuses is refused here); their parameter names."""
        self._bindings = [b for b in bindings if isinstance(b, QuotientBinding)]
        trainable = {n: t.detach() for n, t in self._named.items() if t.requires_grad}
        validate_bindings(self._bindings, trainable)
        for binding in self._bindings:
            check_structure(binding, trainable)
        return list(dict.fromkeys(n for b in self._bindings for n in b.parameters))

    # ------------------------------------------------------------------ steps
    def _descend(self, group: dict[str, Any], params: list[torch.Tensor],
                 directions: list[torch.Tensor]) -> list[torch.Tensor]:
        """Apply weight decay and momentum to ``directions`` (in place of torch's SGD)."""
        momentum, decay = group["momentum"], group["weight_decay"]
        result = []
        for param, direction in zip(params, directions, strict=True):
            if decay:
                direction = direction + decay * param.detach()
            if momentum:
                state = self.state[param]
                buffer = state.get("momentum_buffer")
                if buffer is None:
                    buffer = direction.detach().clone()
                else:
                    buffer.mul_(momentum).add_(direction)
                state["momentum_buffer"] = buffer
                direction = buffer
            result.append(direction)
        return result

    def _pair_directions(self) -> dict[str, torch.Tensor]:
        """The Riemannian gradient of every pair, by parameter name (parameter space)."""
        named = self._named
        values = {n: named[n].detach() for n in self._pair_names}
        grads: dict[str, torch.Tensor] = {}
        for n in self._pair_names:
            grad = named[n].grad
            grads[n] = grad if grad is not None else torch.zeros_like(named[n])
        if self._layout is not None:
            full_values = {n: t.detach() for n, t in named.items() if n in self._layout.names}
            full_grads = dict(full_values)
            full_grads.update(grads)
            coords = self._layout.to_coordinates(full_values)
            egrads = self._layout.to_coordinates(full_grads)
            raised = []
            for index, ((G, H), (dG, dH), quotient) in enumerate(zip(
                    coords.gl, egrads.gl, self._quotients, strict=True)):
                point = self._frozen(quotient, (G, H), f"bucket {index}", self._labels[index])
                raised.append(tuple(point.riemannian_gradient((dG, dH))))
            directions = self._layout.to_parameters(coords.replace(gl=raised))
            return {n: directions[n] for n in self._pair_names}
        result: dict[str, torch.Tensor] = {}
        for binding in self._bindings:
            point = tuple(t.detach().requires_grad_(True) for t in binding.point(values))
            # the gradient on the point: the adjoint of from_point applied to the parameters'
            # gradient (autograd, so any differentiable binding maps work)
            back = binding.parameters_of(point)
            inner = torch.stack([(back[n] * grads[n]).sum() for n in binding.parameters]).sum()
            raw = torch.autograd.grad(inner, point, allow_unused=True)
            egrad = tuple(torch.zeros_like(p) if g is None else g
                          for p, g in zip(point, raw, strict=True))
            detached = tuple(t.detach() for t in point)
            frozen = self._frozen(binding.quotient, detached, binding.name, [])
            direction = tuple(frozen.riemannian_gradient(egrad))
            # a tangent vector maps by the differential of from_point (an affine or nonlinear
            # map moves points and tangent vectors differently)
            _, pushed = jvp_pair(binding.parameters_of, (detached,), (direction,))
            result.update({n: t.detach() for n, t in pushed.items()})
        return result

    @staticmethod
    def _frozen(quotient: Any, point: tuple[torch.Tensor, ...], where: str,
                labels: list[str]) -> Any:
        try:
            return quotient.at(point)
        except ValueError as err:
            if not isinstance(quotient, GLQuotient):
                raise ValueError(f"QuotientSGD: binding {where!r}: {err}") from err
            named = f" ({', '.join(labels[:3])}{', ...' if len(labels) > 3 else ''})"
            raise ValueError(f"QuotientSGD: the pairs of {where}{named if labels else ''} are "
                             f"degenerate for the {quotient.metric.name} metric at eps="
                             f"{quotient.eps}: {err}. A fresh LoRA adapter has B = 0; pass "
                             "eps > 0 (the damped step)") from err

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step; ``closure`` (re-evaluating the loss with gradients) as in ``torch.optim``."""
        loss = begin_step("QuotientSGD", closure, self._named, self._pair_names)
        for group in self.param_groups:
            params = list(group["params"])
            if group["kind"] == "pairs":
                if not any(p.grad is not None for p in params):
                    continue
                with torch.enable_grad():
                    directions_by_name = self._pair_directions()
                names = {id(self._named[n]): n for n in self._pair_names}
                directions = [directions_by_name[names[id(p)]].to(p.dtype) for p in params]
            else:
                params = [p for p in params if p.grad is not None]
                directions = [p.grad for p in params]
            for param, direction in zip(params, self._descend(group, params, directions),
                                        strict=True):
                param.add_(direction, alpha=-group["lr"])
        return loss
