"""The exact-path check of an order-2 value (``Locality.path_share``, ``path_agrees``).

An order-2 geodesic value is the loss rise at ``theta + xi - Gamma(xi, xi) / 2``, a Taylor
approximation of the geodesic through ``xi``. The check evaluates the loss at the exact
geodesic through the same ``xi``. References: the geodesic equation integrated with the
Christoffel symbols by autograd from the metric alone (:func:`quotientsharp.core.reference.
geodesic`), and the Euclidean metric, whose geodesics are the lines themselves.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import quotientsharp as qs
from quotientsharp.core import reference
from quotientsharp.engine.ball import GeodesicBall
from quotientsharp.engine.blocks import PATH_CHECK_STEPS, Locality, path_check

Tensors = tuple[torch.Tensor, ...]
F64 = torch.float64


def _pair(seed: int, small: float, dtype: torch.dtype = torch.float64
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two heads of a GL(3) pair, the second head's ``G`` scaled by ``small``."""
    generator = torch.Generator().manual_seed(seed)
    G = torch.randn(2, 5, 3, generator=generator, dtype=dtype)
    H = torch.randn(2, 4, 3, generator=generator, dtype=dtype)
    G[1] *= small
    return G, H


def _loss(point: Tensors) -> torch.Tensor:
    """A smooth loss of the heads' products ``G H^T`` (a function on the quotient)."""
    product = point[0] @ point[1].mT
    return (torch.sin(product).sum() + 0.1 * (product ** 2).sum()).to(point[0].dtype)


def _tangent(frozen: object, seed: int, size: float) -> Tensors:
    """A horizontal velocity of metric norm ``size`` (the heads together) along which the
    loss's first-order change is a rise (the check compares rises)."""
    generator = torch.Generator().manual_seed(100 + seed)
    x = frozen.x  # type: ignore[attr-defined]
    raw = tuple(torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in x)
    xi = frozen.horizontal_projection(raw)  # type: ignore[attr-defined]
    norm = frozen.norm(xi).square().sum().sqrt()  # type: ignore[attr-defined]
    point = tuple(t.detach().requires_grad_() for t in x)
    slope = sum((g * v).sum() for g, v in zip(
        torch.autograd.grad(_loss(point), point), xi, strict=True))
    return tuple(torch.sign(slope) * size * t / norm for t in xi)


@pytest.mark.parametrize("metric, eps", [("inv", 0.0), ("mix", 0.0), ("inv", 0.5),
                                         ("mix", 0.5)])
@pytest.mark.parametrize("seed, small, size", [(0, 1.0, 0.05), (1, 0.05, 0.3), (2, 1e-2, 1.0)])
def test_path_share_against_the_geodesic_equation_by_autograd(metric: str, eps: float,
                                                              seed: int, small: float,
                                                              size: float) -> None:
    G, H = _pair(seed, small)
    quotient = qs.GLQuotient(metric, eps=eps)
    frozen = quotient.at((G, H))
    xi = _tangent(frozen, seed, size)
    ball = GeodesicBall(frozen, 10.0, order=2, steps=64)
    clean, perturbed = _loss((G, H)), _loss(ball.point(xi))
    found = path_check(ball, xi, _loss, clean, perturbed, F64)
    # the same discretisation (RK4 of the check's steps), the Christoffel symbols by autograd
    # from the metric
    if found["path_share"] is None:
        # the integration left the points where the metric is defined: so does the reference
        with pytest.raises(ValueError, match="singular"):
            reference.geodesic(quotient, (G, H), xi, order="exact", steps=PATH_CHECK_STEPS)
        assert found["path_agrees"] is False
        return
    exact = reference.geodesic(quotient, (G, H), xi, order="exact", steps=PATH_CHECK_STEPS)
    rise = float(_loss(exact) - clean)
    assert found["path_share"] * float(perturbed - clean) == pytest.approx(rise, rel=1e-9,
                                                                          abs=1e-12)
    assert found["path_agrees"] == (abs(rise / float(perturbed - clean) - 1) <= 0.01)
    # and the geodesic itself (256 steps): its few steps judge as the converged path does,
    # except within a quarter of the tolerance of the tolerance, and near 1 they are accurate
    converged = float(_loss(reference.geodesic(quotient, (G, H), xi, order="exact",
                                               steps=256)) - clean) / float(perturbed - clean)
    if not 0.0075 <= abs(converged - 1) <= 0.0125:
        assert found["path_agrees"] == (abs(converged - 1) <= 0.01)
    if abs(converged - 1) < 0.02:
        assert found["path_share"] == pytest.approx(converged, abs=1e-4)


