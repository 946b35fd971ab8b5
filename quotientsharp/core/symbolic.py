"""Symbolic Riemannian geometry with sympy, for derivations and checks (never the hot path).

Everything works on an explicit metric matrix ``g`` over a list of coordinate symbols. The
Christoffel symbols use the Koszul formula with plain :func:`sympy.diff`: ``sympy.diffgeom``
silently returns zero Christoffel symbols for metrics written in plain ``Symbol`` coordinates.
Identities are checked exactly at random rational points rather than by a long ``simplify``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

try:
    import sympy
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("quotientsharp.core.symbolic needs sympy: "
                      "pip install 'quotientsharp[symbolic]'") from err

import torch

from quotientsharp.core.checks import CheckResult
from quotientsharp.core.quotient import SymmetryQuotient

Gamma = list[list[list[sympy.Expr]]]
Simplifier = Callable[[sympy.Expr], sympy.Expr] | None


# ---------------------------------------------------------------------- small constructors
def symbol_matrix(name: str, rows: int, cols: int, **assumptions: Any) -> sympy.Matrix:
    """A ``rows x cols`` matrix of fresh symbols ``name_i_j``.

    Parameters
    ----------
    name
        Prefix of the symbols' names.
    rows, cols
        Shape of the matrix.
    **assumptions
        sympy assumptions of every symbol (``real=True`` unless overridden).

    Returns
    -------
    sympy.Matrix
        ``shape=[rows, cols]``.
    """
    assumptions.setdefault("real", True)
    return sympy.Matrix(rows, cols,
                        lambda i, j: sympy.Symbol(f"{name}_{i}_{j}", **assumptions))


def flat(*matrices: sympy.MatrixBase) -> list[sympy.Expr]:
    """The entries of the matrices in row-major order, concatenated (torch ``reshape`` order).

    Parameters
    ----------
    *matrices
        Matrices (or anything :class:`sympy.Matrix` accepts), e.g. the components of a point.

    Returns
    -------
    list
        ``sum(len(m))`` expressions: the coordinates of a point in the order the package
        flattens it.
    """
    out: list[sympy.Expr] = []
    for m in matrices:
        out.extend(sympy.Matrix(m).reshape(1, len(m)).tolist()[0])
    return out


def unflat(entries: Sequence[sympy.Expr], shapes: Sequence[tuple[int, int]]
           ) -> list[sympy.Matrix]:
    """Inverse of :func:`flat`: split a flat list (or column vector) into matrices of ``shapes``.

    Parameters
    ----------
    entries
        ``sum(r * c)`` expressions.
    shapes
        ``(rows, cols)`` of each matrix.

    Returns
    -------
    list[sympy.Matrix]
    """
    entries = list(entries)
    total = sum(r * c for r, c in shapes)
    if len(entries) != total:
        raise ValueError(f"entries has {len(entries)} elements but shapes {list(shapes)} need "
                         f"{total}")
    out, start = [], 0
    for r, c in shapes:
        out.append(sympy.Matrix(r, c, entries[start:start + r * c]))
        start += r * c
    return out


def _as_column(vector: Sequence[sympy.Expr] | sympy.MatrixBase, n: int, name: str
               ) -> sympy.Matrix:
    column = sympy.Matrix(list(vector)) if not isinstance(vector, sympy.MatrixBase) \
        else sympy.Matrix(vector).reshape(len(vector), 1)
    if column.shape != (n, 1):
        raise ValueError(f"{name} must have {n} entries (one per coordinate), got {len(column)}")
    return column


def _check_metric(metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol]) -> sympy.Matrix:
    metric = sympy.Matrix(metric)
    n = len(coords)
    if metric.shape != (n, n):
        raise ValueError(f"metric must be {n} x {n} (one row per coordinate), got {metric.shape}")
    if not all(isinstance(c, sympy.Symbol) for c in coords):
        raise TypeError("coords must be sympy Symbols")
    if len(set(coords)) != n:
        raise ValueError("coords must be distinct symbols")
    if metric != metric.T:
        # structurally different entries may still agree; expand before refusing
        left = [e for e in (metric - metric.T).applyfunc(sympy.cancel) if e != 0]
        if any(sympy.simplify(e) != 0 for e in left):
            raise ValueError("metric must be symmetric")
    return metric


def metric_from_bilinear(form: sympy.Expr, first: Sequence[sympy.Symbol],
                         second: Sequence[sympy.Symbol]) -> sympy.Matrix:
    """The matrix ``g_kl = d^2 form / (d first_k d second_l)`` of a bilinear form.

    Parameters
    ----------
    form
        An expression bilinear in the symbols ``first`` and ``second`` (two tangent vectors).
    first, second
        The coordinates of the two vectors, ``len = N`` each.

    Returns
    -------
    sympy.Matrix
        ``shape=[N, N]``.
    """
    if len(first) != len(second):
        raise ValueError(f"first and second must have the same length, got {len(first)} and "
                         f"{len(second)}")
    return sympy.Matrix(len(first), len(second),
                        lambda k, l: sympy.diff(form, first[k], second[l]))


# ---------------------------------------------------------------------- Christoffel symbols
def metric_derivatives(metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol]
                       ) -> list[sympy.Matrix]:
    """The coordinate derivatives of the metric, ``[d g / d x^l for l]``.

    Parameters
    ----------
    metric, coords
        As in :func:`christoffel_symbols`.

    Returns
    -------
    list[sympy.Matrix]
        ``N`` matrices of ``shape=[N, N]``; pass them to :func:`christoffel_symbols_at` to
        reuse them across points.
    """
    metric = _check_metric(metric, coords)
    return [metric.diff(c) for c in coords]


def _koszul(inverse: sympy.Matrix, derivatives: Sequence[sympy.Matrix],
            simplify: Simplifier) -> Gamma:
    """``Gamma^k_ij = 1/2 g^{kl} (d_i g_lj + d_j g_li - d_l g_ij)`` from ``g^{-1}`` and ``dg``."""
    n = inverse.shape[0]
    # the lowered symbols Gamma_{l,ij}, symmetric in (i, j)
    lowered = [[[None] * n for _ in range(n)] for _ in range(n)]
    for l in range(n):
        for i in range(n):
            for j in range(i, n):
                value = (derivatives[i][l, j] + derivatives[j][l, i] - derivatives[l][i, j]) / 2
                lowered[l][i][j] = lowered[l][j][i] = value
    gamma: Gamma = [[[sympy.S.Zero] * n for _ in range(n)] for _ in range(n)]
    for k in range(n):
        for i in range(n):
            for j in range(i, n):
                value = sympy.Add(*[inverse[k, l] * lowered[l][i][j] for l in range(n)
                                    if inverse[k, l] != 0 and lowered[l][i][j] != 0])
                if simplify is not None:
                    value = simplify(value)
                gamma[k][i][j] = gamma[k][j][i] = value
    return gamma


def christoffel_symbols(metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol], *,
                        simplify: Simplifier = sympy.cancel) -> Gamma:
    """Christoffel symbols of the Levi-Civita connection, ``Gamma[k][i][j] = Gamma^k_ij``.

    Parameters
    ----------
    metric
        Symmetric metric matrix in the coordinates, ``shape=[N, N]``.
    coords
        The ``N`` coordinate symbols.
    simplify
        Applied to every symbol (default :func:`sympy.cancel`, which suits rational metrics);
        ``None`` leaves the raw Koszul sums.

    Returns
    -------
    list
        Nested list ``N x N x N``, symmetric in the last two indices.
    """
    metric = _check_metric(metric, coords)
    inverse = metric.inv()
    if simplify is not None:
        inverse = inverse.applyfunc(simplify)
    return _koszul(inverse, metric_derivatives(metric, coords), simplify)


def christoffel_symbols_at(metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol],
                           point: Mapping[sympy.Symbol, sympy.Expr],
                           derivatives: Sequence[sympy.Matrix] | None = None) -> Gamma:
    """Christoffel symbols at one point, exact when ``point`` holds rationals.

    The metric is differentiated symbolically, then ``point`` is substituted and the metric is
    inverted there, so no symbolic inverse of a large metric is ever formed.

    Parameters
    ----------
    metric, coords
        As in :func:`christoffel_symbols`.
    point
        Values of (at least) all coordinates, e.g. from :func:`random_rationals`.
    derivatives
        Optional precomputed :func:`metric_derivatives` (reuse them across points).

    Returns
    -------
    list
        Nested list ``N x N x N`` of exact numbers, ``Gamma[k][i][j] = Gamma^k_ij`` at ``point``.
    """
    metric = _check_metric(metric, coords)
    if derivatives is None:
        derivatives = metric_derivatives(metric, coords)
    g_at = evaluate_exact(metric, point)
    if g_at.det() == 0:
        raise ValueError("the metric is singular at point")
    inverse = g_at.inv()
    dg_at = [evaluate_exact(d, point) for d in derivatives]
    return _koszul(inverse, dg_at, None)


def contract(gamma: Gamma, u: Sequence[sympy.Expr] | sympy.MatrixBase,
             v: Sequence[sympy.Expr] | sympy.MatrixBase | None = None) -> sympy.Matrix:
    """The contraction ``Gamma^k(u, v) = sum_ij Gamma^k_ij u^i v^j``.

    Parameters
    ----------
    gamma
        Christoffel symbols, from :func:`christoffel_symbols` or :func:`christoffel_symbols_at`.
    u, v
        Tangent vectors by their ``N`` components; ``v`` defaults to ``u``.

    Returns
    -------
    sympy.Matrix
        ``shape=[N, 1]``.
    """
    n = len(gamma)
    u = _as_column(u, n, "u")
    v = u if v is None else _as_column(v, n, "v")
    return sympy.Matrix([sympy.Add(*[gamma[k][i][j] * u[i] * v[j]
                                     for i in range(n) for j in range(n) if gamma[k][i][j] != 0])
                         for k in range(n)])


def christoffel_contraction(metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol],
                            u: Sequence[sympy.Expr] | sympy.MatrixBase,
                            v: Sequence[sympy.Expr] | sympy.MatrixBase | None = None, *,
                            simplify: Simplifier = sympy.cancel) -> sympy.Matrix:
    """The vector ``Gamma^k(u, v)`` of the Levi-Civita connection.

    Parameters
    ----------
    metric, coords
        As in :func:`christoffel_symbols`.
    u, v
        Tangent vectors by their ``N`` components (symbols or expressions); ``v`` defaults to
        ``u``, which gives the quadratic form of the geodesic equation.
    simplify
        Applied to the symbols and to each component (default :func:`sympy.cancel`).

    Returns
    -------
    sympy.Matrix
        ``shape=[N, 1]``.
    """
    out = contract(christoffel_symbols(metric, coords, simplify=simplify), u, v)
    return out if simplify is None else out.applyfunc(simplify)


def geodesic_residual(metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol],
                      path: Sequence[sympy.Expr], t: sympy.Symbol, *,
                      gamma: Gamma | None = None, simplify: Simplifier = None) -> sympy.Matrix:
    """``x''(t) + Gamma_{x(t)}(x'(t), x'(t))`` along ``path``: zero iff ``path`` is a geodesic.

    Parameters
    ----------
    metric, coords
        As in :func:`christoffel_symbols`.
    path
        ``N`` expressions in ``t``, the coordinates along the curve.
    t
        The curve parameter.
    gamma
        Optional precomputed :func:`christoffel_symbols` (symbolic in ``coords``).
    simplify
        Applied to each component of the residual (default: none; transcendental paths
        usually need a problem-specific rewrite first, e.g. division by the path).

    Returns
    -------
    sympy.Matrix
        ``shape=[N, 1]``.
    """
    n = len(coords)
    if len(path) != n:
        raise ValueError(f"path must have {n} components (one per coordinate), got {len(path)}")
    if gamma is None:
        gamma = christoffel_symbols(metric, coords)
    along = dict(zip(coords, path, strict=True))
    velocity = [sympy.diff(p, t) for p in path]
    acceleration = [sympy.diff(w, t) for w in velocity]
    gamma_along = [[[g.xreplace(along) for g in row] for row in block] for block in gamma]
    quadratic = contract(gamma_along, velocity)
    residual = sympy.Matrix([acceleration[k] + quadratic[k] for k in range(n)])
    return residual if simplify is None else residual.applyfunc(simplify)


# ---------------------------------------------------------------------- vertical / horizontal
def vertical_matrix(generators: Sequence[Sequence[sympy.Expr] | sympy.MatrixBase]
                    ) -> sympy.Matrix:
    """The vertical generators as the columns of a matrix.

    Parameters
    ----------
    generators
        ``K`` vectors of ``N`` components each (lists or column matrices).

    Returns
    -------
    sympy.Matrix
        ``shape=[N, K]``.
    """
    if len(generators) == 0:
        raise ValueError("generators must hold at least one vertical vector")
    n = len(generators[0])
    for i, g in enumerate(generators):
        if len(g) != n:
            raise ValueError(f"generators[{i}] has {len(g)} entries, generators[0] has {n}")
    return sympy.Matrix.hstack(*(_as_column(g, n, "generators") for g in generators))


def metric_products(metric: sympy.MatrixBase,
                    generators: Sequence[Sequence[sympy.Expr] | sympy.MatrixBase],
                    vector: Sequence[sympy.Expr] | sympy.MatrixBase) -> sympy.Matrix:
    """The metric products ``[<V_k, vector>_g for k]`` with every vertical generator.

    Parameters
    ----------
    metric
        Metric matrix, ``shape=[N, N]``.
    generators
        The ``K`` vertical generators (see :func:`vertical_matrix`).
    vector
        ``N`` components.

    Returns
    -------
    sympy.Matrix
        ``shape=[K, 1]``; zero iff ``vector`` is horizontal.
    """
    basis = vertical_matrix(generators)
    vector = _as_column(vector, basis.shape[0], "vector")
    return basis.T * sympy.Matrix(metric) * vector


def vertical_projection_matrix(metric: sympy.MatrixBase,
                               generators: Sequence[Sequence[sympy.Expr] | sympy.MatrixBase],
                               *, simplify: Simplifier = sympy.cancel) -> sympy.Matrix:
    """Metric-orthogonal projection onto the span of the generators: ``V (V^T g V)^{-1} V^T g``.

    Parameters
    ----------
    metric
        Metric matrix, ``shape=[N, N]`` (symbolic, or evaluated at an exact point).
    generators
        The ``K`` vertical generators, linearly independent (a degenerate orbit raises).
    simplify
        Applied to the Gram matrix and to every entry (default :func:`sympy.cancel`); ``None``
        for numbers.

    Returns
    -------
    sympy.Matrix
        ``shape=[N, N]``.
    """
    basis = vertical_matrix(generators)
    metric = sympy.Matrix(metric)
    if metric.shape != (basis.shape[0], basis.shape[0]):
        raise ValueError(f"metric must be {basis.shape[0]} x {basis.shape[0]}, got {metric.shape}")
    gram = basis.T * metric * basis
    if simplify is not None:
        gram = gram.applyfunc(simplify)
    det = gram.det()
    if (simplify(det) if simplify is not None else det) == 0:
        raise ValueError("the vertical generators are linearly dependent under the metric")
    out = basis * gram.inv() * basis.T * metric
    return out if simplify is None else out.applyfunc(simplify)


def horizontal_projection_matrix(metric: sympy.MatrixBase,
                                 generators: Sequence[Sequence[sympy.Expr] | sympy.MatrixBase],
                                 *, simplify: Simplifier = sympy.cancel) -> sympy.Matrix:
    """Metric-orthogonal projection onto the horizontal space, ``I - V (V^T g V)^{-1} V^T g``.

    Works on symbolic metrics and, much faster, on metrics evaluated at an exact point.

    Parameters
    ----------
    metric, generators, simplify
        As in :func:`vertical_projection_matrix`.

    Returns
    -------
    sympy.Matrix
        ``shape=[N, N]``.
    """
    vertical = vertical_projection_matrix(metric, generators, simplify=simplify)
    out = sympy.eye(vertical.shape[0]) - vertical
    return out if simplify is None else out.applyfunc(simplify)


def pullback_metric(metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol],
                    action: Sequence[sympy.Expr]) -> sympy.Matrix:
    """The pulled-back metric ``J^T g(psi(x)) J`` of the map ``x -> psi(x)``, ``J = d psi / dx``.

    The metric is invariant under ``psi`` iff this equals ``metric``.

    Parameters
    ----------
    metric, coords
        As in :func:`christoffel_symbols`.
    action
        ``psi(x)``: ``N`` expressions in ``coords``, e.g. a group element acting.

    Returns
    -------
    sympy.Matrix
        ``shape=[N, N]``.
    """
    metric = _check_metric(metric, coords)
    if len(action) != len(coords):
        raise ValueError(f"action must have {len(coords)} components, got {len(action)}")
    jacobian = sympy.Matrix(list(action)).jacobian(list(coords))
    moved = metric.xreplace(dict(zip(coords, action, strict=True)))
    return jacobian.T * moved * jacobian


# ---------------------------------------------------------------------- exact evaluation
def random_rational(rng: random.Random, *, bound: int = 3, max_denominator: int = 7,
                    nonzero: bool = True) -> sympy.Rational:
    """A random rational ``p / q`` with ``|p / q| <= bound`` and ``1 <= q <= max_denominator``.

    Parameters
    ----------
    rng
        The source of randomness.
    bound, max_denominator
        Limits of the value and of its denominator (both ``>= 1``).
    nonzero
        Redraw zeros (default), e.g. for coordinates a metric divides by.

    Returns
    -------
    sympy.Rational
    """
    if bound < 1 or max_denominator < 1:
        raise ValueError("bound and max_denominator must be >= 1")
    while True:
        q = rng.randint(1, max_denominator)
        p = rng.randint(-bound * q, bound * q)
        if p != 0 or not nonzero:
            return sympy.Rational(p, q)


def random_rationals(symbols: Sequence[sympy.Symbol], rng: random.Random, **kwargs: Any
                     ) -> dict[sympy.Symbol, sympy.Rational]:
    """A random rational value for every symbol: a point where identities hold exactly.

    Parameters
    ----------
    symbols
        The coordinates.
    rng
        The source of randomness.
    **kwargs
        Passed to :func:`random_rational` (nonzero by default).

    Returns
    -------
    dict
        ``{symbol: rational}``, ready for :func:`evaluate_exact`.
    """
    return {s: random_rational(rng, **kwargs) for s in symbols}


def random_rational_matrix(rows: int, cols: int, rng: random.Random, **kwargs: Any
                           ) -> sympy.Matrix:
    """A matrix of :func:`random_rational` entries.

    Parameters
    ----------
    rows, cols
        Its shape.
    rng
        The source of randomness.
    **kwargs
        Passed to :func:`random_rational`.

    Returns
    -------
    sympy.Matrix
        ``shape=[rows, cols]``.
    """
    return sympy.Matrix(rows, cols, lambda i, j: random_rational(rng, **kwargs))


def random_invertible_rational_matrix(n: int, rng: random.Random, **kwargs: Any
                                      ) -> sympy.Matrix:
    """A random invertible rational matrix (redrawn until its determinant is nonzero).

    Parameters
    ----------
    n
        Its size.
    rng
        The source of randomness.
    **kwargs
        Passed to :func:`random_rational` (entries may be zero).

    Returns
    -------
    sympy.Matrix
        ``shape=[n, n]``, e.g. a group element of GL(n).
    """
    while True:
        m = random_rational_matrix(n, n, rng, nonzero=False, **kwargs)
        if m.det() != 0:
            return m


def evaluate_exact(expr: Any, values: Mapping[sympy.Symbol, sympy.Expr]) -> Any:
    """Substitute ``values`` into an expression or matrix without floats or simplification.

    Uses ``xreplace`` (simultaneous, structural); sympy's constructors fold the rational
    arithmetic.

    Parameters
    ----------
    expr
        An expression, a matrix, or anything :func:`sympy.sympify` accepts.
    values
        ``{symbol: value}``, e.g. from :func:`random_rationals`.

    Returns
    -------
    object
        ``expr`` at ``values``: exact numbers when the values are rational.

    Raises
    ------
    ValueError
        A free symbol is left over, so a forgotten coordinate is not mistaken for a symbolic
        result.
    """
    if not hasattr(expr, "xreplace"):
        expr = sympy.sympify(expr)
    out = expr.xreplace(dict(values))
    left: set[Any] = getattr(out, "free_symbols", set())
    if left:
        names = ", ".join(sorted(str(s) for s in left))
        raise ValueError(f"values leave free symbols in the expression: {names}")
    return out


def _entries(value: Any) -> list[sympy.Expr]:
    if isinstance(value, sympy.MatrixBase):
        return list(value)
    if isinstance(value, (list, tuple)):
        return [e for v in value for e in _entries(v)]
    return [sympy.sympify(value)]


def is_exactly_zero(value: Any) -> bool:
    """Whether every entry of a number, matrix or nested list is exactly ``0``.

    Parameters
    ----------
    value
        Rational numbers (e.g. from :func:`evaluate_exact` at a rational point).

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        An entry is symbolic or not rational, so an inexact comparison never passes silently.
    """
    for e in _entries(value):
        if e.free_symbols:
            raise ValueError(f"is_exactly_zero needs numbers, got the expression {e}")
        if not e.is_Rational:
            raise ValueError(f"is_exactly_zero needs rational entries, got {e}")
        if e != 0:
            return False
    return True


def max_abs(value: Any) -> sympy.Rational:
    """Largest absolute entry (exact) of a rational number, matrix or nested list.

    Parameters
    ----------
    value
        Numbers, a matrix or a nested list of them.

    Returns
    -------
    sympy.Rational
        ``0`` for an empty value.
    """
    return max((abs(e) for e in _entries(value)), default=sympy.S.Zero)


def to_tensor(value: Any, dtype: torch.dtype = torch.float64,
              device: torch.device | str | None = None) -> torch.Tensor:
    """A numeric sympy matrix (kept 2-D), list or number as a torch tensor.

    Parameters
    ----------
    value
        Exact or floating numbers: a matrix, a (nested) list or a number.
    dtype, device
        Of the tensor.

    Returns
    -------
    torch.Tensor
        A matrix keeps its two dimensions; a list is stacked.
    """
    if isinstance(value, sympy.MatrixBase):
        return torch.tensor([[float(e) for e in row] for row in value.tolist()], dtype=dtype,
                            device=device)
    if isinstance(value, (list, tuple)):
        return torch.stack([to_tensor(v, dtype, device) for v in value])
    return torch.tensor(float(value), dtype=dtype, device=device)


def package_relative_error(package: Sequence[torch.Tensor], exact: Sequence[sympy.Expr]) -> float:
    """``max |package - exact| / max |exact|`` over all entries (absolute when exact is 0).

    Parameters
    ----------
    package
        The package's torch output, any shapes, flattened in order (e.g. a point tuple).
    exact
        The exact values, as many as ``package`` has entries.

    Returns
    -------
    float
        The relative error in float64.
    """
    got = torch.cat([p.reshape(-1) for p in package]).to(torch.float64)
    want = torch.tensor([float(e) for e in exact], dtype=torch.float64)
    if got.shape != want.shape:
        raise ValueError(f"package returned {got.numel()} numbers, expected {want.numel()}")
    scale = float(want.abs().max()) or 1.0
    return float((got - want).abs().max()) / scale


# ---------------------------------------------------------------------- a user's class
def _point_tensors(values: Sequence[sympy.Expr], shapes: Sequence[Sequence[int]]
                   ) -> tuple[torch.Tensor, ...]:
    """Split flat exact values into float64 tensors of ``shapes`` (row-major, as :func:`flat`)."""
    flat_values = torch.tensor([float(v) for v in values], dtype=torch.float64)
    parts = flat_values.split([math.prod(shape) for shape in shapes])
    return tuple(part.reshape(tuple(shape)) for part, shape in zip(parts, shapes, strict=True))


def _vertical_error(quotient: Any, x: tuple[torch.Tensor, ...], vertical: sympy.Matrix
                    ) -> float:
    """Largest error of ``vertical`` over the algebra's standard basis (one exact column each)."""
    algebra = tuple(quotient.algebra_shape(x))
    if math.prod(algebra) != vertical.shape[1]:
        raise ValueError(f"vertical has {vertical.shape[1]} generators but the algebra of "
                         f"{type(quotient).__name__} has {math.prod(algebra)} elements "
                         f"(algebra_shape {algebra})")
    vertical_error = 0.0
    for k in range(vertical.shape[1]):
        a = torch.zeros(math.prod(algebra), dtype=torch.float64)
        a[k] = 1.0
        vertical_error = max(vertical_error, package_relative_error(
            quotient.vertical(x, a.reshape(algebra)), list(vertical[:, k])))
    return vertical_error


