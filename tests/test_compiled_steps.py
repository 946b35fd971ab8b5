"""``compile_steps=True``: the solver's per-iteration geometry as ``torch.compile`` graphs.

The compiled graphs must give the eager path's values. They fuse passes and reductions, so
they may sum in another order: a norm over ``n`` numbers then differs by about ``n`` units in
the last place, which is what the tolerances below allow (``TOLERANCE``: far below any
difference a wrong formula makes, which the tests show by changing one). Float64 runs compare
whole ascents; a decision flipping on a near-tie would show as a larger difference.

Compiling is slow (seconds per graph on a small geometry), so the cases are few and each
compiles its graphs once; dynamo is reset first, so that nothing is reused from another test
and a failing compile cannot hide behind an earlier one's graphs.
"""

from __future__ import annotations

import pytest
import torch

import quotientsharp as qs
from quotientsharp.core.gl import GLQuotient
from quotientsharp.engine.coordinates import Factor, other_factor
from quotientsharp.engine.geometry import build_geometry
from quotientsharp.engine.solver import (
    ON_DEVICE,
    AscentSettings,
    CompiledSteps,
    ascend,
    gradient_step,
    momentum_step,
)
from tests.test_touched_rows import _CountingEmbedding
from tests.tiny_models import tiny_bert_classifier

#: largest relative difference, compiled against eager: reassociated sums of < 100 terms
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


def _geometry(dtype: torch.dtype, metric: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(3, 7, 2, generator=gen, dtype=dtype)
    H = torch.randn(3, 6, 2, generator=gen, dtype=dtype)
    others = [torch.randn(*s, generator=gen, dtype=dtype) for s in [(4,), (3, 2), (5,)]]
    others[1][0] = 0.0            # zero weights: fixed by the adaptive metric, never 0 / 0
    factors = [Factor(GLQuotient(metric), (G, H), "gl", folded=1),
               other_factor(tuple(others), "adaptive", "line")]
    return build_geometry(factors, radius=0.3, order=2), gen


def _relative(a, b) -> float:
    return max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-300))
               for x, y in zip(a, b, strict=True))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()      # reset() keeps the counters
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(("metric", "dtype"), [("mix", torch.float64), ("inv", torch.float64),
                                               ("mix", torch.float32)])
def test_compiled_direction_and_proposal_equal_the_eager_ones(metric, dtype) -> None:
    geometry, gen = _geometry(dtype, metric)
    steps = CompiledSteps()
    egrad = tuple(torch.randn(t.shape, generator=gen, dtype=dtype) for t in geometry.zeros())
    lent = tuple(t.clone() for t in egrad)
    # eager first, as in the solver: the frozen point's cached quantities are computed
    eager = geometry.direction(tuple(t.clone() for t in egrad))
    geometry.clip(eager, ON_DEVICE)
    direction = steps.direction(geometry, egrad)
    assert _relative(direction, eager) < TOLERANCE[dtype]
    assert all(torch.equal(a, b) for a, b in zip(egrad, lent, strict=True))   # nothing written
    xi, previous = geometry.random_start(gen), geometry.random_start(gen)
    given = [tuple(t.clone() for t in v) for v in (xi, direction, previous)]
    eta = torch.tensor(0.45, dtype=dtype)
    for momentum in (False, True):
        compiled = steps.proposal(geometry, xi, direction, previous, eta, 0.75, momentum)
        # the eager formula, written out from the solver's steps
        z = geometry.clip(gradient_step(xi, direction, eta), ON_DEVICE)
        plain = geometry.clip(momentum_step(xi, z, previous, 0.75), ON_DEVICE) if momentum else z
        assert _relative(compiled, plain) < TOLERANCE[dtype]
        assert float(geometry.norm(compiled)) <= 0.3 * (1 + 16 * torch.finfo(dtype).eps)
    for before, after in zip(given, (xi, direction, previous), strict=True):
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.parametrize(("host_decisions", "skip_nonfinite"), [(True, False), (False, True)],
                         ids=["host", "device-skipping"])
def test_a_compiled_ascent_equals_the_eager_one_and_reuses_its_graphs(
        host_decisions, skip_nonfinite) -> None:
    # on the device the iterate comes from a flat-buffer decision every step (a failed step's
    # pick under skip_nonfinite): that must not change the graphs' input types
    geometry, gen = _geometry(torch.float64, "mix", seed=3)
    target = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64)
                   for t in geometry.zeros())

    def objective(xi):
        # a smooth loss with a maximum inside the ball's reach: the ascent moves and restarts
        leaves = tuple(t.detach().requires_grad_(True) for t in xi)
        with torch.enable_grad():
            loss = sum(((a * b).sum().sin() + 0.1 * (a * a).sum()) for a, b in
                       zip(leaves, target, strict=True))
            grads = torch.autograd.grad(loss, leaves)
        return loss.detach(), grads

    settings = AscentSettings(n_iter=12)
    steps = CompiledSteps()
    eager = ascend(geometry, objective, settings, host_decisions=False)
    compiled = ascend(geometry, objective, settings, compiled=steps,
                      host_decisions=host_decisions, skip_nonfinite=skip_nonfinite)
    assert abs(float(compiled.loss - eager.loss)) <= TOLERANCE[torch.float64] * abs(
        float(eager.loss))
    assert _relative(compiled.xi, eager.xi) < 1e-10
    assert torch.allclose(compiled.trace, eager.trace, rtol=1e-12, atol=0)
    counters = torch._dynamo.utils.counters
    # both graphs compiled, whole: a graph break would cut the fused passes into pieces
    assert counters["stats"]["unique_graphs"] == 2
    assert not counters["graph_break"]
    frames = dict(counters["frames"])
    again = ascend(geometry, objective, settings, compiled=steps,
                   host_decisions=host_decisions, skip_nonfinite=skip_nonfinite)
    assert dict(torch._dynamo.utils.counters["frames"]) == frames       # nothing compiled
    assert float(again.loss) == float(compiled.loss)


