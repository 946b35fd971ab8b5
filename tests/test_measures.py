"""The measures of ``quotientsharp.engine.measures``: the non-finite bookkeeping of an ascent
and its messages, the average measure against a hand-written Monte Carlo mean, relative
flatness's layer, the reference solve, ``AscentMeasure.setup``, and the errors on bad inputs
and non-finite losses.

References are independent of the code under test (a hand-written average, the documented
contract); the errors must name the batch, the iteration and the argument.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quotientsharp as qs
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.engine.measures import NonFiniteLossError, _check_ascents
from quotientsharp.engine.solver import AscentOutcome, AscentSettings
from tests.test_functional import _adaptive, _batches, _measure
from tests.test_functional import _mlp as _small_mlp


def _mlp(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(),
                         nn.Linear(5, 3)).to(dtype)


def _batch(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(10, 4, generator=generator, dtype=dtype),
            torch.randint(0, 3, (10,), generator=generator))


def _outcome(count: int, at: list[int], best: float = 1.0) -> AscentOutcome:
    return AscentOutcome(
        loss=torch.tensor(best), xi=(), run_losses=[], start_loss=torch.tensor(0.5),
        nonfinite_at=[torch.tensor(k) for k in at],
        nonfinite_loss=[torch.tensor(float("inf") if k >= 0 else 0.0) for k in at],
        nonfinite_count=torch.tensor(count))


def _check_ascent(outcome: AscentOutcome, index: int, settings: AscentSettings,
                  model: FunctionalModel, rho: float | None, policy: str) -> int:
    """One solve alone: the measurement's own ascent."""
    return _check_ascents([(settings, outcome, "")], index, model, rho, policy)


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


def test_a_search_chain_with_nothing_finite_leaves_the_others_value(functional):
    # the reach search: the first chain from xi = 0 found a finite perturbed value, a further
    # chain from a random start found none; under "skip" the batch keeps its value
    first, probe = AscentSettings(n_iter=4), AscentSettings(n_iter=4, random_init=True)
    total = first.evaluations_per_run
    finite = _outcome(2, [1])
    nothing = _outcome(total, [0], best=-math.inf)
    solves = [(first, finite, ""), (probe, nothing, " (reach search)")]
    assert _check_ascents(solves, 0, functional, 0.1, "skip") == 2 + total
    # the other order: a further chain found values where the first found nothing
    empty_first = _outcome(total - 1, [1], best=0.5)
    solves = [(first, empty_first, ""), (probe, _outcome(1, [2]), " (reach search)")]
    assert _check_ascents(solves, 0, functional, 0.1, "skip") == total
    # no chain found anything: nothing to report, under "skip" too
    solves = [(first, empty_first, ""), (probe, nothing, " (reach search)")]
    with pytest.raises(NonFiniteLossError, match="batch 3: .*No perturbed evaluation was finite"):
        _check_ascents(solves, 3, functional, 0.1, "skip")
    # "raise" stops at the first solve with a non-finite evaluation, naming it
    with pytest.raises(NonFiniteLossError, match=r"batch 0 \(reach search\): the perturbed loss"):
        _check_ascents([(first, _outcome(0, [-1]), ""), (probe, nothing, " (reach search)")],
                       0, functional, 0.1, "raise")


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


def _weight_normed(kind: str) -> nn.Sequential:
    from torch.nn.utils import parametrizations, spectral_norm, weight_norm
    wrap = {"parametrized weight_norm": parametrizations.weight_norm,
            "parametrized spectral_norm": parametrizations.spectral_norm,
            "old weight_norm": weight_norm, "old spectral_norm": spectral_norm}[kind]
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), wrap(nn.Linear(5, 3)))


@pytest.mark.filterwarnings("ignore::FutureWarning")      # torch's old-style weight_norm
@pytest.mark.parametrize("kind, how", [
    ("parametrized weight_norm", r"parametrized \(_WeightNorm, torch\.nn\.utils\.parametrize\): "
                                 r"computed from 2\.parametrizations\.weight\.original\*"),
    ("parametrized spectral_norm", r"parametrized \(_SpectralNorm, "),
    ("old weight_norm", r"computed at each forward by the old-style torch\.nn\.utils\."
                        r"weight_norm, from weight_g and weight_v"),
    ("old spectral_norm", r"computed .* old-style torch\.nn\.utils\.spectral_norm, from "
                          r"weight_orig")])
