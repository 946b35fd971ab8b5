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

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
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
