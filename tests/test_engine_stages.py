"""The engine's declared stages: the measure registry, the solver's geometry protocol, the
ownership rule of ``ascend(initial=...)``, the removed names, and the module trace script."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.engine import (
    MEASURE_REGISTRY,
    MEASURES,
    AscentGeometry,
    AscentSettings,
    BoxGeometry,
    GeodesicBall,
    HandedOver,
    ascend,
    build_geometry,
)
from quotientsharp.engine.coordinates import other_factor
from quotientsharp.engine.solver import ON_DEVICE, ON_HOST, decisions_for

ROOT = Path(__file__).resolve().parents[1]


def _ball(seed: int = 0) -> GeodesicBall:
    base = torch.randn(5, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return build_geometry([other_factor((base,), "adaptive", "line")], radius=0.3)


def _quadratic(target: torch.Tensor):
    calls = []

    def objective(xi):
        (x,) = xi
        calls.append(x)
        return -((x - target) ** 2).sum(), (-2 * (x - target),)

    return objective, calls


# ---------------------------------------------------------------------------- registry
def test_the_registry_holds_every_measure_with_its_options() -> None:
    assert set(MEASURE_REGISTRY) == set(MEASURES)
    for name, kind in MEASURE_REGISTRY.items():
        assert kind.name == name
        assert kind.defaults() == MEASURES[name]
        assert kind.needs_rho == (name != "relative_flatness")


def test_each_measure_checks_its_own_options() -> None:
    model = nn.Sequential(nn.Linear(4, 3)).double()
    batches = [(torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,)))]
    with pytest.raises(ValueError, match="p must be 2 or 'inf'"):
        qs.sharpness(model, batches, measure="worst_case", rho=0.1, p=3, progress=False)
    with pytest.raises(ValueError, match="samples must be an integer"):
        qs.sharpness(model, batches, measure="average", rho=0.1, samples=0, progress=False)
    with pytest.raises(TypeError, match="unknown option"):
        qs.sharpness(model, batches, measure="average", rho=0.1, p=2, progress=False)


# ---------------------------------------------------------------------------- geometry protocol
def test_the_engines_geometries_satisfy_the_solvers_protocol() -> None:
    ball = _ball()
    box = BoxGeometry(ball.base, [torch.ones_like(t) for t in ball.base], 0.3)
    assert isinstance(ball, AscentGeometry)
    assert isinstance(box, AscentGeometry)
    assert isinstance(ball.on_rows({0: torch.tensor([1, 3])}), AscentGeometry)


# ---------------------------------------------------------------------------- decisions
def test_decisions_are_read_on_the_host_only_for_one_problem_on_the_cpu() -> None:
    assert decisions_for(torch.zeros(())) is ON_HOST
    assert decisions_for(torch.zeros(()), host_decisions=False) is ON_DEVICE
    assert decisions_for(torch.zeros(2)) is ON_DEVICE


@pytest.mark.parametrize("restarts", [0, 2])
def test_host_and_device_decisions_give_the_same_ascent_bit_for_bit(restarts) -> None:
    ball = _ball()
    target = torch.randn(5, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    objective, _ = _quadratic(target)
    settings = AscentSettings(n_iter=12, restarts=restarts)
    host = ascend(ball, objective, settings, torch.Generator().manual_seed(1))
    device = ascend(ball, objective, settings, torch.Generator().manual_seed(1),
                    host_decisions=False)
    assert torch.equal(host.loss, device.loss)
    assert torch.equal(host.trace, device.trace)
    assert all(torch.equal(a, b) for a, b in zip(host.xi, device.xi, strict=True))


# ---------------------------------------------------------------------------- ownership
def test_a_lent_initial_evaluation_is_never_written() -> None:
    ball = _ball()
    target = torch.randn(5, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    objective, _ = _quadratic(target)
    initial = objective(ball.zeros())
    copies = (initial[0].clone(), tuple(g.clone() for g in initial[1]))
    lent = ascend(ball, objective, AscentSettings(n_iter=6), initial=initial,
                  host_decisions=False)
    assert torch.equal(initial[0], copies[0]) and torch.equal(initial[1][0], copies[1][0])
    handed = HandedOver(*objective(ball.zeros()))
    taken = ascend(ball, objective, AscentSettings(n_iter=6), initial=handed,
                   host_decisions=False)
    assert torch.equal(lent.loss, taken.loss)
    with pytest.raises(ValueError, match="taken already"):
        handed.take()


@pytest.mark.parametrize(("module", "name"), [
    ("measures", "plain_builder"), ("measures", "geodesic_builder"),
    ("solver", "host_decides"), ("solver", "HOST_DECISIONS_ON_CPU")])
def test_the_names_0_2_deprecated_are_gone(module: str, name: str) -> None:
    """0.3 removed them (CHANGELOG): reading one raises, with no warning first."""
    loaded = importlib.import_module(f"quotientsharp.engine.{module}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hasattr(loaded, name)


# ---------------------------------------------------------------------------- module trace
def _module_trace():
    spec = importlib.util.spec_from_file_location("module_trace",
                                                  ROOT / "benchmarks" / "module_trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["module_trace"] = module
    spec.loader.exec_module(module)
    return module


def test_the_module_trace_counts_hops_and_reentries() -> None:
    trace_script = _module_trace()
    synthetic = ["quotientsharp.engine.api", "quotientsharp.engine.api", "torch.nn",
                 "quotientsharp.engine.solver", "quotientsharp.engine.api",
                 "quotientsharp.engine.ball", "quotientsharp.models.layout"]
    every = trace_script.ModuleTrace.of(synthetic)
    assert (every.hops, every.reentries, every.calls) == (4, 1, 6)
    engine = trace_script.ModuleTrace.of(synthetic, "quotientsharp.engine")
    assert (engine.hops, engine.reentries) == (3, 1)


def test_the_module_trace_of_a_sharpness_call() -> None:
    pytest.importorskip("transformers")
    trace_script = _module_trace()
    profile = sys.getprofile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace, result = trace_script.trace_modules(trace_script.small_bert_call())
    assert result.per_batch and result.value == result.per_batch[0]
    assert trace.sequence[0] == "quotientsharp.engine.api"
    assert 0 <= trace.reentries <= trace.hops < trace.calls
    assert trace.hops == len(trace.sequence) - 1
    assert {"quotientsharp.engine.solver", "quotientsharp.engine.registry",
            "quotientsharp.engine.geometry"} <= trace.modules
    assert sys.getprofile() is profile          # the profiler is removed afterwards
