"""The Auto-PGD solver against a plain-Python transcription of SPEC section 6.

The reference below is written from the SPEC text with NumPy floats and explicit branches (no
tensors, no ``where``): both must evaluate the same iterates in the same order, halve the step at
the same checkpoints and return the same best loss.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from quotientsharp.engine.coordinates import other_factor
from quotientsharp.engine.geometry import build_geometry
from quotientsharp.engine.solver import AscentSettings, ascend


def _objective_numpy(point: np.ndarray, seed: int) -> tuple[float, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b, c = rng.normal(size=(3, point.size))
    value = float(np.sum(a * np.sin(3 * b * point + c)) + 0.5 * point @ point)
    grad = 3 * a * b * np.cos(3 * b * point + c) + point
    return value, grad


def _schedule(n_iter: int) -> list[int]:
    """Croce & Hein's checkpoints, written here from the paper (not imported from the solver).

    ``p_0 = 0``, ``p_1 = 0.22``, ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)`` while
    ``p_j <= 1``; ``w_j = ceil(p_j N)``, in exact rational arithmetic, distinct and >= 1.
    """
    p = [Fraction(0), Fraction(22, 100)]
    while True:
        step = max(p[-1] - p[-2] - Fraction(3, 100), Fraction(6, 100))
        if p[-1] + step > 1:
            break
        p.append(p[-1] + step)
    return sorted({math.ceil(q * n_iter) for q in p[1:]} - {0})


def _reference_apgd(rho: float, n_iter: int, alpha: float, d: int, seed: int):
    """SPEC section 6, step by step, in the Euclidean ball (scale c = 1, straight lines)."""

    def project(x):
        norm = np.sqrt(np.sum(x * x))
        return x if norm <= rho else x * (rho / norm)

    def direction(g):
        norm = np.sqrt(np.sum(g * g))
        return g / norm if norm > 0 else g

    marks = [w for w in _schedule(n_iter) if w < n_iter]
    eta = 2 * rho
    x = np.zeros(d)
    f, g = _objective_numpy(x, seed)
    evaluated = [x.copy()]
    best_f, best_x, best_g = f, x.copy(), g.copy()
    x_prev, f_cur = x.copy(), f
    eta_at_last, best_at_last, last_mark, increases = eta, best_f, 0, 0
    halvings = []
    for k in range(n_iter):
        z = project(x + eta * direction(g))
        x_new = z if k == 0 else project(x + alpha * (z - x) + (1 - alpha) * (x - x_prev))
        f_new, g_new = _objective_numpy(x_new, seed)
        evaluated.append(x_new.copy())
        if f_new > f_cur:
            increases += 1
        if f_new > best_f:
            best_f, best_x, best_g = f_new, x_new.copy(), g_new.copy()
        x_prev, x, f_cur, g = x, x_new, f_new, g_new
        step = k + 1
        if marks and step == marks[0]:
            marks.pop(0)
            condition_1 = increases < 0.75 * (step - last_mark)
            condition_2 = eta == eta_at_last and best_f == best_at_last
            eta_at_last, best_at_last = eta, best_f
            if condition_1 or condition_2:
                eta /= 2
                halvings.append(step)
                x, x_prev, f_cur, g = best_x.copy(), best_x.copy(), best_f, best_g.copy()
            increases, last_mark = 0, step
    return best_f, evaluated, halvings


# Long runs converge to a plateau where consecutive losses tie to rounding, and a tie may
# break differently in the two implementations; these runs stop before that.
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n_iter", [12, 20])
def test_solver_follows_the_spec_step_by_step(seed: int, n_iter: int) -> None:
    d, rho, alpha = 3, 0.8, 0.75
    expected_best, expected_points, halvings = _reference_apgd(rho, n_iter, alpha, d, seed)

    evaluated = []

    def objective(xi):
        (x,) = xi
        evaluated.append(x.detach().numpy().copy())
        value, grad = _objective_numpy(x.detach().numpy(), seed)
        return torch.tensor(value, dtype=torch.float64), (torch.from_numpy(grad),)

    base = torch.zeros(d, dtype=torch.float64)
    geometry = build_geometry([other_factor([base], "euclidean", "line")], rho)
    outcome = ascend(geometry, objective, AscentSettings(n_iter=n_iter, alpha=alpha))
    assert len(evaluated) == n_iter + 1
    np.testing.assert_allclose(np.stack(evaluated), np.stack(expected_points), rtol=0,
                               atol=1e-13)
    assert float(outcome.loss) == pytest.approx(expected_best, abs=1e-13)
    best_index = int(np.argmax([_objective_numpy(p, seed)[0] for p in expected_points]))
    np.testing.assert_allclose(outcome.xi[0].numpy(), expected_points[best_index], atol=1e-13)


def test_the_reference_cases_exercise_restarts() -> None:
    halved = [_reference_apgd(0.8, n, 0.75, 3, seed)[2] for n in (12, 20) for seed in range(8)]
    assert sum(bool(h) for h in halved) >= 8
    assert any(h and h[0] == 5 for h in halved)         # a restart at the first checkpoint


def test_restarts_are_random_and_the_best_run_wins() -> None:
    d, rho = 3, 0.8
    runs = []

    def objective(xi):
        (x,) = xi
        value, grad = _objective_numpy(x.detach().numpy(), 1)
        if not runs or len(runs[-1]) == 6:
            runs.append([])
        runs[-1].append(x.detach().numpy().copy())
        return torch.tensor(value, dtype=torch.float64), (torch.from_numpy(grad),)

    base = torch.zeros(d, dtype=torch.float64)
    geometry = build_geometry([other_factor([base], "euclidean", "line")], rho)
    outcome = ascend(geometry, objective, AscentSettings(n_iter=5, restarts=3),
                     generator=torch.Generator().manual_seed(0))
    assert len(runs) == 4 and len(outcome.run_losses) == 4
    assert not runs[0][0].any()                                  # the first run starts at 0
    starts = [r[0] for r in runs[1:]]
    assert all(0 < np.linalg.norm(s) <= rho for s in starts)      # random points of the ball
    assert len({tuple(s) for s in starts}) == 3
    assert float(outcome.loss) == max(float(v) for v in outcome.run_losses)
    all_values = [_objective_numpy(p, 1)[0] for r in runs for p in r]
    assert float(outcome.loss) == pytest.approx(max(all_values), abs=1e-14)


def test_settings_are_validated() -> None:
    for bad in (dict(n_iter=0), dict(alpha=0.0), dict(alpha=1.5), dict(eta0=-1.0),
                dict(eta0=math.nan), dict(restarts=-1)):
        with pytest.raises(ValueError):
            AscentSettings(**bad)
    with pytest.raises(TypeError):
        AscentSettings(random_init=1)


def _apgd_reference(objective, x0: torch.Tensor, rho: float, n_iter: int, alpha: float,
                    eta0: float) -> tuple[float, torch.Tensor, list[float]]:
    """Auto-PGD in a Euclidean ball, written from its definition (one flat float64 vector).

    With the skip rule for non-finite evaluations (a no-op while every loss is finite): a NaN
    evaluation counts as the lowest loss (never best, never an increase) and the next step
    starts again from the best iterate."""
    def clip(v: torch.Tensor) -> torch.Tensor:
        norm = float(v.norm())
        return v if norm <= rho else v * (rho / norm)

    def evaluate(v: torch.Tensor) -> tuple[float, torch.Tensor]:
        loss, grad = objective(v)
        return loss, grad / grad.norm()

    x = prev = x0
    current, d = evaluate(x)
    best, best_x, best_d = current, x, d
    eta, mark_eta, mark_best, increases, last = eta0, eta0, best, 0, 0
    marks = [w for w in _schedule(n_iter) if w < n_iter]
    trace = [best]
    for k in range(n_iter):
        z = clip(x + eta * d)
        new = z if k == 0 else clip(x + alpha * (z - x) + (1 - alpha) * (x - prev))
        loss, new_d = evaluate(new)
        failed = not math.isfinite(loss)
        loss = -math.inf if failed else loss
        increases += loss > current
        if loss > best:
            best, best_x, best_d = loss, new, new_d
        trace.append(best)
        if failed:
            new, new_d, loss = best_x, best_d, best
        prev, x, current, d = x, new, loss, new_d
        if k + 1 in marks:
            oscillating = increases < 0.75 * (k + 1 - last)
            stalled = eta == mark_eta and best == mark_best
            mark_eta, mark_best = eta, best
            if oscillating or stalled:
                eta /= 2
                x = prev = best_x
                d, current = best_d, best
            increases, last = 0, k + 1
    return best, best_x, trace


def _wavy(shift: float):
    """A smooth non-concave objective on R^12 with its gradient, as a tuple of two tensors
    (shapes (3, 2) and (6,)), and the same objective on the flat vector."""
    generator = torch.Generator().manual_seed(7)
    matrix = torch.randn(9, 12, generator=generator, dtype=torch.float64)
    offset = torch.randn(9, generator=generator, dtype=torch.float64) + shift

    def flat(v: torch.Tensor) -> tuple[float, torch.Tensor]:
        u = matrix @ v + offset
        return float(torch.sin(3 * u).sum() + 0.5 * u.square().sum()), matrix.T @ (
            3 * torch.cos(3 * u) + u)

    def split(xi):
        v = torch.cat([xi[0].reshape(-1), xi[1]])
        loss, grad = flat(v)
        return torch.tensor(loss, dtype=torch.float64), (grad[:6].reshape(3, 2), grad[6:])
    return flat, split


@pytest.mark.parametrize("n_iter, alpha, shift, rho", [
    (20, 0.75, 0.0, 0.7), (9, 0.5, 1.0, 1.3), (33, 1.0, -0.5, 0.4), (14, 0.75, 0.3, 2.5)])
@pytest.mark.parametrize("host_decisions", [True, False])
def test_ascend_follows_auto_pgd_step_by_step(n_iter, alpha, shift, rho, host_decisions):
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall
    from quotientsharp.engine.solver import ascend

    base = (torch.ones(3, 2, dtype=torch.float64), torch.ones(6, dtype=torch.float64))
    ball = GeodesicBall(AdaptiveQuotient.of(base, "euclidean").frozen_point(base), rho)
    flat, split = _wavy(shift)
    outcome = ascend(ball, split, AscentSettings(n_iter=n_iter, alpha=alpha),
                     host_decisions=host_decisions)
    best, best_x, trace = _apgd_reference(flat, torch.zeros(12, dtype=torch.float64), rho,
                                          n_iter, alpha, 2 * rho)
    assert outcome.trace is not None
    torch.testing.assert_close(outcome.trace, torch.tensor(trace, dtype=torch.float64),
                               rtol=1e-10, atol=1e-12)
    assert float(outcome.loss) == pytest.approx(best, rel=1e-12)
    torch.testing.assert_close(torch.cat([outcome.xi[0].reshape(-1), outcome.xi[1]]), best_x,
                               rtol=1e-10, atol=1e-12)
    # the contracts: the best iterate lies in the ball, and its loss is the reported one
    assert float(ball.norm(outcome.xi)) <= rho * (1 + 1e-12)
    assert float(split(outcome.xi)[0]) == pytest.approx(float(outcome.loss), rel=1e-12)
    assert float(outcome.start_loss) == pytest.approx(flat(torch.zeros(12,
                                                                       dtype=torch.float64))[0])


@pytest.mark.parametrize("random_init, restarts", [(True, 0), (False, 2), (True, 3)])
def test_restarts_keep_the_best_run_and_a_monotone_trace(random_init, restarts):
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall
    from quotientsharp.engine.solver import ascend

    base = (torch.ones(3, 2, dtype=torch.float64), torch.ones(6, dtype=torch.float64))
    rho, n_iter = 0.9, 7
    ball = GeodesicBall(AdaptiveQuotient.of(base, "euclidean").frozen_point(base), rho)
    flat, split = _wavy(0.2)
    generator = torch.Generator().manual_seed(3)
    settings = AscentSettings(n_iter=n_iter, random_init=random_init, restarts=restarts)
    outcome = ascend(ball, split, settings, generator)
    runs = [float(r) for r in outcome.run_losses]
    assert len(runs) == restarts + 1
    assert float(outcome.loss) == max(runs)
    assert outcome.trace is not None and outcome.trace.shape == ((restarts + 1) * (n_iter + 1),)
    steps = outcome.trace.diff()
    assert bool((steps >= 0).all()) and float(outcome.trace[-1]) == float(outcome.loss)
    # every run's own best appears in the trace by the end of that run
    for r, value in enumerate(runs):
        assert float(outcome.trace[(r + 1) * (n_iter + 1) - 1]) >= value
    assert float(ball.norm(outcome.xi)) <= rho * (1 + 1e-12)
    assert float(split(outcome.xi)[0]) == pytest.approx(float(outcome.loss), rel=1e-12)
    # a random first start is not the origin, a start at the origin is
    start = flat(torch.zeros(12, dtype=torch.float64))[0]
    assert (float(outcome.start_loss) == pytest.approx(start)) != random_init


def test_skip_nonfinite_never_keeps_a_nonfinite_step():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall
    from quotientsharp.engine.solver import ascend

    base = (torch.zeros(2, dtype=torch.float64),)
    ball = GeodesicBall(AdaptiveQuotient.of(base, "euclidean").frozen_point(base), 1.0)

    def objective(xi):
        v = xi[0]
        # increases along the first axis; NaN past 0.5 (the finite maximum is 0.5 on the ray)
        loss = torch.where(v[0] > 0.5, torch.tensor(float("nan"), dtype=v.dtype), v[0])
        return loss, (torch.tensor([1.0, 0.0], dtype=v.dtype),)

    for skip in (True, False):
        outcome = ascend(ball, objective, AscentSettings(n_iter=12), skip_nonfinite=skip)
        assert outcome.nonfinite_count is not None and int(outcome.nonfinite_count) > 0
        assert int(outcome.nonfinite_at[0]) == 1          # the first step, to xi = (1, 0)
        assert torch.isnan(outcome.nonfinite_loss[0])
        if skip:
            assert 0 < float(outcome.loss) <= 0.5
            assert torch.isfinite(outcome.trace).all()


def test_a_handed_over_evaluation_is_taken_once():
    from quotientsharp.engine.solver import HandedOver

    pair = HandedOver(torch.tensor(1.0), (torch.ones(2),))
    loss, gradient = pair.take()
    assert float(loss) == 1.0 and gradient[0].shape == (2,)
    with pytest.raises(ValueError, match="this HandedOver evaluation was taken already"):
        pair.take()


@pytest.mark.parametrize("host_decisions", [True, False])
def test_a_batch_of_problems_is_solved_as_if_each_were_alone(host_decisions):
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall
    from quotientsharp.engine.solver import ascend

    shifts, radii, n_iter = (0.0, 1.0, -0.5), (0.7, 1.3, 0.4), 16
    problems = [_wavy(s)[0] for s in shifts]
    base = (torch.zeros(12, dtype=torch.float64),)
    frozen = AdaptiveQuotient.of(base, "euclidean").frozen_point(base)
    ball = GeodesicBall(frozen, torch.tensor(radii, dtype=torch.float64), problem_shape=(3,))

    def objective(xi):
        pairs = [f(v) for f, v in zip(problems, xi[0], strict=True)]
        return (torch.tensor([p[0] for p in pairs], dtype=torch.float64),
                (torch.stack([p[1] for p in pairs]),))

    outcome = ascend(ball, objective, AscentSettings(n_iter=n_iter),
                     host_decisions=host_decisions)
    assert outcome.trace is not None and outcome.trace.shape == (n_iter + 1, 3)
    for i, (flat, rho) in enumerate(zip(problems, radii, strict=True)):
        best, best_x, trace = _apgd_reference(flat, torch.zeros(12, dtype=torch.float64), rho,
                                              n_iter, 0.75, 2 * rho)
        torch.testing.assert_close(outcome.trace[:, i], torch.tensor(trace, dtype=torch.float64),
                                   rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(outcome.xi[0][i], best_x, rtol=1e-10, atol=1e-12)


def test_a_nonfinite_start_is_recorded_at_evaluation_zero():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall
    from quotientsharp.engine.solver import ascend

    base = (torch.zeros(2, dtype=torch.float64),)
    ball = GeodesicBall(AdaptiveQuotient.of(base, "euclidean").frozen_point(base), 1.0)

    def objective(xi):
        v = xi[0]
        # inf at the start, NaN past 0.9 (where the first step lands), finite in between
        loss = torch.where(v.abs().sum() == 0, torch.tensor(float("inf"), dtype=v.dtype),
                           torch.where(v[0] > 0.9, torch.tensor(float("nan"), dtype=v.dtype),
                                       v[0]))
        return loss, (torch.tensor([1.0, 0.0], dtype=v.dtype),)

    outcome = ascend(ball, objective, AscentSettings(n_iter=6), skip_nonfinite=True)
    assert outcome.nonfinite_at[0].dtype == torch.int64
    assert outcome.nonfinite_count is not None and outcome.nonfinite_count.dtype == torch.int64
    assert int(outcome.nonfinite_at[0]) == 0 and int(outcome.nonfinite_count) >= 2
    assert float(outcome.nonfinite_loss[0]) == float("inf")       # the first, not the NaN
    assert 0 < float(outcome.loss) <= 0.9


def test_checkpoints_follow_their_definition():
    from quotientsharp.engine.solver import checkpoints

    for n_iter in range(1, 160):
        assert checkpoints(n_iter) == _schedule(n_iter), n_iter


def test_ascent_settings_accept_their_boundaries_and_name_bad_values():
    AscentSettings(n_iter=1, eta0=0.5, alpha=1.0, restarts=0, random_init=False)
    AscentSettings(n_iter=1, eta0=2, alpha=0.25, restarts=1, random_init=True)
    bad = [({"n_iter": 0}, ValueError, "n_iter must be an integer >= 1"),
           ({"n_iter": True}, ValueError, "n_iter must be an integer >= 1"),
           ({"n_iter": 1.5}, ValueError, "n_iter must be an integer >= 1"),
           ({"eta0": 0.0}, ValueError, "eta0 must be a finite number > 0"),
           ({"eta0": True}, ValueError, "eta0 must be a finite number > 0"),
           ({"alpha": True}, ValueError, r"alpha must be in \(0, 1\]"),
           ({"alpha": 0.0}, ValueError, r"alpha must be in \(0, 1\]"),
           ({"restarts": True}, ValueError, "restarts must be an integer >= 0"),
           ({"restarts": -1}, ValueError, "restarts must be an integer >= 0"),
           ({"random_init": 1}, TypeError, "random_init must be a bool, got int")]
    for kwargs, error, message in bad:
        with pytest.raises(error, match=message):
            AscentSettings(**kwargs)


def test_the_step_formulas_leave_their_inputs_alone_by_default():
    """``gradient_step`` and ``momentum_step`` write into an input only when told to."""
    from quotientsharp.engine.solver import gradient_step, momentum_step

    generator = torch.Generator().manual_seed(30)
    xi, d, z, previous = ([torch.randn(3, 2, generator=generator, dtype=torch.float64)
                           for _ in range(2)] for _ in range(4))
    copies = [[t.clone() for t in v] for v in (xi, d, z, previous)]
    eta = torch.tensor(0.3, dtype=torch.float64)
    step = gradient_step(xi, d, eta)
    new = momentum_step(xi, z, previous, 0.75)
    for v, c in zip((xi, d, z, previous), copies, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(v, c, strict=True))
    for s, x, e in zip(step, xi, d, strict=True):
        torch.testing.assert_close(s, x + 0.3 * e)
    for n, x, a, p in zip(new, xi, z, previous, strict=True):
        torch.testing.assert_close(n, x + 0.75 * (a - x) + 0.25 * (x - p))
    assert gradient_step((), (), eta) == () and momentum_step((), (), (), 0.5) == ()


def _plateau_or_nan(shift: float, cap: float | None, nan_beyond: float | None):
    """The wavy objective, capped at ``cap`` (ties between iterates) and NaN beyond the
    radius ``nan_beyond`` (failed steps)."""
    flat, _ = _wavy(shift)

    def capped(v: torch.Tensor) -> tuple[float, torch.Tensor]:
        loss, grad = flat(v)
        if cap is not None:
            loss = min(loss, cap)
        if nan_beyond is not None and float(v.norm()) > nan_beyond:
            loss = float("nan")
        return loss, grad

    def split(xi):
        v = torch.cat([xi[0].reshape(-1), xi[1]])
        loss, grad = capped(v)
        return torch.tensor(loss, dtype=torch.float64), (grad[:6].reshape(3, 2), grad[6:])
    return capped, split


def _reference_apgd_skipping(objective, rho: float, n_iter: int, alpha: float):
    """:func:`_apgd_reference` from 0 with the solver's default first step, 2 rho."""
    return _apgd_reference(objective, torch.zeros(12, dtype=torch.float64), rho, n_iter, alpha,
                           2 * rho)


