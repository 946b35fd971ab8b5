"""GLQuotient and the Sylvester solvers: closed forms against independent references.

References: the generic autograd defaults of :mod:`quotientsharp.core.reference` applied to the same
``inner`` (projections, gradients, Christoffel contractions, horizontality), dense
Kronecker-product solves (Sylvester), ``torch.func.jvp`` (action, vertical space), RK4
integration (geodesics) and pseudo-inverses of the dense vertical Gram matrix (degenerate
orbits).
"""

import math

import pytest
import torch

import quotientsharp as qs
from quotientsharp import GLQuotient, reference, value_checks
from quotientsharp.core.checks import check_all, relative_error
from quotientsharp.core.gl.point import solve_sylvester_eig

METRICS = ["inv", "mix", "euclidean"]
INVARIANT_METRICS = ["inv", "mix"]
DTYPES = [torch.float64, torch.float32]
SHAPES = [(2, 2, 1), (3, 2, 2), (5, 4, 3), (9, 7, 4)]
EPS64 = torch.finfo(torch.float64).eps


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    # every matrix here is tiny; on a loaded 2-core machine OpenMP threads of the LAPACK calls
    # stall each other for milliseconds per call, which dominates the run time
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tol(dtype):
    return 1e-10 if dtype == torch.float64 else 1e-4


def gaussian_point(n, m, h, seed, dtype=torch.float64, batch=()):
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(*batch, n, h, generator=gen, dtype=torch.float64)
    H = torch.randn(*batch, m, h, generator=gen, dtype=torch.float64)
    return G.to(dtype), H.to(dtype)


def gaussian_tangent(x, seed):
    gen = torch.Generator().manual_seed(seed + 7919)
    return tuple(torch.randn(c.shape, generator=gen, dtype=torch.float64).to(c.dtype) for c in x)


def cast(x, dtype):
    return tuple(c.to(dtype) for c in x)


# ====================================================================== Sylvester solvers
def spd(p, seed, batch=(), rank=None, shift=0.0):
    """``B B^T + shift I`` with ``B`` Gaussian of ``rank`` columns (PSD when rank < p)."""
    gen = torch.Generator().manual_seed(seed)
    b = torch.randn(*batch, p, p if rank is None else rank, generator=gen, dtype=torch.float64)
    return b @ b.mT + shift * torch.eye(p, dtype=torch.float64)


def kron_operator(P, Q):
    """Row-major ``vec(P X + X Q) = (P kron I + I kron Q^T) vec(X)``."""
    p, q = P.shape[-1], Q.shape[-1]
    eye_p = torch.eye(p, dtype=P.dtype)
    eye_q = torch.eye(q, dtype=Q.dtype)
    return (torch.kron(P.contiguous(), eye_q) + torch.kron(eye_p, Q.mT.contiguous()))


def solve_sylvester_spd(P, Q, C, rcond=None):
    """``P X + X Q = C`` by :func:`solve_sylvester_eig` in the eigenbases of ``P`` and ``Q``."""
    eigvals_p, eigvecs_p = torch.linalg.eigh(P)
    eigvals_q, eigvecs_q = torch.linalg.eigh(Q)
    denominators = eigvals_p.unsqueeze(-1) + eigvals_q.unsqueeze(-2)
    return solve_sylvester_eig(eigvecs_p, eigvecs_q, denominators, C, rcond)


def kron_solve(P, Q, C):
    """Dense reference solution of ``P X + X Q = C``, looping over a flat batch."""
    batch = torch.broadcast_shapes(P.shape[:-2], Q.shape[:-2], C.shape[:-2])
    p, q = P.shape[-1], Q.shape[-1]
    Pb = P.expand(*batch, p, p).reshape(-1, p, p)
    Qb = Q.expand(*batch, q, q).reshape(-1, q, q)
    Cb = C.expand(*batch, p, q).reshape(-1, p * q)
    out = [torch.linalg.solve(kron_operator(a, b), c) for a, b, c in zip(Pb, Qb, Cb, strict=True)]
    return torch.stack(out).reshape(*batch, p, q)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", [(1, 1), (2, 3), (4, 4), (5, 2)])
@pytest.mark.parametrize("seed", range(3))
def test_sylvester_spd_matches_kronecker(dtype, sizes, seed):
    p, q = sizes
    P, Q = spd(p, seed, (3,), shift=0.1), spd(q, seed + 100, (3,), shift=0.1)
    gen = torch.Generator().manual_seed(seed + 200)
    C = torch.randn(3, p, q, generator=gen, dtype=torch.float64)
    expected = kron_solve(P, Q, C)
    got = solve_sylvester_spd(P.to(dtype), Q.to(dtype), C.to(dtype))
    assert got.dtype == dtype and got.shape == (3, p, q)
    assert relative_error((got.double(),), (expected,)) <= tol(dtype)
    residual = P @ got.double() + got.double() @ Q - C
    assert float(residual.abs().max() / C.abs().max()) <= tol(dtype) * 10


