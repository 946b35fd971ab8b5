"""``quotientsharp.sharpness`` on tiny models against independent computations.

- worst-case L2 on a quadratic: the trust-region maximum from a 1-D search over the multiplier;
- worst-case L-infinity on a convex quadratic: brute force over the box's vertices;
- average: the exact mean and variance of a Gaussian quadratic form;
- geodesic on a diagonal net: maximisation over the horizontal rate b by SLSQP (SciPy) of the
  closed-form paths of SPEC section 2;
- relative flatness: the dense Hessian from torch.autograd.functional.hessian;
- order 1 in the adaptive geometry is adaptive sharpness (SPEC section 5);
plus safety (state dict, modes, exceptions), determinism and input errors.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch import nn

import quotientsharp as qs
from quotientsharp import SharpnessResult, sharpness
from quotientsharp.models import find_symmetries, reparametrize
from tests.test_functional import _adaptive, _batches, _measure

#: These tests measure geodesic sharpness on MLPs, where discovery finds no symmetry: the
#: warning that says so is expected here (tests/test_symmetry_check.py checks it).
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")

DUMMY = [(torch.zeros(1), torch.zeros(1))]


def _value_loss(output, target):
    return output


class Quadratic(nn.Module):
    """``f(theta) = theta^T A theta / 2 + b^T theta``, returned as the model's output."""

    def __init__(self, A: torch.Tensor, b: torch.Tensor, theta: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("A", A)
        self.register_buffer("b", b)
        self.theta = nn.Parameter(theta.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.theta @ self.A @ self.theta + self.b @ self.theta


def _quadratic(seed: int, d: int, shift: float = 0.0):
    gen = torch.Generator().manual_seed(seed)
    M = torch.randn(d, d, generator=gen, dtype=torch.float64)
    A = M @ M.T / d - shift * torch.eye(d, dtype=torch.float64)
    b = torch.randn(d, generator=gen, dtype=torch.float64)
    theta = torch.randn(d, generator=gen, dtype=torch.float64)
    return A, b, theta


def _trust_region_max(A: torch.Tensor, g: torch.Tensor, rho: float) -> float:
    """``max_{|d| <= rho} g^T d + d^T A d / 2`` for A with a positive eigenvalue.

    The maximiser is ``d = (mu I - A)^{-1} g`` with ``mu > lambda_max(A)`` and ``|d| = rho``;
    ``|d(mu)|`` decreases in ``mu``, so bisection finds it.
    """
    lam, Q = np.linalg.eigh(A.numpy())
    gh = Q.T @ g.numpy()
    lo, hi = lam.max(), lam.max() + np.linalg.norm(gh) / rho + 1.0
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        if np.linalg.norm(gh / (mid - lam)) > rho:
            lo = mid
        else:
            hi = mid
    d = Q @ (gh / (hi - lam))
    return float(gh @ (Q.T @ d) + 0.5 * d @ A.numpy() @ d)


def mlp(seed: int = 0, dtype: torch.dtype = torch.float64, sizes=(4, 6, 3)) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(dtype)


def classification_batches(count: int = 2, size: int = 8, features: int = 4, classes: int = 3,
                           seed: int = 1, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, features, generator=gen, dtype=dtype),
             torch.randint(0, classes, (size,), generator=gen)) for _ in range(count)]


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _bit_identical(model: nn.Module, snapshot: dict[str, torch.Tensor]) -> bool:
    state = model.state_dict()
    return state.keys() == snapshot.keys() and all(
        state[k].dtype == v.dtype and torch.equal(state[k].view(torch.uint8) if state[k].dim()
                                                  else state[k], v.view(torch.uint8)
                                                  if v.dim() else v)
        for k, v in snapshot.items())


