"""CUDA against CPU: GL and diagonal operations and sharpness runs (skipped without CUDA).

Run on a GPU machine with ``python -m pytest -m gpu`` (or ``bash benchmarks/gpu.sh``). Every
comparison is in float64 with tight tolerances: the closed forms are the same arithmetic on both
devices, so the results may differ only by rounding.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.core.gl.point import solve_sylvester_eig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")
TOLERANCE = 1e-10


def _close(cuda_values, cpu_values, tolerance: float = TOLERANCE) -> None:
    if isinstance(cpu_values, torch.Tensor):
        cuda_values, cpu_values = (cuda_values,), (cpu_values,)
    for on_cuda, on_cpu in zip(cuda_values, cpu_values, strict=True):
        assert on_cuda.device.type == "cuda"
        scale = on_cpu.abs().max().clamp_min(1.0)
        assert float((on_cuda.cpu() - on_cpu).abs().max() / scale) <= tolerance


def _to_cuda(values):
    return tuple(v.to(CUDA) for v in values)


@pytest.mark.parametrize("metric", ["inv", "mix", "euclidean"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gl_operations_match_cpu(metric, seed):
    generator = torch.Generator().manual_seed(seed)
    quotient = qs.GLQuotient(metric)
    x = quotient.random_point((6,), shapes=((17, 4), (16, 4)), generator=generator,
                              dtype=torch.float64)
    u = tuple(torch.randn(c.shape, generator=generator, dtype=torch.float64) for c in x)
    v = tuple(torch.randn(c.shape, generator=generator, dtype=torch.float64) for c in x)
    xc, uc, vc = _to_cuda(x), _to_cuda(u), _to_cuda(v)
    _close(quotient.inner(xc, uc, vc), quotient.inner(x, u, v))
    _close(quotient.horizontal_projection(xc, uc), quotient.horizontal_projection(x, u))
    _close(quotient.vertical_projection(xc, uc), quotient.vertical_projection(x, u))
    _close(quotient.euclidean_to_riemannian_gradient(xc, uc),
           quotient.euclidean_to_riemannian_gradient(x, u))
    _close(quotient.christoffel(xc, uc, vc), quotient.christoffel(x, u, v))
    horizontal = quotient.horizontal_projection(x, u)
    _close(quotient.geodesic(xc, _to_cuda(horizontal), t=0.1, order=2),
           quotient.geodesic(x, horizontal, t=0.1, order=2))
    _close(quotient.geodesic(xc, _to_cuda(horizontal), t=0.1, order="exact", steps=8),
           quotient.geodesic(x, horizontal, t=0.1, order="exact", steps=8), 1e-9)
    g = quotient.random_group_element(x, condition=10.0, generator=generator)
    _close(quotient.act(xc, g.to(CUDA)), quotient.act(x, g))


def test_gl_closed_forms_pass_their_checks_on_cuda():
    quotient = qs.GLQuotient("mix")
    generator = torch.Generator(device=CUDA).manual_seed(0)
    x = quotient.random_point((3,), shapes=((9, 3), (8, 3)), generator=generator,
                              dtype=torch.float64, device=CUDA)
    u = quotient.random_tangent(x, generator=generator)
    assert bool(quotient.is_horizontal(x, u, atol=1e-10).all())
    gamma = quotient.christoffel(x, u)
    reference = qs.reference.christoffel(quotient, x, u)
    _close(gamma, tuple(r.cpu() for r in reference))


@pytest.mark.parametrize("quotient", [qs.GLQuotient("inv"), qs.GLQuotient("mix"),
                                      qs.DiagonalQuotient("mix")], ids=repr)
def test_check_all_on_cuda_agrees_with_cpu(quotient):
    on_cpu = qs.checks.check_all(quotient, seed=0)
    on_cuda = qs.checks.check_all(quotient, seed=0, device=CUDA)
    assert [r.name for r in on_cuda] == [r.name for r in on_cpu]
    assert all(r.passed for r in on_cuda), [r for r in on_cuda if not r.passed]


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_diagonal_operations_match_cpu(metric):
    generator = torch.Generator().manual_seed(3)
    quotient = qs.DiagonalQuotient(metric)
    x = quotient.random_point((5,), shapes=((30,), (30,)), generator=generator,
                              dtype=torch.float64)
    u = tuple(torch.randn(c.shape, generator=generator, dtype=torch.float64) for c in x)
    xc, uc = _to_cuda(x), _to_cuda(u)
    _close(quotient.horizontal_projection(xc, uc), quotient.horizontal_projection(x, u))
    _close(quotient.euclidean_to_riemannian_gradient(xc, uc),
           quotient.euclidean_to_riemannian_gradient(x, u))
    _close(quotient.christoffel(xc, uc), quotient.christoffel(x, u))
    small = tuple(0.01 * t for t in quotient.horizontal_projection(x, u))
    _close(quotient.geodesic(xc, _to_cuda(small), order="exact"),
           quotient.geodesic(x, small, order="exact"))


def test_sylvester_solver_matches_cpu():
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(4, 6, 6, generator=generator, dtype=torch.float64)
    b = torch.randn(4, 5, 5, generator=generator, dtype=torch.float64)
    p, q = a @ a.mT + 0.1 * torch.eye(6, dtype=torch.float64), b @ b.mT
    c = torch.randn(4, 6, 5, generator=generator, dtype=torch.float64)

    def solve(p, q, c):
        values_p, vectors_p = torch.linalg.eigh(p)
        values_q, vectors_q = torch.linalg.eigh(q)
        return solve_sylvester_eig(vectors_p, vectors_q,
                                   values_p.unsqueeze(-1) + values_q.unsqueeze(-2), c)

    _close(solve(p.to(CUDA), q.to(CUDA), c.to(CUDA)), solve(p, q, c))


class _Attention(nn.Module):
    def __init__(self, width: int = 8, heads: int = 2, classes: int = 3) -> None:
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.v_proj, self.o_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        h = self.num_heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(b, t, h, w // h).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(w // h), dim=-1)
        out = self.o_proj((a @ v).transpose(1, 2).reshape(b, t, w))
        return self.head(out.mean(dim=1))


def _model_and_batches():
    torch.manual_seed(0)
    model = _Attention().double()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 5, 8, generator=generator, dtype=torch.float64),
                torch.randint(0, 3, (6,), generator=generator)) for _ in range(2)]
    return model, batches


@pytest.mark.parametrize("options", [
    dict(measure="geodesic", metric="mix", order=2),
    dict(measure="geodesic", metric="inv", order=2),
    dict(measure="geodesic", metric="inv", order="exact", exact_steps=4),
    dict(measure="adaptive"),
    dict(measure="worst_case", p="inf"),
], ids=["mix", "inv", "inv-exact", "adaptive", "linf"])
def test_sharpness_on_cuda_matches_cpu(options):
    model, batches = _model_and_batches()
    on_cpu = qs.sharpness(model, batches, rho=0.05, n_iter=6, progress=False, **options)
    model_cuda = model.to(CUDA)
    batches_cuda = [(x.to(CUDA), y.to(CUDA)) for x, y in batches]
    on_cuda = qs.sharpness(model_cuda, batches_cuda, rho=0.05, n_iter=6, progress=False,
                           **options)
    assert on_cpu.value > 0
    assert on_cuda.per_batch == pytest.approx(on_cpu.per_batch, rel=1e-8, abs=1e-14)
    assert on_cuda.clean_losses == pytest.approx(on_cpu.clean_losses, rel=1e-12)


def test_sharpness_accepts_cpu_batches_for_a_cuda_model():
    model, batches = _model_and_batches()
    expected = qs.sharpness(model, batches, measure="geodesic", rho=0.05, n_iter=3,
                            progress=False)
    got = qs.sharpness(model.to(CUDA), batches, measure="geodesic", rho=0.05, n_iter=3,
                       progress=False)
    assert got.value == pytest.approx(expected.value, rel=1e-8)


def test_the_adaptive_norm_stays_fused_on_cuda() -> None:
    # a GPU launches a kernel per dispatch: the norm keeps its fused form there, and it
    # equals the CPU's tensor-by-tensor form to rounding
    from quotientsharp.core.adaptive import AdaptiveQuotient

    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in [(6, 3), (5,), (2, 4)]]
    u = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in x]
    on_cpu = AdaptiveQuotient.of(x).frozen_point(tuple(x))
    on_cuda = AdaptiveQuotient.of(_to_cuda(x)).frozen_point(tuple(_to_cuda(x)))
    assert on_cpu._fits_scratch(tuple(u)) and not on_cuda._fits_scratch(tuple(_to_cuda(u)))
    _close(on_cuda.squared_norm(tuple(_to_cuda(u))), on_cpu.squared_norm(tuple(u)))