def test_sylvester_spd_broadcasts_batch_dimensions():
    P, Q = spd(3, 0, (2, 1), shift=0.5), spd(2, 1, (4,), shift=0.5)
    C = torch.randn(2, 4, 3, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = solve_sylvester_spd(P, Q, C)
    assert got.shape == (2, 4, 3, 2)
    assert relative_error((got,), (kron_solve(P, Q, C),)) <= 1e-12


def test_sylvester_singular_gives_minimum_norm_solution():
    # P and Q share a null direction: lambda + mu = 0 there, the operator is singular
    P, Q = spd(4, 0, rank=2), spd(3, 1, rank=1)
    operator = kron_operator(P, Q)
    target = torch.randn(12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    C = (operator @ target).reshape(4, 3)                 # in the range: solvable
    expected = (torch.linalg.pinv(operator) @ C.reshape(-1)).reshape(4, 3)
    got = solve_sylvester_spd(P, Q, C)
    assert torch.isfinite(got).all()
    assert relative_error((got,), (expected,)) <= 1e-9
    assert relative_error((P @ got + got @ Q,), (C,)) <= 1e-9


def test_sylvester_singular_backward_is_finite():
    P, Q = spd(3, 0, rank=1), spd(2, 1, rank=1)
    C = torch.randn(3, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    C = (P @ C + C @ Q).requires_grad_(True)
    (grad,) = torch.autograd.grad(solve_sylvester_spd(P, Q, C).square().sum(), C)
    assert torch.isfinite(grad).all()


def test_sylvester_eig_rcond_and_errors():
    eye = torch.eye(2, dtype=torch.float64)
    denominators = torch.tensor([[1.0, 1e-3], [2.0, 3.0]], dtype=torch.float64)
    rhs = torch.ones(2, 2, dtype=torch.float64)
    kept = solve_sylvester_eig(eye, eye, denominators, rhs)
    assert kept[0, 1] == pytest.approx(1e3)
    cut = solve_sylvester_eig(eye, eye, denominators, rhs, rcond=1e-2)
    assert cut[0, 1] == 0 and cut[1, 1] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="rcond"):
        solve_sylvester_eig(eye, eye, denominators, rhs, rcond=-1.0)


# ====================================================================== closed forms
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_closed_forms_match_reference(metric, eps, shape, dtype):
    q = GLQuotient(metric, eps)
    for seed in range(2):
        x64 = gaussian_point(*shape, seed)
        u64, w64 = gaussian_tangent(x64, seed), gaussian_tangent(x64, seed + 1)
        # the reference always runs in float64: float32 closed forms are held to the truth
        expected = {
            "horizontal": reference.horizontal_projection(q, x64, u64),
            "vertical": reference.vertical_projection(q, x64, u64),
            "gradient": reference.euclidean_to_riemannian_gradient(q, x64, u64),
            "christoffel_bilinear": reference.christoffel(q, x64, u64, w64),
            "christoffel_quadratic": reference.christoffel(q, x64, u64),
        }
        x, u, w = cast(x64, dtype), cast(u64, dtype), cast(w64, dtype)
        got = {
            "horizontal": q.horizontal_projection(x, u),
            "vertical": q.vertical_projection(x, u),
            "gradient": q.euclidean_to_riemannian_gradient(x, u),
            "christoffel_bilinear": q.christoffel(x, u, w),
            "christoffel_quadratic": q.christoffel(x, u),
        }
        for name, value in got.items():
            assert all(c.dtype == dtype for c in value), name
            err = relative_error(cast(value, torch.float64), expected[name])
            assert err <= tol(dtype), (name, seed, err)
        for vec in (u64, expected["horizontal"], expected["vertical"]):
            ref = reference.horizontality_error(q, x64, vec)
            mine = q.horizontality_error(x, cast(vec, dtype)).double()
            assert float((mine - ref).abs()) <= tol(dtype) * 10, (seed, float(mine), float(ref))


@pytest.mark.parametrize("metric", METRICS)
# eps = 1 as well as 0.3: a branch on "eps is zero" that compared eps with 1 instead would add
# eps I everywhere except at eps = 1, unseen at 0 and 0.3
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_inner_matches_trace_formula(metric, eps):
    x = gaussian_point(5, 4, 3, 0, batch=(2,))
    u, w = gaussian_tangent(x, 0), gaussian_tangent(x, 1)
    G, H = x
    eye = torch.eye(3, dtype=torch.float64)
    s_g, s_h = G.mT @ G + eps * eye, H.mT @ H + eps * eye
    cross_g, cross_h = u[0].mT @ w[0], u[1].mT @ w[1]

    def trace(a):
        return a.diagonal(dim1=-2, dim2=-1).sum(-1)

    expected = {"euclidean": trace(cross_g) + trace(cross_h),
                "inv": trace(torch.linalg.inv(s_g) @ cross_g)
                + trace(torch.linalg.inv(s_h) @ cross_h),
                "mix": trace(s_h @ cross_g) + trace(s_g @ cross_h)}[metric]
    got = GLQuotient(metric, eps).inner(x, u, w)
    assert got.shape == (2,)
    assert relative_error((got,), (expected,)) <= 1e-12


# ====================================================================== projection properties
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.05])
@pytest.mark.parametrize("dtype", DTYPES)
def test_projection_properties(metric, eps, dtype):
    q = GLQuotient(metric, eps)
    x = gaussian_point(6, 5, 3, 3, dtype, batch=(4,))
    u = gaussian_tangent(x, 3)
    hor, ver = q.horizontal_projection(x, u), q.vertical_projection(x, u)
    t = tol(dtype) * (10 if dtype == torch.float32 else 1)
    assert relative_error(q.horizontal_projection(x, hor), hor) <= t       # idempotent
    assert relative_error(tuple(a + b for a, b in zip(hor, ver, strict=True)), u) <= t
    assert float((q.inner(x, hor, ver).abs() / q.inner(x, u, u)).max()) <= t   # orthogonal
    assert float(q.horizontality_error(x, hor).max()) <= t                     # horizontal
    # the vertical part has no horizontal component
    rest = q.horizontal_projection(x, ver)
    assert float((q.norm(x, rest) / q.norm(x, u)).max()) <= t


@pytest.mark.parametrize("metric", METRICS)
def test_horizontality_error_meaning(metric):
    q = GLQuotient(metric)
    x = gaussian_point(5, 4, 3, 5, batch=(3,))
    u = gaussian_tangent(x, 5)
    err = q.horizontality_error(x, u)
    assert err.shape == (3,) and bool(((err > 0) & (err <= 1 + 1e-12)).all())
    for c in (1e-6, 1e6):     # scale-free
        scaled = q.horizontality_error(x, tuple(c * a for a in u))
        assert relative_error((scaled,), (err,)) <= 1e-12
    # a vertical basis vector V(E_kl) against itself: error 1 (it is its own worst direction)
    basis = torch.zeros(3, 3, dtype=torch.float64)
    basis[1, 2] = 1.0
    assert torch.allclose(q.horizontality_error(x, q.vertical(x, basis)),
                          torch.ones(3, dtype=torch.float64), atol=1e-12)
    zero = tuple(torch.zeros_like(a) for a in u)
    assert bool((q.horizontality_error(x, zero) == 0).all())
    assert bool(q.is_horizontal(x, q.horizontal_projection(x, u), atol=1e-12).all())


# ====================================================================== group action
@pytest.mark.parametrize("metric", METRICS)
def test_action_preserves_product_and_composes(metric):
    q = GLQuotient(metric)
    x = gaussian_point(5, 4, 3, 8, batch=(2,))
    gen = torch.Generator().manual_seed(8)
    A = q.random_group_element(x, condition=1e3, generator=gen)
    B = q.random_group_element(x, kind="gaussian", generator=gen)
    moved = q.act(x, A)
    assert relative_error((moved[0] @ moved[1].mT,), (x[0] @ x[1].mT,)) <= 1e-11
    assert relative_error(q.act(moved, B), q.act(x, B @ A)) <= 1e-10
    u = gaussian_tangent(x, 8)
    _, pushed = torch.func.jvp(lambda y: q.act(y, A), (x,), (u,))
    assert relative_error(q.act_tangent(x, u, A), pushed) <= 1e-12


