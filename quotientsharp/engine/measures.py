"""Measure stage: the sharpness measures, one batch at a time (``docs/sharpness.md``):
:class:`AverageMeasure` (Gaussian noise), :class:`AscentMeasure` (Auto-PGD over a ball or box)
and :class:`RelativeFlatness` (Hessian-vector products), each a :class:`Measure`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from quotientsharp.core.adaptive import AdaptiveQuotient
from quotientsharp.core.validation import warn_at_caller
from quotientsharp.engine.ball import BoxGeometry, GeodesicBall
from quotientsharp.engine.batches import Batch, few_names
from quotientsharp.engine.blocks import (
    BlockOutcome,
    Locality,
    blockwise,
    locality,
    loss_rounding,
    path_check,
)
from quotientsharp.engine.coordinates import BoundCoordinates, LayoutCoordinates, PlainCoordinates
from quotientsharp.engine.functional import (
    FunctionalModel,
    checked_clean_loss,
    nonfinite_inputs,
)
from quotientsharp.engine.geometry import (
    AscentSpace,
    GeometryPlan,
    PlainGeometry,
    TouchedSpace,
    plain_coordinates,
)
from quotientsharp.engine.solver import (
    AscentOutcome,
    AscentSettings,
    CompiledSteps,
    HandedOver,
    Objective,
    SearchSettings,
    ascend,
    search,
)

Tensors = tuple[torch.Tensor, ...]
#: Called after every loss evaluation (a progress bar's update).
Tick = Callable[[], object]


def _exact_steps(geometry: GeodesicBall | BoxGeometry) -> int | None:
    """The RK4 steps of a ball some of whose factors follow exact geodesics without a closed
    form; ``None`` for any other geometry."""
    if not isinstance(geometry, GeodesicBall):
        return None
    return geometry.steps if "exact" in geometry.orders else None


class NonFiniteLossError(ValueError):
    """A perturbed loss was NaN or inf (``nonfinite="raise"``); the message names the batch,
    the evaluation and the likely cause."""


def likely_cause(model: FunctionalModel, rho: float | None, batch: Batch | None = None,
                 exact_steps: int | None = None) -> str:
    """The likely reason for a non-finite perturbed loss, and what to do about it; given the
    batch of an ascent, a non-finite gradient at theta first (one more forward+backward).
    ``exact_steps``: the perturbed points lie on exact geodesics integrated with that many RK4
    steps, which can leave the full-rank points of a factor."""
    names = [] if batch is None else model.nonfinite_gradients(batch)
    if names:
        # an inf input that a saturating layer (tanh, softmax) makes a finite loss still
        # multiplies into the gradient: the data, not the loss, is then to blame
        inputs = [] if batch is None else nonfinite_inputs(batch)
        why = (f"the input(s) {inputs} contain NaN or inf, which the forward turns into a "
               "finite loss but not into a finite gradient; remove or replace those values"
               if inputs else "the loss is finite there but not differentiable (a sqrt, log "
               "or division at 0?)")
        # the first step follows the gradient at theta: no radius is small enough
        return (f"likely cause: the gradient of the loss at theta, before any perturbation, is "
                f"not finite (NaN or inf) in parameter(s) {few_names(names)}: {why}, so the "
                "ascent's first step is not finite whatever rho")
    half = sorted({str(d).removeprefix("torch.") for d in model.dtypes.values()
                   if d in (torch.float16, torch.bfloat16)})
    if half:
        return (f"likely cause: half-precision overflow: the model runs in {', '.join(half)} "
                "(float16's largest finite value is 65504), so a perturbed forward overflowed; "
                "measure a float32 copy (model.float()) or use a smaller rho")
    radius = "" if rho is None else f"rho={rho:g} "
    if exact_steps is not None:
        # a factor's Gram matrix that goes singular on the way makes the integration NaN
        ball = "" if rho is None else f"rho={rho:g}, "
        return (f"likely cause: an exact geodesic of the ball ({ball}RK4 of {exact_steps} "
                "steps where it has no closed form) left the full-rank points of a symmetry "
                "factor, or overflowed (under mix a factor moves by about rho over the smallest "
                "singular value of its partner); use more exact_steps, a smaller rho or the inv "
                "metric")
    dtype = str(model.dtype).removeprefix("torch.")
    return (f"likely cause: the radius {radius}is too large for {dtype}: the perturbed "
            "parameters or activations overflow (or leave the loss's domain); use a smaller "
            "rho")


_SKIP_HINT = ("; or pass nonfinite='skip' (--nonfinite skip on the command line) to keep the "
              "best over the finite evaluations (the skipped ones are counted per batch)")


def _nonfinite(outcome: AscentOutcome, settings: AscentSettings) -> tuple[int, bool]:
    """The non-finite evaluations of one ascent, and whether no perturbed one was finite."""
    if outcome.nonfinite_count is None:
        return 0, False
    count, best = torch.stack([outcome.nonfinite_count.to(outcome.loss.dtype),
                               outcome.loss]).tolist()
    if count == 0:
        return 0, False
    total = settings.runs * settings.evaluations_per_run
    # a run started at xi = 0 begins with the clean loss, which is finite: its best is finite
    # even when every perturbed evaluation was not, and would report a sharpness of 0
    perturbed = total - (0 if settings.random_init else 1)
    return int(count), not math.isfinite(best) or count >= perturbed


def _check_ascents(solves: Sequence[tuple[AscentSettings, AscentOutcome, str]], index: int,
                   model: FunctionalModel, rho: float | None, policy: str,
                   batch: Batch | None = None, exact_steps: int | None = None) -> int:
    """The non-finite evaluations of batch ``index``'s solves (each named by its ``label``);
    raises under ``"raise"``, and under ``"skip"`` when no solve had a finite evaluation
    (``exact_steps``: :func:`likely_cause`)."""
    found = [(_nonfinite(outcome, settings), settings, outcome, label)
             for settings, outcome, label in solves]
    failed = [f for f in found if f[0][0] > 0]
    if not failed:
        return 0
    if policy == "skip" and not all(none for (_, none), *_ in found):
        return sum(count for (count, _), *_ in found)
    (count, none), settings, outcome, label = failed[0]
    none = none and all(n for (_, n), *_ in found)
    at = torch.stack(outcome.nonfinite_at).tolist()
    run = next(r for r, k in enumerate(at) if k >= 0)
    value = float(outcome.nonfinite_loss[run])
    where = "the starting point (iteration 0)" if at[run] == 0 else (
        f"solver iteration {at[run]} of {settings.n_iter}")
    runs = f" of run {run} (of {settings.runs})" if settings.runs > 1 else ""
    nothing = (" No perturbed evaluation was finite, so there is no value to report (under "
               "nonfinite='skip' too)." if none else "")
    raise NonFiniteLossError(
        f"batch {index}{label}: the perturbed loss is {value} at {where}{runs}; {count} of "
        f"{settings.runs * settings.evaluations_per_run} evaluations were not finite.{nothing} "
        f"The clean loss is finite, so the perturbation caused it: "
        f"{likely_cause(model, rho, batch, exact_steps)}"
        + (_SKIP_HINT if policy == "raise" and not none else ""))


def excess(loss: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """``loss - clean`` in float64: exact for losses of a narrower dtype, so that every value
    reported as a difference of losses equals the difference of the losses reported."""
    return loss.double() - clean.double()


@dataclass
class FirstEvaluation:
    """The loss at ``theta``, its gradient by parameter name (``None``: not reached) and the
    embedding rows touched, by table: batch 0's setup evaluation, reused by its measurement."""

    loss: torch.Tensor
    gradients: dict[str, torch.Tensor | None]
    rows: dict[str, torch.Tensor] = field(default_factory=dict)


