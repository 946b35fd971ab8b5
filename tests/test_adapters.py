"""geoopt and pymanopt adapters: layout, geometry against the quotient, Taylor tests, optimizers.

The Taylor tests are our own (pymanopt's check_gradient crashes on numpy >= 2.4): along the
adapters' order-2 retraction ``R`` and a horizontal unit direction ``xi``,

- ``f(R(x, t xi)) - f(x) - t <grad, xi>`` must fall like ``t^2`` (slope 2),
- ``... - t^2 / 2 <Hess[xi], xi>`` like ``t^3`` (slope 3: the retraction is second order).

A wrong gradient leaves slope 1, a wrong Hessian slope 2.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from quotientsharp import DiagonalQuotient, ProductQuotient, SymmetryQuotient, reference
from quotientsharp.core.gl import GLQuotient

geoopt = pytest.importorskip("geoopt")
pymanopt = pytest.importorskip("pymanopt")

from pymanopt.optimizers import (  # noqa: E402
    ConjugateGradient,
    SteepestDescent,
    TrustRegions,
)

from quotientsharp.core.adapters import (  # noqa: E402
    PymanoptQuotient,
    QuotientManifold,
    QuotientTangentVector,
    StackedLayout,
)
from quotientsharp.core.adapters.pymanopt import riemannian_hessian  # noqa: E402
from tests.tiny_models import ReLUNeuronQuotient  # noqa: E402

DTYPES = [torch.float64, torch.float32]
N, M, H_DIM, D = 5, 4, 3, 6


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny tensors: extra torch threads only contend with other processes on a shared box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def quotient_cases() -> list[tuple[str, object, tuple]]:
    cases = []
    for metric in ("inv", "mix"):
        cases.append((f"diagonal-{metric}", DiagonalQuotient(metric), ((D,), (D,))))
    for metric in ("inv", "mix", "euclidean"):
        cases.append((f"gl-{metric}", GLQuotient(metric), ((N, H_DIM), (M, H_DIM))))
    return cases


CASES = quotient_cases()
CASE_IDS = [c[0] for c in CASES]


def well_conditioned_point(quotient, shapes, seed, dtype=torch.float64, batch=()):
    """Entries of moderate size: diagonal magnitudes in [0.5, 2]; GL factors with singular
    values in [1, 2] (Gram condition numbers at most 4) between random orthonormal bases."""
    gen = torch.Generator().manual_seed(seed)
    if isinstance(quotient, DiagonalQuotient):
        parts = []
        for s in shapes:
            mag = 0.5 * 4.0 ** torch.rand(*batch, *s, generator=gen, dtype=torch.float64)
            sign = torch.randint(0, 2, (*batch, *s), generator=gen).double() * 2 - 1
            parts.append((sign * mag).to(dtype))
        return tuple(parts)
    parts = []
    for rows, h in shapes:
        left, _ = torch.linalg.qr(torch.randn(*batch, rows, h, generator=gen, dtype=torch.float64))
        right, _ = torch.linalg.qr(torch.randn(*batch, h, h, generator=gen, dtype=torch.float64))
        singular = 1.0 + torch.rand(*batch, 1, h, generator=gen, dtype=torch.float64)
        parts.append(((left * singular) @ right.mT).to(dtype))
    return tuple(parts)


def invariant_loss(quotient, shapes, seed):
    """A smooth loss that depends on the point only through its orbit invariant."""
    gen = torch.Generator().manual_seed(seed + 7)
    if isinstance(quotient, DiagonalQuotient):
        features = torch.randn(8, shapes[0][0], generator=gen, dtype=torch.float64)
        target = torch.randn(8, generator=gen, dtype=torch.float64)

        def loss(u, v):
            beta = u * v
            return ((features.to(u.dtype) @ beta - target.to(u.dtype)) ** 2).mean() \
                + torch.sin(beta).sum()
        return loss
    weights = torch.randn(shapes[0][0], shapes[1][0], generator=gen, dtype=torch.float64)
    target = torch.randn(shapes[0][0], shapes[1][0], generator=gen, dtype=torch.float64)

    def loss(G, H):
        product = G @ H.mT
        return 0.5 * ((product - target.to(G.dtype)) ** 2).sum() \
            + (torch.tanh(product) * weights.to(G.dtype)).sum()
    return loss


def taylor_ts():
    return torch.logspace(-4, -2, 7, dtype=torch.float64)


# ---------------------------------------------------------------------------------- imports
def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_importing_quotientsharp_never_imports_geoopt_or_pymanopt():
    result = run_python(
        "import sys, quotientsharp, quotientsharp.core.adapters\n"
        "import quotientsharp.core.gl, quotientsharp.core.diagonal\n"
        "print(sorted(m for m in ('geoopt', 'pymanopt') if m in sys.modules))\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_missing_extra_gives_clear_import_error():
    # one interpreter for both extras (starting one costs seconds)
    result = run_python(
        "import sys\n"
        "sys.modules['geoopt'] = None\n"
        "sys.modules['pymanopt'] = None\n"
        "import quotientsharp.core.adapters as a\n"
        "for name in ('QuotientManifold', 'PymanoptQuotient'):\n"
        "    try:\n"
        "        getattr(a, name)\n"
        "    except ImportError as err:\n"
        "        print('IMPORTERROR', name, err)\n")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stdout
    assert lines[0].startswith("IMPORTERROR QuotientManifold")
    assert "pip install quotientsharp[geoopt]" in lines[0]
    assert lines[1].startswith("IMPORTERROR PymanoptQuotient")
    assert "pip install quotientsharp[pymanopt]" in lines[1]


def test_unknown_adapter_name_is_an_attribute_error():
    import quotientsharp.core.adapters as adapters
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        adapters.Nope  # noqa: B018


# ---------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("shapes, layout, stacked, ndim", [
    (((5, 3), (4, 3)), "concat", (9, 3), 2),
    (((5, 3), (4, 3)), "flat", (27,), 1),
    (((6,), (6,)), "concat", (12,), 1),
    (((6,), (6,)), "stack", (2, 6), 2),
    (((6,), (6,)), "flat", (12,), 1),
    (((2, 3), (4,)), None, (10,), 1),
])
def test_layout_split_merge_roundtrip(shapes, layout, stacked, ndim):
    lay = StackedLayout(shapes, layout)
    assert lay.stacked_shape == stacked and lay.ndim == ndim
    gen = torch.Generator().manual_seed(0)
    parts = tuple(torch.randn(7, *s, generator=gen) for s in shapes)
    merged = lay.merge(parts)
    assert merged.shape == (7, *stacked)
    back = lay.split(merged)
    for a, b in zip(back, parts, strict=True):
        assert torch.equal(a, b)
    # split returns views: writing through them changes the stacked tensor
    back[0].zero_()
    assert float(lay.split(merged)[0].abs().sum()) == 0.0


def test_layout_default_and_errors():
    assert StackedLayout(((5, 3), (4, 3))).layout == "concat"
    with pytest.raises(ValueError, match="layout='stack' needs components of identical shape"):
        StackedLayout(((5, 3), (4, 3)), "stack")
    with pytest.raises(ValueError, match="layout='concat' needs"):
        StackedLayout(((5, 3), (4, 2)), "concat")
    with pytest.raises(ValueError, match="layout must be one of"):
        StackedLayout(((5,),), "rows")
    with pytest.raises(ValueError, match="shapes\\[1\\] must be a non-empty shape"):
        StackedLayout(((5,), (0,)))
    lay = StackedLayout(((5, 3), (4, 3)))
    with pytest.raises(ValueError, match="stacked must end in shape \\(9, 3\\)"):
        lay.split(torch.zeros(8, 3))
    with pytest.raises(ValueError, match="parts\\[1\\] must end in shape \\(4, 3\\)"):
        lay.merge((torch.zeros(5, 3), torch.zeros(4, 2)))


# ---------------------------------------------------------------------------------- geoopt
@pytest.mark.parametrize("name, quotient, shapes", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(2))
def test_geoopt_operations_are_the_quotients(name, quotient, shapes, dtype, seed):
    manifold = QuotientManifold(quotient, shapes)
    x = well_conditioned_point(quotient, shapes, seed, dtype, batch=(2,))
    gen = torch.Generator().manual_seed(seed + 100)
    u = tuple(torch.randn(c.shape, generator=gen, dtype=dtype) for c in x)
    v = tuple(torch.randn(c.shape, generator=gen, dtype=dtype) for c in x)
    xs, us, vs = manifold.merge(x), manifold.merge(u), manifold.merge(v)
    # the quotient sees the adapter's views (same memory layout, so the same rounding)
    x, u, v = manifold.split(xs), manifold.split(us), manifold.split(vs)
    tol = 1e-12 if dtype == torch.float64 else 1e-6

    def close(stacked, parts):
        expected = manifold.merge(parts)
        scale = expected.abs().max().clamp_min(1.0)
        assert float((stacked - expected).abs().max() / scale) <= tol

    close(manifold.proju(xs, us), quotient.horizontal_projection(x, u))
    close(manifold.egrad2rgrad(xs, us), quotient.euclidean_to_riemannian_gradient(x, u))
    hu = quotient.horizontal_projection(x, u)
    hus = manifold.merge(hu)
    for order in (1, 2, "exact"):
        chosen = QuotientManifold(quotient, shapes, retraction=order)
        close(chosen.retr(xs, 0.1 * hus),
              quotient.geodesic(x, tuple(0.1 * c for c in hu), 1.0, order=order))
    assert manifold.retraction == 1
    close(manifold.expmap(xs, 0.1 * hus),
          quotient.geodesic(x, tuple(0.1 * c for c in hu), 1.0, order="exact"))
    inner = manifold.inner(xs, us, vs)
    assert inner.shape == (2,)
    torch.testing.assert_close(inner, quotient.inner(x, u, v), rtol=tol, atol=0)
    assert manifold.inner(xs, us, keepdim=True).shape == (2, *([1] * manifold.ndim))
    torch.testing.assert_close(manifold.inner(xs, us), manifold.norm(xs, us) ** 2,
                               rtol=100 * tol, atol=0)
    # transport: horizontal at the new point, and the identity on horizontal vectors at y = x
    y, moved = manifold.retr_transp(xs, 0.1 * hus, vs)
    assert bool(quotient.is_horizontal(manifold.split(y), manifold.split(moved),
                                       atol=100 * tol).all())
    close(manifold.transp(xs, xs, hus), hu)
    assert manifold.projx(xs) is xs


@pytest.mark.parametrize("name, quotient, shapes", CASES, ids=CASE_IDS)
def test_geoopt_checks(name, quotient, shapes):
    manifold = QuotientManifold(quotient, shapes)
    x = well_conditioned_point(quotient, shapes, 0)
    xs = manifold.merge(x)
    assert manifold.check_point_on_manifold(xs)
    horizontal = manifold.random_tangent(xs)
    assert manifold.check_vector_on_tangent(xs, horizontal)
    basis = reference.vertical_basis(quotient, x)
    vertical = manifold.merge(tuple(b[0] for b in basis))
    ok, reason = manifold.check_vector_on_tangent(xs, vertical, explain=True)
    assert not ok and "not horizontal" in reason
    ok, reason = manifold.check_point(torch.zeros(3, 3), explain=True)
    assert not ok and "must end in shape" in reason
    with pytest.raises(ValueError, match="must end in shape"):
        geoopt.ManifoldParameter(torch.zeros(3, 3), manifold=manifold)
    if quotient.name != "gl-euclidean":  # the inv and mix metrics need nondegenerate orbits
        degenerate = tuple(c.clone() for c in x)
        degenerate[0].zero_()
        ok, reason = manifold.check_point_on_manifold(manifold.merge(degenerate), explain=True)
        assert not ok and reason


def test_geoopt_constructor_errors():
    q = GLQuotient("mix")
    with pytest.raises(TypeError, match="quotient must be a SymmetryQuotient"):
        QuotientManifold("mix", ((5, 3), (4, 3)))
    with pytest.raises(ValueError, match="has no point_shapes: pass shapes="):
        QuotientManifold(q)
    with pytest.raises(ValueError, match="retraction must be one of"):
        QuotientManifold(q, ((5, 3), (4, 3)), retraction=3)
    with pytest.raises(ValueError, match="do not match the point layout"):
        QuotientManifold(q, ((5,), (4,)))
    assert QuotientManifold(GLQuotient("mix", n=5, m=4, h=3)).shapes == ((5, 3), (4, 3))


@pytest.mark.parametrize("name, quotient, shapes", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("retraction", [1, 2])
def test_geoopt_gradient_taylor_slope_two(name, quotient, shapes, seed, retraction):
    manifold = QuotientManifold(quotient, shapes, retraction=retraction)
    loss = invariant_loss(quotient, shapes, seed)
    xs = manifold.merge(well_conditioned_point(quotient, shapes, seed)).requires_grad_()
    value = loss(*manifold.split(xs))
    (egrad,) = torch.autograd.grad(value, xs)
    with torch.no_grad():
        rgrad = manifold.egrad2rgrad(xs, egrad)
        xi = manifold.random_tangent(xs, generator=torch.Generator().manual_seed(seed))
        slope_term = manifold.inner(xs, rgrad, xi)
        ts = taylor_ts()
        errors = torch.stack([
            (loss(*manifold.split(manifold.retr(xs, t * xi))) - value - t * slope_term).abs()
            for t in ts])
    slope = reference.taylor_slope(ts, errors)
    assert abs(slope - 2.0) < 0.1, (slope, errors)


@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum", "adam"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quotient, shapes", [
    (GLQuotient("mix"), ((6, 2), (5, 2))),
    (GLQuotient("inv"), ((6, 2), (5, 2))),
    (DiagonalQuotient("mix"), ((D,), (D,))),
    (DiagonalQuotient("inv"), ((D,), (D,))),
], ids=["gl-mix", "gl-inv", "diagonal-mix", "diagonal-inv"])
def test_geoopt_optimizers_run_unchanged(optimizer, dtype, quotient, shapes):
    """A batch of 3 fits of a reachable target; the loss falls by a factor 1000 or more.

    Diagonal targets keep the signs of the start's ``u * v`` (a sign change would cross the
    degenerate set ``u_i v_i = 0``).
    """
    manifold = QuotientManifold(quotient, shapes)
    truth = tuple(t.to(dtype) for t in well_conditioned_point(quotient, shapes, 1, batch=(3,)))
    if isinstance(quotient, GLQuotient):
        target = truth[0] @ truth[1].mT

        def loss(G, H):
            return 0.5 * ((G @ H.mT - target) ** 2).sum()
    start = well_conditioned_point(quotient, shapes, 2, dtype, batch=(3,))
    if not isinstance(quotient, GLQuotient):
        target = (truth[0] * truth[1]).abs() * torch.sign(start[0] * start[1])

        def loss(u, v):
            return 0.5 * ((u * v - target) ** 2).sum()
    param = geoopt.ManifoldParameter(manifold.merge(start), manifold=manifold)
    if optimizer == "adam":
        opt = geoopt.optim.RiemannianAdam([param], lr=0.1, stabilize=10)
    else:
        opt = geoopt.optim.RiemannianSGD([param], lr=0.05,
                                         momentum=0.5 if optimizer == "sgd-momentum" else 0.0,
                                         stabilize=10)
    with torch.no_grad():
        initial = float(loss(*manifold.split(param)))
    for _ in range(150):
        opt.zero_grad()
        value = loss(*manifold.split(param))
        value.backward()
        opt.step()
    assert isinstance(param, geoopt.ManifoldParameter) and param.dtype == dtype
    with torch.no_grad():
        final = float(loss(*manifold.split(param)))
    assert math.isfinite(final) and final < 1e-3 * initial, (initial, final)


def test_geoopt_parameter_survives_torch_save_and_load(tmp_path):
    manifold = QuotientManifold(GLQuotient("mix"), ((5, 3), (4, 3)))
    param = geoopt.ManifoldParameter(manifold.random(dtype=torch.float64), manifold=manifold)
    torch.save(param, tmp_path / "param.pt")
    loaded = torch.load(tmp_path / "param.pt", weights_only=False)  # geoopt needs the pickle
    assert isinstance(loaded, geoopt.ManifoldParameter) and torch.equal(loaded, param)
    assert loaded.manifold.shapes == ((5, 3), (4, 3))
    assert loaded.manifold.quotient.metric.name == "mix"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_geoopt_on_cuda_matches_cpu():
    manifold = QuotientManifold(GLQuotient("mix"), ((6, 2), (5, 2)))
    start = manifold.merge(well_conditioned_point(GLQuotient("mix"), ((6, 2), (5, 2)), 0,
                                                  batch=(4,)))
    target = torch.randn(4, 6, 5, generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64)
    finals = []
    for device in ("cpu", "cuda"):
        # a copy per device: on the CPU, .to() returns ``start`` itself, which the steps update
        param = geoopt.ManifoldParameter(start.clone().to(device), manifold=manifold)
        opt = geoopt.optim.RiemannianSGD([param], lr=0.05, momentum=0.5)
        for _ in range(20):
            opt.zero_grad()
            G, H = manifold.split(param)
            (0.5 * ((G @ H.mT - target.to(device)) ** 2).sum()).backward()
            opt.step()
        assert param.device.type == device
        finals.append(param.detach().cpu().clone())
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-9, atol=1e-9)


def test_geoopt_random_and_repr():
    manifold = QuotientManifold(GLQuotient("mix"), ((5, 3), (4, 3)))
    assert manifold.random(2, dtype=torch.float64).shape == (2, 9, 3)
    assert manifold.random(2, 9, 3).shape == (2, 9, 3)
    assert "gl-mix" in repr(manifold) and "concat" in repr(manifold)


# ---------------------------------------------------------------------------------- pymanopt
def pymanopt_problem(quotient, shapes, seed):
    space = PymanoptQuotient(quotient, shapes, rng=seed)
    loss = invariant_loss(quotient, shapes, seed)

    @pymanopt.function.pytorch(space)
    def cost(a, b):
        return loss(a, b)

    return space, pymanopt.Problem(space, cost)


def numpy_point(quotient, shapes, seed):
    return tuple(c.numpy() for c in well_conditioned_point(quotient, shapes, seed))


@pytest.mark.parametrize("name, quotient, shapes", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", range(3))
def test_pymanopt_gradient_and_hessian_taylor(name, quotient, shapes, seed):
    space, problem = pymanopt_problem(quotient, shapes, seed)
    x = numpy_point(quotient, shapes, seed)
    xi = space.random_tangent_vector(x)
    assert abs(space.norm(x, xi) - 1.0) < 1e-12
    f0 = problem.cost(x)
    grad = problem.riemannian_gradient(x)
    hess = problem.riemannian_hessian(x, xi)
    first = space.inner_product(x, grad, xi)
    second = space.inner_product(x, hess, xi)
    ts = taylor_ts()
    err1, err2 = [], []
    for t in ts.tolist():
        ft = problem.cost(space.retraction(x, t * xi))
        err1.append(abs(ft - f0 - t * first))
        err2.append(abs(ft - f0 - t * first - 0.5 * t * t * second))
    slope1 = reference.taylor_slope(ts, torch.tensor(err1))
    slope2 = reference.taylor_slope(ts, torch.tensor(err2))
    assert abs(slope1 - 2.0) < 0.1, (slope1, err1)
    assert abs(slope2 - 3.0) < 0.15, (slope2, err2)


@pytest.mark.parametrize("name, quotient, shapes", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seed", range(2))
def test_pymanopt_hessian_is_symmetric_and_horizontal(name, quotient, shapes, seed):
    space, problem = pymanopt_problem(quotient, shapes, seed)
    x = numpy_point(quotient, shapes, seed)
    xi, eta = space.random_tangent_vector(x), space.random_tangent_vector(x)
    h_xi, h_eta = problem.riemannian_hessian(x, xi), problem.riemannian_hessian(x, eta)
    a, b = space.inner_product(x, h_xi, eta), space.inner_product(x, xi, h_eta)
    scale = max(space.norm(x, h_xi), space.norm(x, h_eta), 1.0)
    assert abs(a - b) <= 1e-10 * scale, (a, b)
    xt = tuple(torch.from_numpy(c) for c in x)
    error = quotient.horizontality_error(xt, tuple(torch.from_numpy(c) for c in h_xi))
    assert float(error) < 1e-10
    # linear in the direction
    combo = problem.riemannian_hessian(x, 2.0 * xi - eta)
    expected = 2.0 * h_xi - h_eta
    assert max(float(np.abs(c - e).max()) for c, e in zip(combo, expected, strict=True)) \
        <= 1e-10 * scale


@pytest.mark.parametrize("name, quotient, shapes", CASES, ids=CASE_IDS)
def test_riemannian_hessian_against_second_derivative_along_exact_geodesic(name, quotient,
                                                                           shapes):
    """``<Hess[xi], xi> = d^2/dt^2 f(Exp(t xi))`` at 0, by a central difference (step 1e-3)."""
    seed = 3
    loss = invariant_loss(quotient, shapes, seed)
    x = well_conditioned_point(quotient, shapes, seed)
    xi = quotient.random_tangent(x, generator=torch.Generator().manual_seed(seed))
    xr = tuple(c.clone().requires_grad_() for c in x)
    egrad = torch.autograd.grad(loss(*xr), xr, create_graph=True)
    dot = sum((g * v).sum() for g, v in zip(egrad, xi, strict=True))
    ehess = torch.autograd.grad(dot, xr)
    egrad = tuple(g.detach() for g in egrad)
    hess = riemannian_hessian(quotient, x, egrad, ehess, xi)
    quadratic = float(quotient.inner(x, hess, xi))
    step = 1e-3

    def along(t):
        return float(loss(*quotient.geodesic(x, tuple(t * c for c in xi), 1.0, order="exact",
                                             steps=200)))

    second = (along(step) - 2 * along(0.0) + along(-step)) / step**2
    assert abs(second - quadratic) <= 1e-4 * max(1.0, abs(quadratic)), (second, quadratic)


def test_pymanopt_dimension_typical_dist_and_errors():
    space = PymanoptQuotient(GLQuotient("mix"), ((5, 3), (4, 3)))
    assert space.dim == (5 + 4) * 3 - 9
    assert space.point_layout == 2
    assert math.isclose(space.typical_dist, math.sqrt(space.dim))
    batched = PymanoptQuotient(GLQuotient("mix"), ((5, 3), (4, 3)), batch_shape=(2,),
                               typical_dist=7.0)
    assert batched.dim == 2 * ((5 + 4) * 3 - 9) and batched.typical_dist == 7.0
    assert PymanoptQuotient(DiagonalQuotient("inv"), ((D,), (D,))).dim == D
    x = space.random_point()
    with pytest.raises(NotImplementedError, match="minimisation over the group"):
        space.dist(x, x)
    with pytest.raises(ValueError, match="point\\[1\\] must have shape \\(4, 3\\)"):
        space.projection((x[0], x[1][:3]), x)
    with pytest.raises(TypeError, match="point must be a tuple of 2 numpy arrays"):
        space.zero_vector(x[0])
    with pytest.raises(ValueError, match="carry leading batch dimensions"):
        PymanoptQuotient(GLQuotient("mix"), ((2, 5, 3), (3, 4, 3)))
    with pytest.raises(ValueError, match="retraction must be one of"):
        PymanoptQuotient(GLQuotient("mix"), ((5, 3), (4, 3)), retraction="cayley")
    bad = (x[0].copy(), x[1])
    bad[0][0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        space.norm(bad, space.zero_vector(x))


def test_pymanopt_exp_transport_zero_and_random():
    quotient = GLQuotient("inv")
    space = PymanoptQuotient(quotient, ((5, 3), (4, 3)), rng=0)
    x = space.random_point()
    assert all(c.dtype == np.float64 for c in x)
    xi = space.random_tangent_vector(x)
    y = space.exp(x, 0.1 * xi)
    expected = quotient.geodesic(tuple(torch.from_numpy(c) for c in x),
                                 tuple(torch.from_numpy(0.1 * c) for c in xi), 1.0,
                                 order="exact")
    for a, b in zip(y, expected, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-12)
    moved = space.transport(x, y, xi)
    yt = tuple(torch.from_numpy(c) for c in y)
    assert float(quotient.horizontality_error(yt, tuple(torch.from_numpy(c) for c in moved))) \
        < 1e-10
    assert space.norm(x, space.zero_vector(x)) == 0.0
    again = PymanoptQuotient(quotient, ((5, 3), (4, 3)), rng=0).random_point()
    assert all(np.array_equal(a, b) for a, b in zip(x, again, strict=True))
    # without rng: numpy's global generator, as pymanopt's own manifolds
    global_space = PymanoptQuotient(quotient, ((5, 3), (4, 3)))
    np.random.seed(3)  # noqa: NPY002
    first = global_space.random_point()
    np.random.seed(3)  # noqa: NPY002
    second = global_space.random_point()
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not np.array_equal(first[0], x[0])


def test_tangent_vector_arithmetic():
    a = QuotientTangentVector([np.ones(2), np.full(3, 2.0)])
    b = QuotientTangentVector([np.full(2, 3.0), np.ones(3)])
    for value in (a + b, a - b, 2 * a, a * 2.0, np.float64(2.0) * a, a / 2, -a):
        assert isinstance(value, QuotientTangentVector) and len(value) == 2
    np.testing.assert_array_equal((np.float64(2.0) * a)[1], np.full(3, 4.0))
    np.testing.assert_array_equal((a - b)[0], np.full(2, -2.0))
    np.testing.assert_array_equal(((1, 1) + a)[0], np.full(2, 2.0))
    with pytest.raises(TypeError, match="cannot add"):
        a + (np.ones(2),)  # noqa: B018
    with pytest.raises(TypeError, match="scaled by a scalar"):
        a * np.ones(2)  # noqa: B018


@pytest.mark.parametrize("optimizer", ["steepest_descent", "conjugate_gradient",
                                       "trust_regions"])
@pytest.mark.parametrize("quotient, shapes", [
    (GLQuotient("mix"), ((6, 2), (5, 2))),
    (GLQuotient("inv"), ((6, 2), (5, 2))),
    (DiagonalQuotient("mix"), ((D,), (D,))),
], ids=["gl-mix", "gl-inv", "diagonal-mix"])
def test_pymanopt_optimizers_run(optimizer, quotient, shapes):
    truth = well_conditioned_point(quotient, shapes, 4)
    if isinstance(quotient, GLQuotient):
        target = truth[0] @ truth[1].mT

        def loss(G, H):
            return 0.5 * ((G @ H.mT - target) ** 2).sum()
    else:  # keep the signs of the start's u * v (see test_geoopt_optimizers_run_unchanged)
        start_product = torch.from_numpy(np.prod(numpy_point(quotient, shapes, 5), axis=0))
        target = (truth[0] * truth[1]).abs() * torch.sign(start_product)

        def loss(u, v):
            return 0.5 * ((u * v - target) ** 2).sum()
    space = PymanoptQuotient(quotient, shapes)

    @pymanopt.function.pytorch(space)
    def cost(a, b):
        return loss(a, b)

    problem = pymanopt.Problem(space, cost)
    start = numpy_point(quotient, shapes, 5)
    initial = problem.cost(start)
    solver = {"steepest_descent": SteepestDescent, "conjugate_gradient": ConjugateGradient,
              "trust_regions": TrustRegions}[optimizer](verbosity=0, max_iterations=300,
                                                        min_gradient_norm=1e-9)
    result = solver.run(problem, initial_point=start)
    assert result.cost < 1e-8 * initial, (result.cost, initial, result.stopping_criterion)


class PlainInvGL(SymmetryQuotient):
    """GL(h) with the inv metric from the four required members only: every other operation
    is the generic autograd default of :mod:`quotientsharp.core.reference`."""

    point_ndims = (2, 2)

    def inner(self, x, u, v):
        return sum(((a.mT @ b) * torch.linalg.inv(c.mT @ c)).sum((-1, -2))
                   for a, b, c in zip(u, v, x, strict=True))

    def vertical(self, x, a):
        return -x[0] @ a, x[1] @ a.mT

    def act(self, x, g):
        return x[0] @ torch.linalg.inv(g), x[1] @ g.mT

    def algebra_shape(self, x):
        return (x[0].shape[-1],) * 2


def test_user_quotient_with_generic_defaults_through_both_adapters():
    """Any quotient: the adapters only use the public methods, and the Hessian's forward-mode
    pass goes through the autograd defaults (dense metric, Cholesky) as well."""
    shapes = ((5, 3), (4, 3))
    plain, closed = PlainInvGL(), GLQuotient("inv")
    loss = invariant_loss(closed, shapes, 0)
    x = tuple(c.numpy() for c in well_conditioned_point(closed, shapes, 0))
    spaces = [PymanoptQuotient(q, shapes, rng=0) for q in (plain, closed)]
    problems = [pymanopt.Problem(s, pymanopt.function.pytorch(s)(loss)) for s in spaces]
    xi = spaces[0].random_tangent_vector(x)
    hessians = [p.riemannian_hessian(x, xi) for p in problems]
    gradients = [p.riemannian_gradient(x) for p in problems]
    for a, b in zip(hessians[0], hessians[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    for a, b in zip(gradients[0], gradients[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    manifolds = [QuotientManifold(q, shapes) for q in (plain, closed)]
    xs = manifolds[0].merge(tuple(torch.from_numpy(c) for c in x))
    egrad = manifolds[0].merge(tuple(torch.from_numpy(c) for c in xi))
    torch.testing.assert_close(manifolds[0].egrad2rgrad(xs, egrad),
                               manifolds[1].egrad2rgrad(xs, egrad), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------- one shape convention
STACKED = 3   # pairs stacked in front of one GL point


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("seed", range(3))
def test_both_adapters_take_trailing_shapes_and_leading_batch(metric, seed):
    """The same ``shapes`` (one point's trailing shapes) in both adapters; the stacked pairs
    are geoopt's tensor batch and pymanopt's ``batch_shape``; their geometry agrees."""
    quotient, shapes = GLQuotient(metric), ((N, H_DIM), (M, H_DIM))
    manifold = QuotientManifold(quotient, shapes)
    space = PymanoptQuotient(quotient, shapes, batch_shape=(STACKED,))
    assert manifold.shapes == space.shapes == space.trailing_shapes == shapes
    assert space.batch_shape == (STACKED,)
    assert space.array_shapes == ((STACKED, N, H_DIM), (STACKED, M, H_DIM))
    x = well_conditioned_point(quotient, shapes, seed, batch=(STACKED,))
    gen = torch.Generator().manual_seed(100 + seed)
    egrad = tuple(torch.randn(c.shape, generator=gen, dtype=torch.float64) for c in x)
    stacked = manifold.merge(x)
    assert stacked.shape == (STACKED, N + M, H_DIM)
    inner = manifold.inner(stacked, manifold.merge(egrad))
    assert inner.shape == (STACKED,)          # one value per pair in geoopt
    arrays = tuple(c.numpy() for c in x)
    grad_arrays = tuple(c.numpy() for c in egrad)
    assert math.isclose(space.inner_product(arrays, grad_arrays, grad_arrays),
                        float(inner.sum()), rel_tol=1e-12)   # summed over the batch
    rgrad = manifold.split(manifold.egrad2rgrad(stacked, manifold.merge(egrad)))
    for a, b in zip(space.euclidean_to_riemannian_gradient(arrays, grad_arrays), rgrad,
                    strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-12)
    assert all(a.shape == s for a, s in zip(space.random_point(), space.array_shapes,
                                            strict=True))


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("seed", range(2))
def test_product_quotient_folded_dimensions_are_part_of_shapes(metric, seed):
    """A ProductQuotient's folded dimensions belong to its point: trailing in both adapters,
    no batch, no warning."""
    quotient = ProductQuotient([GLQuotient(metric)], folded=[1])
    shapes = ((STACKED, N, H_DIM), (STACKED, M, H_DIM))
    manifold = QuotientManifold(quotient, shapes)
    space = PymanoptQuotient(quotient, shapes)
    assert manifold.shapes == space.shapes == shapes and space.batch_shape == ()
    x = well_conditioned_point(GLQuotient(metric), ((N, H_DIM), (M, H_DIM)), seed,
                               batch=(STACKED,))
    stacked = manifold.merge(x)
    assert manifold.inner(stacked, stacked).shape == ()       # the folded heads are one point
    arrays = tuple(c.numpy() for c in x)
    assert math.isclose(space.inner_product(arrays, arrays, arrays),
                        float(manifold.inner(stacked, stacked)), rel_tol=1e-12)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_old_spelling_with_batch_in_shapes(metric):
    """0.1's spelling, the batch in front of the shapes, is refused by both adapters (0.3),
    naming the shapes to pass."""
    quotient, trailing = GLQuotient(metric), ((N, H_DIM), (M, H_DIM))
    old = ((STACKED, N, H_DIM), (STACKED, M, H_DIM))
    for batch_shape in (None, (STACKED,)):
        with pytest.raises(ValueError, match=r"carry leading batch dimensions: .* pass "
                                             r"shapes=\(\(5, 3\), \(4, 3\)\), and the leading "
                                             r"\(batch\) dimensions as batch_shape="):
            PymanoptQuotient(quotient, old, batch_shape=batch_shape)
    with pytest.raises(ValueError, match=r"pass shapes=\(\(5, 3\), \(4, 3\)\)"):
        QuotientManifold(quotient, old)
    with pytest.raises(ValueError, match="batch_shape entries must be an integer >= 1"):
        PymanoptQuotient(quotient, trailing, batch_shape=(0,))


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("seed", range(2))
def test_riemannian_adam_is_invariant_and_coordinatewise_adam_is_not(metric, seed):
    """docs/adapters.md: geoopt's RiemannianAdam keeps one second moment per point (the metric
    norm), so from starts related by a group element the products G H^T agree; torch's Adam
    does not."""
    quotient, shapes = GLQuotient(metric), ((N, H_DIM), (M, H_DIM))
    manifold = QuotientManifold(quotient, shapes)
    x = well_conditioned_point(quotient, shapes, seed, batch=(2,))
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(2, N, M, generator=gen, dtype=torch.float64)
    basis = torch.linalg.qr(torch.randn(2, H_DIM, H_DIM, generator=gen,
                                        dtype=torch.float64)).Q
    a = basis @ torch.diag(torch.tensor([1.0, 3.0, 10.0], dtype=torch.float64))
    starts = [x, (x[0] @ a, x[1] @ torch.linalg.inv(a).mT)]

    def products(make):
        out = []
        for start in starts:
            param = geoopt.ManifoldParameter(manifold.merge(start), manifold=manifold)
            opt = make([param])
            for _ in range(10):
                opt.zero_grad()
                G, H = manifold.split(param)
                (G @ H.mT - target).square().sum().backward()
                opt.step()
            with torch.no_grad():
                G, H = manifold.split(param)
                out.append(G @ H.mT)
        return float((out[0] - out[1]).norm() / out[0].norm())

    assert products(lambda p: geoopt.optim.RiemannianAdam(p, lr=0.02)) < 1e-10
    assert products(lambda p: geoopt.optim.RiemannianSGD(p, lr=1e-3)) < 1e-10
    assert products(lambda p: torch.optim.Adam(p, lr=0.02)) > 1e-3


class _WrongChristoffelNeuron(ReLUNeuronQuotient):
    """The ReLU unit's scaling quotient with a Christoffel contraction off by a factor 2."""

    def christoffel(self, x, u, v=None):
        return tuple(2 * c for c in reference.christoffel(self, x, u, v))


class _WrongGradientNeuron(_WrongChristoffelNeuron):
    christoffel = SymmetryQuotient.christoffel

    def euclidean_to_riemannian_gradient(self, x, egrad):
        # the Euclidean gradient projected, not raised
        return reference.horizontal_projection(self, x, egrad)


@pytest.mark.parametrize(("cls", "prop"), [(_WrongChristoffelNeuron, "christoffel_vs_reference"),
                                           (_WrongGradientNeuron, "gradient_vs_reference")])
def test_adapters_refuse_a_user_quotient_with_a_wrong_closed_form(cls, prop):
    with pytest.raises(ValueError, match=rf"QuotientManifold: {cls.__name__} fails {prop}"):
        QuotientManifold(cls(), ((4,), (3,)))
    with pytest.raises(ValueError, match=rf"PymanoptQuotient: {cls.__name__} fails {prop}"):
        PymanoptQuotient(cls(), ((4,), (3,)), batch_shape=(2,))
