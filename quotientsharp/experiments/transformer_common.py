"""Training and measuring code shared by the ViT and BERT family studies.

A *family study* (``reproduce vit``, ``reproduce bert``) trains ``M`` small transformers whose
hyperparameters are drawn at random per model, measures each model's generalisation gap
(test error minus train error, 0-1 errors) and its sharpness under several measures on one fixed
set of training points, and reports Kendall's tau between gap and sharpness per measure
(SPEC section 7).

Protocol, shared by both families:

- a fixed *training pool* and a fixed *test set* (the family's data); model ``i`` trains on the
  first ``train_size_i`` points of the pool. The sharpness points are the first
  ``sharpness_points`` points of the pool, so they lie in every model's training set;
- the hyperparameters of model ``i`` are drawn from ``numpy.random.default_rng([seed, i])``:
  they depend only on the study seed and the index, so a resumed or partial run draws the same
  ones (no seed picking: models are never filtered or redrawn);
- training: AdamW, batch size ``batch_size``, linear warm-up over the first 5% of the steps then
  cosine decay to zero, cross-entropy with label smoothing, dropout off; the initialisation and
  the order of the minibatches come from ``torch.manual_seed(init_seed_i)``;
- sharpness: every measure of :data:`FAMILY_MEASURES` on the same batches, through
  :func:`quotientsharp.sharpness` with ``seed=0`` (deterministic ascent from ``xi = 0``).

Everything runs on the CPU with ``torch.set_num_threads(threads)`` (1 by default: these models
are tiny and several threads only add synchronisation).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FAMILY_MEASURES",
    "ClassificationData",
    "HyperparameterSpace",
    "Hyperparameters",
    "MeasureSpec",
    "draw_hyperparameters",
    "error_rate",
    "mean_loss",
    "measure_model",
    "sharpness_batches",
    "train_classifier",
]

Inputs = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------- data
@dataclass
class ClassificationData:
    """A training pool and a test set, inputs as keyword tensors of the model's forward.

    Attributes
    ----------
    train_inputs, test_inputs
        Keyword inputs, every tensor batched on dim 0 (e.g. ``{"pixel_values": [N, 1, 8, 8]}``
        or ``{"input_ids": [N, T], "attention_mask": [N, T]}``).
    train_labels, test_labels
        Class indices, ``shape=[N]`` (int64).
    num_labels
        Number of classes.
    description
        What the data is, for the docs and ``run.json``.
    """

    train_inputs: Inputs
    train_labels: torch.Tensor
    test_inputs: Inputs
    test_labels: torch.Tensor
    num_labels: int
    description: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for which, inputs, labels in (("train", self.train_inputs, self.train_labels),
                                      ("test", self.test_inputs, self.test_labels)):
            sizes = {int(t.shape[0]) for t in inputs.values()} | {int(labels.shape[0])}
            if len(sizes) != 1:
                raise ValueError(f"{which} inputs and labels disagree on the number of points: "
                                 f"{sorted(sizes)}")

    @property
    def pool_size(self) -> int:
        return int(self.train_labels.shape[0])


def take(inputs: Mapping[str, torch.Tensor], index: torch.Tensor | slice) -> Inputs:
    """Rows ``index`` of every input tensor."""
    return {name: tensor[index] for name, tensor in inputs.items()}


def sharpness_batches(data: ClassificationData, points: int, batch_size: int) -> list[dict]:
    """The fixed sharpness batches: the first ``points`` pool points, ``batch_size`` at a time.

    Returns
    -------
    list[dict]
        HuggingFace-style batches (keyword inputs plus ``"labels"``), ``points / batch_size`` of
        them (``points`` must be a multiple of ``batch_size``).
    """
    if points < 1 or batch_size < 1 or points % batch_size:
        raise ValueError(f"sharpness points ({points}) must be a positive multiple of the "
                         f"sharpness batch size ({batch_size})")
    if points > data.pool_size:
        raise ValueError(f"sharpness points ({points}) exceed the training pool "
                         f"({data.pool_size})")
    return [{**take(data.train_inputs, slice(start, start + batch_size)),
             "labels": data.train_labels[start:start + batch_size]}
            for start in range(0, points, batch_size)]


# ---------------------------------------------------------------------------- hyperparameters
@dataclass(frozen=True)
class HyperparameterSpace:
    """Ranges the per-model hyperparameters are drawn from (all bounds inclusive).

    Learning rate and weight decay are log-uniform, label smoothing uniform, epochs and the
    training-set size uniform integers.
    """

    learning_rate: tuple[float, float]
    weight_decay: tuple[float, float]
    epochs: tuple[int, int]
    label_smoothing: tuple[float, float]
    train_size: tuple[int, int]

    def __post_init__(self) -> None:
        for name in ("learning_rate", "weight_decay"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} range must satisfy 0 < low <= high, got {(low, high)}")
        for name in ("epochs", "train_size", "label_smoothing"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} range must satisfy 0 <= low <= high, got "
                                 f"{(low, high)}")

    def as_dict(self) -> dict[str, list]:
        return {name: list(bounds) for name, bounds in asdict(self).items()}


@dataclass(frozen=True)
class Hyperparameters:
    """One model's training settings, drawn by :func:`draw_hyperparameters`."""

    learning_rate: float
    weight_decay: float
    epochs: int
    label_smoothing: float
    train_size: int
    init_seed: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def draw_hyperparameters(space: HyperparameterSpace, seed: int, index: int) -> Hyperparameters:
    """The hyperparameters of model ``index``: a function of ``(seed, index)`` only."""
    rng = np.random.default_rng([seed, index])

    def log_uniform(bounds: tuple[float, float]) -> float:
        return float(math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]))))

    return Hyperparameters(
        learning_rate=log_uniform(space.learning_rate),
        weight_decay=log_uniform(space.weight_decay),
        epochs=int(rng.integers(space.epochs[0], space.epochs[1], endpoint=True)),
        label_smoothing=float(rng.uniform(*space.label_smoothing)),
        train_size=int(rng.integers(space.train_size[0], space.train_size[1], endpoint=True)),
        init_seed=int(rng.integers(0, 2**31 - 1)),
    )


