"""DiagonalQuotient: closed forms against the generic references, over seeds and dtypes."""

import math

import pytest
import torch

import quotientsharp as qs
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


def _diagonal_point(metric: str, seed: int, batch=(3,), d: int = 4):
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient(metric, d=d)
    x = quotient.random_point(batch, generator=torch.Generator().manual_seed(seed),
                              dtype=torch.float64)
    return quotient, x


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_exact_diagonal_geodesics_default_to_time_one(metric):
    """Called without ``t``, the closed-form geodesic and quotient geodesic are those at t = 1,
    held against RK4 integration of the geodesic equation (an independent reference)."""
    from quotientsharp.core import reference

    quotient, x = _diagonal_point(metric, 11)
    generator = torch.Generator().manual_seed(12)
    u = tuple(0.2 * c * torch.randn(c.shape, generator=generator, dtype=c.dtype) for c in x)
    frozen = quotient.at(x)
    ode = reference.geodesic_ode(x, u, 1.0, quotient.point_ndims, quotient.christoffel,
                                 steps=256)
    for got, want in zip(frozen.geodesic_exact(u), ode, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=0.0)
    # the quotient geodesic is the image of the geodesic of a horizontal velocity
    h = frozen.horizontal_projection(u)
    ode = reference.geodesic_ode(x, h, 1.0, quotient.point_ndims, quotient.christoffel,
                                 steps=256)
    torch.testing.assert_close(frozen.quotient_geodesic(h), ode[0] * ode[1], rtol=1e-9, atol=0.0)


def test_the_mix_geodesic_may_pass_round_the_origin_of_the_complex_plane():
    """``1 + t (alpha + beta)`` negative with a nonzero imaginary part ``t (alpha - beta)``: the
    path goes round ``u v = 0`` and stays on the manifold (RK4 reaches the same point)."""
    from quotientsharp.core import reference
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("mix")
    x = (torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([0.5, 3.0],
                                                                      dtype=torch.float64))
    # alpha = u_u / u = -1.5, beta = u_v / v = -0.5: re = -1, im = -1 at t = 1
    u = (-1.5 * x[0], -0.5 * x[1])
    ode = reference.geodesic_ode(x, u, 1.0, quotient.point_ndims, quotient.christoffel,
                                 steps=512)
    for got, want in zip(quotient.at(x).geodesic_exact(u, 1.0), ode, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=0.0)


def test_a_mix_geodesic_that_reaches_the_origin_at_t_is_refused():
    """``alpha = beta = -1/2``: ``u(t) v(t) = u v (1 - t)^2`` is 0 at t = 1 exactly."""
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("mix")
    x = (torch.tensor([1.5, -2.0], dtype=torch.float64), torch.tensor([0.5, 3.0],
                                                                      dtype=torch.float64))
    u = (-0.5 * x[0], -0.5 * x[1])
    with pytest.raises(ValueError, match="shorten t or the velocity u"):
        quotient.at(x).geodesic_exact(u, 1.0)
    # just before, the path is still on the manifold
    assert bool((quotient.at(x).quotient_geodesic(u, 0.99) != 0).all())


def test_the_exact_mix_ball_limit_is_where_a_horizontal_geodesic_reaches_the_origin():
    """A horizontal ``xi = b (u, v)`` on the coordinate of least ``|u v|`` with norm ``rho``
    reaches ``u v = 0`` by t = 1 exactly when rho >= that coordinate's limit: the ball is
    accepted below the limit and refused at and above it."""
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("mix")
    x = (torch.tensor([1.5, -0.25, 2.0], dtype=torch.float64),
         torch.tensor([0.5, 0.75, -3.0], dtype=torch.float64))
    frozen = quotient.at(x)
    i = int((x[0] * x[1]).abs().argmin())
    unit = torch.zeros(3, dtype=torch.float64)
    unit[i] = -1.0
    xi = (unit * x[0], unit * x[1])                 # b = -1 on coordinate i, horizontal
    length = float(quotient.norm(x, xi))
    # the exact geodesic of xi scaled to norm r leaves the manifold by t = 1 iff r >= limit:
    # bisect for the limit on the geodesic itself
    low, high = 0.0, 10.0 * length
    for _ in range(80):
        mid = 0.5 * (low + high)
        try:
            frozen.geodesic_exact(tuple(mid / length * c for c in xi), 1.0)
            low = mid
        except ValueError:
            high = mid
    frozen.check_ball(0.99 * low, "exact")
    with pytest.raises(ValueError, match=r"leave the manifold \(reach") as err:
        frozen.check_ball(1.01 * high, "exact")
    assert "or order=2" in str(err.value)
    # the same for a batch of radii: only the largest counts
    frozen.check_ball(0.5 * low, 2)                 # not exact: nothing can leave


