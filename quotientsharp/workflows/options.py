"""What to measure and how: the typed, self-validating settings of ``measure`` and ``study``.

:class:`SharpnessConfig` says which measures to run (with their radii, metrics and orders) and
with which options; :class:`BatchSettings` how a data file becomes batches and
:class:`SolverSettings` how the ascent measures solve. Each checks itself when it is made: a
bad value raises :class:`InputError` (one line on stderr, exit status 2 on the command line),
whose text names the command-line option that sets it. :func:`measure_runs` and
:func:`options_for` turn a configuration into the calls of :func:`quotientsharp.sharpness`.

The command-line options that fill these settings are declared in
:mod:`quotientsharp.cli.sharpness_options`; the library takes the settings themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ASCENT_MEASURES = ("worst_case", "adaptive", "geodesic")
#: The measures of :func:`quotientsharp.sharpness` (``tests/test_cli_measure.py`` holds this
#: list to ``quotientsharp.engine.MEASURES``; it is repeated here so that checking
#: ``--measure`` imports no torch).
MEASURE_NAMES = ("average", "worst_case", "adaptive", "geodesic", "relative_flatness")
METRICS = ("inv", "mix", "euclidean")
LOSSES = ("cross_entropy", "mse")
DTYPES = ("float32", "float64")


class InputError(ValueError):
    """Bad user input: reported as one line on stderr, exit status 2."""


def _positive_int(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise InputError(f"{option} must be an integer >= 1, got {value}")


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

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise InputError(f"--loss must be cross_entropy or mse, got {self.loss!r}")
        for value, option in ((self.batch_size, "--batch-size"),
                              (self.max_batches, "--max-batches"),
                              (self.max_length, "--max-length")):
            _positive_int(value, option)
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
    """

    n_iter: int = 20
    blockwise: bool = False
    compile_steps: bool = False
    reference_n_iter: int | None = None
    reference_restarts: int | None = None

    def __post_init__(self) -> None:
        _positive_int(self.n_iter, "--n-iter")
        _positive_int(self.reference_n_iter, "--reference-n-iter")
        if self.reference_restarts is not None and self.reference_restarts < 0:
            raise InputError(f"--reference-restarts must be an integer >= 0, got "
                             f"{self.reference_restarts}")

    def diagnostics(self) -> list[str]:
        """The command-line options of the diagnostics asked for (they need an ascent
        measure)."""
        return [option for given, option in (
            (self.blockwise, "--blockwise"), (self.compile_steps, "--compile-steps"),
            (self.reference_n_iter is not None, "--reference-n-iter"),
            (self.reference_restarts is not None, "--reference-restarts")) if given]

    def options(self) -> dict[str, Any]:
        """Keyword options of :func:`quotientsharp.sharpness` for an ascent measure."""
        options: dict[str, Any] = {"n_iter": self.n_iter}
        if self.blockwise:
            options["blockwise"] = True
        if self.compile_steps:
            options["compile_steps"] = True
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
    if isinstance(requested, str):
        requested = [requested]
    names: list[str] = []
    for item in requested or ["geodesic"]:
        for part in item.split(","):
            part = part.strip()
            name = aliases.get(part, part)
            if name not in MEASURE_NAMES:
                raise InputError(f"--measure: unknown measure {part!r}; choose from "
                                 f"{', '.join(sorted(MEASURE_NAMES))}")
            if name not in names:
                names.append(name)
    return names


def _order(value: int | str) -> int | str:
    """A geodesic order: 1, 2 (also as text) or ``"exact"``."""
    if value in ("1", "2") or (value in (1, 2) and not isinstance(value, bool)):
        return int(value)
    if value == "exact":
        return value
    raise InputError(f"--order must be 1, 2 or exact (or a comma list of them), got {value!r}")


def _p(value: object) -> str:
    """The norm of worst-case and adaptive sharpness as ``"2"`` or ``"inf"``."""
    if value in ("2", "inf") or (value == 2 and not isinstance(value, (bool, str))):
        return str(value) if isinstance(value, str) else "2"
    if isinstance(value, float) and value == math.inf:
        return "inf"
    raise InputError(f"--p must be 2 or inf, got {value!r}")


