"""Property-based tests (hypothesis) of the quotient contract of the GL metrics: over the
shapes of the factors, the batch shape, the dtype, the Gram relaxation ``eps`` and the
conditioning of the point.

Drawn per example: ``n, m`` rows of ``G, H`` and their ``h`` columns (``h <= min(n, m)``, full
rank), a batch shape ``()``, ``(2,)`` or ``(2, 3)``, float64 or float32, ``eps``, and a
condition ``10^c`` of the point (its columns rescaled by a geometric range, ``G S`` and
``H S^{-1}``, which leaves ``G H^T`` and so the network's function alone). Checked at every draw:

- the horizontal projection is idempotent, the two projections add up to the vector and are
  orthogonal in the metric;
- the norm is the square root of the inner product, which is symmetric;
- the Riemannian gradient of any covector is horizontal;
- at ``eps = 0``, the inv and mix metrics are invariant and the horizontal projection
  equivariant under a group element ``A`` of condition up to 100.

Bounded: ``max_examples`` per test, no deadline (the first call of a shape pays torch's set-up),
derandomised so a CI run is reproducible.
"""

from __future__ import annotations

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from quotientsharp import GLQuotient  # noqa: E402

FAST = settings(max_examples=25, deadline=None, derandomize=True, database=None)


@st.composite
def points(draw, metrics=("inv", "mix", "euclidean"), relaxed=True):
    metric = draw(st.sampled_from(metrics))
    h = draw(st.integers(1, 3))
    n, m = draw(st.integers(h, 6)), draw(st.integers(h, 6))
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    eps = draw(st.sampled_from([0.0, 1e-3, 0.5])) if relaxed else 0.0
    condition = draw(st.floats(0.0, 2.0))                # 10^condition between the columns
    seed = draw(st.integers(0, 2 ** 16))
    generator = torch.Generator().manual_seed(seed)
    G = torch.randn(*batch, n, h, generator=generator, dtype=torch.float64)
    H = torch.randn(*batch, m, h, generator=generator, dtype=torch.float64)
    scales = torch.logspace(0.0, condition, h, dtype=torch.float64)
    x = ((G * scales).to(dtype), (H / scales).to(dtype))
    u = tuple(torch.randn(c.shape, generator=generator, dtype=torch.float64).to(dtype) for c in x)
    w = tuple(torch.randn(c.shape, generator=generator, dtype=torch.float64).to(dtype) for c in x)
    return GLQuotient(metric=metric, eps=eps), x, u, w, generator


def _size(vector) -> float:
    return sum(float(c.double().square().sum()) for c in vector) ** 0.5


def _tolerance(x) -> float:
    # float32 rounding grows with the conditioning of the Gram matrices (up to 1e4 here)
    return 1e-9 if x[0].dtype == torch.float64 else 2e-3


def _relative(a, b) -> float:
    num = sum(float((p - q).double().square().sum()) for p, q in zip(a, b, strict=True))
    den = sum(float(q.double().square().sum()) for q in b)
    return (num / max(den, 1e-300)) ** 0.5


@FAST
@given(points())
def test_projections_split_a_vector_into_orthogonal_parts(drawn):
    quotient, x, u, _, _ = drawn
    frozen = quotient.at(x)
    h, v = frozen.horizontal_projection(u), frozen.vertical_projection(u)
    tol = _tolerance(x)
    assert _relative(frozen.horizontal_projection(h), h) < tol
    assert _relative(tuple(a + b for a, b in zip(h, v, strict=True)), u) < tol
    cross = frozen.inner(h, v).double().abs()
    assert float((cross / frozen.inner(u, u).double()).max()) < tol
    # a vertical vector has no horizontal part
    assert _size(frozen.horizontal_projection(v)) <= tol * _size(u)