# ---------------------------------------------------------------------------- training
def _logits(model: nn.Module, inputs: Inputs) -> torch.Tensor:
    output = model(**inputs)
    return output.logits if hasattr(output, "logits") else output


def train_classifier(model: nn.Module, data: ClassificationData, hyper: Hyperparameters,
                     batch_size: int, tick: Callable[[], None] | None = None) -> float:
    """Train ``model`` in place on the first ``hyper.train_size`` pool points.

    AdamW (``lr``, decoupled ``weight_decay``), warm-up over the first 5% of the steps then
    cosine decay to zero, label-smoothed cross-entropy. Minibatch order from the global torch
    generator (seed it before building the model). ``tick`` is called once per epoch.

    Returns
    -------
    float
        Mean training loss (with label smoothing) of the last epoch.
    """
    if hyper.train_size > data.pool_size:
        raise ValueError(f"train_size {hyper.train_size} exceeds the training pool "
                         f"({data.pool_size})")
    inputs = take(data.train_inputs, slice(0, hyper.train_size))
    labels = data.train_labels[:hyper.train_size]
    steps_per_epoch = math.ceil(hyper.train_size / batch_size)
    total_steps = max(1, hyper.epochs * steps_per_epoch)
    warmup = max(1, round(0.05 * total_steps))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    optimizer = torch.optim.AdamW(model.parameters(), lr=hyper.learning_rate,
                                  weight_decay=hyper.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    last_epoch_loss = float("nan")
    for _ in range(hyper.epochs):
        order = torch.randperm(hyper.train_size)
        running, count = 0.0, 0
        for start in range(0, hyper.train_size, batch_size):
            index = order[start:start + batch_size]
            loss = F.cross_entropy(_logits(model, take(inputs, index)), labels[index],
                                   label_smoothing=hyper.label_smoothing)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"training diverged (loss {float(loss)}) with "
                                         f"{hyper}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running += loss.detach().item() * index.numel()
            count += index.numel()
        last_epoch_loss = running / count
        if tick is not None:
            tick()
    model.eval()
    return last_epoch_loss


@torch.no_grad()
def _predict(model: nn.Module, inputs: Inputs, batch_size: int) -> torch.Tensor:
    was_training = model.training
    model.eval()
    size = next(iter(inputs.values())).shape[0]
    logits = torch.cat([_logits(model, take(inputs, slice(start, start + batch_size)))
                        for start in range(0, size, batch_size)])
    model.train(was_training)
    return logits


def error_rate(model: nn.Module, inputs: Inputs, labels: torch.Tensor,
               batch_size: int = 512) -> float:
    """Fraction of misclassified points (0-1 error), eval mode."""
    return float((_predict(model, inputs, batch_size).argmax(-1) != labels).double().mean())


def mean_loss(model: nn.Module, inputs: Inputs, labels: torch.Tensor,
              batch_size: int = 512) -> float:
    """Mean cross-entropy (no label smoothing), eval mode."""
    return float(F.cross_entropy(_predict(model, inputs, batch_size).double(), labels))


# ---------------------------------------------------------------------------- measures
@dataclass(frozen=True)
class MeasureSpec:
    """One sharpness measure of a study.

    Attributes
    ----------
    key
        Column name in the CSV (``"geodesic_inv_o2"``).
    label
        Readable name for tables and plots.
    measure
        The ``measure`` argument of :func:`quotientsharp.sharpness`.
    rho
        The radius (``None`` for relative flatness).
    options
        Further keyword options (``metric``, ``order``, ...).
    paper_key
        Which column of the paper's row this measure is compared with (or ``None``).
    """

    key: str
    label: str
    measure: str
    rho: float | None
    options: Mapping[str, Any] = field(default_factory=dict)
    paper_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "measure": self.measure,
                "rho": self.rho, "options": dict(self.options), "paper_key": self.paper_key}