# ---------------------------------------------------------------------------- exact optima
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("adaptive", [False, True])
def test_worst_case_l2_matches_trust_region_maximum(seed: int, adaptive: bool) -> None:
    A, b, theta = _quadratic(seed, d=4, shift=0.3)     # indefinite Hessian
    model = Quadratic(A, b, theta)
    rho = 0.5
    scale = torch.diag(theta.abs() if adaptive else torch.ones(4, dtype=torch.float64))
    exact = _trust_region_max(scale @ A @ scale, scale @ (A @ theta + b), rho)
    result = sharpness(model, DUMMY, measure="worst_case", rho=rho, adaptive=adaptive,
                       loss=_value_loss, progress=False)
    assert abs(result.value - exact) <= 1e-10 * abs(exact)
    assert abs(result.perturbation_norms[0]["total"] - rho) < 1e-12


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("adaptive", [False, True])
def test_worst_case_linf_matches_vertex_search(d: int, adaptive: bool) -> None:
    for seed in range(5):
        A, b, theta = _quadratic(seed, d)             # PSD: the maximum sits at a vertex
        model = Quadratic(A, b, theta)
        rho = 0.3
        c = theta.abs() if adaptive else torch.ones(d, dtype=torch.float64)

        def f(t: torch.Tensor, A=A, b=b) -> float:
            return float(0.5 * t @ A @ t + b @ t)

        vertices = [f(theta + rho * c * torch.tensor(s, dtype=torch.float64)) - f(theta)
                    for s in itertools.product([-1.0, 1.0], repeat=d)]
        one_run = sharpness(model, DUMMY, measure="worst_case", p="inf", rho=rho,
                            adaptive=adaptive, loss=_value_loss, progress=False, n_iter=10)
        # one sign-ascent run ends on a vertex (a local maximum), not necessarily the best
        assert min(abs(one_run.value - v) for v in vertices) <= 1e-12 * max(map(abs, vertices))
        best = sharpness(model, DUMMY, measure="worst_case", p="inf", rho=rho,
                         adaptive=adaptive, loss=_value_loss, progress=False, n_iter=5,
                         restarts=16, seed=seed)
        assert abs(best.value - max(vertices)) <= 1e-12 * abs(max(vertices))
        assert best.perturbation_norms[0]["total"] == pytest.approx(rho, rel=1e-14)


def test_average_matches_gaussian_quadratic_form() -> None:
    A, b, theta = _quadratic(3, d=3)
    model = Quadratic(A, b, theta)
    rho, samples = 0.2, 4000
    for adaptive in (False, True):
        c = theta.abs() if adaptive else torch.ones(3, dtype=torch.float64)
        M = torch.diag(c) @ A @ torch.diag(c)
        g = c * (A @ theta + b)
        mean = 0.5 * rho ** 2 * float(torch.trace(M))
        std = math.sqrt(rho ** 2 * float(g @ g) + 0.5 * rho ** 4 * float((M * M).sum()))
        result = sharpness(model, DUMMY, measure="average", rho=rho, adaptive=adaptive,
                           samples=samples, loss=_value_loss, progress=False, seed=5)
        assert abs(result.value - mean) < 5 * std / math.sqrt(samples)


# ---------------------------------------------------------------------------- diagonal nets
class DiagonalNet(nn.Module):
    """``y = X (u * v)``; ``diagonal = True`` lets find_symmetries find the GL(1)^d pair."""

    diagonal = True

    def __init__(self, u: torch.Tensor, v: torch.Tensor) -> None:
        super().__init__()
        self.u = nn.Parameter(u.clone())
        self.v = nn.Parameter(v.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.u * self.v)


def _diagonal_problem(seed: int):
    gen = torch.Generator().manual_seed(seed)
    d = 3
    u = torch.randn(d, generator=gen, dtype=torch.float64)
    v = torch.randn(d, generator=gen, dtype=torch.float64)
    X = torch.randn(10, d, generator=gen, dtype=torch.float64)
    y = X @ torch.randn(d, generator=gen, dtype=torch.float64)
    return u, v, X, y


