"""Where one ascent iteration's time goes, phase by phase, on the real MiniLM or BERT-base.

The table's ratio says how much an iteration costs; this says what for. It wraps the phases
of an ascent step with process-CPU timers (one thread) and reports, per measure, each phase's
time per iteration (the difference between whole calls at ``n_iter = hi`` and ``lo``, over
``hi - lo``) next to one plain forward+backward of the same batch:

- ``model forward``: the loss at the perturbed parameters (``FunctionalModel.loss``);
- ``backward``: its gradient in the perturbation, through the model, the layout and the
  geometry's path (the objective's ``torch.autograd.grad``);
- ``path``: the perturbed point itself (``GeodesicBall.point``: the order-2 point of every
  factor and the layout);
- ``direction``: the Riemannian gradient normalised by its norm (``GeodesicBall.direction``);
- ``rescale``: the radial rescale into the ball, its norm included (``GeodesicBall.clip``);
- ``other``: the rest of the loop (steps, momentum, decisions, bookkeeping).

A timer inside another is not counted twice: each phase's time excludes the phases it calls.

Run: ``python benchmarks/phases.py [--model minilm|bert-base] [--measures adaptive ...]
[--sentences 8 --tokens 32] [--tiny]`` (``--tiny``: a tiny
BERT, the smoke test). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


class PhaseClock:
    """Exclusive process-CPU time per named phase (a nested phase's time is its own)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []      # [start, time spent in nested phases]

    def wrap(self, function: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([time.process_time(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                start, nested = self._stack.pop()
                spent = time.process_time() - start
                self.seconds[name] += spent - nested
                if self._stack:
                    self._stack[-1][1] += spent
        return timed

    def reset(self) -> None:
        self.seconds.clear()


def instrument(clock: PhaseClock) -> Callable[[], None]:
    """Wrap the phases (module docstring); returns the function that undoes it."""
    from quotientsharp.engine import ball, functional, geometry

    patches = [(ball.GeodesicBall, "point", "path"),
               (ball.GeodesicBall, "direction", "direction"),
               (ball.GeodesicBall, "clip", "rescale"),
               (functional.FunctionalModel, "loss", "model forward")]
    originals = [(owner, attribute, getattr(owner, attribute)) for owner, attribute, _ in patches]
    for owner, attribute, name in patches:
        setattr(owner, attribute, clock.wrap(getattr(owner, attribute), name))
    grad = torch.autograd.grad
    objective = geometry.perturbed_objective

    def timed_objective(*args: Any, **kwargs: Any) -> Any:
        inner = objective(*args, **kwargs)

        def call(xi: Any) -> Any:
            torch.autograd.grad = clock.wrap(grad, "backward")  # type: ignore[assignment]
            try:
                return inner(xi)
            finally:
                torch.autograd.grad = grad          # type: ignore[assignment]
        return call

    geometry.perturbed_objective = timed_objective  # type: ignore[assignment]

    def undo() -> None:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)
        geometry.perturbed_objective = objective  # type: ignore[assignment]
    return undo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--iters", type=int, nargs=2, default=(2, 10))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a tiny BERT (smoke test)")
    parser.add_argument("--model", default="minilm", choices=("minilm", "bert-base"),
                        help="the real MiniLM (row 7) or the BERT-base-sized model (row 8)")
    parser.add_argument("--measures", nargs="+", default=None,
                        help="a subset of the table's measures (default: all three)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import minilm
    from _common import benchmark_model, without_path_check

    import quotientsharp as qs

    device = torch.device("cpu")
    measures = {name: options for name, options in minilm.MEASURES.items()
                if args.measures is None or name in args.measures}
    if not measures:
        parser.error(f"--measures: choose from {sorted(minilm.MEASURES)}")
    model, batch = benchmark_model(args.model, device, args.tiny, args.sentences, args.tokens)

    def cpu(function: Callable[[], object]) -> float:
        start = time.process_time()
        function()
        return time.process_time() - start

    minilm.forward_backward(model, batch)
    unit = statistics.median(cpu(lambda: minilm.forward_backward(model, batch))
                             for _ in range(3))
    clock = PhaseClock()
    undo = instrument(clock)
    low, high = args.iters
    result: dict[str, Any] = {"forward_backward_ms": 1000 * unit}
    try:
        for name, options in measures.items():
            def call(n_iter: int, options: dict[str, Any] = options) -> None:
                with without_path_check():
                    qs.sharpness(model, [batch], rho=0.05, n_iter=n_iter, progress=False,
                                 reach=False, **options)

            call(1)
            rounds: list[dict[str, float]] = []
            for _ in range(args.repeats):
                spent = {}
                for n_iter in (low, high):
                    clock.reset()
                    total = cpu(lambda n_iter=n_iter: call(n_iter))
                    spent[n_iter] = {**clock.seconds, "total": total}
                phases = set(spent[low]) | set(spent[high])
                rounds.append({p: (spent[high].get(p, 0.0) - spent[low].get(p, 0.0))
                               / (high - low) for p in phases})
            per_iteration = {p: statistics.median(r.get(p, 0.0) for r in rounds)
                             for p in rounds[0]}
            named = sum(v for p, v in per_iteration.items() if p != "total")
            per_iteration["other"] = per_iteration["total"] - named
            result[name] = {f"{p} ms": round(1000 * v, 2) for p, v in per_iteration.items()}
            result[name]["total over forward+backward"] = round(per_iteration["total"] / unit, 3)
    finally:
        undo()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