def family_measures(rho_adaptive: float, rho_worst_case: float, rho_inv: float,
                    rho_mix: float) -> list[MeasureSpec]:
    """The measures of the family studies with their radii.

    Adaptive (L2, ``c = |theta|``), plain L2 worst case, geodesic inv and mix at orders 1 and 2
    (non-attention parameters in the adaptive metric, straight lines), relative flatness of the
    classifier layer (the last ``nn.Linear``).
    """
    return [
        MeasureSpec("adaptive", "adaptive", "adaptive", rho_adaptive, {}, "adaptive"),
        MeasureSpec("worst_case", "worst-case (L2)", "worst_case", rho_worst_case, {}, None),
        MeasureSpec("geodesic_inv_o1", "geodesic inv (order 1)", "geodesic", rho_inv,
                    {"metric": "inv", "order": 1}, None),
        MeasureSpec("geodesic_inv_o2", "geodesic inv (order 2)", "geodesic", rho_inv,
                    {"metric": "inv", "order": 2}, "geodesic_inv"),
        MeasureSpec("geodesic_mix_o1", "geodesic mix (order 1)", "geodesic", rho_mix,
                    {"metric": "mix", "order": 1}, None),
        MeasureSpec("geodesic_mix_o2", "geodesic mix (order 2)", "geodesic", rho_mix,
                    {"metric": "mix", "order": 2}, "geodesic_mix"),
        MeasureSpec("relative_flatness", "relative flatness", "relative_flatness", None, {},
                    "relative_flatness"),
    ]


#: Placeholder so that ``from transformer_common import FAMILY_MEASURES`` documents the keys.
FAMILY_MEASURES: tuple[str, ...] = tuple(spec.key for spec in family_measures(1, 1, 1, 1))


