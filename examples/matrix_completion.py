"""Low-rank matrix completion on the GL(h) quotient, with geoopt and with pymanopt.

A synthetic rank-``h`` matrix ``M = A B^T`` (``A [n, h]``, ``B [m, h]`` standard Gaussian,
seeded) is observed on a random fraction of its entries ``Omega``; the rest are held out. We fit
``M ~ G H^T`` by minimising

    ``f(G, H) = 1 / (2 p) * sum_{(i, j) in Omega} ((G H^T)_ij - M_ij)^2``,   ``p = |Omega| / (n m)``

(an unbiased estimate of ``||G H^T - M||_F^2 / 2``). ``f`` only sees ``G H^T``, so it is invariant
under ``(G, H) -> (G A^{-1}, H A^T)`` and lives on the GL(h) quotient. Convergence is measured
on the held-out entries: ``||P_test(G H^T - M)|| / ||P_test(M)||`` (the relative RMSE).

- :func:`fit_geoopt`: ``geoopt.optim.RiemannianSGD`` / ``RiemannianAdam`` on a
  ``geoopt.ManifoldParameter`` of our :class:`~quotientsharp.core.adapters.QuotientManifold`. Plain
  Riemannian SGD under the mix metric is scaled gradient descent: ``grad_G = dL/dG (H^T H)^{-1}``.
- :func:`fit_pymanopt`: pymanopt's ``TrustRegions`` (or ``ConjugateGradient``,
  ``SteepestDescent``) on our :class:`~quotientsharp.core.adapters.PymanoptQuotient`, or on
  pymanopt's
  own ``FixedRankEmbedded`` from the same starting matrix. pymanopt 2.2 has no Hessian for
  ``FixedRankEmbedded`` (its docstring says it does not work with TrustRegions), so
  :func:`fixed_rank_derivatives` supplies the embedded-geometry Riemannian Hessian
  (projection of the Euclidean Hessian plus the Weingarten curvature term of Absil, Mahony and
  Trumpf 2013 / Vandereycken 2013), which ``tests/test_matrix_completion.py`` checks by a Taylor
  test.

Run ``python examples/matrix_completion.py`` for a demonstration; ``benchmarks/
matrix_completion.py`` compares iterations and wall time.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from quotientsharp.core.gl import GLQuotient

OPTIMIZERS = ("trust_regions", "conjugate_gradient", "steepest_descent")


# ---------------------------------------------------------------------------------- the data
@dataclass(frozen=True)
class CompletionProblem:
    """A matrix to complete: the truth, the observed entries and the held-out entries.

    Observed entries are sorted by (row, column) (compressed sparse row order).

    Attributes
    ----------
    truth
        The full matrix ``M = A B^T``, ``shape=[n, m]``.
    rank
        ``h``, the rank of ``M`` and the width of the factors.
    rows, cols, values
        Observed entries, ``shape=[|Omega|]``.
    test_rows, test_cols, test_values
        Held-out entries (all unobserved ones), ``shape=[n m - |Omega|]``.
    """

    truth: np.ndarray
    rank: int
    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    test_rows: np.ndarray
    test_cols: np.ndarray
    test_values: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.truth.shape  # type: ignore[return-value]

    @property
    def fraction(self) -> float:
        """``p``, the observed fraction of entries."""
        return self.values.size / self.truth.size

    @property
    def dimension(self) -> int:
        """Dimension of the rank-``h`` matrices: ``(n + m - h) h``."""
        n, m = self.shape
        return (n + m - self.rank) * self.rank


def make_problem(n: int = 300, m: int = 200, rank: int = 5, observed: float = 0.25,
                 seed: int = 0) -> CompletionProblem:
    """A seeded synthetic completion problem.

    Parameters
    ----------
    n, m, rank
        ``M = A B^T`` with ``A [n, rank]``, ``B [m, rank]`` standard Gaussian.
    observed
        Fraction of entries observed, drawn uniformly without replacement.
    seed
        Seed of the numpy generator drawing ``A``, ``B`` and the observed set.
    """
    if not (isinstance(rank, int) and 1 <= rank <= min(n, m)):
        raise ValueError(f"rank must be an int in [1, min(n, m)] = [1, {min(n, m)}], got {rank}")
    if not 0.0 < observed < 1.0:
        raise ValueError(f"observed must be a fraction in (0, 1), got {observed}")
    rng = np.random.default_rng(seed)
    truth = rng.standard_normal((n, rank)) @ rng.standard_normal((m, rank)).T
    count = round(observed * n * m)
    if count < (n + m - rank) * rank:
        raise ValueError(f"observed={observed} gives {count} entries, fewer than the "
                         f"{(n + m - rank) * rank} degrees of freedom of a rank-{rank} matrix")
    flat = np.sort(rng.choice(n * m, size=count, replace=False))
    mask = np.zeros(n * m, dtype=bool)
    mask[flat] = True
    per_row = mask.reshape(n, m).sum(1)
    per_col = mask.reshape(n, m).sum(0)
    if per_row.min() < rank or per_col.min() < rank:
        raise ValueError(f"observed={observed} leaves a row or column with fewer than {rank} "
                         f"observed entries (not identifiable); observe more entries")
    rows, cols = np.divmod(flat, m)
    test_rows, test_cols = np.divmod(np.flatnonzero(~mask), m)
    return CompletionProblem(truth, rank, rows, cols, truth[rows, cols], test_rows, test_cols,
                             truth[test_rows, test_cols])


def random_factors(problem: CompletionProblem, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Standard Gaussian factors ``G [n, h]``, ``H [m, h]`` (``G H^T`` has the truth's scale)."""
    rng = np.random.default_rng(10_000 + seed)
    n, m = problem.shape
    return rng.standard_normal((n, problem.rank)), rng.standard_normal((m, problem.rank))


