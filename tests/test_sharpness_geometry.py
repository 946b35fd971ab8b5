"""The sharpness engine's geometry stage against independent references.

The engine runs the product of the layout's quotients frozen at ``theta``
(:func:`quotientsharp.engine.geometry.build_geometry`). GL buckets (heads folded into the
point): against the autograd reference of :mod:`quotientsharp.core.reference` built from the metric
alone (a stand-in quotient defined here) and against Christoffel symbols written out with
explicit inverses. Diagonal factor: against ``DiagonalQuotient`` and the GL(1) case of the GL
Euclidean metric. Adaptive factor: against its closed forms. The ball: projections, directions
and random starts. Solver checkpoints: against the values of Croce & Hein's schedule.
"""

from __future__ import annotations

import math

import pytest
import torch

from quotientsharp import DiagonalQuotient, reference
from quotientsharp.core.gl import GLQuotient
from quotientsharp.core.quotient import SymmetryQuotient
from quotientsharp.engine.ball import BoxGeometry
from quotientsharp.engine.coordinates import Factor, other_factor
from quotientsharp.engine.geometry import build_geometry
from quotientsharp.engine.solver import checkpoints

METRICS = ("inv", "mix", "euclidean")


class MetricOnlyGL(SymmetryQuotient):
    """GL(h) pairs defined only by their metric and action (for the autograd reference)."""

    point_ndims = (2, 2)

    def __init__(self, metric: str, eps: float = 0.0) -> None:
        super().__init__()
        self.metric, self.eps = metric, eps

    def inner(self, x, u, v):
        G, H = x
        eye = torch.eye(G.shape[-1], dtype=G.dtype)
        s_g, s_h = G.mT @ G + self.eps * eye, H.mT @ H + self.eps * eye
        cross_g, cross_h = u[0].mT @ v[0], u[1].mT @ v[1]
        if self.metric == "inv":
            return (torch.linalg.inv(s_g) * cross_g.mT).sum((-2, -1)) + (
                torch.linalg.inv(s_h) * cross_h.mT).sum((-2, -1))
        if self.metric == "mix":
            return (s_h * cross_g.mT).sum((-2, -1)) + (s_g * cross_h.mT).sum((-2, -1))
        return (u[0] * v[0]).sum((-2, -1)) + (u[1] * v[1]).sum((-2, -1))

    def vertical(self, x, a):
        return -x[0] @ a, x[1] @ a.mT

    def act(self, x, g):
        return x[0] @ torch.linalg.inv(g), x[1] @ g.mT

    def algebra_shape(self, x):
        return (x[0].shape[-1], x[0].shape[-1])


def GLBlock(G, H, metric="inv", eps=0.0, exact_steps=16, pair_names=None, radius=1.0,
            order=1):
    """The engine's geometry of one bucket of heads (the heads folded into the point)."""
    factor = Factor(GLQuotient(metric, eps), (G, H), "gl", folded=1,
                    labels=list(pair_names or []))
    return build_geometry([factor], radius, order, exact_steps)


def DiagonalBlock(u, v, metric="inv", radius=1.0, order=1):
    return build_geometry([Factor(DiagonalQuotient(metric), (u, v), "diagonal")], radius, order)


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _bucket(seed: int, dtype: torch.dtype, pairs: int = 3, n: int = 5, m: int = 4, h: int = 2):
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(pairs, n, h, generator=gen, dtype=dtype)
    H = torch.randn(pairs, m, h, generator=gen, dtype=dtype)
    xi = (torch.randn(G.shape, generator=gen, dtype=dtype),
          torch.randn(H.shape, generator=gen, dtype=dtype))
    return (G, H), xi


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("seed", [0, 1])
def test_gl_block_matches_glquotient(metric: str, eps: float, seed: int) -> None:
    x, xi = _bucket(seed, torch.float64)
    block = GLBlock(*x, metric=metric, eps=eps)
    quotient = GLQuotient(metric, eps)
    scale = 1.0 + float(quotient.inner(x, xi, xi).abs().max())
    tol = 1e-12 * scale
    assert _max_diff(block.frozen.horizontal_projection(xi),
                     quotient.horizontal_projection(x, xi)) < tol
    assert _max_diff(block.frozen.horizontal_projection(block.frozen.raise_index(xi)),
                     quotient.euclidean_to_riemannian_gradient(x, xi)) < tol
    assert _max_diff(block.frozen.christoffel(xi), quotient.christoffel(x, xi)) < tol
    assert abs(float(block.frozen.squared_norm(xi) - quotient.inner(x, xi, xi).sum())) < tol
    for order in (1, 2):
        assert _max_diff(block.frozen.geodesic(xi, 1.0, order, block.steps),
                         quotient.geodesic(x, xi, 1.0, order=order)) < tol


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_gl_block_matches_autograd_reference(metric: str, eps: float) -> None:
    x, xi = _bucket(2, torch.float64)
    block = GLBlock(*x, metric=metric, eps=eps)
    ref = MetricOnlyGL(metric, eps)
    assert _max_diff(block.frozen.horizontal_projection(xi),
                     reference.horizontal_projection(ref, x, xi)) < 1e-11
    assert _max_diff(block.frozen.raise_index(xi), reference.raise_index(ref, x, xi)) < 1e-11
    assert _max_diff(block.frozen.christoffel(xi), reference.christoffel(ref, x, xi)) < 1e-10
    assert abs(float(block.frozen.squared_norm(xi) - ref.inner(x, xi, xi).sum())) < 1e-11
    # the projection is idempotent and its result horizontal
    projected = block.frozen.horizontal_projection(xi)
    assert _max_diff(block.frozen.horizontal_projection(projected), projected) < 1e-11
    assert float(reference.horizontality_error(ref, x, projected).max()) < 1e-10


