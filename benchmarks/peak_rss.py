"""Peak resident memory of one sharpness call beyond a plain forward+backward, one process.

Peak RSS (``VmHWM`` of ``/proc/self/status``, Linux) only grows, so each measure runs in a
process of its own: the model and batch are built, one plain forward+backward runs (the
baseline peak), then one ``quotientsharp.sharpness`` call with ``n_iter`` steps; the figure is
the growth of the peak over the parameter bytes. Models: the real MiniLM (8 x 32 tokens,
``benchmarks/minilm.py``) or a BERT built from its config (``--hidden``, ``--layers``).

Run: ``python benchmarks/peak_rss.py --model minilm --measure "geodesic inv"``; ``--all``
runs every measure, each in a new process, and prints one JSON line per measure.

``--end-to-end`` measures the command line instead (issue 26's 11M-parameter BERT: hidden
256, 4 layers): the BERT is saved with ``save_pretrained`` and 32 pre-tokenised rows of 32
tokens go to a JSON-lines file, then ``quotientsharp measure MODEL DATA --batch-size 8``
runs once per measure, each in a new process, and its peak resident memory (``ru_maxrss`` of
that child) is compared with that of a baseline process that imports the same libraries,
loads the same directory and file and runs one plain forward+backward per batch. Reported:
the command's peak beyond the baseline's over the parameter bytes, and both raw peaks (the
Python and torch runtime alone is several hundred MB, many times an 11M-parameter model).
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
    qs.sharpness(model, [batch], rho=0.05, n_iter=n_iter, progress=False, reach=False,
                 **minilm.MEASURES[measure])
    return {"model": model_name, "measure": measure, "n_iter": n_iter,
            "parameter_bytes": parameter_bytes, "forward_backward_peak_bytes": baseline,
            "beyond_forward_backward_over_parameter_bytes":
                (vm_hwm() - baseline) / parameter_bytes}


#: the baseline of an end-to-end run: the command's own loading, then forward+backward per batch
_BASELINE = """
import json, sys
import torch
import quotientsharp.cli, quotientsharp.workflows  # the command's imports
from transformers import AutoModelForSequenceClassification
torch.set_num_threads(1)
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1],
                                                           attn_implementation="eager")
rows = [json.loads(line) for line in open(sys.argv[2])]
for start in range(0, len(rows), 8):
    chunk = rows[start:start + 8]
    ids = torch.tensor([r["input_ids"] for r in chunk])
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                labels=torch.tensor([r["label"] for r in chunk]))
    out.loss.backward()
    model.zero_grad(set_to_none=True)
"""


def _child_peak(command: list[str]) -> int:
    """Peak resident memory in bytes of one child process (Linux ``ru_maxrss`` is in KiB)."""
    import os

    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=dict(
        os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"))
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{command[:4]}... exited with status "
                           f"{os.waitstatus_to_exitcode(status)}")
    return usage.ru_maxrss * 1024


def end_to_end(hidden: int, layers: int, n_iter: int) -> list[dict]:
    """Peak memory of ``quotientsharp measure`` per measure, beyond loading + forward+backward."""
    import tempfile

    import torch
    from _common import bert_batch, bert_model

    from quotientsharp.cli import main as _  # noqa: F401  (fail here, not in a child)

    rows, tokens, vocab = 32, 32, 30522
    with tempfile.TemporaryDirectory() as folder:
        model_dir, data = Path(folder) / "bert", Path(folder) / "data.jsonl"
        model = bert_model(hidden, layers, max(hidden // 64, 1), 512, vocab, 2, torch.float32,
                           torch.device("cpu"))
        model.save_pretrained(model_dir)
        parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        batch = bert_batch(rows, tokens, vocab, 2, torch.device("cpu"))
        data.write_text("".join(json.dumps({"input_ids": ids, "label": label}) + "\n"
                                for ids, label in zip(batch["input_ids"].tolist(),
                                                      batch["labels"].tolist(), strict=True)))
        baseline = _child_peak([sys.executable, "-c", _BASELINE, str(model_dir), str(data)])
        results = []
        for name in MEASURE_NAMES:
            options = ["--measure", "adaptive"] if name == "adaptive" else [
                "--measure", "geodesic", "--metric", name.split()[1], "--order", "2"]
            peak = _child_peak([sys.executable, "-m", "quotientsharp", "measure",
                                str(model_dir), str(data), *options, "--rho", "0.05",
                                "--n-iter", str(n_iter), "--batch-size", "8", "--no-progress"])
            results.append({"model": f"bert hidden {hidden}, {layers} layers (end to end)",
                            "measure": name, "n_iter": n_iter,
                            "parameter_bytes": parameter_bytes,
                            "baseline_peak_bytes": baseline, "command_peak_bytes": peak,
                            "beyond_baseline_over_parameter_bytes":
                                (peak - baseline) / parameter_bytes,
                            "command_peak_over_parameter_bytes": peak / parameter_bytes})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", choices=("minilm", "bert"))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--measure", default="adaptive", choices=MEASURE_NAMES)
    parser.add_argument("--n-iter", type=int, default=5)
    parser.add_argument("--all", action="store_true", help="every measure, one process each")
    parser.add_argument("--end-to-end", action="store_true",
                        help="the `quotientsharp measure` command on a saved BERT, per measure")
    args = parser.parse_args(argv)
    if args.end_to_end:
        for result in end_to_end(args.hidden, args.layers, args.n_iter):
            print(json.dumps(result), flush=True)
        return 0
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