def test_a_relative_flatness_layer_with_a_computed_weight_is_refused(kind, how):
    # the default layer was the weight-normalised one, then refused as having "no weight
    # parameter" (the old spectral_norm's weight, not trainable, was skipped: layer '0' unsaid)
    model, said = _weight_normed(kind), rf"has a weight {how}.*, not a parameter; relative "
    said += r"flatness needs the weight itself as a parameter .*: pass layer= another layer"
    with pytest.raises(ValueError, match=r"^relative flatness's default layer, the last "
                                         rf"nn\.Linear '2', {said}"):
        qs.sharpness(model, [_batch()], measure="relative_flatness", progress=False)
    with pytest.raises(ValueError, match=rf"^layer '2' {said}"):
        qs.sharpness(model, [_batch()], measure="relative_flatness", layer="2",
                     progress=False)
    other = qs.sharpness(model, [_batch()], measure="relative_flatness", layer="0",
                         progress=False)
    assert other.settings["layer"] == "0" and math.isfinite(other.value)


def test_a_frozen_relative_flatness_layer_is_named():
    model = _Three()
    model.last.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="the weight of layer 'last' is frozen"):
        qs.sharpness(model, [_batch()], measure="relative_flatness", layer="last",
                     progress=False)


class _TiedOutput(nn.Module):
    """A language model in miniature whose output layer shares its weight with the input
    embedding (GPT-2's ``lm_head``), or whose last layer is applied twice."""

    def __init__(self, tied: bool = True, twice: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.hidden, self.out = nn.Embedding(7, 5), nn.Linear(5, 5), nn.Linear(5, 7)
        if tied:
            self.out.weight = self.embed.weight
        self.twice = twice

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.embed(ids)))
        return self.out(torch.tanh(self.out(h)[..., :5])) if self.twice else self.out(h)


def _token_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return (torch.randint(0, 7, (4, 6), generator=generator),
            torch.randint(0, 7, (4, 6), generator=generator))


def test_a_tied_relative_flatness_layer_is_refused():
    # measured the Hessian of both uses of the shared tensor under the layer's name (GPT-2:
    # 0.505 where the untied copy of the same function gives 0.402)
    with pytest.raises(ValueError, match=r"the weight of layer 'out' is tied to "
                                         r"\['embed.weight'\]"):
        qs.sharpness(_TiedOutput(), [_token_batch()], measure="relative_flatness",
                     progress=False)
    untied = qs.sharpness(_TiedOutput(tied=False), [_token_batch()],
                          measure="relative_flatness", progress=False)
    assert untied.settings["layer"] == "out" and math.isfinite(untied.value)


def test_a_relative_flatness_layer_applied_twice_is_refused():
    with pytest.raises(ValueError, match=r"batch 0: layer 'out' runs 2 times in one forward"):
        qs.sharpness(_TiedOutput(tied=False, twice=True), [_token_batch()],
                     measure="relative_flatness", progress=False)


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
    # the skip hint, true of the API and of the command line
    assert str(err.value).endswith("; or pass nonfinite='skip' (--nonfinite skip on the "
                                   "command line) to keep the best over the finite "
                                   "evaluations (the skipped ones are counted per batch)")


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
    from quotientsharp.engine.geometry import PlainGeometry
    from quotientsharp.engine.measures import AscentMeasure

    measure = AscentMeasure(functional, AscentSettings(n_iter=2), torch.Generator(),
                            PlainGeometry(0.1, 2.0, True))
    for name in ("space", "geometry"):
        with pytest.raises(RuntimeError, match="setup has not run"):
            getattr(measure, name)


def _mlp_of_widths(widths=(5, 8, 3), activation=nn.Tanh) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), activation()]
    return nn.Sequential(*layers[:-1])