def _independent_geodesic_max(u, v, X, y, rho: float, metric: str, order) -> float:
    """``max_{|xi|_g = rho, xi = (b u, b v)} L(beta(b)) - L(beta0)`` over the sphere in ``b``.

    Horizontal vectors are ``(b u, b v)`` with ``|xi|^2 = 2 |b|^2`` (inv) or ``2 |beta0 b|^2``
    (mix), and the paths are the closed forms of SPEC section 2. The sphere (the loss grows
    outwards here; the engine's optimum is checked to lie on it) is searched by a grid over the
    two angles, refined by Nelder-Mead.
    """
    beta0 = (u * v).numpy()
    Xn, yn = X.numpy(), y.numpy()
    if metric == "inv":
        weight = np.ones_like(beta0)
        path = {1: lambda b: (1 + b) ** 2, 2: lambda b: (1 + b + b * b / 2) ** 2,
                "exact": lambda b: np.exp(2 * b)}[order]
    else:
        weight = np.abs(beta0)
        path = {1: lambda b: (1 + b) ** 2, 2: lambda b: (1 + b - b * b / 2) ** 2,
                "exact": lambda b: 1 + 2 * b}[order]

    def gain(angles) -> float:
        theta, phi = angles
        s = np.array([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)])
        b = rho / np.sqrt(2) * s / weight
        return float(np.mean((Xn @ (beta0 * path(b)) - yn) ** 2) - np.mean((Xn @ beta0 - yn) ** 2))

    grid = [(t, p) for t in np.linspace(0, np.pi, 61) for p in np.linspace(0, 2 * np.pi, 121)]
    starts = sorted(grid, key=gain)[-5:]
    return max(-minimize(lambda a: -gain(a), start, method="Nelder-Mead",
                         options={"xatol": 1e-12, "fatol": 1e-15, "maxiter": 4000}).fun
               for start in starts)


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("order", [1, 2, "exact"])
def test_geodesic_on_diagonal_net_matches_independent_maximisation(metric: str, order) -> None:
    u, v, X, y = _diagonal_problem(0)
    model = DiagonalNet(u, v)
    rho = 0.3
    if metric == "mix" and order == "exact":
        # the exact mix path must stay in the manifold over the whole ball
        rho = min(rho, 0.9 * float((u * v).abs().min()) / math.sqrt(2))
        with pytest.raises(ValueError, match="leave the manifold"):
            sharpness(model, [(X, y)], measure="geodesic", rho=rho / 0.8, metric=metric,
                      order=order, loss="mse", progress=False)
    expected = _independent_geodesic_max(u, v, X, y, rho, metric, order)
    result = sharpness(model, [(X, y)], measure="geodesic", rho=rho, metric=metric, order=order,
                       loss="mse", n_iter=60, progress=False)
    assert result.settings["diagonal_pairs"] == 1
    assert result.value <= expected + 1e-9 * abs(expected)       # feasible, hence not above
    assert result.value == pytest.approx(expected, rel=1e-6)
    assert result.perturbation_norms[0]["diagonal"] == pytest.approx(rho, rel=1e-12)


def test_diagonal_net_with_a_zero_coordinate_is_rejected_by_name() -> None:
    u, v, X, y = _diagonal_problem(1)
    u[1] = 0.0
    with pytest.raises(ValueError, match="u = 0"):
        sharpness(DiagonalNet(u, v), [(X, y)], measure="geodesic", rho=0.1, loss="mse",
                  progress=False)


