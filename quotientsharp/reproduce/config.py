"""What each paper study is asked to do: one frozen configuration per kind of study, torch-free.

A study module's ``run(config) -> int`` takes one of these (built by the command line from
its options, or directly by a script: docs/cli.md). A field left at its default means what the
command does without the option. Each field is checked when made: a wrong type (a bool for an
integer included) raises ``TypeError``, a value out of range ``ValueError``, the message
starting with the field's name. Paths are stored as :class:`~pathlib.Path`, lists of names or
radii as tuples (from a sequence or a comma-separated string alike).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


def _check_flag(name: str, value: Any, optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool (or, when ``optional``, ``None``)."""
    if not (isinstance(value, bool) or (optional and value is None)):
        raise TypeError(f"{name} must be True or False{' or None' if optional else ''}, "
                        f"got {value!r}")


def _check_integer(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is an integer (not a bool; or, when ``optional``,
    ``None``), ``ValueError`` when it is below ``minimum``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _as_path(name: str, value: Any) -> Path | None:
    """``value`` (``None``, a ``str`` or a path) as a :class:`~pathlib.Path`."""
    if value is None or isinstance(value, Path):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a path (str or Path) or None, got {value!r}")
    return Path(value)


def _as_names(name: str, value: Any) -> tuple[str, ...] | None:
    """``value`` (``None``, ``"a, b"`` or a sequence of strings) as a tuple of stripped,
    non-empty names; ``ValueError`` when none is left."""
    if value is None:
        return None
    entries = value.split(",") if isinstance(value, str) else value
    if not isinstance(entries, Sequence) or not all(isinstance(e, str) for e in entries):
        raise TypeError(f"{name} must be a comma-separated string or a sequence of strings, "
                        f"got {value!r}")
    names = tuple(entry.strip() for entry in entries if entry.strip())
    if not names:
        raise ValueError(f"{name} must name at least one entry, got {value!r}")
    return names


@dataclass(frozen=True)
class ReproduceConfig:
    """What every study shares: where its results go, how it runs, its seed.

    Attributes
    ----------
    out
        Results folder (``None``: ``results/NAME`` or ``results/NAME-quick``).
    resume, plots, progress
        Keep the units already in ``out``; write the figures; progress bars (``None``: on a
        terminal only).
    docs
        A docs folder: also write ``docs/results/NAME.md`` and regenerate ``docs/results.md``.
    threads, seed, quick
        torch threads (>= 1), the study seed (>= 0), the reduced variant (a smoke run).
    device
        torch device of the families' training and measuring (checked when the study runs).
    """

    #: Fields the study does not read; a value other than the default is refused.
    IGNORED: ClassVar[tuple[str, ...]] = ()

    out: Path | None = None
    resume: bool = False
    plots: bool = True
    progress: bool | None = None
    docs: Path | None = None
    threads: int = 1
    seed: int = 0
    quick: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("resume", "plots", "quick"):
            _check_flag(name, getattr(self, name))
        _check_flag("progress", self.progress, optional=True)
        _check_integer("threads", self.threads, 1)
        _check_integer("seed", self.seed, 0)
        if not isinstance(self.device, str) or not self.device:
            raise (ValueError if isinstance(self.device, str) else TypeError)(
                f"device must be a torch device name, got {self.device!r}")
        for name in ("out", "docs"):
            object.__setattr__(self, name, _as_path(name, getattr(self, name)))
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        for name in self.IGNORED:
            if getattr(self, name) != defaults[name]:
                raise ValueError(f"{name}: {type(self).__name__} does not use it (leave it at "
                                 f"{defaults[name]!r}), got {getattr(self, name)!r}")


def check_config(config: object, expected: type[ReproduceConfig], study: str) -> None:
    """Raise ``TypeError`` unless ``config`` is an ``expected`` (the configuration of
    ``reproduce study``'s ``run``)."""
    if not isinstance(config, expected):
        raise TypeError(f"reproduce {study}: run takes a {expected.__name__}, got "
                        f"{type(config).__name__}")


@dataclass(frozen=True)
class DiagonalConfig(ReproduceConfig):
    """``reproduce diagonal``.

    Attributes
    ----------
    nets
        Number of nets, >= 1 (``None``: 50, or 12 with ``quick``).
    full
        Also run the data seeds, the rho sweep and a training set per net.
    rhos, per_net_seeds
        With ``full``: the radii of the rho sweep, numbers > 0 (a sequence or a
        comma-separated string) that must contain the study's 0.1 (``None``: 0.03, 0.1, 0.3);
        the training-set-per-net variant on the first N data seeds only (``None``: all).
    """

    nets: int | None = None
    full: bool = False
    rhos: tuple[float, ...] | None = None
    per_net_seeds: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_integer("nets", self.nets, 1, optional=True)
        _check_flag("full", self.full)
        _check_integer("per_net_seeds", self.per_net_seeds, 0, optional=True)
        object.__setattr__(self, "rhos", _as_radii(self.rhos))


def _as_radii(value: Any) -> tuple[float, ...] | None:
    """``rhos`` (``None``, ``"0.03, 0.1"`` or a sequence of numbers) as a tuple of floats,
    each finite and > 0."""
    if value is None:
        return None
    entries: Any = _as_names("rhos", value) if isinstance(value, str) else value
    if not isinstance(entries, Sequence) or any(
            isinstance(e, bool) or not isinstance(e, (int, float, str)) for e in entries):
        raise TypeError(f"rhos must be a comma-separated string or a sequence of numbers, "
                        f"got {value!r}")
    try:
        radii = tuple(float(entry) for entry in entries)
    except ValueError as err:
        raise ValueError(f"rhos: {err}") from err
    if not radii or not all(math.isfinite(r) and r > 0 for r in radii):
        raise ValueError(f"rhos must be finite numbers > 0, got {value!r}")
    return radii


@dataclass(frozen=True)
class FamilyConfig(ReproduceConfig):
    """``reproduce vit``, ``bert``, ``vit-finetune``, ``minilm`` and ``lora``.

    Attributes
    ----------
    models
        Number of models, >= 1 (``None``: the variant's).
    study_seeds
        Replicate over this many study seeds from ``seed``, >= 1 (``None``: the single-seed
        study).
    n_iter, sharpness_points, sharpness_batch_size
        The measurement's sizes, >= 1 (``None``: the variant's).
    """

    models: int | None = None
    study_seeds: int | None = None
    n_iter: int | None = None
    sharpness_points: int | None = None
    sharpness_batch_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("models", "study_seeds", "n_iter", "sharpness_points",
                     "sharpness_batch_size"):
            _check_integer(name, getattr(self, name), 1, optional=True)


@dataclass(frozen=True)
class InvarianceConfig(ReproduceConfig):
    """``reproduce invariance``.

    Attributes
    ----------
    dtypes
        Model precisions from ``float64``, ``float32``, ``bfloat16``, as a sequence or a
        comma-separated string (``None``: all three).
    measures
        Keys of the measures to run (see ``reproduce invariance --help``), as a sequence or a
        comma-separated string (``None``: the variant's).
    """

    dtypes: tuple[str, ...] | None = None
    measures: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        # torch-free: the study module imports torch only inside its functions
        from quotientsharp.reproduce.invariance.study import check_measures, parse_dtypes

        super().__post_init__()
        dtypes = _as_names("dtypes", self.dtypes)
        object.__setattr__(self, "dtypes", None if dtypes is None else parse_dtypes(dtypes))
        measures = _as_names("measures", self.measures)
        if measures is not None:
            check_measures(measures)
        object.__setattr__(self, "measures", measures)


@dataclass(frozen=True)
class ReachConfig(ReproduceConfig):
    """``reproduce reach``: uses ``out``, ``resume``, ``docs``, ``threads``, ``seed`` and
    ``quick``; it writes no figures, shows no bars and runs on the CPU, so ``plots``,
    ``progress`` and ``device`` are refused unless left at their defaults."""

    IGNORED: ClassVar[tuple[str, ...]] = ("plots", "progress", "device")


@dataclass(frozen=True)
class SummaryConfig(ReproduceConfig):
    """``reproduce summary``: uses ``docs`` only, the folder whose headline files it reads and
    whose summary it rewrites; the other fields are refused unless left at their defaults."""

    IGNORED: ClassVar[tuple[str, ...]] = ("out", "resume", "plots", "progress", "threads",
                                          "seed", "quick", "device")

    docs: Path | None = Path("docs")
