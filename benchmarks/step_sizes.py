"""Step sizes and retraction costs of geoopt's RiemannianSGD on the GL quotient, per metric.

The problem is the one of ``docs/adapters.md``: fit ``G H^T`` to a rank-3 target,
``(n, m, h) = (30, 20, 3)``, float64, ``loss = |G H^T - target|^2 / 2``, from a fixed random
start (seed 0). It prints three tables:

1. **largest stable step size per metric**: RiemannianSGD on
   ``QuotientManifold(GLQuotient(metric))`` (default retraction) for ``--steps`` steps at every
   ``lr`` of a grid with four points per decade; a run is stable when it raises nothing and
   ends below the starting error. Beside it, the stability bound of gradient descent at the
   start, ``2 / curvature`` (see :func:`predicted_lr`). The largest stable ``lr`` is the
   largest whose run, and the run of every smaller ``lr`` of the grid, is stable. Also the
   best final relative error and its ``lr``. The start is scaled by ``--scales`` (both
   factors), which shows that the inv metric's stable step depends on the size of the
   weights and the mix metric's does not.
2. **retraction orders**: for the mix metric at ``lr = 0.5``, the CPU time of one optimizer
   step (median over interleaved repetitions, one thread), that time relative to order 1, and
   the steps needed to reach a relative error of ``1e-9``.
3. the largest stable ``lr`` of each retraction order (mix).

Run: ``python benchmarks/step_sizes.py [--steps 200] [--json PATH]``. Timings depend on the
machine; the ratios and step sizes are the comparable numbers. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

N, M, H = 30, 20, 3
METRICS = ("inv", "mix", "euclidean")
ORDERS: tuple[int | str, ...] = (1, 2, "exact")


def problem(scale: float = 1.0) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The target and the start of ``docs/adapters.md`` (start scaled by ``scale``)."""
    generator = torch.Generator().manual_seed(0)
    target = (torch.randn(N, H, generator=generator, dtype=torch.float64)
              @ torch.randn(M, H, generator=generator, dtype=torch.float64).T)
    start = (scale * torch.randn(N, H, generator=generator, dtype=torch.float64),
             scale * torch.randn(M, H, generator=generator, dtype=torch.float64))
    return target, start


def relative_error(G: torch.Tensor, H: torch.Tensor, target: torch.Tensor) -> float:
    return float((G @ H.mT - target).norm() / target.norm())


def run_sgd(metric: str, lr: float, steps: int, *, scale: float = 1.0,
            retraction: int | str | None = None, tol: float = 0.0) -> dict:
    """One RiemannianSGD run: final error, whether it was stable, steps to ``tol``."""
    import geoopt

    import quotientsharp as qs
    from quotientsharp.core.adapters import QuotientManifold

    target, start = problem(scale)
    options = {} if retraction is None else {"retraction": retraction}
    manifold = QuotientManifold(qs.GLQuotient(metric), ((N, H), (M, H)), **options)
    parameter = geoopt.ManifoldParameter(manifold.merge(start), manifold=manifold)
    optimizer = geoopt.optim.RiemannianSGD([parameter], lr=lr)
    first = relative_error(*start, target)
    reached = None
    try:
        for step in range(steps):
            optimizer.zero_grad()
            G, Hm = manifold.split(parameter)
            (0.5 * (G @ Hm.mT - target).square().sum()).backward()
            optimizer.step()
            if tol:
                with torch.no_grad():
                    if relative_error(*manifold.split(parameter), target) <= tol:
                        reached = step + 1
                        break
    except ValueError:               # the adapter refuses a diverged iterate
        return {"stable": False, "error": math.inf, "steps_to_tol": None}
    with torch.no_grad():
        error = relative_error(*manifold.split(parameter), target)
    stable = math.isfinite(error) and error < first
    return {"stable": stable, "error": error, "steps_to_tol": reached}


def predicted_lr(metric: str, scale: float) -> float | None:
    """The stability bound ``2 / curvature`` of gradient descent at the start, per metric.

    The loss's curvature along ``G`` is ``H^T H`` (along ``H``: ``G^T G``). The Riemannian
    gradient applies the inverse metric: ``euclidean`` leaves it, so the bound is about
    ``2 / (l_G + l_H)`` (``l`` the largest eigenvalue of the Gram matrix, the two blocks
    coupled); ``inv`` multiplies it by ``G^T G`` (``H^T H``), giving ``2 / (l_G l_H)``; ``mix``
    multiplies it by ``(H^T H)^{-1}`` (``(G^T G)^{-1}``), which cancels it: ``None``, no bound
    that depends on the weights.
    """
    _, (G, Hm) = problem(scale)
    l_g = float(torch.linalg.eigvalsh(G.T @ G)[-1])
    l_h = float(torch.linalg.eigvalsh(Hm.T @ Hm)[-1])
    return {"inv": 2 / (l_g * l_h), "euclidean": 2 / (l_g + l_h)}.get(metric)


