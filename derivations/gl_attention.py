"""Check the GL(h) attention-pair formulas (``docs/attention.md``) exactly, from the metric alone.

Run ``python derivations/gl_attention.py``: exit status 0 when every check passes, 1 (with the
failing rows listed) otherwise. Importable: :func:`main` returns the exit status.

For factor pairs ``(G, H)``, ``G`` in ``R^{n x h}``, ``H`` in ``R^{m x h}``, and each metric
(``inv``, ``mix``, ``euclidean``), the script builds the metric matrix over the flattened
coordinates of ``(G, H)`` from the trace formula with sympy and then, in exact rational
arithmetic at random rational points (no floating point, no ``simplify``):

- derives every Christoffel symbol ``Gamma^k_ij`` by the Koszul formula and compares it with
  the matrix formulas ``Gamma_G``, ``Gamma_H`` (zero for euclidean), component by component;
- checks the invariance of ``inv`` and ``mix`` under ``(G A^{-1}, H A^T)`` for a random
  rational invertible ``A`` (and, as a control, that euclidean is not invariant);
- checks that the vertical vectors ``(-G X, H X^T)`` are the derivative of the action, and that
  the horizontal conditions (mix; the corrected inv erratum) cut out exactly the metric-orthogonal
  complement of all of them;
- checks that the mix closed-form ``L`` and the inv / euclidean Sylvester equations (solved
  exactly) give the metric-orthogonal projection;
- checks the metric-raised Riemannian gradients.

Then it compares the package code ``quotientsharp.GLQuotient`` (``inner``, ``christoffel``,
``horizontal_projection``, and the gradient where present) in float64 at the same points to
``1e-10`` relative. Without ``quotientsharp.core.gl`` those rows are reported as skipped.
"""

from __future__ import annotations

import functools
import random
import sys
import time
import traceback
from collections.abc import Callable, Sequence

import sympy
import torch

from quotientsharp.core import symbolic as S

#: (n, m, h) shapes checked
CASES = ((2, 2, 1), (3, 2, 2), (2, 3, 2))
METRICS = ("inv", "mix", "euclidean")
#: rational points per (shape, metric) for the component-wise Christoffel comparison
POINTS = 2
#: relative tolerance of the float64 package code against the exact value
TOLERANCE = 1e-10

SKIP = "skip"


