"""``quotientsharp verify``: run every geometry check on every built-in quotient."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quotientsharp.core.quotient import SymmetryQuotient


def builtin_quotients() -> list[SymmetryQuotient]:
    """One instance of every built-in quotient and metric (the engine's factors)."""
    from quotientsharp.core.adaptive import AdaptiveQuotient
    from quotientsharp.core.diagonal import DiagonalQuotient
    from quotientsharp.core.gl import GLQuotient, RotaryQuotient
    from quotientsharp.core.product import ProductQuotient

    quotients: list[SymmetryQuotient] = [DiagonalQuotient(metric, d=4)
                                         for metric in ("inv", "mix", "euclidean")]
    quotients += [GLQuotient(metric) for metric in ("inv", "mix", "euclidean")]
    quotients += [GLQuotient(metric, eps=0.1) for metric in ("inv", "mix")]
    quotients += [RotaryQuotient(metric, head_dim=4) for metric in ("inv", "mix")]
    quotients += [RotaryQuotient("mix", head_dim=6, rotary_dims=4, layout="interleaved")]
    quotients += [AdaptiveQuotient(metric, shapes=[(3, 4), (5,)])
                  for metric in ("adaptive", "euclidean")]
    # products, as the sharpness engine runs them: heads folded into the point
    network = ProductQuotient([GLQuotient("inv"), DiagonalQuotient("inv"),
                               AdaptiveQuotient(shapes=[(3, 2), (4,)])], folded=[1, 0, 0],
                              names=["gl", "diagonal", "other"])
    network.point_shapes = ((2, 5, 3), (2, 4, 3), (6,), (6,), (3, 2), (4,))
    quotients += [network, ProductQuotient([RotaryQuotient("mix", head_dim=4),
                                            DiagonalQuotient("mix", d=3)])]
    return quotients


def title_of(quotient: SymmetryQuotient) -> str:
    """The quotient's name and settings, e.g. ``gl-inv (metric='inv', eps=0.1)``."""
    settings = quotient.extra_repr()
    return f"{quotient.name} ({settings})" if settings else quotient.name


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("verify", help="check every built-in quotient's closed forms "
                              "against autograd references, Taylor slopes and invariances")
    p.add_argument("--seeds", type=int, default=2, help="number of random seeds (default 2)")
    p.add_argument("--dtype", choices=["float64", "float32", "both"], default="both",
                   help="dtype of the random points (default both)")
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON")


def run(args: argparse.Namespace) -> int:
    import torch

    from quotientsharp.core.checks import check_all, format_results

    dtypes = {"float64": [torch.float64], "float32": [torch.float32],
              "both": [torch.float64, torch.float32]}[args.dtype]
    failures, rows = 0, []
    for quotient in builtin_quotients():
        for dtype in dtypes:
            for seed in range(args.seeds):
                results = check_all(quotient, seed=seed, dtype=dtype)
                title = (f"{title_of(quotient)}  dtype={str(dtype).removeprefix('torch.')}  "
                         f"seed={seed}")
                print(format_results(results, title))
                failures += sum(not r.passed for r in results)
                rows += [dict(quotient=quotient.name, dtype=str(dtype), seed=seed,
                              name=r.name, error=r.error, tolerance=r.tolerance,
                              passed=r.passed) for r in results]
    total = len(rows)
    print(f"\n{total - failures} passed, {failures} failed")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failures else 0
