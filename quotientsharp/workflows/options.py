"""What to measure and how: the typed, self-validating settings of ``measure`` and ``study``;
a bad value raises :class:`InputError` naming the field (``rho``), or, inside
:func:`command_line_names`, the option (``--rho``)."""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotientsharp.core.scalars import (
    as_real,
    check_finite,
    check_flag,
    check_int,
    check_nonfinite,
    check_order,
    check_p,
    check_real,
    check_seed,
    check_thread_count,
)
from quotientsharp.workflows.labels import MEASURE_NAMES

ASCENT_MEASURES = ("worst_case", "adaptive", "geodesic")
METRICS = ("inv", "mix", "euclidean")
LOSSES = ("cross_entropy", "mse")
DTYPES = ("float32", "float64")

#: The options of some measures only, the measures they apply to and their defaults (what
#: ``None`` stands for). Given while none of their measures is measured, they are refused.
_MEASURE_OPTIONS: dict[str, tuple[tuple[str, ...], Any]] = {
    "metrics": (("geodesic",), ("inv",)), "orders": (("geodesic",), (2,)),
    "eps": (("geodesic",), 0.0), "symmetry": (("geodesic",), None),
    "p": (("worst_case", "adaptive"), "2"), "samples": (("average",), 1),
    "layer": (("relative_flatness",), None),
    # relative flatness perturbs nothing, so it has no perturbed loss to skip
    "nonfinite": (("average", "worst_case", "adaptive", "geodesic"), "raise")}

#: Fields whose command-line option is not ``--`` and their name with dashes.
_OPTION_NAMES = {"measures": "--measure", "metrics": "--metric", "orders": "--order",
                 "plots": "--no-plots", "BootstrapSettings.resamples": "--bootstrap",
                 "BootstrapSettings.seed": "--bootstrap-seed"}
#: Parts of the settings that no single option sets: their errors name the field.
_NO_OPTION = ("batches", "solver", "bootstrap")

# True while the command line builds settings: errors then name options, not fields
_NAMING_OPTIONS: ContextVar[bool] = ContextVar("naming_options", default=False)


class InputError(ValueError):
    """Bad user input: reported as one line on stderr, exit status 2."""


def _input_errors(post_init: Callable[[Any], None]) -> Callable[[Any], None]:
    """``__post_init__`` raising the ``TypeError``/``ValueError`` of a check as an
    :class:`InputError`."""
    @functools.wraps(post_init)
    def checked(self: Any) -> None:
        try:
            post_init(self)
        except InputError:
            raise
        except (TypeError, ValueError) as error:
            raise InputError(str(error)) from None
    return checked


@contextmanager
def command_line_names() -> Iterator[None]:
    """Within this block, the settings' errors name the command-line options, not the fields."""
    token = _NAMING_OPTIONS.set(True)
    try:
        yield
    finally:
        _NAMING_OPTIONS.reset(token)


def _name(field_name: str) -> str:
    """How an error names a field: the field, or its option on the command line."""
    if not _NAMING_OPTIONS.get() or field_name in _NO_OPTION:
        return field_name
    return (_OPTION_NAMES.get(field_name)
            or "--" + field_name.rpartition(".")[2].replace("_", "-"))


def _integer(value: object, field_name: str, minimum: int, *, optional: bool = False) -> Any:
    """``value`` as an ``int`` >= ``minimum`` (``None`` too where ``optional``), bools refused."""
    return None if value is None and optional else check_int(_name(field_name), value, minimum)


