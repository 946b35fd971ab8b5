"""Families of small models measured at once (row 4 of ``benchmarks/run.py``).

One ascent step of geodesic sharpness (order 2) for every model of a family: the point
``theta + xi - Gamma(xi, xi) / 2``, the loss and its gradient with respect to ``xi`` through that
point, the Riemannian gradient (raised, horizontal, normalised) and the projected step
``P_S(xi + eta d)``. The step is one pure function of one model's tensors; the family is measured

- batched: the models' tensors stacked on a leading dimension and the step mapped over it with
  ``torch.func.vmap`` (quotient operations, the functional forward and backward: all batched);
- looped: the same function called once per model in a Python loop.

Both use the closed forms of :class:`~quotientsharp.DiagonalQuotient` and
:class:`~quotientsharp.GLQuotient` with value checks off (as in the engine's hot loop) and the
Gram factorisations computed once per base point, outside the step (as the engine does).

Families:

- diagonal networks ``y = X (u * v)`` (SPEC section 2), each with its own data (one step, as
  above); and the full Auto-PGD ascent of :mod:`quotientsharp.reproduce.diagonal.batched_ascent`
  over all nets at once against the same function looped (:func:`diagonal_ascent_family`);
- small transformer classifiers (token embedding, ``layers`` self-attention blocks with
  ``q_proj/k_proj/v_proj/o_proj`` and a LayerNorm, mean pooling, a linear head), one shared
  batch; attention pairs in GL(h) coordinates through
  :class:`~quotientsharp.models.ParameterLayout`, everything else with the adaptive metric of
  SPEC section 4.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from quotientsharp import DiagonalQuotient, GLQuotient, value_checks
from quotientsharp.core.adaptive import AdaptiveQuotient
from quotientsharp.models import ParameterLayout, find_symmetries

__all__ = ["DiagonalNet", "Family", "TinyTransformer", "diagonal_ascent_family",
           "diagonal_family", "transformer_family"]


@dataclass
class Family:
    """A family ready to time: ``batched()`` and ``looped()`` each do one step for every model.

    ``check()`` returns the largest difference between the two results (losses and steps)
    relative to the largest magnitude (at least 1), which must be at rounding level.
    """

    name: str
    models: int
    parameters_per_model: int
    batched: Callable[[], object]
    looped: Callable[[], object]
    check: Callable[[], float]


def _tiny(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).tiny


def _max_difference(batched, looped) -> float:
    flat_b = torch.utils._pytree.tree_leaves(batched)
    flat_l = [torch.stack(parts) for parts in zip(
        *[torch.utils._pytree.tree_leaves(item) for item in looped], strict=True)]
    return max(float((b - lo).abs().max() / lo.abs().max().clamp_min(1.0))
               for b, lo in zip(flat_b, flat_l, strict=True))


# ---------------------------------------------------------------------------- diagonal networks
def diagonal_family(models: int, d: int, samples: int, metric: str, rho: float,
                    dtype: torch.dtype, device: torch.device, seed: int = 0) -> Family:
    """``models`` diagonal networks of width ``d``, each with ``samples`` data points."""
    generator = torch.Generator().manual_seed(seed)
    quotient = DiagonalQuotient(metric)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    support = (torch.rand(models, d, generator=generator) < 0.1).to(dtype).to(device)
    beta_star = support * draw(models, d)
    inputs = draw(models, samples, d)
    targets = (inputs @ beta_star.unsqueeze(-1)).squeeze(-1)
    # nonzero factors of random sign around |u| = |v| = 1
    u = (draw(models, d).sign() * (0.5 + torch.rand(models, d, generator=generator,
                                                    dtype=dtype).to(device)))
    v = (draw(models, d).sign() * (0.5 + torch.rand(models, d, generator=generator,
                                                    dtype=dtype).to(device)))
    xi = quotient.horizontal_projection((u, v), (draw(models, d), draw(models, d)))
    xi = tuple(t * (0.5 * rho / quotient.norm((u, v), xi).unsqueeze(-1)) for t in xi)
    eta = 2.0 * rho

    def step(u, v, xi_u, xi_v, x, y):
        base = (u, v)

        def loss_of(direction):
            moved = quotient.geodesic(base, direction, t=1.0, order=2)
            return (x @ (moved[0] * moved[1]) - y).square().mean()

        egrad, loss = torch.func.grad_and_value(loss_of)((xi_u, xi_v))
        rgrad = quotient.euclidean_to_riemannian_gradient(base, egrad)
        scale = eta / quotient.norm(base, rgrad).clamp_min(_tiny(dtype))
        z = quotient.horizontal_projection(base, (xi_u + scale * rgrad[0],
                                                  xi_v + scale * rgrad[1]))
        factor = (rho / quotient.norm(base, z).clamp_min(_tiny(dtype))).clamp(max=1.0)
        return loss, factor * z[0], factor * z[1]

    mapped = torch.func.vmap(step)

    def batched():
        with value_checks(False):
            return mapped(u, v, xi[0], xi[1], inputs, targets)

    def looped():
        with value_checks(False):
            return [step(u[i], v[i], xi[0][i], xi[1][i], inputs[i], targets[i])
                    for i in range(models)]

    return Family(f"diagonal ({models} nets, d={d}, {metric})", models, 2 * d, batched, looped,
                  lambda: _max_difference(batched(), looped()))


# ---------------------------------------------------------------------------- diagonal: full ascent
class DiagonalNet(nn.Module):
    """``y = x^T (u * v)``, marked ``diagonal = True`` for symmetry discovery."""

    diagonal = True

    def __init__(self, u: torch.Tensor, v: torch.Tensor) -> None:
        super().__init__()
        self.u, self.v = nn.Parameter(u.clone()), nn.Parameter(v.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.u * self.v)


def diagonal_ascent_family(models: int, d: int, samples: int, metric: str, rho: float,
                           n_iter: int, dtype: torch.dtype, device: torch.device,
                           seed: int = 0) -> tuple[Family, Callable[[], list[float]]]:
    """Geodesic sharpness (order 2, full Auto-PGD) of ``models`` diagonal nets on one batch.

    ``batched``: one :func:`quotientsharp.reproduce.diagonal.batched_ascent.batched_ascend` call
    over the problem shape ``[models, 1]``; ``looped``: the same function once per model (problem
    shape ``[1, 1]``). Also returns ``engine_loop``, a loop of
    :func:`quotientsharp.sharpness` over the models as ``nn.Module`` instances (the same
    quantity through the general engine).
    """
    from quotientsharp.engine import AscentSettings, sharpness
    from quotientsharp.reproduce.diagonal.batched_ascent import (
        DiagonalHorizontalGeometry,
        batched_ascend,
        mse_objective,
    )

    generator = torch.Generator().manual_seed(seed)
    support = torch.rand(d, generator=generator) < 0.1
    beta_star = (support * torch.randn(d, generator=generator)).to(dtype)
    inputs = torch.randn(samples, d, generator=generator, dtype=dtype)
    targets = inputs @ beta_star

    def factor() -> torch.Tensor:
        sign = torch.randint(0, 2, (models, d), generator=generator).to(dtype) * 2 - 1
        return sign * (0.5 + torch.rand(models, d, generator=generator, dtype=dtype))

    u, v = factor().to(device), factor().to(device)
    inputs, targets = inputs.to(device), targets.to(device)
    settings = AscentSettings(n_iter=n_iter)

    def ascend(u_part: torch.Tensor, v_part: torch.Tensor) -> torch.Tensor:
        count = u_part.shape[0]
        geometry = DiagonalHorizontalGeometry(u_part.unsqueeze(1), v_part.unsqueeze(1), metric,
                                              2, rho, (count, 1))
        outcome = batched_ascend(geometry, mse_objective(geometry, inputs[None], targets[None]),
                                 settings)
        return outcome.sharpness[:, 0]

    def batched():
        return ascend(u, v)

    def looped():
        return [ascend(u[i:i + 1], v[i:i + 1])[0] for i in range(models)]

    nets = [DiagonalNet(u[i], v[i]) for i in range(models)]

    def engine_loop() -> list[float]:
        return [sharpness(net, [(inputs, targets)], measure="geodesic", metric=metric, order=2,
                          rho=rho, n_iter=n_iter, loss="mse", progress=False, reach=False).value
                for net in nets]

    def check() -> float:
        together, alone = batched(), torch.stack(looped())
        return float((together - alone).abs().max() / alone.abs().max().clamp_min(1.0))

    family = Family(f"diagonal ({models} nets, d={d}, {metric}, full ascent, batched_ascent)",
                    models, 2 * d, batched, looped, check)
    return family, engine_loop


# ---------------------------------------------------------------------------- small transformers
class TinyAttention(nn.Module):
    """Multi-head self-attention with ``q_proj``/``k_proj``/``v_proj``/``o_proj`` projections."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.v_proj, self.o_proj = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        heads = self.num_heads
        head_dim = width // heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, tokens, heads, head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), dim=-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(batch, tokens, width))


