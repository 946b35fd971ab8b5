"""Batches, model outputs and losses (validation and the functional model stages).

A batch is a pair ``(x, y)`` (``x`` a tensor, a tuple or list of positional inputs or a dict of
keyword inputs; ``y`` the target) or a HuggingFace-style dict with a ``"labels"`` entry. The
model's output is a tensor, an object or dict with ``logits``, or a tuple whose first element
is the logits (:func:`output_tensor`). The loss is the mean cross-entropy (``ignore_index=-100``),
``"mse"``, or any callable ``loss(output, target)`` returning a scalar tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

LossFunction = Callable[[Any, Any], torch.Tensor]
LOSS_NAMES = ("cross_entropy", "mse")


#: The label cross-entropy ignores (HuggingFace's and torch's default ``ignore_index``).
IGNORE_INDEX = -100


@dataclass
class Batch:
    """A batch split into model inputs and target; ``index`` (its position) names it in errors."""

    args: tuple
    kwargs: dict
    target: Any
    index: int | None = None

    @property
    def label(self) -> str:
        """``"batch i"`` (or ``"the batch"`` without an index), for error messages."""
        return "the batch" if self.index is None else f"batch {self.index}"


def _move(obj: Any, device: torch.device, float_dtype: torch.dtype | None,
          where: str = "the batch") -> Any:
    """Tensors to ``device``; floating input tensors to ``float_dtype`` when given."""
    if isinstance(obj, torch.Tensor):
        if obj.is_meta and device.type != "meta":
            # torch's own message ("Cannot copy out of meta tensor") names no tensor
            raise ValueError(f"{where} holds a tensor on the meta device (shape "
                             f"{tuple(obj.shape)}, no data): batches need real tensors")
        if float_dtype is not None and obj.is_floating_point():
            return obj.to(device=device, dtype=float_dtype)
        return obj.to(device=device)
    if isinstance(obj, Mapping):
        return {k: _move(v, device, float_dtype, f"{where}, entry {k!r},") for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(v, device, float_dtype, f"{where}, item {i},")
                         for i, v in enumerate(obj))
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
        return Batch((), _move(inputs, device, input_dtype, f"batch {index}"),
                     _move(batch["labels"], device, None, f"batch {index}'s labels"), index)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        target = _move(y, device, None, f"batch {index}'s target")
        where = f"batch {index}'s inputs"
        if isinstance(x, Mapping):
            return Batch((), _move(dict(x), device, input_dtype, where), target, index)
        if isinstance(x, (tuple, list)):
            return Batch(tuple(_move(list(x), device, input_dtype, where)), {}, target, index)
        return Batch((_move(x, device, input_dtype, where),), {}, target, index)
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


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over class indices (``-100`` ignored) of shape ``logits.shape[:-1]``
    (flattened) or ``[B, d1, ...]`` for ``[B, C, d1, ...]`` logits, or class probabilities of
    the logits' shape; other targets raise, naming both shapes."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"the cross-entropy target must be a tensor, got {type(target).__name__}")
    if target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"cross-entropy needs integer class labels (or class probabilities), "
                        f"got a {str(target.dtype).removeprefix('torch.')} target")
    if target.is_floating_point():
        if target.shape != logits.shape:
            raise TypeError(
                f"cross-entropy got a {str(target.dtype).removeprefix('torch.')} target of shape "
                f"{_shape(target)} for logits of shape {_shape(logits)}: it needs integer class "
                "labels, or class probabilities of the logits' shape; for real-valued targets "
                "pass loss='mse'")
        return F.cross_entropy(logits, target)
    target = target.long()
    if logits.dim() > 2 and target.shape == logits.shape[:-1]:
        logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    elif target.shape != logits.shape[:-1] and not (
            logits.dim() > 2 and target.shape == (logits.shape[0], *logits.shape[2:])):
        rows = f"{logits.shape[0]} rows" if logits.dim() > 1 else "one row"
        raise ValueError(f"the model's output has shape {_shape(logits)} ({rows} of "
                         f"{logits.shape[-1]} class scores) but the labels have shape "
                         f"{_shape(target)}: do the inputs and the labels hold the same number "
                         "of examples?")
    return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)


def check_class_labels(logits: torch.Tensor, target: torch.Tensor) -> None:
    """Raise unless every class label is in ``[0, C)`` or ``-100``, and not all are ``-100``
    (before the loss: out of range is a device-side assert on CUDA)."""
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.numel() == 0:
        return
    classes = logits.shape[-1] if (logits.dim() < 3 or target.shape == logits.shape[:-1]) \
        else logits.shape[1]
    ignored = target == IGNORE_INDEX
    invalid = ~ignored & ((target < 0) | (target >= classes))
    bad, skipped = torch.stack([invalid.sum(), ignored.sum()]).tolist()
    if bad:
        value = int(target[invalid].reshape(-1)[0])
        raise ValueError(f"label {value} is out of range: the model's output has {classes} "
                         f"classes, so a label must be in [0, {classes}) (or {IGNORE_INDEX}, "
                         f"ignored); {bad} of {target.numel()} labels are out of range")
    if skipped == target.numel():
        raise ValueError(f"every label is {IGNORE_INDEX} (the ignore_index): the cross-entropy "
                         "has no target to average, so the loss would be NaN")


def mean_squared_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error against a target of as many entries, cast and reshaped to the
    prediction's (integer class labels ``[B]`` for a ``[B, C]`` output are refused)."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"the mse target must be a tensor, got {type(target).__name__}")
    if (not target.is_floating_point() and prediction.dim() >= 1 and prediction.shape[-1] > 1
            and target.shape == prediction.shape[:-1]):
        raise ValueError(f"loss='mse' got integer class labels of shape {_shape(target)} for an "
                         f"output of shape {_shape(prediction)}: use loss='cross_entropy' (the "
                         "default) for class labels, or give real-valued targets of the "
                         "output's shape")
    if target.numel() != prediction.numel():
        raise ValueError(f"loss='mse' needs a target with as many entries as the model's output: "
                         f"output {_shape(prediction)}, target {_shape(target)} (do the inputs "
                         "and the targets hold the same number of examples?)")
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
                 dtype: torch.dtype, batch: str = "the batch", check: bool = False
                 ) -> torch.Tensor:
    """``function(output, target)`` as a 0-dim tensor of ``dtype``; a ``builtin`` loss gets the
    logits in ``dtype``. Errors name ``batch``; ``check`` also checks the labels' values (one
    host sync: once per batch, never inside the ascent)."""
    logits = output_tensor(output)
    if logits is not None and not (logits.is_floating_point() or logits.is_complex()):
        raise TypeError(f"{batch}: the model returned a tensor of dtype "
                        f"{str(logits.dtype).removeprefix('torch.')} and shape {_shape(logits)}; "
                        "sharpness needs floating scores (logits), not integer predictions such "
                        "as an argmax")
    try:
        if builtin:
            if logits is None:
                raise TypeError(f"the model returned {type(output).__name__}, which has no logits "
                                "tensor; pass loss=callable(output, target)")
            if check and function is cross_entropy:
                check_class_labels(logits, target)
            value = function(logits.to(dtype), target)
        else:
            value = function(logits if logits is not None else output, target)
    except (TypeError, ValueError) as err:
        # name the batch in the plain TypeErrors and ValueErrors of the loss (subclasses, which
        # may take other arguments, pass unchanged)
        if type(err) not in (TypeError, ValueError) or str(err).startswith(batch):
            raise
        raise type(err)(f"{batch}: {err}") from err
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{batch}: the loss must return a tensor, got {type(value).__name__}")
    if value.numel() != 1:
        raise ValueError(f"{batch}: the loss must return a scalar, got shape "
                         f"{tuple(value.shape)}")
    if value.is_complex():
        # the cast to a real dtype would drop the imaginary part with only a warning: the
        # ascent would maximise the real part of whatever the loss computes
        raise TypeError(f"{batch}: the loss returned a complex tensor "
                        f"({str(value.dtype).removeprefix('torch.')}); it must be a real "
                        "floating scalar (take .real or .abs() in the loss if that is meant)")
    if not value.is_floating_point():
        raise TypeError(f"{batch}: the loss returned a tensor of dtype "
                        f"{str(value.dtype).removeprefix('torch.')}; it must be a floating "
                        "scalar that depends on the parameters")
    return value.reshape(()).to(dtype)
