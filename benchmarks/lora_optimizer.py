"""LoRA fine-tuning on the quotient: QuotientSGD (mix metric, damped) and QuotientAdamW against
AdamW.

Task (synthetic, CPU, seconds): a frozen random MLP ``d -> w -> w -> k`` (tanh) is the base
model; the teacher is the same network with a rank-``r`` change ``B* A*`` on both hidden layers.
The student is the base with PEFT LoRA adapters of rank ``r`` on those layers (PEFT's
initialisation: ``B = 0``) and fits the teacher's outputs on a fixed training set (mean squared
error, full batch). Every optimiser runs over a small grid of learning rates from the same
start; for each we keep the learning rate with the lowest final loss, and report the steps to
reach fractions of the initial loss (``--targets``), the median time per step (process CPU
time, one thread) and the loss curves (``lora_optimizer.png``, ``lora_optimizer.json`` under
``--out``).

Methods:

- ``QuotientSGD mix``: the scaled gradient step on every adapter's ``GL(r)`` quotient,
  ``grad_B = dL/dB (A A^T + eps I)^{-1}``, ``grad_A = (B^T B + eps I)^{-1} dL/dA`` (Riemannian
  preconditioned LoRA), heavy-ball momentum 0.9;
- ``QuotientAdamW mix``: :class:`~quotientsharp.models.quotient_adamw.QuotientAdamW` (mix
  frames, ``eps = 0``, its default balanced scale ``balance=1``, exactly invariant under each
  adapter's ``GL(r)``; weight decay 0), and
  the damped ``QuotientAdamW mix eps 0.01`` (invariant under orthogonal elements only);
- ``AdamW``: ``torch.optim.AdamW`` on the same parameters (weight decay 0).

Each learning-rate grid has three values around its method's best. Every run starts from the
same adapters (PEFT's initialisation drawn from ``--seed``).

Run: ``python benchmarks/lora_optimizer.py [--out DIR] [--steps 300] [--rank 4] [--quick]``.
Nothing is asserted: which optimiser wins, and by how much, is the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quotientsharp.models import QuotientSGD  # noqa: E402
from quotientsharp.models.quotient_adamw import QuotientAdamW  # noqa: E402

GRIDS = {"QuotientSGD mix": (1.0, 3.0, 10.0), "AdamW": (1e-2, 3e-2, 1e-1),
         "QuotientAdamW mix": (1e-2, 3e-2, 1e-1), "QuotientAdamW mix eps 0.01": (1e-2, 3e-2, 1e-1)}


def _base(sizes: Sequence[int], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(fan_in, fan_out))
        if index < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).double()


def _hidden(model: nn.Module) -> list[str]:
    """Names of the hidden linear layers (every linear layer but the last)."""
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return names[:-1]


def make_task(sizes: Sequence[int], rank: int, samples: int, seed: int, condition: float
              ) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The frozen base, and inputs with the teacher's outputs (base plus rank-``rank``
    changes of relative size 1/2 and condition number ``condition`` on the hidden layers)."""
    base = _base(sizes, seed)
    teacher = _base(sizes, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name in _hidden(teacher):
            weight = teacher.get_submodule(name).weight
            # orthonormal factors and singular values spread over `condition`: the ill-conditioned
            # low-rank change that scaled gradient steps are made for
            b, _ = torch.linalg.qr(torch.randn(weight.shape[0], rank, generator=generator,
                                               dtype=weight.dtype))
            a, _ = torch.linalg.qr(torch.randn(weight.shape[1], rank, generator=generator,
                                               dtype=weight.dtype))
            spread = torch.logspace(0, -1, rank, base=condition, dtype=weight.dtype)
            change = b @ torch.diag(spread) @ a.T
            weight.add_(0.5 * change * weight.norm() / change.norm())
        x = torch.randn(samples, sizes[0], generator=generator, dtype=torch.float64)
        y = teacher(x)
    return base, x, y


def student(base: nn.Module, rank: int, seed: int = 0) -> nn.Module:
    """The base with fresh PEFT adapters, drawn from ``seed`` (every run starts alike)."""
    import copy

    import peft

    torch.manual_seed(seed)
    return peft.get_peft_model(copy.deepcopy(base),
                               peft.LoraConfig(r=rank, lora_alpha=rank,
                                               target_modules=_hidden(base)))


def run(model: nn.Module, make: Callable[[nn.Module], torch.optim.Optimizer], x: torch.Tensor,
        y: torch.Tensor, steps: int) -> tuple[list[float], list[float]]:
    """Full-batch training: the loss before each step and the CPU time of each step."""
    optimizer = make(model)
    losses, times = [], []
    for _ in range(steps):
        start = time.process_time()
        optimizer.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        optimizer.step()
        times.append(time.process_time() - start)
        value = float(loss.detach())
        losses.append(value)
        if not value < 1e30:        # diverged (or NaN): the rest of the run says nothing
            break
    return losses, times


def steps_to(losses: Sequence[float], target: float) -> int | None:
    """The first step whose loss is at most ``target`` (``None``: never)."""
    return next((i for i, value in enumerate(losses) if value <= target), None)


def optimisers(eps: float) -> dict[str, Callable[[float], Callable[[nn.Module], Any]]]:
    return {
        "QuotientSGD mix": lambda lr: lambda m: QuotientSGD(m, lr=lr, metric="mix", eps=eps,
                                                            momentum=0.9),
        "QuotientAdamW mix": lambda lr: lambda m: QuotientAdamW(m, lr=lr, metric="mix"),
        # damped frames: steps along a factor's directions far below sqrt(0.01) are capped
        "QuotientAdamW mix eps 0.01": lambda lr: lambda m: QuotientAdamW(m, lr=lr, metric="mix",
                                                                         eps=1e-2),
        "AdamW": lambda lr: lambda m: torch.optim.AdamW(
            [p for p in m.parameters() if p.requires_grad], lr=lr, weight_decay=0.0),
    }


def benchmark(sizes: Sequence[int], rank: int, samples: int, steps: int,
              targets: Sequence[float], eps: float, seed: int, condition: float = 100.0
              ) -> dict[str, Any]:
    base, x, y = make_task(sizes, rank, samples, seed, condition)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # PEFT's notes on targeting plain nn.Sequential
        initial = float((student(base, rank, seed)(x) - y).square().mean())
    goals = [target * initial for target in targets]
    results: dict[str, Any] = {"sizes": list(sizes), "rank": rank, "samples": samples,
                               "steps": steps, "initial_loss": initial, "targets": list(targets),
                               "eps": eps, "seed": seed, "condition": condition,
                               "methods": {}}
    for name, factory in optimisers(eps).items():
        runs = {}
        for lr in GRIDS[name]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = student(base, rank, seed)
            losses, times = run(model, factory(lr), x, y, steps)
            runs[lr] = {"losses": losses,
                        "steps_to_target": [steps_to(losses, goal) for goal in goals],
                        "seconds_per_step": statistics.median(times)}
        # the learning rate with the lowest final loss (a diverged run has none)
        best = min(runs, key=lambda lr: (len(runs[lr]["losses"]) < steps,
                                         runs[lr]["losses"][-1]))
        results["methods"][name] = {"best_lr": best, **runs[best],
                                    "grid": {str(lr): {k: v for k, v in r.items()
                                                       if k != "losses"}
                                             for lr, r in runs.items()}}
    return results


def table(results: dict[str, Any]) -> str:
    targets = results["targets"]
    lines = [f"loss {results['initial_loss']:.3g} at the start; rank {results['rank']}, sizes "
             f"{results['sizes']}, teacher condition {results['condition']:g}",
             f"{'method':<26} {'best lr':>8} "
             + " ".join(f"{'steps to ' + format(t, 'g'):>15}" for t in targets)
             + f" {'ms per step':>12} {'final loss':>11}"]
    for name, method in results["methods"].items():
        reached = " ".join(f"{'-' if s is None else s:>15}" for s in method["steps_to_target"])
        lines.append(f"{name:<26} {method['best_lr']:>8g} {reached} "
                     f"{1e3 * method['seconds_per_step']:>12.3f} {method['losses'][-1]:>11.3g}")
    lines.append("(steps to a fraction of the initial loss; '-': not reached)")
    return "\n".join(lines)


def figure(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, method in results["methods"].items():
        ax.semilogy(method["losses"], label=f"{name} (lr {method['best_lr']:g})")
    for target in results["targets"]:
        ax.axhline(target * results["initial_loss"], color="gray", linestyle=":", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (MSE)")
    ax.set_title(f"LoRA rank {results['rank']}: quotient steps vs AdamW")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/lora_optimizer"),
                        help="folder for lora_optimizer.json and lora_optimizer.png")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--targets", type=float, nargs="+", default=[1e-1, 3e-2, 1e-2],
                        help="target losses as fractions of the initial loss")
    parser.add_argument("--eps", type=float, default=1e-2, help="QuotientSGD's damping")
    parser.add_argument("--condition", type=float, default=100.0,
                        help="condition number of the teacher's low-rank changes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.width, args.samples = 30, 12, 64
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sizes = (16, args.width, args.width, 8)
    results = benchmark(sizes, args.rank, args.samples, args.steps, args.targets, args.eps,
                        args.seed, args.condition)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora_optimizer.json").write_text(json.dumps(results, indent=2))
    figure(results, args.out / "lora_optimizer.png")
    print(table(results))
    print(f"wrote {args.out / 'lora_optimizer.json'} and {args.out / 'lora_optimizer.png'}")
    return results


if __name__ == "__main__":
    main()