def _exact_errors(q: Any, shapes: Sequence[Sequence[int]], metric: sympy.Matrix,
                  coords: Sequence[sympy.Symbol], derivatives: list[sympy.Matrix],
                  basis: sympy.Matrix | None, rng: random.Random) -> dict[str, tuple[str, float]]:
    """The rows of :func:`check_quotient` at one random rational point where the metric is
    invertible, with three rational vectors: ``{name: (method, relative error)}``."""
    for _ in range(20):   # redraw where the metric is singular
        point = random_rationals(coords, rng)
        g = evaluate_exact(metric, point)
        if g.det() != 0:
            break
    else:
        raise ValueError("the metric is singular at 20 random rational points")
    u, w, egrad = (random_rational_matrix(len(coords), 1, rng, nonzero=False) for _ in range(3))
    gamma = christoffel_symbols_at(metric, coords, point, derivatives)
    x = _point_tensors([point[c] for c in coords], shapes)
    tu, tw = _point_tensors(list(u), shapes), _point_tensors(list(w), shapes)
    errors = {
        "inner_vs_exact": ("inner", package_relative_error(
            (q.inner(x, tu, tw).reshape(1),), [(u.T * g * w)[0]])),
        "christoffel_vs_exact": ("christoffel", package_relative_error(
            q.christoffel(x, tu, tw), list(contract(gamma, u, w)))),
        "christoffel_quadratic_vs_exact": ("christoffel", package_relative_error(
            q.christoffel(x, tu), list(contract(gamma, u)))),
    }
    if basis is None:
        return errors
    vertical = evaluate_exact(basis, point)
    horizontal = horizontal_projection_matrix(
        g, [vertical[:, k] for k in range(vertical.shape[1])], simplify=None)
    errors["vertical_vs_exact"] = ("vertical", _vertical_error(q, x, vertical))
    errors["horizontal_projection_vs_exact"] = ("horizontal_projection", package_relative_error(
        q.horizontal_projection(x, tu), list(horizontal * u)))
    errors["vertical_projection_vs_exact"] = ("vertical_projection", package_relative_error(
        q.vertical_projection(x, tu), list(u - horizontal * u)))
    errors["gradient_vs_exact"] = ("euclidean_to_riemannian_gradient", package_relative_error(
        q.euclidean_to_riemannian_gradient(x, _point_tensors(list(egrad), shapes)),
        list(horizontal * g.inv() * egrad)))
    return errors


