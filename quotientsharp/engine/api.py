"""``sharpness(model, batches, measure)``: the entry point of all measures.

``measure`` is a typed :class:`~.registry.MeasureSpec` (``GeodesicSpec(rho=0.1, metric="mix")``),
or the string form ``measure="geodesic", rho=0.1, **options``, which :func:`~.registry.measure_from`
turns into one at once: below this function, the engine sees the typed object only.

The call runs the engine's stages in order, each in a module of its own:

1. validate: the typed measure checks its options when it is made (:mod:`.registry`, with the
   checks of :mod:`.options`);
2. build the functional model (:mod:`.functional`): the model is never written, parameters and
   buffers are cloned once and every loss is a :func:`torch.func.functional_call`;
3. build the runtime measure, ``spec.build(...)`` (:mod:`.registry`, :mod:`.measures`); symmetry
   discovery and layout (:mod:`.layouts`) happen here for geodesic sharpness;
4. loop over the batches: the first batch's clean forward+backward finds the parameters without
   gradient, then the measure's geometry is built, once (:mod:`.geometry`), and every batch is
   measured (the solver, :mod:`.solver`, for ascent measures);
5. assemble the result (:mod:`.result`).

The model runs in eval mode during the measurement; every submodule's mode is restored
afterwards, also when the loss raises or the run is interrupted. Sharpness is computed per
batch and averaged over batches (``docs/sharpness.md``). This module holds the order of the
stages only: it computes nothing itself.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar, cast

import torch
from torch import nn

from quotientsharp.core.validation import value_checks
from quotientsharp.engine.batches import Batch, resolve_loss, split_batch
from quotientsharp.engine.determinism import (
    check_deterministic,
    global_states,
    kept_global_random_state,
)
from quotientsharp.engine.functional import FunctionalModel, checked_clean_loss
from quotientsharp.engine.measures import BatchOutcome, FirstEvaluation
from quotientsharp.engine.options import check_batches, check_radius_fits
from quotientsharp.engine.registry import MeasureSpec, measure_defaults, measure_from
from quotientsharp.engine.result import SharpnessResult, assemble_result

#: Options of each measure and their defaults (the fields of its :class:`~.registry.MeasureSpec`).
MEASURES: dict[str, dict[str, Any]] = measure_defaults()
_F = TypeVar("_F", bound=Callable[..., Any])


def _validated(model: object, batches: object, measure: MeasureSpec | str, rho: float | None,
               options: dict[str, Any]) -> MeasureSpec:
    """Validate stage: the typed measure, made from the string form if need be (it checks its
    options when it is made)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(measure, MeasureSpec):
        if rho is not None or options:
            raise TypeError(f"{type(measure).__name__} holds rho and every option: pass them to "
                            f"it, not to sharpness (got rho={rho!r} and options "
                            f"{sorted(options)})")
        spec = measure
    else:
        spec = measure_from(measure, rho, options)
    check_batches(batches)
    return spec


@contextlib.contextmanager
def _in_eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode; every submodule's mode restored afterwards, whatever happens."""
    modes = {module: module.training for module in model.modules()}
    try:
        model.eval()
        yield
    finally:
        for module, training in modes.items():
            module.training = training


def _progress_bar(batches: Iterable[Any], per_batch: int, progress: bool | None,
                  measure: str) -> Any:
    from tqdm.auto import tqdm
    total = len(batches) * per_batch if isinstance(batches, Sized) else None
    disable = None if progress is None else not progress
    return tqdm(total=total, disable=disable, desc=f"{measure} sharpness", unit="eval",
                leave=False)


def _first_evaluation(functional: FunctionalModel, batch: Batch
                      ) -> tuple[FirstEvaluation, list[str]]:
    """The clean loss and its gradient on batch 0, with the embedding rows it touches, and
    the parameters without gradient (``excluded``).

    One forward+backward finds the parameters without gradient; the measure reuses it as the
    clean loss and the ascent's evaluation at ``xi = 0``.
    """
    before = global_states(functional.model)
    with functional.checking(), functional.recording_tables() as tables:
        first = FirstEvaluation(*functional.loss_and_gradients(batch))
    first.rows = tables.rows()
    # before the loss's value: a forward that draws random numbers is the first thing wrong
    check_deterministic(before, batch)
    checked_clean_loss(first.loss, 0, batch, functional)
    return first, [n for n, g in first.gradients.items() if g is None]


def _split_batches(batches: Iterable[Any], functional: FunctionalModel
                   ) -> Iterator[tuple[int, Batch]]:
    """Each batch, indexed and split into inputs and target on the model's device, lazily."""
    for index, raw in enumerate(batches):
        yield index, split_batch(raw, index, functional.device, functional.input_dtype)


