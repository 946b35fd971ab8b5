"""The trust region of ``quotientsharp.engine.ball``: clipping onto the sphere, the unit Riemannian
gradient direction, random starts, batches of problems, block norms, and the ball on rows.
"""

from __future__ import annotations

import pytest
import torch


def _gl_ball(metric: str, dtype: torch.dtype, seed: int, rho, problem_shape=()):
    from quotientsharp.core.gl import GLQuotient
    from quotientsharp.engine.ball import GeodesicBall

    quotient = GLQuotient(metric, n=5, m=4, h=3)
    generator = torch.Generator().manual_seed(seed)
    x = quotient.random_point(generator=generator, dtype=dtype)
    frozen = quotient.at(x)
    return quotient, x, frozen, GeodesicBall(frozen, rho, problem_shape=problem_shape), generator


def _metric_norm(quotient, x, u) -> torch.Tensor:
    return quotient.inner(x, u, u).sqrt()


@pytest.mark.parametrize("metric", ["inv", "mix", "euclidean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1])
def test_clip_rescales_radially_onto_the_sphere_and_keeps_the_inside(metric, dtype, seed):
    from quotientsharp.engine.solver import ON_DEVICE, decisions_for

    rho = 0.4
    quotient, x, frozen, ball, generator = _gl_ball(metric, dtype, seed, rho)
    u = quotient.random_tangent(x, generator=generator)          # unit, horizontal
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    host = decisions_for(torch.zeros((), dtype=dtype), True)
    for scale in (3.0, 0.5, 1.0):          # outside, inside, on the sphere (rho = 0.4)
        v = tuple(scale * rho * t for t in u)
        for decisions in (ON_DEVICE, host):
            clipped = ball.clip(v, decisions)
            factor = min(1.0, 1.0 / scale)
            for c, t in zip(clipped, v, strict=True):
                torch.testing.assert_close(c, factor * t, rtol=tol, atol=tol)
            assert float(_metric_norm(quotient, x, clipped)) == pytest.approx(
                min(scale, 1.0) * rho, rel=tol)
    # project: the horizontal part of a vector with a vertical component, then the rescale
    noise = tuple(torch.randn(t.shape, generator=generator, dtype=dtype) for t in x)
    vertical = frozen.vertical_projection(noise)
    projected = ball.project(tuple(3 * rho * a + b for a, b in zip(u, vertical, strict=True)))
    for p, a in zip(projected, u, strict=True):
        torch.testing.assert_close(p, rho * a, rtol=10 * tol, atol=10 * tol)
    assert ball.norm(projected).dtype == dtype


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_direction_is_the_unit_riemannian_gradient(metric):
    quotient, x, frozen, ball, generator = _gl_ball(metric, torch.float64, 4, 0.3)
    egrad = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    d = ball.direction(egrad)
    assert float(ball.norm(d)) == pytest.approx(1.0, rel=1e-12)
    # <d, v>_x = <egrad, v>_E / ||grad|| for every horizontal v: the gradient's defining property
    norm = float(frozen.norm(frozen.riemannian_gradient(egrad)))
    for _ in range(3):
        v = quotient.random_tangent(x, generator=generator)
        euclidean = sum(float((e * t).sum()) for e, t in zip(egrad, v, strict=True))
        assert float(quotient.inner(x, d, v)) == pytest.approx(euclidean / norm, rel=1e-9,
                                                               abs=1e-12)
    assert float(ball.norm(ball.direction(tuple(torch.zeros_like(t) for t in x)))) == 0.0


def test_random_starts_are_horizontal_inside_the_ball_with_uniform_radius():
    rho = 0.7
    quotient, x, frozen, ball, generator = _gl_ball("mix", torch.float64, 5, rho)
    radii = []
    for _ in range(400):
        start = ball.random_start(generator)
        radii.append(float(ball.norm(start)))
        assert all(s.shape == t.shape for s, t in zip(start, x, strict=True))
    vertical = frozen.vertical_projection(start)
    assert sum(float(v.abs().max()) for v in vertical) < 1e-10
    radii_t = torch.tensor(radii) / rho
    assert float(radii_t.max()) <= 1 + 1e-12 and float(radii_t.min()) >= 0
    # U(0, 1): mean 1/2 and variance 1/12, checked within five standard errors
    assert abs(float(radii_t.mean()) - 0.5) < 5 * (1 / 12 / 400) ** 0.5
    assert float((radii_t < 0.5).float().mean()) == pytest.approx(0.5, abs=0.13)


def test_a_batch_of_problems_is_clipped_and_started_problem_by_problem():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    base = (torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64),)
    frozen = AdaptiveQuotient.of(base, "adaptive").frozen_point(base)
    radius = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64)
    ball = GeodesicBall(frozen, radius, problem_shape=(3,))
    zeros = ball.zeros()
    assert zeros[0].shape == (3, 3) and not zeros[0].any()
    xi = (torch.tensor([[0.3, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                       dtype=torch.float64),)
    # adaptive norms ||xi / |w| ||: 0.3, 0.5 and 2, against radii 0.1, 1 and 10
    clipped = ball.clip(xi)[0]
    torch.testing.assert_close(clipped, torch.stack([xi[0][0] / 3, xi[0][1], xi[0][2]]))
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        norms = ball.norm(ball.random_start(generator))
        assert norms.shape == (3,) and bool((norms <= radius * (1 + 1e-12)).all())


def test_validate_checks_the_largest_radius_of_a_batch():
    from quotientsharp.core.diagonal import DiagonalQuotient
    from quotientsharp.engine.ball import GeodesicBall

    quotient = DiagonalQuotient("mix", d=4)
    x = quotient.random_point(generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    frozen = quotient.at(x)
    limit = float((x[0] * x[1]).abs().min()) / 2 ** 0.5      # min |u v| / sqrt(2)
    GeodesicBall(frozen, torch.tensor([0.1, 0.5]) * limit, "exact", problem_shape=(2,)).validate()
    with pytest.raises(ValueError, match=r"order='exact' with the mix metric: rho=") as err:
        GeodesicBall(frozen, torch.tensor([0.1, 2.0]) * limit, "exact",
                     problem_shape=(2,)).validate()
    assert f"rho={2 * limit:g}" in str(err.value)


def test_block_norms_of_a_plain_ball_are_its_total_norm():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    base = (torch.tensor([1.0, -2.0]), torch.tensor([[4.0]]))
    ball = GeodesicBall(AdaptiveQuotient.of(base, "adaptive").frozen_point(base), 1.0)
    norms = ball.block_norms((torch.tensor([3.0, 0.0]), torch.tensor([[16.0]])))
    assert list(norms) == ["total"]
    torch.testing.assert_close(norms["total"], torch.tensor(5.0))     # |(3 / 1, 16 / 4)|


def test_the_ball_point_uses_its_order_and_steps():
    quotient, x, frozen, _, generator = _gl_ball("inv", torch.float64, 6, 1.0)
    from quotientsharp.engine.ball import GeodesicBall

    u = tuple(0.8 * t for t in quotient.random_tangent(x, generator=generator))
    coarse = GeodesicBall(frozen, 1.0, "exact", steps=1).point(u)
    fine = GeodesicBall(frozen, 1.0, "exact", steps=64).point(u)
    straight = GeodesicBall(frozen, 1.0, 1).point(u)
    for c, f, s, w, d in zip(coarse, fine, straight, x, u, strict=True):
        torch.testing.assert_close(s, w + d)
        assert float((c - f).abs().max()) > 1e-8          # one RK4 step is not 64
    torch.testing.assert_close(fine[0], frozen.geodesic(u, 1.0, "exact", 64)[0])


def test_zeros_have_the_points_batch_shape_and_draws_follow_the_generator():
    from quotientsharp.core.gl import GLQuotient
    from quotientsharp.engine.ball import BoxGeometry, GeodesicBall

    quotient = GLQuotient("mix", n=5, m=4, h=3)
    x = quotient.random_point((2,), generator=torch.Generator().manual_seed(8),
                              dtype=torch.float64)
    ball = GeodesicBall(quotient.at(x), 0.5)
    assert [z.shape for z in ball.zeros()] == [t.shape for t in x]
    assert all(z.dtype == torch.float64 and not z.any() for z in ball.zeros())
    box = BoxGeometry(x, tuple(t.abs() for t in x), 0.5)
    for geometry in (ball, box):
        first = geometry.random_start(torch.Generator().manual_seed(3))
        again = geometry.random_start(torch.Generator().manual_seed(3))
        other = geometry.random_start(torch.Generator().manual_seed(4))
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
        assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
        assert all(f.dtype == torch.float64 for f in first)


def test_the_ball_direction_never_writes_a_gradient_the_caller_lent():
    """The Euclidean metric's raised gradient is the gradient itself (or a view of it): the
    normalisation must divide into new tensors, for one problem and for a batch."""
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    generator = torch.Generator().manual_seed(31)
    # (an unbatched adaptive point does not take a batch of gradients: its in-place raise
    # cannot broadcast, a loud RuntimeError, so the batch runs with the Euclidean metric)
    for metric, problem_shape in (("euclidean", ()), ("euclidean", (2,)), ("adaptive", ())):
        base = (torch.rand(2, 3, generator=generator, dtype=torch.float64) + 0.5,
                torch.rand(4, generator=generator, dtype=torch.float64) + 0.5)
        frozen = AdaptiveQuotient.of(base, metric).frozen_point(base)
        ball = GeodesicBall(frozen, 1.0, problem_shape=problem_shape)
        egrad = tuple(torch.randn(*problem_shape, *t.shape, generator=generator,
                                  dtype=torch.float64) for t in base)
        kept = tuple(e.clone() for e in egrad)
        d = ball.direction(egrad)
        assert all(torch.equal(e, k) for e, k in zip(egrad, kept, strict=True))
        # the unit Riemannian gradient: g / ||g||, problem by problem
        g = frozen.riemannian_gradient(kept)
        norm = ball.norm(g)
        for a, b in zip(d, g, strict=True):
            lifted = norm.reshape(*norm.shape, *([1] * (b.dim() - norm.dim())))
            torch.testing.assert_close(a, b / lifted)


def test_a_ball_on_rows_is_the_ball_of_the_point_on_those_rows():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    base = (torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 4.0]], dtype=torch.float64),
            torch.tensor([2.0, -3.0], dtype=torch.float64))
    frozen = AdaptiveQuotient.of(base, "adaptive").frozen_point(base)
    ball = GeodesicBall(frozen, 0.7, "exact", steps=5, problem_shape=(2,))
    rows = {0: torch.tensor([0, 2])}
    cut = ball.on_rows(rows)
    assert (cut.radius, cut.order, cut.steps, cut.problem_shape) == (0.7, "exact", 5, (2,))
    torch.testing.assert_close(cut.base[0], base[0][[0, 2]])
    torch.testing.assert_close(cut.base[1], base[1])
    # the norm of a vector on those rows is the full ball's norm of it written into them
    xi = (torch.tensor([[[1.0, 0.0], [0.0, 2.0]]] * 2, dtype=torch.float64),
          torch.ones(2, 2, dtype=torch.float64))
    full = (torch.zeros(2, 3, 2, dtype=torch.float64).index_copy(1, rows[0], xi[0]), xi[1])
    torch.testing.assert_close(cut.norm(xi), ball.norm(full))