def _clean_loss(model: FunctionalModel, batch: Batch, index: int,
                first: FirstEvaluation | None) -> torch.Tensor:
    """The clean loss of batch ``index``: the setup's evaluation, else a checked forward."""
    if first is not None:
        return first.loss
    with torch.no_grad(), model.checking():
        return checked_clean_loss(model.loss(batch, {}), index, batch, model)


@dataclass
class BatchOutcome:
    """One batch: sharpness, clean and perturbed loss, norms, optional displacement; the
    ascent measures add what :class:`~.result.SharpnessResult` reports per batch. A loss
    difference is taken in float64 (:func:`excess`)."""

    value: torch.Tensor
    clean: torch.Tensor
    perturbed: torch.Tensor
    norms: dict[str, torch.Tensor]
    perturbation: dict[str, torch.Tensor] | None = None
    nonfinite: int = 0
    trace: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    reference_trace: torch.Tensor | None = None
    blocks: BlockOutcome | None = None
    chains: list[float | None] | None = None
    chain_shortfalls: list[float] | None = None
    reach: float | None = None
    evaluations: int = 0
    locality: Locality | None = None
    rounding: float | None = None
    draw_rise: float | None = None


class Measure(Protocol):
    """What :func:`~.api.sharpness` asks of a measure, built by its registry entry.

    Setup, once before the batch loop: :meth:`setup` with the parameters that receive no
    gradient (ascent measures build their geometry there). Per batch: ``measure(batch, index,
    tick, keep, first)`` returns that batch's :class:`BatchOutcome`. After the batches:
    :meth:`settings_after`.
    """

    def setup(self, excluded: Sequence[str]) -> None:
        """Prepare the batch loop; ``excluded``: parameters the loss does not reach."""
        ...

    def evaluations_per_batch(self) -> int:
        """Loss evaluations per batch (the progress bar's unit)."""
        ...

    def __call__(self, batch: Batch, index: int, tick: Tick, keep: bool,
                 first: FirstEvaluation | None = None) -> BatchOutcome:
        """Sharpness of batch ``index``; ``tick()`` after each evaluation; ``keep``: return the
        best perturbation; ``first``: the setup's evaluation of this batch, to reuse."""
        ...

    def settings_after(self) -> dict[str, Any]:
        """What the measurement adds to ``SharpnessResult.settings`` after the batches."""
        ...