# ---------------------------------------------------------------------- reporting
class Report:
    """Rows of (section, check, method, verdict, detail); verdict True, False or ``"skip"``."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, bool | str, str]] = []

    def run(self, section: str, what: str, method: str,
            check: Callable[[], tuple[bool | str, str]]) -> None:
        try:
            ok, detail = check()
        except Exception as err:  # a crash in the package is a failed check, not a lost table
            ok, detail = False, f"raised {type(err).__name__}: {err}"
            traceback.print_exc(limit=3)
        self.rows.append((section, what, method, ok if ok == SKIP else bool(ok), detail))

    @property
    def failures(self) -> list[tuple[str, str, str, bool | str, str]]:
        return [r for r in self.rows if r[3] is False]

    @property
    def skipped(self) -> list[tuple[str, str, str, bool | str, str]]:
        return [r for r in self.rows if r[3] == SKIP]

    def table(self) -> str:
        head = ("section", "check", "method", "ok", "detail")
        widths = [max(len(head[i]), *(len(str(r[i])) for r in self.rows)) for i in (0, 1, 2)]
        lines = [f"{head[0]:<{widths[0]}}  {head[1]:<{widths[1]}}  {head[2]:<{widths[2]}}  "
                 f"ok    {head[4]}"]
        lines.append("-" * len(lines[0]))
        verdicts = {True: "yes ", False: "FAIL", SKIP: "skip"}
        for section, what, method, ok, detail in self.rows:
            lines.append(f"{section:<{widths[0]}}  {what:<{widths[1]}}  {method:<{widths[2]}}  "
                         f"{verdicts[ok]}  {detail}")
        return "\n".join(lines)


def exact_zero(value: object, what: str = "difference") -> tuple[bool, str]:
    ok = S.is_exactly_zero(value)
    return ok, ("exactly 0" if ok else f"{what} nonzero, max |.| = {S.max_abs(value)}")


relative_error = S.package_relative_error


def numeric_agreement(errors: list[float]) -> tuple[bool, str]:
    worst = max(errors)
    return worst <= TOLERANCE, f"max rel err {worst:.1e} over {len(errors)} comparisons"


# ---------------------------------------------------------------------- the closed forms
def gram_weights(metric: str, G: sympy.Matrix, H: sympy.Matrix
                 ) -> tuple[sympy.Matrix, sympy.Matrix]:
    """``(M_G, M_H)`` of ``<eta, zeta> = Tr(M_G eta_G^T zeta_G) + Tr(M_H eta_H^T zeta_H)``."""
    h = G.shape[1]
    if metric == "euclidean":
        return sympy.eye(h), sympy.eye(h)
    gram_g, gram_h = G.T * G, H.T * H
    if metric == "mix":
        return gram_h, gram_g
    # adjugate / det: an explicit rational function, no elimination with symbolic pivots
    return gram_g.adjugate() / gram_g.det(), gram_h.adjugate() / gram_h.det()


def spec_christoffel(metric: str, G: sympy.Matrix, H: sympy.Matrix, XG: sympy.Matrix,
                     XH: sympy.Matrix) -> tuple[sympy.Matrix, sympy.Matrix]:
    """The closed-form ``(Gamma_G, Gamma_H)(xi, xi)``, as sympy matrix expressions.

    inv (``G`` and ``H`` decouple):
    ``Gamma_G = -xi_G (G^T G)^{-1} (xi_G^T G + G^T xi_G) + G (G^T G)^{-1} xi_G^T xi_G``, ``H``
    likewise; mix (coupled): ``Gamma_G = xi_G (xi_H^T H + H^T xi_H) (H^T H)^{-1}
    - G (xi_H^T xi_H) (H^T H)^{-1}``, ``Gamma_H`` with ``G`` and ``H`` swapped; euclidean: 0.
    """
    if metric == "euclidean":
        return sympy.zeros(*G.shape), sympy.zeros(*H.shape)
    inv_g, inv_h = (G.T * G).inv(), (H.T * H).inv()
    if metric == "inv":
        gamma_g = -XG * inv_g * (XG.T * G + G.T * XG) + G * inv_g * XG.T * XG
        gamma_h = -XH * inv_h * (XH.T * H + H.T * XH) + H * inv_h * XH.T * XH
        return gamma_g, gamma_h
    gamma_g = XG * (XH.T * H + H.T * XH) * inv_h - G * (XH.T * XH) * inv_h
    gamma_h = XH * (XG.T * G + G.T * XG) * inv_g - H * (XG.T * XG) * inv_g
    return gamma_g, gamma_h


def horizontal_condition(metric: str, G: sympy.Matrix, H: sympy.Matrix, XG: sympy.Matrix,
                         XH: sympy.Matrix) -> sympy.Matrix:
    """The ``h x h`` matrix that vanishes exactly on horizontal ``(xi_G, xi_H)``.

    mix: ``G^T xi_G H^T H - G^T G xi_H^T H``; inv, corrected from the paper:
    ``xi_G^T G H^T H - G^T G H^T xi_H``; euclidean is ``xi_G^T G - H^T xi_H``,
    what ``<xi, (-G X, H X^T)> = Tr((H^T xi_H - xi_G^T G) X)`` gives for the identity weights.
    """
    gram_g, gram_h = G.T * G, H.T * H
    if metric == "mix":
        return G.T * XG * gram_h - gram_g * XH.T * H
    if metric == "inv":
        return XG.T * G * gram_h - gram_g * H.T * XH
    return XG.T * G - H.T * XH


def solve_exactly(unknowns: sympy.Matrix, equations: sympy.Matrix) -> sympy.Matrix:
    """The unique solution of a linear matrix equation ``equations(unknowns) = 0``."""
    symbols = list(unknowns)
    solutions = sympy.linsolve(list(equations), symbols)
    if len(solutions) != 1:
        raise ValueError("the linear system has no solution")
    (solution,) = solutions
    if any(e.free_symbols & set(symbols) for e in solution):
        raise ValueError("the linear system has no unique solution")
    return sympy.Matrix(unknowns.shape[0], unknowns.shape[1], list(solution))


def spec_projection_shift(metric: str, G: sympy.Matrix, H: sympy.Matrix, XG: sympy.Matrix,
                          XH: sympy.Matrix) -> sympy.Matrix:
    """``L`` of the horizontal projection ``(xi_G + G L, xi_H - H L^T)``.

    mix: ``L = 1/2 [xi_H^T H (H^T H)^{-1} - (G^T G)^{-1} G^T xi_G]``; inv (corrected from the
    paper): ``A L^T + L^T A = B`` with ``A = G^T G H^T H``, ``B = G^T G H^T xi_H - xi_G^T G H^T H``;
    euclidean: ``G^T G L + L H^T H = xi_H^T H - G^T xi_G``.
    """
    h = G.shape[1]
    gram_g, gram_h = G.T * G, H.T * H
    if metric == "mix":
        return (XH.T * H * gram_h.inv() - gram_g.inv() * G.T * XG) / 2
    unknown = S.symbol_matrix("L", h, h)
    if metric == "inv":
        coefficient = gram_g * gram_h
        rhs = gram_g * H.T * XH - XG.T * G * gram_h
        # A L^T + L^T A = B, solved for L^T
        transposed = solve_exactly(unknown, coefficient * unknown + unknown * coefficient - rhs)
        return transposed.T
    return solve_exactly(unknown, gram_g * unknown + unknown * gram_h - (XH.T * H - G.T * XG))


def spec_gradient(metric: str, G: sympy.Matrix, H: sympy.Matrix, DG: sympy.Matrix,
                  DH: sympy.Matrix) -> tuple[sympy.Matrix, sympy.Matrix]:
    """The metric-raised gradient (euclidean: the gradient itself).

    inv: ``(dL/dG G^T G, dL/dH H^T H)``; mix: ``(dL/dG (H^T H)^{-1}, dL/dH (G^T G)^{-1})``.
    """
    if metric == "euclidean":
        return DG, DH
    if metric == "inv":
        return DG * (G.T * G), DH * (H.T * H)
    return DG * (H.T * H).inv(), DH * (G.T * G).inv()


# ---------------------------------------------------------------------- the checks
class Shape:
    """Symbols and the three metric matrices for one ``(n, m, h)``."""

    def __init__(self, n: int, m: int, h: int, metrics: Sequence[str] = METRICS) -> None:
        self.n, self.m, self.h = n, m, h
        self.G, self.H = S.symbol_matrix("G", n, h), S.symbol_matrix("H", m, h)
        self.coords = S.flat(self.G, self.H)
        self.shapes = [(n, h), (m, h)]
        first = [S.symbol_matrix("eta_G", n, h), S.symbol_matrix("eta_H", m, h)]
        second = [S.symbol_matrix("zeta_G", n, h), S.symbol_matrix("zeta_H", m, h)]
        # differentiate the trace form with placeholder weights, substitute the Grams after:
        # the second derivatives stay polynomial and cheap
        weight_g, weight_h = S.symbol_matrix("M_G", h, h), S.symbol_matrix("M_H", h, h)
        form = ((weight_g * first[0].T * second[0]).trace()
                + (weight_h * first[1].T * second[1]).trace())
        template = S.metric_from_bilinear(form, S.flat(*first), S.flat(*second))
        self.metrics: dict[str, sympy.Matrix] = {}
        self.derivatives: dict[str, list[sympy.Matrix]] = {}
        for metric in metrics:
            if metric not in METRICS:
                raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
            m_g, m_h = gram_weights(metric, self.G, self.H)
            weights = dict(zip(S.flat(weight_g, weight_h), S.flat(m_g, m_h), strict=True))
            self.metrics[metric] = template.xreplace(weights)
            self.derivatives[metric] = S.metric_derivatives(self.metrics[metric], self.coords)

    @property
    def name(self) -> str:
        return f"n={self.n} m={self.m} h={self.h}"

    def random_point(self, rng: random.Random) -> dict[sympy.Symbol, sympy.Rational]:
        """Random rational ``(G, H)`` of full rank ``h``."""
        while True:
            values = S.random_rationals(self.coords, rng)
            G, H = self.at(values)
            if (G.T * G).det() != 0 and (H.T * H).det() != 0:
                return values

    def at(self, values: dict[sympy.Symbol, sympy.Rational]) -> tuple[sympy.Matrix, sympy.Matrix]:
        return S.evaluate_exact(self.G, values), S.evaluate_exact(self.H, values)

    def random_tangent(self, rng: random.Random) -> tuple[sympy.Matrix, sympy.Matrix]:
        return (S.random_rational_matrix(self.n, self.h, rng, nonzero=False),
                S.random_rational_matrix(self.m, self.h, rng, nonzero=False))

    def vertical_generators(self, G: sympy.Matrix, H: sympy.Matrix) -> list[list[sympy.Expr]]:
        """``(-G E_ab, H E_ab^T)`` for the ``h^2`` basis matrices ``E_ab``, flattened."""
        generators = []
        for a in range(self.h):
            for b in range(self.h):
                unit = sympy.zeros(self.h, self.h)
                unit[a, b] = 1
                generators.append(S.flat(-G * unit, H * unit.T))
        return generators


def to_torch(matrices: Sequence[sympy.Matrix]) -> tuple[torch.Tensor, ...]:
    return tuple(S.to_tensor(m, torch.float64) for m in matrices)


def load_package() -> type | None:
    try:
        from quotientsharp.core.gl import GLQuotient
    except ImportError:
        return None
    return GLQuotient


class MetricCase:
    """One metric at one ``(n, m, h)``, shared by the checks of :data:`METRIC_CHECKS`.

    ``points``: :data:`POINTS` random rational ``(G, H)``; ``gammas``: the Christoffel symbols
    ``Gamma^k_ij`` of the metric at each, by the Koszul formula; ``tangents``: a pair
    ``((xi_G, xi_H), (nu_G, nu_H))`` of random rational tangent vectors at each. The checks that
    draw more (random ``A``, gradients) draw from ``rng`` in the order of the table.
    """

    def __init__(self, shape: Shape, metric: str, rng: random.Random) -> None:
        self.shape, self.metric, self.rng = shape, metric, rng
        self.section = f"{metric} {shape.name}"
        self.g = shape.metrics[metric]
        self.points = [shape.random_point(rng) for _ in range(POINTS)]
        self.gammas = [S.christoffel_symbols_at(self.g, shape.coords, p,
                                                shape.derivatives[metric])
                       for p in self.points]
        self.tangents = [(shape.random_tangent(rng), shape.random_tangent(rng))
                         for _ in self.points]

    def xi_symbols(self) -> list[sympy.Matrix]:
        """A symbolic tangent ``(xi_G, xi_H)``, of shapes ``(n, h)`` and ``(m, h)``."""
        shape = self.shape
        return [S.symbol_matrix("xi_G", shape.n, shape.h),
                S.symbol_matrix("xi_H", shape.m, shape.h)]


def quadratic_coefficients(quadratic: sympy.Expr, variables: Sequence[sympy.Symbol]
                           ) -> list[list[sympy.Expr]]:
    """The symmetric ``C`` (``len(variables)`` square) with ``quadratic = sum_ij C_ij v_i v_j``.

    The coefficient of ``v_i v_j`` is ``C_ii`` on the diagonal and ``2 C_ij`` off it. Raises
    ``ValueError`` (its message the exponents) at a term that is not of degree 2.
    """
    size = len(variables)
    coefficients = [[sympy.S.Zero] * size for _ in range(size)]
    for powers, coefficient in sympy.Poly(quadratic, *variables).terms():
        if coefficient == 0:
            continue
        used = [i for i, p in enumerate(powers) for _ in range(p)]
        if len(used) != 2:
            raise ValueError(f"{powers}")
        i, j = used
        coefficients[i][j] = coefficients[j][i] = coefficient if i == j else coefficient / 2
    return coefficients


def christoffel_components(case: MetricCase) -> tuple[bool, str]:
    """Each Koszul ``Gamma^k_ij`` equals the coefficient of ``xi_i xi_j`` in the closed form."""
    xi_symbols = case.xi_symbols()
    xi_flat = S.flat(*xi_symbols)
    size = len(xi_flat)
    worst = sympy.S.Zero
    for point, gamma in zip(case.points, case.gammas, strict=True):
        G, H = case.shape.at(point)
        formula = S.flat(*spec_christoffel(case.metric, G, H, *xi_symbols))
        for k, quadratic in enumerate(formula):
            try:
                from_formula = quadratic_coefficients(quadratic, xi_flat)
            except ValueError as err:
                return False, f"Gamma^{k} formula is not quadratic in xi: {err}"
            for i in range(size):
                for j in range(i, size):
                    worst = max(worst, abs(from_formula[i][j] - gamma[k][i][j]))
    count = size ** 2 * (size + 1) // 2
    return worst == 0, (f"all {count} Gamma^k_ij equal at {len(case.points)} points"
                        if worst == 0 else f"max |Koszul - formula| = {worst}")


def christoffel_contraction(case: MetricCase) -> tuple[bool, str]:
    """``Gamma(xi, nu)`` from the Koszul symbols equals the polarised closed form."""
    diffs = []
    for point, gamma, (xi, nu) in zip(case.points, case.gammas, case.tangents, strict=True):
        G, H = case.shape.at(point)
        derived = S.contract(gamma, S.flat(*xi), S.flat(*nu))
        plus = spec_christoffel(case.metric, G, H, xi[0] + nu[0], xi[1] + nu[1])
        minus = spec_christoffel(case.metric, G, H, xi[0] - nu[0], xi[1] - nu[1])
        polarised = [(p - q) / 4 for p, q in zip(S.flat(*plus), S.flat(*minus), strict=True)]
        diffs.append(derived - sympy.Matrix(polarised))
    return exact_zero(diffs)


def pulled_back_metric(case: MetricCase) -> tuple[sympy.Matrix, sympy.Matrix]:
    """``(J^T g(G A^-1, H A^T) J, A)``: the metric pulled back by the action of a random ``A``.

    ``A`` is a random rational invertible ``h x h`` matrix drawn from ``case.rng``.
    """
    shape = case.shape
    matrix = S.random_invertible_rational_matrix(shape.h, case.rng)
    action = S.flat(shape.G * matrix.inv(), shape.H * matrix.T)
    return S.pullback_metric(case.g, shape.coords, action), matrix


def invariance(case: MetricCase) -> tuple[bool, str]:
    """``J^T g(G A^-1, H A^T) J = g`` at the points; euclidean, as a control, must move."""
    pulled, matrix = pulled_back_metric(case)
    diffs = [S.evaluate_exact(pulled - case.g, p) for p in case.points]
    if case.metric != "euclidean":
        return exact_zero(diffs, "J^T g(psi x) J - g")
    # control: the check must be able to fail, and euclidean is not invariant
    moved = any(not S.is_exactly_zero(d) for d in diffs)
    if case.shape.h == 1 and not moved and matrix[0, 0] ** 2 == 1:
        return True, "A = +-1 leaves euclidean invariant too"
    return moved, ("not invariant (control), as expected" if moved
                   else "euclidean unexpectedly invariant")


def symbolic_invariance(case: MetricCase) -> tuple[bool, str]:
    """The invariance with ``(G, H)`` left symbolic (run for mix, where it expands cheaply)."""
    pulled, _ = pulled_back_metric(case)
    left = (pulled - case.g).applyfunc(sympy.expand)
    return left.is_zero_matrix, ("expands to 0 for symbolic (G, H)"
                                 if left.is_zero_matrix else "nonzero")


def horizontal_conditions(case: MetricCase) -> tuple[bool, str]:
    """The horizontal condition cuts out the metric-orthogonal complement of the vertical space.

    Compared by ranks of the linear constraints on ``xi``; for inv (``h > 1``) also a control:
    the mix condition is rejected.
    """
    h = case.shape.h
    xi_symbols = case.xi_symbols()
    xi_flat = S.flat(*xi_symbols)
    details = []
    for point in case.points:
        G, H = case.shape.at(point)
        g_at = S.evaluate_exact(case.g, point)
        products = S.metric_products(g_at, case.shape.vertical_generators(G, H), xi_flat)
        orthogonality = products.jacobian(xi_flat)
        condition = sympy.Matrix(S.flat(horizontal_condition(case.metric, G, H, *xi_symbols)))
        condition = condition.jacobian(xi_flat)
        ranks = (orthogonality.rank(), condition.rank(),
                 sympy.Matrix.vstack(orthogonality, condition).rank())
        if ranks != (h * h,) * 3:
            return False, f"ranks (orthogonality, condition, both) = {ranks}"
        if case.metric == "inv" and h > 1:
            # control: the mix condition is not the inv one (for h = 1 they coincide),
            # and the rank test can tell them apart
            other = sympy.Matrix(S.flat(horizontal_condition("mix", G, H, *xi_symbols)))
            stacked = sympy.Matrix.vstack(orthogonality, other.jacobian(xi_flat))
            details.append(stacked.rank())
    detail = f"same {h * h}-dim. constraint space at {len(case.points)} points"
    if details:
        if min(details) <= h * h:
            return False, "the mix condition is indistinguishable from inv here"
        detail += f"; mix condition rejected for inv (rank {max(details)})"
    return True, detail


def projection(case: MetricCase) -> tuple[bool, str]:
    """``(xi_G + G L, xi_H - H L^T)`` is horizontal and the metric-orthogonal projection."""
    diffs = []
    for point, (xi, _) in zip(case.points, case.tangents, strict=True):
        G, H = case.shape.at(point)
        shift = spec_projection_shift(case.metric, G, H, *xi)
        projected = S.flat(xi[0] + G * shift, xi[1] - H * shift.T)
        generators = case.shape.vertical_generators(G, H)
        g_at = S.evaluate_exact(case.g, point)
        diffs.append(S.metric_products(g_at, generators, projected))
        diffs.append(horizontal_condition(case.metric, G, H,
                                          *S.unflat(projected, case.shape.shapes)))
        projector = S.horizontal_projection_matrix(g_at, generators, simplify=None)
        diffs.append(projector * sympy.Matrix(S.flat(*xi)) - sympy.Matrix(projected))
    return exact_zero(diffs)


def gradient(case: MetricCase) -> tuple[bool, str]:
    """``g^-1 egrad`` is the closed-form gradient, and horizontal for an invariant loss."""
    diffs = []
    for point in case.points:
        G, H = case.shape.at(point)
        g_at = S.evaluate_exact(case.g, point)
        egrad = case.shape.random_tangent(case.rng)
        raised = g_at.solve(sympy.Matrix(S.flat(*egrad)))
        diffs.append(raised - sympy.Matrix(S.flat(*spec_gradient(case.metric, G, H, *egrad))))
        # an invariant loss f(G H^T) has egrad (D H, D^T G): the raise is horizontal
        direction = S.random_rational_matrix(case.shape.n, case.shape.m, case.rng, nonzero=False)
        invariant = g_at.solve(sympy.Matrix(S.flat(direction * H, direction.T * G)))
        diffs.append(S.metric_products(g_at, case.shape.vertical_generators(G, H), invariant))
    return exact_zero(diffs)


#: the horizontal condition of each metric, as its row of the table shows it
HORIZONTAL_LABELS = {"mix": "G^T xi_G H^T H = G^T G xi_H^T H",
                     "inv": "xi_G^T G H^T H = G^T G H^T xi_H",
                     "euclidean": "xi_G^T G = H^T xi_H"}
#: how each metric's projection shift ``L`` is obtained
PROJECTION_METHODS = {"mix": "closed-form L", "inv": "Sylvester A L^T + L^T A = B",
                      "euclidean": "Sylvester"}

#: The exact checks of one metric: (check, with ``{horizontal}`` and ``{projection}`` filled in
#: from the tables above, method, function, metrics it runs for). In the order they run: the
#: order fixes the rows of the table and what each check draws from the shared random stream.
METRIC_CHECKS: tuple[tuple[str, str, Callable[[MetricCase], tuple[bool | str, str]],
                           tuple[str, ...]], ...] = (
    ("Koszul Gamma^k_ij = Gamma_G, Gamma_H", "exact rational", christoffel_components, METRICS),
    ("Koszul Gamma(xi,nu) = polarised formula", "exact rational", christoffel_contraction,
     METRICS),
    ("J^T g(G A^-1, H A^T) J = g, random A", "exact rational", invariance, METRICS),
    ("invariance for symbolic (G, H)", "symbolic expand", symbolic_invariance, ("mix",)),
    ("horizontal <=> {horizontal}", "exact rank", horizontal_conditions, METRICS),
    ("projection ({projection}) = I - V(V^T g V)^-1 V^T g", "exact rational", projection,
     METRICS),
    ("g^-1 egrad = closed-form gradient; f(GH^T) horizontal", "exact rational", gradient,
     METRICS),
)


def check_metric(report: Report, shape: Shape, metric: str, rng: random.Random,
                 package: type | None) -> None:
    """Every exact check of one metric at one ``(n, m, h)``, then the package comparison."""
    case = MetricCase(shape, metric, rng)
    for what, method, check, metrics in METRIC_CHECKS:
        if metric in metrics:
            label = what.format(horizontal=HORIZONTAL_LABELS[metric],
                                projection=PROJECTION_METHODS[metric])
            report.run(case.section, label, method, functools.partial(check, case))
    check_package(report, case, package)


def check_package(report: Report, case: MetricCase, package: type | None) -> None:
    """``package`` (``GLQuotient``) in float64 against the exact values at the case's points."""
    section, shape = case.section, case.shape
    what = "GLQuotient inner, christoffel, projection"
    if package is None:
        report.run(section, what, "numeric vs package",
                   lambda: (SKIP, "quotientsharp.core.gl not importable: package not compared"))
        return
    # its own stream: the exact checks draw the same points with or without the package
    rng = random.Random(f"package {section}")

    def compare() -> tuple[bool, str]:
        quotient = package(case.metric, eps=0.0)
        errors = []
        for point, gamma, (xi, nu) in zip(case.points, case.gammas, case.tangents, strict=True):
            G, H = shape.at(point)
            x, u, w = to_torch((G, H)), to_torch(xi), to_torch(nu)
            xi_flat, nu_flat = S.flat(*xi), S.flat(*nu)
            g_at = S.evaluate_exact(case.g, point)
            inner = (sympy.Matrix(xi_flat).T * g_at * sympy.Matrix(nu_flat))[0]
            errors.append(relative_error([quotient.inner(x, u, w)], [inner]))
            errors.append(relative_error(quotient.christoffel(x, u, w),
                                         list(S.contract(gamma, xi_flat, nu_flat))))
            errors.append(relative_error(quotient.christoffel(x, u),
                                         list(S.contract(gamma, xi_flat))))
            projector = S.horizontal_projection_matrix(g_at, shape.vertical_generators(G, H),
                                                       simplify=None)
            errors.append(relative_error(quotient.horizontal_projection(x, u),
                                         list(projector * sympy.Matrix(xi_flat))))
        return numeric_agreement(errors)

    report.run(section, what, "numeric vs package", compare)

    if not hasattr(package, "euclidean_to_riemannian_gradient"):
        return

    def compare_gradient() -> tuple[bool, str]:
        # at an invariant loss's gradient the raise is horizontal, so projecting or not agrees
        quotient = package(case.metric, eps=0.0)
        errors = []
        for point in case.points:
            G, H = shape.at(point)
            direction = S.random_rational_matrix(shape.n, shape.m, rng, nonzero=False)
            egrad = (direction * H, direction.T * G)
            exact = spec_gradient(case.metric, G, H, *egrad)
            got = quotient.euclidean_to_riemannian_gradient(to_torch((G, H)), to_torch(egrad))
            errors.append(relative_error(got, S.flat(*exact)))
        return numeric_agreement(errors)

    report.run(section, "GLQuotient gradient of f(G H^T)", "numeric vs package",
               compare_gradient)


