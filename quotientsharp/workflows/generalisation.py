"""``quotientsharp study``: a model's generalisation gap, ``test - train`` of its 0-1 error
(``--gap-from error``) or of its loss, from its train and test data."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows.options import BatchSettings, InputError

if TYPE_CHECKING:
    from torch import nn


def evaluate(model: nn.Module, batches: Sequence[Any], loss: str) -> dict[str, float | None]:
    """Mean loss (weighted by examples) and 0-1 error of ``model`` over ``batches``:
    ``{"loss", "error"}``, the error the share of labels (``-100`` left out) whose class is not
    the largest logit, ``None`` with ``loss="mse"``."""
    import torch

    from quotientsharp.engine.batches import compute_loss, output_tensor, resolve_loss, split_batch

    function, _, builtin = resolve_loss(loss)
    parameter = next(model.parameters())
    input_dtype = parameter.dtype if parameter.is_floating_point() else None
    total_loss = examples = wrong = labelled = 0.0
    with torch.no_grad():
        for index, raw in enumerate(batches):
            batch = split_batch(raw, index, parameter.device, input_dtype)
            output = model(*batch.args, **batch.kwargs)
            value = compute_loss(function, builtin, output, batch.target, torch.float64,
                                 batch.label, check=True)
            if not torch.isfinite(value):
                raise InputError(f"{batch.label}: the loss is {float(value)}")
            count = int(batch.target.shape[0]) if batch.target.dim() else 1
            total_loss += float(value) * count
            examples += count
            if loss == "cross_entropy":
                logits = output_tensor(output)
                target = batch.target
                if logits is None or target is None:
                    raise InputError(f"{batch.label}: no logits or no labels, so no error "
                                     "rate")
                if target.is_floating_point():          # class probabilities
                    target = target.argmax(-1)
                predicted = (logits.argmax(-1) if target.shape == logits.shape[:-1]
                             else logits.argmax(1))
                valid = target != -100
                wrong += float((predicted != target)[valid].sum())
                labelled += float(valid.sum())
    return {"loss": total_loss / examples,
            "error": wrong / labelled if loss == "cross_entropy" and labelled else None}


def generalisation(model: nn.Module, model_path: Path, train: Path, test: Path,
                   batches: BatchSettings, kind: str) -> dict[str, float | None]:
    """Train and test loss and error of ``model`` and its gap (``test - train`` of ``kind``),
    on every example of the files (``max_batches`` applies to the sharpness data only)."""
    from quotientsharp.workflows.data import load_batches

    every = dataclasses.replace(batches, max_batches=None)
    out: dict[str, float | None] = {}
    for split, path in (("train", train), ("test", test)):
        split_batches, examples, _ = load_batches(path, model, model_path, every)
        try:
            values = evaluate(model, split_batches, batches.loss)
        except (TypeError, ValueError, IndexError, RuntimeError) as err:
            raise InputError(f"{split} data {path} of model {model_path}: {err}") from err
        out[f"{split}_loss"], out[f"{split}_error"] = values["loss"], values["error"]
        out[f"{split}_examples"] = examples
    test_value, train_value = out[f"test_{kind}"], out[f"train_{kind}"]
    if test_value is None or train_value is None:
        raise InputError(f"model {model_path}: no {kind} to take the gap of (the error needs "
                         "--loss cross_entropy)")
    out["gap"] = test_value - train_value
    return out
