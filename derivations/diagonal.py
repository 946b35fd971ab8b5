"""Derive the closed forms of the diagonal-network quotient from the metric alone, and check them.

Run ``python derivations/diagonal.py``: exit status 0 when every check passes, 1 (with the
failing rows marked) otherwise. Importable: :func:`main` returns the exit status.

For both metrics of the GL(1)^d quotient (``inv``: ``diag(1/u^2, 1/v^2)``, ``mix``:
``diag(v^2, u^2)`` per coordinate pair) the script starts from the metric matrix of one pair
``(u, v)`` and derives with sympy: the Christoffel symbols (Koszul formula), the vertical
direction and the invariance of the metric, the horizontal projection, the Riemannian
gradient, and the geodesic equation, which the package's closed-form geodesics must solve for
any initial velocity. Each derived object is compared twice: symbolically with a transcription
of the formula the package uses (and of the closed form as published), and numerically with the
package code itself (``quotientsharp.DiagonalQuotient``) in float64 at exact rational points, so
a typo in the package is caught. The d = 2 product metric is checked to have no cross terms.
"""

from __future__ import annotations

import random
import sys
import time
import traceback
from collections.abc import Callable, Sequence

import sympy
import torch

from quotientsharp import DiagonalQuotient
from quotientsharp.core import symbolic as S

#: relative tolerance of the float64 package code against the exact value
TOLERANCE = 1e-12
#: exact rational points per numeric comparison
POINTS = 4


# ---------------------------------------------------------------------- reporting
class Report:
    """Rows of (section, check, method, verdict, detail); a failing or crashing check is kept."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, bool, str]] = []

    def run(self, section: str, what: str, method: str,
            check: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = check()
        except Exception as err:  # a crash in the package is a failed check, not a lost table
            ok, detail = False, f"raised {type(err).__name__}: {err}"
            traceback.print_exc(limit=3)
        self.rows.append((section, what, method, bool(ok), detail))

    @property
    def failures(self) -> list[tuple[str, str, str, bool, str]]:
        return [r for r in self.rows if not r[3]]

    def table(self) -> str:
        head = ("section", "check", "method", "ok", "detail")
        widths = [max(len(head[i]), *(len(str(r[i])) for r in self.rows)) for i in (0, 1, 2)]
        lines = [f"{head[0]:<{widths[0]}}  {head[1]:<{widths[1]}}  {head[2]:<{widths[2]}}  "
                 f"ok    {head[4]}"]
        lines.append("-" * len(lines[0]))
        for section, what, method, ok, detail in self.rows:
            lines.append(f"{section:<{widths[0]}}  {what:<{widths[1]}}  {method:<{widths[2]}}  "
                         f"{'yes ' if ok else 'FAIL'}  {detail}")
        return "\n".join(lines)


def symbolic_zero(exprs: Sequence[sympy.Expr] | sympy.MatrixBase) -> tuple[bool, str]:
    """Every entry cancels to exactly 0 (rational functions: ``cancel`` decides)."""
    left = [e for e in (sympy.cancel(sympy.together(e)) for e in exprs) if e != 0]
    return (not left), ("cancels to 0" if not left else f"left over: {left[0]}")


relative_error = S.package_relative_error


def numeric_agreement(errors: list[float]) -> tuple[bool, str]:
    worst = max(errors)
    return worst <= TOLERANCE, f"max rel err {worst:.1e} over {len(errors)} rational points"


def tensors(values: Sequence[sympy.Expr], d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened ``(u_1..u_d, v_1..v_d)`` values as the package's ``(u, v)`` float64 tuple."""
    numbers = torch.tensor([float(e) for e in values], dtype=torch.float64)
    return numbers[:d], numbers[d:]


# ---------------------------------------------------------------------- the geometry
u, v = sympy.symbols("u v", real=True, nonzero=True)
COORDS = [u, v]
eta_u, eta_v, nu_u, nu_v = sympy.symbols("eta_u eta_v nu_u nu_v", real=True)
ETA, NU = [eta_u, eta_v], [nu_u, nu_v]
t, alpha, beta, a = sympy.symbols("t alpha beta a", real=True)


def bilinear_form(metric: str, point: Sequence[sympy.Expr], first: Sequence[sympy.Expr],
                  second: Sequence[sympy.Expr]) -> sympy.Expr:
    """The metric, summed over the coordinate pairs ``point = (u_1..u_d, v_1..v_d)``.

    inv: ``eta_u nu_u / u^2 + eta_v nu_v / v^2``; mix: ``eta_u nu_u v^2 + eta_v nu_v u^2``.
    """
    d = len(point) // 2
    total = sympy.S.Zero
    for i in range(d):
        pu, pv = point[i], point[d + i]
        fu, fv, su, sv = first[i], first[d + i], second[i], second[d + i]
        if metric == "inv":
            total += fu * su / pu**2 + fv * sv / pv**2
        else:
            total += fu * su * pv**2 + fv * sv * pu**2
    return total


