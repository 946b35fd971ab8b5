"""The ascent's in-place fast paths equal the plain formulas they replace.

The solver rescales the new tuples it makes in place (``clip(fresh=True)``), the ball divides
the new Riemannian gradient in place (``direction``), and the order-2 point subtracts the
Christoffel term into the new sum. Each is checked against the plain out-of-place formula,
bit for bit, over seeds, dtypes and problem shapes, on a geometry with a GL block, a
diagonal-metric block and a user-style block; and no tensor the caller lent is written.
"""

from __future__ import annotations

import pytest
import torch

from quotientsharp.core.gl import GLQuotient
from quotientsharp.engine.coordinates import Factor, other_factor
from quotientsharp.engine.geometry import build_geometry
from quotientsharp.engine.solver import lift

DTYPES = [torch.float32, torch.float64]


def _geometry(seed: int, dtype: torch.dtype, metric: str, other: str):
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(3, 7, 2, generator=gen, dtype=dtype)
    H = torch.randn(3, 6, 2, generator=gen, dtype=dtype)
    others = tuple(torch.randn(*s, generator=gen, dtype=dtype) for s in [(4,), (3, 2), (5,)])
    factors = [Factor(GLQuotient(metric), (G, H), "gl", folded=1),
               other_factor(others, other, "line")]
    return build_geometry(factors, radius=0.3, order=2), gen


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("metric", ["mix", "inv"])
@pytest.mark.parametrize("scale", [0.01, 5.0], ids=["inside", "outside"])
def test_fresh_clip_equals_the_plain_rescale(dtype, seed, metric, scale) -> None:
    geometry, gen = _geometry(seed, dtype, metric, "adaptive")
    xi = tuple(scale * t for t in geometry.project(geometry.random_start(gen)))
    plain = geometry.clip(xi)
    copies = tuple(t.clone() for t in xi)
    fast = geometry.clip(copies, fresh=True)
    assert _equal(fast, plain)
    assert _equal(xi, tuple(t.clone() for t in xi))          # the plain call wrote nothing
    norm = geometry.norm(plain)
    assert float(norm) <= 0.3 * (1 + 8 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("metric", ["mix", "inv", "euclidean"])
@pytest.mark.parametrize("other", ["adaptive", "euclidean"])
def test_direction_equals_the_gradient_over_its_norm(dtype, seed, metric, other) -> None:
    geometry, gen = _geometry(seed, dtype, metric, other)
    egrad = tuple(torch.randn(t.shape, generator=gen, dtype=dtype) for t in geometry.zeros())
    lent = tuple(t.clone() for t in egrad)
    # divided in place: the same values as new tensors, bit for bit
    rgrad, squared = geometry.frozen.riemannian_gradient_and_squared_norm(egrad)
    norm = squared.sqrt().clamp_min(torch.finfo(dtype).tiny)
    direction = geometry.direction(egrad)
    assert _equal(direction, tuple(t / norm for t in rgrad))
    # and the plain path (the gradient, then its norm) to rounding: the adaptive block takes
    # its norm on the way to the gradient, which rounds differently
    plain = geometry.frozen.riemannian_gradient(egrad)
    plain_norm = geometry.norm(plain).clamp_min(torch.finfo(dtype).tiny)
    tolerance = 8 * torch.finfo(dtype).eps
    for got, want in zip(direction, plain, strict=True):
        assert float((got - want / plain_norm).abs().max()) <= tolerance * float(
            (want / plain_norm).abs().max())
    # the euclidean "other" block returns the gradient's own tensors: never divided in place
    assert _equal(egrad, lent)


def test_direction_of_a_user_point_is_not_written_in_place() -> None:
    # a frozen point that keeps what it returns (not new_gradients) must keep it unchanged
    geometry, gen = _geometry(0, torch.float64, "mix", "adaptive")
    frozen = geometry.frozen
    kept = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64)
                 for t in geometry.zeros())
    snapshot = tuple(t.clone() for t in kept)
    frozen.riemannian_gradient = lambda egrad: kept          # type: ignore[method-assign]
    frozen.riemannian_gradient_and_squared_norm = (          # type: ignore[method-assign]
        lambda egrad: (kept, frozen.squared_norm(kept)))
    frozen.new_gradients = False
    direction = geometry.direction(geometry.zeros())
    assert _equal(kept, snapshot)
    assert _equal(direction, tuple(t / geometry.norm(kept) for t in kept))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("metric", ["mix", "inv"])
