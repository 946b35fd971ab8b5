"""Gradient descent on the quotient: :class:`QuotientSGD` steps ``GL`` pairs along the core's
Riemannian gradient (:class:`~quotientsharp.core.gl.GLQuotient`; with the ``mix`` metric the
scaled gradient step of ScaledGD and Riemannian preconditioned LoRA, ``docs/lora.md``), every
other trainable parameter as plain SGD; and the helpers the three quotient optimisers share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from quotientsharp.core.gl import GLQuotient, RotaryQuotient
from quotientsharp.core.reference import jvp_pair
from quotientsharp.core.validation import warn_at_caller
from quotientsharp.models.binding import QuotientBinding, check_binding_list, validate_bindings
from quotientsharp.models.layout import ParameterLayout
from quotientsharp.models.report import NoSymmetryWarning, SymmetryReport
from quotientsharp.models.symmetry_check import check_structure, check_working_point
from quotientsharp.models.walker import find_symmetries

Tensors = tuple[torch.Tensor, ...]
#: The metrics of the quotient optimisers.
METRICS = ("mix", "inv")
#: The parameter state entries of AdamW (``torch.optim.AdamW``'s, also written by
#: ``QuotientAdamW`` outside the pairs), each with whether it is always there.
ADAMW_ENTRIES = {"step": True, "exp_avg": True, "exp_avg_sq": True, "max_exp_avg_sq": False}


def check_number(name: str, value: object, minimum: float, strict: bool = False) -> float:
    """``value`` as a finite float ``>= minimum`` (``>`` when ``strict``), else a ValueError."""
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


def check_model(model: object, metric: str = "mix") -> dict[str, nn.Parameter]:
    """The parameters of ``model`` (a ``torch.nn.Module``) by name, after checking ``metric``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    return dict(model.named_parameters())


def check_adam_eps_precision(adam_eps: float, named: Mapping[str, nn.Parameter]) -> None:
    """Refuse an ``adam_eps`` below float16's smallest normal number for a model with float16
    trainable parameters: Adam's denominator would round to zero where the moment underflows."""
    half = [n for n, p in named.items() if p.requires_grad and p.dtype == torch.float16]
    tiny = torch.finfo(torch.float16).tiny
    if half and adam_eps < tiny:
        raise ValueError(f"adam_eps must be >= {tiny:.3g} (float16's smallest normal number) "
                         f"for float16 parameters ({', '.join(half[:3])}"
                         f"{', ...' if len(half) > 3 else ''}), got {adam_eps!r}: smaller, "
                         "Adam's denominator rounds to zero where the second moment underflows "
                         "and the steps divide by zero; pass adam_eps=1e-4, or train in "
                         "bfloat16 or float32")


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
    """The closure's loss (``None`` without one), then, before anything changes, a
    ``ValueError`` naming ``owner`` and every trainable parameter whose gradient, or parameter of
    ``values`` (the pairs') whose value, is not finite (one synchronisation)."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    checked = [(n, "gradient", p.grad) for n, p in named.items()
               if p.requires_grad and p.grad is not None]
    checked += [(n, "value", named[n].detach()) for n in values]
    if not checked:
        return loss
    flags = [torch.isfinite(t).all() for _, _, t in checked]
    device = flags[0].device
    if bool(torch.stack([f.to(device) for f in flags]).all()):
        return loss
    bad = [f"{n} ({what})" for (n, what, _), ok in zip(checked, flags, strict=True)
           if not bool(ok)]
    raise ValueError(f"{owner}: NaN or inf in {', '.join(bad)}; the step was refused and "
                     "nothing changed (skip this batch, or lower the learning rate)")


def _cloned(value: Any) -> Any:
    """A copy of one optimiser state entry (tensors cloned, dicts copied, numbers shared)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _cloned(entry) for key, entry in value.items()}
    return value


