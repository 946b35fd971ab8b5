"""Per-iteration cost of the ascent in one whole process, for comparing two trees (A/B).

The benchmark table (rows 7 and 8) interleaves every measure within one process, which is
the right figure for a target but cannot compare two versions of the package. This script
measures one version: it builds the row's model and batch, times one plain forward+backward
(the best of three), then whole ``quotientsharp.sharpness`` calls at ``n_iter = lo`` and
``hi`` per measure (process CPU time, one thread), and prints one JSON line with
``(t_hi - t_lo) / (hi - lo)`` over the forward+backward per measure, and the CPU seconds of the
whole call at ``lo`` (setup included). Run it alternately on
two trees, A B A B ..., and compare the pairs: pairing keeps the comparison meaningful when
the machine's speed drifts.

Run: ``PYTHONPATH=TREE python benchmarks/step_ab.py --model minilm`` (or ``bert-base``;
``--tiny`` for the smoke test), where ``TREE`` holds the version of ``quotientsharp`` to time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _cpu_seconds(function) -> float:
    start = time.process_time()
    function()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", choices=("minilm", "bert-base"))
    parser.add_argument("--tiny", action="store_true", help="a tiny BERT (smoke test)")
    parser.add_argument("--iters", type=int, nargs=2, default=(2, 10))
    parser.add_argument("--measures", nargs="+", default=None,
                        help="measures of benchmarks/launches.py's COUNTED (default: the "
                             "table's three)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import minilm
    from _common import benchmark_model, without_path_check
    from launches import COUNTED

    measures = minilm.MEASURES if args.measures is None else {
        name: COUNTED[name] for name in args.measures if name in COUNTED}
    if args.measures is not None and len(measures) != len(args.measures):
        parser.error(f"--measures: choose from {sorted(COUNTED)}")

    import quotientsharp as qs

    device = torch.device("cpu")
    model, batch = benchmark_model(args.model, device, args.tiny)
    minilm.forward_backward(model, batch)
    unit = min(_cpu_seconds(lambda: minilm.forward_backward(model, batch)) for _ in range(3))
    low, high = args.iters
    result: dict[str, object] = {"quotientsharp": str(Path(qs.__file__).parent),
                                 "model": "tiny" if args.tiny else args.model,
                                 "forward_backward_s": unit}
    for name, options in measures.items():
        def call(n_iter: int, options=options) -> None:
            with without_path_check():
                qs.sharpness(model, [batch], rho=0.05, n_iter=n_iter, progress=False,
                             reach=False, **options)

        spent = {n: _cpu_seconds(lambda n=n: call(n)) for n in (low, high)}
        result[name] = (spent[high] - spent[low]) / (high - low) / unit
        # the whole call at n_iter = lo, setup included (the measure's first call here)
        result[f"{name}: call at n_iter={low}, s"] = spent[low]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
