"""The adaptive quotient (``quotientsharp.core.adaptive``): its frozen point's norms, inner products
and vertical vectors against hand-written formulas and loops, and its constructor's errors.
"""

from __future__ import annotations

import re

import pytest
import torch


def _adaptive_point(metric: str = "adaptive", fused: bool = True):
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 3, generator=generator, dtype=torch.float64),
         torch.randn(5, generator=generator, dtype=torch.float64),
         torch.randn((), generator=generator, dtype=torch.float64))
    quotient = AdaptiveQuotient(metric, point_ndims=[2, 1, 0], fused=fused)
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    return quotient, quotient.at(x), x, u


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("metric", ["adaptive", "euclidean"])
def test_adaptive_point_refuses_a_tangent_tuple_of_another_length(metric, fused) -> None:
    # a shorter tuple would otherwise be paired with the first tensors and silently cut
    _, point, _, u = _adaptive_point(metric, fused)
    short = u[:-1]
    operations = [lambda: point.geodesic_exact(short), lambda: point.geodesic(short, 0.5, order=1),
                  lambda: point.geodesic(short, order=2), lambda: point.squared_norm(short),
                  lambda: point.inner(short, u), lambda: point.inner(u, short),
                  lambda: point.raise_index(short),
                  lambda: point.riemannian_gradient_and_squared_norm(short)]
    if metric == "adaptive":
        # (the Euclidean metric's connection is zero: its Christoffel term pairs no tuples)
        operations += [lambda: point.christoffel(short), lambda: point.christoffel(u, short),
                       lambda: point.christoffel(short, u)]
    for operation in operations:
        with pytest.raises(ValueError):
            operation()
    # the raise pairs nothing with the point under the Euclidean metric: its own message
    with pytest.raises(ValueError, match=rf"^raise_index: {len(short)} gradient tensors for a "
                                         rf"point of {len(u)}$"):
        point.raise_index(short)


def test_adaptive_point_on_rows_works_unfused_and_names_a_bad_slot() -> None:
    _, fused, x, u = _adaptive_point()
    _, unfused, _, _ = _adaptive_point(fused=False)
    rows = {0: torch.tensor([0, 2])}
    # the unfused point is unbatched too: the same cut, the same norm of a cut vector
    cut_u = (u[0][[0, 2]], u[1], u[2])
    assert torch.allclose(unfused.on_rows(rows).squared_norm(cut_u),
                          fused.on_rows(rows).squared_norm(cut_u), rtol=1e-14, atol=0)
    assert torch.equal(unfused.on_rows(rows).x[0], x[0][[0, 2]])
    for slot in (3, 7, -1, 2):           # out of range, or the 0-dim tensor (no rows)
        with pytest.raises(ValueError, match=f"slot {slot} is not a tensor of rows"):
            fused.on_rows({slot: torch.tensor([0])})


def test_adaptive_point_on_rows_refuses_a_batched_point() -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    quotient = AdaptiveQuotient("adaptive", point_ndims=[1])
    batched = quotient.at((torch.randn(3, 4, dtype=torch.float64),))
    with pytest.raises(ValueError, match="^on_rows needs an unbatched point "):
        batched.on_rows({0: torch.tensor([0])})


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_adaptive_vertical_vectors_are_zeros_shaped_like_batched_tangent_vectors(dtype) -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    quotient = AdaptiveQuotient("adaptive", point_ndims=[2, 1])
    x = (torch.randn(2, 4, 3, dtype=dtype), torch.randn(1, 5, dtype=dtype))   # batch (2,), (1,)
    # each component's batch broadcast with the algebra element's
    for algebra_batch, shapes in (((), [(2, 4, 3), (1, 5)]),
                                  ((7, 1), [(7, 2, 4, 3), (7, 1, 5)]),
                                  ((2,), [(2, 4, 3), (2, 5)])):
        a = torch.zeros(*algebra_batch, 0, dtype=dtype)          # the trivial group: dimension 0
        vertical = quotient.vertical(x, a)
        assert [tuple(v.shape) for v in vertical] == shapes
        assert all(v.dtype == dtype and not v.any() for v in vertical)
    with pytest.raises(ValueError):              # one tensor fewer than the quotient's
        quotient.vertical(x[:1], torch.zeros(0, dtype=dtype))


