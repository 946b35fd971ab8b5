"""Tests of quotientsharp.core.symbolic against textbook geometry and against torch autograd."""

from __future__ import annotations

import random

import pytest

sympy = pytest.importorskip("sympy")
torch = pytest.importorskip("torch")

from quotientsharp.core import symbolic as S  # noqa: E402

x, y = sympy.symbols("x y", real=True)
r, theta = sympy.symbols("r theta", positive=True)
t = sympy.Symbol("t", real=True)


def zero(expr: sympy.Expr) -> bool:
    return sympy.simplify(expr) == 0


# ---------------------------------------------------------------------- Christoffel symbols
def test_poincare_half_plane_christoffels() -> None:
    ypos = sympy.Symbol("y", positive=True)
    gamma = S.christoffel_symbols(sympy.diag(1 / ypos**2, 1 / ypos**2), [x, ypos])
    expected = {(0, 0, 1): -1 / ypos, (0, 1, 0): -1 / ypos, (1, 0, 0): 1 / ypos,
                (1, 1, 1): -1 / ypos}
    for k in range(2):
        for i in range(2):
            for j in range(2):
                assert zero(gamma[k][i][j] - expected.get((k, i, j), 0)), (k, i, j)


def test_flat_metric_in_polar_coordinates() -> None:
    gamma = S.christoffel_symbols(sympy.diag(1, r**2), [r, theta])
    expected = {(0, 1, 1): -r, (1, 0, 1): 1 / r, (1, 1, 0): 1 / r}
    for k in range(2):
        for i in range(2):
            for j in range(2):
                assert zero(gamma[k][i][j] - expected.get((k, i, j), 0)), (k, i, j)


def test_round_sphere_christoffels() -> None:
    phi = sympy.Symbol("phi", real=True)
    gamma = S.christoffel_symbols(sympy.diag(1, sympy.sin(theta)**2), [theta, phi])
    assert zero(gamma[0][1][1] + sympy.sin(theta) * sympy.cos(theta))
    assert zero(gamma[1][0][1] - sympy.cos(theta) / sympy.sin(theta))
    assert gamma[0][0][0] == 0 and gamma[1][1][1] == 0 and gamma[0][0][1] == 0


@pytest.fixture
def coupled_metric() -> tuple[sympy.Matrix, list[sympy.Symbol]]:
    """A non-diagonal metric: the induced metric of the graph of ``f = x^2 y / 2 + y^3 / 3``."""
    f = x**2 * y / 2 + y**3 / 3
    fx, fy = sympy.diff(f, x), sympy.diff(f, y)
    return sympy.Matrix([[1 + fx**2, fx * fy], [fx * fy, 1 + fy**2]]), [x, y]


def test_koszul_is_the_levi_civita_connection(coupled_metric) -> None:
    # torsion-free (symmetric) and metric-compatible: d_k g_ij = Gamma^l_ki g_lj + Gamma^l_kj g_il
    g, coords = coupled_metric
    gamma = S.christoffel_symbols(g, coords)
    n = len(coords)
    for k in range(n):
        for i in range(n):
            for j in range(n):
                assert zero(gamma[k][i][j] - gamma[k][j][i])
                compat = sympy.diff(g[i, j], coords[k]) - sum(
                    gamma[l][k][i] * g[l, j] + gamma[l][k][j] * g[i, l] for l in range(n))
                assert zero(compat), (k, i, j)


