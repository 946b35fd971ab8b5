"""Does ``compile_steps=True`` pay on the real MiniLM? Eager against compiled, in one process.

``quotientsharp.sharpness(..., compile_steps=True)`` runs the solver's per-iteration geometry
(the direction from the gradient, the gradient and momentum steps, both rescales) as
``torch.compile`` graphs (:class:`quotientsharp.engine.solver.CompiledSteps`). This script
reports, for adaptive and geodesic mix and inv (order 2), on the real MiniLM:

- the cost of one iteration over one plain forward+backward, eager and compiled, timed
  interleaved in the same rounds (process CPU time, one thread; the slope between whole calls
  at ``n_iter = 2`` and ``10``, so the setup cancels), and their paired difference;
- the compile: the wall and process CPU time of the first compiled call beyond the first eager
  call (both graphs, the momentum step's included), and of the first call on a batch that
  touches another number of embedding rows (dynamo compiles once more, with that size
  dynamic), and on a third such batch (reused: no compile);
- the largest relative difference between the eager and compiled values.

The compile goes through torch's on-disk cache: ``--cold`` points it at a fresh folder (the
first compile a user pays), without it the compile may be read from an earlier run's cache.

``--dynamic`` compiles with symbolic sizes from the start (``CompiledSteps(dynamic=True)``):
one longer compile, none for a new number of rows.

Run: ``python benchmarks/compiled_steps.py [--sentences 8 --tokens 32] [--repeats 5]
[--cold] [--dynamic] [--measures adaptive ...] [--tiny]`` (``--tiny``: a tiny BERT, the smoke
test). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _timed(function: Any) -> tuple[float, float, Any]:
    """Wall and process CPU seconds of one call, and its result."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, nargs=2, default=(2, 10))
    parser.add_argument("--cold", action="store_true",
                        help="compile into a fresh on-disk cache (the first compile a user pays)")
    parser.add_argument("--tiny", action="store_true", help="a tiny BERT (smoke test)")
    parser.add_argument("--dynamic", action="store_true",
                        help="compile with symbolic sizes from the start (CompiledSteps("
                        "dynamic=True)) instead of the package's default")
    parser.add_argument("--measures", nargs="+", default=None, metavar="NAME",
                        help="some of the measures only (default: adaptive, geodesic mix, "
                        "geodesic inv)")
    args = parser.parse_args(argv)
    if args.cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="qs-inductor-")
    torch.set_num_threads(1)
    import minilm
    from _common import benchmark_model, time_interleaved, without_path_check

    import quotientsharp as qs
    from quotientsharp.engine.solver import CompiledSteps

    if args.dynamic:
        # the object the engine passes (CompiledSteps.shared), built with symbolic sizes
        CompiledSteps._shared = CompiledSteps(dynamic=True)

    measures = {name: options for name, options in minilm.MEASURES.items()
                if args.measures is None or name in args.measures}
    if not measures:
        parser.error(f"--measures: choose among {sorted(minilm.MEASURES)}")
    device = torch.device("cpu")
    model, batch = benchmark_model("minilm", device, args.tiny, args.sentences, args.tokens)
    # two more batches of the same shape that look up one and two rows fewer: a token the
    # batch holds once, then two such, replaced by a token that the batch holds several times
    ids = batch["input_ids"].flatten()
    counts = torch.bincount(ids)
    once = [k for k in range(ids.numel()) if counts[ids[k]] == 1][:2]
    common = int(counts.argmax())
    if len(once) < 2:
        parser.error("the batch holds fewer than two tokens once: no batches with fewer rows")
    others = []
    for positions in (once[:1], once):
        flat = ids.clone()
        flat[positions] = common
        others.append({**batch, "input_ids": flat.view_as(batch["input_ids"])})
    low, high = args.iters

    def run(n_iter: int, compiled: bool, options: dict[str, Any], data: Any = batch) -> float:
        with without_path_check():
            return qs.sharpness(model, [data], rho=0.05, n_iter=n_iter, progress=False,
                                reach=False, compile_steps=compiled, **options).value

    result: dict[str, Any] = {"sentences": args.sentences, "tokens": args.tokens,
                              "tiny": args.tiny, "cold_cache": args.cold,
                              "dynamic": args.dynamic,
                              "rows": [int(b["input_ids"].unique().numel())
                                       for b in (batch, *others)],
                              "torch": torch.__version__}
    compile_seconds: dict[str, Any] = {}
    difference: dict[str, float] = {}
    for name, options in measures.items():
        eager_wall, eager_cpu, eager_value = _timed(lambda o=options: run(high, False, o))
        wall, cpu, value = _timed(lambda o=options: run(high, True, o))
        difference[name] = abs(value - eager_value) / max(abs(eager_value), 1e-30)
        entry = {"first_call_wall_s": wall - eager_wall, "first_call_cpu_s": cpu - eager_cpu}
        for label, data in (("new_rows_wall_s", others[0]), ("third_rows_wall_s", others[1])):
            eager_wall, _, _ = _timed(lambda o=options, d=data: run(high, False, o, d))
            wall, _, _ = _timed(lambda o=options, d=data: run(high, True, o, d))
            entry[label] = wall - eager_wall
        compile_seconds[name] = entry
    functions = {"forward+backward": functools.partial(minilm.forward_backward, model, batch)}
    for name, options in measures.items():
        for compiled in (False, True):
            for n_iter in (low, high):
                functions[f"{name} compiled={compiled} n_iter={n_iter}"] = functools.partial(
                    run, n_iter, compiled, options)
    timings = time_interleaved(functions, args.repeats, device)
    unit = timings["forward+backward"].samples
    ratios: dict[str, dict[str, float]] = {}
    for name in measures:
        slopes = {}
        for compiled in (False, True):
            hi = timings[f"{name} compiled={compiled} n_iter={high}"].samples
            lo = timings[f"{name} compiled={compiled} n_iter={low}"].samples
            slopes[compiled] = [(h - lo_) / (high - low) for h, lo_ in zip(hi, lo, strict=True)]
        ratios[name] = {
            "eager": statistics.median(s / u for s, u in zip(slopes[False], unit, strict=True)),
            "compiled": statistics.median(s / u for s, u in zip(slopes[True], unit,
                                                               strict=True)),
            # paired within each round, ms per iteration
            "compiled_minus_eager_ms": 1000 * statistics.median(
                c - e for c, e in zip(slopes[True], slopes[False], strict=True))}
    result.update({"per_iteration_over_forward_backward": ratios,
                   "forward_backward_ms": 1000 * statistics.median(unit),
                   "compile_s": compile_seconds,
                   "max_relative_value_difference": difference})
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
