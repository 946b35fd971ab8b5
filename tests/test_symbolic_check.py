"""``quotientsharp.core.symbolic.check_quotient``: a quotient class against the exact values
derived from its metric, in one call; it passes on correct classes (closed forms and generic
defaults) and names the operation that is wrong."""

from __future__ import annotations

import pytest

import quotientsharp as qs
from quotientsharp.core import reference
from tests.tiny_models import ReLUNeuronQuotient

sympy = pytest.importorskip("sympy")
S = pytest.importorskip("quotientsharp.core.symbolic")


Neuron = ReLUNeuronQuotient


class FastNeuron(Neuron):
    def horizontal_projection(self, x, u):
        w_in, w_out = x
        a = ((u[0] * w_in).sum(-1) / w_in.square().sum(-1)
             - (u[1] * w_out).sum(-1) / w_out.square().sum(-1)) / 2
        a = a.unsqueeze(-1)
        return u[0] - a * w_in, u[1] + a * w_out


class WrongProjection(Neuron):
    def horizontal_projection(self, x, u):
        w_in, w_out = x
        a = ((u[0] * w_in).sum(-1) / w_in.square().sum(-1)
             - (u[1] * w_out).sum(-1) / w_out.square().sum(-1)) / 2
        a = a.unsqueeze(-1)
        return u[0] + a * w_in, u[1] - a * w_out          # the sign of a flipped


class WrongChristoffel(Neuron):
    def christoffel(self, x, u, v=None):
        gamma = reference.christoffel(self, x, u, v)
        return gamma[0], 0.5 * gamma[1]                     # half of the w_out term


@pytest.fixture(scope="module")
def neuron_metric():
    """The metric of a neuron with 2 incoming weights and 1 outgoing, written with sympy."""
    coords = sympy.symbols("a1 a2 b1", real=True)
    u = sympy.symbols("u1:4", real=True)
    v = sympy.symbols("v1:4", real=True)
    a1, a2, b1 = coords
    form = (u[0] * v[0] + u[1] * v[1]) / (a1**2 + a2**2) + u[2] * v[2] / b1**2
    return S.metric_from_bilinear(form, u, v), list(coords), [[a1, a2, -b1]]


def _failed(results):
    return sorted(r.name for r in results if not r.passed)


@pytest.mark.parametrize("cls", [Neuron, FastNeuron])
def test_a_correct_class_passes_every_operation(neuron_metric, cls) -> None:
    metric, coords, vertical = neuron_metric
    results = S.check_quotient(cls(point_shapes=[(2,), (1,)]), metric, coords, vertical)
    assert {r.name for r in results} == {
        "inner_vs_exact", "christoffel_vs_exact", "christoffel_quadratic_vs_exact",
        "vertical_vs_exact", "horizontal_projection_vs_exact", "vertical_projection_vs_exact",
        "gradient_vs_exact"}
    assert _failed(results) == []
    projection = next(r for r in results if r.name == "horizontal_projection_vs_exact")
    assert ("this class" in projection.detail) == (cls is FastNeuron)


def test_a_wrong_christoffel_is_named(neuron_metric) -> None:
    metric, coords, vertical = neuron_metric
    results = S.check_quotient(WrongChristoffel(point_shapes=[(2,), (1,)]), metric, coords,
                               vertical)
    assert _failed(results) == ["christoffel_quadratic_vs_exact", "christoffel_vs_exact"]


def test_a_wrong_projection_is_named(neuron_metric) -> None:
    metric, coords, vertical = neuron_metric
    results = S.check_quotient(WrongProjection(point_shapes=[(2,), (1,)]), metric, coords,
                               vertical)
    assert "horizontal_projection_vs_exact" in _failed(results)
    assert "christoffel_vs_exact" not in _failed(results)


def test_a_metric_that_is_not_the_classs_fails(neuron_metric) -> None:
    """A class whose inner differs from the metric written down: every row that uses it fails."""
    _, coords, vertical = neuron_metric
    euclidean = sympy.eye(3)
    results = S.check_quotient(Neuron(point_shapes=[(2,), (1,)]), euclidean, coords, vertical)
    assert "inner_vs_exact" in _failed(results)


def test_built_in_diagonal_mix_against_its_metric() -> None:
    u, v = sympy.symbols("u v", real=True)
    metric = sympy.diag(v**2, u**2)
    quotient = qs.DiagonalQuotient("mix", d=1)
    results = S.check_quotient(quotient, metric, [u, v], [[u, -v]], points=4, seed=3)
    assert _failed(results) == [], results


def test_bad_arguments_are_refused(neuron_metric) -> None:
    metric, coords, vertical = neuron_metric
    with pytest.raises(ValueError, match="point_shapes"):
        S.check_quotient(Neuron(), metric, coords, vertical)
    with pytest.raises(ValueError, match="coords has 3 symbols"):
        S.check_quotient(Neuron(point_shapes=[(3,), (1,)]), sympy.eye(3), coords, vertical)
    with pytest.raises(ValueError, match="generators"):
        S.check_quotient(Neuron(point_shapes=[(2,), (1,)]), metric, coords,
                         vertical + vertical)
    with pytest.raises(TypeError, match="SymmetryQuotient"):
        S.check_quotient(object(), metric, coords)
