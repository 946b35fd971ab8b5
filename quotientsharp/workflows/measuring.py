"""``quotientsharp study``: one model measured, from its manifest row to its record, with its
generalisation gap, ``test - train`` of its 0-1 error (``--gap-from error``) or of its loss."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quotientsharp.workflows.data import load_batches
from quotientsharp.workflows.fingerprints import content_identity, symmetry_fingerprint
from quotientsharp.workflows.grid import GridPoint
from quotientsharp.workflows.manifest import ManifestEntry
from quotientsharp.workflows.options import BatchSettings, InputError, StudyConfig
from quotientsharp.workflows.records import is_main_rank
from quotientsharp.workflows.saved_models import load_measured_model
from quotientsharp.workflows.user_objects import import_object, load_symmetry

if TYPE_CHECKING:
    from torch import nn

#: Models whose geodesic measures found no symmetry, noted once each in this process.
_NOTED: set[str] = set()


def entry_symmetry(entry: ManifestEntry, symmetry: str | None, model: Any
                   ) -> tuple[str, list[Any], dict[str, Any]] | None:
    """The row's own symmetry, else ``--symmetry``, else ``None``: its ``MODULE:FUNCTION``, its
    bindings for ``model`` and their fingerprint."""
    spec = entry.symmetry or symmetry
    if not spec:
        return None
    flag = (f"the 'symmetry' field of model {entry.name!r} (line {entry.line})"
            if entry.symmetry else "--symmetry")
    bindings = load_symmetry(spec, model, flag)
    return spec, bindings, symmetry_fingerprint(import_object(spec, flag), bindings)


def sharpness_noting_symmetry(model: Any, batches: list, spec: Callable[[], Any],
                              what: str) -> tuple[Any, bool]:
    """``sharpness(model, batches, spec())`` and whether it found no symmetry (for the caller to
    note once rather than warn per measure); reach warnings are dropped (the table and the record
    hold the reach), others issued again. A model that does not fit its data (or an option that
    does not fit the model) is an :class:`InputError`, ``"{what} failed: ..."``."""
    import warnings

    from quotientsharp.engine import NoSymmetryWarning, ReachWarning, sharpness

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NoSymmetryWarning)
            result = sharpness(model, batches, spec())
    except (TypeError, ValueError, IndexError, RuntimeError) as err:
        raise InputError(f"{what} failed: {err}") from err
    no_symmetry = False
    for warning in caught:
        if issubclass(warning.category, NoSymmetryWarning):
            no_symmetry = True
        elif not issubclass(warning.category, ReachWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
    return result, no_symmetry


def _measure_point(model: Any, batches: list, point: GridPoint, entry: ManifestEntry,
                   config: StudyConfig, symmetries: list[Any] | None) -> Any:
    """The result of one grid point, noting once per model that it found no symmetry."""
    from quotientsharp.engine.layouts import NO_SYMMETRY_NOTE

    result, no_symmetry = sharpness_noting_symmetry(
        model, batches, lambda: point.spec(config, symmetries),
        f"{point.label(greek=False)} of model {entry.name} ({entry.model}) on {config.data}")
    if no_symmetry and entry.name not in _NOTED and is_main_rank():
        _NOTED.add(entry.name)
        print(f"note: model {entry.name}: {NO_SYMMETRY_NOTE}")
    return result


def evaluate(model: nn.Module, batches: Sequence[Any], loss: str) -> dict[str, float | None]:
    """Mean loss (weighted by examples) and 0-1 error of ``model`` over ``batches``:
    ``{"loss", "error"}``, the error the share of labels (``-100`` left out) whose class is not
    the largest logit, ``None`` with ``loss="mse"``."""
    import torch

    from quotientsharp.engine.batches import (
        IGNORE_INDEX,
        compute_loss,
        output_tensor,
        resolve_loss,
        split_batch,
    )

    function, _, builtin = resolve_loss(loss)
    parameter = next(model.parameters())
    input_dtype = parameter.dtype if parameter.is_floating_point() else None
    total_loss = examples = wrong = labelled = 0.0
    with torch.no_grad():
        for index, raw in enumerate(batches):
            batch = split_batch(raw, index, parameter.device, input_dtype)
            count = _loss_weight(batch.target, loss)
            if count == 0:
                continue            # every label -100: nothing of this batch is averaged
            output = model(*batch.args, **batch.kwargs)
            value = compute_loss(function, builtin, output, batch.target, torch.float64,
                                 batch.label, check=True)
            if not torch.isfinite(value):
                raise InputError(f"{batch.label}: the loss is {float(value)}")
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
                valid = target != IGNORE_INDEX
                wrong += float((predicted != target)[valid].sum())
                labelled += float(valid.sum())
    if not examples:
        raise InputError("every label of the files is -100 (ignored): no loss to average")
    return {"loss": total_loss / examples,
            "error": wrong / labelled if loss == "cross_entropy" and labelled else None}


def _loss_weight(target: Any, loss: str) -> int:
    """The entries a batch's mean loss averages over: its labels other than ``-100`` for
    cross-entropy on class labels (the loss leaves the others out, so weighing by the batch's
    size would count them), else its examples."""
    import torch

    from quotientsharp.engine.batches import IGNORE_INDEX

    if (loss == "cross_entropy" and isinstance(target, torch.Tensor)
            and not target.is_floating_point()):
        return int((target != IGNORE_INDEX).sum())
    return int(target.shape[0]) if isinstance(target, torch.Tensor) and target.dim() else 1


def generalisation(model: nn.Module, model_path: Path, train: Path, test: Path,
                   batches: BatchSettings, kind: str) -> dict[str, float | None]:
    """Train and test loss and error of ``model`` and its gap (``test - train`` of ``kind``),
    on every example of the files (``max_batches`` applies to the sharpness data only)."""
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


def measure_entry(entry: ManifestEntry, grid: Sequence[GridPoint], config: StudyConfig,
                  device: Any, tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The record of one model of the manifest (a line of ``models.jsonl``), measured on
    ``device`` at every point of ``grid`` on the same batches of ``config.data``;
    ``tick(status)`` after each step (the progress bar)."""
    tick = tick or (lambda status: None)
    # hashed before loading: the record holds what was measured, not what is there later
    identity = content_identity(entry)
    model = load_measured_model(entry.model, device, config.dtype)
    batches, examples, _ = load_batches(config.data, model, entry.model, config.batches)
    # the row's own symmetry, else --symmetry: bindings passed as the API's symmetries=
    bound = entry_symmetry(entry, config.symmetry, model)
    symmetry, fingerprint = (None, None) if bound is None else (bound[0], bound[2])
    record: dict[str, Any] = {
        "name": entry.name, "identity": identity, "model_class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()), "examples": examples,
        "batches": len(batches), "device": str(device), "generalisation": None,
        "sharpness": {}, "per_batch": {}, "reach": {}, "locality": {}, "evaluations": {},
        "clean_loss": None, "seconds": {},
        "symmetry": symmetry, "symmetry_fingerprint": fingerprint}
    if entry.computes_gap:
        if entry.train is None or entry.test is None:
            raise InputError(f"model {entry.name!r} (line {entry.line}): no gap and no train "
                             "and test data to compute it from")
        tick("gap")
        record["generalisation"] = generalisation(model, entry.model, entry.train, entry.test,
                                                  config.batches, config.gap_kind)
    for point in grid:
        tick(point.key)
        start = time.perf_counter()
        result = _measure_point(model, batches, point, entry, config,
                                None if bound is None else bound[1])
        record["sharpness"][point.key] = float(result.value)
        record["per_batch"][point.key] = [float(v) for v in result.per_batch]
        record["reach"][point.key] = result.reach
        record["locality"][point.key] = result.locality
        record["evaluations"][point.key] = result.evaluations
        record["seconds"][point.key] = time.perf_counter() - start
        if record["clean_loss"] is None:
            record["clean_loss"] = sum(result.clean_losses) / len(result.clean_losses)
    return record