@pytest.mark.parametrize("seed", range(3))
def test_symbols_at_a_point_are_exact(coupled_metric, seed: int) -> None:
    g, coords = coupled_metric
    symbolic = S.christoffel_symbols(g, coords)
    point = S.random_rationals(coords, random.Random(seed))
    exact = S.christoffel_symbols_at(g, coords, point)
    for k in range(2):
        for i in range(2):
            for j in range(2):
                assert exact[k][i][j].is_Rational
                assert S.evaluate_exact(symbolic[k][i][j], point) == exact[k][i][j]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_contraction_matches_autograd_reference(coupled_metric, seed: int,
                                                dtype: torch.dtype) -> None:
    # independent: Gamma(v, v) = g^{-1} [D(g v)[v] - 1/2 grad <v, v>] by torch autograd
    g, coords = coupled_metric
    a, b = sympy.symbols("a b", real=True)
    symbolic = S.christoffel_contraction(g, coords, [a, b])
    rng = random.Random(seed)
    point, vel = [S.random_rational(rng) for _ in range(2)], [S.random_rational(rng)
                                                              for _ in range(2)]
    exact = S.evaluate_exact(symbolic, dict(zip([x, y, a, b], point + vel, strict=True)))

    def metric(px: torch.Tensor, py: torch.Tensor) -> torch.Tensor:
        # the fixture's metric written in torch: f_x = x y, f_y = x^2 / 2 + y^2
        fx, fy = px * py, px**2 / 2 + py**2
        return torch.stack([torch.stack([1 + fx**2, fx * fy]),
                            torch.stack([fx * fy, 1 + fy**2])])
    p = torch.tensor([float(c) for c in point], dtype=dtype)
    w = torch.tensor([float(c) for c in vel], dtype=dtype)
    gv = torch.func.jvp(lambda q: metric(q[0], q[1]) @ w, (p,), (w,))[1]
    dquad = torch.func.grad(lambda q: w @ metric(q[0], q[1]) @ w)(p)
    got = torch.linalg.solve(metric(p[0], p[1]), gv - 0.5 * dquad)
    want = torch.tensor([float(c) for c in exact], dtype=dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()))


def test_contraction_is_symmetric_bilinear(coupled_metric) -> None:
    g, coords = coupled_metric
    u = sympy.symbols("u0 u1", real=True)
    v = sympy.symbols("v0 v1", real=True)
    uv = S.christoffel_contraction(g, coords, u, v)
    vu = S.christoffel_contraction(g, coords, v, u)
    plus = S.christoffel_contraction(g, coords, [u[0] + v[0], u[1] + v[1]])
    minus = S.christoffel_contraction(g, coords, [u[0] - v[0], u[1] - v[1]])
    point = S.random_rationals([x, y, *u, *v], random.Random(0))
    assert S.is_exactly_zero(S.evaluate_exact(uv - vu, point))
    assert S.is_exactly_zero(S.evaluate_exact(uv - (plus - minus) / 4, point))


def test_diffgeom_pitfall_is_avoided() -> None:
    # the Poincare metric has nonzero symbols: a zero answer would be the diffgeom bug
    gamma = S.christoffel_symbols(sympy.diag(1 / y**2, 1 / y**2), [x, y])
    assert any(e != 0 for block in gamma for row in block for e in row)


# ---------------------------------------------------------------------- geodesics
def test_geodesic_residual_of_half_plane_geodesics() -> None:
    g = sympy.diag(1 / y**2, 1 / y**2)
    gamma = S.christoffel_symbols(g, [x, y])
    for path in ([sympy.tanh(t), 1 / sympy.cosh(t)], [sympy.Integer(3), sympy.exp(2 * t)]):
        residual = S.geodesic_residual(g, [x, y], path, t, gamma=gamma)
        assert all(zero(e.rewrite(sympy.exp)) for e in residual), path
    # a Euclidean straight line is not a hyperbolic geodesic
    residual = S.geodesic_residual(g, [x, y], [t, sympy.Integer(1)], t, gamma=gamma)
    assert not all(zero(e) for e in residual)


def test_geodesic_residual_of_a_line_in_polar_coordinates() -> None:
    # the line (1, t) in polar coordinates
    path = [sympy.sqrt(1 + t**2), sympy.atan(t)]
    residual = S.geodesic_residual(sympy.diag(1, r**2), [r, theta], path, t,
                                   simplify=sympy.simplify)
    assert residual.is_zero_matrix
    wrong = [sympy.sqrt(1 + t**2), 2 * sympy.atan(t)]
    residual = S.geodesic_residual(sympy.diag(1, r**2), [r, theta], wrong, t,
                                   simplify=sympy.simplify)
    assert not residual.is_zero_matrix


def test_geodesic_residual_rejects_wrong_length() -> None:
    with pytest.raises(ValueError, match="path"):
        S.geodesic_residual(sympy.eye(2), [x, y], [t], t)


# ---------------------------------------------------------------------- horizontal space
def test_horizontal_projection_euclidean_plane() -> None:
    projector = S.horizontal_projection_matrix(sympy.eye(2), [[1, 1]])
    assert projector == sympy.Matrix([[1, -1], [-1, 1]]) / 2