class AverageMeasure:
    """``E_delta[L(theta + delta)] - L(theta)``, ``delta ~ N(0, rho^2 diag(c^2))``, ``c =
    |theta|`` with ``adaptive``, else ``1``; the norm reported is the draws' mean
    ``||delta / c||_2``, the perturbation kept the last draw."""

    def __init__(self, model: FunctionalModel, rho: float, adaptive: bool, samples: int,
                 generator: torch.Generator, nonfinite: str = "raise") -> None:
        self.model, self.rho, self.adaptive, self.samples = model, rho, adaptive, samples
        self.generator, self.nonfinite = generator, nonfinite
        self.coordinates: PlainCoordinates | None = None

    def setup(self, excluded: Sequence[str]) -> None:
        warn_excluded(excluded, set())
        self.coordinates = plain_coordinates(self.model, set(excluded))
        quotient = AdaptiveQuotient.of(self.coordinates.base,
                                       "adaptive" if self.adaptive else "euclidean")
        # delta ~ N(0, rho^2 diag(c^2)) is rho times the metric's isotropic Gaussian
        self.frozen = quotient.frozen_point(self.coordinates.base)

    def evaluations_per_batch(self) -> int:
        return self.samples

    def settings_after(self) -> dict[str, Any]:
        return {}

    def __call__(self, batch: Batch, index: int, tick: Tick, keep: bool,
                 first: FirstEvaluation | None = None) -> BatchOutcome:
        assert self.coordinates is not None
        clean = _clean_loss(self.model, batch, index, first)
        total = torch.zeros((), dtype=self.model.dtype, device=self.model.device)
        norm_sum = torch.zeros_like(total)
        finite = torch.zeros((), dtype=torch.int64, device=self.model.device)
        first_bad = torch.full_like(finite, -1)
        bad_loss = torch.zeros_like(total)
        # the draws' mean |loss change|: what their rounding is judged against (their mean is
        # near zero by chance, which no dtype resolves better)
        rises = torch.zeros((), dtype=torch.float64, device=self.model.device)
        for sample in range(self.samples):
            deltas = tuple(self.rho * d for d in self.frozen.isotropic(self.generator))
            point = tuple(w + d for w, d in zip(self.coordinates.base, deltas, strict=True))
            with torch.no_grad():
                loss = self.model.loss(batch, self.coordinates.updates(point))
            ok = torch.isfinite(loss)
            new_bad = ~ok & (first_bad < 0)
            first_bad = torch.where(new_bad, sample, first_bad)
            bad_loss = torch.where(new_bad, loss, bad_loss)
            total = total + torch.where(ok, loss, torch.zeros_like(loss))
            rises = rises + torch.where(ok, excess(loss, clean).abs(), torch.zeros_like(rises))
            finite = finite + ok.to(finite.dtype)
            norm_sum = norm_sum + self.frozen.norm(deltas)
            tick()
        count, at = torch.stack([finite, first_bad]).tolist()
        if at >= 0 and (self.nonfinite == "raise" or count == 0):
            none = " No draw was finite." if count == 0 else ""
            raise NonFiniteLossError(
                f"batch {index}: the perturbed loss is {float(bad_loss)} at draw {at} of "
                f"{self.samples}; {self.samples - count} of {self.samples} draws were not "
                f"finite.{none} The clean loss is finite, so the perturbation caused it: "
                f"{likely_cause(self.model, self.rho)}"
                + (_SKIP_HINT if self.nonfinite == "raise" else ""))
        mean = total / count
        perturbation = (dict(zip(self.coordinates.names, deltas, strict=True)) if keep else None)
        # a small rho in a coarse dtype: the draws round away in the parameters and their
        # rises in the losses, so the value is the ascent measures' kind of unresolved one
        return BatchOutcome(excess(mean, clean), clean, mean, {"total": norm_sum / self.samples},
                            perturbation, self.samples - count,
                            rounding=loss_rounding([float(clean), float(mean)],
                                                   self.model.forward_dtype),
                            draw_rise=float(rises) / count)


