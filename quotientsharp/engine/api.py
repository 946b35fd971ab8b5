"""``sharpness(model, batches, measure)``: the entry point of all measures. It runs the
engine's stages in order (``docs/sharpness.md``, "The pipeline, stage by stage") and
computes nothing itself.
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
    caller_iteration,
    check_deterministic,
    global_states,
    kept_global_random_state,
)
from quotientsharp.engine.functional import FunctionalModel, checked_clean_loss
from quotientsharp.engine.measures import BatchOutcome, FirstEvaluation
from quotientsharp.engine.options import check_batches, check_radius_fits
from quotientsharp.engine.registry import MEASURE_REGISTRY, MeasureSpec, measure_from
from quotientsharp.engine.result import SharpnessResult, assemble_result
from quotientsharp.models.walker import check_model

#: Options of each measure and their defaults (the fields of its :class:`~.registry.MeasureSpec`).
MEASURES: dict[str, dict[str, Any]] = {name: kind.defaults()
                                        for name, kind in MEASURE_REGISTRY.items()}
_F = TypeVar("_F", bound=Callable[..., Any])


def _validated(model: object, batches: object, measure: MeasureSpec | str, rho: float | None,
               options: dict[str, Any]) -> MeasureSpec:
    """Validate stage: the typed measure, made from the string form if need be (it checks its
    options when it is made)."""
    check_model(model, functional=True)
    if torch.is_inference_mode_enabled():
        # its tensors never record gradients, whatever enable_grad says: each measure would
        # fail on "no gradient" instead
        raise RuntimeError("sharpness was called inside torch.inference_mode(), under which no "
                           "tensor records gradients, and every measure needs them: call it "
                           "outside that block (inside torch.no_grad() is fine)")
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
    """Batch 0's clean loss, gradient and touched rows (reused by the measure as its
    evaluation at ``xi = 0``), and the parameters without gradient."""
    before = global_states(functional.model)
    with (functional.checking(), functional.inputs_kept(batch),
          functional.recording_tables() as tables):
        first = FirstEvaluation(*functional.loss_and_gradients(batch))
    first.rows = tables.rows()
    # before the loss's value: a forward that draws random numbers is the first thing wrong
    check_deterministic(before, batch)
    functional.check_buffers_kept(batch)
    checked_clean_loss(first.loss, 0, batch, functional)
    return first, [n for n, g in first.gradients.items() if g is None]


def _keeping_global_random_state(function: _F) -> _F:
    """``function`` run inside :func:`.determinism.kept_global_random_state` (a plain wrapper:
    a context manager's own frame would be the caller ``warn_at_caller`` names)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with kept_global_random_state():
            return function(*args, **kwargs)

    return cast(_F, wrapper)


@_keeping_global_random_state
def sharpness(model: nn.Module, batches: Iterable[Any], measure: MeasureSpec | str = "geodesic",
              rho: float | None = None, **options: Any) -> SharpnessResult:
    """Sharpness of ``model`` on ``batches``, per batch then averaged.

    Parameters
    ----------
    model
        A ``torch.nn.Module`` of Python submodules (a TorchScript module or one wrapped in
        ``nn.DataParallel`` raises a ``TypeError``: pass the module itself); never written
        (state dict bit-identical afterwards) and run in eval mode during the measurement
        (modes restored afterwards).
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
    different sizes, an integer model output, class labels with ``loss="mse"`` and, for a
    HuggingFace causal language model, labels equal to ``input_ids`` (which its own loss would
    shift by one position; give them shifted) and, for a HuggingFace encoder-decoder (BART,
    T5, Whisper), labels without ``decoder_input_ids`` (which its own loss would build from
    the labels) raise an error naming the batch. A forward that
    draws random numbers (on any batch) or writes to its buffers or its inputs (on batch 0) is
    refused.
    Half-precision and bfloat16 models are measured with geometry, gradients and losses in
    float32 (float64 if any parameter is float64); perturbed parameters are cast back to each
    parameter's own dtype for the forward.
    """
    spec = _validated(model, batches, measure, rho, options)
    loss = resolve_loss(spec.loss)
    functional = FunctionalModel(model, (loss[0], loss[2]),
                                 geometry_dtype=spec.resolved_geometry_dtype)
    functional.check_finite()
    generator = torch.Generator(device=functional.device).manual_seed(spec.seed)
    evaluator, recorded = spec.build(model, functional, generator)
    check_radius_fits(spec.rho, spec.first_step(), functional.dtype)

    outcomes: list[BatchOutcome] = []
    with _in_eval_mode(model), contextlib.closing(_progress_bar(
            batches, evaluator.evaluations_per_batch(), spec.progress, spec.name)) as bar:
        # each batch split lazily, on the model's device
        stream = ((index, split_batch(raw, index, functional.device, functional.input_dtype))
                  for index, raw in enumerate(caller_iteration(batches)))
        head = next(stream, None)
        if head is None:
            raise ValueError("batches is empty: sharpness needs at least one batch")
        first, excluded = _first_evaluation(functional, head[1])
        evaluator.setup(excluded)           # the geometry is built here, once
        spec.check_first_batch(functional, head[1], evaluator)   # symmetries, before any ascent
        # reused by batch 0 alone: popped, so that its parameter-sized gradients die with it
        reusable = [first]
        del first
        for index, batch in itertools.chain([head], stream):
            before = global_states(model)   # every batch: a draw on any forward is refused
            with value_checks(False):
                outcomes.append(evaluator(batch, index, bar.update, spec.keep_perturbations,
                                          reusable.pop() if reusable else None))
            check_deterministic(before, batch, "its ascent")

    settings = {"measure": spec.name, "rho": spec.rho, "n_batches": len(outcomes),
                "geometry_dtype": str(functional.dtype).removeprefix("torch."),
                **spec.settings(), "loss": loss[1], **recorded, **evaluator.settings_after()}
    return assemble_result(spec.name, outcomes, settings, excluded, functional.frozen,
                           spec.keep_perturbations, spec.measures_blocks())