def _check_quotient_inputs(quotient: Any, metric: sympy.MatrixBase,
                           coords: Sequence[sympy.Symbol],
                           vertical: Sequence[Sequence[sympy.Expr]] | None
                           ) -> tuple[Sequence[Sequence[int]], sympy.Matrix, sympy.Matrix | None]:
    """The point shapes, the checked metric and the vertical basis of :func:`check_quotient`."""
    if not isinstance(quotient, SymmetryQuotient):
        raise TypeError(f"quotient must be a SymmetryQuotient instance, got "
                        f"{type(quotient).__name__}")
    shapes = quotient.point_shapes
    if shapes is None:
        raise ValueError(f"{type(quotient).__name__} has no point_shapes: build it with "
                         f"point_shapes=[...] (no batch dimensions)")
    metric = _check_metric(metric, coords)
    n = len(coords)
    if sum(math.prod(s) for s in shapes) != n:
        raise ValueError(f"coords has {n} symbols but the point shapes {list(shapes)} hold "
                         f"{sum(math.prod(s) for s in shapes)} entries")
    basis = None if vertical is None else vertical_matrix(vertical)
    if basis is not None and basis.shape[0] != n:
        raise ValueError(f"each vertical generator must have {n} entries, got {basis.shape[0]}")
    return shapes, metric, basis