def test_adaptive_norm_is_differentiable_in_the_vector_and_the_point() -> None:
    # sum (u / |w|)^2: d/du = 2 u / w^2, d/dw = -2 u^2 sign(w) / |w|^3, written out here
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(8)
    x = tuple(torch.randn(s, generator=generator, dtype=torch.float64) + 3.0
              for s in [(4, 3), (5,)])
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    leaves = tuple(t.clone().requires_grad_(True) for t in x)
    point = AdaptiveQuotient("adaptive", point_ndims=[2, 1]).at(leaves)
    grads = torch.autograd.grad(point.squared_norm(u), leaves)
    for g, w, a in zip(grads, x, u, strict=True):
        assert torch.allclose(g, -2 * a.square() * w.sign() / w.abs() ** 3, rtol=1e-12, atol=0)
    vectors = tuple(a.clone().requires_grad_(True) for a in u)
    plain = AdaptiveQuotient("adaptive", point_ndims=[2, 1]).at(x)
    grads = torch.autograd.grad(plain.squared_norm(vectors), vectors)
    for g, w, a in zip(grads, x, u, strict=True):
        assert torch.allclose(g, 2 * a / w.square(), rtol=1e-12, atol=0)


def test_adaptive_norm_of_a_float64_vector_at_a_float32_point_is_promoted() -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(9)
    x = tuple(torch.randn(s, generator=generator) for s in [(4, 3), (5,)])
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    norm = AdaptiveQuotient("adaptive", point_ndims=[2, 1]).at(x).squared_norm(u)
    # 1 / |w| in the point's float32 (the point's own precision), the rest in float64
    expected = sum(float((a * (1 / w.abs())).square().sum()) for a, w in zip(u, x, strict=True))
    assert norm.dtype == torch.float64
    assert abs(float(norm) - expected) <= 1e-12 * expected


def test_adaptive_norm_has_a_finite_derivative_at_a_zero_weight() -> None:
    # c = 0 coordinates are fixed (1 / c read as 0): the derivative there is 0, never 0 * inf
    from quotientsharp.core.adaptive import AdaptiveQuotient

    w = torch.tensor([[0.5, 0.0, -2.0], [0.0, 1.5, 3.0]], dtype=torch.float64,
                     requires_grad=True)
    u = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    point = AdaptiveQuotient("adaptive", point_ndims=[2]).at((w,))
    (grad,) = torch.autograd.grad(point.squared_norm((u,)), (w,))
    assert torch.isfinite(grad).all()
    expected = torch.where(w == 0, 0.0, -2 * u.square() * w.sign() / w.detach().abs() ** 3)
    assert torch.allclose(grad, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_adaptive_batched_norms_and_inner_products_equal_the_loop(fused) -> None:
    # a 0-dim component too: its reduction over no dimensions must keep the batch
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(11)
    quotient = AdaptiveQuotient("adaptive", point_ndims=[2, 0], fused=fused)
    x = (torch.randn(3, 4, 2, generator=generator, dtype=torch.float64),
         torch.randn(3, generator=generator, dtype=torch.float64))
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    v = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    batched = quotient.at(x)
    norms, inner = batched.squared_norm(u), batched.inner(u, v)
    assert norms.shape == inner.shape == (3,)
    for b in range(3):
        single = tuple(t[b] for t in x)
        loop_norm = sum(float(((a[b] / w.abs()) ** 2).sum()) for a, w in zip(u, single,
                                                                             strict=True))
        loop_inner = sum(float((a[b] * c[b] / w.square()).sum())
                         for a, c, w in zip(u, v, single, strict=True))
        assert abs(float(norms[b]) - loop_norm) <= 1e-12 * loop_norm
        assert abs(float(inner[b]) - loop_inner) <= 1e-12 * abs(loop_inner)


def test_adaptive_quotient_names_what_its_constructor_lacks() -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    with pytest.raises(ValueError, match="^pass point_ndims or shapes$"):
        AdaptiveQuotient("adaptive")
    for point_ndims in ([], [2, -1]):
        with pytest.raises(ValueError, match=r"point_ndims must be non-empty and >= 0, got "
                                             + re.escape(str(point_ndims))):
            AdaptiveQuotient("adaptive", point_ndims=point_ndims)
    assert AdaptiveQuotient("adaptive", point_ndims=[0, 1]).point_ndims == (0, 1)