class AscentMeasure:
    """Auto-PGD ascent in the space ``geometry`` builds once, in :meth:`setup` (worst case or
    geodesic). The options are :class:`~.registry.AscentSpec`'s; ``reference_generator`` and
    ``probe_generator`` are the reference solve's and the reach search's own random streams,
    so that the measured value does not depend on them; ``host_decisions`` is
    :func:`.solver.ascend`'s."""

    def __init__(self, model: FunctionalModel, settings: AscentSettings,
                 generator: torch.Generator, geometry: GeometryPlan, nonfinite: str = "raise",
                 reference: AscentSettings | None = None,
                 reference_generator: torch.Generator | None = None,
                 blockwise: bool = False, touched_rows: bool = True,
                 host_decisions: bool = True, compile_steps: bool = False,
                 reach: SearchSettings | None = None,
                 probe_generator: torch.Generator | None = None) -> None:
        self.reach, self.probe_generator = reach, probe_generator
        self.model, self.settings, self.generator = model, settings, generator
        self.plan = geometry
        self.nonfinite = nonfinite
        self.reference, self.reference_generator = reference, reference_generator
        self.blockwise = blockwise
        self.touched_rows = touched_rows
        self.host_decisions = host_decisions
        self.compiled = CompiledSteps.shared() if compile_steps else None
        #: per batch, the rows each restricted table was solved on (empty: the full tables)
        self.restricted_rows: list[dict[str, int]] = []
        self._space: AscentSpace | None = None

    def setup(self, excluded: Sequence[str]) -> None:
        """Build the space of the ascent, once (the geometry stage, :mod:`.geometry`)."""
        self._space = self.plan.build(self.model, set(excluded))
        coordinates = self._space.coordinates
        covered: set[str] = set()
        if isinstance(coordinates, LayoutCoordinates):
            covered = set(excluded) - set(coordinates.coords.other)
        elif isinstance(coordinates, BoundCoordinates):
            covered = {n for b in coordinates.bindings for n in b.parameters} & set(excluded)
        warn_excluded(excluded, covered)
        self._space.geometry.validate()

    @property
    def space(self) -> AscentSpace:
        """The space built by :meth:`setup`."""
        if self._space is None:
            raise RuntimeError("AscentMeasure.setup has not run: the space is not built yet")
        return self._space

    @property
    def geometry(self) -> GeodesicBall | BoxGeometry:
        """The feasible set of the ascent (``space.geometry``)."""
        return self.space.geometry

    def evaluations_per_batch(self) -> int:
        evaluations = self.settings.runs * self.settings.evaluations_per_run
        if self.reach is not None:
            # the fewest chains; continuations and further chains are counted as they run
            evaluations += (self.reach.min_chains - 1) * self.settings.evaluations_per_run
        if self.reference is not None:
            evaluations += self.reference.runs * self.reference.evaluations_per_run
        return evaluations

    def settings_after(self) -> dict[str, Any]:
        return {"restricted_rows": self.restricted_rows}

    def restricts(self) -> bool:
        """Whether this measurement's solve may run on the touched rows of embedding tables:
        it starts at ``xi = 0`` and the model has tables that may be cut."""
        return (self.touched_rows and bool(self.model.tables) and not self.settings.random_init
                and self.settings.restarts == 0)

    def _starting_point(self, batch: Batch, index: int, objective: Objective,
                        first: FirstEvaluation | None, restricts: bool
                        ) -> tuple[torch.Tensor, tuple[torch.Tensor, Tensors] | None,
                                   Mapping[str, torch.Tensor]]:
        """The clean loss, the evaluation at ``xi = 0`` (``None`` for a random start) and
        the embedding rows the batch touches (recorded where the solve may be cut to them)."""
        if self.settings.random_init:
            return _clean_loss(self.model, batch, index, first), None, {}
        if first is not None:
            # the solver's first evaluation is at xi = 0, i.e. at theta: it is the clean loss
            initial = (first.loss, self.space.gradient_at_zero(first.gradients))
            # consumed: the parameter-sized gradients are not kept through the ascent
            first.gradients = {}
            return first.loss, initial, first.rows
        recording = (self.model.recording_tables() if restricts else contextlib.nullcontext())
        with self.model.checking(), recording as recorder:
            initial = objective(self.space.geometry.zeros())
        clean = checked_clean_loss(initial[0], index, batch, self.model)
        return clean, initial, recorder.rows() if recorder is not None else {}

    def __call__(self, batch: Batch, index: int, tick: Tick, keep: bool,
                 first: FirstEvaluation | None = None) -> BatchOutcome:
        space, restricts = self.space, self.restricts()
        objective = space.objective(self.model, batch)
        clean, initial, rows = self._starting_point(batch, index, objective, first, restricts)
        # the per-batch step of the geometry: the space cut to the rows this batch touches
        touched = space.on_touched_rows(self.model, rows) if restricts and rows else None
        self.restricted_rows.append({} if touched is None else {
            name: int(t.rows.numel()) for name, t in touched.coordinates.tables.items()})
        solved: AscentSpace | TouchedSpace = space if touched is None else touched
        solve = objective if touched is None else touched.objective(self.model, batch)
        start = initial
        if touched is not None:
            assert initial is not None
            start = (initial[0], touched.coordinates.restrict(initial[1]))
        handed: tuple[torch.Tensor, Tensors] | HandedOver | None = start
        if self.reference is None and start is not None:
            # handed over to the solver, which drops the gradient once it is raised
            handed = HandedOver(*start)
            start = initial = None
        skip = self.nonfinite == "skip"
        if self.reach is None:
            outcome = ascend(solved.geometry, solve, self.settings, self.generator, tick,
                             initial=handed, skip_nonfinite=skip,
                             host_decisions=self.host_decisions, compiled=self.compiled)
            solves = [(self.settings, outcome, "")]
            chains, reach, shortfalls = None, None, None
            evaluations = self.settings.runs * self.settings.evaluations_per_run
        else:
            found = search(solved.geometry, solve, self.settings, self.reach, clean.item(),
                           self.generator, self.probe_generator, tick, initial=handed,
                           skip_nonfinite=skip, host_decisions=self.host_decisions,
                           compiled=self.compiled)
            outcome = AscentOutcome(found.loss, found.xi, [], found.solves[0][1].start_loss,
                                    trace=found.trace)
            solves = [(s, o, "" if i == 0 else " (reach search)")
                      for i, (s, o) in enumerate(found.solves)]
            chains, reach, evaluations = found.chains, found.reach, found.evaluations
            shortfalls = found.shortfalls
        del handed, start
        norms = solved.geometry.block_norms(outcome.xi)
        if touched is not None:
            # the best iterate at full size (zero off the rows), for what follows
            outcome.xi = touched.coordinates.expand(outcome.xi)
        radius = float(space.geometry.radius)
        exact_steps = _exact_steps(space.geometry)
        skipped = _check_ascents(solves, index, self.model, radius, self.nonfinite, batch,
                                 exact_steps)
        del solves
        reference = None
        if self.reference is not None:
            reference = ascend(space.geometry, objective, self.reference,
                               self.reference_generator, tick,
                               initial=None if self.reference.random_init else initial,
                               skip_nonfinite=skip, host_decisions=self.host_decisions,
                               compiled=self.compiled)
            skipped += _check_ascents([(self.reference, reference, " (reference solve)")],
                                      index, self.model, radius, self.nonfinite, batch,
                                      exact_steps)
        perturbation = None
        if keep:
            moved = space.parameters(outcome.xi)
            with torch.no_grad():
                perturbation = {n: t - self.model.theta_geometry[n] for n, t in moved.items()}
        blocks = self._blocks(batch, outcome.xi, clean) if self.blockwise else None
        absolute = isinstance(self.plan, PlainGeometry) and not self.plan.adaptive
        rounding_dtype = self.model.forward_dtype
        path = path_check(space.geometry, outcome.xi,
                          lambda point: self.model.loss(batch, space.coordinates.updates(point)),
                          clean, outcome.loss, rounding_dtype)
        where = locality(space.geometry, space.coordinates, space.coordinates.blocks(),
                         self.model.theta_geometry, outcome.xi, absolute, path)
        return BatchOutcome(excess(outcome.loss, clean), clean, outcome.loss, norms,
                            perturbation, skipped, trace=outcome.trace,
                            reference=None if reference is None else reference.loss,
                            reference_trace=None if reference is None else reference.trace,
                            blocks=blocks, chains=chains, chain_shortfalls=shortfalls,
                            reach=reach, evaluations=evaluations, locality=where,
                            rounding=loss_rounding([float(clean), float(outcome.loss)],
                                                   rounding_dtype))

    def _blocks(self, batch: Batch, xi: Tensors, clean: torch.Tensor) -> BlockOutcome:
        """The best perturbation block by block (:mod:`.blocks`)."""
        space = self.space

        def loss_at(point: Tensors) -> torch.Tensor:
            return self.model.loss(batch, space.coordinates.updates(point))

        return blockwise(loss_at, space.geometry, space.coordinates.blocks(), xi, clean)


