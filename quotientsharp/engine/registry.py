"""Measure stage: the registry of measures, ``name -> spec``, in place of an if-chain.

A :class:`MeasureSpec` is everything :func:`~.api.sharpness` needs to know about one measure:
its options and their defaults (``spec.defaults``), whether it has a radius, and
``spec.build(setup)``, which checks the measure's own options and returns the
:class:`~.measures.Measure` with the settings it resolved. The options every measure shares
are checked by :mod:`.options`, before. A spec touches the options, the functional model and
the generator; the geometry it describes is built later, once, by the measure's ``setup``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from quotientsharp.core.adaptive import METRICS as OTHER_METRICS
from quotientsharp.core.frozen import check_order
from quotientsharp.core.gl import METRICS as GL_METRICS
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.engine.geometry import OTHER_PATHS
from quotientsharp.engine.layouts import symmetry_layout
from quotientsharp.engine.measures import (
    AscentMeasure,
    AverageMeasure,
    Measure,
    RelativeFlatness,
    default_layer,
    layer_weight_name,
)
from quotientsharp.engine.options import (
    ASCENT_OPTIONS,
    COMMON_OPTIONS,
    SEED_LIMIT,
    check_bool,
    check_int,
)
from quotientsharp.engine.solver import AscentSettings, SearchSettings, checkpoints
from quotientsharp.engine.space import GeodesicGeometry, GeometryPlan, PlainGeometry

__all__ = ["ALIASES", "MEASURE_REGISTRY", "REFERENCE_ITERATIONS", "REFERENCE_RESTARTS",
           "MeasureSetup", "MeasureSpec", "measure_defaults", "reference_settings"]

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


@dataclass(frozen=True)
class MeasureSetup:
    """What a spec builds its measure from.

    Attributes
    ----------
    model
        The user's module (discovery reads it; it is never run).
    functional
        The functional model the measure evaluates.
    rho
        The checked radius; ``None`` for a measure without one.
    options
        Every option, defaults filled in; the common ones checked already.
    generator
        The measurement's random stream (seeded with ``seed``).
    """

    model: nn.Module
    functional: FunctionalModel
    rho: float | None
    options: Mapping[str, Any]
    generator: torch.Generator

    @property
    def radius(self) -> float:
        """``rho``, for a measure that has one (checked by :func:`.options.check_rho`)."""
        if self.rho is None:
            raise ValueError("rho is required (the radius of the perturbation)")
        return self.rho


class MeasureSpec(Protocol):
    """One measure of the registry: its options, and how to build it."""

    @property
    def name(self) -> str:
        """The measure's name (``SharpnessResult.measure``)."""
        ...

    @property
    def defaults(self) -> Mapping[str, Any]:
        """Every option the measure takes, with its default."""
        ...

    @property
    def needs_rho(self) -> bool:
        """Whether ``rho`` is required (else it must be left unset)."""
        ...

    def build(self, setup: MeasureSetup) -> tuple[Measure, dict[str, Any]]:
        """Check the measure's own options; the measure and the settings it resolved."""
        ...


# ---------------------------------------------------------------------------- average
class AverageSpec:
    """``average``: ``E[L(theta + delta)] - L(theta)`` (:class:`~.measures.AverageMeasure`)."""

    name = "average"
    defaults: ClassVar[dict[str, Any]] = {**COMMON_OPTIONS, "adaptive": False, "samples": 1}
    needs_rho = True

    def build(self, setup: MeasureSetup) -> tuple[Measure, dict[str, Any]]:
        opts = setup.options
        samples = check_int("samples", opts["samples"], 1)
        adaptive = check_bool("adaptive", opts["adaptive"])
        return AverageMeasure(setup.functional, setup.radius, adaptive, samples,
                              setup.generator, opts["nonfinite"]), {}


# ---------------------------------------------------------------------------- ascent measures
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
    if option is True:
        given: dict[str, Any] = {}
    elif isinstance(option, Mapping):
        given = dict(option)
        unknown = sorted(str(k) for k in set(given) - set(REFERENCE_KEYS))
        if unknown:
            raise ValueError(f"reference_solve: unknown key(s) {unknown}; allowed: "
                             f"{list(REFERENCE_KEYS)}")
    else:
        raise TypeError(f"reference_solve must be None, True or a dict of solver settings "
                        f"({', '.join(REFERENCE_KEYS)}), got {option!r}")
    resolved = {"n_iter": REFERENCE_ITERATIONS * settings.n_iter,
                "restarts": REFERENCE_RESTARTS, "eta0": settings.eta0, "alpha": settings.alpha,
                "random_init": False, **given}
    try:
        return AscentSettings(**resolved)
    except (TypeError, ValueError) as err:
        raise type(err)(f"reference_solve: {err}") from err


SEARCH_KEYS = ("chains", "min_chains", "continuations", "target", "stall", "warm_step")


