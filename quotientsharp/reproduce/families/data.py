"""Family studies: a training pool and a test set, and the fixed sharpness batches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from quotientsharp.core.scalars import check_int

Inputs = dict[str, torch.Tensor]


@dataclass
class ClassificationData:
    """A training pool and a test set: keyword inputs of the model's forward, each tensor
    batched on dim 0 (``{"pixel_values": [N, 1, 8, 8]}``), class indices ``shape=[N]``, and a
    ``description`` of the data for ``run.json``."""

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

    def to(self, device: torch.device | str) -> ClassificationData:
        """The same data with every tensor on ``device``."""
        return ClassificationData(
            {k: v.to(device) for k, v in self.train_inputs.items()},
            self.train_labels.to(device),
            {k: v.to(device) for k, v in self.test_inputs.items()},
            self.test_labels.to(device), self.num_labels, dict(self.description))


def take(inputs: Mapping[str, torch.Tensor], index: torch.Tensor | slice) -> Inputs:
    """Rows ``index`` of every input tensor."""
    return {name: tensor[index] for name, tensor in inputs.items()}


def sharpness_batches(data: ClassificationData, points: int, batch_size: int) -> list[dict]:
    """The first ``points`` pool points, ``batch_size`` at a time, as inputs plus ``"labels"``."""
    if points < 1 or batch_size < 1 or points % batch_size:
        raise ValueError(f"sharpness points ({points}) must be a positive multiple of the "
                         f"sharpness batch size ({batch_size})")
    if points > data.pool_size:
        raise ValueError(f"sharpness points ({points}) exceed the training pool "
                         f"({data.pool_size})")
    return [{**take(data.train_inputs, slice(start, start + batch_size)),
             "labels": data.train_labels[start:start + batch_size]}
            for start in range(0, points, batch_size)]


def shuffled_pool(data: ClassificationData, seed: int) -> ClassificationData:
    """The same data with the training pool permuted by ``torch.Generator().manual_seed(seed)``:
    a study seed's own training sets and sharpness set."""
    seed = check_int("seed", seed, 0)
    order = torch.randperm(data.pool_size, generator=torch.Generator().manual_seed(seed))
    order = order.to(data.train_labels.device)
    return ClassificationData(take(data.train_inputs, order), data.train_labels[order],
                              dict(data.test_inputs), data.test_labels, data.num_labels,
                              {**data.description, "pool_order_seed": seed})
