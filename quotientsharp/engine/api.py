"""``sharpness(model, batches, measure=..., rho=..., **options)``: the entry point of all measures.

The call runs the engine's stages in order, each in a module of its own:

1. validate the options (:mod:`.options`; a measure's own options: its registry entry);
2. build the functional model (:mod:`.functional`): the model is never written, parameters and
   buffers are cloned once and every loss is a :func:`torch.func.functional_call`;
3. build the measure from the registry (:mod:`.registry`, :mod:`.measures`); symmetry
   discovery and layout (:mod:`.layouts`) happen here for geodesic sharpness;
4. loop over the batches: the first batch's clean forward+backward finds the parameters without
   gradient, then the measure's geometry is built, once (:mod:`.space`), and every batch is
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
from quotientsharp.engine.binding_checks import check_user_bindings, user_bindings
from quotientsharp.engine.determinism import (
    check_deterministic,
    global_states,
    kept_global_random_state,
)
from quotientsharp.engine.functional import FunctionalModel, checked_clean_loss
from quotientsharp.engine.measures import BatchOutcome, FirstEvaluation
from quotientsharp.engine.options import (
    check_batches,
    check_bool,
    check_geometry_dtype,
    check_measure,
    check_nonfinite,
    check_progress,
    check_radius_fits,
    check_rho,
    check_seed,
    resolve_options,
)
from quotientsharp.engine.registry import (
    ALIASES,
    MEASURE_REGISTRY,
    REFERENCE_ITERATIONS,
    REFERENCE_RESTARTS,
    MeasureSetup,
    MeasureSpec,
    measure_defaults,
    reference_settings,
)
from quotientsharp.engine.result import SharpnessResult, assemble_result

__all__ = ["MEASURES", "REFERENCE_ITERATIONS", "REFERENCE_RESTARTS", "SharpnessResult",
           "reference_settings", "sharpness"]

#: Options of each measure and their defaults (a view of the registry, :mod:`.registry`).
MEASURES: dict[str, dict[str, Any]] = measure_defaults()
#: Options that are not recorded in ``result.settings``: the loss and the symmetries are
#: recorded in their own form, the geometry dtype as resolved; ``host_decisions`` changes no
#: value.
_UNRECORDED = ("loss", "symmetries", "geometry_dtype", "host_decisions")
_F = TypeVar("_F", bound=Callable[..., Any])


def _validated(model: object, batches: object, measure: object, rho: object,
               options: dict[str, Any]) -> tuple[MeasureSpec, float | None, dict[str, Any]]:
    """Validate stage: the measure's spec, the checked ``rho`` and the options resolved (the
    options every measure shares checked, ``geometry_dtype`` resolved; the measure's own are its
    spec's to check)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    spec = MEASURE_REGISTRY[check_measure(measure, MEASURE_REGISTRY, ALIASES)]
    opts = resolve_options(spec.name, spec.defaults, options)
    checked_rho = check_rho(rho, spec.needs_rho)
    check_batches(batches)
    check_seed(opts["seed"])
    check_bool("keep_perturbations", opts["keep_perturbations"])
    check_progress(opts["progress"])
    check_nonfinite(opts["nonfinite"])
    return spec, checked_rho, {**opts, "geometry_dtype": check_geometry_dtype(
        opts["geometry_dtype"])}


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
def sharpness(model: nn.Module, batches: Iterable[Any], measure: str = "geodesic",
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
        ``"average"``, ``"worst_case"``, ``"adaptive"`` (worst case with ``c = |theta|``),
        ``"geodesic"`` or ``"relative_flatness"``.
    rho
        Radius (standard deviation for ``"average"``); required except for relative flatness.
    **options
        Common: ``loss`` (``None``/``"cross_entropy"``, ``"mse"`` or ``loss(output, target)``),
        ``seed`` (random starts and draws; same seed, same value), ``progress`` (tqdm bar:
        ``True``/``False``; ``None`` shows it on a terminal only), ``keep_perturbations``,
        ``nonfinite`` (``"raise"``: a NaN or inf perturbed loss raises a ``ValueError`` naming
        the batch, the solver iteration and the likely cause; ``"skip"``: such evaluations are
        left out, counted in ``result.nonfinite_evaluations``, with a warning). ``geometry_dtype``
        (``None``: float64 if any parameter is float64, else float32; ``torch.float64`` or
        ``"float64"`` keeps the geometry, the gradients and the iterate of a float32 or half
        model in float64, which holds invariance at ill-conditioned points of the orbit
        where float32 geometry does not; the forward still runs in the model's dtype).

        Ascent measures (Auto-PGD, Croce & Hein 2020): ``n_iter=20``, ``eta0=None`` (``2 rho``),
        ``alpha=0.75``, ``random_init=False``, ``restarts=0``. Solver quality:
        ``reference_solve=None`` (``True`` or a dict of ``n_iter``, ``restarts``, ``eta0``,
        ``alpha``, ``random_init``: a second, stronger solve per batch, default 10 times the
        steps and 4 random restarts, whose value and gap are reported; see
        :func:`reference_settings`). Block-wise: ``blockwise=False`` (``True``: norm share and
        loss change of every block of the best perturbation, ``result.blocks``; one extra
        forward per block and batch). Speed: ``touched_rows=True`` solves on the rows of the
        embedding tables the batch looks up, when the solve starts at ``xi = 0`` (any
        ascent measure, ``p="inf"`` included): the other
        rows have no gradient and never move, so the value is the same up to the summation
        order of the norms (``settings["restricted_rows"]`` lists, per batch, the rows kept
        per table; ``False`` solves on the full tables). ``host_decisions=True``: a single
        problem on the CPU reads the solver's decisions on the host, where that is free
        (:mod:`quotientsharp.engine.decisions`); ``False`` runs the device path there too (the
        CPU stand-in of a CUDA run). The values are the same bit for bit, so it is not
        recorded in ``result.settings``. ``compile_steps=False``: ``True`` runs the solver's
        per-iteration geometry (direction, steps, rescales) as ``torch.compile`` graphs
        (:class:`quotientsharp.engine.solver.CompiledSteps`), with the decisions on the device:
        its elementwise passes fuse, for about half their eager cost on a CPU, but the first
        compile takes tens of seconds (seconds from torch's on-disk cache), so it pays on long
        runs. Equal to the eager values to rounding; recorded in ``result.settings``.

        ``average``: ``adaptive=False`` (``c = |theta|`` if true), ``samples=1``.
        ``worst_case``: ``p=2`` or ``"inf"``, ``adaptive=False``. ``adaptive``: ``p=2``.

        ``geodesic``: ``metric`` (``"inv"``, ``"mix"``, ``"euclidean"``), ``order`` (``1``,
        ``2``, ``"exact"``: GL pairs by RK4 with ``exact_steps=16``, diagonal pairs in closed
        form; with the mix metric ``rho`` must keep them inside the manifold, else a
        ``ValueError`` says how small), ``eps=0.0`` (Gram relaxation of GL pairs; diagonal pairs
        have none and reject zero coordinates), ``symmetries`` (``"auto"``: discovered by
        :func:`quotientsharp.models.find_symmetries`, ``diagonal`` passed on; ``"none"``: every
        parameter in the adaptive block; a ``SymmetryReport`` / ``ParameterLayout``; or one or a
        list of :class:`~quotientsharp.models.QuotientBinding`: any quotient, a user's own
        included, attached to named parameters, measured with its own metric), ``other_metric``
        (``"adaptive"``: ``diag(1/w^2)``, the metric of adaptive sharpness, or
        ``"euclidean"``), ``other_path`` (``"line"``: ``w + xi``; ``"geodesic"``:
        the adaptive metric's geodesic, ``w * exp(xi / w)`` for ``order="exact"``),
        ``check_symmetry=True`` (each binding is checked on the first batch, before the
        ascent: random group elements of its quotient must leave the loss and the outputs
        unchanged to ``sqrt(eps)`` of the forward's dtype, else a
        :class:`~quotientsharp.models.SymmetryCheckError` names the binding; ``False`` skips
        that check, recorded in ``result.settings``. The structure of every binding is checked
        always: a gradient through ``from_point``, the shapes ``vertical()`` returns, an
        overriding ``horizontal_projection`` idempotent and horizontal). With ``symmetries=
        "auto"`` and no symmetry found, a :class:`NoSymmetryWarning` says that geodesic equals
        adaptive sharpness there.

        ``relative_flatness``: ``layer`` (module name, default the last ``nn.Linear``),
        ``hvp_chunk=64`` (Hessian-vector products per batched double backward).

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
    # 1. validate: the measure's registry entry, rho, the options every measure shares
    spec, rho, opts = _validated(model, batches, measure, rho, options)
    # 2. the functional model: clones of the parameters, the loss at given parameters
    loss = resolve_loss(opts["loss"])
    functional = FunctionalModel(model, (loss[0], loss[2]),
                                 geometry_dtype=opts["geometry_dtype"])
    functional.check_finite()
    # 3. the measure, from the registry (its own options checked; symmetries discovered)
    generator = torch.Generator(device=functional.device).manual_seed(opts["seed"])
    evaluator, extra = spec.build(MeasureSetup(model, functional, rho, opts, generator))
    check_radius_fits(rho, extra.get("eta0"), functional.dtype)

    # 4. the batches: batch 0's clean forward+backward tells which parameters have no gradient,
    # the measure builds its geometry once, then measures every batch
    outcomes: list[BatchOutcome] = []
    with _in_eval_mode(model), contextlib.closing(_progress_bar(
            batches, evaluator.evaluations_per_batch(), opts["progress"], spec.name)) as bar:
        stream = _split_batches(batches, functional)
        head = next(stream, None)
        if head is None:
            raise ValueError("batches is empty: sharpness needs at least one batch")
        first, excluded = _first_evaluation(functional, head[1])
        evaluator.setup(excluded)           # the geometry is built here, once
        # the caller's bindings checked against the model on batch 0, before any ascent
        bindings = user_bindings(opts.get("symmetries"))
        if bindings:
            check_user_bindings(functional, head[1], bindings, opts["check_symmetry"],
                                opts["seed"])
        # reused by batch 0 alone: popped, so that its parameter-sized gradients die with it
        reusable = [first]
        del first
        for index, batch in itertools.chain([head], stream):
            before = global_states(model)   # every batch: a draw on any forward is refused
            with value_checks(False):
                outcomes.append(evaluator(batch, index, bar.update, opts["keep_perturbations"],
                                          reusable.pop() if reusable else None))
            check_deterministic(before, batch, "its ascent")

    # 5. the result
    settings = {"measure": spec.name, "rho": rho, "n_batches": len(outcomes),
                "geometry_dtype": str(functional.dtype).removeprefix("torch."),
                **{k: v for k, v in opts.items() if k not in _UNRECORDED},
                "loss": loss[1], **extra, **evaluator.settings_after()}
    return assemble_result(spec.name, outcomes, settings, excluded, functional.frozen,
                           opts["keep_perturbations"], bool(extra.get("blockwise")))