@pytest.mark.parametrize("t", [1.0, 0.3])
def test_order_two_point_equals_the_taylor_formula(dtype, seed, metric, t) -> None:
    geometry, gen = _geometry(seed, dtype, metric, "adaptive")
    frozen = geometry.frozen
    xi = geometry.project(geometry.random_start(gen))
    gamma = frozen.christoffel(xi)
    expected = tuple(a + t * b - 0.5 * t * t * c
                     for a, b, c in zip(frozen.x, xi, gamma, strict=True))
    got = frozen.geodesic(xi, t, 2)
    # the GL factors' point is one fused product per factor (OrderTwoGLPath): equal to
    # rounding of the terms, at every t
    eps = torch.finfo(dtype).eps
    for g, e, c in zip(got, expected, gamma, strict=True):
        assert bool(((g - e).abs() <= 4 * eps * (e.abs() + c.abs())).all())


@pytest.mark.parametrize("seed", [0, 1])
def test_order_two_point_keeps_its_gradient(seed) -> None:
    # the in-place subtraction must leave autograd's graph intact: the gradient through the
    # point equals the one through the plain formula
    geometry, gen = _geometry(seed, torch.float64, "inv", "adaptive")
    frozen = geometry.frozen
    xi = geometry.project(geometry.random_start(gen))
    weights = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in xi)

    def grad(point_of):
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        total = sum((p * w).sum() for p, w in zip(point_of(leaves), weights, strict=True))
        return torch.autograd.grad(total, leaves)

    def plain(u):
        gamma = frozen.christoffel(u)
        return tuple(a + b - 0.5 * c for a, b, c in zip(frozen.x, u, gamma, strict=True))

    for fast, slow in zip(grad(lambda u: frozen.geodesic(u, 1.0, 2)), grad(plain),
                          strict=True):
        assert torch.allclose(fast, slow, rtol=1e-12, atol=0)


@pytest.mark.parametrize("problems", [(3,), (2, 2)])
def test_fresh_clip_per_problem(problems) -> None:
    # independent problems: one radius per problem, each rescaled in place
    gen = torch.Generator().manual_seed(4)
    base = tuple(torch.randn(*s, generator=gen, dtype=torch.float64) for s in [(4,), (3, 2)])
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    quotient = AdaptiveQuotient("adaptive", point_ndims=[1, 2])
    ball = GeodesicBall(quotient.frozen_point(base), 0.2, 1, problem_shape=problems)
    xi = tuple(torch.randn(*problems, *t.shape, generator=gen, dtype=torch.float64)
               for t in base)
    plain = ball.clip(xi)
    factor = (0.2 / ball.norm(xi)).clamp(max=1.0)
    assert _equal(plain, tuple(lift(factor, t) * t for t in xi))
    assert _equal(ball.clip(tuple(t.clone() for t in xi), fresh=True), plain)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("problems", [(), (3,)], ids=["single", "P=3"])
def test_overwriting_steps_equal_the_allocating_ones(dtype, seed, problems) -> None:
    from quotientsharp.engine.solver import gradient_step, momentum_step

    gen = torch.Generator().manual_seed(seed)
    shapes = [(3,), (4, 2), (2, 3, 2)]
    xi, direction, z, previous = (tuple(torch.randn(*problems, *s, generator=gen, dtype=dtype)
                                        for s in shapes) for _ in range(4))
    eta = torch.rand(problems, generator=gen, dtype=dtype) + 0.1
    plain_step = gradient_step(xi, direction, eta)
    plain_momentum = momentum_step(xi, z, previous, 0.75)
    written = tuple(t.clone() for t in direction)
    assert _equal(gradient_step(xi, written, eta, overwrite=True), plain_step)
    assert _equal(written, plain_step)                     # the step lives in direction's storage
    assert _equal(momentum_step(xi, tuple(t.clone() for t in z), previous, 0.75,
                                overwrite=True), plain_momentum)


class _Lending:
    """A ball whose directions are not declared new: the solver must never write them."""

    def __init__(self, ball) -> None:
        self.ball = ball
        self.radius, self.dtype, self.device = ball.radius, ball.dtype, ball.device

    def zeros(self):
        return self.ball.zeros()

    def clip(self, xi, decisions=None, fresh=False):
        return self.ball.clip(xi, decisions, fresh) if decisions is not None else \
            self.ball.clip(xi, fresh=fresh)

    def direction(self, egrad):
        return self.ball.direction(egrad)

    def random_start(self, generator):
        return self.ball.random_start(generator)


