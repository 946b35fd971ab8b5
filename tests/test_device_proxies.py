"""CPU stand-ins for the two CUDA properties the GPU tests check (they run on every machine).

- **No host sync inside the ascent loop.** On CUDA, ``torch.cuda.set_sync_debug_mode("error")``
  catches a sync (``tests/test_sharpness.py``). Every sync a tensor program can make reaches
  the dispatcher as one of a few operators whatever the device: ``.item()``, ``float(t)``,
  ``bool(t)`` and ``if t:`` become ``aten._local_scalar_dense`` / ``aten.is_nonzero``, and
  data-dependent shapes (boolean indexing, ``nonzero``, ``masked_select``, ``unique``) need the
  data on the host. A dispatch mode that records those operators inside ``solver.ascend``
  therefore finds on CPU every sync the CUDA run would hit. A positive control shows that it
  does find an injected ``float(loss)``.
- **Device taken from the inputs.** On CUDA, a tensor created without ``device=`` lands on the
  CPU and mixing it with the inputs fails. Here the inputs are on the CPU and the *default*
  device is ``meta``, so any tensor the library creates without taking the device from its
  inputs lands on ``meta``, where mixing it with a CPU tensor raises and reading a value fails.
  The results must equal, bit for bit, those of a run with the normal default.
"""

from __future__ import annotations

import collections
import importlib
import traceback

import pytest
import torch
from test_sharpness_reuse import AttentionWithDiagonal, _token_batches
from torch.utils._python_dispatch import TorchDispatchMode

import quotientsharp as qs
from quotientsharp.core import reference
from quotientsharp.engine.solver import AscentSettings
from quotientsharp.models import find_symmetries, reparametrize
from quotientsharp.reproduce.diagonal.batched_ascent import (
    AdaptiveGeometry,
    DiagonalHorizontalGeometry,
    batched_ascend,
    mse_objective,
)

measures_module = importlib.import_module("quotientsharp.engine.measures")
solver_module = importlib.import_module("quotientsharp.engine.solver")

SYNCING_OPERATORS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.item.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.nonzero_static.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_consecutive.default,
}


