"""Derive the rotary symmetry group of query/key pairs and check the package against it, exactly.

Run ``python derivations/rotary.py``: exit status 0 when every check passes, 1 (with the failing
rows listed) otherwise. Importable: :func:`main` returns the exit status.

Rotary embeddings multiply each query and key by ``R_p = exp(p Omega)`` at position ``p``, with
``Omega`` block-diagonal: a rotation generator ``omega_d J`` on each plane ``d`` (dims
``(d, d + R/2)`` in the rotate_half layout, ``(2d, 2d + 1)`` interleaved) and zero on the
``h - R`` dims without rotation. ``(G A^{-1}, H A^T)`` leaves every score
``q R_p R_{p'}^T k^T`` unchanged iff ``A`` commutes with every ``R_p``, i.e. with ``Omega``
(differentiate at ``p = 0``; conversely, commuting with ``Omega`` commutes with its
exponential). The script, in exact rational arithmetic (no floating point, no ``simplify``):

1. solves ``C Omega = Omega C`` for a matrix ``C`` of unknowns, with distinct rational
   frequencies, and checks that the solution space is exactly the span of the package's
   algebra basis (``quotientsharp.core.gl.rotary_algebra_basis``): complex scalars
   ``[[a, -b], [b, a]]`` on each plane and a free block on the non-rotary dims;
2. checks that the solution space is closed under the matrix product (a Lie subalgebra whose
   exponential is the group ``GL(1, C)^{R/2} x GL(h - R)``);
3. at random rational points ``(G, H)`` builds the inv and mix metrics over the flattened
   coordinates and the vertical vectors ``(-G X, H X^T)`` of the basis, forms the exact
   metric-orthogonal horizontal projection ``I - V (V^T g V)^{-1} V^T g``, and compares the
   package's ``RotaryQuotient.horizontal_projection`` and Riemannian gradient (float64) with it
   to ``1e-10`` relative.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence

import sympy
import torch

from quotientsharp.core import symbolic as S

#: (head_dim, rotary_dims, layout)
CASES = ((4, 4, "rotate_half"), (6, 4, "rotate_half"), (4, 4, "interleaved"),
         (5, 2, "interleaved"))
TOLERANCE = 1e-10


def omega(head_dim: int, rotary_dims: int, layout: str) -> sympy.Matrix:
    """The generator of the rotations, with distinct rational frequencies ``1 / (d + 1)``."""
    from quotientsharp.core.gl import rotary_planes

    matrix = sympy.zeros(head_dim, head_dim)
    for d, (i, j) in enumerate(rotary_planes(head_dim, rotary_dims, layout)):
        frequency = sympy.Rational(1, d + 1)
        matrix[j, i], matrix[i, j] = frequency, -frequency
    return matrix


def commutant(generator: sympy.Matrix) -> list[sympy.Matrix]:
    """A basis of ``{C : C Omega = Omega C}`` (exact nullspace of the linear map)."""
    h = generator.shape[0]
    unknowns = S.symbol_matrix("c", h, h)
    equations = S.flat(unknowns * generator - generator * unknowns)
    symbols = S.flat(unknowns)
    system = sympy.Matrix([[sympy.diff(e, s) for s in symbols] for e in equations])
    return [sympy.Matrix(h, h, list(v)) for v in system.nullspace()]


def package_basis(head_dim: int, rotary_dims: int, layout: str) -> list[sympy.Matrix]:
    """The package's basis, scaled back to integer entries (its ``1 / sqrt 2`` is a norm)."""
    from quotientsharp.core.gl import rotary_algebra_basis

    basis = rotary_algebra_basis(head_dim, rotary_dims, layout)
    out = []
    for element in basis:
        scale = float(element.abs().max())
        entries = [sympy.Integer(round(float(v) / scale)) for v in element.flatten()]
        out.append(sympy.Matrix(head_dim, head_dim, entries))
    return out


def same_span(first: Sequence[sympy.Matrix], second: Sequence[sympy.Matrix]) -> bool:
    a = sympy.Matrix.hstack(*[m.reshape(len(m), 1) for m in first])
    b = sympy.Matrix.hstack(*[m.reshape(len(m), 1) for m in second])
    return a.rank() == b.rank() == sympy.Matrix.hstack(a, b).rank() == len(first)


