"""Low-rank matrix completion (examples/matrix_completion.py): real convergence to the truth.

(1) geoopt RiemannianSGD on our GL-mix quotient from a random start reaches held-out relative
RMSE < 1e-3; (2) pymanopt TrustRegions on our GL-mix quotient and on pymanopt's own
FixedRankEmbedded (with the Riemannian Hessian the example supplies, itself Taylor-tested here)
both recover the held-out entries to 1e-9. Full benchmark size (300 x 200, rank 5, 25% observed).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from quotientsharp.core import reference

pytest.importorskip("geoopt")
pymanopt = pytest.importorskip("pymanopt")
pytest.importorskip("scipy")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "matrix_completion.py"


def load_example():
    name = "quotientsharp_example_matrix_completion"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


mc = load_example()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These fits are many small tensor operations: on a shared 2-core machine, torch's thread
    pool spinning against other processes made a fit 10-15x slower than with one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def problem():
    return mc.make_problem(300, 200, 5, 0.25, seed=0)


def test_problem_is_what_it_says(problem):
    n, m = problem.shape
    assert (n, m) == (300, 200) and problem.rank == 5
    assert np.linalg.matrix_rank(problem.truth) == 5
    assert problem.values.size == 15000 and problem.test_values.size == 45000
    observed = set(zip(problem.rows.tolist(), problem.cols.tolist(), strict=True))
    held_out = set(zip(problem.test_rows.tolist(), problem.test_cols.tolist(), strict=True))
    assert not observed & held_out and len(observed | held_out) == n * m
    again = mc.make_problem(300, 200, 5, 0.25, seed=0)
    assert np.array_equal(again.truth, problem.truth) and np.array_equal(again.rows, problem.rows)
    # the starting point is far from the truth: convergence below is real
    assert mc.heldout_error(problem, *mc.random_factors(problem)) > 0.9


def test_make_problem_errors():
    with pytest.raises(ValueError, match="observed must be a fraction"):
        mc.make_problem(observed=1.5)
    with pytest.raises(ValueError, match="fewer than the .* degrees of freedom"):
        mc.make_problem(30, 20, 5, 0.2)
    with pytest.raises(ValueError, match="rank must be an int"):
        mc.make_problem(rank=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_geoopt_riemannian_sgd_on_gl_mix_completes_the_matrix(problem, dtype):
    fit = mc.fit_geoopt(problem, metric="mix", optimizer="sgd", lr=0.5, max_steps=200,
                        tol=1e-3, init="random", seed=0, dtype=dtype)
    assert fit["converged"], fit["history"][-5:]
    assert fit["error"] < 1e-3
    assert fit["history"][0] > 0.1  # the first step does not already solve it
    # the recovered matrix is the truth everywhere, not only on the observed entries
    recovered = fit["G"].astype(np.float64) @ fit["H"].astype(np.float64).T
    assert np.linalg.norm(recovered - problem.truth) / np.linalg.norm(problem.truth) < 2e-3


def test_pymanopt_trust_regions_gl_mix_and_fixed_rank_both_recover_the_truth(problem):
    ours = mc.fit_pymanopt(problem, manifold="gl", metric="mix", optimizer="trust_regions",
                           derivatives="autodiff", tol=1e-9, max_iterations=100)
    baseline = mc.fit_pymanopt(problem, manifold="fixed_rank", optimizer="trust_regions",
                               tol=1e-9, max_iterations=100)
    for fit in (ours, baseline):
        assert fit["converged"] and fit["error"] < 1e-9, (fit["iterations"], fit["error"])
        assert fit["trace"][0]["error"] > 0.9
    G, H = ours["point"]
    assert np.linalg.norm(G @ H.T - problem.truth) / np.linalg.norm(problem.truth) < 1e-9
    u, s, vt = baseline["point"]
    assert np.linalg.norm((u * s) @ vt - problem.truth) / np.linalg.norm(problem.truth) < 1e-9
    # second-order convergence: a handful of trust-region steps, not hundreds
    assert ours["iterations"] <= 60 and baseline["iterations"] <= 60


def test_gl_closed_derivatives_match_autograd():
    small = mc.make_problem(30, 20, 3, 0.5, seed=1)
    cost, egrad, ehess = mc.gl_derivatives(small)
    data = mc.TorchData(small)
    rng = np.random.default_rng(0)
    G, H = rng.standard_normal((30, 3)), rng.standard_normal((20, 3))
    dG, dH = rng.standard_normal((30, 3)), rng.standard_normal((20, 3))
    Gt, Ht = torch.tensor(G, requires_grad=True), torch.tensor(H, requires_grad=True)
    value = data.loss(Gt, Ht)
    grads = torch.autograd.grad(value, (Gt, Ht), create_graph=True)
    directional = (grads[0] * torch.from_numpy(dG)).sum() + (grads[1] * torch.from_numpy(dH)).sum()
    hvp = torch.autograd.grad(directional, (Gt, Ht))
    assert abs(cost(G, H) - float(value.detach())) <= 1e-12 * abs(float(value.detach()))
    for closed, auto in zip(egrad(G, H), grads, strict=True):
        np.testing.assert_allclose(closed, auto.detach().numpy(), rtol=1e-12, atol=1e-12)
    for closed, auto in zip(ehess(G, H, dG, dH), hvp, strict=True):
        np.testing.assert_allclose(closed, auto.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_fixed_rank_baseline_gradient_and_hessian_taylor(seed):
    """The supplied FixedRankEmbedded derivatives: slopes 2 and 3 along its retraction."""
    from pymanopt.manifolds import FixedRankEmbedded

    small = mc.make_problem(30, 20, 3, 0.5, seed=seed)
    space = FixedRankEmbedded(30, 20, 3)
    cost, rgrad, rhess = mc.fixed_rank_derivatives(small, space)
    G, H = mc.random_factors(small, seed)
    u, s, vt = np.linalg.svd(G @ H.T, full_matrices=False)
    x = (u[:, :3], s[:3], vt[:3])
    np.random.seed(seed)  # noqa: NPY002 - pymanopt's FixedRankEmbedded samples from it
    xi = space.random_tangent_vector(x)
    f0 = cost(*x)
    first = space.inner_product(x, rgrad(*x), xi)
    second = space.inner_product(x, rhess(*x, *xi), xi)
    # f0 ~ 1e3 and |xi| = 1: larger steps than usual keep the t^3 term above the rounding
    # of pymanopt's retraction (which also shifts the singular values by np.spacing(1))
    ts = torch.logspace(-2.5, -0.5, 7, dtype=torch.float64)
    err1, err2 = [], []
    for t in ts.tolist():
        ft = cost(*space.retraction(x, t * xi))
        err1.append(abs(ft - f0 - t * first))
        err2.append(abs(ft - f0 - t * first - 0.5 * t * t * second))
    assert abs(reference.taylor_slope(ts, torch.tensor(err1)) - 2.0) < 0.1, err1
    assert abs(reference.taylor_slope(ts, torch.tensor(err2)) - 3.0) < 0.15, err2
