"""Solver quality as an output of the ascent measures: the convergence trace, the reference
solve and its gap, bounded against the exact maximiser of the trust-region subproblem.

- ``trust_region_maximum`` against multi-start SLSQP (SciPy), in the easy, interior and hard
  cases;
- on a quadratic loss, where the worst case over an L2 (or adaptive) ball is that subproblem,
  the reference solve reaches the exact maximum and the reported gap is exactly how far a
  weak Auto-PGD stays below it; the paper's default (20 steps) is within 1e-12 of it;
- traces are non-decreasing, one entry per evaluation, and end at the value;
- the options change nothing when off, and the reference solve leaves the measured value
  bit-identical (its own random stream), syncs nothing inside its loop, and validates its keys.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from test_device_proxies import _attention_model, recorded_ascents  # noqa: F401 (fixture)
from test_sharpness import DUMMY, Quadratic, _quadratic, _value_loss, classification_batches, mlp
from test_sharpness_reuse import _token_batches

import quotientsharp as qs
from quotientsharp.engine import AscentSettings, reference_settings, trust_region_maximum

#: These tests measure geodesic sharpness on MLPs, where discovery finds no symmetry: the
#: warning that says so is expected here (tests/test_symmetry_check.py checks it).
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


def _slsqp_maximum(A: torch.Tensor, g: torch.Tensor, rho: float, c: torch.Tensor) -> float:
    """Multi-start SLSQP on ``max (c e)^T g + (c e)^T A (c e) / 2``, ``|e| <= rho``."""
    A_, g_, c_ = A.numpy(), g.numpy(), c.numpy()
    rng = np.random.default_rng(0)
    best = -math.inf
    for _ in range(12):
        start = rng.normal(size=len(g_))
        start *= rho * rng.uniform() / np.linalg.norm(start)

        def objective(e):
            return -(g_ @ (c_ * e) + 0.5 * (c_ * e) @ A_ @ (c_ * e))

        run = minimize(objective, start, method="SLSQP", options={"ftol": 1e-15, "maxiter": 300},
                       constraints=[{"type": "ineq", "fun": lambda e: rho ** 2 - e @ e}])
        best = max(best, -run.fun)
    return best


@pytest.mark.parametrize("case", ["indefinite", "concave-interior", "scaled"])
def test_trust_region_maximum_matches_multistart_slsqp(case: str) -> None:
    gen = torch.Generator().manual_seed(4)
    M = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    A = 0.5 * (M + M.T)
    g = torch.randn(5, generator=gen, dtype=torch.float64)
    c = torch.ones(5, dtype=torch.float64)
    if case == "concave-interior":
        A, g = A - 6 * torch.eye(5, dtype=torch.float64), 0.05 * g
    if case == "scaled":
        c = torch.rand(5, generator=gen, dtype=torch.float64) + 0.2
    exact = trust_region_maximum(A, g, 0.7, None if case != "scaled" else c)
    assert exact.value == pytest.approx(_slsqp_maximum(A, g, 0.7, c), rel=1e-10, abs=1e-14)
    assert float((exact.d / c).norm()) <= 0.7 * (1 + 1e-12)
    assert (exact.multiplier == 0.0) == (case == "concave-interior")
    assert exact.value == pytest.approx(float(g @ exact.d + 0.5 * exact.d @ A @ exact.d),
                                        rel=1e-12)


def test_trust_region_maximum_hard_case() -> None:
    # g has no component along the top eigenvector: the maximiser needs it to fill the ball
    A = torch.diag(torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64))
    g = torch.tensor([0.0, 0.3, 0.1], dtype=torch.float64)
    exact = trust_region_maximum(A, g, 1.0)
    assert exact.hard_case and exact.multiplier == 2.0
    assert float(exact.d.norm()) == pytest.approx(1.0, rel=1e-14)
    assert exact.value == pytest.approx(_slsqp_maximum(A, g, 1.0, torch.ones(3,
                                                                            dtype=A.dtype)),
                                        rel=1e-9)


@pytest.mark.parametrize("rho", [0.5, 2.0])
def test_trust_region_maximum_hard_case_away_from_rho_one(rho: float) -> None:
    # at rho = 1, rho and rho^2 coincide: a maximiser that fills the ball with rho in place of
    # rho^2 passes the test above. A = diag(2, -1), g = (0, 1): the hard case for rho >= 1/3,
    # with d = (sqrt(rho^2 - 1/9), 1/3) and the value g.d + d^T A d / 2 = rho^2 + 1/6 by hand
    A = torch.diag(torch.tensor([2.0, -1.0], dtype=torch.float64))
    g = torch.tensor([0.0, 1.0], dtype=torch.float64)
    exact = trust_region_maximum(A, g, rho)
    assert exact.hard_case and exact.multiplier == 2.0
    assert float(exact.d.norm()) == pytest.approx(rho, rel=1e-14)
    assert abs(float(exact.d[0])) == pytest.approx(math.sqrt(rho ** 2 - 1 / 9), rel=1e-12)
    assert float(exact.d[1]) == pytest.approx(1 / 3, rel=1e-12)
    assert exact.value == pytest.approx(rho ** 2 + 1 / 6, rel=1e-12)


def test_trust_region_maximum_rejects_bad_input() -> None:
    A, g = torch.eye(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="rho"):
        trust_region_maximum(A, g, 0.0)
    with pytest.raises(ValueError, match="symmetric"):
        trust_region_maximum(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), g, 1.0)
    with pytest.raises(ValueError, match="scale"):
        trust_region_maximum(A, g, 1.0, scale=-torch.ones(2))


def _check_trace(trace: list[float], value: float, evaluations: int) -> None:
    assert len(trace) == evaluations
    assert all(b >= a for a, b in zip(trace, trace[1:], strict=False)), trace
    assert trace[-1] == value


@pytest.mark.parametrize("adaptive", [False, True], ids=["l2", "adaptive"])
def test_reference_solve_bounds_the_auto_pgd_gap_on_a_quadratic(adaptive: bool) -> None:
    A, b, theta = _quadratic(0, d=6, shift=0.8)          # indefinite: a real trust region
    model = Quadratic(A, b, theta)
    rho = 0.5
    exact = trust_region_maximum(A, A @ theta + b, rho, theta.abs() if adaptive else None).value
    measure = "adaptive" if adaptive else "worst_case"
    options = dict(rho=rho, loss=_value_loss, progress=False)

    weak = qs.sharpness(model, DUMMY, measure=measure, n_iter=2, reach=False,
                        reference_solve={"n_iter": 60, "restarts": 2}, **options)
    # the reference solve reaches the exact maximum, and the value stays below it
    assert weak.reference_value == pytest.approx(exact, rel=1e-12)
    assert weak.value <= exact * (1 + 1e-12)
    # the reported gap is exactly the reference minus the value, and here it is real
    assert weak.gap == weak.reference_value - weak.value
    assert weak.gap_per_batch == [weak.reference_per_batch[0] - weak.per_batch[0]]
    assert weak.relative_gap == pytest.approx((exact - weak.value) / exact, rel=1e-8)
    assert 1e-4 < weak.relative_gap < 1e-1
    assert "reference solve" in weak.summary() and "gap" in weak.summary()
    _check_trace(weak.traces[0], weak.value, 3)
    _check_trace(weak.reference_traces[0], weak.reference_per_batch[0], 3 * 61)
    assert weak.settings["reference_solve"]["n_iter"] == 60
    assert weak.settings["reference_solve"]["restarts"] == 2

    # the paper's solver (20 Auto-PGD steps) closes the gap on this problem, and the default
    # search confirms it: every chain reached the exact maximum
    default = qs.sharpness(model, DUMMY, measure=measure, reference_solve=True, **options)
    assert default.settings["reference_solve"]["n_iter"] == 200
    assert default.settings["reference_solve"]["restarts"] == 4
    assert abs(default.relative_gap) < 1e-12
    assert (exact - default.value) / exact < 1e-12
    assert default.reach[0] >= 0.99 and default.chains[0][0] == pytest.approx(exact, rel=1e-12)
    _check_trace(default.traces[0], default.value, default.evaluations[0])


def test_traces_of_every_ascent_measure_and_restarts() -> None:
    model, batches = mlp(2), classification_batches(count=2)
    runs = [("worst_case", {"p": "inf", "rho": 0.01}), ("adaptive", {"rho": 0.1}),
            ("geodesic", {"rho": 0.1, "metric": "mix", "restarts": 2, "random_init": True})]
    for measure, options in runs:
        result = qs.sharpness(model, batches, measure=measure, n_iter=4, progress=False,
                              reach=False, **options)
        runs_count = options.get("restarts", 0) + 1
        assert len(result.traces) == 2
        for trace, value in zip(result.traces, result.per_batch, strict=True):
            _check_trace(trace, value, runs_count * 5)
        assert result.reference_per_batch == [] and result.gap is None
        assert result.blocks is None
        if not options.get("random_init"):
            assert result.traces[0][0] == 0.0             # the start xi = 0 is theta
    average = qs.sharpness(model, batches, measure="average", rho=0.01, progress=False)
    assert average.traces == []


def test_the_options_leave_the_measured_values_unchanged() -> None:
    model, batches = _attention_model(), _token_batches(count=2)
    for options in (dict(measure="geodesic", metric="mix"),
                    dict(measure="adaptive", restarts=1, random_init=True)):
        plain = qs.sharpness(model, batches, rho=0.05, n_iter=4, progress=False, **options)
        both = qs.sharpness(model, batches, rho=0.05, n_iter=4, progress=False,
                            reference_solve={"n_iter": 6, "restarts": 1}, blockwise=True,
                            **options)
        assert both.per_batch == plain.per_batch
        assert both.perturbed_losses == plain.perturbed_losses
        assert both.perturbation_norms == plain.perturbation_norms
        assert both.traces == plain.traces
        assert plain.settings["reference_solve"] is None and not plain.settings["blockwise"]


def test_the_reference_solve_never_needs_the_host(recorded_ascents) -> None:  # noqa: F811
    recorders = recorded_ascents            # the GPU path, each ascent under its own recorder
    qs.sharpness(_attention_model(), _token_batches(count=1), measure="geodesic", rho=0.05,
                 n_iter=3, reference_solve={"n_iter": 5, "restarts": 1}, progress=False)
    # the measurement's search (at least two chains), then the reference
    assert len(recorders) >= 3
    for recorder in recorders:
        assert recorder.operators > 100
        assert not recorder.syncs, dict(recorder.syncs)


@pytest.mark.parametrize("option, error, message", [
    ({"steps": 10}, ValueError, r"reference_solve: unknown key\(s\) \['steps'\]"),
    ({"n_iter": 0}, ValueError, "reference_solve: n_iter must be an integer >= 1"),
    ({"restarts": -1}, ValueError, "reference_solve: restarts must be"),
    (5, TypeError, "reference_solve must be None, True or a dict"),
])
def test_reference_solve_options_are_checked(option, error, message) -> None:
    with pytest.raises(error, match=message):
        qs.sharpness(mlp(0), classification_batches(count=1), measure="adaptive", rho=0.1,
                     n_iter=2, progress=False, reference_solve=option)


def test_option_errors_name_the_option() -> None:
    model, batches = mlp(0), classification_batches(count=1)
    with pytest.raises(TypeError, match="blockwise must be True or False"):
        qs.sharpness(model, batches, measure="geodesic", rho=0.1, blockwise="yes")
    for measure in ("average", "relative_flatness"):
        rho = None if measure == "relative_flatness" else 0.1
        for option in ("reference_solve", "blockwise"):
            with pytest.raises(TypeError, match=rf"unknown option\(s\) \['{option}'\]"):
                qs.sharpness(model, batches, measure=measure, rho=rho, **{option: True})


def test_reference_settings_defaults_follow_the_measurement() -> None:
    main = AscentSettings(n_iter=7, eta0=0.3, alpha=0.5)
    assert reference_settings(None, main) is None and reference_settings(False, main) is None
    strong = reference_settings(True, main)
    assert (strong.n_iter, strong.restarts, strong.eta0, strong.alpha) == (70, 4, 0.3, 0.5)
    assert reference_settings({"restarts": 0, "random_init": True}, main).random_init


# ---------------------------------------------------------------------------- mutation survivors
def _boundary_maximum(A: torch.Tensor, g: torch.Tensor, rho: float) -> float:
    """``max g.d + d^T A d / 2`` over the circle ``||d|| = rho`` (2-D), by a fine grid of
    angles: an independent reference where the maximum is on the boundary."""
    theta = torch.linspace(0, 2 * math.pi, 400_001, dtype=torch.float64)
    d = rho * torch.stack([theta.cos(), theta.sin()], dim=-1)
    values = d @ g + 0.5 * ((d @ A) * d).sum(-1)
    return float(values.max())


@pytest.mark.parametrize("diagonal, g, rho", [
    ((0.3, -0.5), (0.2, 0.1), 1.0),      # indefinite, multiplier in (0.3, 1): lower bound 0
    ((0.5, -1.0), (0.01, 0.01), 1.0),    # 0 < top < 1 and a small stationary point inside
    ((-1.0, -1.0), (1.5, 0.0), 1.0),     # concave, unconstrained maximiser outside the ball
    ((0.5, -1.0), (0.0, 1.0), 1.0),      # the hard case with 0 < top < 1
])
def test_trust_region_maximum_against_a_grid_of_the_circle(diagonal, g, rho) -> None:
    A = torch.diag(torch.tensor(diagonal, dtype=torch.float64))
    g = torch.tensor(g, dtype=torch.float64)
    exact = trust_region_maximum(A, g, rho)
    assert float(exact.d.norm()) <= rho * (1 + 1e-12)
    assert exact.value == pytest.approx(float(g @ exact.d + 0.5 * exact.d @ A @ exact.d),
                                        rel=1e-12)
    assert exact.value == pytest.approx(_boundary_maximum(A, g, rho), rel=1e-8, abs=1e-10)


def test_trust_region_maximum_reports_the_case_and_returns_float64_on_the_cpu() -> None:
    easy = trust_region_maximum(torch.tensor([[1.0, 0.2], [0.2, -1.0]]),
                                torch.tensor([0.3, 0.4]), 0.5)      # float32 in
    assert easy.hard_case is False
    assert easy.d.dtype == torch.float64 and easy.d.device.type == "cpu"
    reference = trust_region_maximum(torch.tensor([[1.0, 0.2], [0.2, -1.0]], dtype=torch.float64),
                                     torch.tensor([0.3, 0.4], dtype=torch.float64), 0.5)
    # float32 inputs widened first: the solve itself runs in float64
    assert easy.value == pytest.approx(reference.value, rel=1e-7)
    # top = 0 with g orthogonal to it: the hard case, the ball filled
    hard = trust_region_maximum(torch.diag(torch.tensor([0.0, -1.0], dtype=torch.float64)),
                                torch.tensor([0.0, 0.5], dtype=torch.float64), 1.0)
    assert hard.hard_case is True and float(hard.d.norm()) == pytest.approx(1.0, rel=1e-12)


def test_trust_region_maximum_fixes_coordinates_of_zero_scale() -> None:
    A = torch.tensor([[1.0, 0.3], [0.3, 0.5]], dtype=torch.float64)
    g = torch.tensor([0.2, 0.4], dtype=torch.float64)
    exact = trust_region_maximum(A, g, 0.7, scale=torch.tensor([0.0, 2.0], dtype=torch.float64))
    assert float(exact.d[0]) == 0.0
    # one free coordinate d_1 = 2 e, |e| <= 0.7: a parabola, maximal at the edge e = 0.7
    assert exact.value == pytest.approx(0.4 * 1.4 + 0.5 * 0.5 * 1.4 ** 2, rel=1e-12)


def test_trust_region_maximum_errors_name_the_shapes_and_bounds() -> None:
    g2 = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"A must be \[n, n\] and g \[n\], got A \(2, 3\) and "
                                         r"g \(2,\)"):
        trust_region_maximum(torch.ones(2, 3, dtype=torch.float64), g2, 1.0)
    with pytest.raises(ValueError, match=r"got A \(2, 2\) and g \(3,\)"):
        trust_region_maximum(torch.eye(2, dtype=torch.float64), torch.ones(3), 1.0)
    with pytest.raises(ValueError, match=r"got A \(2,\) and g \(2,\)"):
        trust_region_maximum(torch.ones(2, dtype=torch.float64), g2, 1.0)
    with pytest.raises(ValueError, match=r"scale must have shape \(2,\), got \(3,\)"):
        trust_region_maximum(torch.eye(2, dtype=torch.float64), g2, 1.0, scale=torch.ones(3))
    with pytest.raises(ValueError, match="^scale must be >= 0$"):
        trust_region_maximum(torch.eye(2, dtype=torch.float64), g2, 1.0,
                             scale=torch.tensor([1.0, -1.0]))
    for rho in (True, math.inf, 0.0, -1.0):
        with pytest.raises(ValueError, match="rho must be a finite number > 0"):
            trust_region_maximum(torch.eye(2, dtype=torch.float64), g2, rho)


@pytest.mark.parametrize("A, symmetric", [
    ([[1.0, 1.0 + 1e-7], [1.0, 1.0]], False),      # 1e-7 relative: above rtol 1e-10
    ([[1.0, 1.0 + 1e-9], [1.0, 1.0]], False),      # above atol 1e-12 + rtol 1e-10
    ([[1.0, 1.5e-12], [0.0, 1.0]], False),         # atol is 1e-12 for |A| <= 1
    ([[1e6, 5e-7], [0.0, 1e6]], True),             # atol scales with max |A|: 1e-6 here
])
def test_trust_region_maximum_symmetry_tolerance(A, symmetric) -> None:
    A = torch.tensor(A, dtype=torch.float64)
    g = torch.ones(2, dtype=torch.float64)
    if symmetric:
        trust_region_maximum(A, g, 1.0)
    else:
        with pytest.raises(ValueError, match="^A must be symmetric$"):
            trust_region_maximum(A, g, 1.0)