@pytest.mark.parametrize("seed", range(3))
def test_under_the_euclidean_metric_the_path_is_the_geodesic(seed: int) -> None:
    # Gamma = 0: order 2, the line and the geodesic are one path, whatever the factors' sizes
    G, H = _pair(seed, 1e-3)
    frozen = qs.GLQuotient("euclidean").at((G, H))
    xi = _tangent(frozen, seed, 2.0)
    ball = GeodesicBall(frozen, 10.0, order=2)
    clean, perturbed = _loss((G, H)), _loss(ball.point(xi))
    found = path_check(ball, xi, _loss, clean, perturbed, F64)
    assert found["path_share"] == pytest.approx(1.0, rel=1e-12)
    assert found["path_agrees"] is True


def test_a_curved_path_far_from_its_geodesic_does_not_agree() -> None:
    # mix with a small factor: the ball moves the partner by about rho / sigma_min, and the
    # order-2 term is several times the first-order one
    G, H = _pair(3, 1e-2)
    frozen = qs.GLQuotient("mix").at((G, H))
    xi = _tangent(frozen, 3, 0.1)
    ball = GeodesicBall(frozen, 10.0, order=2)
    clean, perturbed = _loss((G, H)), _loss(ball.point(xi))
    found = path_check(ball, xi, _loss, clean, perturbed, F64)
    assert abs(found["path_share"] - 1) > 0.01 and found["path_agrees"] is False
    # further out the geodesic leaves the points where the metric is defined before t = 1:
    # no share, and no agreement
    far = tuple(10 * t for t in xi)
    found = path_check(ball, far, _loss, clean, _loss(ball.point(far)), F64)
    assert found == {"path_share": None, "path_agrees": False}


@pytest.mark.parametrize("order", [1, "exact"])
def test_no_check_without_an_order_2_path(order: int | str) -> None:
    G, H = _pair(0, 1e-2)
    frozen = qs.GLQuotient("mix").at((G, H))
    xi = _tangent(frozen, 0, 1.0)
    ball = GeodesicBall(frozen, 10.0, order=order)
    assert path_check(ball, xi, _loss, _loss((G, H)), _loss((G, H)) + 1.0, F64) == {}


def _inv_ball() -> tuple[GeodesicBall, Tensors, torch.Tensor]:
    """An order-2 inv ball at a well-conditioned pair, a velocity in it and the clean loss."""
    G, H = _pair(0, 1.0)
    frozen = qs.GLQuotient("inv").at((G, H))
    return GeodesicBall(frozen, 10.0, order=2), _tangent(frozen, 0, 0.1), _loss((G, H))


def test_no_check_where_the_value_is_not_a_rise() -> None:
    ball, xi, clean = _inv_ball()
    for perturbed in (clean, clean - 1.0, clean + math.inf):
        assert path_check(ball, xi, _loss, clean, perturbed, F64) == {}


def test_a_loss_that_is_not_finite_on_the_geodesic_does_not_agree() -> None:
    ball, xi, clean = _inv_ball()
    found = path_check(ball, xi, lambda point: torch.tensor(math.inf, dtype=torch.float64),
                       clean, clean + 1.0, F64)
    assert found == {"path_share": None, "path_agrees": False}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_rounding_of_the_forward_is_no_evidence_either_way(dtype: torch.dtype) -> None:
    # losses near 1 in float64 from a forward in `dtype`: differences are counted in units in
    # the last place (ulp) of that dtype, however the losses are stored
    ball, xi, _ = _inv_ball()
    ulp = float(torch.finfo(dtype).eps)
    clean = torch.tensor(1.0, dtype=torch.float64)

    def check(value_ulps: float, gap_ulps: float) -> dict:
        rise = torch.tensor(1.0 + (value_ulps - gap_ulps) * ulp, dtype=torch.float64)
        return path_check(ball, xi, lambda point: rise, clean, clean + value_ulps * ulp, dtype)

    # a value of 10^4 ulps: 1 % of it is 100 ulps, so the two rises may differ by 100 ulps
    # plus the forward's rounding (tens of ulps), and no more
    assert check(1e4, 150)["path_agrees"] is True
    assert check(1e4, 200)["path_agrees"] is False
    assert check(1e4, -200)["path_agrees"] is False
    # a value of 10^3 ulps: 1 % of it is below the rounding, which cannot tell
    found = check(1e3, 500)
    assert found["path_agrees"] is None and found["path_share"] == pytest.approx(0.5)
    # the same gap far above the rounding
    found = path_check(ball, xi, lambda point: torch.tensor(2.0, dtype=torch.float64),
                       torch.tensor(0.0, dtype=torch.float64),
                       torch.tensor(4.0, dtype=torch.float64), dtype)
    assert found == {"path_share": 0.5, "path_agrees": False}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_forward_cannot_judge_a_value_of_everyday_size(dtype: torch.dtype
                                                                        ) -> None:
    # a loss of 0.7 from a half-precision forward is known to about a unit in its last place
    # (0.004 in bfloat16): a rise of 0.05 against one of 0.03 is no evidence either way
    ball, xi, _ = _inv_ball()
    found = path_check(ball, xi, lambda point: torch.tensor(0.73, dtype=torch.float64),
                       torch.tensor(0.7, dtype=torch.float64),
                       torch.tensor(0.75, dtype=torch.float64), dtype)
    assert found["path_agrees"] is None and found["path_share"] == pytest.approx(0.6)