# ---------------------------------------------------------------------------- attention
class TinyAttention(nn.Module):
    """Generic q/k/v/o attention with a ``num_heads`` attribute (found by find_symmetries)."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width)
                                                              for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        heads, head_dim = self.num_heads, width // self.num_heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, tokens, heads, head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim), dim=-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(batch, tokens, width))


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attention = TinyAttention()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attention(self.embed(x)).mean(1))


def _token_batches(count: int = 1, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(2)
    return [(torch.randn(6, 5, 4, generator=gen, dtype=dtype),
             torch.randint(0, 3, (6,), generator=gen)) for _ in range(count)]


@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_geodesic_sharpness_invariant_on_tiny_attention_for_every_order(metric: str) -> None:
    torch.manual_seed(0)
    model = TinyTransformer().double()
    batches = _token_batches()
    report = find_symmetries(model)
    assert len(report.pairs) == 4
    moved = copy.deepcopy(model)
    params = reparametrize(model, report, scale=30.0, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for name, tensor in moved.named_parameters():
            tensor.copy_(params[name])
    adaptive = [sharpness(m, batches, measure="adaptive", rho=0.1, progress=False).value
                for m in (model, moved)]
    assert abs(adaptive[1] - adaptive[0]) > 0.1 * adaptive[0]
    values = {}
    for order in (1, 2, "exact"):
        options = dict(measure="geodesic", metric=metric, order=order, rho=0.1, n_iter=8,
                       progress=False)
        first = sharpness(model, batches, **options)
        second = sharpness(moved, batches, **options)
        assert first.settings["gl_buckets"] == [[9, 9, 4], [9, 8, 4]]
        assert first.perturbation_norms[0]["gl"] > 0.5 * first.perturbation_norms[0]["total"]
        assert second.value == pytest.approx(first.value, rel=1e-8)
        values[order] = first.value
    assert len(set(values.values())) == 3 and min(values.values()) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_and_the_ascent_loop_never_syncs(monkeypatch) -> None:
    import quotientsharp.engine.measures as measures

    original = measures.ascend

    def strict_ascend(*args, **kwargs):
        with warnings.catch_warnings():     # torch warns that the debug mode is a prototype
            warnings.filterwarnings("ignore", "Synchronization debug mode", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
        try:
            return original(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(measures, "ascend", strict_ascend)
    torch.manual_seed(0)
    model = TinyTransformer().double()
    batches = _token_batches(count=2)
    for extra in ({"order": 2}, {"order": "exact", "metric": "mix"}, {"order": 1}):
        cpu = sharpness(model, batches, measure="geodesic", rho=0.1, progress=False, **extra)
        gpu = sharpness(copy.deepcopy(model).cuda(), batches, measure="geodesic", rho=0.1,
                        progress=False, **extra)
        assert gpu.per_batch == pytest.approx(cpu.per_batch, rel=1e-9)
    for extra in ({"p": 2}, {"p": "inf", "restarts": 1}):
        result = sharpness(copy.deepcopy(model).cuda(), batches, measure="worst_case", rho=0.1,
                           progress=False, **extra)
        assert math.isfinite(result.value)


# ---------------------------------------------------------------------------- equivalences
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("symmetries", ["none", "auto"])
def test_order_one_adaptive_geometry_is_adaptive_sharpness(dtype, symmetries) -> None:
    model = mlp(0, dtype)
    batches = classification_batches(dtype=dtype)
    options = dict(rho=0.05, progress=False, random_init=True, restarts=1, seed=3)
    # an MLP has no symmetry discovery knows: "auto" says so, "none" asked for none
    with (pytest.warns(qs.NoSymmetryWarning, match="equals adaptive") if symmetries == "auto"
          else contextlib.nullcontext()):
        geodesic = sharpness(model, batches, measure="geodesic", metric="inv", order=1,
                             symmetries=symmetries, **options)
    adaptive = sharpness(model, batches, measure="adaptive", **options)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert geodesic.value == pytest.approx(adaptive.value, rel=tol, abs=tol)
    assert geodesic.per_batch == pytest.approx(adaptive.per_batch, rel=tol, abs=tol)
    assert adaptive.value > 0


def test_value_is_mean_of_batches_and_ascent_improves_on_clean_loss() -> None:
    model = mlp(1)
    batches = classification_batches(count=3)
    result = sharpness(model, batches, measure="worst_case", rho=0.1, progress=False)
    assert isinstance(result, SharpnessResult)
    assert result.value == pytest.approx(sum(result.per_batch) / 3, rel=1e-15)
    assert all(p > 0 for p in result.per_batch)
    for clean, perturbed, value in zip(result.clean_losses, result.perturbed_losses,
                                       result.per_batch, strict=True):
        assert perturbed - clean == pytest.approx(value, rel=1e-12)
    assert result.settings["n_iter"] == 20 and result.settings["eta0"] == pytest.approx(0.2)
    assert result.settings["checkpoints"] == [5, 9, 12, 14, 16, 18, 19, 20]


def test_geodesic_orders_and_metrics_run_with_keep_perturbations() -> None:
    u, v, X, y = _diagonal_problem(2)
    model = DiagonalNet(u, v)
    for metric in ("inv", "mix", "euclidean"):
        for order in (1, 2, "exact"):
            result = sharpness(model, [(X, y)], measure="geodesic", rho=0.1, metric=metric,
                               order=order, loss="mse", n_iter=5, progress=False,
                               keep_perturbations=True)
            moved = result.perturbations[0]
            assert set(moved) == {"u", "v"}
            assert math.isfinite(result.value) and result.value >= 0


# ---------------------------------------------------------------------------- safety
def test_state_dict_and_modes_untouched_by_every_measure() -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 3))
    model = model.double().train()
    model[2].eval()                                   # a submodule in its own mode
    snapshot = _snapshot(model)
    batches = classification_batches()
    for measure, extra in [("average", {}), ("worst_case", {}), ("worst_case", {"p": "inf"}),
                           ("adaptive", {}), ("geodesic", {"order": "exact"}),
                           ("relative_flatness", {})]:
        rho = None if measure == "relative_flatness" else 0.1
        result = sharpness(model, batches, measure=measure, rho=rho, progress=False, **extra)
        assert math.isfinite(result.value)
        assert _bit_identical(model, snapshot)
        assert model.training and model[1].training and not model[2].training
        for p in model.parameters():
            assert p.grad is None and p.requires_grad


@pytest.mark.parametrize("exception", [RuntimeError, KeyboardInterrupt])
def test_state_dict_and_modes_restored_when_the_loss_raises(exception) -> None:
    model = mlp(2).train()
    snapshot = _snapshot(model)
    calls = {"n": 0}

    def exploding(output, target):
        calls["n"] += 1
        if calls["n"] == 5:
            raise exception("boom")
        return nn.functional.cross_entropy(output, target)

    with pytest.raises(exception, match="boom"):
        sharpness(model, classification_batches(), measure="geodesic", rho=0.1, loss=exploding,
                  progress=False)
    assert calls["n"] == 5
    assert _bit_identical(model, snapshot)
    assert all(m.training for m in model.modules())


def test_same_seed_same_value_other_seed_other_value() -> None:
    model = mlp(3)
    batches = classification_batches()
    for measure in ("geodesic", "worst_case", "average"):
        options = dict(rho=0.2, progress=False)
        if measure != "average":
            options.update(random_init=True, restarts=2, n_iter=4)
        first = sharpness(model, batches, measure=measure, seed=11, **options)
        again = sharpness(model, batches, measure=measure, seed=11, **options)
        other = sharpness(model, batches, measure=measure, seed=12, **options)
        assert first.per_batch == again.per_batch
        assert first.per_batch != other.per_batch


def test_random_init_and_restarts_never_lose_to_a_single_run() -> None:
    model = mlp(4)
    batches = classification_batches(count=1)
    single = sharpness(model, batches, measure="geodesic", rho=0.3, n_iter=6, progress=False)
    restarted = sharpness(model, batches, measure="geodesic", rho=0.3, n_iter=6, restarts=3,
                          progress=False)
    assert restarted.value >= single.value
    random_start = sharpness(model, batches, measure="geodesic", rho=0.3, n_iter=6,
                             random_init=True, progress=False)
    assert math.isfinite(random_start.value)
    assert random_start.perturbation_norms[0]["total"] <= 0.3 * (1 + 1e-12)


def test_zero_weights_stay_fixed_without_nan() -> None:
    model = mlp(5)
    with torch.no_grad():
        model[0].weight[1, :2] = 0.0
        model[2].bias[0] = 0.0
    batches = classification_batches()
    runs = [("adaptive", {}), ("worst_case", {"p": "inf", "adaptive": True}),
            ("geodesic", {"order": "exact", "other_path": "geodesic", "random_init": True}),
            ("geodesic", {"order": 2, "other_path": "geodesic", "metric": "mix"}),
            ("average", {"adaptive": True})]
    for measure, extra in runs:
        result = sharpness(model, batches, measure=measure, rho=0.3, progress=False,
                           keep_perturbations=True, **extra)
        assert math.isfinite(result.value), (measure, extra)
        for moved in result.perturbations:
            assert torch.equal(moved["0.weight"][1, :2], torch.zeros(2, dtype=torch.float64))
            assert float(moved["2.bias"][0]) == 0.0
            assert all(bool(torch.isfinite(t).all()) for t in moved.values())
            assert float(moved["0.weight"].abs().sum()) > 0


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 3)
        self.unused = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


@pytest.mark.parametrize("measure", ["geodesic", "worst_case", "average"])
def test_parameter_without_gradient_is_excluded_with_a_warning(measure: str) -> None:
    torch.manual_seed(0)
    model = WithUnused().double()
    with pytest.warns(UserWarning, match=r"unused\.weight.*no gradient"):
        result = sharpness(model, classification_batches(), measure=measure, rho=0.1,
                           progress=False, keep_perturbations=True)
    assert result.excluded == ["unused.weight", "unused.bias"]
    assert math.isfinite(result.value)
    for moved in result.perturbations:
        assert "unused.weight" not in moved or not bool(moved["unused.weight"].any())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_models_use_float32_geometry(dtype: torch.dtype) -> None:
    model = mlp(6, dtype)
    snapshot = _snapshot(model)
    batches = classification_batches(dtype=torch.float32)        # inputs are cast to the model
    for measure in ("geodesic", "adaptive"):
        result = sharpness(model, batches, measure=measure, rho=0.1, progress=False)
        assert result.settings["geometry_dtype"] == "float32"
        assert math.isfinite(result.value)
    assert _bit_identical(model, snapshot)


# ---------------------------------------------------------------------------- relative flatness
@pytest.mark.parametrize("layer", [None, "0"])
def test_relative_flatness_matches_dense_hessian(layer) -> None:
    model = mlp(7, sizes=(4, 5, 3))
    batches = classification_batches(count=2)
    result = sharpness(model, batches, measure="relative_flatness", layer=layer, hvp_chunk=7,
                       progress=False)
    name = "2.weight" if layer is None else "0.weight"
    assert result.settings["layer"] == ("2" if layer is None else "0")
    params = dict(model.named_parameters())
    W = params[name].detach()
    expected = []
    for x, y in batches:
        def loss_of(weight, x=x, y=y):
            full = {k: v.detach() for k, v in params.items()}
            full[name] = weight
            out = torch.func.functional_call(model, full, (x,))
            return nn.functional.cross_entropy(out, y)

        H = torch.autograd.functional.hessian(loss_of, W)          # [out, in, out, in]
        trace_blocks = torch.einsum("skrk->sr", H)
        expected.append(float(((W @ W.T) * trace_blocks).sum()))
    assert result.per_batch == pytest.approx(expected, rel=1e-10)


# ---------------------------------------------------------------------------- batches
class HFStyle(nn.Module):
    """Keyword inputs, an output object with ``.logits`` (like a HuggingFace model)."""

    class Output:
        def __init__(self, logits: torch.Tensor) -> None:
            self.logits = logits

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Output:
        pooled = (self.embed(input_ids) * attention_mask.unsqueeze(-1)).mean(1)
        return self.Output(self.head(pooled))


def test_batch_formats_and_custom_losses() -> None:
    torch.manual_seed(0)
    model = HFStyle().double()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (6, 5), generator=gen)
    mask = torch.ones(6, 5, dtype=torch.long)
    labels = torch.randint(0, 3, (6,), generator=gen)
    as_dict = sharpness(model, [{"input_ids": ids, "attention_mask": mask, "labels": labels}],
                        measure="adaptive", rho=0.1, progress=False)
    as_pair = sharpness(model, [({"input_ids": ids, "attention_mask": mask}, labels)],
                        measure="adaptive", rho=0.1, progress=False)
    as_tuple = sharpness(model, [((ids, mask), labels)], measure="adaptive", rho=0.1,
                         progress=False)
    assert as_dict.value == as_pair.value == as_tuple.value
    doubled = sharpness(model, [((ids, mask), labels)], measure="adaptive", rho=0.1,
                        progress=False,
                        loss=lambda logits, y: 2 * nn.functional.cross_entropy(logits, y))
    assert doubled.value == pytest.approx(2 * as_dict.value, rel=1e-9)
    generator_batches = (b for b in [((ids, mask), labels)])
    assert sharpness(model, generator_batches, measure="adaptive", rho=0.1,
                     progress=False).value == as_tuple.value


def test_progress_bar_can_be_shown_and_hidden(capsys) -> None:
    model = mlp(8)
    batches = classification_batches(count=1)
    sharpness(model, batches, measure="adaptive", rho=0.1, n_iter=2, progress=True)
    assert "adaptive sharpness" in capsys.readouterr().err
    sharpness(model, batches, measure="adaptive", rho=0.1, n_iter=2, progress=False)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("rho", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_rho(rho) -> None:
    with pytest.raises(ValueError, match="rho must be a finite number > 0"):
        sharpness(mlp(), classification_batches(), measure="adaptive", rho=rho, progress=False)


def test_bad_inputs_name_the_culprit() -> None:
    model, batches = mlp(), classification_batches()
    with pytest.raises(ValueError, match="rho is required"):
        sharpness(model, batches, measure="adaptive")
    with pytest.raises(TypeError, match="rho must be a number"):
        sharpness(model, batches, measure="adaptive", rho=True)
    with pytest.raises(ValueError, match="leave rho unset"):
        sharpness(model, batches, measure="relative_flatness", rho=0.1)
    with pytest.raises(ValueError, match="unknown measure 'sam'"):
        sharpness(model, batches, measure="sam", rho=0.1)
    with pytest.raises(ValueError, match="metric must be one of"):
        sharpness(model, batches, measure="geodesic", rho=0.1, metric="fisher")
    with pytest.raises(ValueError, match="order must be 1, 2 or 'exact'"):
        sharpness(model, batches, measure="geodesic", rho=0.1, order=3)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['order'\]"):
        sharpness(model, batches, measure="adaptive", rho=0.1, order="exact")
    with pytest.raises(ValueError, match="p must be 2 or 'inf'"):
        sharpness(model, batches, measure="worst_case", rho=0.1, p=1)
    with pytest.raises(ValueError, match="eps must be"):
        sharpness(model, batches, measure="geodesic", rho=0.1, eps=-1.0)
    with pytest.raises(ValueError, match="needs other_metric='adaptive'"):
        sharpness(model, batches, measure="geodesic", rho=0.1, other_path="geodesic",
                  other_metric="euclidean")
    with pytest.raises(ValueError, match="n_iter must be"):
        sharpness(model, batches, measure="adaptive", rho=0.1, n_iter=0)
    with pytest.raises(ValueError, match="batches is empty"):
        sharpness(model, [], measure="adaptive", rho=0.1, progress=False)
    with pytest.raises(ValueError, match="batches is empty"):
        sharpness(model, iter([]), measure="adaptive", rho=0.1, progress=False)
    with pytest.raises(TypeError, match="batches must be an iterable"):
        sharpness(model, torch.zeros(3), measure="adaptive", rho=0.1)
    with pytest.raises(ValueError, match="without a 'labels' entry"):
        sharpness(model, [{"x": torch.zeros(2, 4)}], measure="adaptive", rho=0.1,
                  progress=False)
    with pytest.raises(ValueError, match="loss must be one of"):
        sharpness(model, batches, measure="adaptive", rho=0.1, loss="hinge")
    with pytest.raises(ValueError, match="layer 'nope' is not a module"):
        sharpness(model, batches, measure="relative_flatness", layer="nope")
    with pytest.raises(ValueError, match="must return a scalar"):
        sharpness(model, batches, measure="adaptive", rho=0.1, progress=False,
                  loss=lambda out, y: out.sum(0))


def test_non_finite_weights_are_named() -> None:
    model = mlp()
    snapshot = _snapshot(model)
    with torch.no_grad():
        model[2].bias[1] = float("nan")
    with pytest.raises(ValueError, match=r"\['2.bias'\] contain non-finite"):
        sharpness(model, classification_batches(), measure="geodesic", rho=0.1)
    del snapshot


def test_non_finite_clean_loss_names_the_batch() -> None:
    batches = classification_batches(count=2)
    batches[1][0][0, 0] = float("nan")
    with pytest.raises(ValueError, match="clean loss on batch 1 is not finite"):
        sharpness(mlp(), batches, measure="adaptive", rho=0.1, progress=False)


def _mlp(widths=(5, 8, 3), activation=nn.Tanh) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), activation()]
    return nn.Sequential(*layers[:-1])


def test_frozen_parameters_are_listed_and_never_perturbed(mlp_and_batches):
    net, batches = mlp_and_batches
    net[0].weight.requires_grad_(False)
    for measure in ("geodesic", "adaptive", "average"):
        extra = {} if measure == "average" else {"n_iter": 2}
        result = qs.sharpness(net, batches, measure=measure, rho=0.1, progress=False,
                              keep_perturbations=True, **extra)
        assert result.frozen == ["0.weight"] and result.excluded == []
        assert all("0.weight" not in p for p in result.perturbations)
    assert _adaptive(_mlp(), batches).frozen == []


def test_the_model_runs_in_eval_mode_and_its_modes_come_back():
    # a dropout left in train mode by the test: only sharpness() itself can switch it off
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 3))
    assert model.training
    first = _measure(model, _batches(), "worst_case")
    second = _measure(model, _batches(), "worst_case")
    assert model.training and all(m.training for m in model.modules())
    # the value of the same weights without any dropout at all: eval mode, whatever the caller's
    without = nn.Sequential(*[m for m in model if not isinstance(m, nn.Dropout)])
    reference = _measure(without, _batches(), "worst_case")
    assert first.value == second.value == pytest.approx(reference.value, rel=1e-6)