def _keeping_global_random_state(function: _F) -> _F:
    """``function`` run inside :func:`.determinism.kept_global_random_state`: the caller's
    global random state is the same after the call, whether it returns or raises."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with kept_global_random_state():
            return function(*args, **kwargs)

    return cast(_F, wrapper)


# ---------------------------------------------------------------------------- entry point
@_keeping_global_random_state
def sharpness(model: nn.Module, batches: Iterable[Any], measure: MeasureSpec | str = "geodesic",
              rho: float | None = None, **options: Any) -> SharpnessResult:
    """Sharpness of ``model`` on ``batches``, per batch then averaged.

    Parameters
    ----------
    model
        A ``torch.nn.Module``; never written (state dict bit-identical afterwards) and run in
        eval mode during the measurement (modes restored afterwards).
    batches
        A non-empty iterable of batches, each ``(x, y)`` or a dict with ``"labels"``
        (see :mod:`quotientsharp.engine.batches`); iterated once.
    measure
        The measure with ``rho`` and every option: a :class:`~.registry.MeasureSpec`,
        :class:`~.registry.AverageSpec`, :class:`~.registry.WorstCaseSpec`,
        :class:`~.registry.AdaptiveSpec` (worst case with ``c = |theta|``),
        :class:`~.registry.GeodesicSpec` or :class:`~.registry.RelativeFlatnessSpec`, whose
        fields document each option. Or its name, ``"average"``, ``"worst_case"``,
        ``"adaptive"``, ``"geodesic"`` or ``"relative_flatness"``, with ``rho`` and
        ``**options`` (the same fields by keyword): ``measure_from(measure, rho, options)``.
    rho
        With a name only: the radius (standard deviation for ``"average"``); required except
        for relative flatness.
    **options
        With a name only: the measure's options (:data:`MEASURES` lists them with their
        defaults); one it does not have raises a ``TypeError`` naming it.

    Returns
    -------
    SharpnessResult

    Notes
    -----
    Parameters whose loss gradient is ``None`` on the first batch are excluded with a warning;
    frozen parameters (``requires_grad=False``) are never perturbed and listed in
    ``result.frozen``. Each batch is checked once, before its ascent: an empty batch, token ids
    outside the vocabulary, class labels out of range (or all ``-100``), labels and outputs of
    different sizes, an integer model output and class labels with ``loss="mse"`` raise an
    error naming the batch.
    Half-precision and bfloat16 models are measured with geometry, gradients and losses in
    float32 (float64 if any parameter is float64); perturbed parameters are cast back to each
    parameter's own dtype for the forward.
    """
    # 1. validate: the typed measure (made from the string form if need be) checked its options
    spec = _validated(model, batches, measure, rho, options)
    # 2. the functional model: clones of the parameters, the loss at given parameters
    loss = resolve_loss(spec.loss)
    functional = FunctionalModel(model, (loss[0], loss[2]),
                                 geometry_dtype=spec.resolved_geometry_dtype)
    functional.check_finite()
    # 3. the runtime measure, built by the typed one (symmetries discovered here)
    generator = torch.Generator(device=functional.device).manual_seed(spec.seed)
    evaluator, extra = spec.build(model, functional, generator)
    check_radius_fits(spec.rho, extra.get("eta0"), functional.dtype)

    # 4. the batches: batch 0's clean forward+backward tells which parameters have no gradient,
    # the measure builds its geometry once, then measures every batch
    outcomes: list[BatchOutcome] = []
    with _in_eval_mode(model), contextlib.closing(_progress_bar(
            batches, evaluator.evaluations_per_batch(), spec.progress, spec.name)) as bar:
        stream = _split_batches(batches, functional)
        head = next(stream, None)
        if head is None:
            raise ValueError("batches is empty: sharpness needs at least one batch")
        first, excluded = _first_evaluation(functional, head[1])
        evaluator.setup(excluded)           # the geometry is built here, once
        spec.check_first_batch(functional, head[1])     # the caller's bindings, before any ascent
        # reused by batch 0 alone: popped, so that its parameter-sized gradients die with it
        reusable = [first]
        del first
        for index, batch in itertools.chain([head], stream):
            before = global_states(model)   # every batch: a draw on any forward is refused
            with value_checks(False):
                outcomes.append(evaluator(batch, index, bar.update, spec.keep_perturbations,
                                          reusable.pop() if reusable else None))
            check_deterministic(before, batch, "its ascent")

    # 5. the result
    settings = {"measure": spec.name, "rho": spec.rho, "n_batches": len(outcomes),
                "geometry_dtype": str(functional.dtype).removeprefix("torch."),
                **spec.settings(), "loss": loss[1], **extra, **evaluator.settings_after()}
    return assemble_result(spec.name, outcomes, settings, excluded, functional.frozen,
                           spec.keep_perturbations, bool(extra.get("blockwise")))
