"""Does ``torch.compile`` (CPU backend) pay for the adaptive block's direction?

The direction of the parameters outside any symmetry (raise ``e c^2``, the norm of the raised
gradient in the metric ``diag(1 / c^2)``, the division) over BERT-base's tensors outside the
embeddings (72 of 768 x 768 and 24 of 768 x 3072: 71M parameters), eager (the package's
fused form) against the same formula compiled with ``torch.compile``. Reports the compile's
process CPU time (setup), eager and compiled CPU time per call (interleaved, median of
``--repeats``), and the largest relative difference of the results.

Run: ``python benchmarks/compile_probe.py [--repeats 5] [--small]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def eager(x, e, inverse):
    # the package's form (AdaptivePoint.raise_index, squared_norm; GeodesicBall.direction)
    raised = torch._foreach_mul(x, x)
    torch._foreach_mul_(raised, e)
    norm = torch.stack(torch._foreach_norm(torch._foreach_mul(raised, inverse))).square().sum()
    torch._foreach_div_(raised, norm.sqrt())
    return raised


def formula(x, e, inverse):
    raised = [a * a * b for a, b in zip(x, e, strict=True)]
    norm = torch.stack([(r * i).square().sum() for r, i in zip(raised, inverse, strict=True)])
    root = norm.sum().sqrt()
    return [r / root for r in raised]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="4 tensors of 64 x 64 (smoke)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    shapes = [(64, 64)] * 4 if args.small else [(768, 768)] * 72 + [(768, 3072)] * 24
    x = [torch.randn(s, generator=generator) for s in shapes]
    e = [torch.randn(s, generator=generator) for s in shapes]
    # 1 / |w|, 0 where w = 0 (a float32 normal draw of 99M values has exact zeros)
    inverse = [torch.where(t == 0, torch.zeros_like(t), 1 / t.abs()) for t in x]
    compiled = torch.compile(formula)
    start = time.process_time()
    result = compiled(x, e, inverse)
    compile_s = time.process_time() - start
    reference = eager(x, e, inverse)
    difference = max(float((a - b).abs().max() / b.abs().max())
                     for a, b in zip(result, reference, strict=True))
    samples: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.repeats):
        for name, function in (("eager", eager), ("compiled", compiled)):
            start = time.process_time()
            function(x, e, inverse)
            samples[name].append(time.process_time() - start)
    print(json.dumps({"tensors": len(shapes), "parameters": sum(t.numel() for t in x),
                      "compile_cpu_s": compile_s,
                      "eager_s": statistics.median(samples["eager"]),
                      "compiled_s": statistics.median(samples["compiled"]),
                      "compiled_over_eager": statistics.median(samples["compiled"])
                      / statistics.median(samples["eager"]),
                      "max_relative_difference": difference, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