@FAST
@given(points())
def test_inner_is_symmetric_and_the_norm_its_square_root(drawn):
    quotient, x, u, w, _ = drawn
    frozen = quotient.at(x)
    tol = _tolerance(x)
    uw, wu = frozen.inner(u, w).double(), frozen.inner(w, u).double()
    scale = (frozen.norm(u) * frozen.norm(w)).double()
    assert float(((uw - wu).abs() / scale).max()) < tol
    assert float(((frozen.norm(u).double() ** 2 - frozen.inner(u, u).double()).abs()
                  / frozen.inner(u, u).double()).max()) < tol
    assert bool((frozen.inner(u, u) > 0).all())


@FAST
@given(points())
def test_the_riemannian_gradient_is_horizontal(drawn):
    quotient, x, u, _, _ = drawn
    frozen = quotient.at(x)
    gradient = frozen.riemannian_gradient(u)
    assert _size(frozen.vertical_projection(gradient)) <= _tolerance(x) * _size(gradient)


@FAST
@given(points(metrics=("inv", "mix"), relaxed=False), st.floats(1.0, 100.0))
def test_invariance_and_equivariance_under_the_group(drawn, condition):
    quotient, x, u, w, generator = drawn
    if x[0].dtype != torch.float64:
        x, u, w = (tuple(c.double() for c in t) for t in (x, u, w))
    A = quotient.random_group_element(x, condition=condition, generator=generator)
    moved_x = quotient.act(x, A)
    moved_u, moved_w = quotient.act_tangent(x, u, A), quotient.act_tangent(x, w, A)
    here, there = quotient.at(x), quotient.at(moved_x)
    scale = here.norm(u) * here.norm(w)
    assert float(((there.inner(moved_u, moved_w) - here.inner(u, w)).abs() / scale).max()) \
        < 1e-8
    assert _relative(there.horizontal_projection(moved_u),
                     quotient.act_tangent(x, here.horizontal_projection(u), A)) < 1e-7


@FAST
@given(points())
def test_the_gram_operator_is_the_moment_of_the_orbit_velocity(drawn):
    # Gram(L) = M(V(L)): the vertical metric in closed form from the h x h Gram matrices
    quotient, x, _, _, generator = drawn
    frozen = quotient.at(x)
    h = x[0].shape[-1]
    L = torch.randn(*x[0].shape[:-2], h, h, generator=generator, dtype=torch.float64)
    direct = frozen.moment(frozen.vertical(L.to(x[0].dtype))).double()
    terms = frozen.gram_operator_terms()
    L_work = L.to(terms[0][0].dtype)
    closed = sum(a @ L_work @ b for a, b in terms).double()
    assert _relative((closed,), (direct,)) < _tolerance(x) * 10


@pytest.mark.parametrize("metric", ["inv", "mix", "euclidean"])
def test_isotropic_draws_follow_the_generator_and_the_factor_shapes(metric):
    quotient = GLQuotient(metric=metric)
    x = quotient.random_point(shapes=[(6, 2), (3, 2)], dtype=torch.float64,
                              generator=torch.Generator().manual_seed(0))
    frozen = quotient.at(x)
    torch.manual_seed(1)
    first = frozen.isotropic(torch.Generator().manual_seed(5))
    torch.manual_seed(2)                     # another global state: the same draw
    second = frozen.isotropic(torch.Generator().manual_seed(5))
    assert [tuple(c.shape) for c in first] == [(6, 2), (3, 2)]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    # the two factors' noises are independent draws (not one reused for both)
    draws = [frozen.isotropic(torch.Generator().manual_seed(s)) for s in range(400)]
    g_part = torch.stack([d[0][:3].flatten() for d in draws])
    h_part = torch.stack([d[1].flatten() for d in draws])
    covariance = (g_part - g_part.mean(0)).T @ (h_part - h_part.mean(0)) / len(draws)
    scale = g_part.std(0)[:, None] * h_part.std(0)[None, :]
    assert float((covariance / scale).abs().max()) < 0.3
