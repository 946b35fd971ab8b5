"""``sharpness(model, batches, measure=..., rho=..., **options)``: the entry point of all measures.

The call never writes to the model: parameters and buffers are cloned once and every loss is a
:func:`torch.func.functional_call` on (perturbed) clones. The model runs in eval mode during the
measurement; every submodule's mode is restored afterwards, also when the loss raises or the
run is interrupted. Sharpness is computed per batch and averaged over batches
(``docs/sharpness.md``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quotientsharp.core.adaptive import METRICS as OTHER_METRICS
from quotientsharp.core.frozen import check_order
from quotientsharp.core.gl import METRICS as GL_METRICS
from quotientsharp.core.validation import value_checks
from quotientsharp.engine.batches import resolve_loss, split_batch
from quotientsharp.engine.functional import FunctionalModel, checked_clean_loss
from quotientsharp.engine.geometry import OTHER_PATHS
from quotientsharp.engine.measures import (
    NONFINITE_POLICIES,
    AscentMeasure,
    AverageMeasure,
    BatchOutcome,
    FirstEvaluation,
    RelativeFlatness,
    default_layer,
    geodesic_builder,
    layer_weight_name,
    plain_builder,
)
from quotientsharp.engine.solver import AscentSettings, checkpoints
from quotientsharp.models.binding import QuotientBinding

__all__ = ["MEASURES", "REFERENCE_ITERATIONS", "REFERENCE_RESTARTS", "SharpnessResult",
           "reference_settings", "sharpness"]

_COMMON = {"loss": None, "seed": 0, "progress": None, "keep_perturbations": False,
           "geometry_dtype": None,
           "nonfinite": "raise"}
_ASCENT = {"n_iter": 20, "eta0": None, "alpha": 0.75, "random_init": False, "restarts": 0,
           "reference_solve": None, "blockwise": False, "touched_rows": True}
#: What ``reference_solve=True`` runs: ``n_iter`` is ``REFERENCE_ITERATIONS`` times the
#: measurement's, ``restarts`` random restarts; ``eta0`` and ``alpha`` are the measurement's.
REFERENCE_ITERATIONS = 10
REFERENCE_RESTARTS = 4
#: The reference solve draws from a stream of its own, ``seed`` plus this odd constant (mod
#: ``2**64``), so that the measured value is the same with and without it.
_REFERENCE_SEED_OFFSET = 0x9E3779B97F4A7C15
#: Options of each measure and their defaults.
MEASURES: dict[str, dict[str, Any]] = {
    "average": {**_COMMON, "adaptive": False, "samples": 1},
    "worst_case": {**_COMMON, **_ASCENT, "p": 2, "adaptive": False},
    "adaptive": {**_COMMON, **_ASCENT, "p": 2},
    "geodesic": {**_COMMON, **_ASCENT, "metric": "inv", "order": 2, "eps": 0.0,
                 "symmetries": "auto", "diagonal": None, "other_metric": "adaptive",
                 "other_path": "line", "exact_steps": 16},
    "relative_flatness": {**_COMMON, "layer": None, "hvp_chunk": 64},
}
_ALIASES = {"worst-case": "worst_case", "relative-flatness": "relative_flatness"}


@dataclass
class SharpnessResult:
    """What :func:`sharpness` measured.

    Attributes
    ----------
    measure
        The measure's name.
    value
        Mean over batches of the per-batch sharpness.
    per_batch
        Sharpness of each batch (best perturbed loss minus clean loss for ascent measures).
    settings
        Every resolved option (defaults filled in), plus ``rho``, the geometry dtype, the
        solver checkpoints, the number of batches and the symmetry summary.
    perturbation_norms
        Per batch, the norms of the best perturbation: ``"total"`` (the constraint's norm) and,
        for geodesic sharpness, one entry per block kind (``"gl"``, ``"diagonal"``, ``"other"``).
    clean_losses, perturbed_losses
        Per batch, ``L(theta)`` and the (best or mean) perturbed loss.
    excluded
        Parameters left out of the perturbation because they receive no gradient.
    perturbations
        With ``keep_perturbations=True``: per batch, the parameter-space displacement of the
        best perturbation by parameter name (geometry dtype); otherwise ``None``.
    frozen
        Parameters with ``requires_grad=False``: never perturbed (they keep their values, as in
        training), so they are outside every measure.
    nonfinite_evaluations
        Per batch, the perturbed evaluations whose loss was NaN or inf. Always zero with
        ``nonfinite="raise"`` (the default), which raises on the first one; with
        ``nonfinite="skip"`` they were left out (never the best iterate, not in the mean; the
        reference solve's included).
    traces
        Ascent measures: per batch, the solver's convergence trace, the best perturbed loss
        minus the clean loss after each evaluation (``runs * (n_iter + 1)`` entries, run after
        run, the first the starting point): non-decreasing, its last entry is that batch's
        value. Empty for the other measures.
    reference_per_batch, reference_traces
        With ``reference_solve``: per batch, the value the stronger reference solve reached
        (best perturbed loss minus clean loss) and its trace. Empty otherwise.
    blocks
        With ``blockwise=True``: per batch, one dict per block of the best perturbation,
        ``{"name", "kind", "norm_share", "loss_change"}`` (``docs/sharpness.md``); ``None``
        otherwise.
    """

    measure: str
    value: float
    per_batch: list[float]
    settings: dict[str, Any]
    perturbation_norms: list[dict[str, float]]
    clean_losses: list[float] = field(default_factory=list)
    perturbed_losses: list[float] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    perturbations: list[dict[str, torch.Tensor]] | None = None
    frozen: list[str] = field(default_factory=list)
    nonfinite_evaluations: list[int] = field(default_factory=list)
    traces: list[list[float]] = field(default_factory=list)
    reference_per_batch: list[float] = field(default_factory=list)
    reference_traces: list[list[float]] = field(default_factory=list)
    blocks: list[list[dict[str, Any]]] | None = None

    def __float__(self) -> float:
        return self.value

    # ------------------------------------------------------------------ solver quality
    @property
    def reference_value(self) -> float | None:
        """Mean over batches of the reference solve's values; ``None`` without one."""
        if not self.reference_per_batch:
            return None
        return sum(self.reference_per_batch) / len(self.reference_per_batch)

    @property
    def gap_per_batch(self) -> list[float]:
        """Per batch, ``reference - value``: how much more the reference solve found (negative
        where it found less). Empty without a reference solve."""
        return [r - v for r, v in zip(self.reference_per_batch, self.per_batch, strict=True)]

    @property
    def relative_gap_per_batch(self) -> list[float]:
        """Per batch, ``(reference - value) / |reference|`` (``0`` where both are ``0``)."""
        return [_relative(r - v, r) for r, v in zip(self.reference_per_batch, self.per_batch,
                                                     strict=True)]

    @property
    def gap(self) -> float | None:
        """``reference_value - value``; ``None`` without a reference solve."""
        reference = self.reference_value
        return None if reference is None else reference - self.value

    @property
    def relative_gap(self) -> float | None:
        """``gap / |reference_value|``; ``None`` without a reference solve."""
        reference, gap = self.reference_value, self.gap
        return None if reference is None or gap is None else _relative(gap, reference)

    # ------------------------------------------------------------------ blocks
    def block_summary(self) -> list[dict[str, Any]]:
        """Per block, ``{"name", "kind", "norm_share", "loss_change"}`` averaged over the
        batches (in layout order); empty without ``blockwise=True``."""
        if not self.blocks:
            return []
        count = len(self.blocks)
        summary = [dict(record) for record in self.blocks[0]]
        for records in self.blocks[1:]:
            for total, record in zip(summary, records, strict=True):
                total["norm_share"] += record["norm_share"]
                total["loss_change"] += record["loss_change"]
        for total in summary:
            total["norm_share"] /= count
            total["loss_change"] /= count
        return summary

    @property
    def variant(self) -> str:
        """The settings that tell this measure's variants apart: ``"metric mix, order 2"``
        for geodesic sharpness, ``"p=inf"`` for a box, ``""`` otherwise."""
        settings = self.settings
        if self.measure == "geodesic":
            return f"metric {settings.get('metric')}, order {settings.get('order')}"
        if self.measure in ("worst_case", "adaptive") and settings.get("p") == "inf":
            return "p=inf"
        if self.measure == "relative_flatness" and settings.get("layer"):
            return f"layer {settings['layer']}"
        return ""

    def summary(self) -> str:
        """One readable line: measure (with metric and order for geodesic), value, batches, rho."""
        variant = f" ({self.variant})" if self.variant else ""
        skipped = sum(self.nonfinite_evaluations)
        note = f", {skipped} non-finite evaluation(s) skipped" if skipped else ""
        gap = self.gap
        if gap is not None:
            note += (f", reference solve {self.reference_value:.6g}: gap {gap:.3g} "
                     f"({100 * self.relative_gap:.3g}%)")
        return (f"{self.measure} sharpness{variant} {self.value:.6g} over "
                f"{len(self.per_batch)} batch(es) (rho={self.settings.get('rho')}{note})")


def _relative(gap: float, reference: float) -> float:
    """``gap / |reference|``; ``0`` for a zero gap, ``inf`` (signed) for a zero reference."""
    if gap == 0:
        return 0.0
    if reference == 0:
        return math.copysign(math.inf, gap)
    return gap / abs(reference)


# ---------------------------------------------------------------------------- option checks
def _check_rho(rho: object, needed: bool) -> float | None:
    if not needed:
        if rho is not None:
            raise ValueError("relative_flatness has no radius: leave rho unset")
        return None
    if rho is None:
        raise ValueError("rho is required (the radius of the perturbation)")
    if isinstance(rho, torch.Tensor) and rho.numel() == 1:
        rho = float(rho)
    if isinstance(rho, bool) or not isinstance(rho, (int, float)):
        raise TypeError(f"rho must be a number, got {type(rho).__name__}")
    if not math.isfinite(rho) or rho <= 0:
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    return float(rho)


def _check_radius_fits(rho: float | None, eta0: float | None, dtype: torch.dtype) -> None:
    """Raise when ``rho`` (or the step ``eta0``) is so large that the squared norm of a
    perturbation overflows the geometry's dtype: the ball's rescale would silently return 0."""
    limit = math.sqrt(torch.finfo(dtype).max) / 16
    name = str(dtype).removeprefix("torch.")
    for label, value in (("rho", rho), ("eta0", eta0)):
        if value is not None and value >= limit:
            raise ValueError(f"{label}={value:g} is too large for the geometry's {name}: the "
                             f"squared norm of a perturbation that size overflows (largest "
                             f"finite {name}: {torch.finfo(dtype).max:.3g}), which would "
                             f"silently shrink every step to zero; use {label} < {limit:.3g}")


def _check_p(p: object) -> float:
    if p in ("inf", "Linf", "linf") or (isinstance(p, float) and math.isinf(p) and p > 0):
        return math.inf
    if p in (2, 2.0, "2", "L2"):
        return 2.0
    raise ValueError(f"p must be 2 or 'inf', got {p!r}")


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


#: ``torch.Generator.manual_seed`` takes 64-bit seeds.
_SEED_LIMIT = 2 ** 64


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if not 0 <= seed < _SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return seed


def _check_progress(progress: object) -> bool | None:
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool or None (None: a bar only on a terminal), "
                        f"got {progress!r}")
    return progress


def _check_geometry_dtype(dtype: object) -> torch.dtype | None:
    if dtype is None:
        return None
    named = {"float32": torch.float32, "float64": torch.float64}
    if isinstance(dtype, str) and dtype in named:
        return named[dtype]
    if dtype in (torch.float32, torch.float64):
        return dtype
    raise ValueError(f"geometry_dtype must be None, torch.float32 or torch.float64 (or their "
                     f"names), got {dtype!r}")


def _check_nonfinite(policy: object) -> str:
    if policy not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {policy!r}")
    return str(policy)


_REFERENCE_KEYS = ("n_iter", "restarts", "eta0", "alpha", "random_init")


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
        unknown = sorted(str(k) for k in set(given) - set(_REFERENCE_KEYS))
        if unknown:
            raise ValueError(f"reference_solve: unknown key(s) {unknown}; allowed: "
                             f"{list(_REFERENCE_KEYS)}")
    else:
        raise TypeError(f"reference_solve must be None, True or a dict of solver settings "
                        f"({', '.join(_REFERENCE_KEYS)}), got {option!r}")
    resolved = {"n_iter": REFERENCE_ITERATIONS * settings.n_iter,
                "restarts": REFERENCE_RESTARTS, "eta0": settings.eta0, "alpha": settings.alpha,
                "random_init": False, **given}
    try:
        return AscentSettings(**resolved)
    except (TypeError, ValueError) as err:
        raise type(err)(f"reference_solve: {err}") from err


def _resolve_options(measure: str, options: Mapping[str, Any]) -> dict[str, Any]:
    allowed = MEASURES[measure]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for measure {measure!r}; allowed: "
                        f"{sorted(allowed)}")
    return {**allowed, **options}


