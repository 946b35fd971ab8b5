"""Discovery/layout stage: the ``symmetries`` option of a geodesic measurement, as ``None``,
a :class:`~quotientsharp.models.ParameterLayout` or a list of
:class:`~quotientsharp.models.QuotientBinding` (:func:`symmetry_layout`); the caller's own
bindings are checked on the first batch (:func:`check_user_bindings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from quotientsharp.core.validation import warn_at_caller
from quotientsharp.engine.batches import Batch, compute_loss, few_names, output_tensor
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.models.binding import QuotientBinding, check_binding_list
from quotientsharp.models.report import NoSymmetryWarning
from quotientsharp.models.symmetry_check import (
    SymmetryCheckError,
    check_bindings,
    check_structure,
)


def no_symmetry_note(other_metric: str = "adaptive", other_path: str = "line",
                     order: int | str = 2) -> str:
    """What geodesic sharpness equals on a model without symmetry, where every parameter is in
    the other factor (its ``other_metric``, ``other_path`` and ``order``), and what to do."""
    if other_metric == "euclidean":
        same = ("geodesic sharpness equals worst-case sharpness (p=2) here (every parameter is in "
                "the other factor, with other_metric='euclidean')")
    elif other_path == "geodesic" and order != 1:
        same = ("every parameter is in the adaptive factor, moved along its geodesic "
                "(other_path='geodesic'): adaptive sharpness's ball on another path, with no "
                "symmetry quotiented out")
    else:
        same = ("geodesic sharpness equals adaptive sharpness here (every parameter is in the "
                "adaptive factor)")
    return (f"no symmetry was found or bound, so {same}; to measure a symmetry discovery does "
            "not know, bind its quotient: symmetries=QuotientBinding(...) in the API, --symmetry "
            "MODULE:FUNCTION on the command line, a 'symmetry' field in a study manifest "
            "(docs/tutorial-custom-symmetry.md)")


#: Why geodesic sharpness equals adaptive sharpness on a model without symmetry, and what to do
#: (the note of the default options, which ``measure`` and ``study`` always use).
NO_SYMMETRY_NOTE = no_symmetry_note()


#: What the ``symmetries`` option may be, in the words of its errors.
SYMMETRIES_ALLOWED = ("'auto', 'none', a SymmetryReport, a ParameterLayout or one or a list of "
                      "QuotientBinding")


def _is_layout(symmetries: object) -> bool:
    """Whether ``symmetries`` is a layout (it maps parameters to coordinates and back)."""
    return hasattr(symmetries, "to_coordinates") and hasattr(symmetries, "to_parameters")


def check_symmetries(symmetries: object) -> None:
    """Raise unless ``symmetries`` is one of :data:`SYMMETRIES_ALLOWED`: a ``ValueError`` for
    another string, a ``TypeError`` for another type or a list of anything but bindings."""
    from quotientsharp.models import SymmetryReport
    if isinstance(symmetries, str):
        if symmetries not in ("auto", "none"):
            raise ValueError(f"symmetries must be {SYMMETRIES_ALLOWED}, got {symmetries!r}")
    elif isinstance(symmetries, (list, tuple)):
        check_binding_list(symmetries)
    elif not (isinstance(symmetries, (QuotientBinding, SymmetryReport))
              or _is_layout(symmetries)):
        raise TypeError(f"symmetries must be {SYMMETRIES_ALLOWED}, got "
                        f"{type(symmetries).__name__} {symmetries!r}")


def check_diagonal(diagonal: object) -> None:
    """Raise a ``TypeError`` unless ``diagonal`` is ``None`` or a list of ``(u_name, v_name)``
    pairs of parameter names (whether the model has them is checked by discovery)."""
    if diagonal is None:
        return
    if isinstance(diagonal, (list, tuple)) and all(
            isinstance(pair, (list, tuple)) and len(pair) == 2
            and all(isinstance(name, str) for name in pair) for pair in diagonal):
        return
    raise TypeError(f"diagonal must be None or a list of (u_name, v_name) pairs of parameter "
                    f"names, got {diagonal!r}")


def symmetry_layout(model: nn.Module, functional: FunctionalModel, symmetries: Any,
                    diagonal: Any, note: str = NO_SYMMETRY_NOTE
                    ) -> tuple[Any | None, dict[str, Any]]:
    """The symmetry layout (``None``, a layout or a list of bindings) and a settings summary
    (``symmetries`` was checked by :func:`check_symmetries` when the measure was made);
    ``note``: the warning where discovery finds no symmetry (:func:`no_symmetry_note`)."""
    bindings = user_bindings(symmetries)
    if bindings:
        return bindings, {"symmetries": "bindings", "symmetry_found": True,
                          # "invariant": False where the class opts out of the check that
                          # its metric is invariant (its values then depend on the group)
                          "bindings": [{"name": b.name, "quotient": b.quotient.name,
                                        "parameters": list(b.parameters),
                                        "invariant": bool(getattr(b.quotient, "invariant",
                                                                  True))}
                                       for b in bindings]}
    if symmetries == "none":
        return None, {"symmetries": "none", "symmetry_found": False}
    if _is_layout(symmetries):
        return symmetries, {"symmetries": type(symmetries).__name__, "symmetry_found": True}
    if symmetries == "auto":
        from quotientsharp.models import find_symmetries
        report = find_symmetries(model, diagonal=diagonal)
    else:
        report = symmetries
        _check_report_fits(report, model, functional)
    from quotientsharp.models import ParameterLayout
    if report.unknown:
        warn_at_caller(f"attention-like module(s) {report.unknown} were not understood: their "
                       "parameters are measured with the adaptive geometry", UserWarning)
    layout = ParameterLayout(report, functional.theta_geometry)
    if not report.pairs and not report.diagonal:
        warn_at_caller(note, NoSymmetryWarning)
    summary = {"symmetries": "report", "symmetry_found": bool(report.pairs or report.diagonal),
               "gl_pairs": len(report.pairs),
               "gl_buckets": [list(shape) for shape in layout.bucket_shapes],
               "diagonal_pairs": len(report.diagonal), "unknown_modules": list(report.unknown)}
    return layout, summary


def _check_report_fits(report: Any, model: nn.Module, functional: FunctionalModel) -> None:
    """Raise a ``ValueError`` naming ``symmetries`` when the report was made for another model
    (parameters it names that the model lacks or has in other shapes, parameters of the model
    it does not know), or while other parameters were frozen."""
    shapes = {name: tuple(t.shape) for name, t in functional.theta.items()}
    known = dict(getattr(report, "parameter_shapes", {}))
    missing = [n for n in known if n not in shapes]
    differ = [f"{n} {tuple(known[n])} (the model's {shapes[n]})" for n in known
              if n in shapes and tuple(known[n]) != shapes[n]]
    unknown = [n for n in shapes if n not in known]
    problems = [f"{what} {few_names(names)}{tail}" for what, names, tail in (
        ("this model has no parameter(s)", missing, ""), ("the shapes of", differ, " differ"),
        ("it does not know the model's parameter(s)", unknown, "")) if names]
    if problems:
        made = getattr(report, "model_type", "") or "unnamed"
        raise ValueError(f"symmetries: the SymmetryReport belongs to another model (made for "
                         f"class {made}, this model's class is {type(model).__name__}): "
                         + "; ".join(problems) + ". Pass find_symmetries(model) of this model, "
                         "or symmetries='auto'")
    changed = sorted(set(getattr(report, "trainable", [])) ^ set(functional.trainable))
    if changed:
        raise ValueError(f"symmetries: the SymmetryReport was made before requires_grad "
                         f"changed on parameter(s) {few_names(changed)}: make it again "
                         "(find_symmetries(model)), or pass symmetries='auto'")


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
