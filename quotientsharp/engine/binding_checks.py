"""Check stage of user bindings: each :class:`~quotientsharp.models.QuotientBinding` is checked
against the model on the first batch, before the ascent.

:func:`check_user_bindings` runs :func:`quotientsharp.models.symmetry_check.check_structure`
(gradient through ``from_point``, ``vertical()`` shapes, an overriding ``horizontal_projection``;
always: a broken class never yields a number) and, unless ``check_symmetry=False``, the
invariance check :func:`~quotientsharp.models.symmetry_check.check_bindings` with the loss of
the measurement itself (this functional model, its loss option, its batch conventions).
It touches the functional model and the first batch; no geometry, no solver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from quotientsharp.engine.batches import Batch, compute_loss, output_tensor
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.models.binding import QuotientBinding
from quotientsharp.models.symmetry_check import (
    SymmetryCheckError,
    check_bindings,
    check_structure,
)

__all__ = ["check_user_bindings", "user_bindings"]


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