def default_layer(model: nn.Module) -> str:
    """Name of the last ``nn.Linear`` (in ``named_modules`` order) with a trainable weight;
    an error if that weight is computed (parametrized), not a parameter."""
    # a computed weight counts whatever its requires_grad (the old-style spectral_norm's is a
    # plain tensor until the first forward): skipping it would pick another layer unsaid
    found = [(name, computed_weight(name, module)) for name, module in model.named_modules()
             if isinstance(module, nn.Linear)
             and (module.weight.requires_grad or computed_weight(name, module))]
    if not found:
        raise ValueError("the model has no trainable nn.Linear layer: pass layer='module name'")
    name, computed = found[-1]
    if computed:
        # another layer is not chosen in its place: the value would be of a layer the caller
        # did not expect (the default is documented as the last nn.Linear)
        raise ValueError(f"relative flatness's default layer, the last nn.Linear {name!r}, "
                         f"{computed}")
    return name


def computed_weight(layer: str, module: nn.Module) -> str | None:
    """Why ``module``'s weight is no parameter but computed from others at each forward (a
    ``torch.nn.utils.parametrize`` parametrization, or the old-style ``weight_norm`` or
    ``spectral_norm`` hook), with what to do; ``None`` if it is not computed so."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    how = None
    if parametrize.is_parametrized(module, "weight"):
        # the ParametrizationList of the weight (typed as a Module attribute for mypy)
        chains = cast(nn.ModuleDict, module.parametrizations)
        chain = cast(nn.ModuleList, chains["weight"])
        kinds = ", ".join(type(p).__name__ for p in chain)
        how = (f"parametrized ({kinds}, torch.nn.utils.parametrize): computed from "
               f"{layer + '.' if layer else ''}parametrizations.weight.original*")
    for hook in getattr(module, "_forward_pre_hooks", {}).values():
        if isinstance(hook, (WeightNorm, SpectralNorm)) and hook.name == "weight":
            old = ("weight_norm, from weight_g and weight_v" if isinstance(hook, WeightNorm)
                   else "spectral_norm, from weight_orig")
            how = f"computed at each forward by the old-style torch.nn.utils.{old}"
    if how is None:
        return None
    return (f"has a weight {how}, not a parameter; relative flatness needs the "
            "weight itself as a parameter (its Hessian and rows w_s): pass layer= another "
            "layer, or remove the parametrization")


def layer_weight_name(model: nn.Module, layer: str) -> str:
    """The ``named_parameters`` name of ``layer``'s weight."""
    modules = dict(model.named_modules())
    if layer not in modules:
        raise ValueError(f"layer {layer!r} is not a module of the model")
    computed = computed_weight(layer, modules[layer])
    if computed:
        raise ValueError(f"layer {layer!r} {computed}")
    weight = getattr(modules[layer], "weight", None)
    if not isinstance(weight, nn.Parameter):
        raise ValueError(f"layer {layer!r} has no weight parameter")
    if isinstance(modules[layer], nn.Embedding):
        raise ValueError(f"layer {layer!r} is an embedding table: its rows are tokens, not the "
                         "neurons w_s of a layer that relative flatness is defined on; pass "
                         "layer= a linear layer")
    for name, tensor in model.named_parameters():
        if tensor is weight:
            if not tensor.requires_grad:
                raise ValueError(f"the weight of layer {layer!r} is frozen")
            if tensor.dim() < 2:
                raise ValueError(f"the weight of layer {layer!r} has shape "
                                 f"{tuple(tensor.shape)}; relative flatness needs rows w_s")
            _check_untied(model, layer, weight)
            return name
    raise ValueError(f"the weight of layer {layer!r} is not among the model's parameters")


