"""The contract of a user's quotient is checked before sharpness() measures with it (issue 40).

Each broken quotient below measured a silent wrong value before: the binding check tested the
model's invariance only. Now the first batch runs ``check_contract`` at the binding's point and
refuses, naming the binding and the failed property; a correct quotient measures as before.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.core.checks import check_contract
from quotientsharp.models import symmetry_check
from tests.tiny_models import ReLUNeuronQuotient

ReLUNeuron = ReLUNeuronQuotient


def _coefficient(x, u):
    """The vertical coefficient of ``u`` (metric-orthogonal), ``shape=[..., 1]``."""
    w_in, w_out = x
    a = ((u[0] * w_in).sum(-1) / w_in.square().sum(-1)
         - (u[1] * w_out).sum(-1) / w_out.square().sum(-1)) / 2
    return a.unsqueeze(-1)


class WrongVertical(ReLUNeuron):
    def vertical(self, x, a):
        return 2 * a * x[0], -a * x[1]


class AsymmetricInner(ReLUNeuron):
    def inner(self, x, u, v):
        # invariant, but <u, v> != <v, u>
        cross = u[0][..., 0] * v[1][..., 0] / (x[0].norm(dim=-1) * x[1].norm(dim=-1))
        return super().inner(x, u, v) + 0.3 * cross


class EuclideanInner(ReLUNeuron):
    def inner(self, x, u, v):
        return (u[0] * v[0]).sum(-1) + (u[1] * v[1]).sum(-1)


class WrongChristoffel(ReLUNeuron):
    def christoffel(self, x, u, v=None):
        v = u if v is None else v
        # forgets the term (u . v) w of the closed form
        return tuple(-((w * b).sum(-1, keepdim=True) * a + (w * a).sum(-1, keepdim=True) * b)
                     / w.square().sum(-1, keepdim=True) for w, a, b in zip(x, u, v, strict=True))


class WrongGradient(ReLUNeuron):
    def euclidean_to_riemannian_gradient(self, x, egrad):
        # forgets to raise the index: the Euclidean gradient, projected
        return self.horizontal_projection(x, egrad)


class ObliqueProjection(ReLUNeuron):
    def horizontal_projection(self, x, u):
        # idempotent and horizontal (the structure check passes), but not metric-orthogonal
        a = _coefficient(x, u)
        return u[0], u[1] + 2 * a * x[1]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).double()


def _binding(quotient: qs.SymmetryQuotient) -> qs.QuotientBinding:
    def to_point(p):
        return torch.cat([p["0.weight"], p["0.bias"][:, None]], dim=1), p["2.weight"].T

    def from_point(x):
        return {"0.weight": x[0][:, :-1], "0.bias": x[0][:, -1], "2.weight": x[1].T}

    return qs.QuotientBinding(quotient, ["0.weight", "0.bias", "2.weight"], to_point,
                              from_point, folded=1, name="relu units")


def _batches() -> list:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 5, dtype=torch.float64, generator=generator),
             torch.randint(0, 3, (16,), generator=generator))]


def _measure(quotient: qs.SymmetryQuotient) -> float:
    return qs.sharpness(_mlp(), _batches(), measure="geodesic", rho=0.05, order=2, n_iter=3,
                        symmetries=_binding(quotient), progress=False).value


BROKEN = [(WrongVertical, "vertical_is_orbit_velocity"),
          (AsymmetricInner, "inner_symmetric"),
          (EuclideanInner, "metric_invariance"),
          (WrongChristoffel, "christoffel_vs_reference"),
          (WrongGradient, "gradient_vs_reference"),
          (ObliqueProjection, "horizontal_projection_vs_reference")]


@pytest.mark.parametrize(("cls", "prop"), BROKEN, ids=[c.__name__ for c, _ in BROKEN])
def test_a_broken_user_quotient_is_refused_naming_binding_and_property(cls, prop, monkeypatch):
    with pytest.raises(qs.SymmetryCheckError) as info:
        _measure(cls())
    message = str(info.value)
    assert "binding 'relu units'" in message and prop in message and cls.__name__ in message
    # without the contract check it measured a value, silently (all but the oblique
    # projection's, which an invariant loss's gradient hardly sees, unlike the correct one's)
    monkeypatch.setattr(symmetry_check, "builtin_quotient", lambda quotient: True)
    silent = _measure(cls())
    if cls is not ObliqueProjection:
        assert abs(silent - _measure(ReLUNeuron())) > 1e-6 * abs(silent)


def test_a_correct_user_quotient_measures_the_same_value(monkeypatch):
    checked = _measure(ReLUNeuron())
    monkeypatch.setattr(symmetry_check, "builtin_quotient", lambda quotient: True)
    assert _measure(ReLUNeuron()) == checked


def test_the_contract_passes_for_a_correct_closed_form_at_a_real_point():
    class Fast(ReLUNeuron):
        def horizontal_projection(self, x, u):
            a = _coefficient(x, u)
            return u[0] - a * x[0], u[1] + a * x[1]

    x = tuple(t.double() for t in _binding(Fast()).point(dict(_mlp().named_parameters())))
    results = check_contract(Fast(), tuple(t.detach() for t in x))
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    assert {"horizontal_projection_vs_reference", "christoffel_vs_reference",
            "exact_geodesic_vs_ode"} <= {r.name for r in results}


def test_builtin_quotients_skip_the_contract():
    assert symmetry_check.builtin_quotient(qs.GLQuotient("mix"))
    assert not symmetry_check.builtin_quotient(ReLUNeuron())
    assert not symmetry_check.builtin_quotient(
        qs.ProductQuotient([qs.GLQuotient("mix"), ReLUNeuron()]))


class NotAnAction(ReLUNeuron):
    """The same orbits and derivative at the identity, but ``s(g) s(h) != s(g h)``."""

    def act(self, x, g):
        s = g + (g - 1) ** 2
        return s * x[0], x[1] / s


def test_a_map_that_is_not_a_group_action_is_refused():
    with pytest.raises(qs.SymmetryCheckError, match=r"binding 'relu units': NotAnAction fails "
                                                    r"act_is_action at the binding's point"):
        _measure(NotAnAction())


class InPlaceProjection(ReLUNeuron):
    def horizontal_projection(self, x, u):
        # the right projection, computed by writing into the caller's tangent vector
        a = _coefficient(x, u)
        u[0].sub_(a * x[0])
        u[1].add_(a * x[1])
        return u[0], u[1]


class RescalesPoint(ReLUNeuron):
    def christoffel(self, x, u, v=None):
        # a 'harmless' normalisation in place: x is a view of the model's parameters
        x[1].mul_(1.0 + 1e-9)
        return super().christoffel(x, u, v)


class Float64Gradient(ReLUNeuron):
    def euclidean_to_riemannian_gradient(self, x, egrad):
        return tuple(t.double() for t in super().euclidean_to_riemannian_gradient(x, egrad))


@pytest.mark.parametrize(("cls", "argument", "method"),
                         [(InPlaceProjection, "u", "horizontal_projection"),
                          (RescalesPoint, "x", "christoffel")])
def test_a_method_writing_into_its_arguments_is_refused_and_the_model_kept(cls, argument,
                                                                          method):
    model = _mlp()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(qs.SymmetryCheckError) as info:
        qs.sharpness(model, _batches(), measure="geodesic", rho=0.05, order=2, n_iter=3,
                     symmetries=_binding(cls()), progress=False)
    message = str(info.value)
    assert f"{cls.__name__}.{method} changed its argument {argument} in place" in message
    assert "relu units" in message
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_a_gradient_of_another_dtype_is_refused_naming_the_method():
    model = _mlp().float()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 5, generator=generator), torch.randint(0, 3, (16,),
                                                                       generator=generator))]
    with pytest.raises(qs.SymmetryCheckError,
                       match=r"Float64Gradient\.euclidean_to_riemannian_gradient returned "
                             r"component 0 of dtype torch\.float64, expected the point's "
                             r"torch\.float32"):
        qs.sharpness(model, batches, measure="geodesic", rho=0.05, order=2, n_iter=3,
                     symmetries=_binding(Float64Gradient()), progress=False)


class Order2Exact(ReLUNeuron):
    def geodesic_exact(self, x, u, t=1.0, steps=16):
        # the order-2 expansion offered as the exact geodesic: right to O(|u|^3) only
        gamma = self.christoffel(x, u)
        return tuple(p + t * a - 0.5 * t * t * c for p, a, c in zip(x, u, gamma, strict=True))


def test_an_exact_geodesic_right_only_to_second_order_is_refused(monkeypatch):
    def measure(quotient):
        return qs.sharpness(_mlp(), _batches(), measure="geodesic", rho=0.05, order="exact",
                            n_iter=3, symmetries=_binding(quotient), progress=False).value

    with pytest.raises(qs.SymmetryCheckError, match="Order2Exact fails exact_geodesic_vs_ode"):
        measure(Order2Exact())
    # unchecked, it measures the order-2 path's value as the exact one's, silently
    monkeypatch.setattr(symmetry_check, "builtin_quotient", lambda quotient: True)
    assert measure(Order2Exact()) != measure(ReLUNeuron())
