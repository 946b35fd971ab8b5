"""The derivation scripts pass on the package, and fail on deliberately broken closed forms."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

sympy = pytest.importorskip("sympy")
torch = pytest.importorskip("torch")

from quotientsharp import DiagonalQuotient  # noqa: E402

DERIVATIONS = Path(__file__).resolve().parent.parent / "derivations"


def load(name: str) -> ModuleType:
    """Import ``derivations/<name>.py`` by path (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"derivation_{name}", DERIVATIONS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def diagonal() -> ModuleType:
    return load("diagonal")


@pytest.fixture(scope="module")
def gl_attention() -> ModuleType:
    return load("gl_attention")


# ---------------------------------------------------------------------- diagonal
def test_diagonal_script_passes(diagonal, capsys) -> None:
    assert diagonal.main() == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "checks passed" in out
    # the table covers both metrics, the product and the general-velocity geodesic
    for needle in ("inv d=1", "mix d=1", "inv d=2", "mix d=2", "general velocity"):
        assert needle in out


def _flipped_christoffel(original):
    def christoffel(self, x, u, v=None):
        gamma = original(self, x, u, v)
        return gamma[0], -gamma[1]
    return christoffel


def test_diagonal_script_catches_a_sign_error_in_christoffel(diagonal, monkeypatch,
                                                             capsys) -> None:
    monkeypatch.setattr(DiagonalQuotient, "christoffel",
                        _flipped_christoffel(DiagonalQuotient.christoffel))
    assert diagonal.main() == 1
    err = capsys.readouterr().err
    assert "package christoffel" in err


def test_diagonal_script_catches_a_wrong_mix_geodesic(diagonal, monkeypatch, capsys) -> None:
    original = DiagonalQuotient.geodesic_exact

    def horizontal_only(self, x, u, t=1.0, steps=64):
        # the horizontal-only formula sqrt(1 + 2 b t) is wrong for general velocities
        if self.metric.name == "inv":
            return original(self, x, u, t, steps)
        b = 0.5 * (u[0] / x[0] + u[1] / x[1])
        root = torch.sqrt(1 + 2 * b * t)
        return x[0] * root, x[1] * root

    monkeypatch.setattr(DiagonalQuotient, "geodesic_exact", horizontal_only)
    assert diagonal.main() == 1
    err = capsys.readouterr().err
    assert "[mix d=1] closed form = package geodesic_exact" in err
    assert "[inv d=1] closed form" not in err


def test_diagonal_script_catches_a_wrong_projection(diagonal, monkeypatch, capsys) -> None:
    def unweighted(self, x, u):
        # Euclidean-orthogonal instead of metric-orthogonal projection
        c = (u[0] * x[0] + u[1] * x[1]) / (x[0] ** 2 + x[1] ** 2)
        return c * x[0], c * x[1]

    monkeypatch.setattr(DiagonalQuotient, "horizontal_projection", unweighted)
    assert diagonal.main() == 1
    assert "package projections" in capsys.readouterr().err


def test_diagonal_transcriptions_are_not_vacuous(diagonal) -> None:
    # a wrong transcription must not cancel to 0 in the symbolic comparison
    u, v = diagonal.u, diagonal.v
    ok, _ = diagonal.symbolic_zero([diagonal.spec_christoffel("mix", [1, 1])[0]
                                    - (2 / v + u / v**2)])
    assert not ok


# ---------------------------------------------------------------------- GL(h)
def _has_gl() -> bool:
    return importlib.util.find_spec("quotientsharp.core.gl") is not None


def test_gl_script_passes(gl_attention, capsys) -> None:
    assert gl_attention.main() == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    for needle in ("inv n=3 m=2 h=2", "mix n=3 m=2 h=2", "euclidean n=2 m=2 h=1"):
        assert needle in out
    if _has_gl():
        assert "SKIPPED" not in out and "not importable" not in out
    else:
        assert "SKIPPED" in out


class _MixReference:
    """A small torch transcription of SPEC section 3 (mix only), standing in for GLQuotient."""

    def __init__(self, metric: str, eps: float = 0.0) -> None:
        assert metric == "mix"

    def inner(self, x, u, v):
        G, H = x
        return (((H.mT @ H) * (u[0].mT @ v[0])).sum((-1, -2))
                + ((G.mT @ G) * (u[1].mT @ v[1])).sum((-1, -2)))

    def _quadratic(self, x, xi):
        (G, H), (XG, XH) = x, xi
        inv_g, inv_h = torch.linalg.inv(G.mT @ G), torch.linalg.inv(H.mT @ H)
        return (XG @ (XH.mT @ H + H.mT @ XH) @ inv_h - G @ (XH.mT @ XH) @ inv_h,
                XH @ (XG.mT @ G + G.mT @ XG) @ inv_g - H @ (XG.mT @ XG) @ inv_g)

    def christoffel(self, x, u, v=None):
        if v is None:
            return self._quadratic(x, u)
        plus = self._quadratic(x, (u[0] + v[0], u[1] + v[1]))
        minus = self._quadratic(x, (u[0] - v[0], u[1] - v[1]))
        return tuple((p - q) / 4 for p, q in zip(plus, minus, strict=True))

    def horizontal_projection(self, x, u):
        (G, H), (XG, XH) = x, u
        shift = 0.5 * (XH.mT @ H @ torch.linalg.inv(H.mT @ H)
                       - torch.linalg.inv(G.mT @ G) @ G.mT @ XG)
        return XG + G @ shift, XH - H @ shift.mT


class _BrokenMix(_MixReference):
    """The mix Gamma_H with the sign of its second term flipped."""

    def _quadratic(self, x, xi):
        gamma_g, gamma_h = super()._quadratic(x, xi)
        (G, H), (XG, _) = x, xi
        correction = 2 * H @ (XG.mT @ XG) @ torch.linalg.inv(G.mT @ G)
        return gamma_g, gamma_h + correction


def test_gl_package_comparison_passes_on_a_correct_implementation(gl_attention, monkeypatch,
                                                                  capsys) -> None:
    monkeypatch.setattr(gl_attention, "load_package", lambda: _MixReference)
    assert gl_attention.main(cases=((3, 2, 2),), metrics=("mix",)) == 0
    out = capsys.readouterr().out
    assert "GLQuotient inner, christoffel, projection" in out and ", 0 skipped" in out


def test_gl_package_comparison_catches_a_sign_error(gl_attention, monkeypatch, capsys) -> None:
    monkeypatch.setattr(gl_attention, "load_package", lambda: _BrokenMix)
    assert gl_attention.main(cases=((3, 2, 2),), metrics=("mix",)) == 1
    err = capsys.readouterr().err
    assert "GLQuotient inner, christoffel, projection" in err
    # only the package comparison fails: the exact derivations are independent of the package
    assert err.count("[mix n=3 m=2 h=2]") == 1


def test_gl_exact_checks_catch_a_wrong_formula(gl_attention, monkeypatch, capsys) -> None:
    # a sign typo in the mix Gamma_G (second term) must be rejected by the exact derivation
    original = gl_attention.spec_christoffel

    def typo(metric, G, H, XG, XH):
        gamma_g, gamma_h = original(metric, G, H, XG, XH)
        return gamma_g + 2 * G * (XH.T * XH) * (H.T * H).inv(), gamma_h

    monkeypatch.setattr(gl_attention, "spec_christoffel", typo)
    monkeypatch.setattr(gl_attention, "load_package", lambda: None)
    assert gl_attention.main(cases=((3, 2, 2),), metrics=("mix",)) == 1
    err = capsys.readouterr().err
    assert "Koszul Gamma^k_ij = Gamma_G, Gamma_H" in err
    assert "Koszul Gamma(xi,nu) = polarised formula" in err


def test_gl_inv_condition_erratum_is_needed(gl_attention) -> None:
    # the mix condition in place of the corrected inv one is not metric-orthogonality for inv
    import random

    from quotientsharp.core import symbolic as S

    shape = gl_attention.Shape(3, 2, 2, metrics=("inv",))
    point = shape.random_point(random.Random(0))
    G, H = shape.at(point)
    xi = [S.symbol_matrix("xi_G", 3, 2), S.symbol_matrix("xi_H", 2, 2)]
    flat = S.flat(*xi)
    g_at = S.evaluate_exact(shape.metrics["inv"], point)
    orth = S.metric_products(g_at, shape.vertical_generators(G, H), flat).jacobian(flat)
    right = sympy.Matrix(S.flat(gl_attention.horizontal_condition("inv", G, H, *xi)))
    wrong = sympy.Matrix(S.flat(gl_attention.horizontal_condition("mix", G, H, *xi)))
    assert sympy.Matrix.vstack(orth, right.jacobian(flat)).rank() == 4
    assert sympy.Matrix.vstack(orth, wrong.jacobian(flat)).rank() > 4


def test_gl_script_catches_a_sign_error_in_the_package(gl_attention, monkeypatch,
                                                        capsys) -> None:
    gl = pytest.importorskip("quotientsharp.core.gl")
    original = gl.GLQuotient.christoffel

    def flipped(self, x, u, v=None, **kwargs):
        gamma_g, gamma_h = original(self, x, u, v, **kwargs)
        return gamma_g, -gamma_h

    monkeypatch.setattr(gl.GLQuotient, "christoffel", flipped)
    assert gl_attention.main(cases=((2, 2, 1),), metrics=("inv", "mix")) == 1
    err = capsys.readouterr().err
    assert err.count("GLQuotient inner, christoffel, projection") == 2


# ---------------------------------------------------------------------- rotary
@pytest.fixture(scope="module")
def rotary() -> ModuleType:
    return load("rotary")


def test_rotary_script_passes(rotary, capsys) -> None:
    assert rotary.main() == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "checks passed" in out
    for needle in ("rotate_half", "interleaved", "inv: package", "mix: package"):
        assert needle in out


def test_rotary_script_catches_a_missing_basis_element(rotary, monkeypatch, capsys) -> None:
    import quotientsharp.core.gl as gl

    original = gl.rotary_algebra_basis
    monkeypatch.setattr(gl, "rotary_algebra_basis",
                        lambda *args, **kwargs: original(*args, **kwargs)[1:])
    assert rotary.main(cases=((4, 4, "rotate_half"),)) == 1
    assert "commutant = span of the package basis" in capsys.readouterr().err


def test_rotary_script_catches_a_wrong_plane_layout(rotary, monkeypatch, capsys) -> None:
    import quotientsharp.core.gl as gl

    # interleaved planes for a rotate_half generator: the commutant differs
    monkeypatch.setattr(gl, "rotary_algebra_basis",
                        lambda h, r, layout, **kw: gl.subgroup.rotary_algebra_basis(
                            h, r, "interleaved", **kw))
    assert rotary.main(cases=((4, 4, "rotate_half"),)) == 1