def test_block_norms_of_a_product_ball_name_its_factors():
    import quotientsharp as qs
    from quotientsharp.engine.ball import GeodesicBall

    quotient = qs.ProductQuotient([qs.GLQuotient("inv", n=3, m=2, h=2),
                                   qs.DiagonalQuotient("mix", d=3)])
    generator = torch.Generator().manual_seed(32)
    x = quotient.random_point(generator=generator, dtype=torch.float64)
    ball = GeodesicBall(quotient.at(x), 1.0)
    xi = quotient.horizontal_projection(x, tuple(torch.randn(t.shape, generator=generator,
                                                             dtype=torch.float64) for t in x))
    norms = ball.block_norms(xi)
    assert len(norms) == 3 and "total" in norms
    torch.testing.assert_close(norms["total"], ball.norm(xi))
    parts = [v for k, v in norms.items() if k != "total"]
    torch.testing.assert_close(sum(p.square() for p in parts), ball.norm(xi).square())


def test_ball_defaults_and_an_empty_point():
    from quotientsharp.engine.ball import GeodesicBall

    quotient, x, frozen, _, generator = _gl_ball("inv", torch.float64, 6, 1.0)
    u = tuple(0.8 * t for t in quotient.random_tangent(x, generator=generator))
    for p, w, d in zip(GeodesicBall(frozen, 1.0).point(u), x, u, strict=True):
        torch.testing.assert_close(p, w + d)                 # order 1 by default
    exact = GeodesicBall(frozen, 1.0, "exact").point(u)      # 16 RK4 steps by default
    for a, b in zip(exact, frozen.geodesic(u, 1.0, "exact", 16), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in
               zip(exact, frozen.geodesic(u, 1.0, "exact", 17), strict=True))

    class Empty:
        x: tuple = ()

    with pytest.raises(ValueError, match="the geometry has no coordinates to perturb"):
        GeodesicBall(Empty(), 1.0)


def test_a_batch_of_problems_gets_unit_directions_problem_by_problem():
    """Batched GL points (new raised gradients, divided in place) with one problem each."""
    from quotientsharp.core.gl import GLQuotient
    from quotientsharp.engine.ball import GeodesicBall

    quotient = GLQuotient("mix", n=5, m=4, h=3)
    generator = torch.Generator().manual_seed(41)
    x = quotient.random_point((2,), generator=generator, dtype=torch.float64)
    frozen = quotient.at(x)
    ball = GeodesicBall(frozen, 0.5, problem_shape=(2,))
    egrad = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    d = ball.direction(egrad)
    g = frozen.riemannian_gradient(egrad)
    norm = quotient.norm(x, g)
    for a, b in zip(d, g, strict=True):
        torch.testing.assert_close(a, b / norm.reshape(2, *([1] * (b.dim() - 1))))
    torch.testing.assert_close(ball.norm(d), torch.ones(2, dtype=torch.float64))
