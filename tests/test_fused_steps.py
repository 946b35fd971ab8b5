"""The solver step and the other-parameter block on whole tuples (``torch._foreach``).

- each fused operation equals the per-tensor formula it replaces, bit for bit (the g-norm to
  rounding: its reduction order is the only change), over seeds, dtypes and problem shapes;
- the number of operators one step dispatches does not grow with the number of parameter
  tensors: the device-independent form of "no per-tensor Python loop in the hot path" (on a
  GPU each operator is at least one kernel launch).
"""

from __future__ import annotations

import pytest
import torch

from quotientsharp.core.gl import GLQuotient
from quotientsharp.engine.coordinates import Factor, other_factor
from quotientsharp.engine.geometry import build_geometry
from quotientsharp.engine.solver import ON_DEVICE, gradient_step, lift, momentum_step
from tests.tuple_helpers import ComputingOperators

DTYPES = [torch.float32, torch.float64]


def _tensors(seed: int, dtype: torch.dtype, count: int = 5, problems: tuple[int, ...] = ()):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(3,), (4, 2), (1,), (2, 3, 2), (5,)] * (count // 5 + 1)
    return tuple(torch.randn(*problems, *s, generator=gen, dtype=dtype) for s in shapes[:count])


def _bitwise_equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("problems", [(), (3,), (2, 3)], ids=["single", "P=3", "P=2x3"])
def test_gradient_and_momentum_steps_equal_the_per_tensor_formulas(seed, dtype,
                                                                   problems) -> None:
    xi, z, previous, direction = (_tensors(seed + k, dtype, problems=problems)
                                  for k in range(0, 40, 10))
    gen = torch.Generator().manual_seed(seed + 99)
    eta = torch.rand(problems, generator=gen, dtype=dtype) + 0.1
    alpha = 0.75
    expected_step = tuple(x + lift(eta, x) * d for x, d in zip(xi, direction, strict=True))
    expected_momentum = tuple(x + alpha * (zz - x) + (1 - alpha) * (x - p)
                              for x, zz, p in zip(xi, z, previous, strict=True))
    inputs = [tuple(t.clone() for t in group) for group in (xi, z, previous, direction)]
    assert _bitwise_equal(gradient_step(xi, direction, eta), expected_step)
    # the momentum step is the same vector in three passes, alpha z + 2 (1 - alpha) xi -
    # (1 - alpha) previous: each form rounds each of its few operations once, so the two agree
    # to a few units of rounding of the terms' sizes
    eps = torch.finfo(dtype).eps
    for got, want, x, zz, p in zip(momentum_step(xi, z, previous, alpha), expected_momentum,
                                   xi, z, previous, strict=True):
        bound = 4 * eps * (zz.abs() + 2 * x.abs() + p.abs())
        assert bool(((got - want).abs() <= bound).all())
    for group, kept in zip((xi, z, previous, direction), inputs, strict=True):
        assert _bitwise_equal(group, kept)          # nothing written in place


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scale", ["adaptive", "euclidean"])
def test_adaptive_factor_equals_the_per_tensor_formulas(seed, dtype, scale) -> None:
    base = _tensors(seed, dtype, count=7)
    base[1][0, 0] = 0.0                                 # a fixed coordinate
    c = {"adaptive": tuple(w.abs() for w in base),
         "euclidean": tuple(torch.ones_like(w) for w in base)}[scale]
    frozen = build_geometry([other_factor(base, scale, "line")], 1.0).frozen
    xi, egrad = _tensors(seed + 1, dtype, count=7), _tensors(seed + 2, dtype, count=7)
    inv_c = tuple(torch.where(t == 0, torch.zeros_like(t), 1 / t) for t in c)
    expected_norm = sum((d * i).square().sum() for d, i in zip(xi, inv_c, strict=True))
    tolerance = 8 * torch.finfo(dtype).eps
    assert float(abs(frozen.squared_norm(xi) - expected_norm) / expected_norm) <= tolerance
    assert _bitwise_equal(frozen.raise_index(egrad),
                          tuple(e * t.square() for e, t in zip(egrad, c, strict=True)))
    assert _bitwise_equal(frozen.geodesic(xi, 1.0, 1),
                          tuple(w + d for w, d in zip(base, xi, strict=True)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1.0, 0.35])
def test_adaptive_order_two_point_and_its_backward_equal_the_elementary_form(dtype, t) -> None:
    # the fused path (OrderTwoAdaptivePath) against w + t u + t^2 u^2 / (2 w) written out and
    # differentiated by autograd; a zero weight (1/w taken as 0) among the coordinates
    base = _tensors(3, dtype, count=7)
    base[1][0, 0] = 0.0
    frozen = build_geometry([other_factor(base, "adaptive", "line")], 1.0).frozen
    inverse = tuple(torch.where(w == 0, torch.zeros_like(w), 1 / w) for w in base)
    u = tuple(v.requires_grad_(True) for v in _tensors(4, dtype, count=7))
    weights = _tensors(5, dtype, count=7)                # a covector to pull back
    fused = frozen.geodesic(u, t, 2)
    plain = tuple(w + t * a + 0.5 * t * t * a * a * r
                  for w, a, r in zip(base, u, inverse, strict=True))
    tolerance = 4 * torch.finfo(dtype).eps
    for f, p in zip(fused, plain, strict=True):
        assert float((f - p).detach().abs().max()) <= tolerance * float(p.detach().abs().max())
    pulled = torch.autograd.grad(fused, u, grad_outputs=weights)
    expected = torch.autograd.grad(plain, u, grad_outputs=weights)
    for a, b in zip(pulled, expected, strict=True):
        assert float((a - b).abs().max()) <= tolerance * float(b.abs().max())
    assert torch.equal(pulled[1][0, 0], weights[1][0, 0] * t)     # dp/du = t where 1/w = 0


def test_adaptive_order_two_point_passes_gradcheck() -> None:
    from quotientsharp.core.adaptive import OrderTwoAdaptivePath

    base = _tensors(6, torch.float64, count=5)
    inverse = tuple(1 / w for w in base)
    u = tuple(v.requires_grad_(True) for v in _tensors(7, torch.float64, count=5))
    for t in (1.0, -0.6):
        assert torch.autograd.gradcheck(
            lambda *a, t=t: OrderTwoAdaptivePath.apply(t, 5, *base, *inverse, *a), u)


def _operators_of_one_step(tensors: int, with_gl: bool) -> int:
    gen = torch.Generator().manual_seed(0)
    factors = []
    if with_gl:
        G = torch.randn(4, 6, 2, generator=gen, dtype=torch.float64)
        H = torch.randn(4, 5, 2, generator=gen, dtype=torch.float64)
        factors.append(Factor(GLQuotient("mix"), (G, H), "gl", folded=1))
    factors.append(other_factor(_tensors(1, torch.float64, count=tensors), "adaptive", "line"))
    geometry = build_geometry(factors, radius=0.1, order=1)
    xi = geometry.project(geometry.random_start(gen))
    previous = geometry.project(geometry.random_start(gen))
    egrad = geometry.random_start(gen)
    eta = torch.tensor(0.2, dtype=torch.float64)
    counter = ComputingOperators()
    with counter:
        direction = geometry.direction(egrad)
        z = geometry.clip(gradient_step(xi, direction, eta), ON_DEVICE)
        new = geometry.clip(momentum_step(xi, z, previous, 0.75), ON_DEVICE)
        geometry.point(new)
    return counter.count


@pytest.mark.parametrize("with_gl", [False, True], ids=["other-only", "with-gl"])
def test_operators_per_step_do_not_grow_with_the_number_of_tensors(with_gl,
                                                                    monkeypatch) -> None:
    # the count stands for kernel launches on a GPU: the GPU path, ON_DEVICE (on the host a
    # rescale by exactly 1 is skipped, which makes the count depend on the draw), and the
    # adaptive norm's fused form, which runs on every device but the CPU
    from quotientsharp.core.adaptive import AdaptivePoint

    monkeypatch.setattr(AdaptivePoint, "scratch_norm_devices", frozenset())
    few, many = _operators_of_one_step(5, with_gl), _operators_of_one_step(60, with_gl)
    assert few == many, (few, many)       # a per-tensor loop would add 55 x its operators


def test_on_the_cpu_the_adaptive_norm_goes_tensor_by_tensor() -> None:
    # the CPU trades a dispatch per tensor for no new parameter-sized tuple; the count grows
    # by the same few operators per tensor, so it is this branch that the test above excludes
    few, many = _operators_of_one_step(5, False), _operators_of_one_step(60, False)
    assert many > few and (many - few) % 55 == 0, (few, many)


@pytest.mark.parametrize("restarts", [0, 1])
def test_at_most_four_tangent_tuples_are_alive_during_each_evaluation(restarts) -> None:
    import gc

    from quotientsharp.engine.solver import AscentSettings, ascend

    shape = (7, 13)                 # a shape no other tensor of the test has
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    target = torch.randn(shape, generator=gen, dtype=torch.float64)
    geometry = build_geometry([other_factor((base,), "euclidean", "line")], radius=0.5)
    alive = []

    def objective(xi):
        gc.collect()
        storages = {t.untyped_storage().data_ptr() for t in gc.get_objects()
                    if type(t) is torch.Tensor and tuple(t.shape) == shape}
        alive.append(len(storages - {base.untyped_storage().data_ptr(),
                                     target.untyped_storage().data_ptr()}))
        difference = xi[0] - target
        return -(difference.square().sum()), (-2 * difference,)

    settings = AscentSettings(n_iter=12, restarts=restarts)
    outcome = ascend(geometry, objective, settings, generator=gen)
    assert len(alive) == settings.runs * settings.evaluations_per_run
    per_run = settings.evaluations_per_run
    # xi, new, best xi, best direction; from the second run on also the best of earlier runs
    assert max(alive[:per_run]) <= 4, alive
    assert max(alive[per_run:], default=0) <= 5, alive
    assert float(outcome.loss) > -float((base - target).square().sum())


# ------------------------------------------------------------------ adaptive paths, by definition
def _adaptive_point(metric: str, batch: tuple[int, ...] = (), seed: int = 8):
    from quotientsharp.core.adaptive import AdaptiveQuotient

    base = tuple(torch.randn(*batch, *s, generator=torch.Generator().manual_seed(seed),
                             dtype=torch.float64) for s in [(3,), (4, 2), (2, 3, 2)])
    shapes = [tuple(t.shape[len(batch):]) for t in base]
    quotient = AdaptiveQuotient(metric, shapes=shapes)
    u = tuple(0.1 * torch.randn(t.shape, generator=torch.Generator().manual_seed(seed + 1),
                                dtype=torch.float64) for t in base)
    return quotient.at(base), base, u


@pytest.mark.parametrize("metric", ["adaptive", "euclidean"])
@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("t", [1.0, 0.3, -0.7])
def test_adaptive_paths_equal_their_definitions(metric, batch, t) -> None:
    # order 1: w + t u; order 2: w + t u + t^2 u^2 / (2 w) (a straight line for the euclidean
    # metric); exact: w exp(t u / w) (a straight line for the euclidean metric); defaults t = 1
    # and order 2
    frozen, w, u = _adaptive_point(metric, batch)
    curved = metric == "adaptive"
    expected = {
        1: tuple(a + t * b for a, b in zip(w, u, strict=True)),
        2: tuple(a + t * b + (0.5 * t * t * b * b / a if curved else 0)
                 for a, b in zip(w, u, strict=True)),
        "exact": tuple(a * torch.exp(t * b / a) if curved else a + t * b
                       for a, b in zip(w, u, strict=True)),
    }
    for order, want in expected.items():
        got = frozen.geodesic(u, t, order)
        assert all(torch.allclose(g, e, rtol=1e-13, atol=0) for g, e in zip(got, want,
                                                                          strict=True)), order
    assert all(torch.allclose(g, e, rtol=1e-13, atol=0)
               for g, e in zip(frozen.geodesic_exact(u, t), expected["exact"], strict=True))
    default = expected[2] if t == 1.0 else frozen.geodesic(u, 1.0, 2)
    assert all(torch.allclose(g, e, rtol=1e-13, atol=0)
               for g, e in zip(frozen.geodesic(u), default, strict=True))
    assert all(torch.equal(g, e) for g, e in zip(frozen.geodesic_exact(u),
                                                 frozen.geodesic_exact(u, 1.0), strict=True))


def test_the_unbatched_adaptive_order_two_point_takes_the_fused_path() -> None:
    frozen, _, u = _adaptive_point("adaptive")
    leaves = tuple(t.clone().requires_grad_(True) for t in u)
    point = frozen.geodesic(leaves, 0.5, 2)
    assert all(type(p.grad_fn).__name__ == "OrderTwoAdaptivePathBackward" for p in point)
    batched, _, v = _adaptive_point("adaptive", (2,))
    point = batched.geodesic(tuple(t.clone().requires_grad_(True) for t in v), 0.5, 2)
    assert all(type(p.grad_fn).__name__ != "OrderTwoAdaptivePathBackward" for p in point)


def test_the_adaptive_gradient_with_its_norm_takes_its_own_path(monkeypatch) -> None:
    # the unbatched adaptive metric never takes the norm of the finished gradient (that is
    # the point of the shortcut); the euclidean one and a batched point do
    from quotientsharp.core.adaptive import AdaptivePoint

    calls = []
    plain = AdaptivePoint.squared_norm
    monkeypatch.setattr(AdaptivePoint, "squared_norm",
                        lambda self, u: calls.append(1) or plain(self, u))
    frozen, _, e = _adaptive_point("adaptive")
    frozen.riemannian_gradient_and_squared_norm(e)
    assert calls == []
    for metric, batch in (("euclidean", ()), ("adaptive", (2,))):
        other, _, e = _adaptive_point(metric, batch)
        other.riemannian_gradient_and_squared_norm(e)
    assert len(calls) == 2


@pytest.mark.parametrize("scale", [1e-4, 1.0])
def test_a_products_gradient_norm_is_not_clamped_away_from_small_values(scale) -> None:
    import quotientsharp as qs

    product = qs.ProductQuotient([qs.GLQuotient("mix"), qs.AdaptiveQuotient("adaptive",
                                                                           shapes=[(3,)])])
    gen = torch.Generator().manual_seed(4)
    x = product.random_point((), shapes=((5, 2), (4, 2), (3,)), generator=gen,
                             dtype=torch.float64)
    e = tuple(scale * torch.randn(c.shape, generator=gen, dtype=torch.float64) for c in x)
    frozen = product.at(x)
    gradient, squared = frozen.riemannian_gradient_and_squared_norm(e)
    expected = frozen.squared_norm(frozen.riemannian_gradient(e))
    assert float(abs(squared - expected)) <= 1e-12 * float(expected)