def measure_model(model: nn.Module, batches: Sequence[Any], specs: Sequence[MeasureSpec],
                  n_iter: int, seed: int = 0,
                  tick: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every measure of ``specs`` on ``batches``.

    Parameters
    ----------
    model
        The trained network (not modified).
    batches
        The fixed sharpness batches.
    specs
        The measures.
    n_iter
        Auto-PGD steps per batch for the ascent measures.
    seed
        The ``seed`` option of :func:`quotientsharp.sharpness`.
    tick
        Called with the measure key after each measure.

    Returns
    -------
    dict
        Per measure key: ``value`` (mean over batches), ``per_batch``, ``seconds``.
    """
    from ..sharpness import sharpness

    results: dict[str, dict[str, Any]] = {}
    for spec in specs:
        options = dict(spec.options)
        if spec.measure != "relative_flatness":
            options["n_iter"] = n_iter
        start = time.perf_counter()
        result = sharpness(model, batches, measure=spec.measure, rho=spec.rho, seed=seed,
                           progress=False, **options)
        results[spec.key] = {"value": float(result.value), "per_batch": list(result.per_batch),
                             "seconds": time.perf_counter() - start}
        if not math.isfinite(result.value):
            raise FloatingPointError(f"{spec.label} sharpness is not finite ({result.value})")
        if tick is not None:
            tick(spec.key)
    return results


# ---------------------------------------------------------------------------- family study
@dataclass(frozen=True)
class FamilySettings:
    """Sizes of one variant (full or ``--quick``) of a family study.

    Attributes
    ----------
    models
        Number of models ``M``.
    space
        Hyperparameter ranges.
    train_batch_size
        Minibatch size of training.
    sharpness_points, sharpness_batch_size
        The fixed sharpness set: the first ``sharpness_points`` pool points, in batches.
    n_iter
        Auto-PGD steps per batch.
    """

    models: int
    space: HyperparameterSpace
    train_batch_size: int
    sharpness_points: int
    sharpness_batch_size: int
    n_iter: int

    def as_dict(self) -> dict[str, Any]:
        return {"models": self.models, "hyperparameter_space": self.space.as_dict(),
                "train_batch_size": self.train_batch_size,
                "sharpness_points": self.sharpness_points,
                "sharpness_batch_size": self.sharpness_batch_size, "n_iter": self.n_iter}


@dataclass(frozen=True)
class FamilyStudy:
    """What distinguishes the ViT and BERT studies; the protocol is :func:`run_family_study`.

    Attributes
    ----------
    name
        Study name (``"vit"``), also the results folder and docs section name.
    title
        Section title.
    load_data
        ``quick -> ClassificationData`` (deterministic, offline).
    build_model
        ``(num_labels) -> nn.Module``; called right after ``torch.manual_seed(init_seed)``.
    model_config
        The architecture, for ``run.json`` and the docs.
    full, quick
        The two variants.
    paper
        The paper's taus by paper key (``"adaptive"``, ``"geodesic_inv"``, ...).
    paper_setting
        The paper's setting of those numbers, in words.
    rhos
        Radii ``adaptive``, ``worst_case``, ``inv``, ``mix``.
    description
        Markdown paragraph(s) for the docs section: the protocol in words.
    """

    name: str
    title: str
    load_data: Callable[[bool], ClassificationData]
    build_model: Callable[[int], nn.Module]
    model_config: Mapping[str, Any]
    full: FamilySettings
    quick: FamilySettings
    paper: Mapping[str, float]
    paper_setting: str
    rhos: Mapping[str, float]
    description: str


def add_family_arguments(parser: Any, study: FamilyStudy) -> None:
    """Command-line options of a family study (the conventions of ``reproduce diagonal``)."""
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results folder (default results/{study.name}, or "
                             f"results/{study.name}-quick with --quick)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the models already in the results folder and compute only "
                             "the missing ones (the settings must match)")
    parser.add_argument("--quick", action="store_true",
                        help=f"reduced run ({study.quick.models} models, tiny training, "
                             f"{study.quick.n_iter} ascent steps): a smoke test, not a result")
    parser.add_argument("--seed", type=int, default=0,
                        help="study seed: hyperparameters and initialisation of model i are "
                             "drawn from (seed, i) (default 0)")
    parser.add_argument("--models", type=int, default=None,
                        help=f"number of models (default {study.full.models}, or "
                             f"{study.quick.models} with --quick)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="do not write the scatter plots")
    parser.add_argument("--progress", action=argparse_boolean(), default=None,
                        help="show progress bars (default: on a terminal)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help=f"also write DIR/results/{study.name}.md and regenerate "
                             "DIR/results.md")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1: fastest for these tiny "
                             "models)")


def argparse_boolean():
    """``--progress`` / ``--no-progress`` (``argparse.BooleanOptionalAction``)."""
    import argparse

    return argparse.BooleanOptionalAction


def _check_positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def study_settings(study: FamilyStudy, variant: FamilySettings, models: int, seed: int,
                   specs: Sequence[MeasureSpec], data: ClassificationData,
                   quick: bool) -> dict[str, Any]:
    """Everything that determines the results (saved in ``run.json``, checked on resume)."""
    return {
        "study": study.name, "quick": quick, "seed": seed, **variant.as_dict(), "models": models,
        "model_config": dict(study.model_config), "data": dict(data.description),
        "measures": [spec.as_dict() for spec in specs], "sharpness_seed": 0,
        "gap": "test error - train error (0-1 errors; train error on the model's own training "
               "set)",
        "optimizer": "AdamW, 5% linear warm-up then cosine decay to 0, label-smoothed "
                     "cross-entropy, dropout 0",
    }


def _model_record(study: FamilyStudy, data: ClassificationData, variant: FamilySettings,
                  specs: Sequence[MeasureSpec], batches: Sequence[Any], seed: int,
                  index: int, bar: Any) -> dict[str, Any]:
    """Train and measure model ``index``; a diverged training is recorded, not retried."""
    hyper = draw_hyperparameters(variant.space, seed, index)
    torch.manual_seed(hyper.init_seed)
    model = study.build_model(data.num_labels)
    record: dict[str, Any] = {"index": index, **hyper.as_dict(), "diverged": False}
    record["parameters"] = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    bar.set_postfix_str(f"model {index}: training {hyper.epochs} epochs")
    try:
        record["final_train_objective"] = train_classifier(model, data, hyper,
                                                           variant.train_batch_size)
    except FloatingPointError as err:
        # kept in the records (and out of the taus) so that no model is silently dropped
        record.update(diverged=True, reason=str(err), train_seconds=time.perf_counter() - start)
        return record
    record["train_seconds"] = time.perf_counter() - start
    train_inputs = take(data.train_inputs, slice(0, hyper.train_size))
    train_labels = data.train_labels[:hyper.train_size]
    record["train_error"] = error_rate(model, train_inputs, train_labels)
    record["test_error"] = error_rate(model, data.test_inputs, data.test_labels)
    record["gap"] = record["test_error"] - record["train_error"]
    record["train_loss"] = mean_loss(model, train_inputs, train_labels)
    record["test_loss"] = mean_loss(model, data.test_inputs, data.test_labels)
    start = time.perf_counter()

    def tick(key: str) -> None:
        bar.set_postfix_str(f"model {index}: {key} done")

    measured = measure_model(model, batches, specs, variant.n_iter, tick=tick)
    for key, result in measured.items():
        record[key] = result["value"]
        record[f"{key}_per_batch"] = result["per_batch"]
        record[f"{key}_seconds"] = result["seconds"]
    record["measure_seconds"] = time.perf_counter() - start
    return record


def csv_columns(specs: Sequence[MeasureSpec]) -> list[str]:
    """Columns of the per-model CSV (per-batch values stay in the JSONL file)."""
    return (["index", "learning_rate", "weight_decay", "epochs", "label_smoothing",
             "train_size", "init_seed", "parameters", "final_train_objective", "train_error",
             "test_error", "gap", "train_loss", "test_loss"]
            + [spec.key for spec in specs] + ["diverged", "train_seconds", "measure_seconds"])


def tau_rows(records: Sequence[Mapping[str, Any]], specs: Sequence[MeasureSpec],
             paper: Mapping[str, float]) -> list[dict[str, Any]]:
    """Kendall tau-a and tau-b between the gap and each measure, next to the paper's value."""
    from .common import kendall_tau_a, kendall_tau_b

    gaps = [r["gap"] for r in records]
    rows = []
    for spec in specs:
        values = [r[spec.key] for r in records]
        enough = len(records) >= 2
        rows.append({"key": spec.key, "measure": spec.label, "rho": spec.rho,
                     "tau_a": kendall_tau_a(gaps, values) if enough else None,
                     "tau_b": kendall_tau_b(gaps, values) if enough else None,
                     "paper": paper.get(spec.paper_key) if spec.paper_key else None})
    return rows


def _ranks_text(world_size: int) -> str:
    return (f" per rank, {world_size} ranks under torchrun, each model trained and measured "
            "whole on one rank") if world_size > 1 else ""


def _format_rho(rho: float | None) -> str:
    return "—" if rho is None else f"{rho:g}"


def family_section(study: FamilyStudy, settings: Mapping[str, Any],
                   records: Sequence[Mapping[str, Any]], taus: Sequence[Mapping[str, Any]],
                   wall_seconds: float, threads: int, resumed: int,
                   world_size: int = 1) -> str:
    """The markdown section ``docs/results/<study>.md`` (``world_size``: ranks of this session,
    mentioned when above 1)."""
    from .common import TauRow, tau_table

    table = tau_table([TauRow(row["measure"] if row["rho"] is None
                              else f"{row['measure']} (rho {_format_rho(row['rho'])})",
                              row["tau_a"], row["tau_b"], row["paper"],
                              "" if row["paper"] is None else "paper: other setting")
                       for row in taus])
    counted = [r for r in records if not r["diverged"]]
    diverged = [r["index"] for r in records if r["diverged"]]
    space = settings["hyperparameter_space"]
    quick = settings["quick"]
    command = f"quotientsharp reproduce {study.name}" + (" --quick" if quick else "")
    folder = f"results/{study.name}" + ("-quick" if quick else "")
    lines = [f"## {study.title}", ""]
    if quick:
        lines += ["**A `--quick` smoke run (tiny training, few ascent steps): the numbers mean "
                  "nothing.**", ""]
    lines += [
        f"Reproduce: `{command} --docs docs` (outputs in `{folder}/`: per-model CSV and JSONL "
        "written as each model finishes, `taus.json`, one scatter plot per measure, "
        f"`run.json`). This run: {len(records)} models, {len(counted)} counted, wall time "
        f"{wall_seconds / 60:.1f} min ({threads} torch thread(s)"
        f"{_ranks_text(world_size)}{', resumed' if resumed else ''}).",
        "",
        " ".join(study.description.split()),
        "",
        f"- Architecture: `{json.dumps(settings['model_config'], sort_keys=True)}`.",
        f"- Per model i, drawn from `numpy.random.default_rng([{settings['seed']}, i])` (no "
        f"model is filtered or redrawn): learning rate log-uniform in "
        f"{space['learning_rate']}, weight decay log-uniform in {space['weight_decay']}, epochs "
        f"uniform in {space['epochs']}, label smoothing uniform in "
        f"{space['label_smoothing']}, training-set size uniform in {space['train_size']}, "
        f"initialisation seed. AdamW, batch {settings['train_batch_size']}, 5% warm-up then "
        "cosine decay, dropout 0.",
    ]
    if counted:
        gaps = [r["gap"] for r in counted]
        train_errors = [r["train_error"] for r in counted]
        test_errors = [r["test_error"] for r in counted]
        lines.append(
            f"- Generalisation gap = test error - train error (0-1 errors): range "
            f"[{min(gaps):+.3f}, {max(gaps):+.3f}]; train error [{min(train_errors):.3f}, "
            f"{max(train_errors):.3f}], test error [{min(test_errors):.3f}, "
            f"{max(test_errors):.3f}].")
    if diverged:
        lines.append(f"- Diverged in training (kept in the records, left out of the taus): "
                     f"models {diverged}.")
    lines += [
        f"- Sharpness on the same {settings['sharpness_points']} training points for every "
        f"model (the first points of the pool, inside every training set), in "
        f"{settings['sharpness_points'] // settings['sharpness_batch_size']} batches of "
        f"{settings['sharpness_batch_size']}, per batch then averaged; Auto-PGD with "
        f"{settings['n_iter']} steps from xi = 0, eta0 = 2 rho. Geodesic: attention heads in "
        "the GL(h) quotient, every other parameter in the adaptive metric along straight "
        "lines. Radii fixed once, before the study, from pilot models (on which the perturbed "
        "loss rose by about 0.005-0.5 nats, far above round-off); the same for every model "
        "and never adjusted to any correlation.",
        "",
        f"Kendall tau between the gap and each sharpness measure over the {len(counted)} "
        f"counted models. The paper's column is {study.paper_setting}: a different setting "
        "(large pretrained models, fine-tuned), shown for orientation only.",
        "",
        table,
    ]
    return "\n".join(lines) + "\n"


@dataclass
class FamilyOutcome:
    """What :func:`family_study` did: the records, the taus, what was computed now."""

    out: Path
    records: list[dict[str, Any]]
    taus: list[dict[str, Any]]
    computed_now: list[int]
    section: str
    wall_seconds: float


def family_study(study: FamilyStudy, out: Path | None = None, *, quick: bool = False,
                 models: int | None = None, seed: int = 0, resume: bool = False,
                 progress: bool | None = None, plots: bool = True, docs: Path | None = None,
                 threads: int = 1) -> FamilyOutcome:
    """Run (or resume) a family study and write every output (see the module docstring).

    Under torchrun (an initialised process group of ``W > 1`` ranks), call it on every rank
    with the same arguments. The models still missing are dealt round-robin over the ranks
    (:func:`quotientsharp.distributed.shard`); each is trained and measured whole on its rank,
    from seeds that depend on ``(seed, index)`` only, so its record is the one a single process
    computes. Writing, in one sentence: rank 0 alone creates, checks and finishes the results
    folder, and during the run each rank ``r`` appends each model it finishes, flushed, to its
    own shard ``models.rank{r}.jsonl``. Why shards and not a gather after each round of ``W``
    models: a model is safe on disk the moment it finishes, whichever rank computed it, so an
    interrupted run loses no finished model (a per-round gather loses the models of the
    unfinished round), and no rank waits for the others before the end. There is one writer per
    file, so no locking is needed. Rank 0 rewrites ``models.csv`` and ``run.json`` from the
    file and the shards as its own models finish; at the end the records are all-gathered and
    rank 0 folds the shards into ``models.jsonl`` (sorted by index, the single-process order) and
    deletes them. ``--resume``, under any number of ranks or none, reads ``models.jsonl``
    together with any shards left by an interrupted run, so it recomputes exactly the missing
    models. Every rank returns the same outcome.

    Parameters
    ----------
    study
        The family.
    out
        Results folder (default ``results/<name>`` or ``results/<name>-quick``).
    quick
        The reduced variant.
    models
        Number of models (default the variant's).
    seed
        Study seed.
    resume
        Keep the finished models of the run in ``out`` (same settings required).
    progress
        tqdm bar (``None``: on a terminal only; rank 0 only under torchrun).
    plots
        Write the scatter plots.
    docs
        A docs folder: write ``docs/results/<name>.md`` and regenerate ``docs/results.md``.
    threads
        torch threads during the run, per rank (restored afterwards).
    """
    from ..distributed import gather_indexed, rank_and_world_size, run_on_rank0, shard
    from .common import (
        ResultsDirectory,
        append_jsonl,
        progress_bar,
        regenerate_results_page,
        scatter_plots,
        shard_name,
        write_json_atomic,
        write_section,
    )

    variant = study.quick if quick else study.full
    models = _check_positive("models", models if models is not None else variant.models)
    threads = _check_positive("threads", threads)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    out = Path(out) if out is not None else Path(
        f"results/{study.name}-quick" if quick else f"results/{study.name}")
    rank, world_size = rank_and_world_size()
    distributed = world_size > 1

    data = study.load_data(quick)
    specs = family_measures(study.rhos["adaptive"], study.rhos["worst_case"],
                            study.rhos["inv"], study.rhos["mix"])
    settings = study_settings(study, variant, models, seed, specs, data, quick)
    names = ["models.jsonl", "models.csv", "taus.json", "summary.md"]
    names += [f"scatter_{spec.key}.png" for spec in specs]
    columns = csv_columns(specs)
    saved_threads = torch.get_num_threads()
    # set before ResultsDirectory, so that run.json records the thread count the run uses
    torch.set_num_threads(threads)
    bar = None
    # rank 0's ResultsDirectory; the other ranks never write through one
    folder: dict[str, ResultsDirectory] = {}

    def open_folder() -> tuple[dict[int, dict[str, Any]], float]:
        results = ResultsDirectory(out, study.name, settings, resume, names,
                                   sharded=["models.jsonl"])
        folder["results"] = results
        # shards of an interrupted distributed run join models.jsonl before anything else
        finished = {r["index"]: r for r in results.consolidate("models.jsonl", "index")
                    if r["index"] < models}
        if resume:
            # the CSV mirrors the JSONL: a run cut between the two writes is repaired here
            results.write_csv("models.csv", columns, [finished[i] for i in sorted(finished)])
        return finished, float(results.run_info.get("wall_seconds", 0.0))

    try:
        records, previous_seconds = run_on_rank0(open_folder)
        results = folder.get("results")
        batches = sharpness_batches(data, variant.sharpness_points,
                                    variant.sharpness_batch_size)
        start = time.perf_counter()
        todo = [i for i in range(models) if i not in records]
        mine = shard(todo)                   # (position in todo, model index)
        bar = progress_bar(len(records) + len(mine), f"{study.name} models",
                           progress if rank == 0 else False, unit="model")
        bar.update(len(records))
        computed: list[tuple[int, dict[str, Any]]] = []
        for position, index in mine:
            record = _model_record(study, data, variant, specs, batches, seed, index, bar)
            computed.append((position, record))
            if not distributed:
                results.append("models.jsonl", record)
                records[index] = record
                results.write_csv("models.csv", columns, [records[i] for i in sorted(records)])
                bar.update(1)
                results.save_run_info(finished_models=len(records),
                                      wall_seconds=previous_seconds + time.perf_counter() - start)
                continue
            append_jsonl(out / shard_name("models.jsonl", rank), record)
            bar.update(1)
            if rank == 0:
                # a live mirror of every rank's finished models (shards read, never repaired)
                live = {r["index"]: r for r in results.merged_records("models.jsonl", "index",
                                                                      repair=False)}
                results.write_csv("models.csv", columns, [live[i] for i in sorted(live)])
                results.save_run_info(finished_models=len(live),
                                      wall_seconds=previous_seconds + time.perf_counter() - start)
        if distributed:
            for position, record in enumerate(gather_indexed(computed)):
                records[todo[position]] = record
    finally:
        if bar is not None:
            bar.close()
        torch.set_num_threads(saved_threads)

    ordered = [records[i] for i in sorted(records)]
    counted = [r for r in ordered if not r["diverged"]]
    taus = tau_rows(counted, specs, study.paper)

    def finish() -> tuple[str, float]:
        wall = previous_seconds + time.perf_counter() - start
        if distributed:
            results.consolidate("models.jsonl", "index")
            results.write_csv("models.csv", columns, ordered)
        write_json_atomic(results.file("taus.json"), taus)
        if plots and counted:
            scatter_plots([r["gap"] for r in counted],
                          {spec.key: [r[spec.key] for r in counted] for spec in specs},
                          results.path, x_label="generalisation gap (test error - train error)",
                          color=[r["train_size"] for r in counted],
                          color_label="training-set size",
                          titles={row["key"]: f"{row['measure']}: tau-a {row['tau_a']:+.2f}"
                                  for row in taus if row["tau_a"] is not None})
        section = family_section(study, settings, ordered, taus, wall, threads,
                                 int(results.run_info.get("resumed", 0)), world_size)
        results.file("summary.md").write_text(section)
        if docs is not None:
            write_section(Path(docs), study.name, section)
            regenerate_results_page(Path(docs))
        results.save_run_info(status="finished", finished_models=len(ordered),
                              wall_seconds=wall, computed_now=todo, taus=taus)
        return section, wall

    section, wall = run_on_rank0(finish)
    return FamilyOutcome(out, ordered, taus, todo, section, wall)


def run_family_study(study: FamilyStudy, args: Any) -> int:
    """Command-line entry of a family study; returns the exit status (printing on rank 0)."""
    import sys

    from .common import is_main_rank

    out = args.out if args.out is not None else Path(
        f"results/{study.name}-quick" if args.quick else f"results/{study.name}")
    try:
        outcome = family_study(study, out, quick=args.quick, models=args.models, seed=args.seed,
                               resume=args.resume, progress=args.progress, plots=args.plots,
                               docs=args.docs, threads=args.threads)
    except KeyboardInterrupt:
        if is_main_rank():
            print(f"\ninterrupted: finished models are kept in {out}; continue with --resume",
                  file=sys.stderr)
        return 130
    except (ValueError, NotADirectoryError) as err:
        # under torchrun every rank raises the same error (run_on_rank0): rank 0 reports it
        if is_main_rank():
            print(f"quotientsharp reproduce {study.name}: error: {err}", file=sys.stderr)
        return 2
    if not is_main_rank():
        return 0
    print(outcome.section)
    print(f"computed now: {len(outcome.computed_now)} model(s), wall time "
          f"{outcome.wall_seconds:.1f} s; results in {outcome.out}"
          + ("" if args.docs is None else
             f"; docs section in {args.docs}/results/{study.name}.md"))
    return 0