class SyncRecorder(TorchDispatchMode):
    """Records every operator that needs the data on the host, with the library frame."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: collections.Counter[str] = collections.Counter()
        self.operators = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operators += 1
        if func in SYNCING_OPERATORS:
            frames = [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                      for f in traceback.extract_stack() if "quotientsharp" in f.filename]
            self.syncs[f"{func} at {frames[-1] if frames else '?'}"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def recorded_ascents(monkeypatch):
    """Wraps the engine's ``ascend`` so that each call runs under a fresh recorder: the
    measurement's own ascent, the reach search's further ones and the reference solve.

    On the CPU the solver reads its decisions on the host (free there); the recorder checks the
    path a CUDA run takes, so that shortcut is switched off (``host_decisions=False``).
    """
    recorders: list[SyncRecorder] = []
    original = solver_module.ascend

    def recorded(*args, **kwargs):
        kwargs["host_decisions"] = False
        recorder = SyncRecorder()
        recorders.append(recorder)
        with recorder:
            return original(*args, **kwargs)

    monkeypatch.setattr(measures_module, "ascend", recorded)
    monkeypatch.setattr(solver_module, "ascend", recorded)
    return recorders


def _attention_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return AttentionWithDiagonal().double().eval()


ASCENT_MEASURES = {
    "geodesic-mix-2": dict(measure="geodesic", metric="mix", order=2),
    "geodesic-inv-1": dict(measure="geodesic", metric="inv", order=1),
    "geodesic-inv-exact": dict(measure="geodesic", metric="inv", order="exact", exact_steps=3),
    "geodesic-path-for-other": dict(measure="geodesic", metric="euclidean",
                                             other_path="geodesic"),
    "adaptive": dict(measure="adaptive"),
    "worst-case-l2-restarts": dict(measure="worst_case", p=2, restarts=1, random_init=True),
    "worst-case-linf": dict(measure="worst_case", p="inf"),
}


@pytest.mark.parametrize("options", list(ASCENT_MEASURES.values()), ids=list(ASCENT_MEASURES))
def test_the_ascent_loop_never_needs_the_host(recorded_ascents, options) -> None:
    result = qs.sharpness(_attention_model(), _token_batches(count=2), rho=0.05, n_iter=9,
                          progress=False, **options)
    assert result.value > 0
    # at least two chains per batch, each at least one ascent
    assert len(recorded_ascents) >= 2 * 2
    for recorder in recorded_ascents:
        assert recorder.operators > 100                     # the recorder saw the loop
        assert not recorder.syncs, dict(recorder.syncs)


def test_the_sync_recorder_finds_an_injected_sync(monkeypatch) -> None:
    original = measures_module.ascend
    recorders: list[SyncRecorder] = []

    def syncing(geometry, objective, *args, **kwargs):
        kwargs["host_decisions"] = False                  # the path a CUDA run takes
        def objective_that_reads_its_loss(xi):
            loss, gradient = objective(xi)
            if float(loss) < 0:                           # a host read, as careless code has
                raise AssertionError("unreachable")
            return loss, gradient

        recorder = SyncRecorder()
        recorders.append(recorder)
        with recorder:
            return original(geometry, objective_that_reads_its_loss, *args, **kwargs)

    monkeypatch.setattr(measures_module, "ascend", syncing)
    qs.sharpness(_attention_model(), _token_batches(count=1), measure="adaptive", rho=0.05,
                 n_iter=4, progress=False, reach=False)
    assert sum(recorders[0].syncs.values()) == 4          # n_iter evaluations, the first reused
    assert all("_local_scalar_dense" in key for key in recorders[0].syncs)


def test_the_search_reads_a_few_numbers_per_ascent(monkeypatch) -> None:
    # between its ascents the reach search decides on the host (continue a chain, add one):
    # a bounded number of reads per ascent, none inside an ascent (the test above)
    original, counts = solver_module.search, []

    def recorded(*args, **kwargs):
        kwargs["host_decisions"] = False
        with SyncRecorder() as recorder:
            found = original(*args, **kwargs)
        counts.append((sum(recorder.syncs.values()), len(found.solves)))
        return found

    monkeypatch.setattr(measures_module, "search", recorded)
    qs.sharpness(_attention_model(), _token_batches(count=2), measure="geodesic", rho=0.05,
                 n_iter=6, progress=False, reach={"chains": 3, "min_chains": 3})
    assert len(counts) == 2
    for syncs, ascents in counts:
        assert ascents >= 3 and 0 < syncs <= 4 * ascents


@pytest.mark.parametrize("path", ["adaptive", "inv-2", "mix-exact"])
def test_the_batched_family_ascent_never_needs_the_host(path) -> None:
    gen = torch.Generator().manual_seed(0)
    models, batches, size, d = 3, 2, 5, 4
    u = torch.rand(models, 1, d, generator=gen, dtype=torch.float64) + 0.5
    v = torch.rand(models, 1, d, generator=gen, dtype=torch.float64) + 0.5
    X = torch.randn(batches, size, d, generator=gen, dtype=torch.float64)
    y = torch.randn(batches, size, generator=gen, dtype=torch.float64)
    shape = (models, batches)
    if path == "adaptive":
        geometry = AdaptiveGeometry(u, v, 0.1, shape)
    else:
        metric, order = path.split("-")
        geometry = DiagonalHorizontalGeometry(u, v, metric, int(order) if order != "exact"
                                              else order, 0.1, shape)
    recorder = SyncRecorder()
    with recorder:
        outcome = batched_ascend(geometry, mse_objective(geometry, X, y), AscentSettings(n_iter=8))
    assert outcome.sharpness.shape == shape and bool((outcome.sharpness > 0).all())
    assert recorder.operators > 100 and not recorder.syncs, dict(recorder.syncs)


# ---------------------------------------------------------------------------- device
ALL_MEASURES = {**ASCENT_MEASURES,
                "average": dict(measure="average", samples=4, seed=1),
                "relative-flatness": dict(measure="relative_flatness")}


@pytest.mark.parametrize("options", list(ALL_MEASURES.values()), ids=list(ALL_MEASURES))
def test_sharpness_takes_the_device_from_the_model_not_the_default(options) -> None:
    extra = {"relative_flatness": {}, "average": {"rho": 0.05}}.get(
        options["measure"], {"rho": 0.05, "n_iter": 4})
    model, batches = _attention_model(), _token_batches(count=2)
    expected = qs.sharpness(model, batches, progress=False, **extra, **options)
    with torch.device("meta"):
        got = qs.sharpness(model, batches, progress=False, **extra, **options)
    assert got.per_batch == expected.per_batch
    assert got.clean_losses == expected.clean_losses


def _quotients():
    return [qs.GLQuotient(metric) for metric in ("inv", "mix", "euclidean")] + [
        qs.DiagonalQuotient(metric) for metric in ("inv", "mix")]


def _operations(quotient, seed: int) -> dict[str, object]:
    """Every public operation of ``quotient`` at one random point, as plain tensors."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((6, 2), (5, 2)) if isinstance(quotient, qs.GLQuotient) else ((4,), (4,))
    x = quotient.random_point((2,), shapes=shapes, generator=gen, dtype=torch.float64)
    u = quotient.random_tangent(x, generator=gen)
    v = quotient.random_tangent(x, generator=gen)
    h = tuple(0.05 * t for t in quotient.horizontal_projection(x, u))
    g = quotient.random_group_element(x, generator=gen)
    out: dict[str, object] = {
        "inner": quotient.inner(x, u, v), "norm": quotient.norm(x, u),
        "vertical": quotient.vertical_projection(x, u),
        "horizontal": quotient.horizontal_projection(x, u),
        "horizontality_error": quotient.horizontality_error(x, u),
        "gradient": quotient.euclidean_to_riemannian_gradient(x, u),
        "christoffel": quotient.christoffel(x, u, v), "act": quotient.act(x, g),
        "act_tangent": quotient.act_tangent(x, u, g),
        "reference christoffel": reference.christoffel(quotient, x, h),
        "reference horizontal": reference.horizontal_projection(quotient, x, u),
    }
    for order in (1, 2, "exact"):
        out[f"geodesic {order}"] = quotient.geodesic(x, h, order=order)
    return out


