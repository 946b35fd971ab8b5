"""``quotientsharp study``: one model measured, from its manifest row to its record.

:func:`measure_entry` loads the model as ``quotientsharp measure`` does, reads the shared
sharpness data with the model's tokenizer, computes the gap when the manifest gives train and
test data instead of a gap, and runs every point of the grid on the same batches. The record it
returns is one line of ``models.jsonl``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from quotientsharp.workflows.fingerprints import content_identity, symmetry_fingerprint
from quotientsharp.workflows.grid import GridPoint
from quotientsharp.workflows.manifest import ManifestEntry
from quotientsharp.workflows.options import InputError, StudyConfig
from quotientsharp.workflows.records import is_main_rank
from quotientsharp.workflows.user_objects import import_object
from quotientsharp.workflows.user_symmetry import load_symmetry

#: Models whose geodesic measures found no symmetry, noted once each in this process.
_NOTED: set[str] = set()


def entry_symmetry(entry: ManifestEntry, symmetry: str | None, model: Any
                   ) -> tuple[str, list[Any], dict[str, Any]] | None:
    """The user's symmetry of one manifest row, if any: its ``MODULE:FUNCTION``, the bindings
    it returns for ``model`` and their :func:`~.fingerprints.symmetry_fingerprint`.

    The row's own ``symmetry`` field, else ``symmetry`` (the study's ``--symmetry``); ``None``
    without either.
    """
    spec = entry.symmetry or symmetry
    if not spec:
        return None
    flag = (f"the 'symmetry' field of model {entry.name!r} (line {entry.line})"
            if entry.symmetry else "--symmetry")
    bindings = load_symmetry(spec, model, flag)
    return spec, bindings, symmetry_fingerprint(import_object(spec, flag), bindings)


def _measure_point(model: Any, batches: list, point: GridPoint, entry: ManifestEntry,
                   config: StudyConfig, symmetries: list[Any] | None) -> Any:
    """The :class:`~quotientsharp.engine.SharpnessResult` of one grid point; the warnings that
    the record holds (reach) or a note says (no symmetry, once per model) are not repeated."""
    import warnings

    from quotientsharp.engine import NoSymmetryWarning, ReachWarning, sharpness
    from quotientsharp.engine.layouts import NO_SYMMETRY_NOTE

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NoSymmetryWarning)
            result = sharpness(model, batches, point.spec(config, symmetries))
        for warning in caught:
            if issubclass(warning.category, ReachWarning):
                continue    # in the record (reach, locality) and beside the taus
            if not issubclass(warning.category, NoSymmetryWarning):
                warnings.warn_explicit(warning.message, warning.category,
                                       warning.filename, warning.lineno)
            elif entry.name not in _NOTED and is_main_rank():
                # once per model, in the study's output
                _NOTED.add(entry.name)
                print(f"note: model {entry.name}: {NO_SYMMETRY_NOTE}")
    except (TypeError, ValueError, IndexError, RuntimeError) as err:
        raise InputError(f"{point.label(greek=False)} of model {entry.name} "
                         f"({entry.model}) on {config.data} failed: {err}") from err
    return result


def measure_entry(entry: ManifestEntry, grid: Sequence[GridPoint], config: StudyConfig,
                  device: Any, tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure one model of the manifest.

    Parameters
    ----------
    entry
        The manifest row.
    grid
        The measures to run, each on the same batches of ``config.data``.
    config
        The study's settings (``data``, ``batches``, ``dtype``, ``symmetry``, the gap's kind,
        the measures' options).
    device
        The torch device.
    tick
        Called with a short status after each step (the progress bar's postfix).

    Returns
    -------
    dict
        ``name``, ``identity`` (:func:`~.fingerprints.content_identity`: paths and SHA-256 of the
        model and the gap's data), ``model_class``,
        ``parameters``, ``examples`` and ``batches`` of the sharpness data, ``generalisation``
        (train/test loss and error and the gap, or ``None`` when the manifest gives the gap),
        ``sharpness`` (grid key -> value), ``per_batch`` (grid key -> per-batch values),
        ``clean_loss`` (mean clean loss on the sharpness data), ``seconds`` (grid key ->
        seconds), ``device``, ``symmetry`` (the user's ``MODULE:FUNCTION`` or ``None``) and
        ``symmetry_fingerprint`` (:func:`~.fingerprints.symmetry_fingerprint`, or ``None``).
    """
    import torch

    from quotientsharp.workflows.data import load_batches
    from quotientsharp.workflows.generalisation import generalisation
    from quotientsharp.workflows.saved_models import load_measured_model

    tick = tick or (lambda status: None)
    # hashed before loading: the record holds what was measured, not what is there later
    identity = content_identity(entry)
    model = load_measured_model(entry.model).to(device=device)
    if config.dtype is not None:
        model = model.to(dtype=getattr(torch, config.dtype))
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
