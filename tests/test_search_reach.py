"""The reach search (``reach=``), its estimate, its warning, and the locality of a value.

References are independent of the code under test: the exact maximum of a quadratic over a
ball (a trust-region subproblem, solved by bisection), the kept perturbations of the engine's
own result (``keep_perturbations``), and the Christoffel contraction by autograd from the
metric alone (:func:`quotientsharp.core.reference.christoffel`).
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

import quotientsharp as qs
from quotientsharp.core import reference
from quotientsharp.engine.ball import GeodesicBall
from quotientsharp.engine.blocks import locality
from quotientsharp.engine.result import local_radius
from quotientsharp.engine.solver import SearchSettings, reach_estimate

DUMMY = [(torch.zeros(1), torch.zeros(1))]


class QuadraticLoss(torch.nn.Module):
    """``f(theta) = theta^T A theta / 2 + b^T theta`` as the model's output."""

    def __init__(self, A: torch.Tensor, b: torch.Tensor, theta: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("A", A)
        self.register_buffer("b", b)
        self.theta = torch.nn.Parameter(theta.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.theta @ self.A @ self.theta + self.b @ self.theta


class TwoModes(torch.nn.Module):
    """``f(theta) = theta_2 + 5 theta_1^2 - 2 theta_1^3`` at ``theta = 0``, as the output.

    The gradient at ``theta`` is ``e_2``: an ascent from ``xi = 0`` stays on the line
    ``theta_1 = 0`` (exactly: the gradient has no ``e_1`` part there) and stops at ``rho e_2``,
    a saddle of ``f`` on the sphere. The maxima lie on the sphere towards ``-e_1`` (the higher)
    and ``+e_1``; random starts reach them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.theta
        return b + 5 * a ** 2 - 2 * a ** 3


def _worst_case(model: torch.nn.Module, rho: float, **options: object) -> qs.SharpnessResult:
    return qs.sharpness(model, DUMMY, measure="worst_case", rho=rho,
                        loss=lambda output, target: output, progress=False, **options)


def _two_modes_maximum(rho: float) -> float:
    """The maximum of :class:`TwoModes` over the ball, by a dense search over the sphere (no
    interior critical point: the gradient's second entry is 1) refined by bisection."""
    phi = torch.linspace(-math.pi, math.pi, 200001, dtype=torch.float64)
    a, b = rho * torch.sin(phi), rho * torch.cos(phi)
    return float((b + 5 * a ** 2 - 2 * a ** 3).max())


def _exact(model: QuadraticLoss, rho: float) -> float:
    gradient = model.A @ model.theta + model.b
    return qs.engine.trust_region_maximum(model.A, gradient, rho).value


def _tiny_transformer(seed: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A float64 transformer layer with a linear head (two attention heads: GL pairs), and a
    batch of 4 sequences of 3 tokens."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True,
                                                                 dropout=0.0),
                                torch.nn.Flatten(), torch.nn.Linear(24, 3)).double()
    return model, (torch.randn(4, 3, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))


# ---------------------------------------------------------------------------- the estimate
@pytest.mark.parametrize("seed", range(5))
def test_reach_estimate_is_second_over_best(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    values = (torch.rand(6, generator=generator, dtype=torch.float64) + 0.1).tolist()
    ordered = sorted(values)
    for permutation in itertools.islice(itertools.permutations(values), 20):
        assert reach_estimate(permutation) == ordered[-2] / ordered[-1]
    assert reach_estimate([values[0], values[0]]) == 1.0
    assert reach_estimate([ordered[-1], -1.0]) == 0.0
    # chains that all stayed at theta confirm nothing
    assert reach_estimate([0.0, 0.0]) == 0.0 and reach_estimate([-1.0, -2.0]) == 0.0


@pytest.mark.parametrize("key, value", [("chains", 1), ("min_chains", 1), ("continuations", -1),
                                        ("target", 0.0), ("target", 1.5), ("stall", 1.0),
                                        ("chains", True), ("stall", "x")])
def test_search_settings_refuse_vacuous_values(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"reach: {key}"):
        SearchSettings(**{key: value})


@pytest.mark.parametrize("option, error", [({"chain": 3}, ValueError), ("yes", TypeError),
                                           (None, TypeError), ({"chains": 1}, ValueError)])
def test_reach_option_is_checked(option: object, error: type[Exception]) -> None:
    model = TwoModes()
    with pytest.raises(error, match="reach"):
        _worst_case(model, 0.5, reach=option)


# ---------------------------------------------------------------------------- the search
@pytest.mark.parametrize("rho", [0.3, 0.5, 1.0])
def test_search_finds_the_higher_mode_and_confirms_it(rho: float) -> None:
    model = TwoModes()
    exact = _two_modes_maximum(rho)
    single = _worst_case(model, rho, reach=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        searched = _worst_case(model, rho, reach={"chains": 8})
    assert single.reach == [None] and single.chains == []
    # the single ascent stops at the saddle rho e_2; the search finds the maximum
    assert single.value == pytest.approx(rho, rel=1e-9) and single.value < 0.9 * exact
    assert searched.value == pytest.approx(exact, rel=1e-5)
    assert searched.reach[0] >= 0.99
    assert searched.chains[0][0] == pytest.approx(single.value, rel=1e-9)
    assert searched.evaluations[0] == len(searched.traces[0])
    assert searched.traces[0][-1] == searched.value


def test_an_unconfirmed_value_warns_and_names_the_batch() -> None:
    with pytest.warns(qs.ReachWarning, match=r"batch 0: reach estimate 0\.\d+"):
        result = _worst_case(TwoModes(), 0.5, reach={"chains": 2, "continuations": 0})
    assert result.reach[0] < 0.99
    assert result.reach[0] == pytest.approx(min(result.chains[0]) / max(result.chains[0]))
    assert "reach >=" in result.summary()


@pytest.mark.parametrize("seed", range(3))
def test_no_warning_where_the_default_reaches_the_maximum(seed: int) -> None:
    # a convex quadratic with a strong gradient: one maximum, reached by every chain
    generator = torch.Generator().manual_seed(seed)
    M = torch.randn(5, 5, generator=generator, dtype=torch.float64)
    A = M @ M.T / 5
    b = 10 * torch.randn(5, generator=generator, dtype=torch.float64)
    model = QuadraticLoss(A, b, torch.zeros(5, dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = _worst_case(model, 0.3)
    assert result.value == pytest.approx(_exact(model, 0.3), rel=1e-6)
    assert result.reach[0] >= 0.99 and len(result.chains[0]) == 2


def test_first_chain_is_the_single_ascent_bit_for_bit() -> None:
    single = _worst_case(TwoModes(), 0.5, reach=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        searched = _worst_case(TwoModes(), 0.5, reach={"continuations": 0, "chains": 3})
    assert searched.chains[0][0] == single.value
    assert searched.traces[0][:len(single.traces[0])] == single.traces[0]


def test_search_is_reproducible_and_follows_the_seed() -> None:
    options = {"reach": {"chains": 3, "min_chains": 3}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        first = _worst_case(TwoModes(), 0.5, seed=3, **options)
        again = _worst_case(TwoModes(), 0.5, seed=3, **options)
        other = _worst_case(TwoModes(), 0.5, seed=4, **options)
    assert first.chains == again.chains and first.value == again.value
    assert first.chains[0][1:] != other.chains[0][1:]


def test_continuation_runs_while_the_ascent_climbs() -> None:
    # a tiny first step: the 5-step ascent along e_2 is still climbing at its end
    single = _worst_case(TwoModes(), 1.0, reach=False, n_iter=5, eta0=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        searched = _worst_case(TwoModes(), 1.0, reach={"chains": 2, "continuations": 3},
                               n_iter=5, eta0=1e-3)
        stopped = _worst_case(TwoModes(), 1.0, reach={"chains": 2, "continuations": 0},
                              n_iter=5, eta0=1e-3)
    assert searched.chains[0][0] > single.value == stopped.chains[0][0]
    assert searched.evaluations[0] > stopped.evaluations[0]


def test_a_chain_still_climbing_when_its_continuations_end_lowers_the_reach() -> None:
    # steps of 1e-3 along e_2, where the value is the distance gone: every run climbs to its
    # end, and what the last run added is what the next one would add
    options = dict(n_iter=5, eta0=1e-3, reach={"chains": 2, "continuations": 1})
    with pytest.warns(qs.ReachWarning, match="batch 0: reach estimate"):
        result = _worst_case(TwoModes(), 1.0, **options)
    # the first chain went 5 + 5 steps of about 1e-3 and 2e-3 up e_2: its last run added
    # about 2/3 of its value, so the reach is at most about 1/3, whatever the other chain did
    first = result.chains[0][0]
    assert 0.01 < first < 0.03
    assert result.reach[0] <= 0.5
    converged = _worst_case(TwoModes(), 1.0, reach={"chains": 8})
    assert converged.reach[0] >= 0.99


# ---------------------------------------------------------------------------- locality
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("measure, options", [("adaptive", {}), ("worst_case", {}),
                                              ("geodesic", {"metric": "mix"}),
                                              ("geodesic", {"metric": "inv"})])
def test_displacement_matches_the_kept_perturbation(seed: int, measure: str,
                                                    options: dict[str, object]) -> None:
    model, batch = _tiny_transformer(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        result = qs.sharpness(model, [batch], measure=measure, rho=0.2, n_iter=4,
                              keep_perturbations=True, progress=False, **options)
    assert result.perturbations is not None
    theta = {name: p.detach() for name, p in model.named_parameters()}
    where = result.locality[0]
    if measure == "worst_case":
        # an absolute ball: the parameters are judged together, as the ball measures them
        deltas = result.perturbations[0]
        together = (torch.cat([d.reshape(-1) for d in deltas.values()]).norm()
                    / torch.cat([theta[n].reshape(-1) for n in deltas]).norm())
        assert where["parameter"] == "all parameters together"
        assert where["displacement"] == pytest.approx(float(together), rel=1e-9)
        assert where["local"] == (float(together) <= 1)
        return
    # the attention weights and biases are the heads' GL factors, judged as factors; the
    # output projection's bias is added after the heads are summed, so it is outside them
    inside = {"0.self_attn.in_proj_weight", "0.self_attn.in_proj_bias",
              "0.self_attn.out_proj.weight"} if measure == "geodesic" else set()
    ratios = {name: float(delta.norm() / theta[name].norm())
              for name, delta in result.perturbations[0].items()
              if theta[name].norm() > 0 and name not in inside}
    worst = max(ratios, key=ratios.__getitem__)
    assert where["parameter"] == worst
    assert where["displacement"] == pytest.approx(ratios[worst], rel=1e-9)
    if measure == "adaptive":
        # ||delta_t|| <= rho max |w_t| <= rho ||w_t||: the adaptive ball moves no tensor more
        assert where["displacement"] <= 0.2 * (1 + 1e-12)
        assert where["second_order"] is None and where["local"]
    else:
        assert where["second_order"] is not None and where["factor"].endswith(("0", "1"))
        assert where["local"] == (max(where["displacement"], where["factor_displacement"]) <= 1
                                  and where["second_order"] <= 0.5)


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("seed", range(3))
def test_second_order_ratio_against_autograd_christoffel(metric: str, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    quotient = qs.GLQuotient(metric)
    G = torch.randn(2, 5, 3, generator=generator, dtype=torch.float64)
    H = torch.randn(2, 4, 3, generator=generator, dtype=torch.float64)
    G[1] *= 1e-2                                    # a small factor: a curved path there
    frozen = quotient.at((G, H))
    xi = frozen.horizontal_projection(tuple(0.1 * torch.randn(t.shape, generator=generator,
                                                              dtype=torch.float64)
                                            for t in (G, H)))
    ball = GeodesicBall(frozen, 10.0, order=2)

    class Pairs:
        def updates(self, point: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
            return {"G": point[0], "H": point[1]}

    where = locality(ball, Pairs(), [], {"G": G, "H": H}, xi)
    gamma = reference.christoffel(quotient, (G, H), xi)
    # a factor's size in the metric, by its definition (eps = 0): mix reads dG through the
    # partner, ||dG H^T||; inv through the factor's own Gram, ||dG (G^T G)^{-1/2}||
    grams = [f.mT @ f for f in (G, H)]
    weights = ([grams[1], grams[0]] if metric == "mix" else
               [torch.linalg.inv(grams[0]), torch.linalg.inv(grams[1])])

    def size(tensor: torch.Tensor, factor: int, head: int) -> float:
        return float(torch.einsum("ij,jk,ik->", tensor[head], weights[factor][head],
                                  tensor[head]).sqrt())

    expected = max(size(0.5 * gamma[f], f, i) / size(xi[f], f, i)
                   for f in range(2) for i in range(2))
    assert where.second_order == pytest.approx(expected, rel=1e-8)
    moved = ball.point(xi)
    assert where.factor_displacement == pytest.approx(
        max(size(moved[f] - x, f, i) / size(x, f, i) for f, x in enumerate((G, H))
            for i in range(2)), rel=1e-10)
    assert where.displacement == pytest.approx(
        max(float((m - b).norm() / b.norm()) for m, b in zip(moved, (G, H), strict=True)),
        rel=1e-10)
    assert where.local == (max(where.displacement, where.factor_displacement) <= 1.0
                           and where.second_order <= 0.5)


@pytest.mark.parametrize("metric", ["mix", "inv"])
@pytest.mark.parametrize("seed, scale", [(0, 3.0), (1, 0.2), (2, 1.0)])
def test_locality_does_not_change_under_the_group(metric: str, seed: int, scale: float) -> None:
    # the model after a random group element on every head pair (condition up to
    # reparametrize's cap) is the same network, its ball the same set of networks: the value and
    # how local its best perturbation is must not tell the two apart
    import copy

    from quotientsharp.models import find_symmetries, reparametrize
    from tests.tiny_models import tiny_bert

    model = tiny_bert(seed).double()
    generator = torch.Generator().manual_seed(10 + seed)
    batches = [{"input_ids": torch.randint(1, 30, (4, 6), generator=generator),
                "labels": torch.randint(0, 3, (4,), generator=generator)} for _ in range(2)]
    moved = copy.deepcopy(model)
    params = reparametrize(model, find_symmetries(model), scale=scale,
                           generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for name, parameter in moved.named_parameters():
            parameter.copy_(params[name])
    options = dict(measure="geodesic", metric=metric, rho=0.3, n_iter=6, seed=seed,
                   progress=False, reach=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        before, after = qs.sharpness(model, batches, **options), qs.sharpness(moved, batches,
                                                                              **options)
    assert after.value == pytest.approx(before.value, rel=1e-10)
    for a, b in zip(before.locality, after.locality, strict=True):
        for key in ("factor_displacement", "second_order"):
            assert b[key] == pytest.approx(a[key], rel=1e-8), key
        assert (b["factor"], b["second_order_factor"], b["local"]) == (
            a["factor"], a["second_order_factor"], a["local"])
    # the control: the factors' Frobenius sizes do change (what locality read before)
    name = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.allclose(params[name].norm(), dict(model.named_parameters())[name].norm(),
                              rtol=1e-3)


def test_a_non_local_ball_warns() -> None:
    model, batch = _tiny_transformer(0)
    with torch.no_grad():
        attention = model[0].self_attn
        attention.in_proj_weight[16:] *= 1e-3      # small value factors: the mix ball is wide
    with pytest.warns(qs.ReachWarning, match="batch 0: the ball is not local"):
        result = qs.sharpness(model, [batch], measure="geodesic", metric="mix", rho=0.3,
                              n_iter=4, progress=False, reach=False)
    assert result.local is False and not result.locality[0]["local"]
    assert result.locality[0]["second_order"] > 0.5 or result.locality[0]["displacement"] > 1
    assert math.isfinite(result.value)


def test_a_non_local_ball_names_a_radius_where_its_direction_is_local() -> None:
    model, batch = _tiny_transformer(0)
    with torch.no_grad():
        model[0].self_attn.in_proj_weight[16:] *= 1e-3
    options = dict(measure="geodesic", metric="mix", n_iter=4, progress=False, reach=False)
    with pytest.warns(qs.ReachWarning) as caught:
        wide = qs.sharpness(model, [batch], rho=0.3, **options)
    radius = local_radius(wide.locality[0], 0.3)
    assert radius is not None and radius < 0.3
    assert any(f"the ball should be local at about rho = {radius:.3g}" in str(w.message)
               for w in caught)
    # measured again there, the ball is local (on this model the maximiser keeps its head)
    with warnings.catch_warnings():
        warnings.simplefilter("error", qs.ReachWarning)
        again = qs.sharpness(model, [batch], rho=radius, **options)
    assert again.locality[0]["local"]
    # a ball that is local suggests nothing smaller
    assert local_radius(again.locality[0], radius) == radius


@pytest.mark.parametrize("given, taken", [(2.0, 2), (1.0, 1)])
def test_an_integral_float_order_is_that_order(given: float, taken: int) -> None:
    # 0.1 accepted order=2.0; 0.2 refused it with no changelog line (campaign 2)
    model, batch = _tiny_transformer(0)
    options = dict(measure="geodesic", rho=0.05, n_iter=3, progress=False, reach=False)
    as_float = qs.sharpness(model, [batch], order=given, **options)
    as_int = qs.sharpness(model, [batch], order=taken, **options)
    assert as_float.per_batch == as_int.per_batch
    assert as_float.settings["order"] == taken and isinstance(as_float.settings["order"], int)
    for wrong in (2.5, 3.0, float("nan")):
        with pytest.raises(ValueError, match="order must be 1, 2 or 'exact'"):
            qs.sharpness(model, [batch], order=wrong, **options)


@pytest.mark.parametrize("n_iter", [1, 2, 3])
def test_a_short_run_still_climbing_is_continued_and_lowers_the_reach(n_iter: int) -> None:
    # runs of 1 to 3 steps have a last 30 % of at most one step; steps of 1e-3 along e_2 climb
    # at every step, so a run that ends climbing must be continued, and a chain whose
    # continuations ran out must not be confirmed
    single = _worst_case(TwoModes(), 1.0, reach=False, n_iter=n_iter, eta0=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        searched = _worst_case(TwoModes(), 1.0, reach={"chains": 2, "continuations": 2},
                               n_iter=n_iter, eta0=1e-3)
    assert searched.chains[0][0] > single.value
    with pytest.warns(qs.ReachWarning, match="batch 0: reach estimate"):
        capped = _worst_case(TwoModes(), 1.0, reach={"chains": 2, "continuations": 0},
                             n_iter=n_iter, eta0=1e-3)
    assert capped.reach[0] < 0.99


def test_chains_that_find_no_increase_confirm_nothing_and_are_flagged() -> None:
    # theta = 0 is the maximum of -|theta|^2 / 2: every chain stays at theta, the value is 0,
    # and the result says that no chain found an increase instead of confirming the 0
    model = QuadraticLoss(-torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
                          torch.zeros(3, dtype=torch.float64))
    with pytest.warns(qs.ReachWarning, match="batch 0: no chain found a loss increase"):
        result = _worst_case(model, 0.5)
    assert result.value <= 0 and result.reach == [0.0]


# ---------------------------------------------------------------------------- continuation in rho
@pytest.mark.parametrize("ladder, error", [([0.0, 0.5], ValueError), ([0.5, 1.0], ValueError),
                                           ([0.5, 0.3], ValueError), ([0.5, 0.5], ValueError),
                                           ("0.5", TypeError), (0.5, TypeError)])
def test_ladder_must_be_increasing_shares_of_rho(ladder: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="reach: ladder"):
        SearchSettings(ladder=ladder)  # type: ignore[arg-type]


@pytest.mark.parametrize("measure", ["worst_case", "adaptive"])
@pytest.mark.parametrize("seed", range(2))
def test_the_ladder_chain_climbs_to_the_maximum_and_costs_its_rungs(measure: str,
                                                                    seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    M = torch.randn(5, 5, generator=generator, dtype=torch.float64)
    b = 10 * torch.randn(5, generator=generator, dtype=torch.float64)
    theta = torch.randn(5, generator=generator, dtype=torch.float64)
    model = QuadraticLoss(M @ M.T / 5, b, theta)
    n_iter, rho = 10, 0.3
    options: dict[str, object] = dict(measure=measure, rho=rho, n_iter=n_iter,
                                      loss=lambda output, target: output, progress=False)
    single = qs.sharpness(model, DUMMY, reach=False, **options)
    ladder = {"chains": 2, "continuations": 0, "ladder": [0.1, 0.5]}
    first = qs.sharpness(model, DUMMY, seed=3, reach=ladder, **options)
    other = qs.sharpness(model, DUMMY, seed=4, reach=ladder, **options)
    # the first chain is the single ascent; the second ascends at 0.1 rho, then 0.5 rho, then
    # rho, each from the last best point scaled up: four runs, none of them random
    assert first.chains[0][0] == single.value
    assert first.evaluations[0] == 4 * (n_iter + 1)
    assert first.chains == other.chains
    assert first.chains[0][1] == pytest.approx(first.chains[0][0], rel=1e-6)
    if measure == "worst_case":
        assert first.value == pytest.approx(_exact(model, rho), rel=1e-6)


@pytest.mark.parametrize("metric", ["mix", "inv"])
def test_the_ladder_chain_on_a_geodesic_ball(metric: str) -> None:
    model, batch = _tiny_transformer(0)
    options: dict[str, object] = dict(measure="geodesic", metric=metric, rho=0.2, n_iter=4,
                                      progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        single = qs.sharpness(model, [batch], reach=False, **options)
        searched = qs.sharpness(model, [batch], reach={"chains": 2, "continuations": 0,
                                                       "ladder": [0.25]}, **options)
    assert searched.chains[0][0] == single.value
    assert searched.evaluations[0] == 3 * 5
    assert searched.value == max(searched.chains[0]) and searched.chains[0][1] > 0
    assert searched.settings["reach"]["ladder"] == (0.25,)


@pytest.mark.parametrize("seed", range(3))
def test_a_ball_at_another_radius_shares_its_point_and_clips_to_the_new_radius(
        seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    G = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    H = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    ball = GeodesicBall(qs.GLQuotient("mix").at((G, H)), 0.4, order=2)
    smaller = ball.with_radius(0.1)
    xi = ball.clip(ball.random_start(generator))
    far = tuple(t * (4.0 / float(ball.norm(xi))) for t in xi)      # norm 4: outside both
    assert smaller.frozen is ball.frozen and smaller.radius == 0.1 and ball.radius == 0.4
    assert float(smaller.norm(smaller.clip(far))) == pytest.approx(0.1, rel=1e-12)
    assert float(ball.norm(ball.clip(far))) == pytest.approx(0.4, rel=1e-12)
    base = (torch.randn(4, 3, generator=generator, dtype=torch.float64),)
    scale = (base[0].abs(),)
    box = qs.engine.ball.BoxGeometry(base, scale, 0.4)
    tight = box.with_radius(0.1)
    clipped = tight.clip(tuple(10 * s for s in scale))
    assert torch.equal(clipped[0], 0.1 * scale[0])
    assert torch.equal(box.clip(tuple(10 * s for s in scale))[0], 0.4 * scale[0])


@pytest.mark.parametrize("measure, options", [("geodesic", {"metric": "inv"}),
                                              ("worst_case", {})])
def test_a_tiny_bias_moving_far_from_itself_does_not_make_a_ball_non_local(
        measure: str, options: dict[str, object]) -> None:
    # biases that start at zero (ViT, DistilBERT, a classifier fine-tuned briefly) have tiny
    # norms: under the inv ball a bias row moves with its head's factor, under the worst-case
    # ball by up to rho itself; neither is a neighbourhood lost, and a warning that fires on
    # every such model would be a warning users learn to ignore
    model, batch = _tiny_transformer(0)
    with torch.no_grad():
        model[0].self_attn.in_proj_bias.mul_(1e-4)
        model[2].bias.mul_(1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", qs.ReachWarning)
        result = qs.sharpness(model, [batch], measure=measure, rho=0.3, n_iter=4,
                              keep_perturbations=True, progress=False, **options)
    assert result.perturbations is not None
    theta = {name: p.detach() for name, p in model.named_parameters()}
    moved = {name: float(d.norm() / theta[name].norm())
             for name, d in result.perturbations[0].items()}
    tiny = "0.self_attn.in_proj_bias" if measure == "geodesic" else "2.bias"
    assert moved[tiny] > 10                     # far from itself
    assert result.local and result.locality[0]["local"]


def test_a_worst_case_ball_larger_than_the_model_is_not_local() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).double()
    batch = (torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,)))
    rho = 10 * float(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).norm())
    with pytest.warns(qs.ReachWarning, match="the parameters together move by"):
        result = qs.sharpness(model, [batch], measure="worst_case", rho=rho, n_iter=4,
                              progress=False, reach=False)
    assert result.locality[0]["displacement"] == pytest.approx(10, rel=1e-6)
    assert result.local is False



@pytest.mark.parametrize("seed", range(3))
def test_a_tensor_of_norm_zero_that_moves_makes_the_ball_non_local(seed: int) -> None:
    # under other_metric="euclidean" a zero bias moves by about rho: by more than any multiple
    # of its own norm, which a ratio read as 0 (0 / 0 taken for "did not move") hid
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(),
                                torch.nn.Linear(6, 3)).double()
    with torch.no_grad():
        model[2].bias.zero_()
    batch = (torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.NoSymmetryWarning)
        with pytest.warns(qs.ReachWarning, match="parameter 2.bias moves by a ratio that is "
                                                 "not finite"):
            moved = qs.sharpness(model, [batch], measure="geodesic", rho=0.05, n_iter=3,
                                 other_metric="euclidean", keep_perturbations=True,
                                 progress=False, reach=False)
        assert moved.perturbations is not None
        assert float(moved.perturbations[0]["2.bias"].norm()) > 0
        assert moved.locality[0]["parameter"] == "2.bias"
        assert moved.locality[0]["displacement"] is None and moved.local is False
        # the adaptive ball keeps a zero weight where it is: 0 / 0 still counts as not moved
        kept = qs.sharpness(model, [batch], measure="geodesic", rho=0.05, n_iter=3,
                            keep_perturbations=True, progress=False, reach=False)
    assert kept.perturbations is not None
    assert float(kept.perturbations[0]["2.bias"].norm()) == 0
    assert kept.locality[0]["parameter"] != "2.bias" and kept.local is True


# ---------------------------------------------------------------------------- why the reach is low
def _agreement(chains: list[float | None]) -> float:
    """Second-best chain over the best, from the chains with a value (0 with fewer than 2)."""
    valued = sorted((c for c in chains if c is not None), reverse=True)
    return max(valued[1], 0.0) / valued[0] if len(valued) > 1 and valued[0] > 0 else 0.0


@pytest.mark.parametrize("seed", range(3))
def test_the_note_says_the_best_chain_was_still_climbing_when_the_chains_agree(
        seed: int) -> None:
    # one step per run and no continuation: each chain ends climbing, and two chains that
    # agree do not make the best converged
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    batch = (torch.randn(6, 4), torch.randint(0, 3, (6,)))
    with pytest.warns(qs.ReachWarning):
        result = qs.sharpness(model, [batch], measure="adaptive", rho=0.1, n_iter=1,
                              progress=False, reach={"chains": 2, "continuations": 0})
    chains, shortfalls = result.chains[0], result.chain_shortfalls[0]
    best = max(range(len(chains)), key=lambda i: chains[i])
    agreement = _agreement(chains)
    assert agreement >= 0.99 and shortfalls[best] > 0.01
    assert result.reach[0] == pytest.approx(min(agreement, 1 - shortfalls[best]), abs=1e-12)
    (note,) = result.shortfalls()
    assert (f"the best chain (chain {best}) was still climbing when its continuations ran out: "
            f"its last run added {100 * shortfalls[best]:.3g} % of its value") in note
    assert "disagree" not in note and "not confirmed" not in note


def test_the_note_says_the_chains_disagree_where_they_do() -> None:
    with pytest.warns(qs.ReachWarning):
        result = _worst_case(TwoModes(), 0.5, reach={"chains": 2, "continuations": 0})
    agreement = _agreement(result.chains[0])
    assert agreement < 0.99
    (note,) = result.shortfalls()
    # a share of the best, cut (not rounded) to three decimals: it never prints higher
    shown = f"{math.floor(agreement * 1000) / 1000:.3f}"
    assert f"the chains disagree: the second best reached {shown} of the best" in note
    assert "still climbing" not in note


class HalfNaN(torch.nn.Module):
    """``f(theta) = theta_2 + theta_1^2`` where ``theta_2 >= 0``, NaN below: the ascent from
    ``theta = 0`` climbs along ``e_2``; a chain that starts below finds nothing finite."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.theta
        return torch.where(b >= 0, b + a ** 2, torch.full_like(b, math.nan))


def _numbers(value: object) -> list[float]:
    """Every float inside a result field (nested lists and dicts)."""
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return []


def _fields(result: qs.SharpnessResult) -> dict[str, object]:
    return {name: getattr(result, name) for name in result.__dataclass_fields__
            if name not in ("settings", "perturbations")}


def test_a_chain_with_no_finite_evaluation_is_none_and_not_counted() -> None:
    found = 0
    for seed in range(6):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = _worst_case(HalfNaN(), 0.5, nonfinite="skip", seed=seed,
                                 reach={"chains": 4, "min_chains": 4})
        for name, value in _fields(result).items():
            assert all(math.isfinite(x) for x in _numbers(value)), name
        chains = result.chains[0]
        found += chains.count(None)
        assert chains[0] is not None and result.value == max(c for c in chains if c is not None)
        # not counted: a chain without a value neither confirms nor lowers the best
        assert result.reach[0] <= _agreement(chains)
    assert found > 0


@pytest.mark.parametrize("chains, expected", [([1.0, None], 0.0), ([1.0, None, 0.5], 0.5),
                                              ([None, 0.8, None, 1.0], 0.8), ([None, None], 0.0),
                                              ([2.0, -math.inf, 1.0], 0.5)])
def test_reach_estimate_skips_chains_without_a_value(chains: list[float | None],
                                                     expected: float) -> None:
    assert reach_estimate(chains) == expected


class _Attention(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x, x, x, need_weights=False)[0].mean(1))


def test_no_inf_in_a_result_whose_far_ball_overflows() -> None:
    # a radius of 50 on an exact inv ball: chains whose every evaluation overflows, and a best
    # point whose factor moved by about 1e21 x its norm, whose float32 norm overflows
    model = _Attention(0)
    batches = [(torch.randn(4, 5, 8), torch.randint(0, 3, (4,))) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = qs.sharpness(model, batches, measure="geodesic", order="exact", metric="inv",
                              rho=50.0, nonfinite="skip", n_iter=3, progress=False)
    for name, value in _fields(result).items():
        assert all(math.isfinite(x) for x in _numbers(value)), name
    assert result.local is False


def test_a_ratio_whose_float32_norm_overflows_is_taken_in_float64() -> None:
    from quotientsharp.engine.blocks import Locality, _entry_ratios, _worst
    generator = torch.Generator().manual_seed(0)
    top = torch.randn(3, 4, generator=generator) * 1e21
    bottom = torch.randn(3, 4, generator=generator)
    table = _entry_ratios([top, bottom], [bottom, bottom], [1, 1])
    # per row of the first tensor: the ratio of two Euclidean norms, in Python floats
    for row, (a, b) in enumerate(zip(top.tolist(), bottom.tolist(), strict=True)):
        expected = math.sqrt(sum(x * x for x in a)) / math.sqrt(sum(x * x for x in b))
        assert float(table[0, row]) == pytest.approx(expected, rel=1e-6)
    assert torch.equal(table[1], torch.ones(3, dtype=table.dtype))
    # a ratio that is not finite even so has no size: it is named, and not local
    broken = torch.tensor([[0.5, math.inf], [2.0, 0.1]])
    assert _worst([(broken, ["head 0", "head 1"])]) == (None, "head 1")
    assert not Locality(0.0, None, None, "head 1").local
    assert not Locality(None, "w").local
    assert Locality(0.0, None).local and Locality(0.5, "w", None, None).local


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("measure, options", [("adaptive", {}),
                                              ("geodesic", {"metric": "mix", "order": 2}),
                                              ("average", {"samples": 3})])
def test_a_value_is_exactly_the_difference_of_the_losses_reported(
        seed: int, measure: str, options: dict[str, object]) -> None:
    # float32 losses: their difference rounded to float32 would differ from the difference
    # of the two reported losses in the last digits
    model = _Attention(seed)
    batches = [(torch.randn(4, 5, 8), torch.randint(0, 3, (4,))) for _ in range(3)]
    if measure != "average":
        options = {**options, "n_iter": 4}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = qs.sharpness(model, batches, measure=measure, rho=0.5, seed=seed,
                              progress=False, **options)
    for index, value in enumerate(result.per_batch):
        assert value == result.perturbed_losses[index] - result.clean_losses[index]
        if result.chains:
            assert value == max(c for c in result.chains[index] if c is not None)
            assert value == result.traces[index][-1]


def test_a_nan_in_a_locality_ratio_is_not_read_as_local() -> None:
    from quotientsharp.engine.blocks import Locality, _ratio, _worst

    # a NaN norm compares false with 0: read as "norm 0, did not move" it would be local
    ratios = _ratio(torch.tensor([0.0, math.nan, 0.5]), torch.tensor([0.0, 0.0, 1.0]))
    value, label = _worst([(ratios.reshape(1, -1), ["a", "b", "c"])])
    assert value is None and label == "b"
    assert not Locality(value, label).local


# ---------------------------------------------------------------------------- rounding
@pytest.mark.parametrize("measure", ["adaptive", "geodesic"])
def test_a_value_within_the_rounding_of_its_float32_losses_is_flagged(measure: str) -> None:
    model, batch = _tiny_transformer(3)
    options = dict(measure=measure, n_iter=3, progress=False)
    # at rho 1e-7 the float32 value is the rounding of two losses that nearly cancel: the
    # float64 model (the same weights) gives a value many times smaller
    fine = qs.sharpness(model, [batch], rho=1e-7, **options)
    with pytest.warns(qs.ReachWarning, match=r"batch 0: the value .* is not resolved to 1 %"):
        coarse = qs.sharpness(model.float(), [(batch[0].float(), batch[1])], rho=1e-7,
                              **options)
    assert abs(coarse.value - fine.value) > 0.01 * abs(coarse.value)
    losses = [coarse.clean_losses[0], coarse.perturbed_losses[0]]
    assert coarse.rounding == [64 * torch.finfo(torch.float32).eps * max(map(abs, losses))]
    assert fine.rounding[0] < 0.01 * fine.value and not fine.shortfalls()
    # the note stands in for the reach estimate's, which says nothing at that precision
    assert not any("reach estimate" in note for note in coarse.shortfalls())
    assert "within the rounding of their losses" in coarse.summary()
    assert "reach >=" not in coarse.summary() and "reach >=" in fine.summary()
    # at an ordinary radius the float32 value is resolved: no note
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = qs.sharpness(model.float(), [(batch[0].float(), batch[1])], rho=0.05,
                                **options)
    assert resolved.rounding[0] < 0.01 * resolved.value


def test_an_average_within_the_rounding_of_its_float32_losses_is_flagged() -> None:
    # the draws of a small rho round away in float32 parameters and the mean rise in float32
    # losses: the value was returned as measured, without a word
    model, batch = _tiny_transformer(3)
    options = dict(measure="average", adaptive=True, samples=4, progress=False)
    fine = qs.sharpness(model, [batch], rho=1e-7, **options)
    with pytest.warns(qs.ReachWarning, match=r"average sharpness .* may not be the mean it "
                                             r"claims: batch 0: the value .* is not resolved"):
        coarse = qs.sharpness(model.float(), [(batch[0].float(), batch[1])], rho=1e-7,
                              **options)
    losses = [coarse.clean_losses[0], coarse.perturbed_losses[0]]
    assert coarse.rounding == [64 * torch.finfo(torch.float32).eps * max(map(abs, losses))]
    assert fine.rounding[0] < 0.01 * abs(fine.value) and not fine.shortfalls()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = qs.sharpness(model.float(), [(batch[0].float(), batch[1])], rho=0.05,
                                **options)
    assert resolved.rounding[0] < 0.01 * abs(resolved.value)


def test_an_average_near_zero_by_chance_is_judged_by_its_draws_not_flagged() -> None:
    # the mean of a batch's draws is near zero by chance (seed 3, batch 0: 8.5e-4 against a
    # rounding bound of 1.3e-5); judged against the value, it was flagged and told to use
    # float64, which does not change sampling noise. Its draws change the loss by 1.3e-2.
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    batches = [(torch.randn(32, 10), torch.randint(0, 5, (32,))) for _ in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = qs.sharpness(mlp, batches, measure="average", rho=0.05, samples=8, seed=3,
                              progress=False)
    assert result.rounding[0] > 0.01 * abs(result.per_batch[0])
    assert all(r < 0.01 * d for r, d in zip(result.rounding, result.draw_rises, strict=True))
    assert not result.shortfalls()


class _Float32Logits(torch.nn.Module):
    """A float64 model that returns its logits in float32."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).float()


@pytest.mark.parametrize("measure", ["adaptive", "geodesic"])
def test_the_rounding_is_that_of_the_outputs_the_loss_is_computed_from(measure: str) -> None:
    # the parameters' dtype says nothing of a forward that returns coarser logits, as one
    # under autocast does: the bound was 2**29 (float32 logits of float64 parameters) or 2**16
    # (bfloat16 logits of float32 parameters) times too small
    model, batch = _tiny_transformer(3)
    options = dict(measure=measure, rho=0.05, n_iter=3, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        plain = qs.sharpness(model, [batch], **options)
        coarse = qs.sharpness(_Float32Logits(model), [batch], **options)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = qs.sharpness(model.float(), [(batch[0].float(), batch[1])], **options)
    for result, dtype in ((plain, torch.float64), (coarse, torch.float32),
                          (autocast, torch.bfloat16)):
        losses = [result.clean_losses[0], result.perturbed_losses[0]]
        assert result.rounding == [64 * torch.finfo(dtype).eps * max(map(abs, losses))]


def test_the_warning_advises_only_for_the_causes_it_names() -> None:
    # a value within its rounding has its own advice (a finer dtype, a larger rho): searching
    # longer, which the warning used to advise whatever the cause, cannot help it
    model, batch = _tiny_transformer(3)
    with pytest.warns(qs.ReachWarning) as caught:
        qs.sharpness(model.float(), [(batch[0].float(), batch[1])], measure="adaptive",
                     rho=1e-7, n_iter=3, progress=False)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, qs.ReachWarning)]
    assert "not resolved to 1 %" in message
    assert "search longer" not in message and "not local" not in message
