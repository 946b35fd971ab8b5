"""The adapters' defaults (as the docs state them), their NotImplementedError messages, the
error on an iterate that diverged, and ``benchmarks/step_sizes.py``."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quotientsharp as qs

geoopt = pytest.importorskip("geoopt")
pymanopt = pytest.importorskip("pymanopt")

from quotientsharp.core.adapters import PymanoptQuotient, QuotientManifold  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((6, 2), (5, 2))


def _point_and_step(manifold, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = manifold.random(generator=generator, dtype=torch.float64)
    u = 0.3 * manifold.random_tangent(x, generator=generator)
    return x, u


def test_geoopt_default_retraction_is_x_plus_u() -> None:
    manifold = QuotientManifold(qs.GLQuotient("mix"), SHAPES)
    x, u = _point_and_step(manifold)
    assert torch.equal(manifold.retr(x, u), x + u)
    # and not the order-2 geodesic, which differs at this step length
    second = QuotientManifold(qs.GLQuotient("mix"), SHAPES, retraction=2)
    assert float((second.retr(x, u) - (x + u)).abs().max()) > 1e-4


def test_pymanopt_default_retraction_is_the_order_two_geodesic() -> None:
    quotient = qs.GLQuotient("mix")
    space = PymanoptQuotient(quotient, SHAPES)
    generator = torch.Generator().manual_seed(1)
    x = quotient.random_point(shapes=SHAPES, generator=generator, dtype=torch.float64)
    v = tuple(0.3 * c for c in quotient.random_tangent(x, generator=generator))
    gamma = quotient.christoffel(x, v)
    expected = tuple(a + b - 0.5 * g for a, b, g in zip(x, v, gamma, strict=True))
    got = space.retraction(tuple(c.numpy() for c in x), tuple(c.numpy() for c in v))
    for a, b in zip(got, expected, strict=True):
        assert float((torch.from_numpy(a) - b).abs().max()) <= 1e-12


def test_docs_state_the_defaults_of_the_signatures() -> None:
    text = (ROOT / "docs" / "adapters.md").read_text()
    for cls in (QuotientManifold, PymanoptQuotient):
        default = inspect.signature(cls).parameters["retraction"].default
        stated = re.findall(rf"`{cls.__name__}\([^`]*retraction=([^,)`]+)", text)
        assert stated, f"docs/adapters.md gives no signature of {cls.__name__}"
        assert all(s == repr(default) for s in stated), (cls.__name__, stated, default)


@pytest.mark.parametrize("call", ["dist", "dist2", "logmap"])
def test_geoopt_not_implemented_says_what_to_use(call) -> None:
    manifold = QuotientManifold(qs.GLQuotient("mix"), SHAPES)
    x, _ = _point_and_step(manifold)
    with pytest.raises(NotImplementedError) as info:
        getattr(manifold, call)(x, x)
    message = str(info.value)
    assert "no closed form" in message and ("instead" in message or "approximation" in message)


@pytest.mark.parametrize("call", ["dist", "log", "pair_mean"])
def test_pymanopt_not_implemented_says_what_to_use(call) -> None:
    space = PymanoptQuotient(qs.GLQuotient("mix"), SHAPES)
    point = space.random_point()
    with pytest.raises(NotImplementedError) as info:
        getattr(space, call)(point, point)
    message = str(info.value)
    assert call in message or "distance" in message
    assert "approximation" in message or "use " in message


def _sgd(metric: str, lr: float, steps: int = 30):
    generator = torch.Generator().manual_seed(0)
    n, m, h = 30, 20, 3
    target = (torch.randn(n, h, generator=generator, dtype=torch.float64)
              @ torch.randn(m, h, generator=generator, dtype=torch.float64).T)
    start = (torch.randn(n, h, generator=generator, dtype=torch.float64),
             torch.randn(m, h, generator=generator, dtype=torch.float64))
    manifold = QuotientManifold(qs.GLQuotient(metric), ((n, h), (m, h)))
    parameter = geoopt.ManifoldParameter(manifold.merge(start), manifold=manifold)
    optimizer = geoopt.optim.RiemannianSGD([parameter], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        G, H = manifold.split(parameter)
        (0.5 * (G @ H.mT - target).square().sum()).backward()
        optimizer.step()
    with torch.no_grad():
        G, H = manifold.split(parameter)
        return float((G @ H.mT - target).norm() / target.norm())


def test_a_diverged_iterate_names_the_step_and_suggests_a_smaller_lr() -> None:
    with pytest.raises(ValueError) as info:
        _sgd("inv", 0.01)
    message = str(info.value)
    assert re.search(r"diverged: retraction step \d+ on this manifold", message), message
    assert "smaller step size" in message and "inv metric" in message
    assert "times its norm" in message
    # the same problem at a step size the docs give as stable converges
    assert _sgd("inv", 5.62e-4, steps=200) < 1e-6
    assert _sgd("mix", 0.5) < 1e-8


def test_a_retraction_to_non_finite_values_names_the_step() -> None:
    manifold = QuotientManifold(qs.GLQuotient("mix"), SHAPES, retraction=2)
    x, u = _point_and_step(manifold)
    with pytest.raises(ValueError, match=r"retraction step 1 .*non-finite point.*smaller step"):
        manifold.retr(x, 1e200 * u)
    with qs.value_checks(False):       # no host syncs: the check is skipped
        assert not bool(torch.isfinite(manifold.retr(x, 1e200 * u)).all())


def test_a_bad_start_keeps_the_quotients_own_message() -> None:
    manifold = QuotientManifold(qs.GLQuotient("inv"), SHAPES)
    x, u = _point_and_step(manifold)
    bad = torch.zeros_like(x)
    with pytest.raises(ValueError) as info:
        manifold.egrad2rgrad(bad, u)
    assert "diverged" not in str(info.value)


def test_step_size_benchmark_runs_and_orders_the_metrics(tmp_path) -> None:
    out = tmp_path / "steps.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_sizes.py"), "--quick",
                           "--json", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    stable = {row["metric"]: row["largest_stable_lr"] for row in results["stable"]}
    # inv needs steps at least 30 times smaller than mix on this problem
    assert stable["inv"] is not None and stable["mix"] is not None
    assert stable["inv"] * 30 <= stable["mix"]
    orders = {row["retraction"]: row for row in results["orders"]}
    assert set(orders) == {"1", "2", "exact"}
    assert all(row["steps_to_tol"] is not None for row in orders.values())