def _flat(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value for t in _flat(item)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("quotient", _quotients(), ids=repr)
def test_quotient_operations_take_the_device_from_their_inputs(quotient, seed) -> None:
    expected = _operations(quotient, seed)
    with torch.device("meta"):
        got = _operations(quotient, seed)
    for name in expected:
        for a, b in zip(_flat(got[name]), _flat(expected[name]), strict=True):
            assert a.device.type == "cpu", name
            assert torch.equal(a, b), name


def test_checks_take_the_device_from_the_point() -> None:
    quotient = qs.GLQuotient("mix")
    expected = qs.checks.check_all(quotient, seed=0)
    with torch.device("meta"):
        got = qs.checks.check_all(quotient, seed=0)
    assert [(r.name, r.passed, r.error) for r in got] == [
        (r.name, r.passed, r.error) for r in expected]


def test_symmetry_discovery_and_reparametrisation_ignore_the_default_device() -> None:
    model = _attention_model()

    def moved():
        report = find_symmetries(model)
        return reparametrize(model, report, scale=3.0,
                             generator=torch.Generator().manual_seed(5),
                             return_transforms=True)

    (expected, (matrices, factors)) = moved()
    with torch.device("meta"):
        got, (got_matrices, got_factors) = moved()
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].device.type == "cpu" and torch.equal(got[name], expected[name]), name
    assert (got_factors is None) == (factors is None)
    for a, b in zip(got_matrices, matrices, strict=True):
        assert a.device.type == "cpu" and torch.equal(a, b)