def closed_under_products(basis: Sequence[sympy.Matrix]) -> bool:
    stacked = sympy.Matrix.hstack(*[m.reshape(len(m), 1) for m in basis])
    rank = stacked.rank()
    for x in basis:
        for y in basis:
            product = (x * y).reshape(len(x), 1)
            if sympy.Matrix.hstack(stacked, product).rank() != rank:
                return False
    return True


def exact_projection(metric: str, G: sympy.Matrix, H: sympy.Matrix,
                     basis: Sequence[sympy.Matrix]) -> sympy.Matrix:
    """``I - V (V^T g V)^{-1} V^T g`` over the flattened ``(G, H)`` (row-major)."""
    n, h = G.shape
    m = H.shape[0]
    gram_g, gram_h = G.T * G, H.T * H
    if metric == "inv":
        weight_g, weight_h = gram_g.inv(), gram_h.inv()
    else:
        weight_g, weight_h = gram_h, gram_g
    g = sympy.diag(sympy.kronecker_product(sympy.eye(n), weight_g),
                   sympy.kronecker_product(sympy.eye(m), weight_h))
    generators = [S.flat(-G * X, H * X.T) for X in basis]
    return S.horizontal_projection_matrix(g, generators, simplify=None)


def check_projection(head_dim: int, rotary_dims: int, layout: str, metric: str,
                     rng: random.Random) -> tuple[bool, str]:
    from quotientsharp.core.gl import RotaryQuotient

    n, m = head_dim + 1, head_dim + 2
    G, H = S.random_rational_matrix(n, head_dim, rng), S.random_rational_matrix(m, head_dim, rng)
    if (G.T * G).det() == 0 or (H.T * H).det() == 0:
        return True, "degenerate draw skipped"
    projection = exact_projection(metric, G, H, commutant(omega(head_dim, rotary_dims, layout)))
    u_g, u_h = S.random_rational_matrix(n, head_dim, rng), S.random_rational_matrix(m, head_dim,
                                                                                  rng)
    exact = projection * sympy.Matrix(S.flat(u_g, u_h))
    quotient = RotaryQuotient(metric, head_dim=head_dim, rotary_dims=rotary_dims, layout=layout)

    def to_torch(matrix: sympy.Matrix) -> torch.Tensor:
        return torch.tensor([[float(v) for v in row] for row in matrix.tolist()],
                            dtype=torch.float64)

    x = (to_torch(G), to_torch(H))
    u = (to_torch(u_g), to_torch(u_h))
    got = torch.cat([t.flatten() for t in quotient.horizontal_projection(x, u)])
    want = torch.tensor([float(v) for v in exact], dtype=torch.float64)
    error = float((got - want).abs().max() / want.abs().max())
    return error <= TOLERANCE, f"relative error {error:.2e}"


def main(cases: Sequence[tuple[int, int, str]] = CASES, seed: int = 0) -> int:
    rng = random.Random(seed)
    rows: list[tuple[str, bool, str]] = []
    for head_dim, rotary_dims, layout in cases:
        label = f"h={head_dim} R={rotary_dims} {layout}"
        solutions = commutant(omega(head_dim, rotary_dims, layout))
        expected = rotary_dims + (head_dim - rotary_dims) ** 2
        rows.append((f"[{label}] commutant dimension = R + (h - R)^2 = {expected}",
                     len(solutions) == expected, f"{len(solutions)}"))
        rows.append((f"[{label}] commutant = span of the package basis",
                     same_span(solutions, package_basis(head_dim, rotary_dims, layout)), ""))
        rows.append((f"[{label}] closed under products (a subalgebra)",
                     closed_under_products(solutions), ""))
        for metric in ("inv", "mix"):
            ok, detail = check_projection(head_dim, rotary_dims, layout, metric, rng)
            rows.append((f"[{label}] {metric}: package horizontal projection = exact", ok,
                         detail))
    width = max(len(r[0]) for r in rows)
    for what, ok, detail in rows:
        print(f"{what:<{width}}  {'pass' if ok else 'FAIL'}  {detail}")
    failed = [r for r in rows if not r[1]]
    if failed:
        print(f"\n{len(failed)} check(s) failed", file=sys.stderr)
        for what, _, detail in failed:
            print(f"  {what}: {detail}", file=sys.stderr)
        return 1
    print(f"\nall {len(rows)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