def _neurons_last(module: nn.Module) -> bool:
    """Whether ``module`` is Hugging Face's ``Conv1D`` (GPT-2's layers), which stores its weight
    as ``[inputs, outputs]``: ``y = x W + b``."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor)
            and weight.dim() == 2 and getattr(module, "nf", None) == weight.shape[1])


def _check_untied(model: nn.Module, layer: str, weight: nn.Parameter) -> None:
    """Raise if ``layer``'s weight is also a parameter of another module (tied)."""
    own = f"{layer}.weight" if layer else "weight"
    tied = [name for name, tensor in model.named_parameters(remove_duplicate=False)
            if tensor is weight and name != own]
    if tied:
        # the Hessian of a shared tensor sums the second derivatives of all its uses
        raise ValueError(f"the weight of layer {layer!r} is tied to {few_names(tied)} (one "
                         "tensor shared with another module, as a language model's output layer "
                         "with its input embedding): its Hessian would add the other uses, which "
                         "relative flatness, a property of one layer's rows, does not include; "
                         "pass layer= a layer whose weight is its own")


@contextlib.contextmanager
def _counting_calls(module: nn.Module | None) -> Iterator[list[int]]:
    """``[calls]``: how many times ``module`` runs inside the block (nothing counted without
    one)."""
    calls = [0]
    if module is None:
        yield calls
        return

    def count(_module: nn.Module, _args: tuple[object, ...]) -> None:
        calls[0] += 1

    handle = module.register_forward_pre_hook(count)
    try:
        yield calls
    finally:
        handle.remove()


