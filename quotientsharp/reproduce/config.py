"""What each paper study is asked to do: one frozen configuration per kind of study, torch-free.

A study module's ``run(config) -> int`` takes one of these (the command line builds it from its
options in :mod:`quotientsharp.cli.reproduce_options`; a script can build it directly).
Every field left at its default means what the command does without the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StudyConfig:
    """What every study shares: where its results go, how it runs, its seed.

    Attributes
    ----------
    out
        Results folder (``None``: the study's default, ``results/NAME`` or
        ``results/NAME-quick``).
    resume
        Keep the units already in ``out`` and compute only the missing ones.
    plots
        Write the figures.
    progress
        Progress bars (``None``: on a terminal only).
    docs
        A docs folder: also write ``docs/results/NAME.md`` and regenerate ``docs/results.md``.
    threads
        torch threads during the run.
    seed
        The study seed.
    quick
        The reduced variant (a smoke run, not a result).
    device
        torch device of training and measuring (the studies that train on one: the families).
    """

    out: Path | None = None
    resume: bool = False
    plots: bool = True
    progress: bool | None = None
    docs: Path | None = None
    threads: int = 1
    seed: int = 0
    quick: bool = False
    device: str = "cpu"


@dataclass(frozen=True)
class DiagonalConfig(StudyConfig):
    """``reproduce diagonal``.

    Attributes
    ----------
    nets
        Number of nets (``None``: 50, or 12 with ``quick``).
    full
        Also run the data seeds, the rho sweep and a training set per net.
    rhos
        With ``full``: the radii of the rho sweep (``None``: 0.03, 0.1, 0.3).
    per_net_seeds
        With ``full``: the training-set-per-net variant on the first N data seeds only
        (``None``: all).
    """

    nets: int | None = None
    full: bool = False
    rhos: tuple[float, ...] | None = None
    per_net_seeds: int | None = None


@dataclass(frozen=True)
class FamilyConfig(StudyConfig):
    """``reproduce vit``, ``bert``, ``vit-finetune``, ``minilm`` and ``lora``.

    Attributes
    ----------
    models
        Number of models (``None``: the variant's).
    study_seeds
        Replicate over this many study seeds from ``seed`` (``None``: the single-seed study).
    n_iter, sharpness_points, sharpness_batch_size
        The measurement's sizes (``None``: the variant's).
    """

    models: int | None = None
    study_seeds: int | None = None
    n_iter: int | None = None
    sharpness_points: int | None = None
    sharpness_batch_size: int | None = None


@dataclass(frozen=True)
class InvarianceConfig(StudyConfig):
    """``reproduce invariance``.

    Attributes
    ----------
    dtypes
        Model precisions, comma-separated or a sequence (``None``: all three).
    measures
        Keys of the measures to run (``None``: the variant's).
    """

    dtypes: str | tuple[str, ...] | None = None
    measures: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ReachConfig(StudyConfig):
    """``reproduce reach``: the common fields only (no figures, no bars)."""


@dataclass(frozen=True)
class SummaryConfig(StudyConfig):
    """``reproduce summary``: only ``docs`` counts, the folder whose headline files it reads
    and whose summary it rewrites."""

    docs: Path | None = Path("docs")
