"""Tests written against the survivors of the mutation run (``benchmarks/mutation.sh``).

Each test pins a behaviour that a surviving mutant changed without any test noticing; the
survivors file (``benchmarks/mutation_survivors.md``) names the mutants each one kills. They
use independent references (a hand-written Monte Carlo average, the definition of a
trust-region step) or the documented contract, never the code under test's own output.
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.engine.measures import NonFiniteLossError, _check_ascent
from quotientsharp.engine.solver import AscentOutcome, AscentSettings


def _mlp(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(),
                         nn.Linear(5, 3)).to(dtype)


def _batch(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(10, 4, generator=generator, dtype=dtype),
            torch.randint(0, 3, (10,), generator=generator))


# ------------------------------------------------------------------ _check_ascent's bookkeeping
def _outcome(count: int, at: list[int], best: float = 1.0) -> AscentOutcome:
    return AscentOutcome(
        loss=torch.tensor(best), xi=(), run_losses=[], start_loss=torch.tensor(0.5),
        nonfinite_at=[torch.tensor(k) for k in at],
        nonfinite_loss=[torch.tensor(float("inf") if k >= 0 else 0.0) for k in at],
        nonfinite_count=torch.tensor(count))


@pytest.fixture(scope="module")
def functional() -> FunctionalModel:
    return FunctionalModel(_mlp())


def test_no_count_means_no_nonfinite_evaluation(functional):
    outcome = AscentOutcome(loss=torch.tensor(1.0), xi=(), run_losses=[],
                            start_loss=torch.tensor(0.5))
    assert _check_ascent(outcome, 0, AscentSettings(n_iter=3), functional, 0.1, "raise") == 0


@pytest.mark.parametrize("random_init", [False, True])
def test_skip_keeps_a_run_with_one_finite_perturbed_evaluation(functional, random_init):
    settings = AscentSettings(n_iter=4, random_init=random_init)
    total = settings.evaluations_per_run
    # the perturbed evaluations: all of them from a random start, all but the clean start at 0
    perturbed = total if random_init else total - 1
    count = perturbed - 1          # one perturbed evaluation was finite: a value to report
    assert _check_ascent(_outcome(count, [1]), 0, settings, functional, 0.1, "skip") == count
    with pytest.raises(NonFiniteLossError, match="No perturbed evaluation was finite"):
        _check_ascent(_outcome(perturbed, [1]), 0, settings, functional, 0.1, "skip")


def test_the_message_names_the_first_run_and_evaluation_that_failed(functional):
    settings = AscentSettings(n_iter=5, restarts=2)
    # run 0 failed at its starting point (evaluation 0), run 2 at step 3
    with pytest.raises(NonFiniteLossError) as err:
        _check_ascent(_outcome(2, [0, -1, 3]), 4, settings, functional, 0.25, "raise")
    message = str(err.value)
    assert message.startswith("batch 4: the perturbed loss is inf at the starting point "
                              "(iteration 0) of run 0 (of 3); 2 of 18 evaluations")
    assert "No perturbed evaluation was finite" not in message
    assert "rho=0.25 is too large for float32" in message
    assert "nonfinite='skip'" in message
    with pytest.raises(NonFiniteLossError) as err:
        _check_ascent(_outcome(1, [-1, 3, -1]), 0, settings, functional, None, "raise")
    assert "at solver iteration 3 of 5 of run 1 (of 3)" in str(err.value)
    assert "the radius is too large" in str(err.value)
    with pytest.raises(NonFiniteLossError) as err:     # one run: no run named
        _check_ascent(_outcome(1, [2]), 0, AscentSettings(n_iter=5), functional, 0.1, "raise")
    assert "at solver iteration 2 of 5;" in str(err.value)


def test_a_half_precision_model_is_named_as_the_likely_cause():
    model = FunctionalModel(_mlp(dtype=torch.bfloat16))
    with pytest.raises(NonFiniteLossError,
                       match=r"half-precision overflow: the model runs in bfloat16 \(float16's "
                             r"largest finite value is 65504\).*model\.float\(\)"):
        _check_ascent(_outcome(1, [2]), 0, AscentSettings(n_iter=5), model, 0.1, "raise")


# ------------------------------------------------------------------------- the average measure
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_average_is_a_hand_written_monte_carlo_mean(adaptive, dtype):
    model, (x, y) = _mlp(3, dtype), _batch(dtype)
    rho, samples, seed = 0.3, 5, 11
    result = qs.sharpness(model, [(x, y)], measure="average", rho=rho, samples=samples,
                          adaptive=adaptive, seed=seed, progress=False, keep_perturbations=True)
    # the reference: delta ~ rho * c * N(0, 1) per entry, drawn parameter by parameter
    generator = torch.Generator().manual_seed(seed)
    names = [n for n, _ in model.named_parameters()]
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = nn.CrossEntropyLoss()
    with torch.no_grad():
        clean = loss(torch.func.functional_call(model, base, (x,)), y)
        losses, norms = [], []
        for _ in range(samples):
            noise = {n: torch.randn(base[n].shape, generator=generator, dtype=dtype)
                     for n in names}
            delta = {n: rho * noise[n] * (base[n].abs() if adaptive else 1) for n in names}
            point = {n: base[n] + delta[n] for n in names}
            losses.append(loss(torch.func.functional_call(model, point, (x,)), y))
            norms.append(rho * torch.sqrt(sum(noise[n].square().sum() for n in names)))
    expected = torch.stack(losses).mean() - clean
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    assert result.value == pytest.approx(float(expected), rel=tolerance, abs=tolerance)
    assert result.perturbation_norms[0]["total"] == pytest.approx(
        float(torch.stack(norms).mean()), rel=tolerance)
    # the kept perturbation is the last draw, by parameter name
    assert result.perturbations is not None
    kept = result.perturbations[0]
    assert sorted(kept) == sorted(names)
    for n in names:
        torch.testing.assert_close(kept[n].to(dtype), delta[n], rtol=tolerance, atol=tolerance)


class _Exploding(nn.Module):
    """A loss that is NaN when the first weight moves further than a threshold from 1."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold
        self.w = nn.Parameter(torch.tensor([1.0, -0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x * self.w
        moved = (self.w[0] - 1.0).abs() > self.threshold
        return torch.where(moved, torch.full_like(logits, float("nan")),
                           logits)


def test_average_raises_on_one_nonfinite_draw_by_default_and_skips_it_on_request():
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    # rho * |N(0, 1)| above 0.5 in some but not all of 40 draws (|N(0, 1)| > 1: a third)
    options = dict(measure="average", rho=0.5, samples=40, seed=0, progress=False)
    with pytest.raises(NonFiniteLossError, match=r"batch 0: the perturbed loss is nan at draw "
                                                 r"\d+ of 40; \d+ of 40 draws were not finite"
                                                 r"\. The clean loss is finite") as err:
        qs.sharpness(_Exploding(0.5), [(x, y)], **options)
    assert "nonfinite='skip'" in str(err.value) and "No draw was finite" not in str(err.value)
    bad = int(str(err.value).split("; ")[1].split(" of ")[0])
    assert 0 < bad < 40
    with pytest.warns(UserWarning, match=f"{bad} perturbed evaluation"):
        skipped = qs.sharpness(_Exploding(0.5), [(x, y)], nonfinite="skip", **options)
    assert skipped.nonfinite_evaluations == [bad]
    with pytest.raises(NonFiniteLossError, match="No draw was finite") as err:
        qs.sharpness(_Exploding(0.0), [(x, y)], nonfinite="skip", **options)
    assert "nonfinite='skip'" not in str(err.value)


# --------------------------------------------------------------------------- layer defaults
class _Three(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.middle, self.last = nn.Linear(4, 5), nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.tanh(self.middle(torch.tanh(self.first(x)))))


def test_relative_flatness_defaults_to_the_last_linear_layer():
    x, y = _batch()
    default = qs.sharpness(_Three(), [(x, y)], measure="relative_flatness", progress=False)
    named = qs.sharpness(_Three(), [(x, y)], measure="relative_flatness", layer="last",
                         progress=False)
    middle = qs.sharpness(_Three(), [(x, y)], measure="relative_flatness", layer="middle",
                          progress=False)
    assert default.value == named.value and default.value != middle.value


@pytest.mark.parametrize("layer, message", [
    ("nope", "nope"),
    ("act", "layer 'act' has no weight parameter"),
])
def test_a_bad_relative_flatness_layer_is_named(layer, message):
    model = nn.Sequential()
    model.add_module("lin", nn.Linear(4, 3))
    model.add_module("act", nn.Tanh())
    with pytest.raises(ValueError, match=message):
        qs.sharpness(model, [_batch()], measure="relative_flatness", layer=layer,
                     progress=False)


def test_a_frozen_relative_flatness_layer_is_named():
    model = _Three()
    model.last.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="the weight of layer 'last' is frozen"):
        qs.sharpness(model, [_batch()], measure="relative_flatness", layer="last",
                     progress=False)


def test_no_linear_layer_is_named():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w

    with pytest.raises(ValueError, match="the model has no trainable nn.Linear layer: pass "
                                         "layer='module name'"):
        qs.sharpness(Scale(), [_batch()], measure="relative_flatness", progress=False)


def test_the_deprecated_builders_warn_and_build_their_replacements():
    from quotientsharp.engine import measures, space

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = measures.plain_builder(None, 0.2, 2.0, True)
        geodesic = measures.geodesic_builder(None, 0.3, "sym", "inv", 2, 0.01, 3, "mix", "exp")
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    assert "plain_builder is deprecated: use quotientsharp.engine.space.PlainGeometry" in str(
        caught[0].message)
    assert ("geodesic_builder is deprecated: use quotientsharp.engine.space.GeodesicGeometry"
            in str(caught[1].message))
    assert plain == space.PlainGeometry(0.2, 2.0, True)
    assert geodesic == space.GeodesicGeometry(0.3, "sym", "inv", 2, 0.01, 3, "mix", "exp")


# ----------------------------------------------------------------- the solver: an independent APGD
def _reference_checkpoints(n_iter: int) -> list[int]:
    """``ceil(p_j N)`` for ``p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03,
    0.06)``, in exact fractions (Croce & Hein 2020)."""
    from fractions import Fraction

    marks, previous, current = [], Fraction(0), Fraction(22, 100)
    while current <= 1:
        w = -((-current * n_iter) // 1)
        if w >= 1 and w not in marks:
            marks.append(int(w))
        previous, current = current, current + max(current - previous - Fraction(3, 100),
                                                   Fraction(6, 100))
    return marks


def _reference_apgd(objective, x0: torch.Tensor, rho: float, n_iter: int, alpha: float,
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
    marks = [w for w in _reference_checkpoints(n_iter) if w < n_iter]
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
    best, best_x, trace = _reference_apgd(flat, torch.zeros(12, dtype=torch.float64), rho,
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


# ------------------------------------------------------------------ the trust region's contracts
def _gl_ball(metric: str, dtype: torch.dtype, seed: int, rho, problem_shape=()):
    from quotientsharp.core.gl import GLQuotient
    from quotientsharp.engine.ball import GeodesicBall

    quotient = GLQuotient(metric, n=5, m=4, h=3)
    generator = torch.Generator().manual_seed(seed)
    x = quotient.random_point(generator=generator, dtype=dtype)
    frozen = quotient.at(x)
    return quotient, x, frozen, GeodesicBall(frozen, rho, problem_shape=problem_shape), generator


def _metric_norm(quotient, x, u) -> torch.Tensor:
    return quotient.inner(x, u, u).sqrt()


@pytest.mark.parametrize("metric", ["inv", "mix", "euclidean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1])
def test_clip_rescales_radially_onto_the_sphere_and_keeps_the_inside(metric, dtype, seed):
    from quotientsharp.engine.decisions import ON_DEVICE, decisions_for

    rho = 0.4
    quotient, x, frozen, ball, generator = _gl_ball(metric, dtype, seed, rho)
    u = quotient.random_tangent(x, generator=generator)          # unit, horizontal
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    host = decisions_for(torch.zeros((), dtype=dtype), True)
    for scale in (3.0, 0.5, 1.0):          # outside, inside, on the sphere (rho = 0.4)
        v = tuple(scale * rho * t for t in u)
        for decisions in (ON_DEVICE, host):
            clipped = ball.clip(v, decisions)
            factor = min(1.0, 1.0 / scale)
            for c, t in zip(clipped, v, strict=True):
                torch.testing.assert_close(c, factor * t, rtol=tol, atol=tol)
            assert float(_metric_norm(quotient, x, clipped)) == pytest.approx(
                min(scale, 1.0) * rho, rel=tol)
    # project: the horizontal part of a vector with a vertical component, then the rescale
    noise = tuple(torch.randn(t.shape, generator=generator, dtype=dtype) for t in x)
    vertical = frozen.vertical_projection(noise)
    projected = ball.project(tuple(3 * rho * a + b for a, b in zip(u, vertical, strict=True)))
    for p, a in zip(projected, u, strict=True):
        torch.testing.assert_close(p, rho * a, rtol=10 * tol, atol=10 * tol)
    assert ball.norm(projected).dtype == dtype


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_direction_is_the_unit_riemannian_gradient(metric):
    quotient, x, frozen, ball, generator = _gl_ball(metric, torch.float64, 4, 0.3)
    egrad = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    d = ball.direction(egrad)
    assert float(ball.norm(d)) == pytest.approx(1.0, rel=1e-12)
    # <d, v>_x = <egrad, v>_E / ||grad|| for every horizontal v: the gradient's defining property
    norm = float(frozen.norm(frozen.riemannian_gradient(egrad)))
    for _ in range(3):
        v = quotient.random_tangent(x, generator=generator)
        euclidean = sum(float((e * t).sum()) for e, t in zip(egrad, v, strict=True))
        assert float(quotient.inner(x, d, v)) == pytest.approx(euclidean / norm, rel=1e-9,
                                                               abs=1e-12)
    assert float(ball.norm(ball.direction(tuple(torch.zeros_like(t) for t in x)))) == 0.0


def test_random_starts_are_horizontal_inside_the_ball_with_uniform_radius():
    rho = 0.7
    quotient, x, frozen, ball, generator = _gl_ball("mix", torch.float64, 5, rho)
    radii = []
    for _ in range(400):
        start = ball.random_start(generator)
        radii.append(float(ball.norm(start)))
        assert all(s.shape == t.shape for s, t in zip(start, x, strict=True))
    vertical = frozen.vertical_projection(start)
    assert sum(float(v.abs().max()) for v in vertical) < 1e-10
    radii_t = torch.tensor(radii) / rho
    assert float(radii_t.max()) <= 1 + 1e-12 and float(radii_t.min()) >= 0
    # U(0, 1): mean 1/2 and variance 1/12, checked within five standard errors
    assert abs(float(radii_t.mean()) - 0.5) < 5 * (1 / 12 / 400) ** 0.5
    assert float((radii_t < 0.5).float().mean()) == pytest.approx(0.5, abs=0.13)


def test_a_batch_of_problems_is_clipped_and_started_problem_by_problem():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    base = (torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64),)
    frozen = AdaptiveQuotient.of(base, "adaptive").frozen_point(base)
    radius = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64)
    ball = GeodesicBall(frozen, radius, problem_shape=(3,))
    zeros = ball.zeros()
    assert zeros[0].shape == (3, 3) and not zeros[0].any()
    xi = (torch.tensor([[0.3, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                       dtype=torch.float64),)
    # adaptive norms ||xi / |w| ||: 0.3, 0.5 and 2, against radii 0.1, 1 and 10
    clipped = ball.clip(xi)[0]
    torch.testing.assert_close(clipped, torch.stack([xi[0][0] / 3, xi[0][1], xi[0][2]]))
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        norms = ball.norm(ball.random_start(generator))
        assert norms.shape == (3,) and bool((norms <= radius * (1 + 1e-12)).all())


def test_the_box_clamps_signs_and_measures_in_scaled_units():
    from quotientsharp.engine.ball import BoxGeometry

    base = (torch.tensor([1.0, -2.0, 0.0]), torch.tensor([[3.0]]))
    scale = (base[0].abs(), torch.ones(1, 1))
    box = BoxGeometry(base, scale, 0.5)
    xi = (torch.tensor([2.0, -0.4, 5.0]), torch.tensor([[-0.7]]))
    expected = (torch.tensor([0.5, -0.4, 0.0]), torch.tensor([[-0.5]]))
    for got, want in zip(box.clip(xi), expected, strict=True):
        torch.testing.assert_close(got, want)
    for got, want in zip(box.point(xi), (base[0] + xi[0], base[1] + xi[1]), strict=True):
        torch.testing.assert_close(got, want)
    direction = box.direction((torch.tensor([-3.0, 2.0, 1.0]), torch.tensor([[-1e-9]])))
    torch.testing.assert_close(direction[0], torch.tensor([-1.0, 2.0, 0.0]))
    torch.testing.assert_close(direction[1], torch.tensor([[-1.0]]))
    # |xi / c| largest entry; a c = 0 coordinate counts 0 (it cannot move)
    torch.testing.assert_close(box.block_norms(xi)["total"], torch.tensor(2.0))
    generator = torch.Generator().manual_seed(1)
    draws = torch.stack([box.random_start(generator)[0] for _ in range(300)])
    assert bool((draws[:, 0].abs() <= 0.5).all()) and bool((draws[:, 1].abs() <= 1.0).all())
    assert not draws[:, 2].any()
    assert float(draws[:, 0].min()) < -0.4 and float(draws[:, 0].max()) > 0.4
    assert all(not z.any() and z.shape == b.shape for z, b in zip(box.zeros(), base,
                                                                  strict=True))
    with pytest.raises(ValueError, match="no coordinates to perturb"):
        BoxGeometry((), (), 0.5)


def test_validate_checks_the_largest_radius_of_a_batch():
    from quotientsharp.core.diagonal import DiagonalQuotient
    from quotientsharp.engine.ball import GeodesicBall

    quotient = DiagonalQuotient("mix", d=4)
    x = quotient.random_point(generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    frozen = quotient.at(x)
    limit = float((x[0] * x[1]).abs().min()) / 2 ** 0.5      # min |u v| / sqrt(2)
    GeodesicBall(frozen, torch.tensor([0.1, 0.5]) * limit, "exact", problem_shape=(2,)).validate()
    with pytest.raises(ValueError, match=r"order='exact' with the mix metric: rho=") as err:
        GeodesicBall(frozen, torch.tensor([0.1, 2.0]) * limit, "exact",
                     problem_shape=(2,)).validate()
    assert f"rho={2 * limit:g}" in str(err.value)


def test_block_norms_of_a_plain_ball_are_its_total_norm():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    base = (torch.tensor([1.0, -2.0]), torch.tensor([[4.0]]))
    ball = GeodesicBall(AdaptiveQuotient.of(base, "adaptive").frozen_point(base), 1.0)
    norms = ball.block_norms((torch.tensor([3.0, 0.0]), torch.tensor([[16.0]])))
    assert list(norms) == ["total"]
    torch.testing.assert_close(norms["total"], torch.tensor(5.0))     # |(3 / 1, 16 / 4)|


def test_the_ball_point_uses_its_order_and_steps():
    quotient, x, frozen, _, generator = _gl_ball("inv", torch.float64, 6, 1.0)
    from quotientsharp.engine.ball import GeodesicBall

    u = tuple(0.8 * t for t in quotient.random_tangent(x, generator=generator))
    coarse = GeodesicBall(frozen, 1.0, "exact", steps=1).point(u)
    fine = GeodesicBall(frozen, 1.0, "exact", steps=64).point(u)
    straight = GeodesicBall(frozen, 1.0, 1).point(u)
    for c, f, s, w, d in zip(coarse, fine, straight, x, u, strict=True):
        torch.testing.assert_close(s, w + d)
        assert float((c - f).abs().max()) > 1e-8          # one RK4 step is not 64
    torch.testing.assert_close(fine[0], frozen.geodesic(u, 1.0, "exact", 64)[0])


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


def test_the_deprecated_solver_names_warn_and_answer_as_before():
    from quotientsharp.engine import solver

    with pytest.warns(DeprecationWarning, match="HOST_DECISIONS_ON_CPU is deprecated and has no "
                                                "effect: pass host_decisions=False"):
        assert solver.HOST_DECISIONS_ON_CPU is True
    with pytest.warns(DeprecationWarning, match="host_decides is deprecated"):
        assert solver.host_decides(torch.tensor(1.0)) is True
        assert solver.host_decides(torch.ones(2)) is False
    with pytest.raises(AttributeError, match="has no attribute 'NO_SUCH_NAME'"):
        _ = solver.NO_SUCH_NAME


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
        best, best_x, trace = _reference_apgd(flat, torch.zeros(12, dtype=torch.float64), rho,
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
        assert checkpoints(n_iter) == _reference_checkpoints(n_iter), n_iter


def test_zeros_have_the_points_batch_shape_and_draws_follow_the_generator():
    from quotientsharp.core.gl import GLQuotient
    from quotientsharp.engine.ball import BoxGeometry, GeodesicBall

    quotient = GLQuotient("mix", n=5, m=4, h=3)
    x = quotient.random_point((2,), generator=torch.Generator().manual_seed(8),
                              dtype=torch.float64)
    ball = GeodesicBall(quotient.at(x), 0.5)
    assert [z.shape for z in ball.zeros()] == [t.shape for t in x]
    assert all(z.dtype == torch.float64 and not z.any() for z in ball.zeros())
    box = BoxGeometry(x, tuple(t.abs() for t in x), 0.5)
    for geometry in (ball, box):
        first = geometry.random_start(torch.Generator().manual_seed(3))
        again = geometry.random_start(torch.Generator().manual_seed(3))
        other = geometry.random_start(torch.Generator().manual_seed(4))
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
        assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
        assert all(f.dtype == torch.float64 for f in first)


# ------------------------------------------------------------------ core/diagonal
def _diagonal_point(metric: str, seed: int, batch=(3,), d: int = 4):
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient(metric, d=d)
    x = quotient.random_point(batch, generator=torch.Generator().manual_seed(seed),
                              dtype=torch.float64)
    return quotient, x


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_exact_diagonal_geodesics_default_to_time_one(metric):
    """Called without ``t``, the closed-form geodesic and quotient geodesic are those at t = 1,
    held against RK4 integration of the geodesic equation (an independent reference)."""
    from quotientsharp.core import reference

    quotient, x = _diagonal_point(metric, 11)
    generator = torch.Generator().manual_seed(12)
    u = tuple(0.2 * c * torch.randn(c.shape, generator=generator, dtype=c.dtype) for c in x)
    frozen = quotient.at(x)
    ode = reference.geodesic_ode(x, u, 1.0, quotient.point_ndims, quotient.christoffel,
                                 steps=256)
    for got, want in zip(frozen.geodesic_exact(u), ode, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=0.0)
    # the quotient geodesic is the image of the geodesic of a horizontal velocity
    h = frozen.horizontal_projection(u)
    ode = reference.geodesic_ode(x, h, 1.0, quotient.point_ndims, quotient.christoffel,
                                 steps=256)
    torch.testing.assert_close(frozen.quotient_geodesic(h), ode[0] * ode[1], rtol=1e-9, atol=0.0)


def test_the_mix_geodesic_may_pass_round_the_origin_of_the_complex_plane():
    """``1 + t (alpha + beta)`` negative with a nonzero imaginary part ``t (alpha - beta)``: the
    path goes round ``u v = 0`` and stays on the manifold (RK4 reaches the same point)."""
    from quotientsharp.core import reference
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("mix")
    x = (torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([0.5, 3.0],
                                                                      dtype=torch.float64))
    # alpha = u_u / u = -1.5, beta = u_v / v = -0.5: re = -1, im = -1 at t = 1
    u = (-1.5 * x[0], -0.5 * x[1])
    ode = reference.geodesic_ode(x, u, 1.0, quotient.point_ndims, quotient.christoffel,
                                 steps=512)
    for got, want in zip(quotient.at(x).geodesic_exact(u, 1.0), ode, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=0.0)


def test_a_mix_geodesic_that_reaches_the_origin_at_t_is_refused():
    """``alpha = beta = -1/2``: ``u(t) v(t) = u v (1 - t)^2`` is 0 at t = 1 exactly."""
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("mix")
    x = (torch.tensor([1.5, -2.0], dtype=torch.float64), torch.tensor([0.5, 3.0],
                                                                      dtype=torch.float64))
    u = (-0.5 * x[0], -0.5 * x[1])
    with pytest.raises(ValueError, match="shorten t or the velocity u"):
        quotient.at(x).geodesic_exact(u, 1.0)
    # just before, the path is still on the manifold
    assert bool((quotient.at(x).quotient_geodesic(u, 0.99) != 0).all())


def test_the_exact_mix_ball_limit_is_where_a_horizontal_geodesic_reaches_the_origin():
    """A horizontal ``xi = b (u, v)`` on the coordinate of least ``|u v|`` with norm ``rho``
    reaches ``u v = 0`` by t = 1 exactly when rho >= that coordinate's limit: the ball is
    accepted below the limit and refused at and above it."""
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("mix")
    x = (torch.tensor([1.5, -0.25, 2.0], dtype=torch.float64),
         torch.tensor([0.5, 0.75, -3.0], dtype=torch.float64))
    frozen = quotient.at(x)
    i = int((x[0] * x[1]).abs().argmin())
    unit = torch.zeros(3, dtype=torch.float64)
    unit[i] = -1.0
    xi = (unit * x[0], unit * x[1])                 # b = -1 on coordinate i, horizontal
    length = float(quotient.norm(x, xi))
    # the exact geodesic of xi scaled to norm r leaves the manifold by t = 1 iff r >= limit:
    # bisect for the limit on the geodesic itself
    low, high = 0.0, 10.0 * length
    for _ in range(80):
        mid = 0.5 * (low + high)
        try:
            frozen.geodesic_exact(tuple(mid / length * c for c in xi), 1.0)
            low = mid
        except ValueError:
            high = mid
    frozen.check_ball(0.99 * low, "exact")
    with pytest.raises(ValueError, match=r"leave the manifold \(reach") as err:
        frozen.check_ball(1.01 * high, "exact")
    assert "or order=2" in str(err.value)
    # the same for a batch of radii: only the largest counts
    frozen.check_ball(0.5 * low, 2)                 # not exact: nothing can leave


def test_diagonal_vertical_products_are_metric_products_with_the_vertical_vectors():
    for metric in ("inv", "mix"):
        quotient, x = _diagonal_point(metric, 13)
        frozen = quotient.at(x)
        generator = torch.Generator().manual_seed(14)
        u = tuple(torch.randn(c.shape, generator=generator, dtype=c.dtype) for c in x)
        dots, norms = frozen.vertical_products(u)
        for i in range(x[0].shape[-1]):
            e = torch.zeros(x[0].shape[-1], dtype=torch.float64)
            e[i] = 1.0
            vertical = (x[0] * e, -x[1] * e)         # V_i = (u_i, -v_i) e_i
            torch.testing.assert_close(dots[..., i], quotient.inner(x, vertical, u))
            torch.testing.assert_close(norms[..., i],
                                       quotient.inner(x, vertical, vertical).sqrt())


def test_diagonal_horizontality_error_over_two_batch_dimensions():
    for metric in ("inv", "mix"):
        quotient, x = _diagonal_point(metric, 15, batch=(2, 3))
        frozen = quotient.at(x)
        generator = torch.Generator().manual_seed(16)
        u = tuple(torch.randn(c.shape, generator=generator, dtype=c.dtype) for c in x)
        error = frozen.horizontality_error(u)
        assert error.shape == (2, 3)
        for j in range(2):
            for k in range(3):
                point = (x[0][j, k], x[1][j, k])
                tangent = (u[0][j, k], u[1][j, k])
                torch.testing.assert_close(error[j, k],
                                           quotient.at(point).horizontality_error(tangent))


def test_diagonal_submersion_of_another_point_and_without_a_closed_form():
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient, x = _diagonal_point("inv", 17)
    _, y = _diagonal_point("inv", 18)
    torch.testing.assert_close(quotient.at(x).submersion(y), y[0] * y[1])
    torch.testing.assert_close(quotient.submersion(y), y[0] * y[1])
    euclidean = DiagonalQuotient("euclidean")
    with pytest.raises(NotImplementedError, match="DiagonalEuclideanPoint has no closed-form"):
        euclidean.at(x).quotient_geodesic(x)


def test_diagonal_zero_entries_are_named_with_their_coordinates():
    from quotientsharp.core.diagonal import DiagonalQuotient

    u = torch.ones(2, 5, dtype=torch.float64)
    v = torch.ones(2, 5, dtype=torch.float64)
    v[0, 1] = 0.0
    v[1, 3] = 0.0
    for metric in ("inv", "mix"):
        quotient = DiagonalQuotient(metric)
        with pytest.raises(ValueError, match=r"w\[1\] \(v\) has zero entries \(v = 0 at "
                                             r"coordinates \[1, 3\]\), which the "
                                             + metric + r" metric divides by \(the orbit is "
                                             r"degenerate there\)"):
            quotient.check_point((u, v), "w")
        # the metric itself refuses them too, outside torch.func transforms
        with pytest.raises(ValueError, match="has zero entries"):
            quotient.inner((u, v), (u, u), (u, u))
    # the Euclidean metric refuses only u = v = 0
    euclidean = DiagonalQuotient("euclidean")
    a = torch.tensor([[0.0, 1.0, 2.0, 0.0], [1.0, 0.0, 0.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, 0.0, 2.0, 4.0], [0.0, 1.0, 1.0, 3.0]], dtype=torch.float64)
    euclidean.check_point((a, b))                    # u = 0 or v = 0 alone: allowed
    with pytest.raises(ValueError, match=r"w has u = v = 0 at coordinates \[2\]: the orbit "
                                         r"is degenerate there"):
        euclidean.check_point((a, b * torch.tensor([1.0, 1.0, 0.0, 1.0],
                                                   dtype=torch.float64)), "w")
    with pytest.raises(ValueError, match=r"x has u = v = 0 at coordinates \[0, 3\]"):
        euclidean.check_point((a[0], torch.tensor([0.0, 1.0, 1.0, 0.0],
                                                  dtype=torch.float64)))  # one point, no batch


def test_diagonal_point_checks_name_the_argument_and_both_shapes():
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("inv")
    with pytest.raises(ValueError, match=r"theta.*\(3,\).*\(4,\)"):
        quotient.check_point((torch.ones(3), torch.ones(4)), "theta")
    with pytest.raises(ValueError, match="theta"):
        quotient.check_point((torch.ones(3), torch.tensor([1.0, float("nan"), 1.0])), "theta")
    assert DiagonalQuotient().metric.name == "inv"          # the documented default


def test_the_diagonal_metric_works_inside_vmap():
    """Inside ``torch.func`` transforms the zero check (a data-dependent branch) is skipped."""
    quotient, x = _diagonal_point("mix", 19, batch=(3,))
    inner = torch.func.vmap(lambda a, b: quotient.inner((a, b), (a, b), (a, b)))(x[0], x[1])
    torch.testing.assert_close(inner, quotient.inner(x, x, x))


def test_diagonal_random_points_are_log_uniform_with_random_signs():
    """``|x|`` log-uniform on [1e-1, 1e1] (log10 |x| uniform on [-1, 1]), signs fair coins;
    the batch shape is kept; no generator needed; a generator makes draws reproducible."""
    from quotientsharp.core.diagonal import DiagonalQuotient

    quotient = DiagonalQuotient("inv", d=50)
    x = quotient.random_point((200,), generator=torch.Generator().manual_seed(20),
                              dtype=torch.float64)
    assert [c.shape for c in x] == [(200, 50), (200, 50)]
    for c in x:
        logs = c.abs().log10().flatten()
        n = logs.numel()
        assert float(logs.min()) >= -1.0 and float(logs.max()) <= 1.0
        # uniform on [-1, 1]: mean 0 and variance 1/3, within six standard errors
        assert abs(float(logs.mean())) < 6 * (1 / 3 / n) ** 0.5
        assert abs(float(logs.var()) - 1 / 3) < 6 * (4 / 45 / n) ** 0.5
        negative = float((c < 0).double().mean())
        assert abs(negative - 0.5) < 6 * (0.25 / n) ** 0.5
    assert all(c.dtype == torch.float32 for c in quotient.random_point((2,)))
    first = quotient.random_point((2,), generator=torch.Generator().manual_seed(21))
    again = quotient.random_point((2,), generator=torch.Generator().manual_seed(21))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    meta = quotient.random_point((2,), device="meta")
    assert all(c.device.type == "meta" for c in meta)


def test_diagonal_group_elements_are_signed_log_normal_and_reproducible():
    """``|a| = exp(scale N(0, 1))`` with a fair random sign; the same generator seed gives the
    same element."""
    quotient, x = _diagonal_point("mix", 22, batch=(400,), d=50)
    for scale, kwargs in ((1.0, {}), (0.5, {"scale": 0.5})):
        g = quotient.random_group_element(x, generator=torch.Generator().manual_seed(23),
                                          **kwargs)
        logs = g.abs().log().flatten()
        n = logs.numel()
        assert abs(float(logs.mean())) < 6 * scale / n ** 0.5
        assert abs(float(logs.std()) - scale) < 6 * scale / (2 * n) ** 0.5
        assert abs(float((g < 0).double().mean()) - 0.5) < 6 * (0.25 / n) ** 0.5
    first = quotient.random_group_element(x, generator=torch.Generator().manual_seed(24))
    again = quotient.random_group_element(x, generator=torch.Generator().manual_seed(24))
    assert torch.equal(first, again)


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_diagonal_isotropic_draws_follow_the_generator_in_the_points_dtype(metric):
    quotient, x = _diagonal_point(metric, 25)
    frozen = quotient.at(x)
    first = frozen.isotropic(torch.Generator().manual_seed(26))
    again = frozen.isotropic(torch.Generator().manual_seed(26))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    # drawn in float64, not drawn in float32 and widened: the standard normals carry more
    # than float32's 24 bits
    scale = (x[0].abs(), x[1].abs()) if metric == "inv" else (1 / x[1].abs(), 1 / x[0].abs())
    for draw, s in zip(first, scale, strict=True):
        assert draw.dtype == torch.float64
        normal = draw / s
        assert float((normal - normal.float().double()).abs().max()) > 1e-12


# ------------------------------------------------------------------ engine: settings, steps, balls
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
    """:func:`_reference_apgd` from 0 with the solver's default first step, 2 rho."""
    return _reference_apgd(objective, torch.zeros(12, dtype=torch.float64), rho, n_iter, alpha,
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


def test_the_ball_direction_never_writes_a_gradient_the_caller_lent():
    """The Euclidean metric's raised gradient is the gradient itself (or a view of it): the
    normalisation must divide into new tensors, for one problem and for a batch."""
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    generator = torch.Generator().manual_seed(31)
    # (an unbatched adaptive point does not take a batch of gradients: its in-place raise
    # cannot broadcast, a loud RuntimeError, so the batch runs with the Euclidean metric)
    for metric, problem_shape in (("euclidean", ()), ("euclidean", (2,)), ("adaptive", ())):
        base = (torch.rand(2, 3, generator=generator, dtype=torch.float64) + 0.5,
                torch.rand(4, generator=generator, dtype=torch.float64) + 0.5)
        frozen = AdaptiveQuotient.of(base, metric).frozen_point(base)
        ball = GeodesicBall(frozen, 1.0, problem_shape=problem_shape)
        egrad = tuple(torch.randn(*problem_shape, *t.shape, generator=generator,
                                  dtype=torch.float64) for t in base)
        kept = tuple(e.clone() for e in egrad)
        d = ball.direction(egrad)
        assert all(torch.equal(e, k) for e, k in zip(egrad, kept, strict=True))
        # the unit Riemannian gradient: g / ||g||, problem by problem
        g = frozen.riemannian_gradient(kept)
        norm = ball.norm(g)
        for a, b in zip(d, g, strict=True):
            lifted = norm.reshape(*norm.shape, *([1] * (b.dim() - norm.dim())))
            torch.testing.assert_close(a, b / lifted)


def test_a_ball_on_rows_is_the_ball_of_the_point_on_those_rows():
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.engine.ball import GeodesicBall

    base = (torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 4.0]], dtype=torch.float64),
            torch.tensor([2.0, -3.0], dtype=torch.float64))
    frozen = AdaptiveQuotient.of(base, "adaptive").frozen_point(base)
    ball = GeodesicBall(frozen, 0.7, "exact", steps=5, problem_shape=(2,))
    rows = {0: torch.tensor([0, 2])}
    cut = ball.on_rows(rows)
    assert (cut.radius, cut.order, cut.steps, cut.problem_shape) == (0.7, "exact", 5, (2,))
    torch.testing.assert_close(cut.base[0], base[0][[0, 2]])
    torch.testing.assert_close(cut.base[1], base[1])
    # the norm of a vector on those rows is the full ball's norm of it written into them
    xi = (torch.tensor([[[1.0, 0.0], [0.0, 2.0]]] * 2, dtype=torch.float64),
          torch.ones(2, 2, dtype=torch.float64))
    full = (torch.zeros(2, 3, 2, dtype=torch.float64).index_copy(1, rows[0], xi[0]), xi[1])
    torch.testing.assert_close(cut.norm(xi), ball.norm(full))


def test_block_norms_of_a_product_ball_name_its_factors():
    import quotientsharp as qs
    from quotientsharp.engine.ball import GeodesicBall

    quotient = qs.ProductQuotient([qs.GLQuotient("inv", n=3, m=2, h=2),
                                   qs.DiagonalQuotient("mix", d=3)])
    generator = torch.Generator().manual_seed(32)
    x = quotient.random_point(generator=generator, dtype=torch.float64)
    ball = GeodesicBall(quotient.at(x), 1.0)
    xi = quotient.horizontal_projection(x, tuple(torch.randn(t.shape, generator=generator,
                                                             dtype=torch.float64) for t in x))
    norms = ball.block_norms(xi)
    assert len(norms) == 3 and "total" in norms
    torch.testing.assert_close(norms["total"], ball.norm(xi))
    parts = [v for k, v in norms.items() if k != "total"]
    torch.testing.assert_close(sum(p.square() for p in parts), ball.norm(xi).square())


def test_random_starts_are_drawn_in_the_points_dtype():
    """A float64 point gets float64 radii and box offsets, not widened float32 draws."""
    from quotientsharp.engine.ball import BoxGeometry

    _, x, _, ball, _ = _gl_ball("mix", torch.float64, 33, 0.5)
    generator = torch.Generator().manual_seed(34)
    radii = torch.stack([ball.norm(ball.random_start(generator)) / 0.5 for _ in range(20)])
    assert float((radii - radii.float().double()).abs().max()) > 1e-12
    box = BoxGeometry(x, tuple(torch.ones_like(t) for t in x), 0.5)
    start = box.random_start(generator)
    assert all(s.dtype == torch.float64 for s in start)
    assert float(max((s - s.float().double()).abs().max() for s in start)) > 1e-12


def test_the_box_direction_of_a_zero_gradient_is_zero_and_its_clip_copies():
    from quotientsharp.engine.ball import BoxGeometry

    base = (torch.tensor([1.0, -2.0, 3.0]), torch.zeros(0))
    box = BoxGeometry(base, (base[0].abs(), torch.zeros(0)), 0.5)
    direction = box.direction((torch.tensor([0.0, -1.0, 2.0]), torch.zeros(0)))
    torch.testing.assert_close(direction[0], torch.tensor([0.0, -2.0, 3.0]))
    xi = (torch.tensor([2.0, 0.1, -9.0]), torch.zeros(0))
    kept = xi[0].clone()
    clipped = box.clip(xi)
    assert torch.equal(xi[0], kept)                  # the caller's vector is not clamped
    torch.testing.assert_close(clipped[0], torch.tensor([0.5, 0.1, -1.5]))
    # an empty block (a zero-size tensor) counts 0 in the largest scaled entry
    torch.testing.assert_close(box.block_norms(xi)["total"], torch.tensor(3.0))


# ------------------------------------------------------------------ engine: measures' edge paths
def test_the_likely_cause_of_a_float_model_says_what_to_do(functional):
    with pytest.raises(NonFiniteLossError,
                       match=r"the perturbed parameters or activations overflow \(or leave the "
                             r"loss's domain\); use a smaller rho"):
        _check_ascent(_outcome(1, [2]), 0, AscentSettings(n_iter=5), functional, 0.1, "raise")


class _NanAtBatch(nn.Module):
    """A linear model whose output is NaN on inputs whose first entry is exactly 7."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        return torch.where((x[:, :1] == 7.0), torch.full_like(out, float("nan")), out)


@pytest.mark.parametrize("measure", ["average", "relative_flatness", "worst_case",
                                     "worst_case_random"])
def test_a_nonfinite_clean_loss_names_its_batch_and_cause(measure):
    x, y = _batch()
    bad = x.clone()
    bad[0, 0] = 7.0
    options = {"average": {"rho": 0.1, "samples": 2}, "relative_flatness": {"layer": "lin"},
               "worst_case": {"rho": 0.1, "n_iter": 2},
               "worst_case_random": {"rho": 0.1, "n_iter": 2, "random_init": True}}[measure]
    measure = measure.removesuffix("_random")
    with pytest.raises(ValueError, match=r"the clean loss on batch 1 is not finite \(nan\): the "
                                         r"model's output at the unperturbed parameters is not "
                                         r"finite \(an overflow in float32\?"):
        qs.sharpness(_NanAtBatch(), [(x, y), (bad, y)], measure=measure, progress=False,
                     **options)


def test_average_with_every_parameter_excluded_is_named():
    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4, 3))
            self.unused = nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w.detach()

    with pytest.raises(ValueError, match="no parameter is left to perturb"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        qs.sharpness(Frozen(), [_batch()], measure="average", rho=0.1, samples=2,
                     progress=False)


def test_relative_flatness_names_a_weight_without_rows_or_gradient():
    class Vector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.scale = nn.Module()
            self.scale.weight = nn.Parameter(torch.ones(3))
            self.dead = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale.weight

    with pytest.raises(ValueError, match=r"the weight of layer 'scale' has shape \(3,\); "
                                         r"relative flatness needs rows w_s"):
        qs.sharpness(Vector(), [_batch()], measure="relative_flatness", layer="scale",
                     progress=False)
    with pytest.raises(ValueError, match="parameter 'dead.weight' receives no gradient"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        qs.sharpness(Vector(), [_batch()], measure="relative_flatness", layer="dead",
                     progress=False)


class _CubeRoot(nn.Module):
    """``sign(z) |z|^(4/3)`` of a linear layer: finite loss and gradient at ``z = 0``, an
    infinite second derivative there."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.lin(x)
        return z.sign() * z.abs().pow(4.0 / 3.0)


def test_relative_flatness_with_infinite_curvature_names_the_layer_and_dtype():
    x, y = _batch(torch.float64)
    x[0] = 0.0                                     # z = 0 on the first sample
    model = _CubeRoot().to(torch.float64)
    with pytest.raises(NonFiniteLossError,
                       match=r"batch 0: relative flatness is (nan|inf): the Hessian-vector "
                             r"products of layer weight 'lin.weight' are not finite although "
                             r"the clean loss is \(an overflow in float64\?\)"):
        qs.sharpness(model, [(x, y)], measure="relative_flatness", layer="lin", progress=False)


def test_relative_flatness_hessian_products_one_at_a_time_equal_the_batched_ones(monkeypatch):
    """The fallback for operators without a batched double backward gives the same
    products."""
    from quotientsharp.engine.measures import RelativeFlatness

    generator = torch.Generator().manual_seed(40)
    weight = torch.randn(3, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 4, generator=generator, dtype=torch.float64)
    with torch.enable_grad():
        loss = torch.tanh(x @ weight.T).pow(3).sum()
        (grad,) = torch.autograd.grad(loss, weight, create_graph=True)
    directions = torch.randn(6, 3, 4, generator=generator, dtype=torch.float64)
    batched = RelativeFlatness._hvp(grad, weight, directions)
    original = torch.autograd.grad

    def no_batching(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            raise RuntimeError("no batching rule")
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", no_batching)
    single = RelativeFlatness._hvp(grad, weight, directions)
    monkeypatch.undo()
    torch.testing.assert_close(single, batched)
    # and the reference: each product by its own autograd call, direction by direction
    for d, product in zip(directions, single, strict=True):
        (expected,) = torch.autograd.grad(grad, weight, grad_outputs=d, retain_graph=True)
        torch.testing.assert_close(product, expected)


# ------------------------------------------------------------------ engine: ascend's bookkeeping
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
    # the deprecated one-element list hands it over too
    listed = _Counted(split)
    with pytest.warns(DeprecationWarning, match=r"ascend\(initial=\[pair\]\) is deprecated: "
                                                r"pass initial=HandedOver\(loss, gradient\) to "
                                                r"hand the evaluation over, or the pair to lend "
                                                r"it"):
        again = ascend(ball, listed, settings, generator=torch.Generator().manual_seed(5),
                       initial=[split(ball.zeros())])
    assert listed.calls == plain.calls - 1
    torch.testing.assert_close(again.trace, reference.trace, rtol=0, atol=0)
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
    best, _, trace = _reference_apgd(flat, torch.zeros(12, dtype=torch.float64), rho, 15, 0.75,
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


def test_ball_defaults_and_an_empty_point():
    from quotientsharp.engine.ball import GeodesicBall

    quotient, x, frozen, _, generator = _gl_ball("inv", torch.float64, 6, 1.0)
    u = tuple(0.8 * t for t in quotient.random_tangent(x, generator=generator))
    for p, w, d in zip(GeodesicBall(frozen, 1.0).point(u), x, u, strict=True):
        torch.testing.assert_close(p, w + d)                 # order 1 by default
    exact = GeodesicBall(frozen, 1.0, "exact").point(u)      # 16 RK4 steps by default
    for a, b in zip(exact, frozen.geodesic(u, 1.0, "exact", 16), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in
               zip(exact, frozen.geodesic(u, 1.0, "exact", 17), strict=True))

    class Empty:
        x: tuple = ()

    with pytest.raises(ValueError, match="the geometry has no coordinates to perturb"):
        GeodesicBall(Empty(), 1.0)


def test_a_batch_of_problems_gets_unit_directions_problem_by_problem():
    """Batched GL points (new raised gradients, divided in place) with one problem each."""
    from quotientsharp.core.gl import GLQuotient
    from quotientsharp.engine.ball import GeodesicBall

    quotient = GLQuotient("mix", n=5, m=4, h=3)
    generator = torch.Generator().manual_seed(41)
    x = quotient.random_point((2,), generator=generator, dtype=torch.float64)
    frozen = quotient.at(x)
    ball = GeodesicBall(frozen, 0.5, problem_shape=(2,))
    egrad = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    d = ball.direction(egrad)
    g = frozen.riemannian_gradient(egrad)
    norm = quotient.norm(x, g)
    for a, b in zip(d, g, strict=True):
        torch.testing.assert_close(a, b / norm.reshape(2, *([1] * (b.dim() - 1))))
    torch.testing.assert_close(ball.norm(d), torch.ones(2, dtype=torch.float64))


def test_two_runs_are_named_in_the_message(functional):
    settings = AscentSettings(n_iter=5, restarts=1)
    with pytest.raises(NonFiniteLossError, match=r"at solver iteration 3 of 5 of run 1 \(of 2\)"):
        _check_ascent(_outcome(1, [-1, 3]), 0, settings, functional, 0.1, "raise")


def test_a_nonfinite_average_names_the_radius():
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    with pytest.raises(NonFiniteLossError, match=r"rho=0\.5 is too large for float32"):
        qs.sharpness(_Exploding(0.5), [(x, y)], measure="average", rho=0.5, samples=40, seed=0,
                     progress=False)


def test_a_weight_that_is_not_a_registered_parameter_is_named():
    model = _Three()
    # an nn.Parameter stored as a plain attribute: the module has it, the model does not list it
    object.__setattr__(model.middle, "weight", nn.Parameter(torch.ones(6, 5)))
    with pytest.raises(ValueError, match="the weight of layer 'middle' is not among the "
                                         "model's parameters"):
        qs.sharpness(model, [_batch()], measure="relative_flatness", layer="middle",
                     progress=False)


# ------------------------------------------------------------------ engine: the reference solve
class _NanFrom:
    """Cross-entropy until call ``after`` (0-based), NaN from then on: one batch, so call ``k``
    is the batch's evaluation ``k`` (0: the clean one; then the measurement's steps, then the
    reference solve's)."""

    def __init__(self, after: int) -> None:
        self.after, self.calls = after, 0

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = nn.functional.cross_entropy(output, target)
        return loss * math.nan if self.calls > self.after else loss


@pytest.mark.parametrize("after, solve, iteration", [(2, "", "2 of 5"),
                                                     (7, " (reference solve)", "2 of 7")])
def test_a_nonfinite_solve_names_itself_its_batch_and_radius(after, solve, iteration):
    # measurement: evaluations 0 (clean) to 5; the reference solve: its steps 1 to 7 (its
    # evaluation at xi = 0 is the measurement's); poisoned from evaluation `after` on
    x, y = _batch()
    with pytest.raises(NonFiniteLossError) as err:
        qs.sharpness(_mlp(), [(x, y)], measure="worst_case", rho=0.1, n_iter=5, seed=0,
                     progress=False, loss=_NanFrom(after), reach=False,
                     reference_solve={"n_iter": 7, "restarts": 0})
    total = 6 if not solve else 8
    assert str(err.value).startswith(
        f"batch 0{solve}: the perturbed loss is nan at solver iteration {iteration}; "
        f"{total - 2} of {total} evaluations were not finite. The clean loss is finite, so "
        "the perturbation caused it: likely cause: the radius rho=0.1 is too large for "
        "float32")
    assert str(err.value).endswith("(recorded in result.settings and "
                                   "result.nonfinite_evaluations)")         # the skip hint


class _Counting(nn.Module):
    """NaN, with a NaN gradient, where the first weight moved further than ``threshold`` from
    1 (so that a step from there is NaN too unless it is skipped); counts its forward passes."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold, self.forwards = threshold, 0
        self.w = nn.Parameter(torch.tensor([1.0, -0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return x * self.w + 0.0 * torch.sqrt(self.threshold - (self.w[0] - 1.0).abs())


@pytest.mark.parametrize("measure", ["worst_case", "adaptive"])
def test_the_reference_solve_is_its_settings_solve_run_second_and_skips_alike(measure):
    # without restarts, a solve from xi = 0 draws nothing: the reference solve must be the
    # measurement a run with its settings would make, and under nonfinite='skip' the batch
    # counts the skipped evaluations of both solves
    x, y = torch.ones(4, 2), torch.tensor([0, 1, 0, 1])
    options = dict(measure=measure, rho=1.0, seed=0, progress=False, nonfinite="skip",
                   reach=False)
    runs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)        # the skipped-evaluations warning
        for name, n_iter, reference in (("own", 5, None), ("alone", 7, None),
                                        ("both", 5, {"n_iter": 7, "restarts": 0})):
            model = _Counting(0.5)
            runs[name] = (qs.sharpness(model, [(x, y)], n_iter=n_iter,
                                       reference_solve=reference, **options), model.forwards)
    (own, own_forwards), (alone, alone_forwards), (both, both_forwards) = (
        runs["own"], runs["alone"], runs["both"])
    assert own.nonfinite_evaluations[0] > 0 and alone.nonfinite_evaluations[0] > 0
    assert both.value == own.value
    assert both.reference_per_batch == [alone.value]
    assert both.nonfinite_evaluations == [own.nonfinite_evaluations[0]
                                          + alone.nonfinite_evaluations[0]]
    # the reference solve starts from the measurement's evaluation at xi = 0: its 7 steps
    assert both_forwards - own_forwards == 7 == alone_forwards - own_forwards + 5


@pytest.mark.parametrize("random_init", [False, True])
def test_the_reference_solve_draws_from_its_own_generator(random_init):
    x, y = _batch()
    traces = []
    for state in (1, 2):
        model = _mlp()                                  # (it seeds the global state)
        torch.manual_seed(state)                        # the global state must not matter
        result = qs.sharpness(model, [(x, y)], measure="worst_case", rho=0.1, n_iter=2,
                              seed=0, progress=False,
                              reference_solve={"n_iter": 2, "restarts": 2,
                                               "random_init": random_init})
        assert result.reference_traces is not None
        traces.append(result.reference_traces[0])
    assert traces[0] == traces[1] and len(traces[0]) == 3 * 3      # three runs of 2 steps


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_both_solves_follow_the_nonfinite_policy(monkeypatch, policy):
    # on this network, skipping a failed step and comparing it take the same path (the loss
    # pins neither); the policy reaching both solves is what `nonfinite` promises
    import quotientsharp.engine.measures as measures
    import quotientsharp.engine.solver as solver

    solve = solver.ascend
    seen: list[object] = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("skip_nonfinite"))
        return solve(*args, **kwargs)

    monkeypatch.setattr(measures, "ascend", spy)
    monkeypatch.setattr(solver, "ascend", spy)      # the search's own ascents
    qs.sharpness(_mlp(), [_batch()], measure="worst_case", rho=0.1, n_iter=2, seed=0,
                 progress=False, nonfinite=policy, reference_solve={"n_iter": 2, "restarts": 0})
    # the measurement's search (two chains at least) and the reference solve
    assert len(seen) >= 3 and seen == [policy == "skip"] * len(seen)


class _Bar:
    """A progress bar that counts its updates."""

    def __init__(self, total: int) -> None:
        self.total, self.updates = total, 0

    def update(self, n: int = 1) -> None:
        self.updates += n

    def close(self) -> None:
        pass


@pytest.mark.parametrize("measure, options", [
    ("worst_case", {}), ("worst_case", {"reference_solve": {"n_iter": 3, "restarts": 1}}),
    ("adaptive", {"restarts": 1, "reference_solve": {"n_iter": 2, "restarts": 0}}),
    ("average", {"samples": 3}), ("relative_flatness", {})])
def test_the_progress_bar_counts_every_evaluation(monkeypatch, measure, options):
    import quotientsharp.engine.api as api

    bars: list[_Bar] = []

    def bar(batches, per_batch, progress, name):
        bars.append(_Bar(len(batches) * per_batch))
        return bars[-1]

    monkeypatch.setattr(api, "_progress_bar", bar)
    if measure in ("worst_case", "adaptive"):
        options = {"n_iter": 4, **options}
    if measure != "relative_flatness":
        options = {"rho": 0.1, **options}
    x, y = _batch()
    qs.sharpness(_mlp(), [(x, y), (x[:6], y[:6])], measure=measure, seed=0, **options)
    assert bars[0].total > 0 and bars[0].updates == bars[0].total


def test_parameters_without_gradient_are_named_as_dropped_or_kept():
    from quotientsharp.engine.measures import warn_excluded

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_excluded(["a", "b", "c"], {"b"})
    assert [(w.category, str(w.message)) for w in caught] == [
        (UserWarning, "parameter(s) ['a', 'c'] receive no gradient from the loss: excluded "
                      "from the perturbation (kept fixed)"),
        (UserWarning, "parameter(s) ['b'] receive no gradient from the loss but belong to a "
                      "symmetry pair: they stay in the geometry with a zero gradient")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_excluded(["b"], {"b"})
        warn_excluded([], set())
    assert len(caught) == 1 and "['b'] receive no gradient from the loss but" in str(
        caught[0].message)


# ------------------------------------------------------------------ AscentMeasure.setup
class _GateWithDetachedHalf(nn.Module):
    """``head(x * (u * v))`` with ``v`` read through ``detach``: the rescaling ``(a u, v / a)``
    is a symmetry of the function, but ``v`` receives no gradient; ``unused`` is never read."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.u = nn.Parameter(torch.rand(4, generator=gen, dtype=torch.float64) + 0.5)
        self.v = nn.Parameter(torch.rand(4, generator=gen, dtype=torch.float64) + 0.5)
        self.unused = nn.Parameter(torch.ones(2, dtype=torch.float64))
        self.head = nn.Linear(4, 3).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x * (self.u * self.v.detach()))


def test_a_bound_parameter_without_gradient_is_kept_and_an_unbound_one_dropped():
    # the binding's coordinates decide: v is in the binding (kept in the geometry, zero
    # gradient), unused is not (dropped); a setup that lost the coordinates, or named every
    # bound parameter, or failed to intersect, would warn otherwise (or not at all)
    torch.manual_seed(0)
    model = _GateWithDetachedHalf()
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 4, generator=gen, dtype=torch.float64),
                torch.randint(0, 3, (8,), generator=gen))]
    binding = qs.QuotientBinding(qs.DiagonalQuotient("inv"), ["u", "v"], name="gate")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = qs.sharpness(model, batches, measure="geodesic", rho=0.05, n_iter=3,
                              symmetries=[binding], progress=False)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    dropped = [m for m in messages if "excluded from the perturbation" in m]
    kept = [m for m in messages if "belong to a symmetry pair" in m]
    assert len(dropped) == 1 and "['unused']" in dropped[0], messages
    assert len(kept) == 1 and "['v']" in kept[0], messages
    assert math.isfinite(result.value)


def test_the_space_before_setup_is_an_error(functional):
    from quotientsharp.engine.measures import AscentMeasure
    from quotientsharp.engine.space import PlainGeometry

    measure = AscentMeasure(functional, AscentSettings(n_iter=2), torch.Generator(),
                            PlainGeometry(0.1, 2.0, True))
    for name in ("space", "geometry", "coordinates"):
        with pytest.raises(RuntimeError, match="setup has not run"):
            getattr(measure, name)


@pytest.mark.parametrize("bad", ["nan", "rank"])
def test_the_frozen_point_errors_name_the_point_given_to_at(bad) -> None:
    # GLQuotient.at(x, name): both the point check and the frozen point's own rank check
    # name the caller's point, not the default "x"
    gen = torch.Generator().manual_seed(0)
    G = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    H = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    if bad == "nan":
        G[0, 0] = float("nan")
    else:
        G[:, 1] = G[:, 0]                     # linearly dependent columns: G^T G singular
    with pytest.raises(ValueError, match=r"theta\[0\]"):
        qs.GLQuotient("mix").at((G, H), "theta")


# ------------------------------------------------------------------ the adaptive frozen point
def _adaptive_point(metric: str = "adaptive", fused: bool = True):
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 3, generator=generator, dtype=torch.float64),
         torch.randn(5, generator=generator, dtype=torch.float64),
         torch.randn((), generator=generator, dtype=torch.float64))
    quotient = AdaptiveQuotient(metric, point_ndims=[2, 1, 0], fused=fused)
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    return quotient, quotient.at(x), x, u


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("metric", ["adaptive", "euclidean"])
def test_adaptive_point_refuses_a_tangent_tuple_of_another_length(metric, fused) -> None:
    # a shorter tuple would otherwise be paired with the first tensors and silently cut
    _, point, _, u = _adaptive_point(metric, fused)
    short = u[:-1]
    operations = [lambda: point.geodesic_exact(short), lambda: point.geodesic(short, 0.5, order=1),
                  lambda: point.geodesic(short, order=2), lambda: point.squared_norm(short),
                  lambda: point.inner(short, u), lambda: point.inner(u, short),
                  lambda: point.raise_index(short),
                  lambda: point.riemannian_gradient_and_squared_norm(short)]
    if metric == "adaptive":
        # (the Euclidean metric's connection is zero: its Christoffel term pairs no tuples)
        operations += [lambda: point.christoffel(short), lambda: point.christoffel(u, short),
                       lambda: point.christoffel(short, u)]
    for operation in operations:
        with pytest.raises(ValueError):
            operation()
    # the raise pairs nothing with the point under the Euclidean metric: its own message
    with pytest.raises(ValueError, match=rf"^raise_index: {len(short)} gradient tensors for a "
                                         rf"point of {len(u)}$"):
        point.raise_index(short)


def test_adaptive_point_on_rows_works_unfused_and_names_a_bad_slot() -> None:
    _, fused, x, u = _adaptive_point()
    _, unfused, _, _ = _adaptive_point(fused=False)
    rows = {0: torch.tensor([0, 2])}
    # the unfused point is unbatched too: the same cut, the same norm of a cut vector
    cut_u = (u[0][[0, 2]], u[1], u[2])
    assert torch.allclose(unfused.on_rows(rows).squared_norm(cut_u),
                          fused.on_rows(rows).squared_norm(cut_u), rtol=1e-14, atol=0)
    assert torch.equal(unfused.on_rows(rows).x[0], x[0][[0, 2]])
    for slot in (3, 7, -1, 2):           # out of range, or the 0-dim tensor (no rows)
        with pytest.raises(ValueError, match=f"slot {slot} is not a tensor of rows"):
            fused.on_rows({slot: torch.tensor([0])})


def test_adaptive_point_on_rows_refuses_a_batched_point() -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    quotient = AdaptiveQuotient("adaptive", point_ndims=[1])
    batched = quotient.at((torch.randn(3, 4, dtype=torch.float64),))
    with pytest.raises(ValueError, match="^on_rows needs an unbatched point "):
        batched.on_rows({0: torch.tensor([0])})


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_adaptive_vertical_vectors_are_zeros_shaped_like_batched_tangent_vectors(dtype) -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    quotient = AdaptiveQuotient("adaptive", point_ndims=[2, 1])
    x = (torch.randn(2, 4, 3, dtype=dtype), torch.randn(1, 5, dtype=dtype))   # batch (2,), (1,)
    # each component's batch broadcast with the algebra element's
    for algebra_batch, shapes in (((), [(2, 4, 3), (1, 5)]),
                                  ((7, 1), [(7, 2, 4, 3), (7, 1, 5)]),
                                  ((2,), [(2, 4, 3), (2, 5)])):
        a = torch.zeros(*algebra_batch, 0, dtype=dtype)          # the trivial group: dimension 0
        vertical = quotient.vertical(x, a)
        assert [tuple(v.shape) for v in vertical] == shapes
        assert all(v.dtype == dtype and not v.any() for v in vertical)
    with pytest.raises(ValueError):              # one tensor fewer than the quotient's
        quotient.vertical(x[:1], torch.zeros(0, dtype=dtype))


def test_adaptive_norm_is_differentiable_in_the_vector_and_the_point() -> None:
    # sum (u / |w|)^2: d/du = 2 u / w^2, d/dw = -2 u^2 sign(w) / |w|^3, written out here
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(8)
    x = tuple(torch.randn(s, generator=generator, dtype=torch.float64) + 3.0
              for s in [(4, 3), (5,)])
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    leaves = tuple(t.clone().requires_grad_(True) for t in x)
    point = AdaptiveQuotient("adaptive", point_ndims=[2, 1]).at(leaves)
    grads = torch.autograd.grad(point.squared_norm(u), leaves)
    for g, w, a in zip(grads, x, u, strict=True):
        assert torch.allclose(g, -2 * a.square() * w.sign() / w.abs() ** 3, rtol=1e-12, atol=0)
    vectors = tuple(a.clone().requires_grad_(True) for a in u)
    plain = AdaptiveQuotient("adaptive", point_ndims=[2, 1]).at(x)
    grads = torch.autograd.grad(plain.squared_norm(vectors), vectors)
    for g, w, a in zip(grads, x, u, strict=True):
        assert torch.allclose(g, 2 * a / w.square(), rtol=1e-12, atol=0)


def test_adaptive_norm_of_a_float64_vector_at_a_float32_point_is_promoted() -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(9)
    x = tuple(torch.randn(s, generator=generator) for s in [(4, 3), (5,)])
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    norm = AdaptiveQuotient("adaptive", point_ndims=[2, 1]).at(x).squared_norm(u)
    # 1 / |w| in the point's float32 (the point's own precision), the rest in float64
    expected = sum(float((a * (1 / w.abs())).square().sum()) for a, w in zip(u, x, strict=True))
    assert norm.dtype == torch.float64
    assert abs(float(norm) - expected) <= 1e-12 * expected


def test_adaptive_norm_has_a_finite_derivative_at_a_zero_weight() -> None:
    # c = 0 coordinates are fixed (1 / c read as 0): the derivative there is 0, never 0 * inf
    from quotientsharp.core.adaptive import AdaptiveQuotient

    w = torch.tensor([[0.5, 0.0, -2.0], [0.0, 1.5, 3.0]], dtype=torch.float64,
                     requires_grad=True)
    u = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    point = AdaptiveQuotient("adaptive", point_ndims=[2]).at((w,))
    (grad,) = torch.autograd.grad(point.squared_norm((u,)), (w,))
    assert torch.isfinite(grad).all()
    expected = torch.where(w == 0, 0.0, -2 * u.square() * w.sign() / w.detach().abs() ** 3)
    assert torch.allclose(grad, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_adaptive_batched_norms_and_inner_products_equal_the_loop(fused) -> None:
    # a 0-dim component too: its reduction over no dimensions must keep the batch
    from quotientsharp.core.adaptive import AdaptiveQuotient

    generator = torch.Generator().manual_seed(11)
    quotient = AdaptiveQuotient("adaptive", point_ndims=[2, 0], fused=fused)
    x = (torch.randn(3, 4, 2, generator=generator, dtype=torch.float64),
         torch.randn(3, generator=generator, dtype=torch.float64))
    u = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    v = tuple(torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in x)
    batched = quotient.at(x)
    norms, inner = batched.squared_norm(u), batched.inner(u, v)
    assert norms.shape == inner.shape == (3,)
    for b in range(3):
        single = tuple(t[b] for t in x)
        loop_norm = sum(float(((a[b] / w.abs()) ** 2).sum()) for a, w in zip(u, single,
                                                                             strict=True))
        loop_inner = sum(float((a[b] * c[b] / w.square()).sum())
                         for a, c, w in zip(u, v, single, strict=True))
        assert abs(float(norms[b]) - loop_norm) <= 1e-12 * loop_norm
        assert abs(float(inner[b]) - loop_inner) <= 1e-12 * abs(loop_inner)


def test_adaptive_quotient_names_what_its_constructor_lacks() -> None:
    from quotientsharp.core.adaptive import AdaptiveQuotient

    with pytest.raises(ValueError, match="^pass point_ndims or shapes$"):
        AdaptiveQuotient("adaptive")
    for point_ndims in ([], [2, -1]):
        with pytest.raises(ValueError, match=r"point_ndims must be non-empty and >= 0, got "
                                             + re.escape(str(point_ndims))):
            AdaptiveQuotient("adaptive", point_ndims=point_ndims)
    assert AdaptiveQuotient("adaptive", point_ndims=[0, 1]).point_ndims == (0, 1)


class _CountingEmbedding(nn.Module):
    """A bag-of-words classifier that counts its forward calls (one embedding table, so the
    touched-rows cut applies)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.table = nn.Embedding(12, 4)
        self.head = nn.Linear(4, 2)
        with torch.no_grad():
            self.table.weight.copy_(torch.randn(12, 4, generator=gen))
            self.head.weight.copy_(torch.randn(2, 4, generator=gen))
        self.forwards = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.head(self.table(ids).mean(-2))


@pytest.mark.parametrize("measure", ["adaptive", "worst_case"])
def test_the_touched_rows_solve_starts_from_the_clean_evaluation(measure):
    # the cut solve reuses the evaluation at xi = 0 as the full one does: as many forwards
    ids, y = torch.tensor([[1, 3, 3], [5, 1, 7]]), torch.tensor([0, 1])
    forwards = {}
    for touched in (True, False):
        model = _CountingEmbedding()
        qs.sharpness(model, [(ids, y)], measure=measure, rho=0.05, n_iter=4, seed=0,
                     progress=False, touched_rows=touched)
        forwards[touched] = model.forwards
    assert forwards[True] == forwards[False]


def test_sharpness_without_compile_steps_compiles_nothing():
    # compile_steps is opt-in: a default call builds no graph (and pays no compile time)
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    qs.sharpness(_CountingEmbedding(), [(torch.tensor([[1, 3]]), torch.tensor([0]))],
                 measure="adaptive", rho=0.05, n_iter=3, seed=0, progress=False)
    assert not torch._dynamo.utils.counters["stats"]["unique_graphs"]
