"""Matrix completion: our GL quotient against pymanopt's FixedRankEmbedded, same data, same run.

For each seed, every method starts from the same random rank-``h`` matrix (``G_0 H_0^T``; the
fixed-rank baseline starts from its SVD) and runs until the held-out relative RMSE falls below
``--tol``. We report iterations, Hessian-vector products and wall time to that tolerance, and the
ratios ours / FixedRankEmbedded measured in the same run (medians over seeds). Nothing is
asserted: timings depend on the machine, ratios are the comparable numbers.

Methods:

- ``tr gl-mix (autodiff)``: pymanopt TrustRegions on ``PymanoptQuotient(GLQuotient("mix"))``,
  derivatives by pymanopt's pytorch backend;
- ``tr gl-mix (closed)``, ``tr gl-inv (closed)``: the same with numpy closed-form derivatives
  (the same sparse kernels as the baseline);
- ``tr gl-mix (own radius)``: with the adapter's default ``typical_dist`` instead of the shared
  ``Delta_bar``;
- ``tr fixed-rank``: TrustRegions on ``FixedRankEmbedded`` with the example's Riemannian Hessian;
- ``cg ...`` / ``sd ...``: ConjugateGradient / SteepestDescent on both manifolds;
- ``geoopt sgd gl-mix (retr k)``: geoopt RiemannianSGD (lr 0.5) with retraction order ``k``
  (the exact geodesic, RK4 with 64 steps, is left out: ~25x slower per step for the same
  iterations).

Run: ``python benchmarks/matrix_completion.py [--json PATH] [--seeds 0 1 2] [--tol 1e-9]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_example() -> Any:
    name = "quotientsharp_example_matrix_completion"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples"
                                                      / "matrix_completion.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def methods(max_iterations: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, driver, keyword arguments) of every method benchmarked."""
    tr = {"optimizer": "trust_regions", "max_iterations": max_iterations}
    cg = {"optimizer": "conjugate_gradient", "max_iterations": 20 * max_iterations}
    sd = {"optimizer": "steepest_descent", "max_iterations": 20 * max_iterations}
    return [
        ("tr gl-mix (autodiff)", "pymanopt", {**tr, "manifold": "gl", "metric": "mix",
                                              "derivatives": "autodiff"}),
        ("tr gl-mix (closed)", "pymanopt", {**tr, "manifold": "gl", "metric": "mix",
                                            "derivatives": "closed"}),
        ("tr gl-inv (closed)", "pymanopt", {**tr, "manifold": "gl", "metric": "inv",
                                            "derivatives": "closed"}),
        ("tr gl-mix (own radius)", "pymanopt", {**tr, "manifold": "gl", "metric": "mix",
                                                "derivatives": "closed",
                                                "delta_bar": "manifold"}),
        ("tr fixed-rank", "pymanopt", {**tr, "manifold": "fixed_rank"}),
        ("cg gl-mix (closed)", "pymanopt", {**cg, "manifold": "gl", "metric": "mix",
                                            "derivatives": "closed"}),
        ("cg fixed-rank", "pymanopt", {**cg, "manifold": "fixed_rank"}),
        ("sd gl-mix (closed)", "pymanopt", {**sd, "manifold": "gl", "metric": "mix",
                                            "derivatives": "closed"}),
        ("sd fixed-rank", "pymanopt", {**sd, "manifold": "fixed_rank"}),
        ("geoopt sgd gl-mix (retr 1)", "geoopt", {"retraction": 1}),
        ("geoopt sgd gl-mix (retr 2)", "geoopt", {"retraction": 2}),
    ]


RATIOS = [("tr gl-mix (autodiff)", "tr fixed-rank"), ("tr gl-mix (closed)", "tr fixed-rank"),
          ("tr gl-inv (closed)", "tr fixed-rank"), ("tr gl-mix (own radius)", "tr fixed-rank"),
          ("cg gl-mix (closed)", "cg fixed-rank"), ("sd gl-mix (closed)", "sd fixed-rank"),
          ("geoopt sgd gl-mix (retr 2)", "geoopt sgd gl-mix (retr 1)")]