# ------------------------------------------------------------------------------ end to end
def _tiny_transformer(seed: int, value_scale: float = 1.0
                      ) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True,
                                                                 dropout=0.0),
                                torch.nn.Flatten(), torch.nn.Linear(24, 3)).double()
    with torch.no_grad():
        model[0].self_attn.in_proj_weight[16:] *= value_scale
    return model, (torch.randn(4, 3, 8, dtype=torch.float64), torch.randint(0, 3, (4,)))


def test_a_mix_value_that_extrapolates_is_flagged_and_the_warning_says_how_far() -> None:
    model, batch = _tiny_transformer(0, 0.3)
    with pytest.warns(qs.ReachWarning, match="along the exact geodesic the same perturbation "
                                             "raises the loss by"):
        result = qs.sharpness(model, [batch], measure="geodesic", metric="mix", rho=0.1,
                              n_iter=4, progress=False, reach=False)
    where = result.locality[0]
    assert where["path_agrees"] is False and not where["local"]
    assert abs(where["path_share"] - 1) > 0.01


@pytest.mark.parametrize("seed", range(3))
def test_an_inv_value_in_a_small_ball_follows_its_geodesic(seed: int) -> None:
    model, batch = _tiny_transformer(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", qs.ReachWarning)
        result = qs.sharpness(model, [batch], measure="geodesic", metric="inv", rho=0.05,
                              n_iter=6, progress=False, reach=False)
    where = result.locality[0]
    assert where["path_agrees"] is True and where["local"]
    assert where["path_share"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("options", [dict(measure="geodesic", metric="mix", order=1),
                                     dict(measure="geodesic", metric="mix", order="exact",
                                          exact_steps=4),
                                     dict(measure="adaptive"), dict(measure="worst_case")])
def test_measures_without_an_order_2_path_are_not_checked(options: dict) -> None:
    model, batch = _tiny_transformer(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        result = qs.sharpness(model, [batch], rho=0.05, n_iter=3, progress=False, reach=False,
                              **options)
    assert result.locality[0]["path_share"] is None
    assert result.locality[0]["path_agrees"] is None


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_the_path_share_does_not_change_under_the_group(metric: str) -> None:
    from quotientsharp.models import find_symmetries, reparametrize

    model, batch = _tiny_transformer(1)
    moved = copy.deepcopy(model)
    params = reparametrize(model, find_symmetries(model), scale=3.0,
                           generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for name, parameter in moved.named_parameters():
            parameter.copy_(params[name])
    options = dict(measure="geodesic", metric=metric, rho=0.3, n_iter=5, progress=False,
                   reach=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        before = qs.sharpness(model, [batch], **options)
        after = qs.sharpness(moved, [batch], **options)
    assert after.value == pytest.approx(before.value, rel=1e-9)
    assert after.locality[0]["path_share"] == pytest.approx(before.locality[0]["path_share"],
                                                            rel=1e-7)
    assert after.locality[0]["path_agrees"] == before.locality[0]["path_agrees"]


def _result_with(where: dict) -> qs.SharpnessResult:
    """A result of one batch that reached its maximum, with the given locality figures."""
    figures = {"displacement": 0.01, "parameter": "w", "factor_displacement": 0.05,
               "factor": "head 0", "second_order": 0.1, "second_order_factor": "head 0",
               "path_share": 1.0, "path_agrees": True, **where}
    figures["local"] = Locality.from_dict(figures).local
    return qs.SharpnessResult(measure="geodesic", value=1.0, per_batch=[1.0],
                              settings={"rho": 0.3, "metric": "inv", "order": 2},
                              perturbation_norms=[{"total": 0.3}], reach=[1.0],
                              chains=[[1.0, 1.0]], locality=[figures])


def test_a_value_only_the_path_check_rejects_is_said_to_leave_its_geodesic() -> None:
    notes = _result_with({"path_share": 0.985, "path_agrees": False}).shortfalls()
    assert notes == ["batch 0: the order-2 value is not the loss rise of its geodesic to 1 % "
                     "(along the exact geodesic the same perturbation raises the loss by "
                     "98.5 % of the value): it is the rise along the Taylor path, which leaves "
                     "the geodesic there; order='exact' measures along the geodesic itself"]
    # a geodesic along which the loss falls is said so
    notes = _result_with({"path_share": -0.002, "path_agrees": False}).shortfalls()
    assert "the same perturbation lowers the loss, by 0.2 % of the value" in notes[0]
    # a ball that is also not local says both, and calls the path an extrapolation
    notes = _result_with({"path_share": 0.3, "path_agrees": False,
                          "second_order": 2.0}).shortfalls()
    assert len(notes) == 1 and "the ball is not local" in notes[0]
    assert "raises the loss by 30 % of the value" in notes[0]
    assert "an extrapolation with many local maxima" in notes[0]
    # a ball wide by its displacement alone is not called an extrapolation
    notes = _result_with({"path_share": 0.3, "path_agrees": False,
                          "factor_displacement": 3.0}).shortfalls()
    assert "raises the loss by 30 % of the value" in notes[0]
    assert "many local maxima" not in notes[0]
    # where the path agrees and the figures are within their bounds, nothing is said
    assert _result_with({}).shortfalls() == []


def test_locality_made_before_the_check_reads_as_not_checked() -> None:
    # a result saved before the check has no path figures: judged by its bounds alone
    old = {"displacement": 0.01, "parameter": "w", "factor_displacement": 0.05,
           "factor": "head 0", "second_order": 0.1, "second_order_factor": "head 0"}
    where = Locality.from_dict(old)
    assert where.path_agrees is None and where.local and where.within_bounds


def test_in_the_engine_a_geodesic_that_leaves_the_manifold_has_no_share() -> None:
    # value factors scaled by 1e-3: the mix ball moves a head by 1e5 times its size, and the
    # geodesic through the best perturbation leaves the full-rank points before t = 1 (the
    # ascent's own path runs without the checks on values; the check runs with them)
    model, batch = _tiny_transformer(0, 1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.ReachWarning)
        result = qs.sharpness(model, [batch], measure="geodesic", metric="mix", rho=0.3,
                              n_iter=4, progress=False, reach=False)
    assert result.locality[0]["path_share"] is None
    assert result.locality[0]["path_agrees"] is False and not result.local


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_with_the_default_search_the_best_chain_is_checked(dtype: torch.dtype) -> None:
    model, batch = _tiny_transformer(2)
    model = model.to(dtype)
    batch = (batch[0].to(dtype), batch[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", qs.ReachWarning)
        result = qs.sharpness(model, [batch], measure="geodesic", metric="inv", rho=0.02,
                              n_iter=5, progress=False)
    where = result.locality[0]
    assert len(result.chains[0]) >= 2
    assert where["path_agrees"] is True and where["path_share"] == pytest.approx(1.0, abs=1e-3)


def test_a_user_quotient_is_checked_along_its_own_geodesic() -> None:
    # the tutorial's ReLU-unit rescaling, bound by the user: no closed form, the generic RK4
    from tests.tiny_models import ReLUNeuronQuotient

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(),
                                torch.nn.Linear(6, 3)).double()
    binding = qs.QuotientBinding(
        ReLUNeuronQuotient(), ["0.weight", "0.bias", "2.weight"],
        lambda p: (torch.cat([p["0.weight"], p["0.bias"][:, None]], dim=1), p["2.weight"].T),
        lambda x: {"0.weight": x[0][:, :-1], "0.bias": x[0][:, -1], "2.weight": x[1].T},
        folded=1, name="relu units")
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 5, dtype=torch.float64, generator=generator),
                torch.randint(0, 3, (16,), generator=generator))]
    shares = []
    for rho in (0.05, 1.0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", qs.ReachWarning)
            result = qs.sharpness(model, batches, measure="geodesic", rho=rho, order=2,
                                  n_iter=4, symmetries=binding, progress=False, reach=False)
        shares.append(result.locality[0]["path_share"])
        assert result.locality[0]["path_agrees"] == (abs(shares[-1] - 1) <= 0.01)
    # a small ball follows its geodesic closely; a large one less so
    assert abs(shares[0] - 1) < 1e-3 < abs(shares[1] - 1)


def test_an_exact_mix_ball_whose_geodesics_leave_the_manifold_names_that_cause() -> None:
    # the advice for a mix value that is not its geodesic's is order="exact": where the ball is
    # so wide that the geodesics themselves reach a singular factor, the error says so (and
    # not that the radius overflows float64)
    model, batch = _tiny_transformer(0, 1e-3)
    with pytest.raises(qs.engine.NonFiniteLossError,
                       match=r"an exact geodesic of the ball \(rho=0.3, RK4 of 4 steps.*left "
                             "the full-rank points of a symmetry factor"):
        qs.sharpness(model, [batch], measure="geodesic", metric="mix", order="exact",
                     exact_steps=4, rho=0.3, n_iter=6, progress=False, reach=False)
