"""The inv ball is a trust region on relative displacement; the mix ball is not.

For a GL pair ``(G, H)`` and ``S_G = G^T G + eps I``, a velocity of inv norm at most ``rho``
moves ``G`` by at most ``rho * sqrt(lambda_max(S_G))`` at first order, and the order-2 term
``Gamma_G(u, u) / 2`` is at most ``3/2 rho^2 sqrt(lambda_max(S_G))``, however small or
ill-conditioned the factors (``docs/sharpness.md``, "Reach and locality"). The bounds are
checked here against the singular values of the factors (the reference), on the package's
inner product and Christoffel contraction; the mix metric's counterpart, which lets ``G``
move by ``rho / sigma_min(H)``, shows that the check can fail.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import quotientsharp as qs

SLACK = 1 + 1e-10


def _pair(seed: int, n: int, m: int, h: int, scale: float, condition: float,
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random factors of the given scale, moved by a group element of the given condition."""
    generator = torch.Generator().manual_seed(seed)
    G = scale * torch.randn(n, h, generator=generator, dtype=torch.float64)
    H = scale * torch.randn(m, h, generator=generator, dtype=torch.float64)
    left, _ = torch.linalg.qr(torch.randn(h, h, generator=generator, dtype=torch.float64))
    right, _ = torch.linalg.qr(torch.randn(h, h, generator=generator, dtype=torch.float64))
    singular = torch.logspace(0, math.log10(condition), h, dtype=torch.float64)
    M = left @ torch.diag(singular) @ right
    return G @ torch.linalg.inv(M), H @ M.mT


def _largest_gram_root(factor: torch.Tensor, eps: float) -> float:
    return math.sqrt(torch.linalg.matrix_norm(factor, ord=2).item() ** 2 + eps)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("eps", [0.0, 1e-3])
@pytest.mark.parametrize("scale", [1.0, 1e-3])
@pytest.mark.parametrize("condition", [1.0, 100.0])
@pytest.mark.parametrize("rho", [0.05, 0.5, 2.0])
def test_an_inv_velocity_moves_each_factor_by_at_most_rho_times_its_scale(
        seed, eps, scale, condition, rho) -> None:
    G, H = _pair(seed, 7, 5, 3, scale, condition)
    point = qs.GLQuotient("inv", eps=eps).at((G, H))
    generator = torch.Generator().manual_seed(100 + seed)
    u = (torch.randn(G.shape, generator=generator, dtype=torch.float64),
         torch.randn(H.shape, generator=generator, dtype=torch.float64))
    norm = point.inner(u, u).sqrt()
    u = (rho * u[0] / norm, rho * u[1] / norm)
    second = point.christoffel(u)
    for index, (factor, velocity, gamma) in enumerate(zip((G, H), u, second, strict=True)):
        root = _largest_gram_root(factor, eps)
        assert torch.linalg.matrix_norm(velocity).item() <= rho * root * SLACK
        assert torch.linalg.matrix_norm(gamma / 2).item() <= 1.5 * rho ** 2 * root * SLACK
        # in the inv metric itself (what locality reads): rho and 3/2 rho^2, scale-free
        alone = [tuple(t if i == index else torch.zeros_like(t) for i, t in enumerate(pair))
                 for pair in (u, tuple(g / 2 for g in second))]
        assert point.norm(alone[0]).item() <= rho * SLACK
        assert point.norm(alone[1]).item() <= 1.5 * rho ** 2 * SLACK


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_the_first_order_bound_is_attained_and_the_mix_ball_breaks_it(seed, eps) -> None:
    G, H = _pair(seed, 6, 6, 3, 1e-2, 30.0)
    rho = 0.1
    unit = torch.zeros(G.shape[0], dtype=torch.float64)
    unit[0] = 1.0
    # inv: along the top eigenvector x of S_G, u_G = rho * unit x^T S_G^{1/2}
    gram_g = G.mT @ G + eps * torch.eye(3, dtype=torch.float64)
    values, vectors = torch.linalg.eigh(gram_g)
    u_inv = (rho * values[-1].sqrt() * torch.outer(unit, vectors[:, -1]), torch.zeros_like(H))
    inv = qs.GLQuotient("inv", eps=eps).at((G, H))
    assert inv.inner(u_inv, u_inv).item() == pytest.approx(rho ** 2, rel=1e-12)
    bound = rho * _largest_gram_root(G, eps)
    assert torch.linalg.matrix_norm(u_inv[0]).item() == pytest.approx(bound, rel=1e-12)
    # mix weighs u_G by S_H: along H's weakest direction a mix velocity of norm rho moves G by
    # rho / sqrt(lambda_min(S_H)), far beyond the inv bound where H is small
    gram_h = H.mT @ H + eps * torch.eye(3, dtype=torch.float64)
    values_h, vectors_h = torch.linalg.eigh(gram_h)
    u_mix = (rho / values_h[0].sqrt() * torch.outer(unit, vectors_h[:, 0]), torch.zeros_like(H))
    mix = qs.GLQuotient("mix", eps=eps).at((G, H))
    assert mix.inner(u_mix, u_mix).item() == pytest.approx(rho ** 2, rel=1e-12)
    assert torch.linalg.matrix_norm(u_mix[0]).item() > 10 * bound


def _tiny_bert(initializer_range: float):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        vocab_size=30, max_position_embeddings=16, num_labels=3, attn_implementation="eager",
        initializer_range=initializer_range)
    model = transformers.BertForSequenceClassification(config).to(torch.float64).eval()
    generator = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(0, 30, (4, 6), generator=generator),
             "attention_mask": torch.ones(4, 6, dtype=torch.long),
             "labels": torch.randint(0, 3, (4,), generator=generator)}
    return model, [batch]


@pytest.mark.parametrize("initializer_range", [0.002, 0.3])
def test_geodesic_inv_balls_stay_local_where_mix_balls_do_not(initializer_range) -> None:
    model, batches = _tiny_bert(initializer_range)
    rho = 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        # one ascent each: only where its best perturbation lies matters here
        inv = qs.sharpness(model, batches, measure="geodesic", metric="inv", order=2, rho=rho,
                           n_iter=5, progress=False, reach=False)
        mix = qs.sharpness(model, batches, measure="geodesic", metric="mix", order=2, rho=rho,
                           n_iter=5, progress=False, reach=False)
    # every GL factor of the best perturbation, read in the inv metric, within its bound
    # rho (1 + 3 rho / 2) / sqrt(h) (head dimension h = 8 here), every tensor outside them
    # within rho (1 + 3 rho / 2)
    assert inv.locality[0]["factor_displacement"] <= rho * (1 + 1.5 * rho) / math.sqrt(8)
    assert inv.locality[0]["displacement"] <= rho * (1 + 1.5 * rho)
    # the second-order half of ``local`` is not implied by the bound; on these models it holds
    assert inv.local
    if initializer_range < 0.01:
        # small factors: the mix ball moves some factor by more than its own norm
        assert not mix.local and mix.locality[0]["factor_displacement"] > 1