class RelativeFlatness:
    """``kappa = sum_{s,s'} <w_s, w_s'> Tr(H_{s,s'})`` for the rows ``w_s`` of one layer.

    With ``W W^T = sum_r lambda_r q_r q_r^T`` and ``H_k`` the Hessian block of column ``k``,
    ``kappa = sum_k Tr(W W^T H_k) = sum_{r,k} lambda_r (q_r e_k^T) : H (q_r e_k^T)``: one
    Hessian-vector product per nonzero eigenvalue and input feature, batched ``chunk`` at a time
    (double backward; attention runs the math SDPA kernel, which supports it). The Hessian is
    never formed.
    """

    def __init__(self, model: FunctionalModel, weight_name: str, chunk: int,
                 layer: tuple[str, nn.Module] | None = None) -> None:
        self.model, self.weight_name, self.chunk = model, weight_name, chunk
        #: ``(name, module)`` of the layer, whose calls per forward are counted
        self.layer = layer
        weight = model.theta_geometry[weight_name]
        #: a layer storing its weight as [inputs, outputs] (Hugging Face's Conv1D, GPT-2's
        #: layers): its neurons w_s are the columns
        self.transposed = layer is not None and _neurons_last(layer[1])
        self.rows = weight.mT if self.transposed else weight.reshape(weight.shape[0], -1)
        values, vectors = torch.linalg.eigh(self.rows @ self.rows.mT)
        rank = min(self.rows.shape)
        self.values, self.vectors = values[-rank:], vectors[:, -rank:]   # [r], [out, r]

    def setup(self, excluded: Sequence[str]) -> None:
        if self.weight_name in excluded:
            raise ValueError(f"parameter {self.weight_name!r} receives no gradient")

    def evaluations_per_batch(self) -> int:
        return 1

    def settings_after(self) -> dict[str, Any]:
        return {}

    def _directions(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.rows.shape[1]
        index = torch.arange(start, stop, device=self.rows.device)
        r, k = index // features, index % features
        directions = torch.zeros(stop - start, *self.rows.shape, dtype=self.rows.dtype,
                                 device=self.rows.device)
        chunk = torch.arange(stop - start, device=self.rows.device)
        directions[chunk, :, k] = self.vectors[:, r].mT
        return directions, self.values[r]

    def __call__(self, batch: Batch, index: int, tick: Tick, keep: bool,
                 first: FirstEvaluation | None = None) -> BatchOutcome:
        shape = self.model.theta_geometry[self.weight_name].shape
        weight = self.rows.detach().clone().requires_grad_(True)
        total = torch.zeros((), dtype=self.rows.dtype, device=self.rows.device)
        count = self.values.numel() * self.rows.shape[1]
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
            with self.model.checking(), _counting_calls(
                    None if self.layer is None else self.layer[1]) as calls:
                value = weight.mT if self.transposed else weight.reshape(shape)
                loss = self.model.loss(batch, {self.weight_name: value})
            self._check_called_once(calls[0], index)
            clean = first.loss if first is not None else checked_clean_loss(
                loss.detach(), index, batch, self.model)
            (grad,) = torch.autograd.grad(loss, weight, create_graph=True)
            if grad.requires_grad:
                for start in range(0, count, self.chunk):
                    stop = min(start + self.chunk, count)
                    directions, weights = self._directions(start, stop)
                    products = self._hvp(grad, weight, directions)
                    total = total + (weights * (directions * products).sum((-2, -1))).sum()
        tick()
        if not bool(torch.isfinite(total)):
            raise NonFiniteLossError(
                f"batch {index}: relative flatness is {float(total)}: the Hessian-vector "
                f"products of layer weight {self.weight_name!r} are not finite although the "
                f"clean loss is (an overflow in "
                f"{str(self.model.dtype).removeprefix('torch.')}?)")
        return BatchOutcome(total.detach(), clean, clean, {})

    def _check_called_once(self, calls: int, index: int) -> None:
        if self.layer is not None and calls > 1:
            # kappa's derivation has the layer map the features once: f(x) = psi(W phi(x))
            raise ValueError(f"batch {index}: layer {self.layer[0]!r} runs {calls} times in one "
                             "forward (a module applied more than once): its Hessian would mix "
                             "the uses, which relative flatness, a property of one layer's rows "
                             "applied once, does not include; pass layer= a layer applied once")

    @staticmethod
    def _hvp(grad: torch.Tensor, weight: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
        try:
            (products,) = torch.autograd.grad(grad, weight, grad_outputs=directions,
                                              is_grads_batched=True, retain_graph=True)
            return products
        except RuntimeError:
            # some operators have no batching rule for their double backward: one at a time
            return torch.stack([torch.autograd.grad(grad, weight, grad_outputs=d,
                                                    retain_graph=True)[0] for d in directions])


def warn_excluded(names: Sequence[str], covered: set[str]) -> None:
    """Warn about parameters without gradient: excluded, or (if in a symmetry) only noted."""
    dropped = [n for n in names if n not in covered]
    kept = [n for n in names if n in covered]
    if dropped:
        warn_at_caller(f"parameter(s) {dropped} receive no gradient from the loss: excluded "
                       "from the perturbation (kept fixed)", UserWarning)
    if kept:
        warn_at_caller(f"parameter(s) {kept} receive no gradient from the loss but belong to a "
                       "symmetry pair: they stay in the geometry with a zero gradient",
                       UserWarning)
