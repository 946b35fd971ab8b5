"""Peak resident memory of one sharpness call beyond a plain forward+backward, one process.

Peak RSS (``VmHWM`` of ``/proc/self/status``, Linux) only grows, so each measure runs in a
process of its own: the model and batch are built, one plain forward+backward runs (the
baseline peak), then one ``quotientsharp.sharpness`` call with ``n_iter`` steps; the figure is
the growth of the peak over the parameter bytes. Models: the real MiniLM (8 x 32 tokens,
``benchmarks/minilm.py``) or a BERT built from its config (``--hidden``, ``--layers``).

Run: ``python benchmarks/peak_rss.py --model minilm --measure "geodesic inv"``; ``--all``
runs every measure, each in a new process, and prints one JSON line per measure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

MEASURE_NAMES = ("adaptive", "geodesic mix", "geodesic inv")


def vm_hwm() -> int:
    """Peak resident set size of this process in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def one(model_name: str, measure: str, n_iter: int, hidden: int, layers: int) -> dict:
    import torch

    torch.set_num_threads(1)
    import minilm

    import quotientsharp as qs

    device = torch.device("cpu")
    if model_name == "minilm":
        model, tokenizer = minilm.load(device)
        batch = minilm.make_batch(tokenizer, 8, 32, device)
    else:
        from _common import bert_batch, bert_model

        model = bert_model(hidden, layers, max(hidden // 64, 1), 512, 30522, 2, torch.float32,
                           device)
        batch = bert_batch(8, 32, 30522, 2, device)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    minilm.forward_backward(model, batch)
    baseline = vm_hwm()
    qs.sharpness(model, [batch], rho=0.05, n_iter=n_iter, progress=False,
                 **minilm.MEASURES[measure])
    return {"model": model_name, "measure": measure, "n_iter": n_iter,
            "parameter_bytes": parameter_bytes, "forward_backward_peak_bytes": baseline,
            "beyond_forward_backward_over_parameter_bytes":
                (vm_hwm() - baseline) / parameter_bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", choices=("minilm", "bert"))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--measure", default="adaptive", choices=MEASURE_NAMES)
    parser.add_argument("--n-iter", type=int, default=5)
    parser.add_argument("--all", action="store_true", help="every measure, one process each")
    args = parser.parse_args(argv)
    if args.all:
        for measure in MEASURE_NAMES:
            subprocess.run([sys.executable, __file__, "--model", args.model, "--hidden",
                            str(args.hidden), "--layers", str(args.layers), "--measure",
                            measure, "--n-iter", str(args.n_iter)], check=True)
        return 0
    print(json.dumps(one(args.model, args.measure, args.n_iter, args.hidden, args.layers)),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