def _listed(names: Sequence[str], last: str) -> str:
    """``"a, b and c"`` (``last`` the word before the last name)."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def _text(value: object, field_name: str, *, optional: bool = True, path: bool = False) -> None:
    """Refuse anything but a string (or a path where ``path``; ``None`` where ``optional``)."""
    kinds: tuple[type, ...] = (str, os.PathLike) if path else (str,)
    if not (isinstance(value, kinds) or (optional and value is None)):
        what = "a string or a path" if path else "a string"
        raise InputError(f"{_name(field_name)} must be {what}{' (or None)' if optional else ''}"
                         f", got {type(value).__name__} {value!r}")


def _part(value: object, kind: type, field_name: str) -> None:
    """Refuse a part of the settings that is not of its class (a dict for ``batches``)."""
    if not isinstance(value, kind):
        raise InputError(f"{_name(field_name)} must be a {kind.__name__}, got "
                         f"{type(value).__name__}")


def _items(value: object, field_name: str, *, empty: bool = False) -> list[Any]:
    """The entries of a comma list (``"mix,inv"``, stripped), a list or a tuple, or a number;
    non-empty unless ``empty``."""
    if isinstance(value, str):
        items: list[Any] = [part.strip() for part in value.split(",")]
    elif isinstance(value, Iterable) and not isinstance(value, (Mapping, bytes)):
        items = list(value)
    elif isinstance(value, numbers.Real):
        items = [value]
    else:
        raise InputError(f"{_name(field_name)} must be a value, a comma list or a list of "
                         f"them, got {type(value).__name__}")
    if not (items or empty):
        raise InputError(f"{_name(field_name)} must not be empty")
    return items


def radius_text(rho: float) -> str:
    """A radius as the outputs name it (``adaptive_rho0.1``): 6 significant digits."""
    return f"{rho:g}"


def _unique(values: Iterable[Any]) -> tuple[Any, ...]:
    """``values`` in order, without repeats."""
    return tuple(dict.fromkeys(values))


def _set(instance: object, name: str, value: Any) -> None:
    """Store a normalised value on a frozen dataclass (in ``__post_init__`` only)."""
    object.__setattr__(instance, name, value)


@dataclass(frozen=True)
class BatchSettings:
    """How a data file becomes batches, and the loss its labels must fit.

    Attributes
    ----------
    batch_size
        Examples per batch (the last batch may be smaller).
    max_batches
        Use at most this many batches (``None``: all).
    max_length
        Text rows: truncate to this many tokens.
    tokenizer
        Text rows: the tokenizer directory (``None``: the model's directory).
    loss
        ``"cross_entropy"`` (integer class labels) or ``"mse"`` (real-valued targets).
    """

    batch_size: int = 32
    max_batches: int | None = None
    max_length: int = 128
    tokenizer: str | None = None
    loss: str = "cross_entropy"

    @_input_errors
    def __post_init__(self) -> None:
        _choice(self.loss, "BatchSettings.loss", LOSSES, "cross_entropy or mse")
        for name in ("batch_size", "max_batches", "max_length"):
            _set(self, name, _integer(getattr(self, name), f"BatchSettings.{name}", 1,
                                      optional=name == "max_batches"))
        _text(self.tokenizer, "BatchSettings.tokenizer", path=True)
        if self.tokenizer is not None:
            _set(self, "tokenizer", str(self.tokenizer))


@dataclass(frozen=True)
class SolverSettings:
    """How the ascent measures (worst-case, adaptive, geodesic) solve, and their diagnostics.

    Attributes
    ----------
    n_iter
        Auto-PGD steps.
    blockwise
        Also report the best perturbation per block (one extra forward per block and batch).
    compile_steps
        Run the solver's per-iteration geometry as ``torch.compile`` graphs.
    reference_n_iter, reference_restarts
        A stronger reference solve per batch (its steps, its random restarts), ``None``: none
        (or the engine's default where the other is given).
    chains
        Most chains of the reach search that confirms each value (``>= 2``); ``None``: the
        engine's default.
    """

    n_iter: int = 20
    blockwise: bool = False
    compile_steps: bool = False
    reference_n_iter: int | None = None
    reference_restarts: int | None = None
    chains: int | None = None

    @_input_errors
    def __post_init__(self) -> None:
        for name, minimum in (("n_iter", 1), ("chains", 2), ("reference_n_iter", 1),
                              ("reference_restarts", 0)):
            _set(self, name, _integer(getattr(self, name), f"SolverSettings.{name}", minimum,
                                      optional=name != "n_iter"))
        check_flag(_name("SolverSettings.blockwise"), self.blockwise)
        check_flag(_name("SolverSettings.compile_steps"), self.compile_steps)

    def diagnostics(self) -> list[str]:
        """The fields given that need an ascent measure, named as the errors name them."""
        return [_name(f"SolverSettings.{name}") for name, given in (
            # n_iter has a default: another value counts as given (on the command line any
            # --n-iter counts, refused before these settings are made)
            ("n_iter", self.n_iter != SolverSettings.n_iter),
            ("blockwise", self.blockwise), ("compile_steps", self.compile_steps),
            ("reference_n_iter", self.reference_n_iter is not None),
            ("reference_restarts", self.reference_restarts is not None),
            ("chains", self.chains is not None)) if given]

    def options(self) -> dict[str, Any]:
        """Keyword options of :func:`quotientsharp.sharpness` for an ascent measure."""
        options: dict[str, Any] = {"n_iter": self.n_iter, "blockwise": self.blockwise,
                                   "compile_steps": self.compile_steps}
        if self.chains is not None:
            options["reach"] = {"chains": self.chains}
        reference = {key: value for key, value in (("n_iter", self.reference_n_iter),
                                                   ("restarts", self.reference_restarts))
                     if value is not None}
        if reference:
            options["reference_solve"] = reference
        return options


def measure_names(requested: str | Sequence[str] | None) -> list[str]:
    """The measures asked for (names, aliases such as ``worst-case``, comma lists), in order,
    without repeats; ``["geodesic"]`` for ``None``."""
    aliases = {"worst-case": "worst_case", "relative-flatness": "relative_flatness"}
    names: list[str] = []
    for item in _items(["geodesic"] if requested is None else requested, "measures"):
        if not isinstance(item, str):
            raise InputError(f"{_name('measures')} must be measure names such as 'adaptive' "
                             f"(the radius goes in rho), got {type(item).__name__}")
        for part in item.split(","):
            part = part.strip()
            name = aliases.get(part, part)
            if name not in MEASURE_NAMES:
                raise InputError(f"{_name('measures')}: unknown measure {part!r}; choose from "
                                 f"{', '.join(sorted(MEASURE_NAMES))}")
            if name not in names:
                names.append(name)
    return names


def _choice(value: object, field_name: str, choices: Collection[Any], allowed: str) -> Any:
    """``value`` if among ``choices``, else an error listing the ``allowed``."""
    if isinstance(value, bool) or value not in choices:
        raise InputError(f"{_name(field_name)} must be {allowed}, got {value!r}")
    return value


def _radius(value: object) -> float:
    """A radius: a finite number > 0 (an entry of a comma list is read as a number)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InputError(f"{_name('rho')} must be a number or a comma list of numbers, got "
                             f"{value!r}") from None
    if as_real(value) is None:
        raise InputError(f"{_name('rho')} must be a number or a comma list of numbers, got "
                         f"{type(value).__name__} {value!r}")
    return float(check_finite(_name("rho"), value))


@dataclass(frozen=True, kw_only=True)
class SharpnessConfig:
    """What to measure and with which options: the settings ``quotientsharp measure`` and
    ``quotientsharp study`` share (a study's :class:`StudyConfig` adds its own), checked (and
    normalised) when made.

    Attributes
    ----------
    measures
        Measures of :func:`quotientsharp.sharpness` (``"geodesic"``, ``"adaptive"``, ...);
        aliases and comma lists are read. Stored as a tuple of names, in order, no repeats.
    rho
        The radius, or several (a study measures each; a list or a comma list such as
        ``"0.05,0.1"``); stored as a tuple of floats. Required except for relative flatness.
    metrics, orders
        Geodesic sharpness: the metrics (``"inv"``, ``"mix"``, ``"euclidean"``) and orders
        (1, 2, ``"exact"``) to measure with, each pair one measurement; a list, or a comma
        list such as ``"inv,mix"``. Stored as tuples, in order, no repeats (``None``:
        ``("inv",)`` and ``(2,)``).
    symmetry
        Geodesic sharpness: ``"MODULE:FUNCTION"``, a symmetry of your own (its bindings
        measure with their own quotients' metric, so one metric at most).
    eps
        Geodesic sharpness: the Gram relaxation ``G^T G + eps I`` (``None``: 0).
    p
        Worst-case and adaptive sharpness: ``"2"`` or ``"inf"`` (the numbers 2 and
        ``math.inf`` are read as these; ``None``: ``"2"``).
    samples
        Average sharpness: Gaussian draws per batch (``None``: 1).
    layer
        Relative flatness: the module (``None``: the last ``nn.Linear``).
    nonfinite
        What a NaN or inf perturbed loss does: ``"raise"`` or ``"skip"`` (``nonfinite=`` of
        :func:`quotientsharp.sharpness`; ``None``: ``"raise"``).
    seed
        The random seed.
    batches, solver
        How the data become batches (and the loss); how the ascent measures solve.
    dtype
        Cast the model to ``"float32"`` or ``"float64"`` (``None``: as saved).
    device
        The torch device, e.g. ``"cpu"`` or ``"cuda:0"`` (checked when a model is measured).
    progress
        Progress bars (``None``: only on a terminal).

    Notes
    -----
    An option of some measures only (``metrics``, ``orders``, ``eps`` and ``symmetry`` of
    geodesic sharpness, ``p`` of worst-case and adaptive sharpness, ``samples`` of average
    sharpness, ``layer`` of relative flatness, ``nonfinite`` of every measure but relative
    flatness) given while none of its measures is in
    ``measures`` is refused, rather than ignored, as are ``rho`` with relative flatness alone
    and ``solver.n_iter`` without an ascent measure. From Python a value equal to the default
    counts as not given (so that ``dataclasses.replace`` of a checked configuration checks
    again); on the command line any option given counts.
    """

    measures: Sequence[str] = ("geodesic",)
    rho: float | Sequence[float] | None = ()
    metrics: Sequence[str] | None = None
    orders: Sequence[int | str] | None = None
    symmetry: str | None = None
    eps: float | None = None
    p: str | None = None
    samples: int | None = None
    layer: str | None = None
    nonfinite: str | None = None
    seed: int = 0
    batches: BatchSettings = field(default_factory=BatchSettings)
    solver: SolverSettings = field(default_factory=SolverSettings)
    dtype: str | None = None
    device: str = "cpu"
    progress: bool | None = None

    @_input_errors
    def __post_init__(self) -> None:
        _set(self, "measures", tuple(measure_names(self.measures)))
        # which options of some measures were given, before their defaults fill the gaps
        typed = [name for name in _MEASURE_OPTIONS if getattr(self, name) is not None]
        for name, (_, default) in _MEASURE_OPTIONS.items():
            if getattr(self, name) is None:
                _set(self, name, default)
        _set(self, "metrics", _unique(
            _choice(m, "metrics", METRICS, "inv, mix or euclidean (or a comma list of them)")
            for m in _items(self.metrics, "metrics")))
        _text(self.symmetry, "symmetry")
        self._check_metrics()
        _set(self, "p", str(check_p(self.p, _name("p"))))
        _set(self, "samples", _integer(self.samples, "samples", 1))
        _set(self, "seed", check_seed(self.seed, _name("seed")))
        self._check_radii()
        _set(self, "eps", float(check_finite(_name("eps"), self.eps, positive=False)))
        # a comma list gives the orders as text
        _set(self, "orders", _unique(
            check_order({"1": 1, "2": 2}.get(order, order) if isinstance(order, str) else order,
                        _name("orders")) for order in _items(self.orders, "orders")))
        _part(self.batches, BatchSettings, "batches")
        _part(self.solver, SolverSettings, "solver")
        self._check_solver()
        _choice(self.dtype, "dtype", (None, *DTYPES), "float32 or float64")
        _text(self.layer, "layer")
        check_nonfinite(self.nonfinite, _name("nonfinite"))
        _text(self.device, "device", optional=False)
        check_flag(_name("progress"), self.progress, optional=True)
        self._check_measure_options(typed)

    @property
    def radii(self) -> tuple[float, ...]:
        """The radii (``rho`` after the checks)."""
        return self.rho  # type: ignore[return-value]

    def _check_metrics(self) -> None:
        metrics = self.metrics or ()       # None became the default in __post_init__
        if self.symmetry is not None and "geodesic" in self.measures and len(metrics) > 1:
            # each metric would give the same value under a different label
            metric, symmetry = _name("metrics"), _name("symmetry")
            raise InputError(f"{metric} {','.join(metrics)}: with {symmetry} "
                             f"{self.symmetry} geodesic sharpness measures with the metric of "
                             f"each binding's own quotient, so every {metric} gives the same "
                             f"value; leave {metric} out (or give one)")

    def _check_radii(self) -> None:
        radii = () if self.rho is None else _unique(
            _radius(rho) for rho in _items(self.rho, "rho", empty=True))
        _set(self, "rho", radii)
        named: dict[str, float] = {}
        for rho in radii:
            first = named.setdefault(radius_text(rho), rho)
            if first != rho:
                # one column, plot and label for two radii: one's values would hide the other's
                raise InputError(f"{_name('rho')} gives {first!r} and {rho!r}, which the "
                                 f"outputs both name rho{radius_text(rho)} (6 significant "
                                 "digits): give radii that differ within 6 digits")
        needs_radius = [m for m in self.measures if m != "relative_flatness"]
        if needs_radius and not radii:
            raise InputError(f"{_name('rho')} is required for {', '.join(needs_radius)}")
        if radii and not needs_radius:
            # relative flatness has no radius: a given one would be ignored without a word
            raise InputError(f"{_name('rho')} applies to every measure but relative_flatness, "
                             f"and {_name('measures')} gives relative_flatness only: leave "
                             f"{_name('rho')} out, or add a measure with a radius")

    def _check_measure_options(self, typed: Sequence[str]) -> None:
        """Refuse an option of some measures only given while none of them is measured (on the
        command line ``typed``, every option given; else those that differ from the default)."""
        given = (typed if _NAMING_OPTIONS.get() else
                 [name for name, (_, default) in _MEASURE_OPTIONS.items()
                  if getattr(self, name) != default])
        for name in given:
            needs = _MEASURE_OPTIONS[name][0]
            if not set(needs) & set(self.measures):
                option, measures = _name(name), _name("measures")
                raise InputError(f"{option} applies to {_listed(needs, 'and')} only, and "
                                 f"{measures} gives {', '.join(self.measures)}: add "
                                 f"{_listed(needs, 'or')} to {measures}, or leave {option} out")

    def _check_solver(self) -> None:
        if any(m in ASCENT_MEASURES for m in self.measures):
            return
        for option in self.solver.diagnostics():
            raise InputError(f"{option} needs an ascent measure (worst_case, adaptive or "
                             f"geodesic); {_name('measures')} gives {', '.join(self.measures)}")


@dataclass(frozen=True)
class BootstrapSettings:
    """The percentile bootstrap of a study's tau intervals (over its models).

    Attributes
    ----------
    resamples
        Bootstrap draws (0: no intervals).
    confidence
        Coverage of the intervals, in (0, 1).
    seed
        Seed of the draws.
    """

    resamples: int = 1000
    confidence: float = 0.95
    seed: int = 0

    @_input_errors
    def __post_init__(self) -> None:
        _set(self, "resamples", _integer(self.resamples, "BootstrapSettings.resamples", 0))
        _set(self, "confidence", float(check_real(_name("BootstrapSettings.confidence"),
                                                  self.confidence, "a number in (0, 1)",
                                                  lambda v: 0 < v < 1)))
        _set(self, "seed", _integer(self.seed, "BootstrapSettings.seed", 0))


@dataclass(frozen=True, kw_only=True)
class StudyConfig(SharpnessConfig):
    """Everything :func:`quotientsharp.workflows.run_study` needs besides the manifest: the
    sharpness settings (:class:`SharpnessConfig`; ``rho`` may hold several radii, each a
    point of the grid) and the study's own, checked when made.

    Attributes
    ----------
    data
        The data file every model is measured on (JSONL or ``torch.save``'d tensors).
    gap_from
        Rows with train and test data: the gap is ``test - train`` of the 0-1 ``"error"`` or
        of the ``"loss"`` (``None``: error with cross-entropy, loss with mse).
    out
        The results folder (``None``: ``results/<manifest stem>``).
    resume
        Keep the models already measured in ``out`` and measure only the missing ones.
    bootstrap
        The bootstrap of the tau intervals.
    color
        Colour the plots by this numeric column of the manifest.
    plots
        Write the scatter plots (needs matplotlib).
    threads
        Torch threads during the run, per rank (``None``: torch's), at most 4 per CPU
        (:func:`~quotientsharp.core.scalars.thread_limit`).

    Examples
    --------
    >>> config = StudyConfig(data="data.pt", measures=["adaptive", "geodesic"],
    ...                      rho=[0.05, 0.1], out="results/mine")
    >>> config.radii, config.gap_kind
    ((0.05, 0.1), 'error')
    """

    data: str | Path
    gap_from: str | None = None
    out: str | Path | None = None
    resume: bool = False
    bootstrap: BootstrapSettings = field(default_factory=BootstrapSettings)
    color: str | None = None
    plots: bool = True
    threads: int | None = None

    @_input_errors
    def __post_init__(self) -> None:
        _set(self, "threads", _integer(self.threads, "threads", 1, optional=True))
        if self.threads is not None:
            check_thread_count(_name("threads"), self.threads)
        super().__post_init__()
        _text(self.data, "data", optional=False, path=True)
        _text(self.gap_from, "gap_from")
        _text(self.out, "out", path=True)
        if self.out is not None and not os.fspath(self.out).strip():
            # Path("") is the working directory: the results would land there unasked
            raise InputError(f"{_name('out')} needs a folder path, got {os.fspath(self.out)!r}")
        check_flag(_name("resume"), self.resume)
        _part(self.bootstrap, BootstrapSettings, "bootstrap")
        _text(self.color, "color")
        check_flag(_name("plots"), self.plots)
        self.gap_kind    # noqa: B018 (checked now, not when the first gap is computed)

    @property
    def gap_kind(self) -> str:
        """What the gap is computed from: ``gap_from``, or by default ``"error"`` with
        cross-entropy and ``"loss"`` with mse (where there is no 0-1 error)."""
        loss = self.batches.loss
        kind = self.gap_from or ("error" if loss == "cross_entropy" else "loss")
        _choice(kind, "gap_from", ("error", "loss"), "error or loss")
        if kind == "error" and loss != "cross_entropy":
            gap_from, loss_name = _name("gap_from"), _name("BatchSettings.loss")
            raise InputError(f"{gap_from} error needs class labels ({loss_name} cross_entropy); "
                             f"with {loss_name} mse use {gap_from} loss")
        return kind


@dataclass(frozen=True)
class MeasureRun:
    """One call of :func:`quotientsharp.sharpness`: a measure and, for geodesic sharpness, one
    metric and order. ``key`` names its entry in the JSON document."""

    key: str
    measure: str
    variant: dict[str, Any] = field(default_factory=dict)


def measure_runs(config: SharpnessConfig) -> list[MeasureRun]:
    """The calls to make: one per measure, keyed by its name, and one per metric and order for
    geodesic (keyed ``geodesic_{metric}_order{order}`` where there are several)."""
    runs: list[MeasureRun] = []
    for measure in config.measures:
        if measure != "geodesic":
            runs.append(MeasureRun(measure, measure))
            continue
        variants = [(m, o) for m in config.metrics or () for o in config.orders or ()]
        for metric, order in variants:
            key = "geodesic" if len(variants) == 1 else f"geodesic_{metric}_order{order}"
            runs.append(MeasureRun(key, measure, {"metric": metric, "order": order}))
    return runs


def options_for(run: MeasureRun, config: SharpnessConfig,
                symmetries: Sequence[Any] | None = None) -> dict[str, Any]:
    """Keyword options of :func:`quotientsharp.sharpness` for one run of ``config``; with the
    bindings of a user's symmetry (``symmetries=`` of the API), ``metric`` and ``eps`` are left
    out, as their quotients bring their own metric."""
    measure = run.measure
    options: dict[str, Any] = {"loss": config.batches.loss, "seed": config.seed,
                               "progress": config.progress, "nonfinite": config.nonfinite}
    if measure in ASCENT_MEASURES:
        options.update(config.solver.options())
    if measure == "geodesic" and symmetries:
        options.update(order=run.variant["order"], symmetries=symmetries)
    elif measure == "geodesic":
        options.update(metric=run.variant["metric"], order=run.variant["order"], eps=config.eps)
    if measure in ("worst_case", "adaptive"):
        options["p"] = config.p
    if measure == "average":
        options["samples"] = config.samples
    if measure == "relative_flatness":
        options["layer"] = config.layer
    return options