def test_diagonal_vertical_products_are_metric_products_with_the_vertical_vectors():
    for metric in ("inv", "mix"):
        quotient, x = _diagonal_point(metric, 13)
        frozen = quotient.at(x)
        generator = torch.Generator().manual_seed(14)
        u = tuple(torch.randn(c.shape, generator=generator, dtype=c.dtype) for c in x)
        dots, norms = frozen.vertical_products(u)
        for i in range(x[0].shape[-1]):
            e = torch.zeros(x[0].shape[-1], dtype=torch.float64)
            e[i] = 1.0
            vertical = (x[0] * e, -x[1] * e)         # V_i = (u_i, -v_i) e_i
            torch.testing.assert_close(dots[..., i], quotient.inner(x, vertical, u))
            torch.testing.assert_close(norms[..., i],
                                       quotient.inner(x, vertical, vertical).sqrt())


def test_diagonal_horizontality_error_over_two_batch_dimensions():
    for metric in ("inv", "mix"):
        quotient, x = _diagonal_point(metric, 15, batch=(2, 3))
        frozen = quotient.at(x)
        generator = torch.Generator().manual_seed(16)
        u = tuple(torch.randn(c.shape, generator=generator, dtype=c.dtype) for c in x)
        error = frozen.horizontality_error(u)
        assert error.shape == (2, 3)
        for j in range(2):
            for k in range(3):
                point = (x[0][j, k], x[1][j, k])
                tangent = (u[0][j, k], u[1][j, k])
                torch.testing.assert_close(error[j, k],
                                           quotient.at(point).horizontality_error(tangent))


def test_diagonal_submersion_of_another_point_and_without_a_closed_form():
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient, x = _diagonal_point("inv", 17)
    _, y = _diagonal_point("inv", 18)
    torch.testing.assert_close(quotient.at(x).submersion(y), y[0] * y[1])
    torch.testing.assert_close(quotient.submersion(y), y[0] * y[1])
    euclidean = DiagonalQuotient("euclidean")
    with pytest.raises(NotImplementedError, match="DiagonalEuclideanPoint has no closed-form"):
        euclidean.at(x).quotient_geodesic(x)


def test_diagonal_zero_entries_are_named_with_their_coordinates():
    from quotientsharp.core.diagonal import DiagonalQuotient

    u = torch.ones(2, 5, dtype=torch.float64)
    v = torch.ones(2, 5, dtype=torch.float64)
    v[0, 1] = 0.0
    v[1, 3] = 0.0
    for metric in ("inv", "mix"):
        quotient = DiagonalQuotient(metric)
        with pytest.raises(ValueError, match=r"w\[1\] \(v\) has zero entries \(v = 0 at "
                                             r"coordinates \[1, 3\]\), which the "
                                             + metric + r" metric divides by \(the orbit is "
                                             r"degenerate there\)"):
            quotient.check_point((u, v), "w")
        # the metric itself refuses them too, outside torch.func transforms
        with pytest.raises(ValueError, match="has zero entries"):
            quotient.inner((u, v), (u, u), (u, u))
    # the Euclidean metric refuses only u = v = 0
    euclidean = DiagonalQuotient("euclidean")
    a = torch.tensor([[0.0, 1.0, 2.0, 0.0], [1.0, 0.0, 0.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, 0.0, 2.0, 4.0], [0.0, 1.0, 1.0, 3.0]], dtype=torch.float64)
    euclidean.check_point((a, b))                    # u = 0 or v = 0 alone: allowed
    with pytest.raises(ValueError, match=r"w has u = v = 0 at coordinates \[2\]: the orbit "
                                         r"is degenerate there"):
        euclidean.check_point((a, b * torch.tensor([1.0, 1.0, 0.0, 1.0],
                                                   dtype=torch.float64)), "w")
    with pytest.raises(ValueError, match=r"x has u = v = 0 at coordinates \[0, 3\]"):
        euclidean.check_point((a[0], torch.tensor([0.0, 1.0, 1.0, 0.0],
                                                  dtype=torch.float64)))  # one point, no batch


def test_diagonal_point_checks_name_the_argument_and_both_shapes():
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("inv")
    with pytest.raises(ValueError, match=r"theta.*\(3,\).*\(4,\)"):
        quotient.check_point((torch.ones(3), torch.ones(4)), "theta")
    with pytest.raises(ValueError, match="theta"):
        quotient.check_point((torch.ones(3), torch.tensor([1.0, float("nan"), 1.0])), "theta")
    assert DiagonalQuotient().metric.name == "inv"          # the documented default


def test_the_diagonal_metric_works_inside_vmap():
    """Inside ``torch.func`` transforms the zero check (a data-dependent branch) is skipped."""
    quotient, x = _diagonal_point("mix", 19, batch=(3,))
    inner = torch.func.vmap(lambda a, b: quotient.inner((a, b), (a, b), (a, b)))(x[0], x[1])
    torch.testing.assert_close(inner, quotient.inner(x, x, x))