@pytest.mark.parametrize("shift, cap, nan_beyond, skip, n_iter", [
    (0.3, None, 0.9, True, 24), (0.3, 4.0, None, False, 24), (0.3, 4.0, 1.1, True, 24),
    (0.3, None, 1.1, True, 24)])
def test_ascend_follows_auto_pgd_through_ties_and_failed_steps(shift, cap, nan_beyond, skip,
                                                               n_iter):
    """Ties (a capped objective) are neither increases nor improvements; under
    ``skip_nonfinite`` a NaN step is never kept and the next starts from the best iterate."""
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall
    from quotientsharp.engine.solver import ascend

    rho, alpha = 1.3, 0.75
    base = (torch.ones(3, 2, dtype=torch.float64), torch.ones(6, dtype=torch.float64))
    ball = GeodesicBall(AdaptiveQuotient.of(base, "euclidean").frozen_point(base), rho)
    flat, split = _plateau_or_nan(shift, cap, nan_beyond)
    outcome = ascend(ball, split, AscentSettings(n_iter=n_iter, alpha=alpha),
                     skip_nonfinite=skip)
    best, best_x, trace = _reference_apgd_skipping(flat, rho, n_iter, alpha)
    torch.testing.assert_close(outcome.trace, torch.tensor(trace, dtype=torch.float64),
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(torch.cat([outcome.xi[0].reshape(-1), outcome.xi[1]]), best_x,
                               rtol=1e-10, atol=1e-12)
    assert float(outcome.loss) == pytest.approx(best, rel=1e-12)
    if nan_beyond is None:
        assert int(outcome.nonfinite_at[0]) == -1 and int(outcome.nonfinite_count) == 0
    else:
        assert int(outcome.nonfinite_at[0]) > 0
    assert outcome.nonfinite_count.dtype == torch.int64


def _euclidean_ball(rho: float = 1.3):
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    base = (torch.ones(3, 2, dtype=torch.float64), torch.ones(6, dtype=torch.float64))
    return GeodesicBall(AdaptiveQuotient.of(base, "euclidean").frozen_point(base), rho)


class _Counted:
    """An objective that counts its calls and its non-finite losses."""

    def __init__(self, split) -> None:
        self.split, self.calls, self.nonfinite = split, 0, 0

    def __call__(self, xi):
        self.calls += 1
        loss, grad = self.split(xi)
        self.nonfinite += int(not bool(torch.isfinite(loss)))
        return loss, grad


@pytest.mark.parametrize("restarts", [0, 2])
def test_a_handed_over_start_saves_one_evaluation_and_changes_nothing(restarts):
    from quotientsharp.engine.solver import HandedOver, ascend

    ball = _euclidean_ball()
    settings = AscentSettings(n_iter=7, restarts=restarts)
    _, split = _wavy(0.2)
    plain = _Counted(split)
    ticks: list[int] = []
    reference = ascend(ball, plain, settings, generator=torch.Generator().manual_seed(5),
                       on_evaluation=lambda: ticks.append(1))
    assert plain.calls == len(ticks) == settings.runs * settings.evaluations_per_run
    lent = _Counted(split)
    start = split(ball.zeros())
    outcome = ascend(ball, lent, settings, generator=torch.Generator().manual_seed(5),
                     initial=HandedOver(*start))
    assert lent.calls == plain.calls - 1
    torch.testing.assert_close(outcome.trace, reference.trace, rtol=0, atol=0)
    for a, b in zip(outcome.xi, reference.xi, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"initial is the evaluation at xi = 0, but "
                                         r"random_init=True starts elsewhere"):
        ascend(ball, split, AscentSettings(n_iter=3, random_init=True),
               initial=HandedOver(*start))


def test_ascend_does_not_skip_nonfinite_steps_unless_asked():
    from quotientsharp.engine.solver import ascend

    ball = _euclidean_ball()
    _, split = _plateau_or_nan(0.3, None, 1.1)      # NaN beyond 1.1 in a ball of 1.3
    settings = AscentSettings(n_iter=12)
    default = ascend(ball, split, settings)
    compared = ascend(ball, split, settings, skip_nonfinite=False)
    skipped = ascend(ball, split, settings, skip_nonfinite=True)
    torch.testing.assert_close(default.trace, compared.trace, rtol=0, atol=0, equal_nan=True)
    assert not torch.equal(default.trace, skipped.trace)


def test_ascend_starts_with_the_settings_step_size():
    flat, split = _wavy(0.4)
    from quotientsharp.engine.solver import ascend

    rho, eta0 = 1.3, 0.11
    outcome = ascend(_euclidean_ball(rho), split, AscentSettings(n_iter=15, eta0=eta0))
    best, _, trace = _apgd_reference(flat, torch.zeros(12, dtype=torch.float64), rho, 15, 0.75,
                                     eta0)
    torch.testing.assert_close(outcome.trace, torch.tensor(trace, dtype=torch.float64),
                               rtol=1e-10, atol=1e-12)


def test_random_restarts_follow_the_generator_not_the_global_state():
    from quotientsharp.engine.solver import ascend

    _, split = _wavy(0.1)
    settings = AscentSettings(n_iter=5, restarts=1, random_init=True)
    torch.manual_seed(1)
    first = ascend(_euclidean_ball(), split, settings, generator=torch.Generator().manual_seed(9))
    torch.manual_seed(2)
    again = ascend(_euclidean_ball(), split, settings, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(first.trace, again.trace, rtol=0, atol=0)
    # one trace entry per evaluation, run after run
    assert first.trace.shape == (settings.runs * (settings.n_iter + 1),)


def test_nonfinite_evaluations_are_counted_over_every_run():
    from quotientsharp.engine.solver import ascend

    _, split = _plateau_or_nan(0.3, None, 0.6)
    counted = _Counted(split)
    outcome = ascend(_euclidean_ball(), counted, AscentSettings(n_iter=8, restarts=3,
                                                                random_init=True),
                     generator=torch.Generator().manual_seed(2), skip_nonfinite=True)
    per_run = [int(a) for a in outcome.nonfinite_at]
    assert sum(k > 0 for k in per_run) >= 3              # several runs saw a NaN
    assert int(outcome.nonfinite_count) == counted.nonfinite > 0


class _LendingGeometry:
    """A geometry that keeps the directions it hands out and does not say the solver may
    overwrite them (no ``new_directions``)."""

    def __init__(self, ball) -> None:
        self.ball = ball
        self.handed: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = []
        self.radius, self.dtype, self.device = ball.radius, ball.dtype, ball.device

    def direction(self, egrad):
        d = self.ball.direction(egrad)
        self.handed.append((d, tuple(t.clone() for t in d)))
        return d

    def __getattr__(self, name):
        if name == "new_directions":         # not declared: the solver may not overwrite
            raise AttributeError(name)
        return getattr(self.ball, name)


def test_the_solver_never_writes_into_directions_it_was_lent():
    from quotientsharp.engine.solver import ascend

    _, split = _wavy(0.2)
    geometry = _LendingGeometry(_euclidean_ball())
    ascend(geometry, split, AscentSettings(n_iter=9))
    assert geometry.handed
    for d, copy in geometry.handed:
        assert all(torch.equal(a, b) for a, b in zip(d, copy, strict=True))