def run_one(mc: Any, problem: Any, driver: str, kwargs: dict[str, Any], seed: int, tol: float,
            max_iterations: int) -> dict[str, Any]:
    if driver == "geoopt":
        fit = mc.fit_geoopt(problem, metric="mix", optimizer="sgd", lr=0.5, tol=tol,
                            max_steps=20 * max_iterations, seed=seed, **kwargs)
        return {"converged": fit["converged"], "iterations": fit["steps"],
                "hessian_calls": 0, "seconds": fit["seconds"], "error": fit["error"]}
    fit = mc.fit_pymanopt(problem, tol=tol, seed=seed, **kwargs)
    return {key: fit[key] for key in ("converged", "iterations", "hessian_calls", "seconds",
                                      "error")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--m", type=int, default=200)
    parser.add_argument("--rank", type=int, default=5)
    parser.add_argument("--observed", type=float, default=0.25)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tol", type=float, default=1e-9,
                        help="held-out relative RMSE to reach")
    parser.add_argument("--max-iterations", type=int, default=200,
                        help="TrustRegions cap (20x for CG, SD and geoopt)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 gives the steadiest timings on a shared machine)")
    parser.add_argument("--json", default=str(ROOT / "results" / "bench_matrix_completion.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    mc = load_example()
    table = methods(args.max_iterations)

    # warm-up: first calls pay one-off import and dispatch costs; keep them out of the timings
    warm = mc.make_problem(40, 30, 2, 0.5, seed=99)
    for _, driver, kwargs in table:
        run_one(mc, warm, driver, kwargs, 0, 1e-2, 5)

    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        problem = mc.make_problem(args.n, args.m, args.rank, args.observed, seed=seed)
        for label, driver, kwargs in table:
            result = run_one(mc, problem, driver, kwargs, seed, args.tol, args.max_iterations)
            runs.append({"method": label, "seed": seed, **result})
            print(f"seed {seed}  {label:32s} iterations {result['iterations']:6d}  "
                  f"Hv {result['hessian_calls']:5d}  {result['seconds']:8.3f} s  "
                  f"error {result['error']:.1e}{'' if result['converged'] else '  NOT CONVERGED'}",
                  flush=True)

    def rows(label: str) -> list[dict[str, Any]]:
        return [r for r in runs if r["method"] == label]

    summary = {}
    for label, _, _ in table:
        chosen = rows(label)
        summary[label] = {
            "converged": f"{sum(r['converged'] for r in chosen)}/{len(chosen)}",
            "iterations": statistics.median(r["iterations"] for r in chosen),
            "hessian_calls": statistics.median(r["hessian_calls"] for r in chosen),
            "seconds": statistics.median(r["seconds"] for r in chosen)}
    ratios = {}
    for ours, theirs in RATIOS:
        per_seed = list(zip(rows(ours), rows(theirs), strict=True))

        def median_ratio(key: str, pairs: list = per_seed) -> float | None:
            values = [a[key] / b[key] for a, b in pairs if b[key]]
            return statistics.median(values) if values else None

        ratios[f"{ours} / {theirs}"] = {key: median_ratio(key) for key in
                                        ("iterations", "hessian_calls", "seconds")}

    print()
    print(f"{args.n} x {args.m}, rank {args.rank}, {args.observed:.0%} observed, tolerance "
          f"{args.tol:g} (held-out relative RMSE), seeds {args.seeds}, medians")
    print(f"{'method':34s} {'converged':>9s} {'iterations':>10s} {'Hv':>7s} {'seconds':>9s}")
    for label, row in summary.items():
        print(f"{label:34s} {row['converged']:>9s} {row['iterations']:>10g} "
              f"{row['hessian_calls']:>7g} {row['seconds']:>9.3f}")
    print()
    print(f"{'ratio (median over seeds)':62s} {'iterations':>10s} {'Hv':>7s} {'seconds':>9s}")
    for label, row in ratios.items():
        cells = [f"{row[k]:.2f}" if row[k] is not None else "-" for k in
                 ("iterations", "hessian_calls", "seconds")]
        print(f"{label:62s} {cells[0]:>10s} {cells[1]:>7s} {cells[2]:>9s}")

    report = {
        "benchmark": "matrix_completion",
        "command": "python benchmarks/matrix_completion.py " + " ".join(argv or sys.argv[1:]),
        "config": {"n": args.n, "m": args.m, "rank": args.rank, "observed": args.observed,
                   "seeds": args.seeds, "tol": args.tol, "max_iterations": args.max_iterations,
                   "threads": args.threads},
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "platform": platform.platform(), "time": time.strftime("%Y-%m-%d %H:%M:%S")},
        "summary": summary, "ratios": ratios, "runs": runs}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path}")
    return report


if __name__ == "__main__":
    main()
