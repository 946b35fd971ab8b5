"""What each paper study is asked to do: one frozen configuration per kind of study, torch-free,
and the one skeleton of a study's ``run(config)`` (:func:`run_study_command`).

Every field is checked when made (a wrong type raises ``TypeError``, a value out of range
``ValueError``, the message naming the field); paths are stored as :class:`~pathlib.Path`, lists
of names or radii as tuples (from a sequence or a comma-separated string alike).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from quotientsharp.core.scalars import check_flag, check_thread_count
from quotientsharp.reproduce.invariance.report import check_measures, parse_dtypes

Outcome = TypeVar("Outcome")


def _check_integer(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    """``TypeError`` unless ``value`` is an integer (or optional ``None``), ``ValueError`` below
    ``minimum``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _as_path(name: str, value: Any) -> Path | None:
    if value is None or isinstance(value, Path):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a path (str or Path) or None, got {value!r}")
    if not value.strip():
        # Path("") is the working directory: the results would land there unasked
        raise ValueError(f"{name} needs a folder path, got {value!r}")
    return Path(value)


def _as_names(name: str, value: Any) -> tuple[str, ...] | None:
    """``value`` (``None``, ``"a, b"`` or a sequence of strings) as a tuple of names."""
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
    """What every study shares, named like the command's options: ``out`` (``None``:
    ``results/NAME[-quick]``), ``resume``, ``plots``, ``progress`` (``None``: on a terminal),
    ``docs`` (a docs folder to render the page into), ``threads``, ``seed``, ``quick`` and the
    families' ``device`` (checked when the study runs)."""

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
            check_flag(name, getattr(self, name))
        check_flag("progress", self.progress, optional=True)
        _check_integer("threads", self.threads, 1)
        check_thread_count("threads", self.threads)
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
    """``TypeError`` unless ``config`` is an ``expected``, the configuration of ``study``."""
    if not isinstance(config, expected):
        raise TypeError(f"reproduce {study}: run takes a {expected.__name__}, got "
                        f"{type(config).__name__}")


def run_study_command(name: str, units: str, out: Path, compute: Callable[[], Outcome],
                      report: Callable[[Outcome], None]) -> int:
    """Run study ``name``'s ``compute`` and ``report`` its outcome on rank 0; the exit status:
    0, 130 when interrupted (the finished ``units`` are kept in ``out``), 2 for a refused
    setting or folder."""
    from quotientsharp.workflows.records import is_main_rank

    try:
        outcome = compute()
    except KeyboardInterrupt:
        if is_main_rank():
            print(f"\ninterrupted: finished {units} are kept in {out}; continue with --resume",
                  file=sys.stderr)
        return 130
    except (ValueError, NotADirectoryError) as err:
        if is_main_rank():
            print(f"quotientsharp reproduce {name}: error: {err}", file=sys.stderr)
        return 2
    if is_main_rank():
        report(outcome)
    return 0


@dataclass(frozen=True)
class DiagonalConfig(ReproduceConfig):
    """``reproduce diagonal``: ``nets`` (``None``: 50, 12 with ``quick``); ``full`` with its
    ``rhos`` (``None``: 0.03, 0.1, 0.3; they must contain 0.1) and ``per_net_seeds`` (the
    training set per net on the first N data seeds; ``None``: all)."""

    nets: int | None = None
    full: bool = False
    rhos: tuple[float, ...] | None = None
    per_net_seeds: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # a rank correlation needs pairs: one net ended deep in the study with a traceback
        _check_integer("nets", self.nets, 2, optional=True)
        check_flag("full", self.full)
        _check_integer("per_net_seeds", self.per_net_seeds, 0, optional=True)
        object.__setattr__(self, "rhos", _as_radii(self.rhos))


def _as_radii(value: Any) -> tuple[float, ...] | None:
    """``rhos`` (``None``, ``"0.03, 0.1"`` or a sequence of numbers) as a tuple of floats > 0."""
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
    """``reproduce vit``, ``bert``, ``vit-finetune``, ``minilm`` and ``lora``: ``models``,
    ``study_seeds`` (replicate over this many study seeds from ``seed``), ``n_iter``,
    ``sharpness_points`` and ``sharpness_batch_size`` (``None``: the variant's)."""

    models: int | None = None
    study_seeds: int | None = None
    n_iter: int | None = None
    sharpness_points: int | None = None
    sharpness_batch_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # a Kendall tau needs pairs of models: one model gives every tau undefined
        _check_integer("models", self.models, 2, optional=True)
        for name in ("study_seeds", "n_iter", "sharpness_points", "sharpness_batch_size"):
            _check_integer(name, getattr(self, name), 1, optional=True)


@dataclass(frozen=True)
class InvarianceConfig(ReproduceConfig):
    """``reproduce invariance``: ``dtypes`` among ``float64``, ``float32``, ``bfloat16``
    (``None``: all three) and the keys of the ``measures`` to run (``None``: the variant's)."""

    dtypes: tuple[str, ...] | None = None
    measures: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        dtypes = _as_names("dtypes", self.dtypes)
        object.__setattr__(self, "dtypes", None if dtypes is None else parse_dtypes(dtypes))
        measures = _as_names("measures", self.measures)
        if measures is not None:
            check_measures(measures)
        object.__setattr__(self, "measures", measures)


@dataclass(frozen=True)
class ReachConfig(ReproduceConfig):
    """``reproduce reach``: no figures, no bars, on the CPU (``plots``, ``progress`` and
    ``device`` are refused unless left at their defaults)."""

    IGNORED: ClassVar[tuple[str, ...]] = ("plots", "progress", "device")


@dataclass(frozen=True)
class SummaryConfig(ReproduceConfig):
    """``reproduce summary``: uses ``docs`` only (the other fields must keep their defaults)."""

    IGNORED: ClassVar[tuple[str, ...]] = ("out", "resume", "plots", "progress", "threads",
                                          "seed", "quick", "device")

    docs: Path | None = Path("docs")