def package_christoffel(metric: str, xi: Sequence[sympy.Expr], nu: Sequence[sympy.Expr]
                        ) -> list[sympy.Expr]:
    """Transcription of ``DiagonalQuotient.christoffel`` (bilinear)."""
    if metric == "inv":
        return [-xi[0] * nu[0] / u, -xi[1] * nu[1] / v]
    cross = xi[0] * nu[1] + nu[0] * xi[1]
    return [cross / v - u * xi[1] * nu[1] / v**2, cross / u - v * xi[0] * nu[0] / u**2]


def spec_christoffel(metric: str, xi: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """The published quadratic ``Gamma(xi, xi)``.

    inv: ``(-xi_u^2 / u, -xi_v^2 / v)``; mix: ``(2 xi_u xi_v / v - u xi_v^2 / v^2,
    2 xi_u xi_v / u - v xi_u^2 / u^2)``.
    """
    if metric == "inv":
        return [-xi[0]**2 / u, -xi[1]**2 / v]
    return [2 * xi[0] * xi[1] / v - u * xi[1]**2 / v**2,
            2 * xi[0] * xi[1] / u - v * xi[0]**2 / u**2]


def package_projection(eta: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Transcription of ``DiagonalQuotient.horizontal_projection``, ``b = (eta_u/u + eta_v/v)/2``.
    """
    b = (eta[0] / u + eta[1] / v) / 2
    return [b * u, b * v]


def package_vertical_projection(eta: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    c = (eta[0] / u - eta[1] / v) / 2
    return [c * u, -c * v]


def package_gradient(metric: str, egrad: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """Transcription of ``DiagonalQuotient.euclidean_to_riemannian_gradient``."""
    raised = ([egrad[0] * u**2, egrad[1] * v**2] if metric == "inv"
              else [egrad[0] / v**2, egrad[1] / u**2])
    return package_projection(raised)


def package_geodesic(metric: str, start: Sequence[sympy.Expr], rates: Sequence[sympy.Expr],
                     time_: sympy.Expr) -> list[sympy.Expr]:
    """Transcription of ``DiagonalQuotient.geodesic_exact`` with ``rates = (xi_u/u, xi_v/v)``."""
    if metric == "inv":
        return [start[0] * sympy.exp(rates[0] * time_), start[1] * sympy.exp(rates[1] * time_)]
    real = 1 + time_ * (rates[0] + rates[1])
    imag = time_ * (rates[0] - rates[1])
    radius = sympy.sqrt(real**2 + imag**2)
    angle = sympy.atan2(imag, real)
    return [start[0] * sympy.sqrt(radius) * sympy.exp(angle / 2),
            start[1] * sympy.sqrt(radius) * sympy.exp(-angle / 2)]


def random_start(rng: random.Random, d: int = 1) -> list[sympy.Rational]:
    return [S.random_rational(rng) for _ in range(2 * d)]


def check_metric(report: Report, name: str, rng: random.Random) -> None:
    section = f"{name} d=1"
    g = S.metric_from_bilinear(bilinear_form(name, COORDS, ETA, NU), ETA, NU)
    quotient = DiagonalQuotient(name)

    # --- the metric matrix against the package's inner product
    def metric_vs_package() -> tuple[bool, str]:
        errors = []
        for _ in range(POINTS):
            point = random_start(rng)
            g_at = S.evaluate_exact(g, dict(zip(COORDS, point, strict=True)))
            x = tensors(point, 1)
            basis = [tensors([1, 0], 1), tensors([0, 1], 1)]
            got = [quotient.inner(x, basis[k], basis[l]).reshape(1)
                   for k in range(2) for l in range(2)]
            errors.append(relative_error(got, list(g_at)))
        return numeric_agreement(errors)

    report.run(section, "metric matrix = inner(e_k, e_l)", "numeric vs package", metric_vs_package)

    # --- Christoffel symbols from the metric alone
    gamma = S.christoffel_symbols(g, COORDS)
    derived = S.contract(gamma, ETA, NU)
    report.run(section, "Koszul Gamma(xi,nu) = package formula", "symbolic",
               lambda: symbolic_zero([derived[k] - package_christoffel(name, ETA, NU)[k]
                                      for k in range(2)]))
    derived_quadratic = S.contract(gamma, ETA)
    report.run(section, "Koszul Gamma(xi,xi) = closed form", "symbolic",
               lambda: symbolic_zero([derived_quadratic[k] - spec_christoffel(name, ETA)[k]
                                      for k in range(2)]))

    def christoffel_vs_package() -> tuple[bool, str]:
        errors = []
        for _ in range(POINTS):
            point, xi, nu = random_start(rng), random_start(rng), random_start(rng)
            values = dict(zip(COORDS + ETA + NU, point + xi + nu, strict=True))
            exact_bilinear = list(S.evaluate_exact(derived, values))
            exact_quadratic = list(S.evaluate_exact(derived_quadratic, values))
            x = tensors(point, 1)
            errors.append(relative_error(quotient.christoffel(x, tensors(xi, 1), tensors(nu, 1)),
                                         exact_bilinear))
            errors.append(relative_error(quotient.christoffel(x, tensors(xi, 1)),
                                         exact_quadratic))
        return numeric_agreement(errors)

    report.run(section, "Koszul Gamma = package christoffel (u,v / u,u)", "numeric vs package",
               christoffel_vs_package)

    # --- the vertical direction and the invariance of the metric
    action = [a * u, v / a]
    generator = [sympy.diff(c, a).subs(a, 1) for c in action]
    report.run(section, "d/da (a u, v/a) at a=1 = (u, -v)", "symbolic",
               lambda: symbolic_zero([generator[0] - u, generator[1] + v]))
    pulled = S.pullback_metric(g, COORDS, action)
    report.run(section, "metric invariant: J^T g(a u, v/a) J = g", "symbolic",
               lambda: symbolic_zero(list(pulled - g)))

    def vertical_vs_package() -> tuple[bool, str]:
        errors = []
        for _ in range(POINTS):
            point, scale = random_start(rng), S.random_rational(rng)
            x = tensors(point, 1)
            rate = torch.tensor([float(scale)], dtype=torch.float64)
            errors.append(relative_error(quotient.vertical(x, rate),
                                         [scale * point[0], -scale * point[1]]))
            errors.append(relative_error(quotient.act(x, rate),
                                         [scale * point[0], point[1] / scale]))
        return numeric_agreement(errors)

    report.run(section, "vertical(x, a), act(x, a) = derived", "numeric vs package",
               vertical_vs_package)

    # --- horizontal space and projection
    vertical = [u, -v]
    products = S.metric_products(g, [vertical], ETA)[0]
    solved = sympy.solve(products, eta_v)
    report.run(section, "<eta, V> = 0  <=>  eta_u/u = eta_v/v", "symbolic solve",
               lambda: (len(solved) == 1 and sympy.cancel(solved[0] - eta_u * v / u) == 0,
                        f"eta_v = {solved}"))
    projector = S.horizontal_projection_matrix(g, [vertical])
    projected = projector * sympy.Matrix(ETA)
    report.run(section, "projection matrix P eta = package formula", "symbolic",
               lambda: symbolic_zero(list(projected - sympy.Matrix(package_projection(ETA)))))
    vertical_part = sympy.Matrix(ETA) - projected
    report.run(section, "(I - P) eta = package vertical_projection", "symbolic",
               lambda: symbolic_zero(list(vertical_part
                                          - sympy.Matrix(package_vertical_projection(ETA)))))
    report.run(section, "P^2 = P, P V = 0, <P eta, V> = 0", "symbolic",
               lambda: symbolic_zero(list(projector * projector - projector)
                                     + list(projector * sympy.Matrix(vertical))
                                     + [S.metric_products(g, [vertical], projected)[0]]))
    b = sympy.Symbol("b", real=True)
    horizontal = [b * u, b * v]
    norm_spec = 2 * b**2 if name == "inv" else 2 * (u * v * b)**2
    norm_derived = (sympy.Matrix(horizontal).T * g * sympy.Matrix(horizontal))[0]
    report.run(section, "||(b u, b v)||^2 = closed-form norm", "symbolic",
               lambda: symbolic_zero([norm_derived - norm_spec]))

    def projection_vs_package() -> tuple[bool, str]:
        errors = []
        for _ in range(POINTS):
            point, eta = random_start(rng), random_start(rng)
            values = dict(zip(COORDS + ETA, point + eta, strict=True))
            x, e = tensors(point, 1), tensors(eta, 1)
            errors.append(relative_error(quotient.horizontal_projection(x, e),
                                         list(S.evaluate_exact(projected, values))))
            errors.append(relative_error(quotient.vertical_projection(x, e),
                                         list(S.evaluate_exact(vertical_part, values))))
        return numeric_agreement(errors)

    report.run(section, "P eta, (I-P) eta = package projections", "numeric vs package",
               projection_vs_package)

    # --- Riemannian gradient: raise with g^{-1}, project
    egrad = sympy.symbols("g_u g_v", real=True)
    raised = projector * g.inv() * sympy.Matrix(egrad)
    report.run(section, "P g^{-1} egrad = package gradient", "symbolic",
               lambda: symbolic_zero(list(raised - sympy.Matrix(package_gradient(name, egrad)))))
    loss = sympy.Function("f")
    invariant_egrad = sympy.Matrix([sympy.diff(loss(u * v), u), sympy.diff(loss(u * v), v)])
    invariant_raised = g.inv() * invariant_egrad
    report.run(section, "f(u v): g^{-1} egrad already horizontal", "symbolic",
               lambda: symbolic_zero([S.metric_products(g, [vertical], invariant_raised)[0]]))

    def gradient_vs_package() -> tuple[bool, str]:
        errors = []
        for _ in range(POINTS):
            point, grad = random_start(rng), random_start(rng)
            values = dict(zip(COORDS + list(egrad), point + grad, strict=True))
            got = quotient.euclidean_to_riemannian_gradient(tensors(point, 1), tensors(grad, 1))
            errors.append(relative_error(got, list(S.evaluate_exact(raised, values))))
        return numeric_agreement(errors)

    report.run(section, "P g^{-1} egrad = package gradient", "numeric vs package",
               gradient_vs_package)

    check_geodesics(report, name, g, gamma, quotient, rng)


def check_geodesics(report: Report, name: str, g: sympy.Matrix, gamma: S.Gamma,
                    quotient: DiagonalQuotient, rng: random.Random) -> None:
    section = f"{name} d=1"
    u0, v0 = sympy.symbols("u0 v0", real=True, nonzero=True)
    path = package_geodesic(name, [u0, v0], [alpha, beta], t)
    residual = S.geodesic_residual(g, COORDS, path, t, gamma=gamma)

    def residual_vanishes() -> tuple[bool, str]:
        # residual / x(t) is rational in t: the exp(phi/2) and sqrt(r) factors divide out
        left = []
        for k in range(2):
            ratio = sympy.powsimp(sympy.expand(residual[k] / path[k]), combine="exp")
            ratio = sympy.cancel(sympy.together(ratio))
            if ratio != 0:
                left.append(ratio)
        return (not left), ("x'' + Gamma(x',x') = 0 for all alpha, beta, t" if not left
                            else f"residual / x = {left[0]}")

    report.run(section, "exact geodesic, general velocity", "symbolic residual",
               residual_vanishes)

    velocity = [sympy.diff(p, t) for p in path]
    at_zero = [sympy.simplify(c.subs(t, 0)) for c in path + velocity]
    report.run(section, "x(0) = (u0, v0), x'(0) = (alpha u0, beta v0)", "symbolic",
               lambda: symbolic_zero([at_zero[0] - u0, at_zero[1] - v0,
                                      at_zero[2] - alpha * u0, at_zero[3] - beta * v0]))

    def horizontal_special_case() -> tuple[bool, str]:
        # alpha = beta = b: the horizontal geodesics (inv: (u, v) e^{b t}, mix:
        # (u, v) sqrt(1 + 2 b t)) and beta(t) = u v along them (inv: beta_0 e^{2 b t}, mix:
        # beta_0 (1 + 2 b t))
        diffs = []
        for _ in range(POINTS):
            b_value, t_value = S.random_rational(rng), S.random_rational(rng)
            while 1 + 2 * b_value * t_value <= 0:
                t_value = S.random_rational(rng)
            start = random_start(rng)
            x_t = package_geodesic(name, start, [b_value, b_value], t_value)
            factor = (sympy.exp(b_value * t_value) if name == "inv"
                      else sympy.sqrt(1 + 2 * b_value * t_value))
            product = (start[0] * start[1]
                       * (sympy.exp(2 * b_value * t_value) if name == "inv"
                          else 1 + 2 * b_value * t_value))
            diffs += [sympy.simplify(x_t[0] - start[0] * factor),
                      sympy.simplify(x_t[1] - start[1] * factor),
                      sympy.simplify(x_t[0] * x_t[1] - product)]
        left = [e for e in diffs if e != 0]
        return (not left), ("matches the closed forms exactly at rational (b, t)" if not left
                            else f"left over: {left[0]}")

    report.run(section, "horizontal: closed-form x(t), beta(t) = u v", "exact rational",
               horizontal_special_case)

    def geodesic_vs_package() -> tuple[bool, str]:
        errors = []
        for _ in range(POINTS):
            start = random_start(rng)
            rates = [S.random_rational(rng), S.random_rational(rng)]
            t_value = S.random_rational(rng, bound=1)
            while rates[0] == rates[1] and 1 + 2 * rates[0] * t_value <= 0:
                t_value = S.random_rational(rng, bound=1)
            exact = [sympy.N(c, 30) for c in package_geodesic(name, start, rates, t_value)]
            xi = [rates[0] * start[0], rates[1] * start[1]]
            got = quotient.geodesic_exact(tensors(start, 1), tensors(xi, 1), t=float(t_value))
            errors.append(relative_error(got, exact))
        return numeric_agreement(errors)

    report.run(section, "closed form = package geodesic_exact", "numeric vs package",
               geodesic_vs_package)


def check_product(report: Report, name: str, rng: random.Random) -> None:
    """d = 2: the metric is the product of two pairs, so Gamma has no cross terms."""
    section = f"{name} d=2"
    coords = list(sympy.symbols("u_1 u_2 v_1 v_2", real=True, nonzero=True))
    first = list(sympy.symbols("e_1:5", real=True))
    second = list(sympy.symbols("n_1:5", real=True))
    g = S.metric_from_bilinear(bilinear_form(name, coords, first, second), first, second)
    gamma = S.christoffel_symbols(g, coords)
    pair = [0, 1, 0, 1]  # coordinate pair of each flattened index (u_1, u_2, v_1, v_2)

    def no_cross_terms() -> tuple[bool, str]:
        cross = [(k, i, j) for k in range(4) for i in range(4) for j in range(4)
                 if len({pair[k], pair[i], pair[j]}) > 1 and gamma[k][i][j] != 0]
        return (not cross), ("Gamma^k_ij = 0 unless k, i, j in one pair" if not cross
                             else f"nonzero cross symbol Gamma^{cross[0]}")

    report.run(section, "no cross terms between pairs", "symbolic", no_cross_terms)

    def pair_equals_d1() -> tuple[bool, str]:
        g1 = S.metric_from_bilinear(bilinear_form(name, COORDS, ETA, NU), ETA, NU)
        gamma1 = S.christoffel_symbols(g1, COORDS)
        diffs = []
        for p in range(2):
            idx = [p, 2 + p]
            rename = {u: coords[p], v: coords[2 + p]}
            diffs += [gamma[idx[k]][idx[i]][idx[j]] - gamma1[k][i][j].xreplace(rename)
                      for k in range(2) for i in range(2) for j in range(2)]
        return symbolic_zero(diffs)

    report.run(section, "each pair's block = d=1 symbols", "symbolic", pair_equals_d1)

    quotient = DiagonalQuotient(name)
    generators = [[coords[0], 0, -coords[2], 0], [0, coords[1], 0, -coords[3]]]

    def product_vs_package() -> tuple[bool, str]:
        errors = []
        for _ in range(POINTS):
            point, xi, nu = random_start(rng, 2), random_start(rng, 2), random_start(rng, 2)
            values = dict(zip(coords, point, strict=True))
            gamma_at = [[[S.evaluate_exact(e, values) for e in row] for row in block]
                        for block in gamma]
            x = tensors(point, 2)
            errors.append(relative_error(quotient.christoffel(x, tensors(xi, 2), tensors(nu, 2)),
                                         list(S.contract(gamma_at, xi, nu))))
            projector = S.horizontal_projection_matrix(S.evaluate_exact(g, values),
                                                       [[S.evaluate_exact(c, values) for c in gen]
                                                        for gen in generators])
            errors.append(relative_error(quotient.horizontal_projection(x, tensors(xi, 2)),
                                         list(projector * sympy.Matrix(xi))))
        return numeric_agreement(errors)

    report.run(section, "Gamma(xi,nu), projection = package", "numeric vs package",
               product_vs_package)


def main() -> int:
    """Run every derivation check, print the table; 0 when all pass, 1 otherwise."""
    start = time.perf_counter()
    rng = random.Random(20250507)
    report = Report()
    for name in ("inv", "mix"):
        check_metric(report, name, rng)
        check_product(report, name, rng)
    print(report.table())
    elapsed = time.perf_counter() - start
    failures = report.failures
    if failures:
        print(f"\n{len(failures)} of {len(report.rows)} checks FAILED ({elapsed:.1f} s):",
              file=sys.stderr)
        for section, what, method, _, detail in failures:
            print(f"  [{section}] {what} ({method}): {detail}", file=sys.stderr)
        return 1
    print(f"\nall {len(report.rows)} checks passed ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