@pytest.mark.parametrize("host", [True, False], ids=["host", "device"])
@pytest.mark.parametrize("metric", ["mix", "inv"])
def test_ascent_values_do_not_depend_on_overwriting(host, metric) -> None:
    # the same ascent with the in-place step (the ball declares new directions) and without
    # (a wrapper that does not): the same best loss and iterate, bit for bit
    from quotientsharp.engine.solver import AscentSettings, ascend

    geometry, gen = _geometry(3, torch.float64, metric, "adaptive")
    weights = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64)
                    for t in geometry.zeros())

    def objective(xi):
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            point = geometry.point(leaves)
            loss = sum(((p * w).sum()).sin() + (p.square() * w).sum() for p, w in
                       zip(point, weights, strict=True))
            grads = torch.autograd.grad(loss, leaves)
        return loss.detach(), grads

    settings = AscentSettings(n_iter=12, restarts=1)
    runs = [ascend(g, objective, settings, torch.Generator().manual_seed(0),
                   host_decisions=host) for g in (geometry, _Lending(geometry))]
    assert torch.equal(runs[0].loss, runs[1].loss)
    assert _equal(runs[0].xi, runs[1].xi)
    assert torch.equal(runs[0].trace, runs[1].trace)


def _adaptive_point(seed: int, dtype: torch.dtype, zero: bool):
    from quotientsharp.core.adaptive import AdaptiveQuotient

    gen = torch.Generator().manual_seed(seed)
    # ill-scaled weights (1e-3 to 1e3) and, where asked, zero weights and a zero tensor
    x = [torch.randn(*s, generator=gen, dtype=dtype)
         * 10.0 ** torch.randint(-3, 4, (), generator=gen)
         for s in [(9, 4), (4,), (3, 5, 2), (17,)]]
    if zero:
        x[0][1, 2] = 0.0
        x[3].zero_()
    return AdaptiveQuotient.of(x).frozen_point(tuple(x)), gen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("zero", [False, True], ids=["nonzero", "zero-weights"])
def test_adaptive_norm_through_its_scratch_buffer_equals_the_fused_norm(dtype, seed,
                                                                        zero) -> None:
    # the norm the ascent takes two or three times per step writes u / c into one buffer,
    # tensor by tensor; it equals the fused form (a new tuple u / c) bit for bit, and the
    # buffer is reused, not grown, from one call to the next
    from quotientsharp.core import _tuples as T

    point, gen = _adaptive_point(seed, dtype, zero)
    assert point.unbatched
    for _ in range(3):
        u = tuple(torch.randn(t.shape, generator=gen, dtype=dtype) for t in point.x)
        assert point._fits_scratch(u)
        plain = T.fused_square_norms(T.fused_mul(u, point.inverse_scale))
        assert torch.equal(point.squared_norm(u), plain)
    assert point._scratch.numel() == max(t.numel() for t in point.x)
    # the Python-loop reference of the metric: sum over entries of (u / |w|)^2, 0 where w = 0
    reference = sum(float(torch.where(w == 0, 0.0, a / w.abs()).double().square().sum())
                    for a, w in zip(u, point.x, strict=True))
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    assert float(point.squared_norm(u)) == pytest.approx(reference, rel=tolerance)


def test_adaptive_norm_of_a_vector_with_history_keeps_its_gradient() -> None:
    # out= takes no autograd history: a vector that requires grad takes the fused form,
    # whose gradient is the metric's 2 u / c^2
    point, gen = _adaptive_point(3, torch.float64, zero=True)
    u = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64).requires_grad_()
              for t in point.x)
    assert not point._fits_scratch(u)
    grads = torch.autograd.grad(point.squared_norm(u), u)
    for g, a, r in zip(grads, u, point.inverse_scale, strict=True):
        assert torch.allclose(g, 2 * a.detach() * r.square(), rtol=1e-12, atol=0)


def test_adaptive_raise_of_a_batch_of_gradients_broadcasts_like_the_formula() -> None:
    # an unbatched point (the engine's, fused) given gradients with a leading batch dimension
    # raises each of them: e * w^2, broadcast, as at a batched point
    point, gen = _adaptive_point(4, torch.float64, zero=True)
    egrad = tuple(torch.randn(3, *t.shape, generator=gen, dtype=torch.float64)
                  for t in point.x)
    raised = point.raise_index(egrad)
    for r, e, w in zip(raised, egrad, point.x, strict=True):
        assert r.shape == e.shape
        assert torch.equal(r, e * (w * w))
    single = point.raise_index(tuple(e[1] for e in egrad))
    for r, one in zip(raised, single, strict=True):
        assert torch.equal(r[1], one)