def lr_grid(low: float = 1e-5, high: float = 10.0, per_decade: int = 4) -> list[float]:
    count = round(math.log10(high / low) * per_decade)
    return [float(f"{low * 10 ** (k / per_decade):.3g}") for k in range(count + 1)]


def largest_stable(runs: Sequence[tuple[float, dict]]) -> float | None:
    """The largest lr whose run and the runs of all smaller lrs were stable."""
    best = None
    for lr, outcome in sorted(runs, key=lambda item: item[0]):
        if not outcome["stable"]:
            break
        best = lr
    return best


def step_time(metric: str, retraction: int | str, repeats: int) -> list[float]:
    """CPU seconds of single optimizer steps (from the same start each time)."""
    import geoopt

    import quotientsharp as qs
    from quotientsharp.core.adapters import QuotientManifold

    target, start = problem()
    manifold = QuotientManifold(qs.GLQuotient(metric), ((N, H), (M, H)), retraction=retraction)
    times = []
    for _ in range(repeats):
        parameter = geoopt.ManifoldParameter(manifold.merge(start), manifold=manifold)
        optimizer = geoopt.optim.RiemannianSGD([parameter], lr=0.5)
        begin = time.process_time()
        optimizer.zero_grad()
        G, Hm = manifold.split(parameter)
        (0.5 * (G @ Hm.mT - target).square().sum()).backward()
        optimizer.step()
        times.append(time.process_time() - begin)
    return times


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    parser.add_argument("--scales", type=float, nargs="+", default=[0.5, 1.0, 2.0],
                        help="scales of the start (both factors)")
    parser.add_argument("--repeats", type=int, default=100, help="timed steps per order")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run for the test-suite: 40 steps, one scale, a coarse grid")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    grid = lr_grid()
    if args.quick:
        args.steps, args.scales, args.repeats = 40, [1.0], 3
        grid = lr_grid(1e-4, 1.0, per_decade=2)
    out: dict = {"problem": {"n": N, "m": M, "h": H, "steps": args.steps}, "stable": [],
                 "orders": []}

    print(f"1. RiemannianSGD, default retraction, {args.steps} steps, lr grid "
          f"{grid[0]:g} .. {grid[-1]:g} ({len(grid)} values)")
    print(f"   {'metric':<10} {'scale':>5} {'largest stable lr':>18} {'predicted':>10} "
          f"{'best lr':>8} {'best rel. error':>16}")
    for metric in METRICS:
        for scale in args.scales:
            runs = [(lr, run_sgd(metric, lr, args.steps, scale=scale)) for lr in grid]
            stable = largest_stable(runs)
            finite = [(o["error"], lr) for lr, o in runs if o["stable"]]
            best_error, best_lr = min(finite) if finite else (math.inf, None)
            bound = predicted_lr(metric, scale)
            out["stable"].append(dict(metric=metric, scale=scale, largest_stable_lr=stable,
                                      predicted_lr=bound, best_lr=best_lr,
                                      best_error=best_error))
            print(f"   {metric:<10} {scale:>5g} {stable if stable is not None else '-':>18} "
                  f"{f'{bound:.2g}' if bound is not None else 'scale-free':>10} "
                  f"{best_lr if best_lr is not None else '-':>8} {best_error:>16.1e}")

    print("\n2. retraction orders, mix metric, lr 0.5: CPU time per optimizer step (one thread,"
          " median), relative to order 1, steps to relative error 1e-9")
    timings: dict = {order: [] for order in ORDERS}
    rounds = 10 if args.repeats >= 10 else 1
    for _ in range(rounds):        # interleaved rounds: slow drifts hit every order alike
        for order in ORDERS:
            timings[order] += step_time("mix", order, args.repeats // rounds)
    base = statistics.median(timings[1])
    for order in ORDERS:
        median = statistics.median(timings[order])
        reached = run_sgd("mix", 0.5, 400, retraction=order, tol=1e-9)["steps_to_tol"]
        out["orders"].append(dict(retraction=str(order), step_ms=1e3 * median,
                                  relative=median / base, steps_to_tol=reached))
        print(f"   retraction={order!s:<6} {1e3 * median:8.3f} ms/step  x{median / base:6.1f}  "
              f"{reached if reached is not None else '>400':>4} steps")

    print("\n3. largest stable lr per retraction order, mix metric")
    # the quick run leaves out the exact geodesic here: it costs most of the run's time
    for order in ORDERS[:2] if args.quick else ORDERS:
        runs = [(lr, run_sgd("mix", lr, args.steps, retraction=order)) for lr in grid
                if lr >= 0.01]
        stable = largest_stable(runs)
        out["orders"][ORDERS.index(order)]["largest_stable_lr"] = stable
        print(f"   retraction={order!s:<6} {stable}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