def _check_group_rates(owner: str, optimizer: torch.optim.Optimizer,
                       names: Mapping[int, str]) -> None:
    """Refuse a param group whose ``"lr"`` (a scheduler or the user may have set it) is not a
    finite number, naming the group and its parameters, before anything is computed."""
    for index, group in enumerate(optimizer.param_groups):
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr):
            listed = [names.get(id(p), "?") for p in group["params"]][:4]
            raise ValueError(f"{owner}: param group {index} ({group.get('kind', '')}: "
                             f"{', '.join(listed)}{', ...' if len(group['params']) > 4 else ''})"
                             f" has lr={lr!r}, which is not a finite number; the step was "
                             "refused and nothing changed")


def all_or_nothing(owner: str, optimizer: torch.optim.Optimizer, names: Mapping[int, str],
                   run: Callable[[], None]) -> None:
    """Run one step (``run``) of ``optimizer`` as a transaction: if ``lr`` is not finite,
    ``run`` raises a ``ValueError`` or ``LinAlgError``, or leaves a parameter NaN or inf, the
    parameters and state are restored exactly and a ``ValueError`` naming ``owner`` says why
    (``names``: ``id(parameter)`` to name). A successful step is the unguarded one, bit for bit.
    """
    _check_group_rates(owner, optimizer, names)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_params = [p.detach().clone() for p in params]
    saved_state = {p: _cloned(entry) for p, entry in optimizer.state.items()}

    def restore() -> None:
        with torch.no_grad():
            for param, value in zip(params, saved_params, strict=True):
                param.copy_(value)
        optimizer.state.clear()
        optimizer.state.update(saved_state)

    try:
        run()
    except torch.linalg.LinAlgError as err:
        restore()
        raise ValueError(f"{owner}: a metric's Gram matrix is not numerically positive "
                         f"definite ({err}); a factor is too ill-conditioned for its metric "
                         "(pass eps > 0); the step was refused and nothing changed") from err
    except ValueError as err:
        restore()
        if str(err).startswith(f"{owner}:"):
            raise
        # a refusal of the core (a metric that is singular at a pair) does not name the step
        raise ValueError(f"{owner}: {err}; the step was refused and nothing changed") from err
    if not params:
        return
    flags = torch.stack([torch.isfinite(p).all().to(params[0].device) for p in params])
    if bool(flags.all()):
        return
    bad = [names.get(id(p), "?") for p, ok in zip(params, flags.tolist(), strict=True) if not ok]
    restore()
    raise ValueError(f"{owner}: the update of {', '.join(bad)} is not finite although the "
                     "gradients are (a factor too ill-conditioned for its metric, or weights "
                     "so large that the step overflows); the step was refused and nothing "
                     "changed (pass eps > 0, rescale the weights, or lower the learning rate)")


def check_loaded_state(owner: str, optimizer: torch.optim.Optimizer, state_dict: object,
                       names: Mapping[int, str], options: Sequence[str],
                       entries: Mapping[str, bool],
                       also: Callable[[str], bool] = lambda key: False,
                       geometry: Sequence[str] = ()) -> None:
    """Refuse, before ``load_state_dict`` changes anything, the state of another optimiser (a
    group without one of ``options``, a parameter entry not in ``entries`` (entry -> required)
    nor admitted by ``also``, a required one missing), of another model (a tensor of another
    shape) or of another geometry (pairs' options ``geometry`` recorded with other values)."""
    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
        raise ValueError(f"{owner}: load_state_dict expects an optimiser state_dict (a dict "
                         f"with 'state' and 'param_groups'), got {type(state_dict).__name__}")
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"{owner}: the loaded state has {len(saved_groups)} param group(s), "
                         f"this optimiser {len(optimizer.param_groups)}: was it saved by "
                         "another optimiser or for another model?")
    by_index: dict[Any, nn.Parameter] = {}
    for index, (saved, group) in enumerate(zip(saved_groups, optimizer.param_groups,
                                               strict=True)):
        # only the options that make this optimiser (torch adds new ones to its own classes
        # over versions, and fills them in when an older state is loaded)
        missing = sorted(set(options) - set(saved))
        if missing:
            raise ValueError(f"{owner}: param group {index} of the loaded state has no "
                             f"{missing}: it was saved by another optimiser")
        if group.get("kind") == "pairs":
            _check_geometry(owner, index, saved, group, geometry)
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(f"{owner}: param group {index} of the loaded state holds "
                             f"{len(saved['params'])} parameters, this optimiser's "
                             f"{len(group['params'])}: was it saved for another model?")
        by_index.update(zip(saved["params"], group["params"], strict=True))
    for key, entry in state_dict["state"].items():
        param = by_index.get(key)
        if param is None or not isinstance(entry, dict):
            continue
        _check_entry(owner, names.get(id(param), "?"), param, entry, entries, also)


