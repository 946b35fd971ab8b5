"""Invariance of geodesic sharpness in float32 (and float64) under reparametrised attention heads.

Run: ``python examples/float32_invariance.py [--dtype float32] [--hidden 64] [--condition 1e3]``.

A small BERT classifier (2 layers, 4 heads, eager attention) and a copy moved along every head's
symmetry orbits by :func:`quotientsharp.models.reparametrize` (Gaussian elements of condition at
most ``--condition``): the same function. Prints, per metric and order, the largest relative
change per batch of geodesic sharpness (rho 0.1, default solver) and how far the best
perturbation's norm ends below rho, and the same change of adaptive sharpness.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import transformers

import quotientsharp as qs
from quotientsharp.models import find_symmetries, reparametrize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--condition", type=float, default=1e3)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=args.hidden, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * args.hidden, vocab_size=100, max_position_embeddings=32,
        num_labels=2, attn_implementation="eager", initializer_range=0.3)
    model = transformers.BertForSequenceClassification(config).to(dtype)
    gen = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 100, (8, 12), generator=gen),
                "attention_mask": torch.ones(8, 12, dtype=torch.long),
                "labels": torch.randint(0, 2, (8,), generator=gen)} for _ in range(2)]
    moved = copy.deepcopy(model)
    params = reparametrize(model, find_symmetries(model),
                           generator=torch.Generator().manual_seed(1),
                           max_condition=args.condition)
    with torch.no_grad():
        for name, parameter in moved.named_parameters():
            parameter.copy_(params[name])

    def change(measure: str, **options) -> tuple[float, float]:
        a, b = (qs.sharpness(m, batches, measure=measure, rho=0.1, progress=False, **options)
                for m in (model, moved))
        rel = max(abs(x - y) / abs(x) for x, y in zip(a.per_batch, b.per_batch, strict=True))
        return rel, b.perturbation_norms[0]["total"] - 0.1

    for metric in ("mix", "inv"):
        for order in (1, 2):
            rel, gap = change("geodesic", metric=metric, order=order)
            print(f"geodesic {metric} order {order}: relative change {rel:.2e}, "
                  f"norm - rho {gap:.1e}")
    print(f"adaptive: relative change {change('adaptive')[0]:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