@pytest.mark.parametrize("seed", range(3))
def test_horizontal_projection_properties(seed: int) -> None:
    rng = random.Random(seed)
    factor = S.random_invertible_rational_matrix(4, rng)
    g = factor.T * factor  # SPD
    generators = [list(S.random_rational_matrix(4, 1, rng)) for _ in range(2)]
    projector = S.horizontal_projection_matrix(g, generators, simplify=None)
    basis = S.vertical_matrix(generators)
    vector = S.random_rational_matrix(4, 1, rng)
    assert projector * projector == projector
    assert (projector * basis).is_zero_matrix
    assert S.is_exactly_zero(S.metric_products(g, generators, projector * vector))
    # g-self-adjoint: g P = P^T g
    assert g * projector == projector.T * g
    vertical = S.vertical_projection_matrix(g, generators, simplify=None)
    assert vertical + projector == sympy.eye(4)


def test_dependent_generators_raise() -> None:
    with pytest.raises(ValueError, match="linearly dependent"):
        S.horizontal_projection_matrix(sympy.eye(2), [[1, 1], [2, 2]])


def test_pullback_metric_invariance() -> None:
    a = sympy.Symbol("a", positive=True)
    u, v = sympy.symbols("u v", positive=True)
    g = sympy.diag(1 / u**2, 1 / v**2)
    pulled = S.pullback_metric(g, [u, v], [a * u, v / a])
    assert (pulled - g).applyfunc(sympy.simplify).is_zero_matrix
    euclid = S.pullback_metric(sympy.eye(2), [u, v], [a * u, v / a])
    assert not (euclid - sympy.eye(2)).applyfunc(sympy.simplify).is_zero_matrix


def test_metric_from_bilinear_and_flat_order() -> None:
    G = S.symbol_matrix("G", 2, 2)
    e, z = S.symbol_matrix("e", 2, 2), S.symbol_matrix("z", 2, 2)
    form = (G.T * G * e.T * z).trace()
    g = S.metric_from_bilinear(form, S.flat(e), S.flat(z))
    assert g.shape == (4, 4)
    assert S.flat(G) == [G[0, 0], G[0, 1], G[1, 0], G[1, 1]]
    assert S.unflat(S.flat(G, e), [(2, 2), (2, 2)]) == [G, e]
    with pytest.raises(ValueError, match="shapes"):
        S.unflat(S.flat(G), [(2, 3)])


def test_metric_checks() -> None:
    with pytest.raises(ValueError, match="metric must be 2 x 2"):
        S.christoffel_symbols(sympy.eye(3), [x, y])
    with pytest.raises(ValueError, match="symmetric"):
        S.christoffel_symbols(sympy.Matrix([[1, x], [0, 1]]), [x, y])
    with pytest.raises(ValueError, match="singular"):
        S.christoffel_symbols_at(sympy.diag(x, 1), [x, y], {x: 0, y: 1})


# ---------------------------------------------------------------------- exact helpers
def test_random_rationals_are_bounded_nonzero_rationals() -> None:
    rng = random.Random(0)
    values = [S.random_rational(rng, bound=2, max_denominator=5) for _ in range(200)]
    assert all(v.is_Rational and v != 0 and abs(v) <= 2 and v.q <= 5 for v in values)
    assert len(set(values)) > 20
    m = S.random_invertible_rational_matrix(3, rng)
    assert m.det() != 0


def test_evaluate_exact_refuses_leftover_symbols() -> None:
    assert S.evaluate_exact(x * y + 1, {x: sympy.Rational(1, 3), y: 3}) == 2
    with pytest.raises(ValueError, match="y"):
        S.evaluate_exact(x * y, {x: 1})


def test_is_exactly_zero_refuses_inexact_values() -> None:
    assert S.is_exactly_zero(sympy.zeros(2, 2))
    assert not S.is_exactly_zero([sympy.Integer(0), sympy.Rational(1, 10**30)])
    with pytest.raises(ValueError, match="rational"):
        S.is_exactly_zero(sympy.Float(0.0) + sympy.sqrt(2))
    with pytest.raises(ValueError, match="rational"):
        S.is_exactly_zero(sympy.Float(1e-300))
    with pytest.raises(ValueError, match="numbers"):
        S.is_exactly_zero(x)


def test_to_tensor() -> None:
    m = sympy.Matrix([[sympy.Rational(1, 3), 2]])
    out = S.to_tensor(m)
    assert out.dtype == torch.float64 and out.shape == (1, 2)
    assert out[0, 0].item() == 1 / 3
