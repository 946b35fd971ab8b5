"""Discovery/layout stage: the ``symmetries`` option of a geodesic measurement, normalised and
checked.

:func:`symmetry_layout` turns the ``symmetries`` option into what the geometry stage builds on:
``None`` (every parameter in the adaptive factor), a
:class:`~quotientsharp.models.ParameterLayout` (discovered by
:func:`quotientsharp.models.find_symmetries`, or given) or a list of
:class:`~quotientsharp.models.QuotientBinding`. It touches the model (discovery reads its
modules) and the models layer; no geometry, no batch.

The caller's own bindings (:func:`user_bindings`) are checked against the model on the first
batch, before the ascent: :func:`check_user_bindings` runs
:func:`quotientsharp.models.symmetry_check.check_structure` (gradient through ``from_point``,
``vertical()`` shapes, an overriding ``horizontal_projection``; always: a broken class never
yields a number) and, unless ``check_symmetry=False``, the invariance check
:func:`~quotientsharp.models.symmetry_check.check_bindings` with the loss of the measurement
itself (this functional model, its loss option, its batch conventions). That check touches the
functional model and the first batch; no geometry, no solver.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from quotientsharp.engine.batches import Batch, compute_loss, output_tensor
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.models.binding import QuotientBinding
from quotientsharp.models.symmetry_check import (
    SymmetryCheckError,
    check_bindings,
    check_structure,
)

#: Why geodesic sharpness equals adaptive sharpness on a model without symmetry, and what to do.
NO_SYMMETRY_NOTE = (
    "no symmetry was found or bound, so geodesic sharpness equals adaptive sharpness here (every "
    "parameter is in the adaptive factor); to measure a symmetry discovery does not know, bind "
    "its quotient: symmetries=QuotientBinding(...) in the API, --symmetry MODULE:FUNCTION on the "
    "command line, a 'symmetry' field in a study manifest (docs/tutorial-custom-symmetry.md)")


class NoSymmetryWarning(UserWarning):
    """Geodesic sharpness was asked for on a model where discovery found no symmetry."""


def symmetry_layout(model: nn.Module, functional: FunctionalModel, symmetries: Any,
                diagonal: Any) -> tuple[Any | None, dict[str, Any]]:
    """The symmetry layout (``None``, a layout or a list of bindings) and a settings summary."""
    if isinstance(symmetries, QuotientBinding):
        symmetries = [symmetries]
    if isinstance(symmetries, (list, tuple)):
        if not symmetries or not all(isinstance(b, QuotientBinding) for b in symmetries):
            raise TypeError("a list of symmetries must hold QuotientBinding objects only")
        return list(symmetries), {"symmetries": "bindings", "symmetry_found": True,
                                  "bindings": [{"name": b.name, "quotient": b.quotient.name,
                                                "parameters": list(b.parameters)}
                                               for b in symmetries]}
    if isinstance(symmetries, str):
        if symmetries == "none":
            return None, {"symmetries": "none", "symmetry_found": False}
        if symmetries != "auto":
            raise ValueError(f"symmetries must be 'auto', 'none', a SymmetryReport, a "
                             f"ParameterLayout or QuotientBinding(s), got {symmetries!r}")
        from quotientsharp.models import find_symmetries
        report = find_symmetries(model, diagonal=diagonal)
    elif hasattr(symmetries, "to_coordinates") and hasattr(symmetries, "to_parameters"):
        return symmetries, {"symmetries": type(symmetries).__name__, "symmetry_found": True}
    else:
        from quotientsharp.models import SymmetryReport
        if not isinstance(symmetries, SymmetryReport):
            raise TypeError(f"symmetries must be 'auto', 'none', a SymmetryReport, a "
                            f"ParameterLayout or QuotientBinding(s), got "
                            f"{type(symmetries).__name__} {symmetries!r}")
        report = symmetries
    from quotientsharp.models import ParameterLayout
    if report.unknown:
        warnings.warn(f"attention-like module(s) {report.unknown} were not understood: their "
                      "parameters are measured with the adaptive geometry", UserWarning,
                      stacklevel=4)
    layout = ParameterLayout(report, functional.theta_geometry)
    if not report.pairs and not report.diagonal:
        warnings.warn(NO_SYMMETRY_NOTE, NoSymmetryWarning, stacklevel=4)
    summary = {"symmetries": "report", "symmetry_found": bool(report.pairs or report.diagonal),
               "gl_pairs": len(report.pairs),
               "gl_buckets": [list(shape) for shape in layout.bucket_shapes],
               "diagonal_pairs": len(report.diagonal), "unknown_modules": list(report.unknown)}
    return layout, summary


# ------------------------------------------------------------------ checks of the caller's bindings
def user_bindings(symmetries: object) -> list[QuotientBinding]:
    """The caller's bindings in the ``symmetries`` option (empty for discovery or a layout)."""
    if isinstance(symmetries, QuotientBinding):
        return [symmetries]
    if isinstance(symmetries, (list, tuple)):
        return [b for b in symmetries if isinstance(b, QuotientBinding)]
    return []


def check_user_bindings(functional: FunctionalModel, batch: Batch,
                        bindings: Sequence[QuotientBinding], invariance: bool, seed: int
                        ) -> None:
    """Raise a :class:`~quotientsharp.models.SymmetryCheckError` naming the first binding that
    fails (the model must be in the mode it is measured in: eval)."""
    params = functional.theta_geometry
    for binding in bindings:
        check_structure(binding, params)
    if not invariance:
        return

    def evaluate(values: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor,
                                                              torch.Tensor | None]:
        # every parameter passed in its own dtype, each a new tensor (never theta itself)
        full = {n: values[n].to(functional.dtypes[n]) if n in values
                else functional.theta[n].clone() for n in functional.theta}
        output = torch.func.functional_call(functional.model, (full, functional.buffers),
                                            batch.args, batch.kwargs)
        loss = compute_loss(functional.loss_function, functional.builtin_loss, output,
                            batch.target, functional.dtype, batch.label)
        return loss, output_tensor(output)

    forward_dtype = max((functional.dtypes[n] for b in bindings for n in b.parameters),
                        key=lambda d: torch.finfo(d).eps)
    for result in check_bindings(bindings, params, evaluate, forward_dtype, seed=seed):
        if not result.passed:
            raise SymmetryCheckError(
                f"{result.message()}: the quotient's group changes the model's function, so "
                "geodesic sharpness would measure a space that is not the model's symmetry "
                "quotient. Check the binding's parameters and maps, and that the model is "
                "invariant in eval mode (sharpness() measures in eval mode); "
                "check_symmetry=False skips this check")