def _layout_for(model: nn.Module, functional: FunctionalModel, symmetries: Any,
                diagonal: Any) -> tuple[Any | None, dict[str, Any]]:
    """The symmetry layout (``None``, a layout or a list of bindings) and a settings summary."""
    if isinstance(symmetries, QuotientBinding):
        symmetries = [symmetries]
    if isinstance(symmetries, (list, tuple)):
        if not symmetries or not all(isinstance(b, QuotientBinding) for b in symmetries):
            raise TypeError("a list of symmetries must hold QuotientBinding objects only")
        return list(symmetries), {"symmetries": "bindings",
                                  "bindings": [{"name": b.name, "quotient": b.quotient.name,
                                                "parameters": list(b.parameters)}
                                               for b in symmetries]}
    if isinstance(symmetries, str):
        if symmetries == "none":
            return None, {"symmetries": "none"}
        if symmetries != "auto":
            raise ValueError(f"symmetries must be 'auto', 'none', a SymmetryReport, a "
                             f"ParameterLayout or QuotientBinding(s), got {symmetries!r}")
        from quotientsharp.models import find_symmetries
        report = find_symmetries(model, diagonal=diagonal)
    elif hasattr(symmetries, "to_coordinates") and hasattr(symmetries, "to_parameters"):
        return symmetries, {"symmetries": type(symmetries).__name__}
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
    summary = {"symmetries": "report", "gl_pairs": len(report.pairs),
               "gl_buckets": [list(shape) for shape in layout.bucket_shapes],
               "diagonal_pairs": len(report.diagonal), "unknown_modules": list(report.unknown)}
    return layout, summary