def check_vertical_is_derivative(report: Report, shape: Shape) -> None:
    """``d/ds psi(I + s X, (G, H))`` at ``s = 0`` is ``(-G X, H X^T)``, symbolically."""
    def derivative() -> tuple[bool, str]:
        s = sympy.Symbol("s", real=True)
        generator = S.symbol_matrix("X", shape.h, shape.h)
        group = sympy.eye(shape.h) + s * generator
        inverse = group.adjugate() / group.det()
        moved = S.flat(shape.G * inverse, shape.H * group.T)
        velocity = [sympy.cancel(sympy.diff(c, s).subs(s, 0)) for c in moved]
        expected = S.flat(-shape.G * generator, shape.H * generator.T)
        left = [sympy.expand(p - q) for p, q in zip(velocity, expected, strict=True)]
        left = [e for e in left if e != 0]
        return (not left), ("equal for symbolic G, H, X" if not left else f"left: {left[0]}")

    report.run(f"action {shape.name}", "d/ds (G (I+sX)^-1, H (I+sX)^T) = (-GX, HX^T)",
               "symbolic", derivative)


def main(cases: Sequence[tuple[int, int, int]] = CASES,
         metrics: Sequence[str] = METRICS) -> int:
    """Run every check, print the table; 0 when all pass (skips allowed), 1 otherwise.

    ``cases`` (``(n, m, h)`` shapes) and ``metrics`` narrow the run, e.g. for quick tests.
    """
    start = time.perf_counter()
    rng = random.Random(20250508)
    package = load_package()
    if package is None:
        print("NOTE: quotientsharp.core.gl (GLQuotient) is not importable: the comparisons against "
              "the package code are SKIPPED; the exact derivations still run.\n")
    report = Report()
    for n, m, h in cases:
        shape = Shape(n, m, h, metrics)
        check_vertical_is_derivative(report, shape)
        for metric in metrics:
            check_metric(report, shape, metric, rng, package)
    print(report.table())
    elapsed = time.perf_counter() - start
    failures = report.failures
    if failures:
        print(f"\n{len(failures)} of {len(report.rows)} checks FAILED ({elapsed:.1f} s):",
              file=sys.stderr)
        for section, what, method, _, detail in failures:
            print(f"  [{section}] {what} ({method}): {detail}", file=sys.stderr)
        return 1
    skipped = len(report.skipped)
    print(f"\nall {len(report.rows) - skipped} checks passed, {skipped} skipped "
          f"({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