def test_a_wrong_compiled_formula_is_caught() -> None:
    # the check above can fail: the momentum weight off by 1e-6 is far outside TOLERANCE
    geometry, gen = _geometry(torch.float64, "inv")
    xi, direction, previous = (geometry.random_start(gen) for _ in range(3))
    eta = torch.tensor(0.2, dtype=torch.float64)
    compiled = CompiledSteps().proposal(geometry, xi, direction, previous, eta,
                                        0.75 + 1e-6, True)
    z = geometry.clip(gradient_step(xi, direction, eta), ON_DEVICE)
    plain = geometry.clip(momentum_step(xi, z, previous, 0.75), ON_DEVICE)
    assert _relative(compiled, plain) > 100 * TOLERANCE[torch.float64]


def _tiny_bert():
    pytest.importorskip("transformers")
    model = tiny_bert_classifier()
    generator = torch.Generator().manual_seed(1)
    # the two batches look up different numbers of embedding rows: a second compile
    batches = [{"input_ids": torch.randint(0, n, (4, 8), generator=generator),
                "attention_mask": torch.ones(4, 8, dtype=torch.long),
                "labels": torch.randint(0, 3, (4,), generator=generator)} for n in (30, 12)]
    return model, batches


@pytest.mark.parametrize("options", [{"measure": "geodesic", "metric": "inv", "order": 2},
                                     {"measure": "worst_case", "p": "inf"}],
                         ids=["geodesic-inv", "worst-case-box"])
def test_sharpness_with_compiled_steps_equals_eager(options) -> None:
    import quotientsharp as qs

    model, batches = _tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    eager = qs.sharpness(model, batches, rho=0.05, n_iter=6, progress=False, **options)
    counters = torch._dynamo.utils.counters
    assert not counters["stats"]["unique_graphs"]         # the eager call builds no graph
    compiled = qs.sharpness(model, batches, rho=0.05, n_iter=6, progress=False,
                            compile_steps=True, **options)
    # the option reached the solver: its steps ran as graphs (equal values alone would not
    # show that compile_steps=True was silently run eager)
    assert counters["stats"]["unique_graphs"] >= 2
    # and every frame dynamo tried was compiled: one that fails to trace runs eager instead,
    # silently, with the same values
    assert counters["frames"]["ok"] == counters["frames"]["total"]
    assert not counters["graph_break"]
    assert compiled.settings["compile_steps"] is True
    assert eager.settings["compile_steps"] is False
    for a, b in zip(compiled.per_batch, eager.per_batch, strict=True):
        assert abs(a - b) <= 1e-10 * abs(b)
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[key]), key


def test_compile_steps_must_be_a_bool() -> None:
    import quotientsharp as qs

    model, batches = _tiny_bert()
    with pytest.raises(TypeError, match="compile_steps"):
        qs.sharpness(model, batches, measure="adaptive", rho=0.05, compile_steps="yes")


def test_a_compile_that_fails_says_how_to_run_without_it() -> None:
    # what a machine without a working C++ compiler gets: a backend that cannot build
    def broken_backend(graph, example_inputs):
        raise OSError("no C++ compiler found")

    geometry, gen = _geometry(torch.float64, "mix")
    steps = CompiledSteps()
    steps._direction = torch.compile(lambda g, e: g.direction(e), backend=broken_backend)
    egrad = tuple(torch.randn(t.shape, generator=gen, dtype=torch.float64)
                  for t in geometry.zeros())
    with pytest.raises(RuntimeError, match="compile_steps=False") as caught:
        steps.direction(geometry, egrad)
    assert "no C++ compiler found" in str(caught.value)


def test_sharpness_without_compile_steps_compiles_nothing():
    # compile_steps is opt-in: a default call builds no graph (and pays no compile time)
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    qs.sharpness(_CountingEmbedding(), [(torch.tensor([[1, 3]]), torch.tensor([0]))],
                 measure="adaptive", rho=0.05, n_iter=3, seed=0, progress=False)
    assert not torch._dynamo.utils.counters["stats"]["unique_graphs"]