def _make_measure(measure: str, model: nn.Module, functional: FunctionalModel,
                  rho: float | None, opts: dict[str, Any],
                  generator: torch.Generator) -> tuple[Any, dict[str, Any]]:
    extra: dict[str, Any] = {}
    if measure == "relative_flatness":
        layer = opts["layer"] if opts["layer"] is not None else default_layer(model)
        if not isinstance(layer, str):
            raise TypeError(f"layer must be a module name, got {type(layer).__name__}")
        chunk = _check_int("hvp_chunk", opts["hvp_chunk"], 1)
        extra["layer"] = layer
        return RelativeFlatness(functional, layer_weight_name(model, layer), chunk), extra
    if measure == "average":
        samples = _check_int("samples", opts["samples"], 1)
        adaptive = _check_bool("adaptive", opts["adaptive"])
        return AverageMeasure(functional, rho, adaptive, samples, generator,
                              opts["nonfinite"]), extra

    settings = AscentSettings(n_iter=opts["n_iter"], eta0=opts["eta0"], alpha=opts["alpha"],
                              random_init=opts["random_init"], restarts=opts["restarts"])
    extra["checkpoints"] = checkpoints(settings.n_iter)
    extra["eta0"] = settings.eta0 if settings.eta0 is not None else 2.0 * rho
    reference = reference_settings(opts["reference_solve"], settings)
    extra["reference_solve"] = None if reference is None else {
        "n_iter": reference.n_iter, "restarts": reference.restarts,
        "eta0": reference.eta0 if reference.eta0 is not None else 2.0 * rho,
        "alpha": reference.alpha, "random_init": reference.random_init,
        "checkpoints": checkpoints(reference.n_iter)}
    extra["blockwise"] = _check_bool("blockwise", opts["blockwise"])
    reference_generator = None
    if reference is not None:
        reference_generator = torch.Generator(device=generator.device).manual_seed(
            (generator.initial_seed() + _REFERENCE_SEED_OFFSET) % _SEED_LIMIT)
    ascent = {"nonfinite": opts["nonfinite"], "reference": reference,
              "reference_generator": reference_generator, "blockwise": extra["blockwise"],
              "touched_rows": _check_bool("touched_rows", opts["touched_rows"])}
    if measure in ("worst_case", "adaptive"):
        p = _check_p(opts["p"])
        adaptive = True if measure == "adaptive" else _check_bool("adaptive", opts["adaptive"])
        extra["p"] = "inf" if math.isinf(p) else 2
        extra["adaptive"] = adaptive
        build = plain_builder(functional, rho, p, adaptive)
        return AscentMeasure(functional, settings, generator, build, **ascent), extra

    metric = opts["metric"]
    if metric not in GL_METRICS:
        raise ValueError(f"metric must be one of {GL_METRICS}, got {metric!r}")
    order = check_order(opts["order"])
    eps = opts["eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (
            math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if opts["other_metric"] not in OTHER_METRICS:
        raise ValueError(f"other_metric must be 'adaptive' or 'euclidean', got "
                         f"{opts['other_metric']!r}")
    if opts["other_path"] not in OTHER_PATHS:
        raise ValueError(f"other_path must be one of {OTHER_PATHS}, got {opts['other_path']!r}")
    if opts["other_path"] == "geodesic" and opts["other_metric"] != "adaptive":
        raise ValueError("other_path='geodesic' follows the adaptive metric's geodesic "
                         "w * exp(xi / w): it needs other_metric='adaptive'")
    exact_steps = _check_int("exact_steps", opts["exact_steps"], 1)
    layout, summary = _layout_for(model, functional, opts["symmetries"], opts["diagonal"])
    extra.update(summary)
    if isinstance(layout, list):
        # bindings bring their own quotients: the options of discovered symmetries do not apply
        ignored = {k: opts[k] for k, default in (("metric", "inv"), ("eps", 0.0),
                                                 ("diagonal", None)) if opts[k] != default}
        if ignored:
            warnings.warn(f"option(s) {ignored} apply to discovered symmetries only; the "
                          "QuotientBinding quotients use their own metric", UserWarning,
                          stacklevel=3)
        extra.update({"metric": "the bindings' own", "eps": None, "diagonal": None})
    build = geodesic_builder(functional, rho, layout, metric, order, float(eps), exact_steps,
                             opts["other_metric"], opts["other_path"])
    return AscentMeasure(functional, settings, generator, build, **ascent), extra


def _progress_bar(batches: Iterable, per_batch: int, progress: bool | None, measure: str):
    from tqdm.auto import tqdm
    total = len(batches) * per_batch if hasattr(batches, "__len__") else None
    disable = None if progress is None else not progress
    return tqdm(total=total, disable=disable, desc=f"{measure} sharpness", unit="eval",
                leave=False)


# ---------------------------------------------------------------------------- entry point
def sharpness(model: nn.Module, batches: Iterable, measure: str = "geodesic",
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
        embedding tables the batch looks up, when the solve starts at ``xi = 0``: the other
        rows have no gradient and never move, so the value is the same up to the summation
        order of the norms (``settings["restricted_rows"]`` lists, per batch, the rows kept
        per table; ``False`` solves on the full tables).

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
        the adaptive metric's geodesic, ``w * exp(xi / w)`` for ``order="exact"``).

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
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(measure, str) or _ALIASES.get(measure, measure) not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; choose one of {sorted(MEASURES)}")
    measure = _ALIASES.get(measure, measure)
    opts = _resolve_options(measure, options)
    rho = _check_rho(rho, measure != "relative_flatness")
    if isinstance(batches, (torch.Tensor, str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of batches, got {type(batches).__name__}")
    seed = _check_seed(opts["seed"])
    keep = _check_bool("keep_perturbations", opts["keep_perturbations"])
    _check_progress(opts["progress"])
    _check_nonfinite(opts["nonfinite"])
    loss = resolve_loss(opts["loss"])

    functional = FunctionalModel(model, (loss[0], loss[2]),
                                 geometry_dtype=_check_geometry_dtype(opts["geometry_dtype"]))
    functional.check_finite()
    generator = torch.Generator(device=functional.device).manual_seed(seed)
    evaluator, extra = _make_measure(measure, model, functional, rho, opts, generator)
    _check_radius_fits(rho, extra.get("eta0"), functional.dtype)

    modes = {module: module.training for module in model.modules()}
    outcomes: list[BatchOutcome] = []
    excluded: list[str] = []
    bar = None
    try:
        model.eval()
        bar = _progress_bar(batches, evaluator.evaluations_per_batch(), opts["progress"],
                            measure)
        for index, raw in enumerate(batches):
            batch = split_batch(raw, index, functional.device, functional.input_dtype)
            first = None
            if index == 0:
                # one forward+backward finds the parameters without gradient; the measure
                # reuses it as the clean loss and the ascent's evaluation at xi = 0
                with functional.checking(), functional.recording_tables() as tables:
                    first = FirstEvaluation(*functional.loss_and_gradients(batch))
                first.rows = tables.rows()
                checked_clean_loss(first.loss, index, batch, functional)
                excluded = [n for n, g in first.gradients.items() if g is None]
                evaluator.setup(excluded)
            with value_checks(False):
                outcomes.append(evaluator(batch, index, bar.update, keep, first))
            del first       # the gradients are parameter-sized: not kept past the first batch
        if not outcomes:
            raise ValueError("batches is empty: sharpness needs at least one batch")
    finally:
        for module, training in modes.items():
            module.training = training
        if bar is not None:
            bar.close()

    skipped = [o.nonfinite for o in outcomes]
    if sum(skipped):
        warnings.warn(f"{sum(skipped)} perturbed evaluation(s) with a NaN or inf loss were "
                      f"skipped (nonfinite='skip'; per batch: {skipped}): the values are the "
                      "best over the finite evaluations only", UserWarning, stacklevel=2)
    values = torch.stack([o.value for o in outcomes]).tolist()
    norms = [{k: float(v) for k, v in o.norms.items()} for o in outcomes]
    traces = [(o.trace - o.clean).tolist() for o in outcomes if o.trace is not None]
    references = [float(o.reference - o.clean) for o in outcomes if o.reference is not None]
    reference_traces = [(o.reference_trace - o.clean).tolist() for o in outcomes
                        if o.reference_trace is not None]
    blocks = ([o.blocks.records() for o in outcomes if o.blocks is not None]
              if extra.get("blockwise") else None)
    restricted = getattr(evaluator, "restricted_rows", None)
    if restricted is not None:
        extra["restricted_rows"] = restricted
    settings = {"measure": measure, "rho": rho, "n_batches": len(outcomes),
                "geometry_dtype": str(functional.dtype).removeprefix("torch."),
                **{k: v for k, v in opts.items()
                   if k not in ("loss", "symmetries", "geometry_dtype")},
                "loss": loss[1], **extra}
    return SharpnessResult(
        measure=measure,
        value=sum(values) / len(values),
        per_batch=values,
        settings=settings,
        perturbation_norms=norms,
        clean_losses=torch.stack([o.clean for o in outcomes]).tolist(),
        perturbed_losses=torch.stack([o.perturbed for o in outcomes]).tolist(),
        excluded=list(excluded),
        perturbations=[o.perturbation for o in outcomes] if keep else None,
        frozen=list(functional.frozen),
        nonfinite_evaluations=skipped,
        traces=traces,
        reference_per_batch=references,
        reference_traces=reference_traces,
        blocks=blocks,
    )