def _christoffel_by_inverse(point, velocity, metric: str):
    """SPEC section 3 contractions written out with explicit inverses (independent code)."""
    (G, H), (a, b) = point, velocity
    inv_g, inv_h = torch.linalg.inv(G.mT @ G), torch.linalg.inv(H.mT @ H)
    if metric == "inv":
        return (-a @ inv_g @ (a.mT @ G + G.mT @ a) + G @ inv_g @ a.mT @ a,
                -b @ inv_h @ (b.mT @ H + H.mT @ b) + H @ inv_h @ b.mT @ b)
    return (a @ (b.mT @ H + H.mT @ b) @ inv_h - G @ (b.mT @ b) @ inv_h,
            b @ (a.mT @ G + G.mT @ a) @ inv_g - H @ (a.mT @ a) @ inv_g)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_gl_exact_geodesic_matches_fine_ode(metric: str) -> None:
    x, xi = _bucket(3, torch.float64)
    block = GLBlock(*x, metric=metric, exact_steps=32)
    small = block.frozen.horizontal_projection(tuple(0.1 * t for t in xi))
    # the closed forms above equal the autograd Christoffel (test_gl_block_matches_autograd_...)
    fine = reference.geodesic_ode(x, small, 1.0, (2, 2),
                                  lambda p, w: _christoffel_by_inverse(p, w, metric), steps=128)
    assert _max_diff(block.frozen.geodesic(small, 1.0, "exact", block.steps), fine) < 1e-9
    # and the geodesic differs from its second-order expansion by O(|xi|^3), not less
    assert _max_diff(block.frozen.geodesic(small, 1.0, 2, block.steps), fine) > 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gl_block_float32_and_float64(dtype: torch.dtype) -> None:
    x, xi = _bucket(4, dtype)
    block = GLBlock(*x, metric="inv")
    out = block.frozen.horizontal_projection(xi)
    assert all(t.dtype == dtype for t in out)
    x64 = tuple(t.double() for t in x)
    ref = GLQuotient("inv").horizontal_projection(x64, tuple(t.double() for t in xi))
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    assert _max_diff(tuple(t.double() for t in out), ref) < tol


def test_gl_rank_deficient_bucket_names_the_pair() -> None:
    (G, H), _ = _bucket(5, torch.float64)
    G = G.clone()
    G[1] = 0.0
    with pytest.raises(ValueError, match="pair-b"):
        GLBlock(G, H, metric="inv", pair_names=["pair-a", "pair-b", "pair-c"])
    GLBlock(G, H, metric="inv", eps=1e-3)        # relaxed: fine


