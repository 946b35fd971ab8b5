"""Kernel launches per ascent iteration on the CUDA path, counted on the CPU, by operator.

On a GPU a small step is launch-bound: each operator the step dispatches is at least one kernel
launch, whatever the size of its tensors. The GPU run of ``benchmarks/gpu.sh`` (H200, BERT-base's
shape) measured about 800 launches per iteration beyond the forward+backward, alike for every
measure, without saying which. This script says which, on any machine: it runs the path a CUDA
run takes (the decisions on the device, the solver's ``host_decisions=False``; the adaptive
norm's fused form, which every device but the CPU uses) and counts the computing operators of whole
``quotientsharp.sharpness`` calls at ``n_iter = lo`` and ``hi``. The difference over
``hi - lo`` is the count per iteration, setup cancelled.

The count depends on the model's structure (its number of parameter tensors, heads and layers),
not on its width, so the default is BERT-base's structure (12 layers, 12 heads, 201 parameter
tensors) at a small width. A Python loop over the parameter tensors shows as operators per
tensor: ``per parameter tensor`` is the count beyond the forward+backward over their number.

Run: ``python benchmarks/launches.py [--hidden 48 --layers 12 --heads 12] [--json FILE]``
(``--tiny``: one layer, the smoke test). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import bert_batch, bert_model, operator_names  # noqa: E402
from minilm import MEASURES, forward_backward  # noqa: E402

#: the table's three measures, and the L-infinity box (worst-case and adaptive sharpness with
#: ``p="inf"``), whose geometry is another class
COUNTED = {**MEASURES, "worst-case linf": {"measure": "worst_case", "p": "inf"}}


def cuda_path_counts(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                     options: dict[str, Any], iters: tuple[int, int]
                     ) -> dict[str, float]:
    """Operators per iteration of one measure on the CUDA path, by name."""
    from unittest import mock

    import quotientsharp as qs
    from quotientsharp.engine import measures

    solve = measures.ascend

    def on_device(*args: Any, **kwargs: Any) -> Any:
        # the solver's decisions on the device, as on CUDA (on the CPU it reads them on the host)
        return solve(*args, **{**kwargs, "host_decisions": False})

    def run(n_iter: int) -> None:
        with mock.patch.object(measures, "ascend", on_device):
            qs.sharpness(model, [batch], rho=0.05, n_iter=n_iter, progress=False, reach=False,
                         **options)

    run(iters[0])               # caches, first-call work
    low, high = (operator_names(functools.partial(run, n)) for n in iters)
    span = iters[1] - iters[0]
    return {name: (high[name] - low[name]) / span for name in set(low) | set(high)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=48)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--iters", type=int, nargs=2, default=(2, 6))
    parser.add_argument("--top", type=int, default=8, help="operators listed per measure")
    parser.add_argument("--tiny", action="store_true", help="one layer (the smoke test)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.tiny:
        args.hidden, args.layers, args.heads, args.sentences, args.tokens = 8, 1, 2, 2, 8
    if args.iters[1] <= args.iters[0]:
        parser.error(f"--iters: the second count must exceed the first, got {args.iters}")
    torch.set_num_threads(1)
    # the adaptive norm's form on a GPU: fused over the tuple (on the CPU it goes tensor by
    # tensor through a cached buffer, see quotientsharp.core.adaptive)
    from quotientsharp.core.adaptive import AdaptivePoint

    AdaptivePoint.scratch_norm_devices = frozenset()
    vocab = 500
    model = bert_model(args.hidden, args.layers, args.heads, max(args.tokens, 64), vocab, 2,
                       torch.float32, torch.device("cpu"))
    batch = bert_batch(args.sentences, args.tokens, vocab, 2, torch.device("cpu"))
    plain = operator_names(functools.partial(forward_backward, model, batch))
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    report: dict[str, Any] = {
        "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                  "parameter tensors": tensors, "batch": [args.sentences, args.tokens]},
        "iters": list(args.iters), "torch": torch.__version__,
        "forward+backward": sum(plain.values()), "measures": {}}
    for name, options in COUNTED.items():
        per_iteration = cuda_path_counts(model, batch, options, tuple(args.iters))
        total = sum(per_iteration.values())
        beyond = {op: count - plain[op] for op, count in per_iteration.items()}
        ranked = sorted(beyond.items(), key=lambda item: -abs(item[1]))
        report["measures"][name] = {
            "per iteration": total,
            "beyond forward+backward": total - sum(plain.values()),
            "per parameter tensor": round((total - sum(plain.values())) / tensors, 2),
            "largest beyond forward+backward": {op: round(count, 2)
                                                for op, count in ranked[:args.top] if count},
        }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