class TinyTransformer(nn.Module):
    """Token embedding, ``layers`` post-norm attention blocks, mean pooling, a linear head."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.attention = nn.ModuleList([TinyAttention(width, heads) for _ in range(layers)])
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(layers)])
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for attention, norm in zip(self.attention, self.norms, strict=True):
            x = norm(x + attention(x))
        return self.head(x.mean(dim=1))


def transformer_family(models: int, width: int, heads: int, layers: int, tokens: int,
                       batch: int, metric: str, rho: float, dtype: torch.dtype,
                       device: torch.device, seed: int = 0, vocab: int = 64,
                       classes: int = 4) -> Family:
    """``models`` :class:`TinyTransformer` instances (independent initialisations), one batch."""
    torch.manual_seed(seed)
    instances = [TinyTransformer(vocab, width, heads, layers, classes).to(device=device,
                                                                         dtype=dtype)
                 for _ in range(models)]
    template = instances[0]
    report = find_symmetries(template)
    named = [{n: p.detach() for n, p in m.named_parameters()} for m in instances]
    layout = ParameterLayout(report, named[0])
    quotient = GLQuotient(metric)
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (batch, tokens), generator=generator).to(device)
    labels = torch.randint(0, classes, (batch,), generator=generator).to(device)
    eta = 2.0 * rho

    def coordinates(params):
        coords = layout.to_coordinates(params)
        gl = [tuple(pair) for pair in coords.gl]
        other_names = list(coords.other)
        other = [coords.other[n] for n in other_names]
        return coords, gl, other_names, other

    per_model = [coordinates(p) for p in named]
    coords0, _, other_names, _ = per_model[0]
    gl_base = [[pm[1][b] for pm in per_model] for b in range(len(coords0.gl))]
    other_base = [[pm[3][i] for pm in per_model] for i in range(len(other_names))]

    gl_stacked = [tuple(torch.stack([bucket[m][f] for m in range(models)]) for f in (0, 1))
                  for bucket in gl_base]
    other_stacked = [torch.stack(parts) for parts in other_base]
    # the adaptive geometry of the other parameters, one model's point per call (unfused: the
    # same formula with and without vmap)
    other_quotient = AdaptiveQuotient("adaptive", point_ndims=[w.dim() - 1 for w in other_stacked],
                                      fused=False)
    # a random horizontal start of norm rho / 2 per model
    with value_checks(False):
        frozen_gl = [quotient.frozen_point(pair) for pair in gl_stacked]
        xi_gl = [frozen.horizontal_projection(
            tuple(torch.randn(t.shape, generator=generator, dtype=dtype).to(device) for t in pair))
            for pair, frozen in zip(gl_stacked, frozen_gl, strict=True)]
        norm_sq = sum(frozen.squared_norm(xi).sum(-1)
                      for frozen, xi in zip(frozen_gl, xi_gl, strict=True))
    xi_other = [0.1 * w * torch.randn(w.shape, generator=generator, dtype=dtype).to(device)
                for w in other_stacked]
    norm_sq = norm_sq + other_quotient.frozen_point(other_stacked).squared_norm(xi_other)
    start_scale = 0.5 * rho / norm_sq.sqrt()

    def per_model_scale(t: torch.Tensor) -> torch.Tensor:
        return start_scale.reshape(-1, *([1] * (t.dim() - 1))) * t

    xi_gl = [tuple(per_model_scale(t) for t in xi) for xi in xi_gl]
    xi_other = [per_model_scale(t) for t in xi_other]

    def step(gl, other, xi_g, xi_o):
        # one model's geometry, frozen inside the step (vmap maps tensors, not objects)
        frozen_g = [quotient.frozen_point(pair) for pair in gl]
        frozen_o = other_quotient.frozen_point(other)

        def norm_sq_of(vec_g, vec_o):
            total = sum(frozen.squared_norm(w).sum() for frozen, w in zip(frozen_g, vec_g,
                                                                         strict=True))
            return total + frozen_o.squared_norm(vec_o)

        def loss_of(vec_g, vec_o):
            moved = [frozen.geodesic(w, 1.0, 2) for frozen, w in zip(frozen_g, vec_g,
                                                                     strict=True)]
            point_other = dict(zip(other_names, frozen_o.geodesic(vec_o, 1.0, 1), strict=True))
            params = layout.to_parameters(coords0.replace(gl=moved, other=point_other))
            logits = torch.func.functional_call(template, params, (ids,))
            return F.cross_entropy(logits, labels)

        (e_g, e_o), loss = torch.func.grad_and_value(loss_of, argnums=(0, 1))(xi_g, xi_o)
        r_g = [frozen.riemannian_gradient(e) for frozen, e in zip(frozen_g, e_g, strict=True)]
        r_o = list(frozen_o.riemannian_gradient(tuple(e_o)))
        scale = eta / norm_sq_of(r_g, r_o).sqrt().clamp_min(_tiny(dtype))
        z_g = [frozen.horizontal_projection(tuple(a + scale * b for a, b in zip(w, r,
                                                                                strict=True)))
               for frozen, w, r in zip(frozen_g, xi_g, r_g, strict=True)]
        z_o = [d + scale * r for d, r in zip(xi_o, r_o, strict=True)]
        factor = (rho / norm_sq_of(z_g, z_o).sqrt().clamp_min(_tiny(dtype))).clamp(max=1.0)
        return (loss, [tuple(factor * t for t in z) for z in z_g], [factor * t for t in z_o])

    mapped = torch.func.vmap(step)

    def batched():
        with value_checks(False):
            return mapped(gl_stacked, other_stacked, xi_gl, xi_other)

    def take(tree, index):
        return torch.utils._pytree.tree_map(
            lambda t: t[index] if isinstance(t, torch.Tensor) else t, tree)

    per_model_args = [take((gl_stacked, other_stacked, xi_gl, xi_other), i)
                      for i in range(models)]

    def looped():
        with value_checks(False):
            return [step(*args) for args in per_model_args]

    parameters = sum(p.numel() for p in template.parameters())
    return Family(f"transformer ({models} models, width {width}, {heads} heads, {layers} layers, "
                  f"{metric})", models, parameters, batched, looped,
                  lambda: _max_difference(batched(), looped()))