class _PoisonedLoss:
    """Cross-entropy that turns ``bad`` (NaN or inf) from evaluation ``after`` of a batch on.

    Evaluations are counted per batch (by the target's storage): evaluation 0 is the clean one,
    evaluation ``k`` the solver's ``k``-th step. Only the batches in ``batches`` are poisoned.
    """

    def __init__(self, bad: float, after: int = 1, batches: tuple[int, ...] = (0,)) -> None:
        self.bad, self.after, self.batches = bad, after, batches
        self.calls: dict[int, int] = {}
        self.order: list[int] = []

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        key = target.untyped_storage().data_ptr()
        if key not in self.calls:
            self.calls[key] = 0
            self.order.append(key)
        count = self.calls[key]
        self.calls[key] += 1
        loss = F.cross_entropy(output, target)
        if self.order.index(key) in self.batches and count >= self.after:
            return loss * self.bad
        return loss


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_non_finite_perturbed_loss_raises_naming_batch_and_iteration(mlp_and_batches, bad):
    net, batches = mlp_and_batches
    loss = _PoisonedLoss(bad, after=3, batches=(1,))
    with pytest.raises(ValueError, match=r"^batch 1: the perturbed loss is (nan|inf) at solver "
                                         r"iteration 3 of 5") as info:
        _adaptive(net, batches, loss=loss, n_iter=5)
    assert isinstance(info.value, NonFiniteLossError)
    assert "likely cause" in str(info.value) and "nonfinite='skip'" in str(info.value)


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_a_loss_that_is_nan_at_every_perturbed_point_is_not_a_silent_zero(mlp_and_batches):
    net, batches = mlp_and_batches
    with pytest.raises(ValueError, match="batch 0: .* iteration 1 of 3; 3 of 4 evaluations"):
        qs.sharpness(net, batches[:1], measure="worst_case", rho=0.1, n_iter=3, progress=False,
                     loss=_PoisonedLoss(math.nan))


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_skip_policy_is_recorded_counted_and_warned(mlp_and_batches):
    net, batches = mlp_and_batches
    with pytest.warns(UserWarning, match="2 perturbed evaluation"):
        result = _adaptive(net, batches[:1], loss=_PoisonedLoss(math.nan, after=2),
                           nonfinite="skip", reach=False)
    assert result.settings["nonfinite"] == "skip"
    assert result.nonfinite_evaluations == [2]
    assert result.value > 0.0                       # the first step's loss, a finite one
    assert "2 non-finite evaluation(s) skipped" in result.summary()
    finite = _adaptive(net, batches[:1])
    assert finite.settings["nonfinite"] == "raise" and finite.nonfinite_evaluations == [0]


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_skip_keeps_the_best_finite_iterate(mlp_and_batches):
    net, batches = mlp_and_batches
    clean = _adaptive(net, batches[:1], n_iter=2, reach=False)
    with pytest.warns(UserWarning):
        skipped = _adaptive(net, batches[:1], n_iter=4, nonfinite="skip", reach=False,
                            loss=_PoisonedLoss(math.inf, after=3))
    # steps 1 and 2 are those of the unpoisoned two-step run; 3 and 4 were skipped
    assert skipped.nonfinite_evaluations == [2]
    assert skipped.value == clean.value


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_radius_too_large_for_float32_raises_instead_of_returning_zero(mlp_and_batches):
    net, batches = mlp_and_batches
    for measure in ("worst_case", "adaptive", "geodesic", "average"):
        extra = {} if measure == "average" else {"n_iter": 2}
        with pytest.raises(ValueError, match=r"rho=1e\+30 is too large for the geometry's "
                                             "float32"):
            qs.sharpness(net, batches, measure=measure, rho=1e30, progress=False, **extra)
    with pytest.raises(ValueError, match="eta0"):
        qs.sharpness(net, batches, measure="worst_case", rho=0.1, eta0=1e30, progress=False)


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_radius_too_small_for_float32_raises_instead_of_returning_zero(mlp_and_batches):
    # a rho that is zero, subnormal or of underflowing square in float32 is no ball at all:
    # the value 0 it gave was blamed on the losses' rounding
    net, batches = mlp_and_batches
    for rho, what in ((1e-300, "it rounds to zero"), (1e-40, "it is subnormal"),
                      (1e-25, "its square underflows")):
        for measure in ("worst_case", "adaptive", "geodesic", "average"):
            extra = {} if measure == "average" else {"n_iter": 2}
            with pytest.raises(ValueError, match=rf"rho={rho:g} is too small for the "
                                                 rf"geometry's float32: {what} there "
                                                 r"\(smallest normal float32: 1.18e-38\).*"
                                                 r"use rho > 1.73e-18"):
                qs.sharpness(net, batches, measure=measure, rho=rho, progress=False, **extra)
    with pytest.raises(ValueError, match="eta0=1e-300 is too small"):
        qs.sharpness(net, batches, measure="worst_case", rho=0.1, eta0=1e-300, progress=False)
    with pytest.raises(ValueError, match="geometry's float64: it is subnormal"):
        qs.sharpness(net, batches, measure="average", rho=1e-310, geometry_dtype="float64",
                     progress=False)
    # float64 holds the same radius
    assert math.isfinite(qs.sharpness(net, batches, measure="average", rho=1e-25,
                                      geometry_dtype="float64", progress=False).value)


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_float16_overflow_raises_while_the_float32_copy_measures():
    torch.manual_seed(0)
    net = _mlp_of_widths((20, 64, 64, 10), nn.ReLU)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 20, generator=generator), torch.randint(0, 10, (32,),
                                                                    generator=generator)
    options = dict(measure="worst_case", rho=1e3, n_iter=3, progress=False)
    assert math.isfinite(qs.sharpness(net, [(x, y)], **options).value)
    half = _mlp_of_widths((20, 64, 64, 10), nn.ReLU)
    half.load_state_dict(net.state_dict())
    with pytest.raises(ValueError, match="batch 0: .*half-precision overflow.*float16"):
        qs.sharpness(half.half(), [(x.half(), y)], **options)


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_average_with_a_nan_perturbed_loss_raises(mlp_and_batches):
    net, batches = mlp_and_batches
    with pytest.raises(ValueError, match="batch 0: the perturbed loss is nan at draw 0 of 2"):
        qs.sharpness(net, batches, measure="average", rho=0.1, samples=2, progress=False,
                     loss=_PoisonedLoss(math.nan))
    with pytest.raises(ValueError, match="No draw was finite"):
        qs.sharpness(net, batches, measure="average", rho=0.1, samples=2, progress=False,
                     loss=_PoisonedLoss(math.nan), nonfinite="skip")
    with pytest.warns(UserWarning, match="skipped"):
        half = qs.sharpness(net, batches[:1], measure="average", rho=0.1, samples=2,
                            progress=False, loss=_PoisonedLoss(math.nan, after=2),
                            nonfinite="skip")
    assert half.nonfinite_evaluations == [1] and math.isfinite(half.value)