@pytest.mark.parametrize("shape", SHAPES)
def test_vertical_is_derivative_of_action(shape):
    q = GLQuotient("inv")
    x = gaussian_point(*shape, 9, batch=(2,))
    h = shape[2]
    X = torch.randn(2, h, h, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    eye = torch.eye(h, dtype=torch.float64)
    zero = torch.zeros((), dtype=torch.float64)
    one = torch.ones((), dtype=torch.float64)
    _, linear = torch.func.jvp(lambda t: q.act(x, eye + t * X), (zero,), (one,))
    _, orbit = torch.func.jvp(lambda t: q.act(x, q.group_exp(t * X)), (zero,), (one,))
    vertical = q.vertical(x, X)
    assert relative_error(vertical, linear) <= 1e-12
    assert relative_error(vertical, orbit) <= 1e-12
    assert relative_error(vertical, (-x[0] @ X, x[1] @ X.mT)) == 0.0
    assert torch.equal(q.group_exp(X), torch.linalg.matrix_exp(X))


def invariance_tolerance(A):
    # forming the Gram matrices of G A^{-1} costs a factor cond(A)^2 of accuracy
    return 64 * EPS64 * float(torch.linalg.cond(A).max()) ** 2


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
@pytest.mark.parametrize("kind, size", [("svd", 1.0), ("svd", 1e2), ("svd", 1e4),
                                        ("gaussian", 1e-2), ("gaussian", 1.0),
                                        ("gaussian", 1e2)])
def test_metric_invariance_and_equivariance(metric, kind, size):
    q = GLQuotient(metric)
    assert q.invariant
    x = gaussian_point(9, 7, 4, 10, batch=(3,))
    u, w = gaussian_tangent(x, 10), gaussian_tangent(x, 11)
    gen = torch.Generator().manual_seed(10)
    if kind == "svd":
        A = q.random_group_element(x, condition=size, generator=gen)
    else:
        A = q.random_group_element(x, kind="gaussian", scale=size, generator=gen)
    bound = invariance_tolerance(A)
    assert bound <= 1e-5
    ax, au, aw = q.act(x, A), q.act_tangent(x, u, A), q.act_tangent(x, w, A)
    scale = q.norm(x, u) * q.norm(x, w)
    assert float(((q.inner(ax, au, aw) - q.inner(x, u, w)).abs() / scale).max()) <= bound

    def moved_error(at_moved, moved):
        diff = tuple(a - b for a, b in zip(at_moved, moved, strict=True))
        return float((q.norm(ax, diff) / (q.norm(ax, au) + q.norm(ax, at_moved))).max())

    # the projections and the connection commute with the isometric action
    assert moved_error(q.horizontal_projection(ax, au),
                       q.act_tangent(x, q.horizontal_projection(x, u), A)) <= bound
    assert moved_error(q.christoffel(ax, au, aw),
                       q.act_tangent(x, q.christoffel(x, u, w), A)) <= bound * 100


def test_euclidean_and_relaxed_metrics_are_not_invariant():
    x = gaussian_point(9, 7, 4, 12, batch=(3,))
    u = gaussian_tangent(x, 12)
    gen = torch.Generator().manual_seed(12)
    for q in (GLQuotient("euclidean"), GLQuotient("inv", eps=0.5), GLQuotient("mix", eps=0.5)):
        assert not q.invariant
        A = q.random_group_element(x, condition=1e2, generator=gen)
        moved = q.inner(q.act(x, A), q.act_tangent(x, u, A), q.act_tangent(x, u, A))
        assert float(((moved - q.inner(x, u, u)).abs() / q.inner(x, u, u)).min()) > 1e-2, q
        # all of them are invariant under orthogonal elements (condition 1)
        O = q.random_group_element(x, condition=1.0, generator=gen)
        moved = q.inner(q.act(x, O), q.act_tangent(x, u, O), q.act_tangent(x, u, O))
        assert relative_error((moved,), (q.inner(x, u, u),)) <= 1e-13


# ====================================================================== batching
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_batched_equals_loop(metric, eps):
    q = GLQuotient(metric, eps)
    x = gaussian_point(5, 4, 3, 13, batch=(2, 3))
    u, w = gaussian_tangent(x, 13), gaussian_tangent(x, 14)
    ops = {
        "inner": lambda y, a, b: (q.inner(y, a, b),),
        "horizontal": lambda y, a, b: q.horizontal_projection(y, a),
        "vertical": lambda y, a, b: q.vertical_projection(y, a),
        "gradient": lambda y, a, b: q.euclidean_to_riemannian_gradient(y, a),
        "christoffel": lambda y, a, b: q.christoffel(y, a, b),
        "horizontality": lambda y, a, b: (q.horizontality_error(y, a),),
    }
    def rounding_bound(i, j):
        # batched and single-matrix LAPACK calls may take different kernels (seen on one Xeon:
        # 1.7e-13 for inv, eps = 0.1, at a point with Gram condition 119), so the two agree to
        # rounding amplified by the conditioning of the solves: 16 eps kappa
        kappa = max(float(torch.linalg.cond(c[i, j].mT @ c[i, j])) for c in x)
        return 16 * EPS64 * kappa

    for name, op in ops.items():
        stacked = op(x, u, w)
        for i in range(2):
            for j in range(3):
                single = op(*(tuple(c[i, j] for c in t) for t in (x, u, w)))
                error = relative_error(tuple(c[i, j] for c in stacked), single)
                assert error <= rounding_bound(i, j), (name, i, j, error)
    # an unbatched point broadcasts against a batch of tangents
    x0 = tuple(c[0, 0] for c in x)
    stacked = q.horizontal_projection(x0, u)
    assert stacked[0].shape == (2, 3, 5, 3)
    single = q.horizontal_projection(x0, tuple(c[1, 2] for c in u))
    assert relative_error(tuple(c[1, 2] for c in stacked), single) <= 1e-13


# ====================================================================== degenerate points
def zero_column(seed):
    G, H = gaussian_point(5, 4, 3, seed)
    G = G.clone()
    G[:, 1] = 0.0
    return G, H


def wide_g(seed):
    return gaussian_point(2, 4, 3, seed)                   # h = 3 > n = 2


def dependent_columns(seed):
    G, H = gaussian_point(5, 4, 3, seed)
    G = G.clone()
    G[:, 2] = 0.5 * G[:, 0] - 2.0 * G[:, 1]
    return G, H


DEGENERATE = {"zero_column": zero_column, "wide": wide_g, "dependent": dependent_columns}


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("case", sorted(DEGENERATE))
def test_relaxed_rank_deficient_point_matches_reference(metric, case):
    q = GLQuotient(metric, eps=1e-2)
    x = DEGENERATE[case](14)
    u, w = gaussian_tangent(x, 14), gaussian_tangent(x, 15)
    pairs = [
        (q.horizontal_projection(x, u), reference.horizontal_projection(q, x, u)),
        (q.euclidean_to_riemannian_gradient(x, u),
         reference.euclidean_to_riemannian_gradient(q, x, u)),
        (q.christoffel(x, u, w), reference.christoffel(q, x, u, w)),
    ]
    for got, expected in pairs:
        assert all(bool(torch.isfinite(c).all()) for c in got)
        assert relative_error(got, expected) <= 1e-10
    assert abs(float(q.horizontality_error(x, u) - reference.horizontality_error(q, x, u))) <= 1e-9


def pinv_projection(q, x, u):
    """Vertical projection by the pseudo-inverse of the dense vertical Gram matrix."""
    basis = reference.vertical_basis(q, x)
    k = basis[0].shape[0]
    gram = torch.stack([torch.stack([q.inner(x, tuple(c[i] for c in basis),
                                             tuple(c[j] for c in basis)) for j in range(k)])
                        for i in range(k)])
    rhs = torch.stack([q.inner(x, tuple(c[i] for c in basis), u) for i in range(k)])
    coeffs = torch.linalg.pinv(gram, hermitian=True) @ rhs
    return tuple(torch.einsum("k,k...->...", coeffs, c) for c in basis)


@pytest.mark.parametrize("metric", METRICS)
def test_doubly_degenerate_orbit_uses_pseudo_inverse(metric):
    # G and H share a zero column: V(E_11) = 0, the vertical vectors are linearly dependent
    G, H = zero_column(16)
    H = H.clone()
    H[:, 1] = 0.0
    x = (G, H)
    q = GLQuotient(metric, eps=1e-2)
    u = gaussian_tangent(x, 16)
    with pytest.raises(ValueError, match="linearly dependent"):
        reference.vertical_projection(q, x, u)
    vertical = q.vertical_projection(x, u)
    horizontal = q.horizontal_projection(x, u)
    assert all(bool(torch.isfinite(c).all()) for c in vertical + horizontal)
    assert relative_error(vertical, pinv_projection(q, x, u)) <= 1e-10
    assert relative_error(q.horizontal_projection(x, horizontal), horizontal) <= 1e-12
    assert float(q.horizontality_error(x, horizontal)) <= 1e-12


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
@pytest.mark.parametrize("case", sorted(DEGENERATE))
def test_rank_deficient_without_eps_raises(metric, case):
    q = GLQuotient(metric)
    x = DEGENERATE[case](17)
    u = gaussian_tangent(x, 17)
    calls = [lambda: q.inner(x, u, u), lambda: q.horizontal_projection(x, u),
             lambda: q.vertical_projection(x, u), lambda: q.christoffel(x, u),
             lambda: q.euclidean_to_riemannian_gradient(x, u),
             lambda: q.horizontality_error(x, u), lambda: q.at(x),
             lambda: q.geodesic(x, u, order=2)]
    for call in calls:
        with pytest.raises(ValueError, match=r"x\[0\] \(G.*rank-deficient.*eps > 0"):
            call()
    # the factor H (second component) is named too
    with pytest.raises(ValueError, match=r"x\[1\] \(H"):
        q.inner((x[1], x[0]), (u[1], u[0]), (u[1], u[0]))


def test_rank_checks_follow_value_checks_switch():
    q = GLQuotient("inv")
    x = zero_column(18)
    u = gaussian_tangent(x, 18)
    with value_checks(False):
        q.horizontal_projection(x, u)     # no host sync, so no value test: no error
        with pytest.raises(ValueError, match="eps > 0"):
            q.inner(wide_g(18), gaussian_tangent(wide_g(18), 0), gaussian_tangent(wide_g(18), 0))
    with pytest.raises(ValueError, match="larger eps"):
        GLQuotient("mix", eps=1e-300).inner(x, u, u)


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
def test_rank_errors_give_the_factor_its_shape_and_the_dtype(metric):
    # the shape test (more columns than rows) and the test on values (a zero column) both say
    # which factor, its n x h and the dtype the check ran in
    q = GLQuotient(metric)
    with pytest.raises(ValueError, match=r"^x\[0\] \(G, 2 x 3\) is rank-deficient .* in "
                                         r"torch\.float64, so G\^T G is singular"):
        q.at(wide_g(30))
    G, H = zero_column(31)
    with pytest.raises(ValueError, match=r"^W\[1\] \(H, 5 x 3\) is rank-deficient .* in "
                                         r"torch\.float64, so H\^T H is singular"):
        q.at((H, G), name="W")
    # a point built directly (not through ``at``) names its factors x[0], x[1]
    with pytest.raises(ValueError, match=r"^x\[0\] \(G, 5 x 3\) is rank-deficient"):
        q.metric.point_type(q, (G, H))


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
def test_square_factors_are_full_rank_at_eps_zero(metric):
    # h = n is the smallest full-rank factor: random_point draws it, and the metric is defined
    q = GLQuotient(metric)
    x = q.random_point(shapes=((3, 3), (4, 3)), generator=torch.Generator().manual_seed(32),
                       dtype=torch.float64)
    u = gaussian_tangent(x, 32)
    expected = reference.horizontal_projection(q, x, u)
    assert relative_error(q.horizontal_projection(x, u), expected) <= 1e-10
    with pytest.raises(ValueError, match=r"^shapes \(\(3, 3\), \(2, 3\)\) give rank-deficient"):
        q.random_point(shapes=((3, 3), (2, 3)))


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
def test_the_rank_test_is_relative_to_each_batch_element(metric):
    # one head 1e-10 times smaller than the other is full rank: its pivots are compared with its
    # own largest Gram entry, not with the batch's; and a batch equals its elements one by one
    G, H = gaussian_point(5, 4, 3, 33, batch=(2,))
    G, H = G.clone(), H.clone()
    G[1], H[1] = 1e-10 * G[1], 1e-10 * H[1]
    u = gaussian_tangent((G, H), 33)
    q = GLQuotient(metric)
    batched = q.horizontal_projection((G, H), u)
    for b in range(2):
        alone = q.horizontal_projection((G[b], H[b]), (u[0][b], u[1][b]))
        assert relative_error((batched[0][b], batched[1][b]), alone) <= 1e-12


@pytest.mark.parametrize("h", [2, 4])
def test_a_pivot_at_rounding_level_of_the_gram_diagonal_is_singular(h):
    # G has orthogonal columns of squared norms 1, ..., 1, t: a Gram pivot t relative to the
    # largest diagonal entry 1. At t = 2 h eps (a few roundings of the diagonal) G^T G is
    # singular to working precision; at t = 64 h eps it is a valid, ill-conditioned point
    eps64 = torch.finfo(torch.float64).eps
    q = GLQuotient("inv")
    H = gaussian_point(5, 4, h, 34)[1]
    for t, singular in ((2 * h * eps64, True), (64 * h * eps64, False)):
        G = torch.zeros(h + 1, h, dtype=torch.float64)
        G[:h, :h] = torch.diag(torch.tensor([1.0] * (h - 1) + [t ** 0.5], dtype=torch.float64))
        if singular:
            with pytest.raises(ValueError, match=r"^x\[0\] \(G, .* singular to working precision"):
                q.at((G, H))
        else:
            q.at((G, H))


def test_euclidean_needs_no_full_rank():
    q = GLQuotient("euclidean")
    x = zero_column(19)
    u = gaussian_tangent(x, 19)
    assert relative_error(q.horizontal_projection(x, u),
                          reference.horizontal_projection(q, x, u)) <= 1e-10


# ====================================================================== argument errors
def test_mismatched_head_dimension_is_named():
    q = GLQuotient("mix")
    x = (torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64))
    u = tuple(torch.randn_like(c) for c in x)
    a = torch.zeros(3, 3, dtype=torch.float64)
    for call in (lambda: q.check_point(x), lambda: q.inner(x, u, u),
                 lambda: q.horizontal_projection(x, u), lambda: q.vertical(x, a),
                 lambda: q.act(x, a), lambda: q.christoffel(x, u)):
        with pytest.raises(ValueError, match="same head dimension h.*h=3 for G and h=2 for H"):
            call()