def _radii(rho: float | Sequence[float] | None) -> tuple[float, ...]:
    """The radii as floats, in order, without repeats."""
    if rho is None:
        return ()
    if isinstance(rho, (int, float)):
        return (float(rho),)
    return tuple(dict.fromkeys(float(value) for value in rho))


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
        The radius, or several (a study measures each); stored as a tuple of floats. Required
        except for relative flatness.
    metrics, orders
        Geodesic sharpness: the metrics (``"inv"``, ``"mix"``, ``"euclidean"``) and orders
        (1, 2, ``"exact"``) to measure with, each pair one measurement.
    symmetry
        Geodesic sharpness: ``"MODULE:FUNCTION"``, a symmetry of your own (its bindings
        measure with their own quotients' metric, so one metric at most).
    eps
        Geodesic sharpness: the Gram relaxation ``G^T G + eps I``.
    p
        Worst-case and adaptive sharpness: ``"2"`` or ``"inf"`` (the numbers 2 and
        ``math.inf`` are read as these).
    samples
        Average sharpness: Gaussian draws per batch.
    layer
        Relative flatness: the module (``None``: the last ``nn.Linear``).
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
    """

    measures: Sequence[str] = ("geodesic",)
    rho: float | Sequence[float] | None = ()
    metrics: Sequence[str] = ("inv",)
    orders: Sequence[int | str] = (2,)
    symmetry: str | None = None
    eps: float = 0.0
    p: str = "2"
    samples: int = 1
    layer: str | None = None
    seed: int = 0
    batches: BatchSettings = field(default_factory=BatchSettings)
    solver: SolverSettings = field(default_factory=SolverSettings)
    dtype: str | None = None
    device: str = "cpu"
    progress: bool | None = None

    def __post_init__(self) -> None:
        _set(self, "measures", tuple(measure_names(self.measures)))
        _set(self, "metrics", tuple(dict.fromkeys(
            [self.metrics] if isinstance(self.metrics, str) else self.metrics)))
        self._check_metrics()
        _set(self, "p", _p(self.p))
        _positive_int(self.samples, "--samples")
        if self.seed < 0:
            raise InputError(f"--seed must be >= 0, got {self.seed}")
        self._check_radii()
        _set(self, "eps", float(self.eps))
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise InputError(f"--eps must be a finite number >= 0, got {self.eps}")
        _set(self, "orders", tuple(dict.fromkeys(_order(order) for order in (
            [self.orders] if isinstance(self.orders, (int, str)) else self.orders))))
        self._check_solver()
        if self.dtype not in (None, *DTYPES):
            raise InputError(f"--dtype must be float32 or float64, got {self.dtype!r}")

    @property
    def radii(self) -> tuple[float, ...]:
        """The radii, as a tuple (``rho`` after the checks)."""
        return self.rho  # type: ignore[return-value]

    def _check_metrics(self) -> None:
        for metric in self.metrics:
            if metric not in METRICS:
                raise InputError(f"--metric must be inv, mix or euclidean (or a comma list of "
                                 f"them), got {metric!r}")
        if self.symmetry is not None and "geodesic" in self.measures and len(self.metrics) > 1:
            # each metric would give the same value under a different label
            raise InputError(f"--metric {','.join(self.metrics)}: with --symmetry "
                             f"{self.symmetry} geodesic sharpness measures with the metric of "
                             "each binding's own quotient, so every --metric gives the same "
                             "value; leave --metric out (or give one)")

    def _check_radii(self) -> None:
        radii = _radii(self.rho)
        _set(self, "rho", radii)
        needs_radius = [m for m in self.measures if m != "relative_flatness"]
        if needs_radius and not radii:
            raise InputError(f"--rho is required for {', '.join(needs_radius)}")
        for rho in radii:
            if not (math.isfinite(rho) and rho > 0):
                raise InputError(f"--rho must be a finite number > 0, got {rho}")

    def _check_solver(self) -> None:
        if any(m in ASCENT_MEASURES for m in self.measures):
            return
        for option in self.solver.diagnostics():
            raise InputError(f"{option} needs an ascent measure (worst_case, adaptive or "
                             f"geodesic); --measure gives {', '.join(self.measures)}")


#: What a study's gap is computed from: ``error`` (0-1, class labels) or ``loss``.
GAP_KINDS = ("error", "loss")


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

    def __post_init__(self) -> None:
        if self.resamples < 0:
            raise InputError(f"--bootstrap must be >= 0, got {self.resamples}")
        if not 0 < self.confidence < 1:
            raise InputError(f"--confidence must be in (0, 1), got {self.confidence}")
        if self.seed < 0:
            raise InputError(f"--bootstrap-seed must be >= 0, got {self.seed}")


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
        Torch threads during the run, per rank (``None``: torch's).

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

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise InputError(f"--threads must be >= 1, got {self.threads}")
        super().__post_init__()
        self.gap_kind    # noqa: B018 (checked now, not when the first gap is computed)

    @property
    def gap_kind(self) -> str:
        """What the gap is computed from: ``gap_from``, or by default ``"error"`` with
        cross-entropy and ``"loss"`` with mse (where there is no 0-1 error)."""
        loss = self.batches.loss
        kind = self.gap_from or ("error" if loss == "cross_entropy" else "loss")
        if kind not in GAP_KINDS:
            raise InputError(f"--gap-from must be error or loss, got {kind!r}")
        if kind == "error" and loss != "cross_entropy":
            raise InputError("--gap-from error needs class labels (--loss cross_entropy); with "
                             "--loss mse use --gap-from loss")
        return kind


@dataclass(frozen=True)
class MeasureRun:
    """One call of :func:`quotientsharp.sharpness`: a measure and, for geodesic sharpness, one
    metric and order. ``key`` names its entry in the JSON document."""

    key: str
    measure: str
    variant: dict[str, Any] = field(default_factory=dict)


def measure_runs(config: SharpnessConfig) -> list[MeasureRun]:
    """The calls to make: one per measure, and one per metric and order for geodesic.

    The JSON key is the measure's name, except for geodesic sharpness with several metrics or
    orders: ``geodesic_{metric}_order{order}`` (e.g. ``geodesic_mix_order2``) for each.
    """
    runs: list[MeasureRun] = []
    for measure in config.measures:
        if measure != "geodesic":
            runs.append(MeasureRun(measure, measure))
            continue
        variants = [(m, o) for m in config.metrics for o in config.orders]
        for metric, order in variants:
            key = "geodesic" if len(variants) == 1 else f"geodesic_{metric}_order{order}"
            runs.append(MeasureRun(key, measure, {"metric": metric, "order": order}))
    return runs


def options_for(run: MeasureRun, config: SharpnessConfig,
                symmetries: Sequence[Any] | None = None) -> dict[str, Any]:
    """Keyword options of :func:`quotientsharp.sharpness` for one run.

    Parameters
    ----------
    run
        The measure (and geodesic metric and order).
    config
        The settings.
    symmetries
        Geodesic sharpness: the bindings of the user's symmetry (``symmetries=`` of the API),
        if any; their quotients bring their own metric, so ``metric`` and ``eps`` are left out.
    """
    measure = run.measure
    options: dict[str, Any] = {"loss": config.batches.loss, "seed": config.seed,
                               "progress": config.progress}
    if measure in ASCENT_MEASURES:
        options.update(config.solver.options())
    if measure == "geodesic" and symmetries:
        options.update(order=run.variant["order"], symmetries=symmetries)
    elif measure == "geodesic":
        options.update(metric=run.variant["metric"], order=run.variant["order"], eps=config.eps)
    if measure in ("worst_case", "adaptive"):
        options["p"] = 2 if config.p == "2" else "inf"
    if measure == "average":
        options["samples"] = config.samples
    if measure == "relative_flatness" and config.layer is not None:
        options["layer"] = config.layer
    return options