def _check_geometry(owner: str, index: int, saved: Mapping[str, Any],
                    group: Mapping[str, Any], geometry: Sequence[str]) -> None:
    """Refuse a loaded pairs' group whose recorded options ``geometry`` differ from ours."""
    for key in geometry:
        if key in group and key in saved and saved[key] != group[key]:
            raise ValueError(f"{owner}: param group {index} of the loaded state was saved with "
                             f"{key}={saved[key]!r}, this optimiser has {key}={group[key]!r}: "
                             "its moments belong to another geometry and would not resume the "
                             f"training; construct the optimiser with {key}={saved[key]!r}")


def _check_entry(owner: str, name: str, param: nn.Parameter, entry: dict[str, Any],
                 entries: Mapping[str, bool], also: Callable[[str], bool]) -> None:
    """One parameter's loaded state against the entries ``owner`` writes."""
    unknown = sorted(k for k in entry if k not in entries and not also(k))
    # a state of only ``also`` entries (QuotientAdamW's bucket moments) needs no other entry
    needed = any(k in entries for k in entry) or not any(also(k) for k in entry)
    missing = sorted(k for k, required in entries.items()
                     if needed and required and k not in entry)
    if unknown or missing:
        raise ValueError(f"{owner}: the loaded state of {name} has "
                         f"{f'unknown entries {unknown}' if unknown else ''}"
                         f"{' and ' if unknown and missing else ''}"
                         f"{f'no {missing}' if missing else ''}: it was saved by another "
                         "optimiser")
    for key in entries:
        value = entry.get(key)
        if isinstance(value, torch.Tensor) and value.numel() > 1 and value.shape != param.shape:
            raise ValueError(f"{owner}: the loaded {key!r} of {name} has shape "
                             f"{tuple(value.shape)}, the parameter {tuple(param.shape)}: was "
                             "the state saved for another model (another rank or width)?")


def resolve_symmetries(model: nn.Module, symmetries: object
                       ) -> SymmetryReport | list[QuotientBinding]:
    """The optimisers' ``symmetries`` option as a report (``"auto"``: discovery keeping
    degenerate pairs, so that a fresh adapter is found) or a list of bindings."""
    if isinstance(symmetries, QuotientBinding):
        return [symmetries]
    if isinstance(symmetries, str):
        if symmetries != "auto":
            raise ValueError(f"symmetries must be 'auto', a SymmetryReport or "
                             f"QuotientBinding(s), got {symmetries!r}")
        return find_symmetries(model, degenerate="pair")
    if isinstance(symmetries, SymmetryReport):
        return symmetries
    if isinstance(symmetries, (list, tuple)):
        # as sharpness() refuses it: an empty list is no request for plain SGD or AdamW
        check_binding_list(symmetries)
        return list(symmetries)
    raise TypeError(f"symmetries must be 'auto', a SymmetryReport or QuotientBinding(s), "
                    f"got {type(symmetries).__name__}")


#: The param group kinds of the quotient optimisers (``param_groups``).
GROUP_KINDS = ("pairs", "other")


def check_added_group(owner: str, groups: Sequence[dict[str, Any]],
                      param_group: dict[str, Any]) -> None:
    """A param group about to be added to ``groups``, given the kind ``"other"`` when it has
    none; only the constructor's first group may be ``"pairs"`` (found once, from the model)."""
    if not isinstance(param_group, dict):
        raise TypeError(f"{owner}: add_param_group expects a dict, got "
                        f"{type(param_group).__name__}")
    kind = param_group.setdefault("kind", "other")
    if kind not in GROUP_KINDS or (kind == "pairs" and groups):
        raise ValueError(f"{owner}: an added param group must have kind 'other' (its "
                         f"parameters step as those outside the pairs), got kind={kind!r}; "
                         "the pairs' group is made once, from the model")