def test_argument_errors():
    with pytest.raises(ValueError, match="metric must be one of"):
        GLQuotient("frobenius")
    for eps in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps must be"):
            GLQuotient("inv", eps=eps)
    for eps in ("abc", None, True):
        with pytest.raises(TypeError, match="eps must be a number"):
            GLQuotient("inv", eps=eps)
    with pytest.raises(ValueError, match="all of n, m, h"):
        GLQuotient("inv", n=3)
    q = GLQuotient("inv")
    x = gaussian_point(5, 4, 3, 20)
    with pytest.raises(ValueError, match=r"must end in shape \(3, 3\)"):
        q.vertical(x, torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="singular"):
        q.act(x, torch.zeros(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="kind must be one of"):
        q.random_group_element(x, kind="haar")
    with pytest.raises(ValueError, match="condition is only supported"):
        q.random_group_element(x, condition=10.0, kind="gaussian")
    with pytest.raises(ValueError, match="condition must be"):
        q.random_group_element(x, condition=0.5)
    with pytest.raises(ValueError, match="scale must be > 0"):
        q.random_group_element(x, kind="svd", scale=0.0)
    with pytest.raises(ValueError, match="pass shapes"):
        q.random_point()
    with pytest.raises(ValueError, match="eps > 0"):
        q.random_point(shapes=((2, 3), (4, 3)))


def test_the_default_metric_is_inv_and_eps_errors_give_the_type():
    assert GLQuotient().metric.name == "inv" and GLQuotient().eps == 0.0
    with pytest.raises(TypeError, match=r"^eps must be a number >= 0, got str '0\.1'$"):
        GLQuotient("inv", eps="0.1")


def test_head_dimension_errors_name_the_argument_and_both_shapes():
    q = GLQuotient("mix")
    x = gaussian_point(5, 4, 3, 35, batch=(2,))
    bad = (x[0], x[1][..., :2])
    a = torch.zeros(3, 3, dtype=torch.float64)
    both = (r"{}\[0\] \(G, shape \(2, 5, 3\)\) and {}\[1\] \(H, shape \(2, 4, 2\)\) must "
            r"have the same head dimension h \(last dimension\): got h=3 for G and h=2 for H$")
    for call in (lambda: q.check_point(bad), lambda: q.vertical(bad, a), lambda: q.act(bad, a),
                 lambda: q.random_group_element(bad)):
        with pytest.raises(ValueError, match="^" + both.format("x", "x")):
            call()
    for call in (lambda: q.check_point(bad, "W"), lambda: q.frozen_point(bad, "W"),
                 lambda: q.at(bad, "W")):
        with pytest.raises(ValueError, match="^" + both.format("W", "W")):
            call()


def test_algebra_and_group_arguments_are_named():
    q = GLQuotient("inv")
    x = gaussian_point(5, 4, 3, 36)
    u = gaussian_tangent(x, 36)
    for name, call in (("a", lambda g: q.vertical(x, g)), ("g", lambda g: q.act(x, g)),
                       ("g", lambda g: q.act_tangent(x, u, g))):
        with pytest.raises(TypeError, match=rf"^{name} must be a torch\.Tensor, got list$"):
            call([[1.0, 0.0, 0.0]] * 3)
        with pytest.raises(ValueError, match=rf"^{name} must end in shape \(3, 3\) \(h x h for "
                                             r"h=3\), got \(3, 2\)$"):
            call(torch.zeros(3, 2, dtype=torch.float64))
    for call in (lambda: q.act(x, torch.zeros(3, 3, dtype=torch.float64)),
                 lambda: q.act_tangent(x, u, torch.zeros(3, 3, dtype=torch.float64))):
        with pytest.raises(ValueError,
                           match=r"^the group element g is singular \(not in GL\(h\)\)$"):
            call()


def test_random_point_shape_errors_say_what_is_wrong():
    q = GLQuotient("inv", eps=0.1)
    with pytest.raises(ValueError, match=r"^shapes must be \(\(n, h\), \(m, h\)\), got "
                                         r"\(\(5, 3\), \(4, 3\), \(2, 3\)\)$"):
        q.random_point(shapes=((5, 3), (4, 3), (2, 3)))
    with pytest.raises(ValueError, match=r"^shapes must be \(\(n, h\), \(m, h\)\), got "
                                         r"\(\(5, 3\), \(4, 3, 1\)\)$"):
        q.random_point(shapes=((5, 3), (4, 3, 1)))
    with pytest.raises(ValueError, match=r"^shapes must share the head dimension h, got "
                                         r"\(\(5, 3\), \(4, 2\)\)$"):
        q.random_point(shapes=((5, 3), (4, 2)))


def test_only_a_metric_with_factors_has_cholesky_factors():
    x = gaussian_point(5, 4, 3, 37)
    frozen = GLQuotient("euclidean").at(x)
    for attribute in ("cholesky_g", "cholesky_h"):
        with pytest.raises(AttributeError, match=r"^EuclideanPoint has no Cholesky factors "
                                                 r"\(needs_factors is False\)$"):
            getattr(frozen, attribute)
    frozen = GLQuotient("mix").at(x)
    for factor, cholesky in zip(x, (frozen.cholesky_g, frozen.cholesky_h), strict=True):
        assert relative_error((cholesky @ cholesky.mT,), (factor.mT @ factor,)) <= 1e-13


# ====================================================================== Christoffel, gradient
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_christoffel_is_symmetric_bilinear(metric, eps):
    q = GLQuotient(metric, eps)
    x = gaussian_point(5, 4, 3, 21, batch=(2,))
    u, v, w = (gaussian_tangent(x, s) for s in (21, 22, 23))
    assert relative_error(q.christoffel(x, u, v), q.christoffel(x, v, u)) <= 1e-13
    assert relative_error(q.christoffel(x, u, u), q.christoffel(x, u)) <= 1e-13
    combo = tuple(2.0 * a - 3.0 * b for a, b in zip(u, w, strict=True))
    lhs = q.christoffel(x, combo, v)
    rhs = tuple(2.0 * a - 3.0 * b for a, b in zip(q.christoffel(x, u, v), q.christoffel(x, w, v),
                                                  strict=True))
    if metric == "euclidean":
        assert all(bool((c == 0).all()) and c.shape == p.shape for c, p in zip(lhs, x, strict=True))
    else:
        assert relative_error(lhs, rhs) <= 1e-12


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_gradient_represents_differential_on_horizontal_vectors(metric, eps):
    q = GLQuotient(metric, eps)
    x = gaussian_point(6, 5, 3, 24, batch=(2,))
    egrad = gaussian_tangent(x, 24)
    rgrad = q.euclidean_to_riemannian_gradient(x, egrad)
    w = q.horizontal_projection(x, gaussian_tangent(x, 25))
    differential = sum((a * b).sum(dim=(-2, -1)) for a, b in zip(egrad, w, strict=True))
    assert relative_error((q.inner(x, rgrad, w),), (differential,)) <= 1e-11
    assert float(q.horizontality_error(x, rgrad).max()) <= 1e-12


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
def test_raised_gradient_of_invariant_loss_is_horizontal(metric):
    q = GLQuotient(metric)
    x = gaussian_point(6, 5, 3, 26)
    target = torch.randn(6, 5, generator=torch.Generator().manual_seed(26), dtype=torch.float64)
    xg = tuple(c.clone().requires_grad_(True) for c in x)
    loss = torch.sin(xg[0] @ xg[1].mT - target).square().sum()
    egrad = torch.autograd.grad(loss, xg)
    raised = reference.raise_index(q, x, egrad)
    assert float(q.horizontality_error(x, raised)) <= 1e-12
    assert relative_error(q.euclidean_to_riemannian_gradient(x, egrad), raised) <= 1e-11


@pytest.mark.parametrize("metric", METRICS)
def test_closed_forms_are_differentiable(metric):
    q = GLQuotient(metric, eps=0.1 if metric == "mix" else 0.0)
    x = gaussian_point(3, 2, 2, 27)
    u, w = gaussian_tangent(x, 27), gaussian_tangent(x, 28)

    def flat(*tensors):
        return torch.cat([t.reshape(-1) for t in tensors])

    def projection(G, H, a, b):
        return flat(*q.horizontal_projection((G, H), (a, b)))

    def christoffel(G, H, a, b):
        return flat(*q.christoffel((G, H), (a, b), w))

    inputs = tuple(c.clone().requires_grad_(True) for c in x + u)
    assert torch.autograd.gradcheck(projection, inputs)
    assert torch.autograd.gradcheck(christoffel, inputs)


# ====================================================================== geodesics
@pytest.mark.parametrize("metric, eps", [("inv", 0.0), ("mix", 0.0), ("inv", 0.3),
                                         ("mix", 0.3)])
def test_exact_geodesic_converges_and_order2_is_third_order(metric, eps):
    q = GLQuotient(metric, eps)
    x = gaussian_point(4, 3, 2, 29)
    v = tuple(0.5 * c for c in q.random_tangent(x, generator=torch.Generator().manual_seed(29)))
    fine = q.geodesic(x, v, order="exact", steps=128)
    errors = [relative_error(q.geodesic(x, v, order="exact", steps=s), fine) for s in (16, 32)]
    assert errors[1] <= 1e-8
    assert 8.0 <= errors[0] / errors[1] <= 32.0         # RK4: error ~ steps^-4
    ts = torch.logspace(-2.5, -1, 6, dtype=torch.float64)
    for order, expected in ((1, 2.0), (2, 3.0)):
        errs = []
        for t in ts:
            vt = tuple(float(t) * c for c in v)
            exact = q.geodesic(x, vt, order="exact", steps=32)
            errs.append(max(float((a - b).abs().max())
                            for a, b in zip(q.geodesic(x, vt, order=order), exact, strict=True)))
        slope = reference.taylor_slope(ts, torch.tensor(errs))
        assert abs(slope - expected) <= 0.2, (order, slope)


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
def test_horizontal_geodesic_stays_horizontal_and_descends(metric):
    q = GLQuotient(metric)
    x = gaussian_point(4, 3, 2, 30)
    v = tuple(0.5 * c for c in q.random_tangent(x, generator=torch.Generator().manual_seed(30)))
    end, velocity = reference.geodesic_ode(x, v, 1.0, q.point_ndims, q.christoffel, steps=64,
                                           return_velocity=True)
    assert float(q.horizontality_error(end, velocity)) <= 1e-9
    # the geodesic from an equivalent start is the moved geodesic: same network G H^T
    A = q.random_group_element(x, condition=10.0, generator=torch.Generator().manual_seed(31))
    moved_end = q.geodesic(q.act(x, A), q.act_tangent(x, v, A), order="exact")
    direct_end = q.geodesic(x, v, order="exact")
    assert relative_error((moved_end[0] @ moved_end[1].mT,),
                          (direct_end[0] @ direct_end[1].mT,)) <= 1e-10


def test_euclidean_geodesic_is_a_straight_line():
    q = GLQuotient("euclidean")
    x = gaussian_point(4, 3, 2, 32)
    v = gaussian_tangent(x, 32)
    line = q.geodesic(x, v, order=1)
    for order in (2, "exact"):
        assert relative_error(q.geodesic(x, v, order=order, steps=4), line) <= 1e-15


# ====================================================================== sampling and caching
@pytest.mark.parametrize("h", [1, 2, 4])
def test_random_group_elements(h):
    q = GLQuotient("inv")
    x = gaussian_point(6, 5, h, 33, batch=(3,))
    gen = torch.Generator().manual_seed(33)
    for condition in (1.0, 10.0, 1e4):
        A = q.random_group_element(x, condition=condition, scale=2.0, generator=gen)
        assert A.shape == (3, h, h) and A.dtype == torch.float64
        singular = torch.linalg.svdvals(A)
        expected_condition = condition if h > 1 else 1.0
        assert torch.allclose(singular[..., 0] / singular[..., -1],
                              torch.full((3,), expected_condition, dtype=torch.float64),
                              rtol=1e-10)
        geometric_mean = singular.log().mean(-1).exp()
        assert torch.allclose(geometric_mean, torch.full((3,), 2.0, dtype=torch.float64),
                              rtol=1e-12)
    state = gen.get_state()
    N = torch.randn(3, h, h, generator=gen, dtype=torch.float64)
    gen.set_state(state)
    assert torch.equal(q.random_group_element(x, kind="gaussian", scale=0.01, generator=gen),
                       0.01 * N)
    E = q.random_group_element(x, generator=gen)     # matrix_exp: identity component
    assert bool((torch.linalg.det(E) > 0).all())


def test_random_point_and_check_shapes():
    q = GLQuotient("mix", n=5, m=4, h=3)
    x = q.random_point((2,), generator=torch.Generator().manual_seed(34), dtype=torch.float32)
    assert x[0].shape == (2, 5, 3) and x[1].shape == (2, 4, 3) and x[0].dtype == torch.float32
    q.at(x)                                             # full rank
    wide = GLQuotient("inv", eps=0.1).random_point(shapes=((2, 3), (4, 3)))
    assert wide[0].shape == (2, 3)
    assert GLQuotient.check_shapes == ((5, 3), (4, 3))
    assert "metric='mix'" in repr(q) and q.name == "gl-mix"


@pytest.mark.parametrize("metric", METRICS)
def test_frozen_point_gives_identical_results(metric):
    """The quotient's methods are the frozen point's: the same formula, bit for bit."""
    q = GLQuotient(metric, eps=0.1)
    x = gaussian_point(5, 4, 3, 35, batch=(2,))
    u, w = gaussian_tangent(x, 35), gaussian_tangent(x, 36)
    frozen = q.at(x)
    assert torch.equal(frozen.gram_g, x[0].mT @ x[0])
    pairs = (("inner", (q.inner(x, u, w),), (frozen.inner(u, w),)),
             ("horizontal", q.horizontal_projection(x, u), frozen.horizontal_projection(u)),
             ("vertical", q.vertical_projection(x, u), frozen.vertical_projection(u)),
             ("gradient", q.euclidean_to_riemannian_gradient(x, u),
              frozen.riemannian_gradient(u)),
             ("christoffel", q.christoffel(x, u, w), frozen.christoffel(u, w)),
             ("horizontality", (q.horizontality_error(x, u),), (frozen.horizontality_error(u),)),
             ("geodesic", q.geodesic(x, u, order=2), frozen.geodesic(u, order=2)))
    for name, direct, cached in pairs:
        assert all(torch.equal(a, b) for a, b in zip(direct, cached, strict=True)), name


# ====================================================================== check tools
@pytest.mark.parametrize("metric", METRICS)
def test_check_all_passes(metric):
    results = check_all(GLQuotient(metric), seed=0, dtype=torch.float64)
    names = {r.name for r in results}
    assert ("metric_invariance" in names) == (metric != "euclidean")
    failed = [r for r in results if not r.passed]
    assert not failed, failed


def test_check_all_passes_in_float32_with_eps():
    results = check_all(GLQuotient("inv", eps=0.1, n=6, m=5, h=3), seed=1, dtype=torch.float32)
    failed = [r for r in results if not r.passed]
    assert not failed, failed


# ====================================================================== CUDA
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(metric, eps, dtype):
    q = GLQuotient(metric, eps)
    x = gaussian_point(9, 7, 4, 37, dtype, batch=(12, 8))
    u, w = gaussian_tangent(x, 37), gaussian_tangent(x, 38)
    on_gpu = [cast_to(t, "cuda") for t in (x, u, w)]
    ops = (lambda y, a, b: (q.inner(y, a, b),), lambda y, a, b: q.horizontal_projection(y, a),
           lambda y, a, b: q.euclidean_to_riemannian_gradient(y, a),
           lambda y, a, b: q.christoffel(y, a, b),
           lambda y, a, b: (q.horizontality_error(y, a),))
    for op in ops:
        cpu = op(x, u, w)
        gpu = op(*on_gpu)
        assert all(c.device.type == "cuda" for c in gpu)
        assert relative_error(cast_to(gpu, "cpu"), cpu) <= tol(dtype) * 10
    gen = torch.Generator(device="cuda").manual_seed(0)
    A = q.random_group_element(on_gpu[0], condition=1e2, generator=gen)
    assert A.device.type == "cuda"
    moved = q.act(on_gpu[0], A)
    assert relative_error((moved[0] @ moved[1].mT,),
                          (on_gpu[0][0] @ on_gpu[0][1].mT,)) <= tol(dtype) * 1e3


def cast_to(tensors, device):
    return tuple(t.to(device) for t in tensors)



@pytest.mark.parametrize("quotient", [GLQuotient("inv"), GLQuotient("mix"),
                                      GLQuotient("euclidean"), GLQuotient("mix", eps=1e-3),
                                      GLQuotient("inv", eps=1e-3),
                                      qs.RotaryQuotient("inv", head_dim=4, rotary_dims=2),
                                      qs.RotaryQuotient("mix", head_dim=4, rotary_dims=2)],
                         ids=repr)
def test_after_factorise_the_ascent_operations_factorise_nothing(quotient, monkeypatch):
    # On CUDA an eigendecomposition or a checked Cholesky factorisation waits for the device.
    # factorise() does them before the ascent loop (the GPU test in tests/test_sharpness.py
    # checks that the loop never waits); here: none is left for the loop, values unchanged.
    shapes = ((6, 4), (5, 4))
    x = quotient.random_point((2,), shapes=shapes, generator=torch.Generator().manual_seed(0),
                              dtype=torch.float64)
    u = tuple(torch.randn(t.shape, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(1)) for t in x)
    lazy, eager = quotient.frozen_point(x), quotient.frozen_point(x)
    eager.factorise()
    calls: list[str] = []
    for name in ("eigh", "cholesky", "eigvalsh", "inv", "solve"):
        original = getattr(torch.linalg, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch.linalg, name, counted)
    operations = ("horizontal_projection", "riemannian_gradient", "vertical_projection")
    factorised = {m: getattr(eager, m)(u) for m in operations}
    assert calls == [], f"the operations after factorise() still call torch.linalg.{calls}"
    for method in operations:
        for a, b in zip(factorised[method], getattr(lazy, method)(u), strict=True):
            assert torch.equal(a, b)


def test_a_product_factorises_every_factor(monkeypatch):
    # the engine's point at theta is a product: its factorise() must reach each GL factor
    gl = GLQuotient("inv")
    product = qs.ProductQuotient([gl, qs.DiagonalQuotient("mix"), GLQuotient("euclidean")])
    generator = torch.Generator().manual_seed(2)
    parts = [gl.random_point((), shapes=((6, 3), (5, 3)), generator=generator,
                             dtype=torch.float64),
             qs.DiagonalQuotient("mix").random_point((), shapes=((4,), (4,)),
                                                     generator=generator, dtype=torch.float64),
             GLQuotient("euclidean").random_point((), shapes=((5, 2), (4, 2)),
                                                  generator=generator, dtype=torch.float64)]
    x = tuple(t for part in parts for t in part)
    u = tuple(torch.randn(t.shape, dtype=torch.float64, generator=generator) for t in x)
    frozen = product.frozen_point(x)
    frozen.factorise()
    calls: list[str] = []
    original = torch.linalg.eigh

    def counted(*args, **kwargs):
        calls.append("eigh")
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "eigh", counted)
    frozen.horizontal_projection(u)
    frozen.riemannian_gradient(u)
    assert calls == []
    monkeypatch.setattr(torch.linalg, "eigh", original)
    lazy = product.frozen_point(x)
    monkeypatch.setattr(torch.linalg, "eigh", counted)
    lazy.horizontal_projection(u)
    assert len(calls) == 4, "inv and euclidean each eigendecompose two Gram matrices on use"