def spectral_factors(problem: CompletionProblem) -> tuple[np.ndarray, np.ndarray]:
    """Balanced factors of the rank-``h`` truncated SVD of ``P_Omega(M) / p``."""
    n, m = problem.shape
    zero_filled = np.zeros((n, m))
    zero_filled[problem.rows, problem.cols] = problem.values / problem.fraction
    u, s, vt = np.linalg.svd(zero_filled, full_matrices=False)
    root = np.sqrt(s[:problem.rank])
    return u[:, :problem.rank] * root, vt[:problem.rank].T * root


def initial_factors(problem: CompletionProblem, init: str = "random",
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    if init == "random":
        return random_factors(problem, seed)
    if init == "spectral":
        return spectral_factors(problem)
    raise ValueError(f"init must be 'random' or 'spectral', got {init!r}")


# ---------------------------------------------------------------------------------- losses
class TorchData:
    """The problem's index and value arrays as torch tensors of one dtype and device."""

    def __init__(self, problem: CompletionProblem, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        def index(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(a, dtype=torch.long, device=device)

        self.rows, self.cols = index(problem.rows), index(problem.cols)
        self.test_rows, self.test_cols = index(problem.test_rows), index(problem.test_cols)
        self.values = torch.as_tensor(problem.values, dtype=dtype, device=device)
        self.test_values = torch.as_tensor(problem.test_values, dtype=dtype, device=device)
        self.fraction = problem.fraction

    def loss(self, G: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
        """``f(G, H) = sum_Omega ((G H^T)_ij - M_ij)^2 / (2 p)``, a scalar."""
        residual = (G[self.rows] * H[self.cols]).sum(-1) - self.values
        return 0.5 * residual.square().sum() / self.fraction

    def heldout_error(self, G: torch.Tensor, H: torch.Tensor) -> float:
        """Relative RMSE on the held-out entries."""
        with torch.no_grad():
            predicted = (G[self.test_rows] * H[self.test_cols]).sum(-1)
            return float((predicted - self.test_values).norm() / self.test_values.norm())


def heldout_error(problem: CompletionProblem, G: np.ndarray, H: np.ndarray) -> float:
    """Relative RMSE of ``G H^T`` on the held-out entries (numpy factors)."""
    predicted = np.einsum("ij,ij->i", G[problem.test_rows], H[problem.test_cols])
    return float(np.linalg.norm(predicted - problem.test_values)
                 / np.linalg.norm(problem.test_values))


# ---------------------------------------------------------------------------------- geoopt
def fit_geoopt(problem: CompletionProblem, *, metric: str = "mix", optimizer: str = "sgd",
               lr: float = 0.5, momentum: float = 0.0, retraction: int | str = 2,
               max_steps: int = 500, tol: float = 1e-3, init: str = "random", seed: int = 0,
               dtype: torch.dtype = torch.float64) -> dict[str, Any]:
    """Fit with a geoopt Riemannian optimizer on the GL(h) quotient, until the held-out relative
    RMSE falls below ``tol`` (checked after every step) or ``max_steps``.

    The parameter is one ``geoopt.ManifoldParameter`` holding ``[G; H]``, ``shape=[n + m, h]``.

    Returns
    -------
    dict
        ``converged``, ``steps`` (to reach ``tol``, or ``max_steps``), ``error`` (final held-out
        relative RMSE), ``seconds`` (optimisation wall time, error evaluations excluded),
        ``history`` (held-out error after each step) and the final ``G``, ``H`` (numpy).
    """
    import geoopt

    from quotientsharp.core.adapters import QuotientManifold

    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    n, m = problem.shape
    h = problem.rank
    data = TorchData(problem, dtype)
    manifold = QuotientManifold(GLQuotient(metric), ((n, h), (m, h)), retraction=retraction)
    start = tuple(torch.as_tensor(a, dtype=dtype) for a in initial_factors(problem, init, seed))
    parameter = geoopt.ManifoldParameter(manifold.merge(start), manifold=manifold)
    if optimizer == "sgd":
        opt = geoopt.optim.RiemannianSGD([parameter], lr=lr, momentum=momentum)
    else:
        opt = geoopt.optim.RiemannianAdam([parameter], lr=lr)
    history: list[float] = []
    elapsed = 0.0
    for _ in range(max_steps):
        tic = time.perf_counter()
        opt.zero_grad()
        G, H = manifold.split(parameter)
        data.loss(G, H).backward()
        opt.step()
        elapsed += time.perf_counter() - tic
        history.append(data.heldout_error(*manifold.split(parameter)))
        if not math.isfinite(history[-1]) or history[-1] < tol:
            break
    G, H = (t.detach().numpy().copy() for t in manifold.split(parameter))
    return {"converged": bool(history[-1] < tol), "steps": len(history), "error": history[-1],
            "seconds": elapsed, "history": history, "G": G, "H": H}


# ---------------------------------------------------------------------------------- pymanopt
class _ToleranceReached(Exception):
    """Raised from inside a pymanopt run to stop it at the first iterate within tolerance."""


def _csr_pattern(problem: CompletionProblem) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    n, _ = problem.shape
    indptr = np.concatenate([[0], np.cumsum(np.bincount(problem.rows, minlength=n))])
    return problem.cols.astype(np.int64), indptr.astype(np.int64), problem.shape


def _sparse(problem: CompletionProblem, data: np.ndarray) -> Any:
    """``P_Omega`` of a matrix given by its values on ``Omega`` (scipy CSR)."""
    import scipy.sparse

    cols, indptr, shape = _csr_pattern(problem)
    return scipy.sparse.csr_matrix((data, cols, indptr), shape=shape)


def _sampled(problem: CompletionProblem, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``(left @ right^T)`` on ``Omega``."""
    return np.einsum("ij,ij->i", left[problem.rows], right[problem.cols])


def gl_derivatives(problem: CompletionProblem) -> tuple[Callable, Callable, Callable]:
    """Closed-form numpy cost, Euclidean gradient and Hessian-vector product of ``f(G, H)``.

    With ``Z = P_Omega(G H^T - M) / p``: ``egrad = (Z H, Z^T G)``; along ``(dG, dH)``, with
    ``dZ = P_Omega(dG H^T + G dH^T) / p``: ``ehess = (dZ H + Z dH, dZ^T G + Z^T dG)``.
    """
    p = problem.fraction

    def cost(G: np.ndarray, H: np.ndarray) -> float:
        residual = _sampled(problem, G, H) - problem.values
        return 0.5 * float(residual @ residual) / p

    def egrad(G: np.ndarray, H: np.ndarray) -> list[np.ndarray]:
        z = _sparse(problem, (_sampled(problem, G, H) - problem.values) / p)
        return [z @ H, z.T @ G]

    def ehess(G: np.ndarray, H: np.ndarray, dG: np.ndarray, dH: np.ndarray) -> list[np.ndarray]:
        z = _sparse(problem, (_sampled(problem, G, H) - problem.values) / p)
        dz = _sparse(problem, (_sampled(problem, dG, H) + _sampled(problem, G, dH)) / p)
        return [dz @ H + z @ dH, dz.T @ G + z.T @ dG]

    return cost, egrad, ehess


def fixed_rank_derivatives(problem: CompletionProblem,
                           manifold: Any) -> tuple[Callable, Callable, Callable]:
    """Cost, Riemannian gradient and Riemannian Hessian of ``f`` on ``FixedRankEmbedded``.

    A point is ``X = U diag(s) V^T`` (pymanopt's ``(u, s, vt)``), a tangent vector
    ``(Up, M, Vp)`` means ``U M V^T + Up V^T + U Vp^T``. With ``Z = P_Omega(X - M) / p`` the
    Euclidean gradient: ``grad = P_T(Z)`` and, along ``xi``,

        ``Hess[xi] = P_T(P_Omega(xi) / p) + (P_U^perp Z Vp diag(s)^{-1}, 0,
        P_V^perp Z^T Up diag(s)^{-1})``,

    the Weingarten term of the embedded submanifold (``P_T`` is pymanopt's ``projection``).
    """
    p = problem.fraction

    def residual(u: np.ndarray, s: np.ndarray, vt: np.ndarray) -> np.ndarray:
        return _sampled(problem, u * s, vt.T) - problem.values

    def cost(u: np.ndarray, s: np.ndarray, vt: np.ndarray) -> float:
        r = residual(u, s, vt)
        return 0.5 * float(r @ r) / p

    def rgrad(u: np.ndarray, s: np.ndarray, vt: np.ndarray) -> Any:
        z = _sparse(problem, residual(u, s, vt) / p)
        return manifold.projection((u, s, vt), z)

    def rhess(u: np.ndarray, s: np.ndarray, vt: np.ndarray, up: np.ndarray, mid: np.ndarray,
              vp: np.ndarray) -> Any:
        point = (u, s, vt)
        z = _sparse(problem, residual(u, s, vt) / p)
        v = vt.T
        xi = _sampled(problem, u @ mid + up, v) + _sampled(problem, u, vp)
        hess = manifold.projection(point, _sparse(problem, xi / p))
        bend_u = (z @ vp) / s
        bend_v = (z.T @ up) / s
        return type(hess)(hess[0] + bend_u - u @ (u.T @ bend_u), hess[1],
                          hess[2] + bend_v - v @ (v.T @ bend_v))

    return cost, rgrad, rhess


class _Recorder:
    """Counts calls and records the accepted iterates of a pymanopt run, in wall-clock time."""

    def __init__(self, evaluate: Callable[[Any], float], tol: float) -> None:
        self.evaluate, self.tol = evaluate, tol
        self.cost_calls = self.gradient_calls = self.hessian_calls = 0
        self.trace: list[dict[str, float]] = []
        self.start = time.perf_counter()
        self.excluded = 0.0
        self.point: Any = None

    def cost(self, function: Callable) -> Callable:
        def counted(point: Any) -> float:
            self.cost_calls += 1
            return function(point)
        return counted

    def hessian(self, function: Callable) -> Callable:
        def counted(point: Any, vector: Any) -> Any:
            self.hessian_calls += 1
            return function(point, vector)
        return counted

    def gradient(self, function: Callable) -> Callable:
        def recorded(point: Any) -> Any:
            # pymanopt computes the gradient once per accepted iterate (and at the start)
            seconds = time.perf_counter() - self.start - self.excluded
            tic = time.perf_counter()
            error = self.evaluate(point)
            self.excluded += time.perf_counter() - tic
            self.trace.append({"seconds": seconds, "error": error, "cost_calls": self.cost_calls,
                               "gradient_calls": self.gradient_calls,
                               "hessian_calls": self.hessian_calls})
            self.point = point
            self.gradient_calls += 1
            if error < self.tol:
                raise _ToleranceReached
            return function(point)
        return recorded


def fit_pymanopt(problem: CompletionProblem, *, manifold: str = "gl", metric: str = "mix",
                 optimizer: str = "trust_regions", derivatives: str = "autodiff",
                 tol: float = 1e-9, max_iterations: int = 300, init: str = "random",
                 seed: int = 0, delta_bar: float | str | None = None,
                 max_time: float = 600.0) -> dict[str, Any]:
    """Fit with a pymanopt optimizer until the held-out relative RMSE is below ``tol``.

    Parameters
    ----------
    manifold
        ``"gl"``: our :class:`~quotientsharp.core.adapters.PymanoptQuotient` of
        ``GLQuotient(metric)``
        on ``(G, H)``; ``"fixed_rank"``: pymanopt's ``FixedRankEmbedded`` on ``(u, s, vt)``, from
        the same starting matrix ``G_0 H_0^T``.
    derivatives
        GL only: ``"autodiff"`` (pymanopt's pytorch backend differentiates the torch cost) or
        ``"closed"`` (numpy closed forms of :func:`gl_derivatives`, the same sparse kernels as
        the fixed-rank baseline). The fixed-rank baseline always uses closed forms.
    delta_bar
        TrustRegions' maximal radius ``Delta_bar`` (``Delta0 = Delta_bar / 8``). ``None``: the
        same radius for both manifolds, ``FixedRankEmbedded``'s default ``(n + m - h) h`` (the
        mix metric and the embedded metric both measure lengths in units of ``G H^T``);
        ``"manifold"``: each manifold's own ``typical_dist``.

    Returns
    -------
    dict
        ``converged``, ``iterations`` (outer iterations to reach ``tol``: trust-region steps,
        accepted or rejected, for TrustRegions; line-search steps otherwise), ``hessian_calls``
        (Hessian-vector products), ``gradient_calls``, ``cost_calls``, ``seconds`` (wall time to
        reach ``tol``, held-out evaluations excluded), ``error`` and ``trace`` (per accepted
        iterate).
    """
    import pymanopt
    from pymanopt.optimizers import ConjugateGradient, SteepestDescent, TrustRegions

    from quotientsharp.core.adapters import PymanoptQuotient

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if manifold not in ("gl", "fixed_rank"):
        raise ValueError(f"manifold must be 'gl' or 'fixed_rank', got {manifold!r}")
    if derivatives not in ("autodiff", "closed"):
        raise ValueError(f"derivatives must be 'autodiff' or 'closed', got {derivatives!r}")
    n, m = problem.shape
    h = problem.rank
    G0, H0 = initial_factors(problem, init, seed)
    if manifold == "gl":
        space = PymanoptQuotient(GLQuotient(metric), ((n, h), (m, h)))
        start: Any = (G0, H0)
        if derivatives == "autodiff":
            data = TorchData(problem, torch.float64)

            @pymanopt.function.pytorch(space)
            def cost(G: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
                return data.loss(G, H)

            problem_kwargs: dict[str, Any] = {}
        else:
            cost_np, egrad_np, ehess_np = gl_derivatives(problem)
            cost = pymanopt.function.numpy(space)(cost_np)
            problem_kwargs = {
                "euclidean_gradient": pymanopt.function.numpy(space)(egrad_np),
                "euclidean_hessian": pymanopt.function.numpy(space)(ehess_np)}

        def evaluate(point: Any) -> float:
            return heldout_error(problem, point[0], point[1])
    else:
        from pymanopt.manifolds import FixedRankEmbedded

        space = FixedRankEmbedded(n, m, h)
        u, s, vt = np.linalg.svd(G0 @ H0.T, full_matrices=False)
        start = (u[:, :h], s[:h], vt[:h])
        cost_np, rgrad_np, rhess_np = fixed_rank_derivatives(problem, space)
        cost = pymanopt.function.numpy(space)(cost_np)
        problem_kwargs = {"riemannian_gradient": pymanopt.function.numpy(space)(rgrad_np),
                          "riemannian_hessian": pymanopt.function.numpy(space)(rhess_np)}

        def evaluate(point: Any) -> float:
            return heldout_error(problem, point[0] * point[1], point[2].T)

    recorder = _Recorder(evaluate, tol)

    class RecordingProblem(pymanopt.Problem):
        @property
        def cost(self) -> Callable:
            return recorder.cost(super().cost)

        @property
        def riemannian_gradient(self) -> Callable:
            return recorder.gradient(super().riemannian_gradient)

        @property
        def riemannian_hessian(self) -> Callable:
            return recorder.hessian(super().riemannian_hessian)

    task = RecordingProblem(space, cost, **problem_kwargs)
    common = {"verbosity": 0, "max_iterations": max_iterations, "min_gradient_norm": 0.0,
              "max_time": max_time}
    solver = {"trust_regions": TrustRegions, "conjugate_gradient": ConjugateGradient,
              "steepest_descent": SteepestDescent}[optimizer](**common)
    run_kwargs: dict[str, Any] = {"initial_point": start}
    if optimizer == "trust_regions" and delta_bar != "manifold":
        run_kwargs["Delta_bar"] = float(problem.dimension if delta_bar is None else delta_bar)
    recorder.start = time.perf_counter()
    try:
        solver.run(task, **run_kwargs)
        stopped = "optimizer stopped"
    except _ToleranceReached:
        stopped = "tolerance reached"
    last = recorder.trace[-1]
    iterations = (last["cost_calls"] - 1 if optimizer == "trust_regions"
                  else last["gradient_calls"])
    return {"converged": stopped == "tolerance reached", "iterations": int(iterations),
            "hessian_calls": int(last["hessian_calls"]),
            "gradient_calls": int(last["gradient_calls"]) + 1,
            "cost_calls": int(last["cost_calls"]), "seconds": last["seconds"],
            "error": last["error"], "trace": recorder.trace, "point": recorder.point}


# ---------------------------------------------------------------------------------- demo
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--m", type=int, default=200)
    parser.add_argument("--rank", type=int, default=5)
    parser.add_argument("--observed", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; these fits are many small operations, and extra "
                             "threads only contend on a busy machine")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    problem = make_problem(args.n, args.m, args.rank, args.observed, args.seed)
    print(f"{args.n} x {args.m} rank-{args.rank} matrix, {problem.values.size} observed entries "
          f"({problem.fraction:.0%}), {problem.test_values.size} held out")
    fit = fit_geoopt(problem, seed=args.seed)
    print(f"geoopt RiemannianSGD, GL-mix:       held-out rel. RMSE {fit['error']:.2e} after "
          f"{fit['steps']} steps, {fit['seconds']:.2f} s")
    for name, kwargs in (("GL-mix (ours)", {"manifold": "gl"}),
                         ("FixedRankEmbedded", {"manifold": "fixed_rank"})):
        fit = fit_pymanopt(problem, seed=args.seed, **kwargs)
        print(f"pymanopt TrustRegions, {name:18s}: held-out rel. RMSE {fit['error']:.2e} after "
              f"{fit['iterations']} iterations ({fit['hessian_calls']} Hessian-vector products),"
              f" {fit['seconds']:.2f} s")


if __name__ == "__main__":
    main()
