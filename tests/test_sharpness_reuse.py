"""What the engine reuses instead of recomputing, each against the computation it replaces.

- the first forward+backward (the no-gradient check) is the ascent's evaluation at ``xi = 0``:
  its gradient, carried to ``xi`` by the chain rule through the ``xi -> parameters`` map, equals
  autograd through the whole model, for the plain and the layout (GL + diagonal) geometries at
  every order; a measurement started from it equals one that evaluates ``xi = 0`` itself;
- the solver over a problem shape ``P`` equals the solver run on each problem alone;
- ``clip`` (the radial rescale) equals the full ``P_S`` on horizontal vectors;
- the model's tensors are shared read-only, never handed to the forward: a forward that writes
  to its parameters in place leaves the state dict bit-identical;
- the clean loss of every batch, not only the first, is checked for every measure.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from quotientsharp import DiagonalQuotient, GLQuotient, sharpness
from quotientsharp.engine.ball import BoxGeometry, GeodesicBall
from quotientsharp.engine.batches import resolve_loss, split_batch
from quotientsharp.engine.coordinates import Factor, other_factor
from quotientsharp.engine.functional import FunctionalModel
from quotientsharp.engine.geometry import build_geometry
from quotientsharp.engine.measures import FirstEvaluation
from quotientsharp.engine.registry import measure_from
from quotientsharp.engine.solver import AscentSettings, ascend
from quotientsharp.reproduce.diagonal.batched_ascent import (
    AdaptiveGeometry,
    DiagonalHorizontalGeometry,
    mse_objective,
)

#: These tests measure geodesic sharpness on MLPs, where discovery finds no symmetry: the
#: warning that says so is expected here (tests/test_symmetry_check.py checks it).
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


def _max_relative(a, b) -> float:
    scale = max(max(float(x.abs().max()), float(y.abs().max())) for x, y in zip(a, b, strict=True))
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
    return diff / max(scale, 1e-300)


# ---------------------------------------------------------------------------- models
class AttentionWithDiagonal(nn.Module):
    """q/k/v/o attention (found by find_symmetries) and a diagonal factor pair ``u * v``."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.num_heads = heads
        self.embed = nn.Linear(4, width)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width)
                                                              for _ in range(4))
        self.u = nn.Parameter(torch.randn(width).abs() + 0.5)
        self.v = nn.Parameter(torch.randn(width).abs() + 0.5)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        batch, tokens, width = x.shape
        heads, head_dim = self.num_heads, width // self.num_heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, tokens, heads, head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), dim=-1)
        mixed = self.o_proj((weights @ v).transpose(1, 2).reshape(batch, tokens, width))
        return self.head((mixed * (self.u * self.v)).mean(1))


def _attention_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return AttentionWithDiagonal().double().eval()


def _token_batches(count: int = 2, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 5, 4, generator=gen, dtype=torch.float64),
             torch.randint(0, 3, (6,), generator=gen)) for _ in range(count)]


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double().eval()


def _mlp_batches(count: int = 2, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 4, generator=gen, dtype=torch.float64),
             torch.randint(0, 3, (8,), generator=gen)) for _ in range(count)]


def _prepared(model: nn.Module, measure: str, rho: float, raw, **options):
    """The evaluator of ``measure`` set up as :func:`sharpness` sets it up on batch 0: built by
    the typed measure, set up with the parameters without gradient."""
    spec = measure_from(measure, rho, options)
    loss = resolve_loss(spec.loss)
    functional = FunctionalModel(model, (loss[0], loss[2]))
    evaluator, _ = spec.build(model, functional, torch.Generator().manual_seed(0))
    batch = split_batch(raw, 0, functional.device, functional.input_dtype)
    first = FirstEvaluation(*functional.loss_and_gradients(batch))
    evaluator.setup([n for n, g in first.gradients.items() if g is None])
    return evaluator, batch, first