def test_diagonal_random_points_are_log_uniform_with_random_signs():
    """``|x|`` log-uniform on [1e-1, 1e1] (log10 |x| uniform on [-1, 1]), signs fair coins;
    the batch shape is kept; no generator needed; a generator makes draws reproducible."""
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("inv", d=50)
    x = quotient.random_point((200,), generator=torch.Generator().manual_seed(20),
                              dtype=torch.float64)
    assert [c.shape for c in x] == [(200, 50), (200, 50)]
    for c in x:
        logs = c.abs().log10().flatten()
        n = logs.numel()
        assert float(logs.min()) >= -1.0 and float(logs.max()) <= 1.0
        # uniform on [-1, 1]: mean 0 and variance 1/3, within six standard errors
        assert abs(float(logs.mean())) < 6 * (1 / 3 / n) ** 0.5
        assert abs(float(logs.var()) - 1 / 3) < 6 * (4 / 45 / n) ** 0.5
        negative = float((c < 0).double().mean())
        assert abs(negative - 0.5) < 6 * (0.25 / n) ** 0.5
    assert all(c.dtype == torch.float32 for c in quotient.random_point((2,)))
    first = quotient.random_point((2,), generator=torch.Generator().manual_seed(21))
    again = quotient.random_point((2,), generator=torch.Generator().manual_seed(21))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    meta = quotient.random_point((2,), device="meta")
    assert all(c.device.type == "meta" for c in meta)


def test_diagonal_group_elements_are_signed_log_normal_and_reproducible():
    """``|a| = exp(scale N(0, 1))`` with a fair random sign; the same generator seed gives the
    same element."""
    quotient, x = _diagonal_point("mix", 22, batch=(400,), d=50)
    for scale, kwargs in ((1.0, {}), (0.5, {"scale": 0.5})):
        g = quotient.random_group_element(x, generator=torch.Generator().manual_seed(23),
                                          **kwargs)
        logs = g.abs().log().flatten()
        n = logs.numel()
        assert abs(float(logs.mean())) < 6 * scale / n ** 0.5
        assert abs(float(logs.std()) - scale) < 6 * scale / (2 * n) ** 0.5
        assert abs(float((g < 0).double().mean()) - 0.5) < 6 * (0.25 / n) ** 0.5
    first = quotient.random_group_element(x, generator=torch.Generator().manual_seed(24))
    again = quotient.random_group_element(x, generator=torch.Generator().manual_seed(24))
    assert torch.equal(first, again)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_diagonal_isotropic_draws_follow_the_generator_in_the_points_dtype(metric):
    quotient, x = _diagonal_point(metric, 25)
    frozen = quotient.at(x)
    first = frozen.isotropic(torch.Generator().manual_seed(26))
    again = frozen.isotropic(torch.Generator().manual_seed(26))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    # drawn in float64, not drawn in float32 and widened: the standard normals carry more
    # than float32's 24 bits
    scale = (x[0].abs(), x[1].abs()) if metric == "inv" else (1 / x[1].abs(), 1 / x[0].abs())
    for draw, s in zip(first, scale, strict=True):
        assert draw.dtype == torch.float64
        normal = draw / s
        assert float((normal - normal.float().double()).abs().max()) > 1e-12


def _diagonal_pair(zero: bool):
    u = torch.tensor([[1.0, 0.0 if zero else 0.5]], dtype=torch.float64)
    v = torch.tensor([[2.0, 3.0]], dtype=torch.float64)
    return (u, v), (torch.ones_like(u), torch.ones_like(v))


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_diagonal_inner_and_norm_at_zero_coordinates_raise(metric):
    quotient = qs.DiagonalQuotient(metric)
    x, u = _diagonal_pair(zero=True)
    for method in (lambda: quotient.inner(x, u, u), lambda: quotient.norm(x, u),
                   lambda: quotient.horizontal_projection(x, u)):
        with pytest.raises(ValueError, match=r"x\[0\] \(u\) has zero entries"):
            method()
    with qs.value_checks(False):                 # documented: unchecked, as in the engine
        value = quotient.inner(x, u, u)
    assert math.isinf(float(value)) if metric == "inv" else math.isfinite(float(value))
    finite, v = _diagonal_pair(zero=False)
    assert torch.isfinite(quotient.norm(finite, v)).all()


def test_diagonal_euclidean_inner_is_defined_at_zero_and_bare_tensors_are_rejected():
    x, u = _diagonal_pair(zero=True)
    assert math.isfinite(float(qs.DiagonalQuotient("euclidean").inner(x, u, u)))
    with pytest.raises(TypeError, match="x must be a tuple of 2 tensors"):
        qs.DiagonalQuotient("inv").inner(torch.ones(2), u, u)