# ---------------------------------------------------------------------------- fused order 2
def _order_two_case(quotient, dtype, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = quotient.point_shapes or getattr(quotient, "check_shapes", None) or ((7, 3), (5, 3))
    x = quotient.random_point(batch, shapes=shapes, generator=gen, dtype=torch.float64)
    u = tuple(0.3 * torch.randn(c.shape, generator=gen, dtype=torch.float64) for c in x)
    pull = tuple(torch.randn(c.shape, generator=gen, dtype=torch.float64) for c in x)
    return (tuple(c.to(dtype) for c in x), tuple(c.to(dtype) for c in u),
            tuple(c.to(dtype) for c in pull))


ORDER_TWO_QUOTIENTS = {
    "mix": lambda: GLQuotient("mix"), "inv": lambda: GLQuotient("inv"),
    "mix-eps": lambda: GLQuotient("mix", eps=0.3), "inv-eps": lambda: GLQuotient("inv", eps=0.3),
    "rotary-mix": lambda: qs.RotaryQuotient("mix", head_dim=4),
    "rotary-inv-partial": lambda: qs.RotaryQuotient("inv", head_dim=6, rotary_dims=4),
}


@pytest.mark.parametrize("name", sorted(ORDER_TWO_QUOTIENTS))
@pytest.mark.parametrize("t", [1.0, 0.4, -1.3])
@pytest.mark.parametrize("batch", [(), (2, 3)])
def test_fused_order_two_point_and_backward_against_the_reference(name, t, batch):
    # OrderTwoGLPath against x + t u - t^2/2 Gamma(u, u) with Gamma from the autograd
    # reference (no closed form), and its backward against autograd through that formula
    quotient = ORDER_TWO_QUOTIENTS[name]()
    x, u, pull = _order_two_case(quotient, torch.float64, batch, seed=5)
    leaves = tuple(c.clone().requires_grad_(True) for c in u)
    fused = quotient.at(x).geodesic(leaves, t, 2)
    gamma = reference.christoffel(quotient, x, leaves)
    plain = tuple(a + t * b - 0.5 * t * t * c for a, b, c in zip(x, leaves, gamma, strict=True))
    assert relative_error(tuple(f.detach() for f in fused),
                          tuple(p.detach() for p in plain)) < 1e-12
    got = torch.autograd.grad(fused, leaves, pull)
    want = torch.autograd.grad(plain, leaves, pull)
    assert relative_error(got, want) < 1e-11


@pytest.mark.parametrize("metric", ["mix", "inv"])
@pytest.mark.parametrize("t", [1.0, 0.7])
def test_fused_order_two_point_passes_gradcheck(metric, t):
    from quotientsharp.core.gl.point import OrderTwoGLPath

    quotient = GLQuotient(metric, eps=0.1)
    x, u, _ = _order_two_case(quotient, torch.float64, (2,), seed=6)
    frozen = quotient.at(x)
    leaves = tuple(c.clone().requires_grad_(True) for c in u)
    assert torch.autograd.gradcheck(lambda a, b: OrderTwoGLPath.apply(t, frozen, a, b), leaves)


@pytest.mark.parametrize("metric", ["mix", "inv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_order_two_point_at_zero_velocity_is_the_base_point(metric, dtype):
    # the base is carried exactly (F + u C + F D with u = 0 and D = 0), and so is its
    # gradient: the pullback at u = 0 is the covector itself
    quotient = GLQuotient(metric)
    x, _, pull = _order_two_case(quotient, dtype, (3,), seed=7)
    zero = tuple(torch.zeros_like(c, requires_grad=True) for c in x)
    point = quotient.at(x).geodesic(zero, 1.0, 2)
    assert all(torch.equal(p, c) for p, c in zip(point, x, strict=True))
    pulled = torch.autograd.grad(point, zero, pull)
    assert all(torch.equal(g, c) for g, c in zip(pulled, pull, strict=True))


@pytest.mark.parametrize("metric", ["mix", "inv"])
def test_fused_order_two_point_in_float32_is_within_rounding_of_float64(metric):
    quotient = GLQuotient(metric)
    x, u, pull = _order_two_case(quotient, torch.float64, (4,), seed=8)
    values = []
    for dtype in (torch.float32, torch.float64):
        leaves = tuple(c.to(dtype).requires_grad_(True) for c in u)
        point = quotient.at(tuple(c.to(dtype) for c in x)).geodesic(leaves, 1.0, 2)
        grads = torch.autograd.grad(point, leaves, tuple(c.to(dtype) for c in pull))
        values.append(tuple(v.detach().double() for v in (*point, *grads)))
    assert relative_error(values[0], values[1]) < 1e-5


@pytest.mark.parametrize("metric", ["mix", "inv"])
def test_order_two_point_under_torch_func_transforms_takes_the_elementary_form(metric):
    # torch.func cannot see through the fused function's own backward: under grad and vmap
    # the point is the elementary form, with the same values and gradient
    quotient = GLQuotient(metric)
    x, u, pull = _order_two_case(quotient, torch.float64, (3,), seed=9)
    frozen = quotient.at(x)

    def loss(a, b):
        return sum((p * c).sum() for p, c in zip(frozen.geodesic((a, b), 1.0, 2), pull,
                                                  strict=True))

    transformed = torch.func.grad(loss, argnums=(0, 1))(*u)
    leaves = tuple(c.clone().requires_grad_(True) for c in u)
    plain = torch.autograd.grad(loss(*leaves), leaves)
    assert relative_error(transformed, plain) < 1e-12
    per_problem = torch.func.vmap(lambda a, b: loss(a, b))(*(c.unsqueeze(0) for c in u))
    assert torch.allclose(per_problem[0], loss(*u))


@pytest.mark.parametrize("metric", ["mix", "inv"])
def test_the_order_two_point_of_a_gl_pair_takes_the_fused_path_with_the_documented_defaults(
        metric):
    # the dispatch: an order-2 point of a pair with velocities of the factors' shapes is the
    # fused function (its backward node says so); the defaults are t = 1 and order 2, and the
    # exact geodesic's default is 64 RK4 steps
    quotient = GLQuotient(metric)
    x, u, _ = _order_two_case(quotient, torch.float64, (2,), seed=10)
    frozen = quotient.at(x)
    leaves = tuple(c.clone().requires_grad_(True) for c in u)
    point = frozen.geodesic(leaves, 1.0, 2)
    assert all(type(p.grad_fn).__name__ == "OrderTwoGLPathBackward" for p in point)
    assert all(torch.equal(a, b) for a, b in zip(frozen.geodesic(leaves), point, strict=True))
    small = tuple(0.1 * c for c in u)
    assert all(torch.equal(a, b) for a, b in zip(frozen.geodesic(small, 1.0, "exact"),
                                                 frozen.geodesic(small, 1.0, "exact", 64),
                                                 strict=True))
    # a velocity that is not of the factors' shapes (a batch of problems) takes the elementary
    # form, with the same values
    stacked = tuple(torch.stack([c, c]) for c in u)
    both = frozen.geodesic(stacked, 1.0, 2)
    assert relative_error(tuple(b[0] for b in both), tuple(p.detach() for p in point)) < 1e-12


@pytest.mark.parametrize("bad", ["nan", "rank"])
def test_the_frozen_point_errors_name_the_point_given_to_at(bad) -> None:
    # GLQuotient.at(x, name): both the point check and the frozen point's own rank check
    # name the caller's point, not the default "x"
    gen = torch.Generator().manual_seed(0)
    G = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    H = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    if bad == "nan":
        G[0, 0] = float("nan")
    else:
        G[:, 1] = G[:, 0]                     # linearly dependent columns: G^T G singular
    with pytest.raises(ValueError, match=r"theta\[0\]"):
        qs.GLQuotient("mix").at((G, H), "theta")


# ====================================================================== raise roots
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_raise_roots_are_square_roots_of_the_raise_operators(metric, eps, dtype, seed):
    if metric == "euclidean" and eps:
        pytest.skip("the Euclidean metric has no damping")
    x = gaussian_point(7, 5, 4, seed, dtype, batch=(3,))
    point = GLQuotient(metric, eps=eps).at(x)
    # the reference in float64 from raise_index of the identity, the metric's own formula
    exact = GLQuotient(metric, eps=eps).at(cast(x, torch.float64))
    eye = torch.eye(4, dtype=torch.float64).expand(3, 4, 4)
    for root, operator in zip(point.raise_roots(), exact.raise_index((eye, eye)), strict=True):
        assert root.dtype == torch.float64              # the working dtype of every point
        assert relative_error((root @ root.mT,), (operator,)) < 1e-12 * (
            1.0 if dtype == torch.float64 else 1e6)


@pytest.mark.parametrize("condition", [1e4, 1e6])
@pytest.mark.parametrize("seed", range(3))
def test_mix_raise_roots_give_orthonormal_bases_at_ill_conditioned_factors(condition, seed):
    # under mix at eps = 0, H C_G and G C_H are orthonormal bases of the factors' column
    # spaces; from the QR factors they are so to rounding, where a Cholesky factor of the formed
    # inverse Gram matrix is off by about eps * condition^2 (here eps * condition)
    gen = torch.Generator().manual_seed(seed)
    G, H = (torch.linalg.qr(torch.randn(9, 4, generator=gen, dtype=torch.float64)).Q
            @ torch.diag(torch.logspace(0, -math.log10(condition), 4, dtype=torch.float64))
            @ torch.linalg.qr(torch.randn(4, 4, generator=gen, dtype=torch.float64)).Q
            for _ in range(2))
    root_g, root_h = GLQuotient("mix").at((G, H)).raise_roots()
    eye = torch.eye(4, dtype=torch.float64)
    for basis in (H @ root_g, G @ root_h):
        assert float((basis.mT @ basis - eye).abs().max()) < 1e-14 * condition
