"""One ascent step on a device: per-iteration cost, kernel launches and peak memory.

For adaptive, geodesic mix and geodesic inv (order 2) on a BERT model built from its config,
per variant of the model's forward:

- ``eager``: the model as it is;
- ``compile``: the model wrapped in ``torch.compile`` (default mode), compile time reported
  as setup (the first call), the compiled code reused by every later call;
- ``compile-steps``: the model as it is, the solver's per-iteration geometry compiled
  (``sharpness(..., compile_steps=True)``), its compile reported as setup;
- ``cudagraphs``: ``torch.compile(mode="reduce-overhead")``, which replays CUDA graphs
  (CUDA only).

Figures, each from whole ``quotientsharp.sharpness`` calls with ``n_iter = lo`` and ``hi``
(setup cancels in the slope): the per-iteration time over one plain forward+backward (CUDA:
wall time after synchronisation; CPU: process CPU time), the kernel launches per iteration
(CUDA: the profiler's device kernels; CPU: the computing operators dispatched, the same count
a GPU would launch at least) against those of one forward+backward, and the peak memory of a
call beyond the forward+backward in parameter bytes. A variant that fails is recorded with
its error, not skipped silently.

Run: ``python benchmarks/gpu_step.py --device cuda --json results/gpu_step.json`` (called by
``benchmarks/gpu.sh``); ``--tiny`` shrinks the model for the CPU smoke test.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    bert_batch,
    bert_model,
    device_synchronize,
    operator_names,
    peak_memory,
    tensor_bytes,
    time_interleaved,
    without_path_check,
)
from minilm import MEASURES, forward_backward  # noqa: E402

VARIANTS = ("eager", "compile", "compile-steps", "cudagraphs")


def _model(variant: str, model: torch.nn.Module) -> torch.nn.Module:
    if variant in ("eager", "compile-steps"):
        return model
    if variant == "compile":
        return torch.compile(model)  # type: ignore[return-value]
    return torch.compile(model, mode="reduce-overhead")  # type: ignore[return-value]


def launches(function, device: torch.device) -> collections.Counter[str]:
    """Kernel launches of ``function()`` by name: device kernels (and copies, fills) on CUDA,
    computing operators on CPU. ``sum(...values())`` is the count."""
    if device.type != "cuda":
        return operator_names(function)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        function()
        device_synchronize(device)
    return collections.Counter(event.name for event in prof.events()
                               if event.device_type == torch.autograd.DeviceType.CUDA)


def _per_iteration_beyond(counts: list[collections.Counter[str]], plain: collections.Counter[str],
                          span: int, top: int = 20) -> list[tuple[str, float]]:
    """The launches per iteration beyond one forward+backward, by name: the ``top`` largest
    differences (a negative count: fewer than the forward+backward, e.g. no gradient
    accumulation into ``.grad``)."""
    names = set(counts[0]) | set(counts[1]) | set(plain)
    extra = {n: (counts[1][n] - counts[0][n]) / span - plain[n] for n in names}
    ranked = sorted(extra.items(), key=lambda item: -abs(item[1]))
    return [(n[:160], round(v, 2)) for n, v in ranked[:top] if v != 0]


def measure_variant(variant: str, model, batch, device: torch.device, iters: tuple[int, int],
                    repeats: int) -> dict[str, Any]:
    import quotientsharp as qs

    wrapped = _model(variant, model)
    low, high = iters
    plain = functools.partial(forward_backward, model, batch)

    def run(n_iter: int, options: dict[str, Any]) -> None:
        with without_path_check():
            qs.sharpness(wrapped, [batch], rho=0.05, n_iter=n_iter, progress=False,
                         reach=False, compile_steps=variant == "compile-steps", **options)

    result: dict[str, Any] = {"setup_s": {}}
    for name, options in MEASURES.items():
        device_synchronize(device)
        start = time.perf_counter()
        run(max(low, 2), options)   # the first call: compilation, counted as setup
        device_synchronize(device)
        result["setup_s"][name] = time.perf_counter() - start
    functions = {"forward+backward": plain}
    for name, options in MEASURES.items():
        for n_iter in iters:
            functions[f"{name} {n_iter}"] = functools.partial(run, n_iter, options)
    timings = time_interleaved(functions, repeats, device)
    unit = timings["forward+backward"].median
    plain_kernels = launches(plain, device)
    plain_launches = sum(plain_kernels.values())
    parameter_bytes = tensor_bytes(p for p in model.parameters())
    baseline = peak_memory(plain, device)
    result.update({"forward_backward_s": unit, "forward_backward_launches": plain_launches,
                   "per_iteration_over_forward_backward": {}, "launches_per_iteration": {},
                   "launches_per_iteration_beyond_forward_backward_by_name": {},
                   "memory_beyond_forward_backward_over_parameter_bytes": {}})
    for name, options in MEASURES.items():
        slope = ((timings[f"{name} {high}"].median - timings[f"{name} {low}"].median)
                 / (high - low))
        result["per_iteration_over_forward_backward"][name] = slope / unit
        counts = [launches(functools.partial(run, n, options), device) for n in iters]
        result["launches_per_iteration"][name] = (
            (sum(counts[1].values()) - sum(counts[0].values())) / (high - low))
        result["launches_per_iteration_beyond_forward_backward_by_name"][name] = (
            _per_iteration_beyond(counts, plain_kernels, high - low))
        peak = peak_memory(functools.partial(run, low, options), device)
        result["memory_beyond_forward_backward_over_parameter_bytes"][name] = (
            (peak - baseline) / parameter_bytes)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--tiny", action="store_true", help="a tiny model (CPU smoke test)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--iters", type=int, nargs=2, default=(2, 6))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    # BERT-base's shape (benchmarks/bert_base.py) at 8 x 32 tokens, or a tiny one
    hidden, layers, heads, vocab = (32, 1, 2, 100) if args.tiny else (768, 12, 12, 30522)
    sentences, tokens = (2, 8) if args.tiny else (8, 32)
    model = bert_model(hidden, layers, heads, 512, vocab, 2, torch.float32, device)
    batch = bert_batch(sentences, tokens, vocab, 2, device)
    report: dict[str, Any] = {"device": str(device), "torch": torch.__version__,
                              "model": {"hidden": hidden, "layers": layers, "heads": heads,
                                        "vocab": vocab, "batch": [sentences, tokens]},
                              "iters": list(args.iters), "variants": {}}
    for variant in args.variants:
        if variant == "cudagraphs" and device.type != "cuda":
            report["variants"][variant] = {"skipped": "CUDA graphs need a CUDA device"}
        else:
            try:
                report["variants"][variant] = measure_variant(variant, model, batch, device,
                                                              tuple(args.iters), args.repeats)
            except Exception as err:  # a variant that fails is a result, with its error
                report["variants"][variant] = {"error": f"{type(err).__name__}: {err}"[:2000]}
        print(variant, json.dumps(report["variants"][variant], default=str)[:600], flush=True)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
