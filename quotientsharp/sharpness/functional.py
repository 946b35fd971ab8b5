"""The model stage of the engine: the loss of a model at given parameters, never touching it.

:class:`FunctionalModel` evaluates ``L(theta')`` by :func:`torch.func.functional_call` on
perturbed clones: the model's own parameters and buffers are never handed to its forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from .batches import Batch, LossFunction, compute_loss, resolve_loss


def geometry_dtype(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    """float64 if any parameter is float64, else float32 (half and bfloat16 models included)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


class FunctionalModel:
    """The loss of a model at given parameter values; the model's tensors are never used.

    Parameters
    ----------
    model
        The network (only read: its parameters are shared, never handed to the forward,
        and its buffers are cloned once).
    loss
        ``None``/``"cross_entropy"``, ``"mse"``, a callable ``loss(output, target)``, or the
        pair ``(loss function, whether it is a built-in taking logits)``.
    """

    def __init__(self, model: nn.Module,
                 loss: tuple[LossFunction, bool] | str | LossFunction | None = None) -> None:
        self.model = model
        if loss is None or isinstance(loss, str) or callable(loss):
            function, _, builtin = resolve_loss(loss)
            loss = (function, builtin)
        self.loss_function, self.builtin_loss = loss
        named = dict(model.named_parameters())
        if not named:
            raise ValueError("the model has no parameters")
        self.dtypes = {n: p.dtype for n, p in named.items()}
        self.trainable = [n for n, p in named.items() if p.requires_grad]
        if not self.trainable:
            raise ValueError("the model has no trainable parameters (requires_grad=True)")
        for name, tensor in named.items():
            if not tensor.is_floating_point():
                raise TypeError(f"parameter {name!r} has non-floating dtype {tensor.dtype}")
        devices = {p.device for p in named.values()}
        if len(devices) != 1:
            raise ValueError("the model's parameters are on several devices "
                             f"{sorted(map(str, devices))}")
        self.device = devices.pop()
        # ``theta`` shares the model's storage and is only ever read by this package. The
        # forward never receives it: perturbed parameters are new tensors (base + xi) and the
        # ones passed unperturbed get a private clone (``_unperturbed``), so whatever the forward
        # does to its inputs the model's own tensors stay intact, without a copy of the model.
        self.theta = {n: p.detach() for n, p in named.items()}
        self._clones: dict[str, torch.Tensor] = {}
        self.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        self.dtype = geometry_dtype([self.dtypes[n] for n in self.trainable])
        self.theta_geometry = {n: self.theta[n].to(self.dtype) for n in self.trainable}
        floating = {t.dtype for t in [*named.values(), *self.buffers.values()]
                    if t.is_floating_point()}
        self.input_dtype = floating.pop() if len(floating) == 1 else None

    def check_finite(self) -> None:
        """Raise naming every trainable parameter with NaN or inf entries (one host sync)."""
        flags = torch.stack([torch.isfinite(self.theta[n]).all() for n in self.trainable])
        bad = [n for n, ok in zip(self.trainable, flags.tolist(), strict=True) if not ok]
        if bad:
            raise ValueError(f"parameter(s) {bad} contain non-finite values (NaN or inf)")

    def _unperturbed(self, name: str) -> torch.Tensor:
        """A private copy of parameter ``name``, made the first time it is passed as is."""
        if name not in self._clones:
            self._clones[name] = self.theta[name].clone()
        return self._clones[name]

    def loss(self, batch: Batch, updates: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The loss with ``updates`` (by name, geometry dtype) replacing the parameters.

        ``updates`` must not alias the model's own tensors (``theta``): the forward receives
        them (cast to each parameter's dtype) and may write to its inputs.
        """
        params = {name: (updates[name].to(self.dtypes[name]) if name in updates
                         else self._unperturbed(name)) for name in self.theta}
        output = torch.func.functional_call(self.model, (params, self.buffers), batch.args,
                                            batch.kwargs)
        return compute_loss(self.loss_function, self.builtin_loss, output, batch.target,
                            self.dtype)

    def loss_and_gradients(self, batch: Batch
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """The loss at ``theta`` and its gradient per trainable parameter (geometry dtype).

        A parameter the loss does not depend on gets ``None``. The leaves are private copies
        of the parameters, so the forward may write to them without touching the model.
        """
        leaves = {n: self.theta_geometry[n].clone().requires_grad_(True) for n in self.trainable}
        with torch.enable_grad():
            loss = self.loss(batch, leaves)
            if not loss.requires_grad:
                return loss.detach(), dict.fromkeys(self.trainable)
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return loss.detach(), dict(zip(leaves, grads, strict=True))

    def parameters_without_gradient(self, batch: Batch) -> list[str]:
        """Trainable parameters the loss on ``batch`` does not depend on (autograd ``None``)."""
        return [n for n, g in self.loss_and_gradients(batch)[1].items() if g is None]


def checked_clean_loss(loss: torch.Tensor, index: int) -> torch.Tensor:
    """``loss`` if finite, else a ``ValueError`` naming the batch (one host sync per batch)."""
    if not bool(torch.isfinite(loss)):
        raise ValueError(f"the clean loss on batch {index} is not finite ({float(loss)})")
    return loss


__all__ = ["FunctionalModel", "checked_clean_loss", "geometry_dtype"]