def check_quotient(quotient: Any, metric: sympy.MatrixBase, coords: Sequence[sympy.Symbol],
                   vertical: Sequence[Sequence[sympy.Expr]] | None = None, *, points: int = 3,
                   seed: int = 0, tolerance: float = 1e-10) -> list[Any]:
    """Check a quotient class against exact values derived from its metric, in one call.

    At ``points`` random rational points (and rational tangent vectors) the exact values are
    derived from ``metric`` alone: the metric itself, the Christoffel contraction (Koszul
    formula), and, given the vertical generators, the horizontal and vertical projections
    ``I - V (V^T g V)^{-1} V^T g`` and the Riemannian gradient ``P_h g^{-1} egrad``. Each is
    compared with what ``quotient`` computes in float64, whether the class overrides the
    operation with a closed form or keeps the generic default.

    Parameters
    ----------
    quotient
        A :class:`~quotientsharp.SymmetryQuotient` with ``point_shapes`` (no batch dimensions).
    metric
        The metric matrix, ``shape=[N, N]``, over ``coords`` (e.g. from
        :func:`metric_from_bilinear`).
    coords
        The ``N`` coordinate symbols: the entries of the point's components, flattened
        row-major and concatenated in component order (the order of :func:`flat`).
    vertical
        Optional vertical generators: one list of ``N`` expressions in ``coords`` per element of
        the Lie algebra's standard basis, in the row-major order of ``algebra_shape``. With
        them, ``vertical``, the projections and the gradient are checked too.
    points
        Number of random rational points.
    seed
        Seed of the rational draws.
    tolerance
        Bound on the relative error of each float64 operation against the exact value.

    Returns
    -------
    list[CheckResult]
        One row per operation (``inner_vs_exact``, ``christoffel_vs_exact``, ...), its error the
        largest relative error over the points; print them with
        :func:`quotientsharp.core.checks.format_results`.

    Examples
    --------
    >>> results = check_quotient(MyQuotient(point_shapes=[(2,), (1,)]), g, coords, [v])  # +SKIP
    >>> [r.name for r in results if not r.passed]                         # doctest: +SKIP
    []
    """
    shapes, metric, basis = _check_quotient_inputs(quotient, metric, coords, vertical)
    rng = random.Random(seed)
    derivatives = metric_derivatives(metric, coords)
    worst: dict[str, tuple[str, float]] = {}
    for _ in range(points):
        for name, (method, error) in _exact_errors(quotient, shapes, metric, coords, derivatives,
                                                    basis, rng).items():
            worst[name] = (method, max(worst.get(name, (method, 0.0))[1], error))

    results = []
    for name, (method, error_value) in worst.items():
        own = getattr(type(quotient), method) is not getattr(SymmetryQuotient, method)
        detail = (f"{method} ({'this class' if own else 'the generic default'}) against the "
                  f"exact value from the metric at {points} rational points")
        results.append(CheckResult(name, error_value, tolerance, bool(error_value <= tolerance),
                                   detail))
    return results