CASES = [
    ("mlp", "adaptive", {}),
    ("mlp", "worst_case", {}),
    ("mlp", "worst_case", {"adaptive": True, "p": "inf"}),
    ("attention", "geodesic", {"symmetries": "none"}),
    ("attention", "geodesic", {"metric": "inv", "order": 1}),
    ("attention", "geodesic", {"metric": "inv", "order": 2}),
    ("attention", "geodesic", {"metric": "mix", "order": 2}),
    ("attention", "geodesic", {"metric": "inv", "order": "exact"}),
    ("attention", "geodesic", {"metric": "mix", "order": "exact"}),
    ("attention", "geodesic", {"metric": "euclidean", "order": 2}),
    ("attention", "geodesic", {"order": 2, "other_path": "geodesic"}),
    ("attention", "geodesic", {"order": "exact", "other_metric": "euclidean"}),
]


def _case(kind: str, seed: int):
    if kind == "mlp":
        return _mlp(seed), _mlp_batches()
    return _attention_model(seed), _token_batches()


def _options(kind: str, options: dict) -> dict:
    if kind == "attention" and options.get("symmetries") != "none":
        return {"diagonal": [("u", "v")], **options}
    return dict(options)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("kind", "measure", "options"), CASES)
def test_initial_gradient_by_the_chain_rule_equals_autograd_through_the_model(
        kind, measure, options, seed) -> None:
    model, batches = _case(kind, seed)
    evaluator, batch, first = _prepared(model, measure, 0.05, batches[0],
                                        **_options(kind, options))
    if kind == "attention" and options.get("symmetries") != "none":
        coordinates = evaluator.space.coordinates
        assert coordinates.gl_pairs and coordinates.diagonal is not None    # both block kinds
    loss, direct = evaluator.space.objective(evaluator.model, batch)(evaluator.geometry.zeros())
    chained = evaluator.space.gradient_at_zero(first.gradients)
    assert torch.equal(loss, first.loss)
    assert [g.shape for g in chained] == [g.shape for g in direct]
    assert _max_relative(chained, direct) <= 1e-12


@pytest.mark.parametrize(("kind", "measure", "options"), [
    CASES[0], CASES[4], ("attention", "geodesic", {"order": "exact", "exact_steps": 4})])
def test_measurement_from_the_first_evaluation_equals_one_that_evaluates_itself(
        kind, measure, options) -> None:
    model, batches = _case(kind, 0)
    evaluator, batch, first = _prepared(model, measure, 0.05, batches[0], n_iter=8,
                                        **_options(kind, options))
    ticks = {"reused": 0, "own": 0}

    def counter(key):
        def tick(n=1):
            ticks[key] += n
        return tick

    reused = evaluator(batch, 0, counter("reused"), True, first)
    own = evaluator(batch, 0, counter("own"), True, None)
    assert ticks["reused"] == ticks["own"] == evaluator.evaluations_per_batch()
    assert torch.equal(reused.clean, own.clean)
    assert abs(float(reused.perturbed) - float(own.perturbed)) <= 1e-12 * abs(float(own.perturbed))
    assert float(reused.perturbed) >= float(reused.clean)


def test_the_public_result_does_not_depend_on_the_reuse() -> None:
    # batch 0 reuses the setup's evaluation, batch 1 evaluates itself: the same batch in both
    # places must give the same value
    model = _attention_model()
    raw = _token_batches(1)[0]
    result = sharpness(model, [raw, raw], measure="geodesic", rho=0.05, order=2,
                       diagonal=[("u", "v")], progress=False)
    first, second = result.per_batch
    assert abs(first - second) <= 1e-12 * abs(second)


