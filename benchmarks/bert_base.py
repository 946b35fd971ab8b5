"""Row 8 of the benchmark table: a BERT-base-sized model built from its config.

``BertForSequenceClassification`` with BERT-base's shape (hidden 768, 12 layers, 12 heads of
64, intermediate 3072, vocabulary 30522: 109M parameters), randomly initialised from a seeded
config (nothing is downloaded), eager attention, float32, a batch of ``sentences`` x ``tokens``
random tokens. The figures are those of row 7 (:func:`minilm.measure`): one ascent iteration
over one plain forward+backward for adaptive, geodesic mix and geodesic inv (order 2), the
setup of one call, in one process, interleaved, process CPU time with one thread.

``--profile DIR`` also writes torch.profiler tables (operators by self CPU time) of one plain
forward+backward and of whole ``quotientsharp.sharpness`` calls at ``n_iter = 1`` and
``1 + k`` per measure, so that the per-iteration cost of each operator is the difference of
the two tables over ``k``.

Run alone: ``python benchmarks/bert_base.py [--sentences 8 --tokens 32] [--profile DIR]``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: BERT-base's shape (Devlin et al. 2019)
BASE = {"hidden": 768, "layers": 12, "heads": 12, "vocab": 30522, "labels": 2}
#: the issue's targets: per iteration / forward+backward
TARGETS = {"adaptive": 1.10, "geodesic mix": 1.20, "geodesic inv": 1.20}


def load(device: torch.device, tokens: int, shape: dict[str, int] | None = None):
    """The randomly initialised BERT-base-sized classifier (``shape`` overrides ``BASE``)."""
    from _common import bert_model

    s = {**BASE, **(shape or {})}
    return bert_model(s["hidden"], s["layers"], s["heads"], max(tokens, 512), s["vocab"],
                      s["labels"], torch.float32, device)


def make_batch(sentences: int, tokens: int, device: torch.device,
               shape: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    from _common import bert_batch

    s = {**BASE, **(shape or {})}
    return bert_batch(sentences, tokens, s["vocab"], s["labels"], device)


def profile_tables(model, batch, out: Path, steps: int = 4, rows: int = 40) -> list[Path]:
    """torch.profiler tables (module docstring), one text file per measure; their paths."""
    from minilm import MEASURES, forward_backward
    from torch.profiler import ProfilerActivity, profile

    import quotientsharp as qs

    out.mkdir(parents=True, exist_ok=True)
    written = []

    def table(function, title: str) -> str:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.process_time()
            function()
            seconds = time.process_time() - start
        return (f"=== {title}: process CPU {seconds:.2f} s (under the profiler) ===\n"
                + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))

    plain = functools.partial(forward_backward, model, batch)
    plain()
    path = out / "forward_backward.txt"
    path.write_text(table(lambda: [plain() for _ in range(steps)],
                          f"plain forward+backward x {steps}") + "\n")
    written.append(path)
    for name, options in MEASURES.items():
        def run(n_iter: int, options: dict[str, Any] = options) -> None:
            qs.sharpness(model, [batch], rho=0.05, n_iter=n_iter, progress=False, reach=False,
                         **options)

        run(1)
        text = [table(lambda: run(1), f"{name}, n_iter=1"),
                table(lambda: run(1 + steps), f"{name}, n_iter={1 + steps}")]
        path = out / f"{name.replace(' ', '_')}.txt"
        path.write_text("\n".join(text) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, nargs=2, default=(1, 4))
    parser.add_argument("--profile", type=Path, default=None,
                        help="write profiler tables into this folder instead of timing")
    args = parser.parse_args(argv)
    import minilm

    torch.set_num_threads(1)
    device = torch.device("cpu")
    model = load(device, args.tokens)
    batch = make_batch(args.sentences, args.tokens, device)
    if args.profile is not None:
        for path in profile_tables(model, batch, args.profile):
            print("wrote", path)
        return 0
    figures = minilm.measure(model, batch, device, args.repeats, tuple(args.iters),
                             memory=False)
    for key in ("per_iteration_over_forward_backward", "setup_over_forward_backward"):
        print(key, {k: round(v, 3) for k, v in figures[key].items()})
    print("forward_backward_s", round(figures["forward_backward_s"], 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
