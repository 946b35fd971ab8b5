"""Discovery/layout stage: the symmetries of a geodesic measurement, as a layout or bindings.

:func:`symmetry_layout` turns the ``symmetries`` option into what the geometry stage builds on:
``None`` (every parameter in the adaptive factor), a
:class:`~quotientsharp.models.ParameterLayout` (discovered by
:func:`quotientsharp.models.find_symmetries`, or given) or a list of
:class:`~quotientsharp.models.QuotientBinding`. It touches the model (discovery reads its
modules) and the models layer; no geometry, no batch.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.models.binding import QuotientBinding

__all__ = ["NO_SYMMETRY_NOTE", "NoSymmetryWarning", "symmetry_layout"]

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