class NanWhenMoved(nn.Module):
    """A finite output at its own parameters only: every perturbed loss is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.reference = self.layer.weight.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out if torch.equal(self.layer.weight, self.reference) else out * math.nan


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
@pytest.mark.parametrize("measure", ["worst_case", "adaptive", "geodesic", "average"])
def test_skip_with_no_finite_evaluation_raises(measure):
    # the start xi = 0 is the clean loss, finite: it used to be reported as a sharpness of 0
    with pytest.raises(ValueError, match="No (perturbed evaluation|draw) was finite"):
        _measure(NanWhenMoved(), _batches(), measure, nonfinite="skip")


@pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")
def test_the_average_measure_reports_the_mean_norm_of_its_draws():
    # delta ~ N(0, rho^2 I) in 67 coordinates: E ||delta|| = rho sqrt(2) Gamma(34) / Gamma(33.5),
    # about rho sqrt(66.5); 64 draws put the mean within 1 % of it (a mutation survivor
    # subtracted the norms)
    model = _small_mlp()
    dimension = sum(p.numel() for p in model.parameters())
    result = _measure(model, _batches(), "average", samples=64)
    expected = 0.1 * math.sqrt(2) * math.exp(math.lgamma((dimension + 1) / 2)
                                             - math.lgamma(dimension / 2))
    assert result.perturbation_norms[0]["total"] == pytest.approx(expected, rel=0.05)


def test_relative_flatness_of_a_conv1d_layer_is_that_of_the_same_linear_layer():
    # Hugging Face's Conv1D (GPT-2's layers) stores W as [inputs, outputs]: its neurons w_s are
    # the columns, and the stored rows (input features) gave another, plausible kappa
    pytorch_utils = pytest.importorskip("transformers.pytorch_utils")
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(),
                               pytorch_utils.Conv1D(3, 6)).double()
    linear = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(),
                                 torch.nn.Linear(6, 3)).double()
    with torch.no_grad():
        linear[0].load_state_dict(conv[0].state_dict())
        linear[2].weight.copy_(conv[2].weight.mT)
        linear[2].bias.copy_(conv[2].bias)
    batch = (torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)),
             torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(2)))
    kappa = [qs.sharpness(model, [batch], "relative_flatness", layer="2", progress=False).value
             for model in (conv, linear)]
    assert kappa[0] == pytest.approx(kappa[1], rel=1e-12)
    embedding = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(),
                                    torch.nn.Linear(8, 3))
    with pytest.raises(ValueError, match="layer '0' is an embedding table"):
        qs.sharpness(embedding, [(torch.randint(0, 10, (4, 2)), torch.randint(0, 3, (4,)))],
                     "relative_flatness", layer="0", progress=False)