def param_groups(named: dict[str, nn.Parameter], pair_names: list[str],
                 geometry: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The non-empty param groups: the pairs' parameters with the options that fix their
    geometry (``geometry``, recorded for :func:`check_loaded_state`), then the other trainable
    ones."""
    frozen = [n for n in pair_names if not named[n].requires_grad]
    if frozen:
        raise ValueError(f"symmetries: pair parameter(s) {frozen} do not require gradients")
    in_pairs = set(pair_names)
    other = [t for n, t in named.items() if t.requires_grad and n not in in_pairs]
    groups: list[dict[str, Any]] = [
        {"params": [named[n] for n in pair_names], "kind": "pairs", **(geometry or {})},
        {"params": other, "kind": "other"}]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("model has no trainable parameter")
    return groups


def geometry_dtype(point: Sequence[torch.Tensor]) -> torch.dtype:
    """The point's dtype widened to float32 at least, as ``sharpness()`` computes a geometry
    (torch lacks half-precision Cholesky, and a Gram matrix loses its rank in 8 bits)."""
    dtype = torch.float32
    for tensor in point:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def degenerate_labels(quotient: GLQuotient, point: Tensors, labels: Sequence[str]
                      ) -> list[str]:
    """The labels of the pairs of a bucket (``point`` stacked, ``shape=[P, n, r]`` and
    ``[P, m, r]``) on which ``quotient`` refuses the point, each pair checked alone; all
    ``labels`` when they do not label the stack or no pair fails alone."""
    if not labels or point[0].dim() != 3 or point[0].shape[0] != len(labels):
        return list(labels)
    failing = []
    for index, label in enumerate(labels):
        try:
            quotient.at(tuple(factor[index:index + 1] for factor in point))
        except ValueError:
            failing.append(label)
    return failing or list(labels)


class PairGradients:
    """The pairs a quotient optimiser steps, and their gradients moved by the pairs' geometry:
    those of a report (the core's quotient of each bucket, with ``metric`` and ``eps``) or of
    bindings (refused as ``sharpness()`` refuses them). ``owner`` names the optimiser in errors.
    """

    def __init__(self, owner: str, named: dict[str, nn.Parameter],
                 resolved: SymmetryReport | list[QuotientBinding], metric: str,
                 eps: float) -> None:
        self.owner, self.named = owner, named
        self.layout: ParameterLayout | None = None
        self.quotients: list[GLQuotient] = []
        self.labels: list[list[str]] = []
        self.bindings: list[QuotientBinding] = []
        if isinstance(resolved, SymmetryReport):
            self.names = self._use_report(resolved, metric, eps)
        else:
            trainable = {n: t.detach() for n, t in named.items() if t.requires_grad}
            bases = validate_bindings(resolved, trainable)
            for binding, base in zip(resolved, bases, strict=True):
                try:    # the quotient's own check of the point, as sharpness() runs it
                    binding.quotient.check_point(base, "x")
                except ValueError as err:
                    shapes = ", ".join(str(tuple(t.shape)) for t in base)
                    raise ValueError(f"binding {binding.name!r} ({binding.quotient.name}, "
                                     f"shapes {shapes}): {err}") from err
                check_structure(binding, trainable)
                working = geometry_dtype(base)
                check_working_point(binding, tuple(t.detach().to(working) for t in base))
            self.bindings = resolved
            self.names = list(dict.fromkeys(n for b in resolved for n in b.parameters))

    def _use_report(self, report: SymmetryReport, metric: str, eps: float) -> list[str]:
        """Set the layout, quotients and labels of ``report``'s buckets; the pairs' names."""
        if report.diagonal:
            raise ValueError(f"symmetries: diagonal GL(1) pairs are not supported by "
                             f"{self.owner} (GL pairs only)")
        self.layout = ParameterLayout(report, self.named)
        for shape, rotary, pairs in zip(self.layout.bucket_shapes, self.layout.bucket_rotary,
                                        self.layout.gl_pairs, strict=True):
            if rotary is None:
                self.quotients.append(GLQuotient(metric, eps))
            else:
                self.quotients.append(RotaryQuotient(metric, eps, head_dim=shape[2],
                                                     rotary_dims=rotary[0], layout=rotary[1]))
            self.labels.append([f"{p.module} {p.kind} head {p.head}" for p in pairs])
        other = set(report.other)
        return [n for n in self.layout.names if n not in other]

    def gradients(self) -> dict[str, torch.Tensor]:
        """Each pair parameter's gradient; a missing one counts as zero (its partner's may not)."""
        result = {}
        for name in self.names:
            gradient = self.named[name].grad
            result[name] = torch.zeros_like(self.named[name]) if gradient is None else gradient
        return result

    def degenerate(self, quotient: GLQuotient, where: str, labels: Sequence[str],
                   why: str) -> str:
        """The error for pairs of ``where`` on which ``quotient`` is degenerate."""
        named = f" ({', '.join(labels[:3])}{', ...' if len(labels) > 3 else ''})"
        return (f"{self.owner}: the pairs of {where}{named if labels else ''} are degenerate "
                f"for the {quotient.metric.name} metric at eps={quotient.eps}: {why}. A fresh "
                "LoRA adapter has B = 0; pass eps > 0 (the damped metric)")

    def at(self, quotient: Any, point: Tensors, where: str, labels: Sequence[str] = ()) -> Any:
        """``quotient.at(point)``, a refusal naming the optimiser and the degenerate pairs."""
        try:
            return quotient.at(point)
        except ValueError as err:
            if not isinstance(quotient, GLQuotient):
                raise ValueError(f"{self.owner}: binding {where!r}: {err}") from err
            failing = degenerate_labels(quotient, point, labels)
            raise ValueError(self.degenerate(quotient, where, failing, str(err))) from err

    def bucket_directions(self, update: Callable[[int, Tensors, Tensors], Sequence[torch.Tensor]]
                          ) -> dict[str, torch.Tensor]:
        """``update(bucket, point, gradient)`` of every bucket of a report's pairs (stacked,
        ``shape=[P, n, r]`` and ``[P, m, r]``), by parameter name (parameter space)."""
        assert self.layout is not None, "a report's pairs only"
        values = {n: t.detach() for n, t in self.named.items() if n in self.layout.names}
        gradients = dict(values)
        gradients.update(self.gradients())
        coords = self.layout.to_coordinates(values)
        egrads = self.layout.to_coordinates(gradients)
        moved = [tuple(update(index, point, egrad))
                 for index, (point, egrad) in enumerate(zip(coords.gl, egrads.gl, strict=True))]
        directions = self.layout.to_parameters(coords.replace(gl=moved))
        return {n: directions[n] for n in self.names}

    def directions(self, operation: str) -> dict[str, torch.Tensor]:
        """The frozen point's ``operation`` (``"riemannian_gradient"`` or ``"raise_index"``) of
        every pair's gradient, by parameter name (parameter space)."""
        if self.layout is not None:
            def moved(index: int, point: Tensors, egrad: Tensors) -> Any:
                frozen = self.at(self.quotients[index], point, f"bucket {index}",
                                 self.labels[index])
                return getattr(frozen, operation)(egrad)

            return self.bucket_directions(moved)
        gradients = self.gradients()
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
            work = geometry_dtype(point)
            egrad = tuple((torch.zeros_like(p) if g is None else g).to(work)
                          for p, g in zip(point, raw, strict=True))
            detached = tuple(t.detach().to(work) for t in point)
            frozen = self.at(binding.quotient, detached, binding.name)
            direction = tuple(getattr(frozen, operation)(egrad))
            # a tangent vector maps by the differential of from_point (an affine or nonlinear
            # map moves points and tangent vectors differently)
            _, pushed = jvp_pair(binding.parameters_of, (detached,), (direction,))
            result.update({n: t.detach() for n, t in pushed.items()})
        return result


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
    Param groups: ``param_groups[0]`` holds the pairs' parameters (``"kind": "pairs"``; a
    report's pairs with ``"metric"`` and ``"eps"`` recorded, checked by ``load_state_dict``),
    ``param_groups[1]`` every other trainable parameter (``"kind": "other"``; also a group added
    by ``add_param_group``). Momentum buffers
    live in ``state[p]["momentum_buffer"]`` in parameter space (the layout's map is a linear
    bijection), so ``state_dict`` works as for ``torch.optim.SGD``; ``load_state_dict`` refuses
    the state of another optimiser or another model by name. A parameter without gradient is
    skipped; in a pair a missing gradient counts as zero. A step is all or nothing
    (:func:`all_or_nothing`): a NaN or inf gradient or ``lr``, or an update that is not finite,
    raises a ``ValueError`` and leaves the parameters and the state as they were. A half
    precision binding's geometry runs in float32 (:func:`geometry_dtype`).
    """

    def __init__(self, model: nn.Module, lr: float, *, metric: str = "mix", eps: float = 0.0,
                 momentum: float = 0.0, weight_decay: float = 0.0,
                 symmetries: str | SymmetryReport | Sequence[QuotientBinding] = "auto") -> None:
        named = check_model(model, metric)
        lr = check_number("lr", lr, 0.0, strict=True)
        eps = check_number("eps", eps, 0.0)
        momentum = check_number("momentum", momentum, 0.0)
        if momentum >= 1.0:
            raise ValueError(f"momentum must be < 1, got {momentum!r}")
        weight_decay = check_number("weight_decay", weight_decay, 0.0)
        self._pairs = PairGradients("QuotientSGD", named, resolve_symmetries(model, symmetries),
                                    metric, eps)
        warn_without_pairs("QuotientSGD", self._pairs.names, "SGD")
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        # bindings step with their quotients' own metric: only a report's pairs use these
        geometry = {"metric": metric, "eps": eps} if self._pairs.layout is not None else {}
        super().__init__(param_groups(named, self._pairs.names, geometry), defaults)
        self.metric, self.eps = metric, eps

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.add_param_group``; a group added after construction is
        ``"kind": "other"`` (plain SGD), :func:`check_added_group`."""
        check_added_group("QuotientSGD", self.param_groups, param_group)
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict`` after checking that the state fits (a
        ``ValueError`` naming the parameter otherwise; nothing is loaded then)."""
        check_loaded_state("QuotientSGD", self, state_dict,
                           {id(p): n for n, p in self._pairs.named.items()},
                           ("kind", "lr", "momentum", "weight_decay"),
                           {"momentum_buffer": False}, geometry=("metric", "eps"))
        super().load_state_dict(state_dict)

    # ------------------------------------------------------------------ steps
    def _descend(self, group: dict[str, Any], params: list[torch.Tensor],
                 directions: list[torch.Tensor]) -> None:
        """Step ``params`` along ``directions`` with weight decay and momentum as torch's SGD."""
        momentum, decay = group["momentum"], group["weight_decay"]
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
            param.add_(direction, alpha=-group["lr"])

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step; ``closure`` (re-evaluating the loss with gradients) as in ``torch.optim``."""
        pairs = self._pairs
        loss = begin_step("QuotientSGD", closure, pairs.named, pairs.names)
        names = {id(p): n for n, p in pairs.named.items()}
        all_or_nothing("QuotientSGD", self, names, self._step_groups)
        return loss

    def _step_groups(self) -> None:
        """Step every group (the pairs along their Riemannian gradient), unguarded."""
        pairs = self._pairs
        for group in self.param_groups:
            params = list(group["params"])
            if group["kind"] == "pairs":
                if not any(p.grad is not None for p in params):
                    continue
                with torch.enable_grad():
                    by_name = pairs.directions("riemannian_gradient")
                directions = [by_name[name].to(param.dtype)
                              for name, param in zip(pairs.names, params, strict=True)]
            else:
                params = [p for p in params if p.grad is not None]
                directions = [p.grad for p in params]
            self._descend(group, params, directions)
