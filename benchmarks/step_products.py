"""Products of size ``n h^2`` per GL head pair in one order-2 ascent iteration, by phase.

An attention head pair ``(G, H)`` (``shape=[n, h]`` each) costs the geodesic measures the
``h x h`` algebra of its quotient at every ascent iteration: the order-2 point and its backward,
the raise and the horizontal projection of the gradient, the norms. Each product that meets a
factor's ``n`` rows (``[n, h] @ [h, h]`` or ``[h, n] @ [n, h]``) costs ``n h^2`` multiply-adds;
the ``h x h`` algebra (``h^3``) is negligible for ``n >> h``. This script counts them on the
operator trace (``TorchDispatchMode``, aten level, CPU): it runs the engine's own solver
(:func:`quotientsharp.engine.solver.ascend`) on the engine's own ball
(:func:`quotientsharp.engine.geometry.build_geometry` of a bucket of ``P`` heads, folded as the
engine folds them) at ``n_iter = lo`` and ``hi`` with a loss that is elementwise in the point
(so that the model contributes no product), and divides the difference by ``hi - lo``: the
setup (Gram matrices, factorisations, the first evaluation) cancels.

Every product is weighed by its cost: ``units = multiply-adds / (P n h^2)``, so that a product
with a ``2h`` inner dimension counts 2, and an ``h x h`` product ``h / n``. A product counts as
``n h^2`` when its cost per head is at least ``n h^2``; the rest is reported as ``h^3``.

Phases (the ball's method running when the product was dispatched): ``clip`` (the two radial
rescales of a step: their norms), ``point`` (the order-2 path, forward), ``backward`` (its
backward, inside the objective's ``autograd.grad``), ``direction`` (raise, horizontal
projection and norm of the gradient).

Run ``python benchmarks/step_products.py [--n 96 --h 8 --heads 3] [--eps 0 1e-3] [--json F]``.

Measured (torch 2.13 on the CPU; the count does not depend on the machine), products of
``n h^2`` per head pair and iteration, ``clip / point / backward / direction``, the same for mix
and inv at ``eps = 0`` and ``1e-3``:

- now (and at fde9f79): 30 = 4 / 8 / 10 / 8.
- Tried and not merged: 26 = 4 / 8 / 10 / 4, the direction reading the gradient's crosses
  ``F^T e`` from the path's backward (``h x h`` algebra on the backward's own reductions,
  handed over through a cache keyed on the gradient tensor) and its squared norm as the
  pairing ``sum(grad * e)``. In float64 it raised the direction's error on ill-conditioned
  pairs about fifty-fold (condition 300: 3e-10 against 6e-12 before, against exact rational
  arithmetic; condition 1000: 2e-8), and a cache across autograd calls is a hazard the saving
  (4 of 30 products) does not pay for.

What the engine's interface leaves: the two radial rescales of a step each take a norm of a
vector the solver made (4); the point needs the crosses and squares of ``u`` (4) and two
products per factor (4); its backward the two reductions of the upstream gradient per factor
(4) and the gradient ``g A + F X + u Y`` (6), which autograd hands on as a tensor; the
direction the crosses ``F^T e``, the raise and ``V(L)`` and the norm (8). Passing on the
crosses and pairing the norm would save 4 (above), a handoff of the gradient in factored form
(``g`` with ``h x h`` coefficients, which the ball and the solver would have to accept instead
of a tensor) 2 more. The issue's target of 10 is below the step's floor: the point
needs 8, and the upstream gradient ``g``, new at every step, enters through at least its two
reductions and one product per factor (6), 14 before any direction or norm.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import launches_kernel  # noqa: E402

#: aten operators that multiply matrices, with the (batch, a, b, c) of ``[a, b] @ [b, c]``
PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "_addmm_activation"}
#: aten operators on h x h matrices (factorisations and solves): reported, never n h^2
LINALG_PREFIXES = ("linalg_", "_linalg_", "cholesky", "triangular_solve")
PHASES = ("clip", "point", "backward", "direction")


def _product_dims(name: str, args: Sequence[Any]) -> tuple[int, int, int, int]:
    """``(batch, a, b, c)`` of the product ``[batch, a, b] @ [batch, b, c]``."""
    if name in ("addmm", "baddbmm", "addbmm", "_addmm_activation"):
        left, right = args[1], args[2]
    else:
        left, right = args[0], args[1]
    batch = math.prod(left.shape[:-2]) if left.dim() > 2 else 1
    return batch, left.shape[-2], left.shape[-1], right.shape[-1]


@dataclass
class ProductTrace(TorchDispatchMode):
    """Records the matrix products dispatched while active, by phase.

    Attributes
    ----------
    rows, h, heads
        ``n``, ``h`` and ``P`` of the traced bucket: a product's cost in units of
        ``P n h^2`` is ``batch a b c / (P n h^2)``.
    phase
        The label products are recorded under (set by :meth:`labelled`).
    units
        ``(phase, operator, shape class) -> units``.
    operators
        ``phase -> computing operators`` (views left out).
    """

    rows: int
    h: int
    heads: int
    phase: str = "other"
    units: defaultdict[tuple[str, str, str], float] = field(
        default_factory=lambda: defaultdict(float))
    operators: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self) -> None:
        super().__init__()

    def _label(self, size: int) -> str:
        names = {self.rows: "n", self.h: "h", self.heads * self.rows: "Pn", 2 * self.h: "2h",
                 3 * self.h: "3h"}
        return names.get(size, str(size))

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        name = func.overloadpacket.__name__
        if launches_kernel(func):
            self.operators[self.phase] += 1
        # an in-place variant (baddbmm_, addmm_) is the same product
        base = name[:-1] if name.endswith("_") else name
        if base in PRODUCTS:
            batch, a, b, c = _product_dims(base, args)
            cost = batch * a * b * c
            shape = "x".join(self._label(d) for d in (a, b, c))
            big = cost >= self.heads * self.rows * self.h * self.h
            kind = "n h^2" if big else "h^3"
            self.units[(self.phase, f"{name} {shape}", kind)] += (
                cost / (self.heads * self.rows * self.h * self.h))
        elif name.startswith(LINALG_PREFIXES):
            self.units[(self.phase, name, "h^3")] += 0.0
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def labelled(self, phase: str) -> Iterator[None]:
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous

    def total(self, kind: str = "n h^2") -> float:
        return sum(v for (_, _, k), v in self.units.items() if k == kind)


def _elementwise_objective(ball: Any, weights: Sequence[torch.Tensor],
                           trace: ProductTrace) -> Callable[..., Any]:
    """``xi -> (L, dL/dxi)`` with ``L = sum(w * tanh(point))``: no product of its own."""

    def objective(xi: Sequence[torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            point = ball.point(leaves)
            loss = sum((w * torch.tanh(p)).sum() for w, p in zip(weights, point, strict=True))
            assert isinstance(loss, torch.Tensor)
            with trace.labelled("backward"):
                grads = torch.autograd.grad(loss, leaves)
        return loss.detach(), tuple(grads)

    return objective


def _labelled(trace: ProductTrace, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with the products it dispatches recorded under ``phase``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with trace.labelled(phase):
            return method(*args, **kwargs)

    return run


def bucket(n: int, h: int, heads: int, seed: int = 0, dtype: torch.dtype = torch.float64
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A bucket of ``heads`` Gaussian head pairs, ``shape=[heads, n, h]`` each."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(heads, n, h, generator=generator, dtype=dtype),
            torch.randn(heads, n, h, generator=generator, dtype=dtype))


def count_iteration(metric: str, eps: float = 0.0, n: int = 96, h: int = 8, heads: int = 3,
                    iters: tuple[int, int] = (2, 6), seed: int = 0) -> ProductTrace:
    """Products per ascent iteration of one bucket (the difference of two ascents over the
    difference of their iterations), by phase; ``units`` are per head pair."""
    from quotientsharp.core.gl import GLQuotient
    from quotientsharp.engine.coordinates import Factor
    from quotientsharp.engine.geometry import build_geometry
    from quotientsharp.engine.solver import AscentSettings, ascend

    G, H = bucket(n, h, heads, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    weights = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in (G, H)]
    traces = []
    for n_iter in iters:
        ball = build_geometry([Factor(GLQuotient(metric, eps), (G, H), "gl", folded=1)],
                              radius=0.5, order=2)
        ball.validate()
        trace = ProductTrace(n, h, heads)
        objective = _elementwise_objective(ball, weights, trace)
        with contextlib.ExitStack() as stack:
            for phase in ("clip", "point", "direction"):
                labelled = _labelled(trace, phase, getattr(ball, phase))
                stack.enter_context(mock.patch.object(ball, phase, labelled))
            stack.enter_context(trace)
            ascend(ball, objective, AscentSettings(n_iter=n_iter))
        traces.append(trace)
    low, high = traces
    per_iteration = ProductTrace(n, h, heads)
    steps = iters[1] - iters[0]
    for key in set(low.units) | set(high.units):
        value = (high.units[key] - low.units[key]) / steps
        if abs(value) > 1e-12 or key[2] == "h^3":
            per_iteration.units[key] = round(value, 6)
    for phase in set(low.operators) | set(high.operators):
        per_iteration.operators[phase] = round(
            (high.operators[phase] - low.operators[phase]) / steps, 6)
    return per_iteration


def report(trace: ProductTrace) -> dict[str, Any]:
    """The per-iteration counts as a JSON-ready dict: by phase, operator and shape, totals."""
    rows = sorted(((p, o, k, v) for (p, o, k), v in trace.units.items() if v),
                  key=lambda r: (PHASES.index(r[0]) if r[0] in PHASES else 9, r[1]))
    by_phase: defaultdict[str, float] = defaultdict(float)
    for phase, _, kind, value in rows:
        if kind == "n h^2":
            by_phase[phase] += value
    return {"products": [{"phase": p, "operator": o, "class": k, "per_pair": v}
                         for p, o, k, v in rows],
            "n_h2_by_phase": dict(by_phase), "n_h2_per_pair": trace.total(),
            "h3_per_pair": trace.total("h^3"),
            "operators_by_phase": {p: trace.operators[p] for p in PHASES}}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--h", type=int, default=8)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--eps", type=float, nargs="+", default=[0.0, 1e-3])
    parser.add_argument("--json", default=None, help="also write the counts to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for metric in ("mix", "inv"):
        for eps in args.eps:
            label = f"geodesic {metric}, eps={eps:g}"
            counted = report(count_iteration(metric, eps, args.n, args.h, args.heads))
            results[label] = counted
            print(f"\n{label}: {counted['n_h2_per_pair']:.2f} products of n h^2 per head pair "
                  f"per iteration (h^3 work: {counted['h3_per_pair']:.2f} n h^2)")
            print(f"  {'phase':<10} {'n h^2':>6}  operators (the bucket's, per iteration)")
            for phase in PHASES:
                print(f"  {phase:<10} {counted['n_h2_by_phase'].get(phase, 0.0):6.2f}  "
                      f"{counted['operators_by_phase'][phase]:g}")
                for row in counted["products"]:
                    if row["phase"] == phase and row["class"] == "n h^2":
                        print(f"      {row['operator']:<22} {row['per_pair']:6.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
