"""DiagonalQuotient: closed forms against the generic references, over seeds and dtypes."""

import pytest
import torch

from quotientsharp import DiagonalQuotient, reference
from quotientsharp.core.checks import check_all, relative_error

METRICS = ["inv", "mix"]
DTYPES = [torch.float64, torch.float32]


def tol(dtype):
    return 1e-10 if dtype == torch.float64 else 1e-4


def wide_point(batch, d, dtype, seed):
    """Entries of both signs with magnitudes log-uniform in [1e-2, 1e2]."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        mag = 10.0 ** (4 * torch.rand(*batch, d, generator=gen, dtype=torch.float64) - 2)
        sign = torch.randint(0, 2, (*batch, d), generator=gen).double() * 2 - 1
        out.append((sign * mag).to(dtype))
    return tuple(out)


def randn_like_point(x, seed):
    gen = torch.Generator().manual_seed(seed + 1000)
    return tuple(torch.randn(c.shape, generator=gen, dtype=torch.float64).to(c.dtype) for c in x)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_check_all_passes(metric, dtype, seed):
    results = check_all(DiagonalQuotient(metric, d=5), seed=seed, dtype=dtype)
    failed = [r for r in results if not r.passed]
    assert not failed, failed


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_closed_forms_match_reference_on_wide_points(metric, dtype, seed):
    q = DiagonalQuotient(metric)
    x = wide_point((2, 3), 6, dtype, seed)
    # relative comparisons per coordinate: magnitudes span 8 orders, so compare scaled errors
    u = tuple(c * torch.randn_like(c) for c in x)
    w = tuple(c * torch.randn_like(c) for c in x)
    pairs = {
        "christoffel": (q.christoffel(x, u, w), reference.christoffel(q, x, u, w)),
        "projection": (q.horizontal_projection(x, u), reference.horizontal_projection(q, x, u)),
        "gradient": (q.euclidean_to_riemannian_gradient(x, u),
                     reference.euclidean_to_riemannian_gradient(q, x, u)),
    }
    for name, (closed, ref) in pairs.items():
        for a, b in zip(closed, ref, strict=True):
            err = ((a - b).abs() / b.abs().clamp_min(torch.finfo(dtype).tiny)).max()
            # float32 references solve 12x12 systems with condition numbers up to 1e8
            bound = 1e-8 if dtype == torch.float64 else 5e-2
            assert float(err) < bound, (name, float(err))


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("seed", range(3))
def test_exact_geodesic_matches_ode_for_non_horizontal_velocity(metric, seed):
    q = DiagonalQuotient(metric)
    x = wide_point((4,), 3, torch.float64, seed)
    u = tuple(0.2 * c * torch.randn_like(c) for c in x)  # generic: not horizontal
    assert not bool(q.is_horizontal(x, u).all())
    closed = q.geodesic(x, u, order="exact")
    # the closed-form Christoffel is itself held against autograd in test_check_all_passes
    ode = reference.geodesic_ode(x, u, 1.0, q.point_ndims, q.christoffel, steps=256)
    assert relative_error(closed, ode) < 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_horizontal_geodesics_follow_spec_formulas(seed):
    x = wide_point((5,), 4, torch.float64, seed)
    gen = torch.Generator().manual_seed(seed)
    b = 0.4 * (2 * torch.rand(5, 4, dtype=torch.float64, generator=gen) - 1)  # 1 + 2b > 0
    u = (b * x[0], b * x[1])
    for metric, factor in (("inv", torch.exp(b)), ("mix", torch.sqrt(1 + 2 * b))):
        g = DiagonalQuotient(metric).geodesic(x, u, order="exact")
        assert relative_error(g, (x[0] * factor, x[1] * factor)) < 1e-13
    # and the network parameter beta = u * v follows beta0 exp(2b) and beta0 (1 + 2b)
    beta0 = x[0] * x[1]
    g_inv = DiagonalQuotient("inv").geodesic(x, u, order="exact")
    g_mix = DiagonalQuotient("mix").geodesic(x, u, order="exact")
    assert relative_error((g_inv[0] * g_inv[1],), (beta0 * torch.exp(2 * b),)) < 1e-13
    assert relative_error((g_mix[0] * g_mix[1],), (beta0 * (1 + 2 * b),)) < 1e-13


@pytest.mark.parametrize("metric", METRICS)
def test_horizontal_norms_match_spec(metric):
    x = wide_point((3,), 5, torch.float64, 0)
    b = torch.randn(3, 5, dtype=torch.float64)
    u = (b * x[0], b * x[1])
    q = DiagonalQuotient(metric)
    expected = 2 * b.square().sum(-1) if metric == "inv" else 2 * (x[0] * x[1] * b).square().sum(-1)
    assert torch.allclose(q.norm(x, u).square(), expected, rtol=1e-13)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("seed", range(3))
def test_invariance_and_order_one_adaptive_equivalence(metric, seed):
    q = DiagonalQuotient(metric)
    x = wide_point((3,), 4, torch.float64, seed)
    gen = torch.Generator().manual_seed(seed)
    g = q.random_group_element(x, scale=2.0, generator=gen)
    u = randn_like_point(x, seed)
    gx, gu = q.act(x, g), q.act_tangent(x, u, g)
    assert torch.allclose(q.inner(gx, gu, gu), q.inner(x, u, u), rtol=1e-12)
    # the projection commutes with the action (equivariance)
    assert relative_error(q.horizontal_projection(gx, gu),
                          q.act_tangent(x, q.horizontal_projection(x, u), g)) < 1e-12


def test_broadcasting_point_against_stacked_tangents():
    q = DiagonalQuotient("mix")
    x = wide_point((3,), 4, torch.float64, 0)
    u = tuple(torch.randn(7, 3, 4, dtype=torch.float64) for _ in range(2))
    stacked = q.christoffel(x, u)
    for i in range(7):
        looped = q.christoffel(x, (u[0][i], u[1][i]))
        assert relative_error(tuple(s[i] for s in stacked), looped) == 0.0


def test_dtype_and_device_follow_inputs():
    q = DiagonalQuotient("inv")
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = (torch.ones(3, dtype=dtype), 2 * torch.ones(3, dtype=dtype))
        out = q.horizontal_projection(x, x)
        assert all(c.dtype == dtype for c in out)


class TestBadInput:
    def test_zero_entry_named(self):
        q = DiagonalQuotient("inv")
        x = (torch.tensor([1.0, 0.0]), torch.tensor([1.0, 2.0]))
        with pytest.raises(ValueError, match=r"x\[0\] \(u\) has zero entries"):
            q.christoffel(x, x)

    def test_non_finite_named(self):
        q = DiagonalQuotient("mix")
        x = (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]))
        with pytest.raises(ValueError, match=r"x\[0\] contains non-finite"):
            q.horizontal_projection(x, x)

    def test_wrong_shapes(self):
        q = DiagonalQuotient("inv")
        x = (torch.ones(3), torch.ones(4))
        with pytest.raises(ValueError, match="same last dimension"):
            q.norm(q.check_point(x), x)
        with pytest.raises(ValueError, match=r"u\[1\] has shape"):
            q.horizontal_projection((torch.ones(3), torch.ones(3)), (torch.ones(3), torch.ones(4)))

    def test_mismatched_dtype_and_type(self):
        q = DiagonalQuotient("inv")
        with pytest.raises(TypeError, match=r"x\[1\] has dtype"):
            q.check_point((torch.ones(3), torch.ones(3, dtype=torch.float64)))
        with pytest.raises(TypeError, match="tuple of 2 tensors"):
            q.check_point(torch.ones(2, 3))
        with pytest.raises(TypeError, match="floating dtype"):
            q.check_point((torch.ones(3, dtype=torch.long), torch.ones(3, dtype=torch.long)))
        with pytest.raises(TypeError, match=r"u\[0\] has dtype"):
            q.christoffel((torch.ones(3), torch.ones(3)),
                          (torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)))

    def test_unknown_metric_and_order(self):
        with pytest.raises(ValueError, match="metric must be one of"):
            DiagonalQuotient("euclid")
        q = DiagonalQuotient("inv")
        x = (torch.ones(3), torch.ones(3))
        with pytest.raises(ValueError, match="order must be"):
            q.geodesic(x, x, order=3)

    def test_mix_geodesic_leaving_manifold(self):
        q = DiagonalQuotient("mix")
        x = (torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
        u = (torch.tensor([-1.0, 0.1], dtype=torch.float64),) * 2  # b = -1: 1 + 2b < 0
        with pytest.raises(ValueError, match="leaves the manifold"):
            q.geodesic(x, u, order="exact")


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_quotient_geodesic_is_the_projection_of_the_exact_geodesic(metric):
    """``beta(t)`` in closed form equals ``u(t) v(t)`` of the exact geodesic upstairs (for a
    horizontal velocity that keeps the path inside the manifold)."""
    q = DiagonalQuotient(metric, d=5)
    gen = torch.Generator().manual_seed(9)
    x = q.random_point((3,), generator=gen, dtype=torch.float64)
    xi = q.horizontal_projection(x, tuple(torch.randn(c.shape, generator=gen,
                                                      dtype=torch.float64) for c in x))
    xi = tuple(0.1 * c / q.norm(x, xi).unsqueeze(-1) * (x[0] * x[1]).abs().amin(-1,
                                                                              keepdim=True)
               for c in xi)
    frozen = q.at(x)
    for t in (0.3, 1.0):
        upstairs = q.geodesic(x, xi, t=t, order="exact")
        assert torch.allclose(frozen.quotient_geodesic(xi, t), upstairs[0] * upstairs[1],
                              rtol=1e-12, atol=0)