# ---------------------------------------------------------------------------- problem shape
def _diagonal_problems(seed: int, dtype: torch.dtype, models: int = 4, batches: int = 3):
    gen = torch.Generator().manual_seed(seed)
    d, size = 6, 10
    u = torch.randn(models, 1, d, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(models, 1, d, generator=gen, dtype=torch.float64).to(dtype)
    X = torch.randn(batches, size, d, generator=gen, dtype=torch.float64).to(dtype)
    y = torch.randn(batches, size, generator=gen, dtype=torch.float64).to(dtype)
    return u, v, X, y


def _geometries(kind: str, u, v, radius, shape):
    if kind == "adaptive":
        return AdaptiveGeometry(u, v, radius, shape)
    metric, order = kind.split("-")
    return DiagonalHorizontalGeometry(u, v, metric, order if order == "exact" else int(order),
                                      radius, shape)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["adaptive", "inv-2", "mix-1", "inv-exact"])
def test_solver_over_a_problem_shape_equals_each_problem_alone(kind, seed, dtype) -> None:
    u, v, X, y = _diagonal_problems(seed, dtype)
    models, batches = u.shape[0], X.shape[0]
    # per-problem radii: the radius broadcasts over P too
    radius = torch.linspace(0.02, 0.2, models * batches, dtype=dtype).reshape(models, batches)
    settings = AscentSettings(n_iter=12)
    geometry = _geometries(kind, u, v, radius, (models, batches))
    together = ascend(geometry, mse_objective(geometry, X, y), settings)
    assert together.loss.shape == (models, batches)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for i in range(models):
        for j in range(batches):
            alone_geometry = _geometries(kind, u[i, 0], v[i, 0], radius[i, j], ())
            alone = ascend(alone_geometry, _single_objective(alone_geometry, X[j], y[j]),
                           settings)
            assert alone.loss.dim() == 0
            for got, want in ((together.loss[i, j], alone.loss),
                              (together.start_loss[i, j], alone.start_loss)):
                assert abs(float(got - want)) <= tolerance * max(1.0, abs(float(want)))
            assert _max_relative([t[i, j] for t in together.xi], alone.xi) <= tolerance * 10


def _single_objective(geometry, X, y):
    """The mean squared error of one problem, written without the problem axes."""

    def objective(xi):
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            loss = ((X * geometry.beta(leaves)).sum(-1) - y).square().mean()
            grads = torch.autograd.grad(loss, leaves)
        return loss.detach(), grads

    return objective


def test_initial_evaluation_is_reused_and_refused_with_random_starts() -> None:
    u, v, X, y = _diagonal_problems(0, torch.float64)
    geometry = DiagonalHorizontalGeometry(u, v, "inv", 2, 0.1, (u.shape[0], X.shape[0]))
    objective = mse_objective(geometry, X, y)
    calls = []

    def counted(xi):
        calls.append(1)
        return objective(xi)

    settings = AscentSettings(n_iter=6)
    plain = ascend(geometry, counted, settings)
    assert len(calls) == 7
    calls.clear()
    reused = ascend(geometry, counted, settings, initial=objective(geometry.zeros()))
    assert len(calls) == 6
    assert torch.equal(plain.loss, reused.loss) and torch.equal(plain.start_loss,
                                                                reused.start_loss)
    with pytest.raises(ValueError, match="random_init"):
        ascend(geometry, counted, AscentSettings(random_init=True),
               initial=objective(geometry.zeros()))


