"""``quotientsharp.core.checks.check_all`` refuses what is not a quotient, and names the defect
of a user's quotient that is wrong in one way."""

from __future__ import annotations

import pytest
import torch

import quotientsharp as qs
from tests.tiny_models import ReLUNeuronQuotient


def test_check_all_rejects_a_name():
    with pytest.raises(TypeError, match="SymmetryQuotient instance"):
        qs.checks.check_all("gl")


# ---------------------------------------------------------------- user quotients, one defect each
class _NotAnAction(ReLUNeuronQuotient):
    """Rescales by ``s(g) = g + (g - 1)^2``: the same orbits, the same derivative at the
    identity (``vertical`` agrees), an invariant metric, but ``s(g) s(h) != s(g h)``."""

    def act(self, x, g):
        s = g + (g - 1) ** 2
        return s * x[0], x[1] / s


class _AsymmetricInner(ReLUNeuronQuotient):
    def inner(self, x, u, v):
        return super().inner(x, u, v) + 0.3 * u[0][..., 0] * v[0][..., 1] / x[0].square().sum(-1)


def _failed(results):
    return {r.name for r in results if not r.passed}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_all_flags_a_map_that_is_not_a_group_action(seed, dtype):
    results = qs.checks.check_all(_NotAnAction(point_shapes=[(4,), (3,)]), seed=seed, dtype=dtype)
    assert "act_is_action" in _failed(results)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_contract_flags_a_map_that_is_not_a_group_action(seed):
    q = _NotAnAction()
    x = q.random_point((2,), shapes=[(4,), (3,)], dtype=torch.float64,
                       generator=torch.Generator().manual_seed(100 + seed))
    assert "act_is_action" in _failed(qs.checks.check_contract(q, x, seed=seed, group_scale=0.5))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_all_names_an_asymmetric_inner(seed):
    results = qs.checks.check_all(_AsymmetricInner(point_shapes=[(4,), (3,)]), seed=seed)
    assert "inner_symmetric" in _failed(results)


@pytest.mark.parametrize("quotient", [ReLUNeuronQuotient(point_shapes=[(4,), (3,)]),
                                      qs.GLQuotient("mix", n=5, m=4, h=3),
                                      qs.DiagonalQuotient("inv", d=3)],
                         ids=["user", "gl-mix", "diagonal-inv"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_true_action_and_a_symmetric_inner_pass(quotient, seed):
    results = {r.name: r for r in qs.checks.check_all(quotient, seed=seed)}
    assert results["act_is_action"].passed and results["inner_symmetric"].passed


class _StraightLineGeodesic(ReLUNeuronQuotient):
    """An ``exact`` geodesic that is the straight line ``x + t u``: not the geodesic of the
    metric, whose Christoffel symbols do not vanish."""

    def geodesic_exact(self, x, u, t=1.0, steps=64):
        return tuple(c + t * d for c, d in zip(x, u, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_check_all_flags_an_exact_geodesic_inconsistent_with_christoffel(seed, dtype):
    results = qs.checks.check_all(_StraightLineGeodesic(point_shapes=[(4,), (3,)]), seed=seed,
                                  dtype=dtype)
    assert "exact_geodesic_vs_ode" in _failed(results)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_closed_form_exact_geodesic_passes_in_float32(seed):
    results = {r.name: r for r in qs.checks.check_all(qs.GLQuotient("inv", n=5, m=4, h=3),
                                                      seed=seed, dtype=torch.float32)}
    assert results["exact_geodesic_vs_ode"].passed


class _UnraisedIndex(ReLUNeuronQuotient):
    """``raise_index`` that forgets the metric: returns the covector itself."""

    def raise_index(self, x, egrad):
        return tuple(egrad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1])
def test_check_all_flags_a_wrong_raise_index_as_check_contract_does(seed, dtype):
    q = _UnraisedIndex(point_shapes=[(4,), (3,)])
    assert "raise_index_vs_reference" in _failed(qs.checks.check_all(q, seed=seed, dtype=dtype))
    # its own seed: a point drawn with the contract's seed would equal the contract's vector u
    x = q.random_point((2,), dtype=torch.float64,
                       generator=torch.Generator().manual_seed(100 + seed))
    assert "raise_index_vs_reference" in _failed(qs.checks.check_contract(q, x, seed=seed))


@pytest.mark.parametrize("seed", [0, 1])
def test_closed_form_raise_index_passes(seed):
    results = {r.name: r for r in qs.checks.check_all(qs.GLQuotient("mix", n=5, m=4, h=3),
                                                      seed=seed)}
    assert results["raise_index_vs_reference"].passed
    assert not results["raise_index_vs_reference"].no_override
