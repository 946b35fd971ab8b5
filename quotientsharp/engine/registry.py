"""Validation stage: one typed description of each measure, :class:`MeasureSpec`, a frozen
dataclass whose fields are the measure's options, checked when it is made, and the registry of
them by name. ``spec.build(model, functional, generator)`` returns the runtime
:class:`~.measures.Measure`; :func:`measure_from` makes a spec from the string form.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn

from quotientsharp.core.adaptive import METRICS as OTHER_METRICS
from quotientsharp.core.gl import METRICS as GL_METRICS
from quotientsharp.core.scalars import (
    SEED_LIMIT,
    check_finite,
    check_flag,
    check_int,
    check_nonfinite,
    check_order,
    check_p,
    check_seed,
)
from quotientsharp.core.validation import warn_at_caller
from quotientsharp.engine.batches import Batch, LossFunction, resolve_loss
from quotientsharp.engine.coordinates import LayoutCoordinates
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.engine.geometry import (
    OTHER_PATHS,
    GeodesicGeometry,
    GeometryPlan,
    PlainGeometry,
)
from quotientsharp.engine.layouts import (
    check_diagonal,
    check_discovered,
    check_symmetries,
    check_user_bindings,
    no_symmetry_note,
    symmetry_layout,
    user_bindings,
)
from quotientsharp.engine.measures import (
    AscentMeasure,
    AverageMeasure,
    Measure,
    RelativeFlatness,
    default_layer,
    layer_weight_name,
)
from quotientsharp.engine.options import check_geometry_dtype, check_rho
from quotientsharp.engine.solver import AscentSettings, SearchSettings, checkpoints

#: What ``reference_solve=True`` runs: ``n_iter`` is ``REFERENCE_ITERATIONS`` times the
#: measurement's, ``restarts`` random restarts; ``eta0`` and ``alpha`` are the measurement's.
REFERENCE_ITERATIONS = 10
REFERENCE_RESTARTS = 4
#: The reference solve draws from a stream of its own, ``seed`` plus this odd constant (mod
#: ``2**64``), so that the measured value is the same with and without it.
REFERENCE_SEED_OFFSET = 0x9E3779B97F4A7C15
#: The reach search's further chains draw from ``seed`` plus this odd constant: the first
#: chain, the measurement's own ascent, is the same with and without them.
SEARCH_SEED_OFFSET = 0x632BE59BD9B4E019


@dataclass(frozen=True, kw_only=True)
class MeasureSpec(ABC):
    """One measure and every option of it, checked when it is made (the options every measure
    shares are these fields; each measure adds its own).

    Attributes
    ----------
    rho
        The radius of the perturbation (the standard deviation for :class:`AverageSpec`);
        required, except for :class:`RelativeFlatnessSpec`, which has none. A one-element
        tensor or an integer is stored as a float.
    loss
        ``None`` or ``"cross_entropy"``, ``"mse"``, or a callable ``loss(output, target)``.
    seed
        The measurement's random stream (random starts and draws): same seed, same value.
    progress
        The tqdm bar: ``True``/``False``; ``None`` shows it on a terminal only.
    keep_perturbations
        Keep each batch's best perturbation in the result.
    geometry_dtype
        ``None``: float64 if any parameter is float64, else float32. ``torch.float64`` or
        ``"float64"`` keeps the geometry, the gradients and the iterate of a float32 or half
        model in float64, which holds invariance at ill-conditioned points of the orbit where
        float32 geometry does not; the forward still runs in the model's dtype.
    nonfinite
        ``"raise"``: a NaN or inf perturbed loss raises a ``ValueError`` naming the batch, the
        solver iteration and the likely cause; ``"skip"``: such evaluations are left out,
        counted in ``result.nonfinite_evaluations``, with a warning.

    Notes
    -----
    A number may be a Python or a NumPy number (not a bool); it is stored as a Python ``int``
    or ``float`` (a Python float as it is, bit for bit). Fields with several spellings are
    stored in one (``p``, ``geometry_dtype``), so that equal measures compare equal.
    ``dataclasses.replace`` checks the new measure again. A measure holding a dict
    (``reach``, ``reference_solve``) or a list of bindings cannot be hashed.

    Raises
    ------
    TypeError, ValueError
        From the constructor, naming the first field with a bad value.
    """

    #: The measure's name (``SharpnessResult.measure``, the string form of :func:`measure_from`).
    name: ClassVar[str]
    #: Whether ``rho`` is required (else it must be left unset).
    needs_rho: ClassVar[bool] = True
    #: Fields ``result.settings`` records in a form of its own, or not at all.
    UNRECORDED: ClassVar[tuple[str, ...]] = ("rho", "loss", "symmetries", "geometry_dtype")

    rho: float | None = None
    loss: str | LossFunction | None = None
    seed: int = 0
    progress: bool | None = None
    keep_perturbations: bool = False
    geometry_dtype: torch.dtype | str | None = None
    nonfinite: str = "raise"

    def __post_init__(self) -> None:
        self._store("rho", check_rho(self.rho, self.needs_rho))
        self._store("seed", check_seed(self.seed))
        check_flag("keep_perturbations", self.keep_perturbations)
        check_flag("progress", self.progress, optional=True)
        check_nonfinite(self.nonfinite)
        # one spelling of each dtype, so that equal measures compare equal (never recorded as
        # given: result.settings holds the dtype the geometry ran in)
        self._store("geometry_dtype", check_geometry_dtype(self.geometry_dtype))
        resolve_loss(self.loss)

    def _store(self, name: str, value: object) -> None:
        """Set the field ``name`` of the frozen dataclass to its checked value."""
        object.__setattr__(self, name, value)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every option of the measure (its fields but ``rho``) and its default."""
        return {f.name: f.default for f in fields(cls) if f.name != "rho"}

    def options(self) -> dict[str, Any]:
        """Every option (the fields but ``rho``) as given: ``measure_from(spec.name, spec.rho,
        spec.options()) == spec``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rho"}

    def settings(self) -> dict[str, Any]:
        """The options ``result.settings`` records as given (those in :attr:`UNRECORDED` are
        recorded as resolved by :func:`~.api.sharpness`, or not at all)."""
        return {k: v for k, v in self.options().items() if k not in self.UNRECORDED}

    @property
    def radius(self) -> float:
        """``rho``, for a measure that has one."""
        if self.rho is None:
            raise ValueError("rho is required (the radius of the perturbation)")
        return self.rho

    @property
    def resolved_geometry_dtype(self) -> torch.dtype | None:
        """``geometry_dtype`` as a ``torch.dtype`` (``None``: the model's, see above)."""
        return check_geometry_dtype(self.geometry_dtype)

    def first_step(self) -> float | None:
        """The solver's first step (checked against the geometry's dtype with ``rho``);
        ``None`` for a measure without an ascent."""
        return None

    def measures_blocks(self) -> bool:
        """Whether the result holds the sharpness of each block (``blockwise``)."""
        return False

    @abstractmethod
    def build(self, model: nn.Module, functional: FunctionalModel, generator: torch.Generator
              ) -> tuple[Measure, dict[str, Any]]:
        """The runtime :class:`~.measures.Measure` and the settings it resolved.

        Parameters
        ----------
        model
            The user's module (discovery reads it; it is never run).
        functional
            The functional model the measure evaluates.
        generator
            The measurement's random stream (seeded with ``seed``).
        """

    def check_first_batch(self, functional: FunctionalModel, batch: Batch,
                          measure: Measure) -> None:
        """Checks against the model on batch 0, before any measurement (none by default);
        ``measure``: the one :meth:`build` made, set up."""
        return None


@dataclass(frozen=True, kw_only=True)
class AverageSpec(MeasureSpec):
    """``average``: ``E[L(theta + delta)] - L(theta)`` (:class:`~.measures.AverageMeasure`).

    Attributes
    ----------
    adaptive
        Scale the Gaussian noise by ``c = |theta|``.
    samples
        Noise draws per batch (an integer >= 1).
    """

    name: ClassVar[str] = "average"

    adaptive: bool = False
    samples: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self._store("samples", check_int("samples", self.samples, 1))
        check_flag("adaptive", self.adaptive)

    def build(self, model: nn.Module, functional: FunctionalModel, generator: torch.Generator
              ) -> tuple[Measure, dict[str, Any]]:
        return AverageMeasure(functional, self.radius, self.adaptive, self.samples, generator,
                              self.nonfinite), {}


REFERENCE_KEYS = ("n_iter", "restarts", "eta0", "alpha", "random_init")


def reference_settings(option: object, settings: AscentSettings) -> AscentSettings | None:
    """The solver settings of ``reference_solve`` for a measurement solved with ``settings``.

    Parameters
    ----------
    option
        ``None`` or ``False``: no reference solve. ``True``: ``n_iter`` =
        :data:`REFERENCE_ITERATIONS` times the measurement's, :data:`REFERENCE_RESTARTS` random
        restarts, the measurement's ``eta0`` and ``alpha``, the first run from ``xi = 0``. A
        dict overrides any of ``n_iter``, ``restarts``, ``eta0``, ``alpha``, ``random_init``.
    settings
        The measurement's own solver settings.

    Raises
    ------
    TypeError, ValueError
        Naming ``reference_solve`` and the offending key.
    """
    if option is None or option is False:
        return None
    if option is not True and not isinstance(option, Mapping):
        raise TypeError(f"reference_solve must be None, True or a dict of solver settings "
                        f"({', '.join(REFERENCE_KEYS)}), got {option!r}")
    given = {} if option is True else _overrides("reference_solve", option, REFERENCE_KEYS)
    resolved = {"n_iter": REFERENCE_ITERATIONS * settings.n_iter,
                "restarts": REFERENCE_RESTARTS, "eta0": settings.eta0, "alpha": settings.alpha,
                "random_init": False, **given}
    try:
        return AscentSettings(**resolved)
    except (TypeError, ValueError) as err:
        raise type(err)(f"reference_solve: {err}") from err


SEARCH_KEYS = ("chains", "min_chains", "continuations", "target", "stall", "warm_step",
               "ladder")


def search_settings(option: object) -> SearchSettings | None:
    """The reach search of the ``reach`` option (``True``: the defaults, ``False``: none, a
    dict: overrides of :data:`SEARCH_KEYS`); errors name ``reach`` and the offending key."""
    if option is False:
        return None
    if option is True:
        return SearchSettings()
    if not isinstance(option, Mapping):
        raise TypeError(f"reach must be True, False or a dict of search settings "
                        f"({', '.join(SEARCH_KEYS)}), got {option!r}")
    return SearchSettings(**_overrides("reach", option, SEARCH_KEYS))


def _overrides(name: str, option: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``option`` as a dict; a key not in ``keys`` raises, naming the option ``name``."""
    unknown = sorted(str(k) for k in set(option) - set(keys))
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}; allowed: {list(keys)}")
    return dict(option)


def _stream(generator: torch.Generator, offset: int) -> torch.Generator:
    """A generator on ``generator``'s device seeded with its seed plus ``offset``."""
    seed = (generator.initial_seed() + offset) % SEED_LIMIT
    return torch.Generator(device=generator.device).manual_seed(seed)


@dataclass(frozen=True, kw_only=True)
class AscentSpec(MeasureSpec):
    """The options of the ascent measures (Auto-PGD, Croce & Hein 2020), shared by
    :class:`WorstCaseSpec`, :class:`AdaptiveSpec` and :class:`GeodesicSpec`.

    Attributes
    ----------
    n_iter, eta0, alpha, random_init, restarts
        The solver's settings (:class:`~.solver.AscentSettings`): steps per run, the initial
        step (``None``: ``2 rho``), the momentum weight in ``(0, 1]``, a random first start,
        extra runs from random starts.
    reach
        ``True``: the reach search beyond the first ascent and its estimate
        (:class:`~.solver.SearchSettings`' defaults); ``False``: one ascent, no estimate; a
        dict overrides any of ``chains``, ``min_chains``, ``continuations``, ``target``,
        ``stall``, ``warm_step``, ``ladder``.
    reference_solve
        ``None``; ``True`` or a dict of ``n_iter``, ``restarts``, ``eta0``, ``alpha``,
        ``random_init``: a second, stronger solve per batch (default 10 times the steps and 4
        random restarts), whose value and gap are reported (:func:`reference_settings`).
    blockwise
        Norm share and loss change of every block of the best perturbation (``result.blocks``;
        one extra forward per block and batch).
    touched_rows
        Solve on the rows of the embedding tables the batch looks up, when the solve starts at
        ``xi = 0``: the other rows have no gradient and never move, so the value is the same up
        to the summation order of the norms (``settings["restricted_rows"]`` lists, per batch,
        the rows kept per table); ``False`` solves on the full tables.
    compile_steps
        Run the solver's per-iteration geometry as ``torch.compile`` graphs
        (:class:`~.solver.CompiledSteps`): about half the eager cost of its elementwise passes
        on a CPU, but the first compile takes tens of seconds; equal to the eager values to
        rounding.
    """

    n_iter: int = 20
    eta0: float | None = None
    alpha: float = 0.75
    random_init: bool = False
    restarts: int = 0
    reach: bool | Mapping[str, Any] = True
    reference_solve: bool | Mapping[str, Any] | None = None
    blockwise: bool = False
    touched_rows: bool = True
    compile_steps: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        solver = self.solver()             # checks the solver's fields, NumPy numbers converted
        for name in ("n_iter", "eta0", "alpha", "restarts"):
            self._store(name, getattr(solver, name))
        reference_settings(self.reference_solve, solver)
        search_settings(self.reach)
        check_flag("blockwise", self.blockwise)
        check_flag("touched_rows", self.touched_rows)
        check_flag("compile_steps", self.compile_steps)

    def first_step(self) -> float | None:
        return float(self.solver().first_step(self.radius))

    def measures_blocks(self) -> bool:
        return self.blockwise

    def solver(self) -> AscentSettings:
        """The measurement's own solver settings."""
        return AscentSettings(n_iter=self.n_iter, eta0=self.eta0, alpha=self.alpha,
                              random_init=self.random_init, restarts=self.restarts)

    def ascent(self, functional: FunctionalModel, generator: torch.Generator,
               plan: GeometryPlan, extra: dict[str, Any]) -> tuple[Measure, dict[str, Any]]:
        """The :class:`~.measures.AscentMeasure` over ``plan``'s geometry, and its settings
        (the solver's resolved, then ``extra``)."""
        settings, rho = self.solver(), self.radius
        reference = reference_settings(self.reference_solve, settings)
        found = search_settings(self.reach)
        resolved: dict[str, Any] = {
            "reach": None if found is None else asdict(found),
            "checkpoints": checkpoints(settings.n_iter), "eta0": settings.first_step(rho),
            "reference_solve": None if reference is None else {
                "n_iter": reference.n_iter, "restarts": reference.restarts,
                "eta0": reference.first_step(rho), "alpha": reference.alpha,
                "random_init": reference.random_init,
                "checkpoints": checkpoints(reference.n_iter)},
            "blockwise": self.blockwise}
        # streams of their own, so that the measured first ascent is the same without them
        measure = AscentMeasure(
            functional, settings, generator, plan, nonfinite=self.nonfinite,
            reference=reference,
            reference_generator=(None if reference is None
                                 else _stream(generator, REFERENCE_SEED_OFFSET)),
            blockwise=self.blockwise, touched_rows=self.touched_rows,
            compile_steps=self.compile_steps, reach=found,
            probe_generator=None if found is None else _stream(generator, SEARCH_SEED_OFFSET))
        return measure, {**resolved, **extra}


def _plain(spec: AscentSpec, functional: FunctionalModel, generator: torch.Generator,
           p: int | float | str, adaptive: bool) -> tuple[Measure, dict[str, Any]]:
    """The ascent in an L2 ball (``p=2``) or an L-infinity box (``p="inf"``, as the spec
    stored it), ``c = |theta|`` if ``adaptive`` else 1."""
    norm = math.inf if p == "inf" else 2.0
    return spec.ascent(functional, generator, PlainGeometry(spec.radius, norm, adaptive),
                       {"p": p, "adaptive": adaptive})


@dataclass(frozen=True, kw_only=True)
class WorstCaseSpec(AscentSpec):
    """``worst_case``: Auto-PGD in an L2 ball or an L-infinity box.

    Attributes
    ----------
    p
        ``2`` (an L2 ball) or ``"inf"`` (an L-infinity box).
    adaptive
        ``c = |theta|`` (else 1).
    """

    name: ClassVar[str] = "worst_case"

    p: int | float | str = 2
    adaptive: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self._store("p", check_p(self.p))        # p=2 and p="L2" are the same measure
        check_flag("adaptive", self.adaptive)

    def build(self, model: nn.Module, functional: FunctionalModel, generator: torch.Generator
              ) -> tuple[Measure, dict[str, Any]]:
        return _plain(self, functional, generator, self.p, self.adaptive)


@dataclass(frozen=True, kw_only=True)
class AdaptiveSpec(AscentSpec):
    """``adaptive``: the worst case with ``c = |theta|``.

    Attributes
    ----------
    p
        ``2`` (an L2 ball) or ``"inf"`` (an L-infinity box).
    """

    name: ClassVar[str] = "adaptive"

    p: int | float | str = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        self._store("p", check_p(self.p))

    def build(self, model: nn.Module, functional: FunctionalModel, generator: torch.Generator
              ) -> tuple[Measure, dict[str, Any]]:
        return _plain(self, functional, generator, self.p, True)


@dataclass(frozen=True, kw_only=True)
class GeodesicSpec(AscentSpec):
    """``geodesic``: Auto-PGD over the product quotient of the symmetries (the paper's).

    Attributes
    ----------
    metric
        The metric of the GL quotients: ``"inv"``, ``"mix"`` or ``"euclidean"``.
    order
        ``1``, ``2`` or ``"exact"``: GL pairs by RK4 with ``exact_steps`` steps, diagonal pairs
        in closed form; with the mix metric ``rho`` must keep them inside the manifold, else a
        ``ValueError`` says how small.
    eps
        Gram relaxation of GL pairs (a number >= 0); diagonal pairs have none and reject zero
        coordinates.
    symmetries
        ``"auto"``: discovered by :func:`quotientsharp.models.find_symmetries` (``diagonal``
        passed on); ``"none"``: every parameter in the adaptive block (``metric``, ``eps`` and
        ``diagonal`` have nothing to act on and must keep their defaults); a ``SymmetryReport`` or
        ``ParameterLayout``; or one or a list of :class:`~quotientsharp.models.QuotientBinding`:
        any quotient, a user's own included, attached to named parameters, measured with its
        own metric. With ``"auto"`` and no symmetry found, a :class:`NoSymmetryWarning` says
        that geodesic equals adaptive sharpness there.
    diagonal
        ``None`` or a list of ``(u_name, v_name)`` pairs of parameter names, passed on to
        discovery. Its structure and that of ``symmetries`` are checked when the measure is
        made (:func:`~.layouts.check_symmetries`, :func:`~.layouts.check_diagonal`); whether
        the model has the named parameters, when it is measured.
    other_metric
        The metric of the parameters outside every symmetry: ``"adaptive"`` (``diag(1/w^2)``,
        that of adaptive sharpness) or ``"euclidean"``.
    other_path
        Their path: ``"line"`` (``w + xi``) or ``"geodesic"`` (the adaptive metric's geodesic,
        ``w * exp(xi / w)`` for ``order="exact"``; needs ``other_metric="adaptive"`` and
        ``order`` 2 or ``"exact"``: at order 1 every path is a line).
    exact_steps
        RK4 steps of ``order="exact"`` (an integer >= 1).
    check_symmetry
        Check each binding on the first batch, before the ascent: random group elements of its
        quotient must leave the loss and the outputs unchanged to ``sqrt(eps)`` of the
        forward's dtype, else a :class:`~quotientsharp.models.SymmetryCheckError` names the
        binding. The structure of every binding is checked always. Without bindings, the
        discovered symmetries are checked so (:func:`~.layouts.check_discovered`: one element
        of every pair's group at once, two forwards), and the error names the kind and the
        modules whose pairs are not symmetries of the model.
    """

    name: ClassVar[str] = "geodesic"
    #: Options of discovered symmetries that bindings ignore (their defaults are the fields').
    DISCOVERY_ONLY: ClassVar[tuple[str, ...]] = ("metric", "eps", "diagonal")

    metric: str = "inv"
    order: int | str = 2
    eps: float = 0.0
    symmetries: Any = "auto"
    diagonal: Any = None
    other_metric: str = "adaptive"
    other_path: str = "line"
    exact_steps: int = 16
    check_symmetry: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.metric not in GL_METRICS:
            raise ValueError(f"metric must be one of {GL_METRICS}, got {self.metric!r}")
        self._store("order", check_order(self.order))     # 2.0 is the order 2
        self._store("eps", check_finite("eps", self.eps, positive=False))
        check_symmetries(self.symmetries)
        check_diagonal(self.diagonal)
        if self.other_metric not in OTHER_METRICS:
            raise ValueError(f"other_metric must be 'adaptive' or 'euclidean', got "
                             f"{self.other_metric!r}")
        if self.other_path not in OTHER_PATHS:
            raise ValueError(f"other_path must be one of {OTHER_PATHS}, got "
                             f"{self.other_path!r}")
        if self.other_path == "geodesic" and self.other_metric != "adaptive":
            raise ValueError("other_path='geodesic' follows the adaptive metric's geodesic "
                             "w * exp(xi / w): it needs other_metric='adaptive'")
        self._store("exact_steps", check_int("exact_steps", self.exact_steps, 1))
        check_flag("check_symmetry", self.check_symmetry)
        self._check_unused()

    def _check_unused(self) -> None:
        """Refuse an option that this measure's other options leave without effect (it would be
        recorded in the settings and change nothing)."""
        if self.metric == "euclidean" and self.eps != 0:
            raise ValueError(f"eps={self.eps!r} relaxes the Gram matrices of the inv and mix "
                             "metrics; the euclidean metric has none: leave eps at 0")
        if self.exact_steps != type(self).exact_steps and self.order != "exact":
            raise ValueError(f"exact_steps={self.exact_steps!r} sets the RK4 steps of "
                             f"order='exact' only; at order={self.order!r} it changes nothing")
        if self.other_path == "geodesic" and self.order == 1:
            raise ValueError("other_path='geodesic' curves the path of the other parameters at "
                             "order 2 and 'exact' only; at order=1 every factor moves on its "
                             "line w + xi and it changes nothing: leave other_path at 'line'")
        if isinstance(self.symmetries, str) and self.symmetries == "none":
            self._check_unused_without_symmetries()

    def _check_unused_without_symmetries(self) -> None:
        """With ``symmetries="none"`` no parameter is in a quotient: refuse the options that
        shape the quotients of discovered symmetries (``DISCOVERY_ONLY``) away from their
        defaults, as they have nothing to act on."""
        defaults = self.defaults()
        unused = {k: getattr(self, k) for k in self.DISCOVERY_ONLY
                  if getattr(self, k) != defaults[k]}
        if unused:
            one = len(unused) == 1
            given = ", ".join(f"{k}={v!r}" for k, v in unused.items())
            leave = ", ".join(f"{k} at {defaults[k]!r}" for k in unused)
            raise ValueError(f"{given} {'sets' if one else 'set'} the quotients of the "
                             "symmetries; symmetries='none' puts every parameter in the "
                             f"adaptive factor, where {'it changes' if one else 'they change'} "
                             f"nothing: leave {leave}")

    def build(self, model: nn.Module, functional: FunctionalModel, generator: torch.Generator
              ) -> tuple[Measure, dict[str, Any]]:
        layout, extra = symmetry_layout(
            model, functional, self.symmetries, self.diagonal,
            no_symmetry_note(self.other_metric, self.other_path))
        if isinstance(layout, list):
            # bindings bring their own quotients: the discovery options do not apply
            defaults = self.defaults()
            ignored = {k: getattr(self, k) for k in self.DISCOVERY_ONLY
                       if getattr(self, k) != defaults[k]}
            if ignored:
                warn_at_caller(f"option(s) {ignored} apply to discovered symmetries only; the "
                               "QuotientBinding quotients use their own metric", UserWarning)
            extra.update({"metric": "the bindings' own", "eps": None, "diagonal": None})
        plan = GeodesicGeometry(self.radius, layout, self.metric, self.order, float(self.eps),
                                self.exact_steps, self.other_metric, self.other_path)
        return self.ascent(functional, generator, plan, extra)

    def check_first_batch(self, functional: FunctionalModel, batch: Batch,
                          measure: Measure) -> None:
        """The caller's bindings, or the discovered symmetries (with ``check_symmetry``),
        checked against the model on batch 0, before any ascent."""
        bindings = user_bindings(self.symmetries)
        if bindings:
            check_user_bindings(functional, batch, bindings, self.check_symmetry, self.seed)
            return
        coordinates = getattr(getattr(measure, "space", None), "coordinates", None)
        if self.check_symmetry and isinstance(coordinates, LayoutCoordinates):
            check_discovered(functional, batch, coordinates, self.seed)


@dataclass(frozen=True, kw_only=True)
class RelativeFlatnessSpec(MeasureSpec):
    """``relative_flatness``: Petzka et al. 2021 for one layer (no radius: leave ``rho`` unset).

    Attributes
    ----------
    layer
        The module's name; ``None``: the last ``nn.Linear`` with a trainable weight. Its weight
        must be its own (not tied to another module's) and a parameter (not computed by a
        parametrization such as ``weight_norm``), and the layer applied once per forward.
    hvp_chunk
        Hessian-vector products per batched double backward (an integer >= 1).
    """

    name: ClassVar[str] = "relative_flatness"
    needs_rho: ClassVar[bool] = False

    layer: str | None = None
    hvp_chunk: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer is not None and not isinstance(self.layer, str):
            raise TypeError(f"layer must be a module name, got {type(self.layer).__name__}")
        self._store("hvp_chunk", check_int("hvp_chunk", self.hvp_chunk, 1))

    def build(self, model: nn.Module, functional: FunctionalModel, generator: torch.Generator
              ) -> tuple[Measure, dict[str, Any]]:
        layer = self.layer if self.layer is not None else default_layer(model)
        measure = RelativeFlatness(functional, layer_weight_name(model, layer), self.hvp_chunk,
                                   (layer, model.get_submodule(layer)))
        return measure, {"layer": layer}


#: The measures by name. A new measure is one more :class:`MeasureSpec` here.
MEASURE_REGISTRY: dict[str, type[MeasureSpec]] = {
    spec.name: spec for spec in (AverageSpec, WorstCaseSpec, AdaptiveSpec, GeodesicSpec,
                                 RelativeFlatnessSpec)}
#: Other spellings of the measures' names.
ALIASES = {"worst-case": "worst_case", "relative-flatness": "relative_flatness"}


def measure_from(measure: object, rho: float | None = None,
                 options: Mapping[str, Any] | None = None) -> MeasureSpec:
    """The typed measure of the string form ``sharpness(..., measure, rho, **options)``.

    Parameters
    ----------
    measure
        A name of :data:`MEASURE_REGISTRY` or :data:`ALIASES` (``"worst-case"``).
    rho
        The radius (``None`` for ``"relative_flatness"``).
    options
        The measure's options by name (the fields of its :class:`MeasureSpec`).

    Raises
    ------
    ValueError
        For an unknown measure, or an option's bad value.
    TypeError
        Naming the options the measure does not have, or an option's value of a wrong type.
    """
    kind = MEASURE_REGISTRY.get(ALIASES.get(measure, measure) if isinstance(measure, str) else "")
    if kind is None:
        raise ValueError(f"unknown measure {measure!r}; choose one of {sorted(MEASURE_REGISTRY)}")
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"options must be a mapping of option names to values (a dict), got "
                        f"{type(options).__name__} {options!r}")
    given = dict(options or {})
    names = [k for k in given if not isinstance(k, str)]
    if names:
        raise TypeError(f"options: option names must be strings, got {names!r}")
    allowed = kind.defaults()
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for measure {kind.name!r}; allowed: "
                        f"{sorted(allowed)}")
    return kind(rho=rho, **given)