def search_settings(option: object) -> SearchSettings | None:
    """The reach search of the ``reach`` option.

    ``True``: :class:`~.solver.SearchSettings`' defaults; ``False``: none (one ascent, no
    reach estimate); a dict overrides any of ``chains``, ``min_chains``, ``continuations``,
    ``target``, ``stall``. Errors name ``reach`` and the offending key.
    """
    if option is False:
        return None
    if option is True:
        return SearchSettings()
    if not isinstance(option, Mapping):
        raise TypeError(f"reach must be True, False or a dict of search settings "
                        f"({', '.join(SEARCH_KEYS)}), got {option!r}")
    unknown = sorted(str(k) for k in set(option) - set(SEARCH_KEYS))
    if unknown:
        raise ValueError(f"reach: unknown key(s) {unknown}; allowed: {list(SEARCH_KEYS)}")
    return SearchSettings(**option)


def _eta0(settings: AscentSettings, rho: float) -> float:
    return settings.eta0 if settings.eta0 is not None else 2.0 * rho


@dataclass(frozen=True)
class AscentOptions:
    """The solver's options, shared by every ascent measure, checked (:meth:`check`)."""

    settings: AscentSettings
    reference: AscentSettings | None
    reference_generator: torch.Generator | None
    search: SearchSettings | None
    search_generator: torch.Generator | None
    blockwise: bool
    touched_rows: bool
    host_decisions: bool
    compile_steps: bool
    #: What they resolve to, for ``SharpnessResult.settings``.
    resolved: dict[str, Any]

    @classmethod
    def check(cls, setup: MeasureSetup) -> AscentOptions:
        opts, rho = setup.options, setup.radius
        settings = AscentSettings(n_iter=opts["n_iter"], eta0=opts["eta0"],
                                  alpha=opts["alpha"], random_init=opts["random_init"],
                                  restarts=opts["restarts"])
        reference = reference_settings(opts["reference_solve"], settings)
        found = search_settings(opts["reach"])
        resolved: dict[str, Any] = {
            "reach": None if found is None else asdict(found),
            "checkpoints": checkpoints(settings.n_iter), "eta0": _eta0(settings, rho),
            "reference_solve": None if reference is None else {
                "n_iter": reference.n_iter, "restarts": reference.restarts,
                "eta0": _eta0(reference, rho), "alpha": reference.alpha,
                "random_init": reference.random_init,
                "checkpoints": checkpoints(reference.n_iter)},
            "blockwise": check_bool("blockwise", opts["blockwise"])}
        # streams of their own, so that the measured first ascent is the same without them
        reference_generator = (None if reference is None
                               else _stream(setup.generator, REFERENCE_SEED_OFFSET))
        search_generator = None if found is None else _stream(setup.generator,
                                                              SEARCH_SEED_OFFSET)
        return cls(settings, reference, reference_generator, found, search_generator,
                   resolved["blockwise"],
                   check_bool("touched_rows", opts["touched_rows"]),
                   check_bool("host_decisions", opts["host_decisions"]),
                   check_bool("compile_steps", opts["compile_steps"]), resolved)

    def measure(self, setup: MeasureSetup, plan: GeometryPlan, extra: dict[str, Any]
                ) -> tuple[Measure, dict[str, Any]]:
        """The :class:`~.measures.AscentMeasure` over ``plan``'s geometry, and its settings."""
        measure = AscentMeasure(setup.functional, self.settings, setup.generator, plan,
                                nonfinite=setup.options["nonfinite"], reference=self.reference,
                                reference_generator=self.reference_generator,
                                blockwise=self.blockwise, touched_rows=self.touched_rows,
                                host_decisions=self.host_decisions,
                                compile_steps=self.compile_steps, reach=self.search,
                                probe_generator=self.search_generator)
        return measure, {**self.resolved, **extra}


def _stream(generator: torch.Generator, offset: int) -> torch.Generator:
    """A generator on ``generator``'s device seeded with its seed plus ``offset``."""
    seed = (generator.initial_seed() + offset) % SEED_LIMIT
    return torch.Generator(device=generator.device).manual_seed(seed)


def _check_p(p: object) -> float:
    if p in ("inf", "Linf", "linf") or (isinstance(p, float) and math.isinf(p) and p > 0):
        return math.inf
    if p in (2, 2.0, "2", "L2"):
        return 2.0
    raise ValueError(f"p must be 2 or 'inf', got {p!r}")


class WorstCaseSpec:
    """``worst_case``: Auto-PGD in an L2 ball or an L-infinity box, ``c = |theta|`` or 1."""

    name = "worst_case"
    defaults: ClassVar[dict[str, Any]] = {**COMMON_OPTIONS, **ASCENT_OPTIONS, "p": 2,
                                          "adaptive": False}
    needs_rho = True

    def _adaptive(self, options: Mapping[str, Any]) -> bool:
        return check_bool("adaptive", options["adaptive"])

    def build(self, setup: MeasureSetup) -> tuple[Measure, dict[str, Any]]:
        ascent = AscentOptions.check(setup)
        p = _check_p(setup.options["p"])
        adaptive = self._adaptive(setup.options)
        extra = {"p": "inf" if math.isinf(p) else 2, "adaptive": adaptive}
        return ascent.measure(setup, PlainGeometry(setup.radius, p, adaptive), extra)


