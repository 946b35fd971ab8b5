"""An adaptive optimiser on the quotient: :class:`QuotientAdamW` steps every ``GL`` pair with
Adam-like moments that the pair's group does not change (kept in an orthonormal frame of the
core's metric and carried between frames by LoRA-RITE's transport, Yen et al., ICLR 2025), and
every other trainable parameter as ``torch.optim.AdamW``. ``docs/lora.md`` and
``derivations/quotient_adamw.md`` derive each step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.adamw import adamw

from quotientsharp.core.gl import GLPoint
from quotientsharp.models.optim import (
    ADAMW_ENTRIES,
    PairGradients,
    Tensors,
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
from quotientsharp.models.report import SymmetryReport

#: The default ``balance`` of the mix metric (:func:`balanced_scale`), chosen among 1, 0.3 and
#: 0.1 on ``benchmarks/optimisers.py`` (``docs/lora.md``): 0.1 had the lowest validation loss,
#: but its fast-growing steps amplify rounding (two starts on one orbit drift apart); 1 does not.
BALANCE = 1.0


# ---------------------------------------------------------------------- frame algebra
def frame_transport(old_basis: torch.Tensor, new_basis: torch.Tensor,
                    work_dtype: torch.dtype) -> torch.Tensor:
    """``T = (B_old^T B_old)^+ B_old^T B_new``, ``shape=[..., r, r]`` (working dtype): a frame
    gradient ``g = X B_old`` read in the new frame is ``g T`` (least squares); zero from a zero
    factor, and covariant, ``O_old^T T O_new``, when the bases rotate."""
    old = old_basis.to(work_dtype)
    gram = old.mT @ old
    cross = old.mT @ new_basis.to(work_dtype)
    return torch.linalg.pinv(gram, hermitian=True) @ cross


def inverse_root(second: torch.Tensor, adam_eps: float) -> torch.Tensor:
    """``(V^{1/2} + adam_eps I)^{-1}`` of a symmetric positive semi-definite ``V``,
    ``shape=[..., r, r]`` (Adam's denominator for a matrix moment), from its eigenvalues: basis
    free, so covariant under rotations."""
    values, vectors = torch.linalg.eigh(0.5 * (second + second.mT))
    inverse = 1.0 / (values.clamp_min(0).sqrt() + adam_eps)
    return (vectors * inverse.unsqueeze(-2)) @ vectors.mT


def balanced_scale(factor: torch.Tensor, frame: torch.Tensor, balance: float) -> torch.Tensor:
    """``(I + S / balance)^{1/2}``, ``shape=[..., r, r]`` (the frame's dtype), ``S`` the singular
    values of the pair's product ``R = F C^{-T}`` read in the frame (``F`` the factor,
    ``shape=[..., k, r]``, ``C`` its frame): the identity for a zero product, covariant under the
    group, the scale of AdamW's step on the balanced factorisation
    (``derivations/quotient_adamw.md``)."""
    product = torch.linalg.solve(frame, factor.to(frame.dtype).mT).mT
    # S from the singular values of R itself, not from the eigenvalues of R^T R: a square root
    # of R^T R's eigenvalues turns their rounding (eps ||R||^2) into errors of sqrt(eps) ||R||
    # where the product is nearly rank-deficient (a fresh adapter), which the steps then amplify
    _, singular, right = torch.linalg.svd(product, full_matrices=False)
    grow = (1.0 + singular / balance).sqrt() - 1.0
    eye = torch.eye(product.shape[-1], dtype=product.dtype, device=product.device)
    return eye + (right.mT * grow.unsqueeze(-2)) @ right


def retraction_guard(x: Tensors, step: Tensors, lr: float, work: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``step`` (the directions ``(dG, dH)`` of pairs ``x``, ``shape=[..., n, r]`` and
    ``[..., m, r]``, taken as ``-lr`` times them) shortened, pair by pair, to where the step's
    second-order change of the product, ``lr^2 ||dG dH^T||``, is at most its first-order one,
    ``lr ||dG H^T + G dH^T||``; unchanged, bit for bit, where it already is.

    Near a product much smaller than the step (a fresh adapter's ``B`` after its first step)
    the mix frame of the other factor is huge and the second-order term would dominate, an
    unbounded extrapolation. Both norms are group invariant (``r x r`` Gram matrices in
    ``work``), so the shortened step is as invariant as the step.
    """
    G, H = (f.to(work) for f in x)
    dG, dH = (d.to(work) for d in step)
    gram_dg, gram_dh = dG.mT @ dG, dH.mT @ dH

    def trace(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b.mT).sum((-2, -1))

    second = lr * trace(gram_dg, gram_dh).clamp_min(0).sqrt()
    first = (trace(gram_dg, H.mT @ H) + trace(G.mT @ G, gram_dh)
             + 2 * trace(dG.mT @ G, dH.mT @ H)).clamp_min(0).sqrt()
    over = second > first
    if not bool(over.any()):
        return step[0], step[1]
    # the shortening t solves t * second = first (second-order change t^2 lr^2 ||dG dH^T||
    # equal to the first-order t lr ||...||); a step with no first-order change takes none
    shorten = torch.where(over, first / torch.where(over, second, 1.0), 1.0)[..., None, None]
    return tuple(torch.where(over[..., None, None], d * shorten.to(d.dtype), d)
                 for d in step)  # type: ignore[return-value]


def _stand_in(factor: torch.Tensor, zero: torch.Tensor, scale: float) -> torch.Tensor:
    """``factor`` with each zero matrix (``zero``, ``shape=[...]``) replaced by ``scale`` times
    orthonormal columns (the first ``r`` of the identity); unchanged when ``n < r`` (the core
    refuses those by shape)."""
    n, r = factor.shape[-2:]
    if n < r:
        return factor
    unit = scale * torch.eye(n, r, dtype=factor.dtype, device=factor.device)
    return torch.where(zero[..., None, None], unit, factor)


def _check_balance(balance: object, metric: str) -> float:
    """``balance`` resolved for ``metric``: ``None`` is :data:`BALANCE` under mix and ``0`` under
    inv; a number must be ``>= 0``, and ``0`` under inv."""
    if balance is None:
        return BALANCE if metric == "mix" else 0.0
    checked = check_number("balance", balance, 0.0)
    if checked and metric != "mix":
        raise ValueError(f"balance must be 0 (or None) under the {metric} metric, got "
                         f"{balance!r}: its frame is the factor's own, so its steps already "
                         "scale with the factor; the balanced scale reads the mix frame")
    return checked


# ---------------------------------------------------------------------- the optimiser
class QuotientAdamW(torch.optim.Optimizer):
    """AdamW whose ``GL`` pairs take steps invariant under the pair's group.

    Parameters
    ----------
    model
        The network (e.g. a ``peft.PeftModel``). Its trainable parameters are optimised: the
        pairs' by the invariant moments (module docstring), all others by AdamW.
    lr
        Step size (``> 0``; both groups, an LR scheduler may change each group's ``"lr"``).
    metric
        ``"mix"`` (frames of the partner factor: the step of ``G`` lives on the column space of
        ``H``, as in LoRA-RITE) or ``"inv"`` (frames of the factor itself: multiplicative
        steps, ``dL/dG S_G``-like).
    eps
        Damping of the Gram matrices, ``S = K + eps I`` (``>= 0``). ``eps = 0`` is exactly
        invariant; ``eps > 0`` is invariant under orthogonal ``M`` only and allows
        rank-deficient factors. From ``B = 0`` the mix metric works at ``eps = 0`` when ``B``'s
        first step has full rank ``r`` (a gradient of lower rank, e.g. from fewer inputs than
        ``r``, leaves ``B`` rank-deficient and the next step is refused: use ``eps > 0``).
    weight_decay
        Decoupled weight decay (``>= 0``), ``p <- p (1 - lr weight_decay)``, for both groups.
    betas
        Decay rates of the first and second moments, each in ``[0, 1)``.
    adam_eps
        The denominator's ``eps`` (``> 0``), added to the square root of each row's second
        moment (mix) or of the second moment's eigenvalues (inv); AdamW's, entrywise, for the
        other parameters. For float16 parameters at least float16's smallest normal number
        (``6.1e-5``; ``1e-4`` works), else a ``ValueError``: the default rounds to zero there.
    balance
        Mix metric only: the frame step is multiplied by ``(I + S / balance)^{1/2}``, ``S``
        the singular values of the pair's product ``G H^T`` in the frame (:func:`balanced_scale`,
        invariant), so that the product's step grows with the product as AdamW's does on a
        balanced factorisation; ``balance`` (``> 0``) is the singular value from which it
        grows. ``0`` turns it off (every direction of the frame steps ``O(lr)``, whatever the
        product). ``None`` (default): :data:`BALANCE` under mix, ``0`` under inv, whose frame
        steps already scale with the factor.
    symmetries
        ``"auto"``: :func:`~quotientsharp.models.find_symmetries` with ``degenerate="pair"``
        (fresh adapters are pairs), or a :class:`~quotientsharp.models.SymmetryReport`, with
        the same rules as :class:`~quotientsharp.models.QuotientSGD`. Diagonal ``GL(1)`` pairs
        and :class:`~quotientsharp.models.QuotientBinding` s are not supported.

    Notes
    -----
    Param groups: ``param_groups[0]`` holds the pairs' parameters (``"kind": "pairs"``, with
    ``"metric"``, ``"eps"`` and ``"balance"`` recorded: ``load_state_dict`` refuses a state saved
    with others), ``param_groups[1]`` every other trainable parameter (``"kind": "other"``;
    also a group added by ``add_param_group``), whose state
    (``"step"``, ``"exp_avg"``, ``"exp_avg_sq"``) and update are ``torch.optim.AdamW``'s. The
    pairs' moments live in the symmetry coordinates, one set per bucket of pairs of one shape
    (``shape=[P, n, r]``; ``[P, n]`` for mix, ``[P, r, r]`` for inv), in the state of the
    first pair parameter under the key ``"bucket<b>"`` (a dict), so ``state_dict`` and
    ``load_state_dict`` carry them. A pair parameter without gradient counts as zero; the pairs
    are skipped when none has one. A step on a NaN or inf gradient (or pair value) raises a
    ``ValueError`` naming the parameters before anything changes (``torch.optim.AdamW`` would
    write the NaN into the parameters).
    """

    def __init__(self, model: nn.Module, lr: float, *, metric: str = "mix", eps: float = 0.0,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 adam_eps: float = 1e-8, balance: float | None = None,
                 symmetries: str | SymmetryReport = "auto") -> None:
        named = check_model(model, metric)
        lr = check_number("lr", lr, 0.0, strict=True)
        eps = check_number("eps", eps, 0.0)
        weight_decay = check_number("weight_decay", weight_decay, 0.0)
        beta_pair = check_betas(betas)
        adam_eps = check_number("adam_eps", adam_eps, 0.0, strict=True)
        check_adam_eps_precision(adam_eps, named)
        balance = _check_balance(balance, metric)
        resolved = resolve_symmetries(model, symmetries)
        if not isinstance(resolved, SymmetryReport):
            raise TypeError("symmetries must be 'auto' or a SymmetryReport (QuotientAdamW steps "
                            "discovered GL pairs), got QuotientBinding(s)")
        self._pairs = PairGradients("QuotientAdamW", named, resolved, metric, eps)
        warn_without_pairs("QuotientAdamW", self._pairs.names, "AdamW")
        defaults = {"lr": lr, "betas": beta_pair, "adam_eps": adam_eps,
                    "weight_decay": weight_decay}
        geometry = {"metric": metric, "eps": eps, "balance": balance}
        super().__init__(param_groups(named, self._pairs.names, geometry), defaults)
        self.metric, self.eps, self.balance = metric, eps, balance

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.add_param_group``; a group added after construction is
        ``"kind": "other"`` (stepped as ``torch.optim.AdamW``),
        :func:`~quotientsharp.models.optim.check_added_group`."""
        check_added_group("QuotientAdamW", self.param_groups, param_group)
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict`` after checking that the state fits (a
        ``ValueError`` naming the parameter otherwise; nothing is loaded then). A bucket's
        moments are checked against the pairs at the next step."""
        check_loaded_state("QuotientAdamW", self, state_dict,
                           {id(p): n for n, p in self._pairs.named.items()},
                           ("kind", "lr", "betas", "adam_eps", "weight_decay"), ADAMW_ENTRIES,
                           also=lambda key: key.startswith("bucket"),
                           geometry=("metric", "eps", "balance"))
        super().load_state_dict(state_dict)

    # ------------------------------------------------------------------ steps
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step; ``closure`` (re-evaluating the loss with gradients) as in ``torch.optim``."""
        loss = begin_step("QuotientAdamW", closure, self._pairs.named, self._pairs.names)
        names = {id(p): n for n, p in self._pairs.named.items()}
        all_or_nothing("QuotientAdamW", self, names, self._step_groups)
        return loss

    def _step_groups(self) -> None:
        """Step every group, unguarded."""
        for group in self.param_groups:
            if group["kind"] == "pairs":
                self._step_pairs(group)
            else:
                self._step_others(group)

    def _step_others(self, group: dict[str, Any]) -> None:
        """``torch.optim.AdamW``'s step (its functional form, so the same numbers)."""
        params = [p for p in group["params"] if p.grad is not None]
        for param in params:
            state = self.state[param]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param,
                                                       memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        adamw(params, [p.grad for p in params], [self.state[p]["exp_avg"] for p in params],
              [self.state[p]["exp_avg_sq"] for p in params], [],
              [self.state[p]["step"] for p in params], amsgrad=False, beta1=beta1, beta2=beta2,
              lr=group["lr"], weight_decay=group["weight_decay"], eps=group["adam_eps"],
              maximize=False)

    def _step_pairs(self, group: dict[str, Any]) -> None:
        params = list(group["params"])
        if not any(p.grad is not None for p in params):
            return
        directions = self._pairs.bucket_directions(
            lambda index, point, egrad: self._bucket_update(index, point, egrad, group))
        lr, decay = group["lr"], group["weight_decay"]
        for name in self._pairs.names:
            param = self._pairs.named[name]
            if decay:
                param.mul_(1.0 - lr * decay)
            param.add_(directions[name].to(param.dtype), alpha=-lr)

    def _bucket_update(self, index: int, x: Tensors, egrad: Tensors, group: dict[str, Any]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """The update direction ``(u_G C_G^T, u_H C_H^T)`` of bucket ``index`` (its pairs
        stacked, ``shape=[P, n, r]`` and ``[P, m, r]``), advancing the bucket's moments."""
        frames, silent = self._frames(index, x)
        G, H = x
        dtype = G.dtype
        # product-space bases (G's frame reads H and the other way round) and frame gradients
        bases = (H @ frames[0].to(dtype), G @ frames[1].to(dtype))
        frame_grads = [g @ c.to(dtype) for g, c in zip(egrad, frames, strict=True)]
        for which, mask in enumerate(silent):
            if mask is not None:           # a factor whose partner is zero: no step
                frame_grads[which] = torch.where(mask[..., None, None], 0.0,
                                                 frame_grads[which])
        # the bucket's moments: a dict in the state of the first pair parameter
        first_pair = self._pairs.named[self._pairs.names[0]]
        state: dict[str, Any] = self.state[first_pair].setdefault(f"bucket{index}", {})
        beta1, beta2 = group["betas"]
        step = state.get("step", 0) + 1
        state["step"] = step
        work = frames[0].dtype
        result = []
        for which, name in enumerate(("g", "h")):
            grad = frame_grads[which]
            first, second = self._moments(state, name, bases[which], grad, work)
            first.mul_(beta1).add_(grad, alpha=1.0 - beta1)
            if self.metric == "mix":
                # one second moment per row: a row is one of the factor's own units, which the
                # group does not touch (it rotates the frame's columns), so its mean square is
                # invariant and is not transported
                square = grad.to(work).square().mean(-1)
            else:
                # inv steps are multiplicative in the factor's own frame: whitening all r
                # columns keeps the factor of full rank (a per-row moment keeps the rank of the
                # gradient, and a rank-deficient factor is a degenerate point of inv)
                square = (grad.mT @ grad).to(work) / grad.shape[-2]
            second = beta2 * second + (1.0 - beta2) * square
            state[f"exp_avg_{name}"], state[f"exp_avg_sq_{name}"] = first, second.to(dtype)
            state[f"basis_{name}"] = bases[which]
            first_hat, second_hat = first / (1.0 - beta1 ** step), second / (1.0 - beta2 ** step)
            if self.metric == "mix":
                frame_step = first_hat / (second_hat.sqrt() + group["adam_eps"]).to(
                    dtype).unsqueeze(-1)
            else:
                frame_step = first_hat @ inverse_root(second_hat, group["adam_eps"]).to(dtype)
            if self.balance:
                frame_step = frame_step @ balanced_scale(x[which], frames[which],
                                                         self.balance).to(dtype)
            result.append(frame_step @ frames[which].mT.to(dtype))
        return retraction_guard(x, (result[0], result[1]), group["lr"], work)

    def _moments(self, state: dict[str, Any], name: str, basis: torch.Tensor,
                 frame_grad: torch.Tensor, work: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The moments of one factor carried into the current frame (zero at the start): the
        first ``shape=[P, rows, r]`` (point dtype), the second (``work``) ``[P, rows]`` for the
        mix metric and ``[P, r, r]`` for inv."""
        r = frame_grad.shape[-1]
        fresh = frame_grad.new_zeros(frame_grad.shape[:-1] if self.metric == "mix"
                                     else (*frame_grad.shape[:-2], r, r), dtype=work)
        old_basis = state.get(f"basis_{name}")
        if old_basis is None:
            return torch.zeros_like(frame_grad), fresh
        stored, second = state[f"exp_avg_{name}"], state[f"exp_avg_sq_{name}"]
        if (old_basis.shape != basis.shape or stored.shape != frame_grad.shape
                or second.shape != fresh.shape):
            # a state loaded from another model would be transported silently between
            # mismatched frames (the products have compatible shapes whenever the rows agree)
            raise ValueError(
                f"QuotientAdamW: the state of factor {name.upper()} (basis "
                f"{tuple(old_basis.shape)}, first moment {tuple(stored.shape)}, second moment "
                f"{tuple(second.shape)}) does not fit this model's pairs (basis "
                f"{tuple(basis.shape)}, first moment {tuple(frame_grad.shape)}, second moment "
                f"{tuple(fresh.shape)}): was the state_dict loaded from another model?")
        transport = frame_transport(old_basis, basis, work)
        first = stored @ transport.to(frame_grad.dtype)
        if self.metric == "mix":
            return first, second.to(work)
        return first, transport.mT @ second.to(work) @ transport

    def _frames(self, index: int, x: Tensors) -> tuple[
            tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor | None, torch.Tensor | None]]:
        """The frames of bucket ``index`` and, at ``eps = 0``, the masks of pairs whose factor
        ``G`` (first) or ``H`` (second) takes no step because its partner is zero."""
        quotient = self._pairs.quotients[index]
        zero_g, zero_h = ((factor == 0).flatten(-2).all(-1) for factor in x)
        if quotient.eps != 0.0 or not bool((zero_g | zero_h).any()):
            return self._roots(index, x), (None, None)
        frames, probe = (self._roots(index, tuple(
            _stand_in(f, z, scale) for f, z in zip(x, (zero_g, zero_h), strict=True)))
            for scale in (1.0, 2.0))
        # a zero factor with a nonzero partner steps in its frame only where that frame does
        # not read the stand-in (mix: P_G = S_H^{-1}); where it does (inv) the step is undefined
        for which, (zero, partner) in enumerate(((zero_g, zero_h), (zero_h, zero_g))):
            moving = zero & ~partner
            if bool(moving.any()):
                change = (frames[which][moving] - probe[which][moving]).abs().amax()
                if bool(change > 1e-6 * frames[which][moving].abs().amax()):
                    labels = [label for label, refused in zip(
                        self._pairs.labels[index], moving.tolist(), strict=True) if refused]
                    raise ValueError(self._pairs.degenerate(
                        quotient, f"bucket {index}", labels,
                        "a factor is zero and the metric's frame of a zero factor depends on "
                        "the factor itself (its steps stay zero under the "
                        f"{quotient.metric.name} metric at eps=0)"))
        return frames, (zero_h, zero_g)

    def _roots(self, index: int, x: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        """The frames ``(C_G, C_H)``, ``P_F = C_F C_F^T``, at the point ``x`` of bucket ``index``:
        the metric's own roots from the QR factors of the factors (a Cholesky factor of the
        formed ``P_F`` would carry the rounding of an inverted Gram matrix, which the steps
        near a rank-deficient factor amplify)."""
        point: GLPoint = self._pairs.at(self._pairs.quotients[index], x, f"bucket {index}",
                                        self._pairs.labels[index])
        return point.raise_roots()
