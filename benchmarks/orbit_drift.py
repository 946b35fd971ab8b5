"""How far two starts on one orbit drift apart under ``QuotientAdamW``, against how far the same
run drifts from a start moved by rounding alone.

``QuotientAdamW``'s update is invariant under each pair's group, so in exact arithmetic two
starts related by a group element give the same products ``G H^T`` at every step. In floating
point the two runs differ by rounding at the start (about ``eps`` times the element's
condition), and the training dynamics amplify it: where a run started ``1e-14`` away (relative,
on the adapters' ``A``) drifts far, no invariant optimiser can keep the orbit to rounding, and
the orbit's drift says nothing about the invariance. This script measures both on a grid:

- model: a float64 two-layer BERT (hidden 32, 2 heads, 3 labels), PEFT LoRA on the query, key,
  value and attention output of both layers (eight adapters), ranks 4 and 8;
- starts: PEFT's ``B = 0``, or every adapter drawn at scale 1/2 (``random``);
- a group element of condition 100 per pair (``GLQuotient("mix").random_group_element``);
- 30 steps on one batch of 8 sequences of 6 tokens, lr 0.001, 0.005, 0.02, seeds 0-2;
- the drift: the largest relative difference of a bucket's products over the steps.

Each row prints the orbit's drift under ``QuotientAdamW`` (its defaults), the drift of the same
run from a start moved by ``1e-14`` (``self``), and AdamW's ``self`` drift for comparison.

Run: ``python benchmarks/orbit_drift.py [--lrs 0.001 0.005 0.02] [--seeds 3]`` (about 10 min on
one core).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quotientsharp.core.gl import GLQuotient  # noqa: E402
from quotientsharp.models import find_symmetries  # noqa: E402
from quotientsharp.models.layout import ParameterLayout  # noqa: E402
from quotientsharp.models.quotient_adamw import QuotientAdamW  # noqa: E402

CONDITION = 100.0
STEPS = 30
RELATIVE_NUDGE = 1e-14


def adapted_bert(seed: int, rank: int, random: bool) -> torch.nn.Module:
    """The float64 two-layer BERT with eight LoRA adapters of ``rank`` (module docstring)."""
    import peft
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=30,
                                     max_position_embeddings=16, num_labels=3,
                                     attn_implementation="eager", hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    base = transformers.BertForSequenceClassification(config).to(torch.float64).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(base, peft.LoraConfig(
            r=rank, target_modules=["query", "key", "value", "attention.output.dense"]))
    if random:
        generator = torch.Generator().manual_seed(seed + 5)
        with torch.no_grad():
            for name, tensor in model.named_parameters():
                if "lora_" in name:
                    tensor.copy_(0.5 * torch.randn(tensor.shape, generator=generator,
                                                   dtype=tensor.dtype))
    return model


def layout_of(model: torch.nn.Module) -> ParameterLayout:
    return ParameterLayout(find_symmetries(model, degenerate="pair"),
                           dict(model.named_parameters()))


def products(model: torch.nn.Module) -> list[torch.Tensor]:
    """``G H^T`` of every bucket of pairs."""
    coordinates = layout_of(model).to_coordinates({n: t.detach()
                                                   for n, t in model.named_parameters()})
    return [(g @ h.mT).clone() for g, h in coordinates.gl]


def on_the_orbit(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy with every pair moved by a group element of condition :data:`CONDITION`."""
    moved = copy.deepcopy(model)
    layout = layout_of(moved)
    coordinates = layout.to_coordinates({n: t.detach() for n, t in moved.named_parameters()})
    quotient, generator = GLQuotient("mix"), torch.Generator().manual_seed(seed)
    acted = [quotient.act(point, quotient.random_group_element(
        point, condition=CONDITION, generator=generator)) for point in coordinates.gl]
    new = layout.to_parameters(coordinates.replace(gl=acted))
    with torch.no_grad():
        for name, tensor in moved.named_parameters():
            if name in new:
                tensor.copy_(new[name])
    return moved


def nudged(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy whose adapters' ``A`` are moved by :data:`RELATIVE_NUDGE` (relative, random)."""
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in moved.named_parameters():
            if "lora_A" in name:
                tensor.mul_(1 + RELATIVE_NUDGE * torch.randn(tensor.shape, generator=generator,
                                                             dtype=tensor.dtype))
    return moved


def drift(first: torch.nn.Module, second: torch.nn.Module, make, batch) -> float:
    """Largest relative difference of a bucket's products over :data:`STEPS` steps."""
    runs = []
    for model in (first, second):
        optimizer, trajectory = make(model), []
        for _ in range(STEPS):
            optimizer.zero_grad()
            model(**batch).loss.backward()
            optimizer.step()
            trajectory.append(products(model))
        runs.append(trajectory)
    return max(float((p - q).norm() / p.norm()) for ps, qs in zip(*runs, strict=True)
               for p, q in zip(ps, qs, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.001, 0.005, 0.02])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("seed rank lr    start   orbit (QuotientAdamW)  self (QuotientAdamW)  self (AdamW)")
    over = []
    for seed, rank, lr, random in itertools.product(range(args.seeds), (4, 8), args.lrs,
                                                    (False, True)):
        model = adapted_bert(seed, rank, random)
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(1, 30, (8, 6), generator=generator)
        batch = {"input_ids": ids, "labels": torch.randint(0, 3, (8,), generator=generator)}

        def quotient_adamw(m: torch.nn.Module, lr: float = lr) -> torch.optim.Optimizer:
            return QuotientAdamW(m, lr=lr)

        def adamw(m: torch.nn.Module, lr: float = lr) -> torch.optim.Optimizer:
            return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=lr)

        row = (drift(copy.deepcopy(model), on_the_orbit(model, seed + 50), quotient_adamw,
                     batch),
               drift(copy.deepcopy(model), nudged(model, seed + 3), quotient_adamw, batch),
               drift(copy.deepcopy(model), nudged(model, seed + 3), adamw, batch))
        start = "random" if random else "B = 0"
        print(f"{seed:>4} {rank:>4} {lr:<5g} {start:<7} {row[0]:>21.1e}  {row[1]:>20.1e}  "
              f"{row[2]:>12.1e}", flush=True)
        if row[0] > 1e-6:
            over.append((row[0], row[1]))
    chaotic = sum(own > 1e-6 for _, own in over)
    print(f"orbit drift over 1e-6: {len(over)} of {args.seeds * 4 * len(args.lrs)} runs; "
          f"of them, {chaotic} drift over 1e-6 from a start moved by rounding alone")


if __name__ == "__main__":
    main()