class AdaptiveSpec(WorstCaseSpec):
    """``adaptive``: the worst case with ``c = |theta|`` (no ``adaptive`` option)."""

    name = "adaptive"
    defaults: ClassVar[dict[str, Any]] = {**COMMON_OPTIONS, **ASCENT_OPTIONS, "p": 2}

    def _adaptive(self, options: Mapping[str, Any]) -> bool:
        return True


class GeodesicSpec:
    """``geodesic``: Auto-PGD over the product quotient of the symmetries (the paper's)."""

    name = "geodesic"
    defaults: ClassVar[dict[str, Any]] = {
        **COMMON_OPTIONS, **ASCENT_OPTIONS, "metric": "inv", "order": 2, "eps": 0.0,
        "symmetries": "auto", "diagonal": None, "other_metric": "adaptive",
        "other_path": "line", "exact_steps": 16, "check_symmetry": True}
    needs_rho = True
    #: Options of discovered symmetries that bindings ignore, with their defaults.
    _DISCOVERY_ONLY = (("metric", "inv"), ("eps", 0.0), ("diagonal", None))

    @staticmethod
    def _check(opts: Mapping[str, Any]) -> tuple[int | str, float, int]:
        """The checked ``order``, ``eps`` and ``exact_steps``; the metrics' names checked."""
        if opts["metric"] not in GL_METRICS:
            raise ValueError(f"metric must be one of {GL_METRICS}, got {opts['metric']!r}")
        order = check_order(opts["order"])
        eps = opts["eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (
                math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
        if opts["other_metric"] not in OTHER_METRICS:
            raise ValueError(f"other_metric must be 'adaptive' or 'euclidean', got "
                             f"{opts['other_metric']!r}")
        if opts["other_path"] not in OTHER_PATHS:
            raise ValueError(f"other_path must be one of {OTHER_PATHS}, got "
                             f"{opts['other_path']!r}")
        if opts["other_path"] == "geodesic" and opts["other_metric"] != "adaptive":
            raise ValueError("other_path='geodesic' follows the adaptive metric's geodesic "
                             "w * exp(xi / w): it needs other_metric='adaptive'")
        return order, float(eps), check_int("exact_steps", opts["exact_steps"], 1)

    def build(self, setup: MeasureSetup) -> tuple[Measure, dict[str, Any]]:
        opts = setup.options
        ascent = AscentOptions.check(setup)
        order, eps, exact_steps = self._check(opts)
        check_bool("check_symmetry", opts["check_symmetry"])
        layout, extra = symmetry_layout(setup.model, setup.functional, opts["symmetries"],
                                        opts["diagonal"])
        if isinstance(layout, list):
            # bindings bring their own quotients: the options of discovered symmetries do not
            # apply
            ignored = {k: opts[k] for k, default in self._DISCOVERY_ONLY if opts[k] != default}
            if ignored:
                warnings.warn(f"option(s) {ignored} apply to discovered symmetries only; the "
                              "QuotientBinding quotients use their own metric", UserWarning,
                              stacklevel=3)
            extra.update({"metric": "the bindings' own", "eps": None, "diagonal": None})
        extra["order"] = order           # as checked: 2.0 is recorded as the order 2
        plan = GeodesicGeometry(setup.radius, layout, opts["metric"], order, eps, exact_steps,
                                opts["other_metric"], opts["other_path"])
        return ascent.measure(setup, plan, extra)


# ---------------------------------------------------------------------------- relative flatness
class RelativeFlatnessSpec:
    """``relative_flatness``: Petzka et al. 2021 for one layer (no radius)."""

    name = "relative_flatness"
    defaults: ClassVar[dict[str, Any]] = {**COMMON_OPTIONS, "layer": None, "hvp_chunk": 64}
    needs_rho = False

    def build(self, setup: MeasureSetup) -> tuple[Measure, dict[str, Any]]:
        opts = setup.options
        layer = opts["layer"] if opts["layer"] is not None else default_layer(setup.model)
        if not isinstance(layer, str):
            raise TypeError(f"layer must be a module name, got {type(layer).__name__}")
        chunk = check_int("hvp_chunk", opts["hvp_chunk"], 1)
        measure = RelativeFlatness(setup.functional, layer_weight_name(setup.model, layer),
                                   chunk)
        return measure, {"layer": layer}


#: The measures by name. A new measure is one more spec here.
MEASURE_REGISTRY: dict[str, MeasureSpec] = {
    spec.name: spec for spec in (AverageSpec(), WorstCaseSpec(), AdaptiveSpec(),
                                 GeodesicSpec(), RelativeFlatnessSpec())}
#: Other spellings of the measures' names.
ALIASES = {"worst-case": "worst_case", "relative-flatness": "relative_flatness"}


def measure_defaults() -> dict[str, dict[str, Any]]:
    """Every measure's options and their defaults, by measure name (``MEASURES``)."""
    return {name: dict(spec.defaults) for name, spec in MEASURE_REGISTRY.items()}