# ---------------------------------------------------------------------------- clip, scales
def _product(seed: int, dtype: torch.dtype, metric: str) -> GeodesicBall:
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(3, 5, 2, generator=gen, dtype=torch.float64).to(dtype)
    H = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64).to(dtype)
    u = (torch.rand(6, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    v = (torch.rand(6, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    w = torch.randn(7, 3, generator=gen, dtype=torch.float64).to(dtype)
    factors = [Factor(GLQuotient(metric), (G, H), "gl", folded=1),
               Factor(DiagonalQuotient(metric), (u, v), "diagonal"),
               other_factor([w], "adaptive", "line")]
    return build_geometry(factors, radius=0.3, order=2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_is_the_full_projection_on_horizontal_vectors(seed, metric, dtype) -> None:
    geometry = _product(seed, dtype, metric)
    gen = torch.Generator().manual_seed(100 + seed)
    raw = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64).to(dtype)
                for t in geometry.zeros())
    tolerance = 1e-12 if dtype == torch.float64 else 2e-5
    for scale in (1e-3, 1.0, 50.0):                 # inside and outside the ball
        horizontal = tuple(scale * t for t in geometry.frozen.horizontal_projection(raw))
        clipped, projected = geometry.clip(horizontal), geometry.project(horizontal)
        assert _max_relative(clipped, projected) <= tolerance
        assert float(geometry.norm(clipped)) <= 0.3 * (1 + tolerance)
    # on a vertical component clip and project differ: clip does not project
    assert _max_relative(geometry.clip(raw), geometry.project(raw)) > 1e-3


def test_box_clip_clamps_each_entry_to_its_bound() -> None:
    # the reference, entry by entry in Python floats: |xi_i| <= rho |w_i|, the sign kept
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, dtype=torch.float64, generator=generator)
    box = BoxGeometry([w], [w.abs()], 0.1)
    xi = (0.2 * torch.randn(5, 3, dtype=torch.float64, generator=generator),)
    clipped, projected = box.clip(xi)[0], box.project(xi)[0]
    inside = outside = 0
    for value, weight, got, got_projected in zip(xi[0].flatten().tolist(),
                                                 w.flatten().tolist(), clipped.flatten().tolist(),
                                                 projected.flatten().tolist(), strict=True):
        bound = 0.1 * abs(weight)
        expected = value if abs(value) <= bound else math.copysign(bound, value)
        inside, outside = inside + (abs(value) <= bound), outside + (abs(value) > bound)
        assert got == pytest.approx(expected, rel=1e-15, abs=0.0)
        assert got_projected == pytest.approx(expected, rel=1e-15, abs=0.0)
    assert inside and outside                       # both branches of the clamp are exercised


# ---------------------------------------------------------------------------- the model's storage
class WritesItsParameters(nn.Module):
    """A forward that writes to the tensors it is handed, trainable and frozen alike."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 6)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.last = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.first.bias.mul_(0.5)
            self.frozen.weight.add_(1.0)
            self.last.bias.sub_(0.25)
        return self.last(torch.tanh(self.frozen(torch.tanh(self.first(x)))))


def _storage(model: nn.Module) -> dict[str, bytes]:
    return {k: v.detach().clone().contiguous().view(torch.uint8).numpy().tobytes()
            for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("measure", "options"), [
    ("average", {}), ("worst_case", {}), ("worst_case", {"p": "inf"}), ("adaptive", {}),
    ("geodesic", {"order": "exact"}), ("geodesic", {"order": 2, "other_path": "geodesic"}),
    ("relative_flatness", {}), ("adaptive", {"random_init": True, "restarts": 1}),
])
def test_a_forward_writing_to_its_parameters_leaves_the_model_bit_identical(
        measure, options) -> None:
    torch.manual_seed(0)
    model = WritesItsParameters().double()
    before = _storage(model)
    rho = None if measure == "relative_flatness" else 0.1
    result = sharpness(model, _mlp_batches(), measure=measure, rho=rho, progress=False,
                       **options)
    assert all(math.isfinite(v) for v in result.per_batch)
    assert _storage(model) == before


@pytest.mark.parametrize("measure", ["average", "worst_case", "adaptive", "geodesic",
                                     "relative_flatness"])
@pytest.mark.parametrize("bad", [1, 2])
def test_a_non_finite_clean_loss_on_a_later_batch_names_it(measure, bad) -> None:
    batches = _mlp_batches(count=3)
    batches[bad][0][0, 0] = float("nan")
    rho = None if measure == "relative_flatness" else 0.1
    with pytest.raises(ValueError, match=f"clean loss on batch {bad} is not finite"):
        sharpness(_mlp(), batches, measure=measure, rho=rho, progress=False)
