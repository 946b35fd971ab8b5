"""The ascent's fused paths against their elementary forms, in one process (A/B).

The order-2 point of a GL(h) pair runs, with its backward, at every step of a geodesic ascent.
``OrderTwoGLPath`` (``quotientsharp/core/gl/point.py``) computes it as one autograd function
with a hand-written backward; the elementary form is ``x + t u - t^2/2 Gamma(u, u)`` with the
same contraction, differentiated by autograd (``FrozenPoint.geodesic``). Both are switched in
one process, interleaved round by round (A B A B ...), and compared pair by pair, so that a
drift of the machine's speed cancels. Two figures, process CPU time, one thread:

- ``point``: the order-2 point and its backward on MiniLM's GL blocks (two buckets of 72 head
  pairs, 385 x 32, float32), in ms per call, fused and elementary;
- ``step``: whole ``quotientsharp.sharpness`` calls (geodesic mix and inv, order 2,
  ``n_iter = 10``) on the real MiniLM at 8 x 32 tokens, the paired difference per iteration in
  ms and over one plain forward+backward;
- ``step adaptive``: the same for adaptive sharpness, switching the adaptive metric's gradient
  with its norm in one call (``AdaptivePoint.riemannian_gradient_and_squared_norm``) against
  the gradient followed by its norm (the ``FrozenPoint`` default).

Run: ``python benchmarks/fused_paths.py [--rounds 8] [--tiny]`` (``--tiny``: small blocks and
a tiny BERT, the smoke test).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _cpu_seconds(function: Callable[[], object]) -> float:
    start = time.process_time()
    function()
    return time.process_time() - start


class Switch:
    """Selects the fused or the elementary form of one method (default: the order-2 point of
    every GL frozen point)."""

    def __init__(self, owner: type | None = None, name: str = "geodesic") -> None:
        from quotientsharp.core.frozen import FrozenPoint
        from quotientsharp.core.gl.point import GLPoint

        self._owner = owner or GLPoint
        self._name = name
        self._fused, self._plain = getattr(self._owner, name), getattr(FrozenPoint, name)

    def __call__(self, variant: str) -> None:
        setattr(self._owner, self._name, self._fused if variant == "fused" else self._plain)

    def restore(self) -> None:
        self("fused")


def _paired(functions: dict[str, Callable[[], object]], switch: Switch, rounds: int
            ) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"fused": [], "elementary": []}
    for variant in times:                       # a first call of each (caches, allocator)
        switch(variant)
        functions[variant]()
    for _ in range(rounds):
        for variant in times:
            switch(variant)
            times[variant].append(_cpu_seconds(functions[variant]))
    switch.restore()
    return times


def point_figures(switch: Switch, rounds: int, pairs: int, rows: int, head: int
                  ) -> dict[str, float]:
    """The order-2 point with its backward, two buckets of ``pairs`` head pairs."""
    import quotientsharp as qs

    gen = torch.Generator().manual_seed(0)
    cases = []
    for metric in ("mix", "inv"):
        G, H = (0.05 * torch.randn(pairs, rows, head, generator=gen) for _ in range(2))
        frozen = qs.GLQuotient(metric).at((G, H))
        frozen.factorise()
        u = frozen.horizontal_projection(tuple(1e-3 * torch.randn(pairs, rows, head,
                                                                  generator=gen)
                                               for _ in range(2)))
        pull = tuple(torch.randn(pairs, rows, head, generator=gen) for _ in range(2))
        cases.append((metric, frozen, u, pull))
    figures: dict[str, float] = {}
    for metric, frozen, u, pull in cases:
        def call(frozen=frozen, u=u, pull=pull) -> None:
            leaves = tuple(t.detach().requires_grad_(True) for t in u)
            torch.autograd.grad(frozen.geodesic(leaves, 1.0, 2), leaves, pull)

        times = _paired({"fused": call, "elementary": call}, switch, rounds)
        for variant, samples in times.items():
            figures[f"point {metric} {variant} ms"] = 1000 * statistics.median(samples)
    return figures


def step_figures(switch: Switch, rounds: int, tiny: bool,
                 measures: tuple[str, ...] = ("geodesic mix", "geodesic inv")
                 ) -> dict[str, float]:
    """Whole ascents at ``n_iter = 10``: the paired difference per iteration."""
    import minilm
    from _common import benchmark_model

    import quotientsharp as qs

    device = torch.device("cpu")
    model, batch = benchmark_model("minilm", device, tiny)
    minilm.forward_backward(model, batch)
    unit = min(_cpu_seconds(lambda: minilm.forward_backward(model, batch)) for _ in range(3))
    figures: dict[str, float] = {"forward_backward ms": 1000 * unit}
    for name in measures:
        def call(options=minilm.MEASURES[name]) -> None:
            qs.sharpness(model, [batch], rho=0.05, n_iter=10, progress=False, reach=False,
                         **options)

        times = _paired({"fused": call, "elementary": call}, switch, rounds)
        paired = [(f - e) / 10 for f, e in zip(times["fused"], times["elementary"],
                                                strict=True)]
        figures[f"step {name} fused minus elementary ms per iteration"] = (
            1000 * statistics.median(paired))
        figures[f"step {name} fused minus elementary over forward+backward"] = (
            statistics.median(paired) / unit)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="small sizes (smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    switch = Switch()
    sizes = (4, 9, 4) if args.tiny else (72, 385, 32)
    figures = point_figures(switch, args.rounds, *sizes)
    figures.update(step_figures(switch, args.rounds, args.tiny))
    from quotientsharp.core.adaptive import AdaptivePoint

    adaptive = Switch(AdaptivePoint, "riemannian_gradient_and_squared_norm")
    figures.update(step_figures(adaptive, args.rounds, args.tiny, ("adaptive",)))
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