def test_gl_isotropic_sample_has_identity_covariance_in_the_metric() -> None:
    x, _ = _bucket(6, torch.float64, pairs=1, n=3, m=3, h=2)
    for metric in ("inv", "mix"):
        block = GLBlock(*x, metric=metric)
        gen = torch.Generator().manual_seed(0)
        samples = [block.frozen.isotropic(gen) for _ in range(4000)]
        mean_sq = torch.stack([block.frozen.squared_norm(s) for s in samples]).mean()
        # E ||xi||_g^2 = dimension (6 + 6), MC error ~ sqrt(2 * 12 / 4000) * 12 ~ 0.9
        assert abs(float(mean_sq) - 12.0) < 0.6


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_diagonal_block_matches_diagonal_quotient(metric: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    quotient = DiagonalQuotient(metric, d=6)
    x = quotient.random_point(generator=gen, dtype=dtype)
    xi = tuple(torch.randn(6, generator=gen, dtype=dtype) for _ in range(2))
    block = DiagonalBlock(*x, metric=metric)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    scale = 1.0 + float(quotient.inner(x, xi, xi))
    assert _max_diff(block.frozen.horizontal_projection(xi),
                     quotient.horizontal_projection(x, xi)) < tol * scale
    assert _max_diff(block.frozen.horizontal_projection(block.frozen.raise_index(xi)),
                     quotient.euclidean_to_riemannian_gradient(x, xi)) < tol * scale
    assert _max_diff(block.frozen.christoffel(xi), quotient.christoffel(x, xi)) < tol * scale
    assert abs(float(block.frozen.squared_norm(xi) - quotient.inner(x, xi, xi))) < tol * scale
    small = block.frozen.horizontal_projection(tuple(0.01 * t for t in xi))
    for order in (1, 2, "exact"):
        assert _max_diff(block.frozen.geodesic(small, 1.0, order, block.steps),
                         quotient.geodesic(x, small, 1.0, order=order)) < tol * scale


def test_diagonal_block_euclidean_is_gl1_euclidean() -> None:
    gen = torch.Generator().manual_seed(8)
    u, v = torch.randn(5, generator=gen, dtype=torch.float64), torch.randn(
        5, generator=gen, dtype=torch.float64)
    xi = tuple(torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(2))
    block = DiagonalBlock(u, v, metric="euclidean")
    as_gl = GLQuotient("euclidean")
    x1 = (u.reshape(5, 1, 1), v.reshape(5, 1, 1))
    ref = as_gl.horizontal_projection(x1, tuple(t.reshape(5, 1, 1) for t in xi))
    assert _max_diff(block.frozen.horizontal_projection(xi),
                     tuple(t.reshape(5) for t in ref)) < 1e-13


def test_diagonal_block_rejects_zero_coordinates() -> None:
    u = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    v = torch.tensor([1.0, 1.0, 3.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"diagonal block.*u = 0 at coordinates \[1\]"):
        DiagonalBlock(u, v, metric="inv")


def test_diagonal_block_rejects_exact_mix_geodesics_leaving_the_manifold() -> None:
    u = torch.tensor([1.0, 0.2, 2.0], dtype=torch.float64)
    v = torch.tensor([1.0, 0.5, 3.0], dtype=torch.float64)
    limit = 0.1 / math.sqrt(2.0)
    DiagonalBlock(u, v, "mix", radius=0.99 * limit, order="exact").validate()
    DiagonalBlock(u, v, "mix", radius=10.0, order=2).validate()
    block = DiagonalBlock(u, v, "mix", radius=1.01 * limit, order="exact")
    with pytest.raises(ValueError, match="leave the manifold"):
        block.validate()
    # at the limit, b = -1/2 on the second coordinate is feasible and reaches u v = 0
    b = torch.tensor([0.0, -0.5, 0.0], dtype=torch.float64)
    xi = (b * u, b * v)
    assert abs(float(block.frozen.squared_norm(xi)) - limit ** 2) < 1e-15
    with pytest.raises(ValueError, match="leaves the manifold"):
        block.point(xi)


def test_adaptive_block_zero_weights_fixed_and_closed_forms() -> None:
    w = torch.tensor([[0.5, 0.0], [-2.0, 1.5]], dtype=torch.float64)
    xi = torch.tensor([[0.1, 0.0], [0.3, -0.2]], dtype=torch.float64)
    factor = other_factor([w], "adaptive", "geodesic")
    frozen = build_geometry([factor], radius=0.3, order=2).frozen
    nonzero = w != 0
    expected = ((xi[nonzero] / w[nonzero]) ** 2).sum()
    assert torch.allclose(frozen.squared_norm((xi,)), expected, rtol=1e-15)
    (gamma,) = frozen.christoffel((xi,))
    assert torch.allclose(gamma[nonzero], -xi[nonzero] ** 2 / w[nonzero], rtol=1e-15)
    (exact,) = frozen.geodesic((xi,), 1.0, "exact")
    assert torch.allclose(exact[nonzero], w[nonzero] * torch.exp(xi[nonzero] / w[nonzero]))
    (second,) = frozen.geodesic((xi,), 1.0, 2)
    assert torch.allclose(second, w + xi - 0.5 * gamma)
    egrad = torch.randn(2, 2, dtype=torch.float64)
    (raised,) = frozen.raise_index((egrad,))
    assert torch.equal(raised[~nonzero], torch.zeros(1, dtype=torch.float64))
    geometry = build_geometry([factor], radius=0.3, order=2)
    for t in (*geometry.direction((egrad,)), *geometry.project((10 * xi,)),
              *geometry.random_start(torch.Generator().manual_seed(0)), exact, second, gamma):
        assert bool(torch.isfinite(t).all())
        assert float(t[0, 1]) == 0.0             # the zero weight neither moves nor is moved to


def test_other_parameters_follow_a_line_unless_asked() -> None:
    w = torch.tensor([0.5, -2.0, 1.5], dtype=torch.float64)
    xi = (torch.tensor([0.1, 0.3, -0.2], dtype=torch.float64),)
    line = build_geometry([other_factor([w], "adaptive", "line")], 0.3, order="exact")
    curved = build_geometry([other_factor([w], "adaptive", "geodesic")], 0.3, order="exact")
    assert torch.equal(line.point(xi)[0], w + xi[0])
    assert torch.allclose(curved.point(xi)[0], w * torch.exp(xi[0] / w), rtol=1e-15)


def test_product_projection_is_onto_the_ball() -> None:
    x, xi = _bucket(9, torch.float64)
    geometry = GLBlock(*x, metric="mix", radius=0.25)
    projected = geometry.project(tuple(5 * t for t in xi))
    assert abs(float(geometry.norm(projected)) - 0.25) < 1e-14
    horizontal = geometry.frozen.horizontal_projection(xi)
    inside = geometry.project(tuple(1e-4 * t for t in horizontal))
    assert _max_diff(inside, tuple(1e-4 * t for t in horizontal)) < 1e-15
    direction = geometry.direction(xi)
    assert abs(float(geometry.norm(direction)) - 1.0) < 1e-13


@pytest.mark.parametrize(("metric", "eps"), [("euclidean", 0.0), ("inv", 0.3), ("mix", 0.3),
                                             ("inv", 0.0)])
def test_direction_and_start_are_horizontal_for_any_gradient(metric: str, eps: float) -> None:
    """A gradient that is not horizontal (a loss that breaks the symmetry) is projected.

    For a loss invariant under the group the raised gradient is horizontal already; here the
    Euclidean gradient is arbitrary, so skipping the projection shows.
    """
    x, egrad = _bucket(10, torch.float64)
    geometry = GLBlock(*x, metric=metric, eps=eps, radius=0.5)
    ref = MetricOnlyGL(metric, eps)
    raised = reference.raise_index(ref, x, egrad)
    assert float(reference.horizontality_error(ref, x, raised).max()) > 1e-3
    direction = geometry.direction(egrad)
    assert float(reference.horizontality_error(ref, x, direction).max()) < 1e-10
    expected = reference.euclidean_to_riemannian_gradient(ref, x, egrad)
    norm = float(ref.inner(x, expected, expected).sum().sqrt())
    assert _max_diff(direction, tuple(t / norm for t in expected)) < 1e-10
    start = geometry.random_start(torch.Generator().manual_seed(3))
    assert float(reference.horizontality_error(ref, x, start).max()) < 1e-10
    assert float(geometry.norm(start)) <= 0.5 * (1 + 1e-12)


def test_box_geometry_clamps_and_signs() -> None:
    w = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    box = BoxGeometry([w], [w.abs()], radius=0.1)
    (clamped,) = box.project((torch.tensor([5.0, 5.0, 5.0], dtype=torch.float64),))
    assert torch.equal(clamped, torch.tensor([0.1, 0.2, 0.0], dtype=torch.float64))
    (step,) = box.direction((torch.tensor([-3.0, 2.0, 1.0], dtype=torch.float64),))
    assert torch.equal(step, torch.tensor([-1.0, 2.0, 0.0], dtype=torch.float64))


def test_checkpoints_follow_the_schedule() -> None:
    # p_j = 0, .22, .41, .57, .70, .80, .87, .93, .99: w_j = ceil(p_j N) (exact arithmetic)
    assert checkpoints(100) == [22, 41, 57, 70, 80, 87, 93, 99]
    assert checkpoints(20) == [5, 9, 12, 14, 16, 18, 19, 20]
    p = [0.0, 0.22]
    while p[-1] + max(p[-1] - p[-2] - 0.03, 0.06) <= 1 + 1e-12:
        p.append(round(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06), 10))
    for n in (7, 33, 50):
        expected = sorted({math.ceil(round(q * n, 9)) for q in p[1:]})
        assert checkpoints(n) == expected
