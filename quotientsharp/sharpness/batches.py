"""Batches, model outputs and losses.

A batch is either

- a pair ``(x, y)``: ``x`` a tensor (``model(x)``), a tuple or list of positional inputs
  (``model(*x)``) or a dict of keyword inputs (``model(**x)``); ``y`` the target;
- a HuggingFace-style dict with a ``"labels"`` entry: the other entries are keyword inputs.

The model's output is a tensor, an object with ``.logits`` (HuggingFace ``ModelOutput``), a dict
with ``"logits"``, or a tuple whose first element is the logits; :func:`output_tensor` takes the
logits from any of these. The default loss is the mean cross-entropy over all targets
(``ignore_index=-100`` as in HuggingFace); ``"mse"`` is the mean squared error; any callable
``loss(output, target)`` returning a scalar tensor works, and receives :func:`output_tensor` of
the output when that exists, otherwise the output itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

LossFunction = Callable[[Any, Any], torch.Tensor]
LOSS_NAMES = ("cross_entropy", "mse")


@dataclass
class Batch:
    """A batch split into model inputs and target."""

    args: tuple
    kwargs: dict
    target: Any


def _move(obj: Any, device: torch.device, float_dtype: torch.dtype | None) -> Any:
    """Tensors to ``device``; floating input tensors to ``float_dtype`` when given."""
    if isinstance(obj, torch.Tensor):
        if float_dtype is not None and obj.is_floating_point():
            return obj.to(device=device, dtype=float_dtype)
        return obj.to(device=device)
    if isinstance(obj, Mapping):
        return {k: _move(v, device, float_dtype) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(v, device, float_dtype) for v in obj)
    return obj


def split_batch(batch: Any, index: int, device: torch.device,
                input_dtype: torch.dtype | None) -> Batch:
    """Split one batch into inputs and target, moved to ``device``.

    Parameters
    ----------
    batch
        ``(x, y)`` or a dict with ``"labels"`` (see the module docstring).
    index
        Position of the batch, for error messages.
    device
        The model's device.
    input_dtype
        Floating inputs are cast to it (the model's parameter dtype), targets are only moved.
    """
    if isinstance(batch, Mapping):
        if "labels" not in batch:
            raise ValueError(f"batch {index} is a dict without a 'labels' entry (keys: "
                             f"{sorted(map(str, batch))})")
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return Batch((), _move(inputs, device, input_dtype), _move(batch["labels"], device, None))
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        target = _move(y, device, None)
        if isinstance(x, Mapping):
            return Batch((), _move(dict(x), device, input_dtype), target)
        if isinstance(x, (tuple, list)):
            return Batch(tuple(_move(list(x), device, input_dtype)), {}, target)
        return Batch((_move(x, device, input_dtype),), {}, target)
    raise TypeError(f"batch {index} must be an (inputs, target) pair or a dict with 'labels', "
                    f"got {type(batch).__name__}"
                    + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""))


def output_tensor(output: Any) -> torch.Tensor | None:
    """The logits inside a model output, or ``None`` when there is no tensor to take."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; sequence outputs ``[B, T, C]`` with targets ``[B, T]`` are flattened."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"the cross-entropy target must be a tensor, got {type(target).__name__}")
    if (logits.dim() > 2 and not target.is_floating_point()
            and target.shape == logits.shape[:-1]):
        logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    return F.cross_entropy(logits, target)


def mean_squared_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error; the target is cast to the prediction's dtype."""
    return F.mse_loss(prediction, target.to(prediction.dtype).reshape(prediction.shape))


def resolve_loss(loss: str | LossFunction | None) -> tuple[LossFunction, str, bool]:
    """``(function, readable name, takes logits)`` for a loss option."""
    if loss is None or loss == "cross_entropy":
        return cross_entropy, "cross_entropy", True
    if loss == "mse":
        return mean_squared_error, "mse", True
    if isinstance(loss, str):
        raise ValueError(f"loss must be one of {LOSS_NAMES} or a callable loss(output, target), "
                         f"got {loss!r}")
    if not callable(loss):
        raise TypeError(f"loss must be a callable loss(output, target), got "
                        f"{type(loss).__name__}")
    return loss, getattr(loss, "__name__", type(loss).__name__), False


def compute_loss(function: LossFunction, builtin: bool, output: Any, target: Any,
                 dtype: torch.dtype) -> torch.Tensor:
    """Apply the loss; built-in losses get the logits in ``dtype`` (float32 for half models)."""
    logits = output_tensor(output)
    if builtin:
        if logits is None:
            raise TypeError(f"the model returned {type(output).__name__}, which has no logits "
                            "tensor; pass loss=callable(output, target)")
        value = function(logits.to(dtype), target)
    else:
        value = function(logits if logits is not None else output, target)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"the loss must return a tensor, got {type(value).__name__}")
    if value.numel() != 1:
        raise ValueError(f"the loss must return a scalar, got shape {tuple(value.shape)}")
    return value.reshape(()).to(dtype)
