"""Held-out evaluation of QuotientAdamW against AdamW on two new LoRA tasks on the real MiniLM.

Reuses benchmarks/optimisers.py (imported, not edited): lora_task (MiniLM, PEFT LoRA r=8 alpha 8
on query/value of layer 5, lower layers cached, fresh 2-class head), train (60 steps, batches of
32, seed-driven init and batch order), select (lr by mean validation loss over seeds).

Run: ``OMP_NUM_THREADS=1 python benchmarks/optimisers_heldout/run_heldout.py [--optimisers ...]
[--tasks ...]``, then ``python benchmarks/optimisers_heldout/report.py`` for the tables
(``report.md``). Tasks: ``negation`` and ``subject`` (the two first asked for), ``sameverb`` and
``polarity`` (added after the first two saturated: every optimiser near 100 % accuracy). Made on
2026-12-07 by an outside check (a helper that had not seen the optimiser's design), one thread
on a shared 2-core machine: the four runs took 190-230 s of wall time each
(``--tasks negation subject``, ``--optimisers RiemannianAdamW "LoRA+" --tasks negation subject``
and the same with ``--tasks sameverb polarity``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

torch.set_num_threads(1)

import optimisers as bench  # noqa: E402
from tasks import NEW_GENERATORS, SUBJECT_HALF  # noqa: E402

from quotientsharp.models.quotient_adamw import QuotientAdamW  # noqa: E402

bench.GENERATORS.update(NEW_GENERATORS)      # in-process only; nothing on disk is changed
STEPS, SEEDS, SIZES = 60, 3, (1024, 128, 256)
MAIN_GRID = (1e-3, 3e-3, 1e-2, 3e-2)
EXTRA_LR = 1e-1
_bench_methods = bench.optimisers()
METHODS = {
    "AdamW": bench._adamw,
    "QuotientAdamW": lambda m, lr: QuotientAdamW(m, lr),          # library defaults
    "RiemannianAdamW": _bench_methods["RiemannianAdamW"],
    "LoRA+": _bench_methods["LoRA+"],
}
GRIDS = {"AdamW": MAIN_GRID, "QuotientAdamW": MAIN_GRID,
         "RiemannianAdamW": bench.GRIDS["RiemannianAdamW"]["lora"],
         "LoRA+": bench.GRIDS["LoRA+"]["lora"]}


def timed(make, log):
    """The optimiser of ``make``, with wall time from zero_grad to the end of step recorded
    (the same interval that bench.train times in process CPU time)."""
    def wrapped(model, lr):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimizer = make(model, lr)
        log["construct_warnings"] = sorted({f"{w.category.__name__}: {w.message}"
                                            for w in caught})
        zero_grad, step = optimizer.zero_grad, optimizer.step
        log["wall"] = []

        def zg(*a, **k):
            log["_t0"] = time.perf_counter()
            return zero_grad(*a, **k)

        def st(*a, **k):
            with warnings.catch_warnings(record=True) as c:
                warnings.simplefilter("always")
                out = step(*a, **k)
            if c:
                log.setdefault("step_warnings", set()).update(
                    f"{w.category.__name__}: {w.message}" for w in c)
            log["wall"].append(time.perf_counter() - log["_t0"])
            return out

        optimizer.zero_grad, optimizer.step = zg, st
        return optimizer
    return wrapped


def param_fingerprint(model):
    return float(sum(p.detach().double().sum() * (i + 1) for i, p in enumerate(model.parameters())))


def run_grid(task, name, lrs, starts):
    runs = []
    for lr in lrs:
        for seed in range(SEEDS):
            log = {}
            run = bench.train(task, timed(METHODS[name], log), lr, seed, STEPS, None,
                              starts[seed])
            run["target_steps"] = STEPS
            run["wall_per_step"] = statistics.fmean(log["wall"]) if log["wall"] else None
            run["construct_warnings"] = log["construct_warnings"]
            run["step_warnings"] = sorted(log.get("step_warnings", ()))
            last = bench.at_step(run, STEPS)
            print(f"    {name:<15} lr {lr:<6g} seed {seed}: "
                  + ("DIVERGED" if last is None else
                     f"val {last['val_loss']:.4f} test {last['test_loss']:.4f} "
                     f"acc {last['test_acc']:.3f}")
                  + f"  cpu {1e3 * run['seconds_per_step']:.1f} ms/step wall "
                    f"{1e3 * run['wall_per_step']:.1f} ms/step", flush=True)
            runs.append(run)
    return runs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", nargs="+", default=list(NEW_GENERATORS))
    parser.add_argument("--optimisers", nargs="+", default=["AdamW", "QuotientAdamW"])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"steps": STEPS, "seeds": SEEDS, "sizes": SIZES,
               "subject_half": sorted(SUBJECT_HALF), "tasks": {}}
    began = time.time()
    for generator in args.tasks:
        task = bench.lora_task(generator, SIZES, False)
        print(f"[{task.name}] {task.description}", flush=True)
        # same initialisation per seed across calls
        fps = [[param_fingerprint(bench.build_quiet(task, s)) for s in range(SEEDS)]
               for _ in range(2)]
        assert fps[0] == fps[1], fps
        starts = {s: bench._checkpoint(bench.build_quiet(task, s), task, 0, 0.0)
                  for s in range(SEEDS)}
        entry = {"description": task.description, "starts": starts,
                 "label_balance": {k: float(getattr(task, k).labels.float().mean())
                                   for k in ("train", "validation", "test")},
                 "methods": {}}
        for name in args.optimisers:
            runs = run_grid(task, name, GRIDS[name], starts)
            entry["methods"][name] = {"grid": list(GRIDS[name]), "runs": runs}
        # extend the main grid by 1e-1 for both if either's best lr is at the top edge
        main = [n for n in ("AdamW", "QuotientAdamW") if n in entry["methods"]]
        chosen = {n: bench.select(entry["methods"][n]["runs"], "steps") for n in main}
        if any(c is not None and c["lr"] == MAIN_GRID[-1] for c in chosen.values()):
            print(f"  top edge reached ({ {n: c['lr'] for n, c in chosen.items()} }): "
                  f"adding lr {EXTRA_LR:g} for {main}", flush=True)
            for n in main:
                entry["methods"][n]["runs"] += run_grid(task, n, (EXTRA_LR,), starts)
                entry["methods"][n]["grid"].append(EXTRA_LR)
        for name, method in entry["methods"].items():
            method["by_steps"] = bench.select(method["runs"], "steps")
            method["cpu_per_step_median"] = statistics.median(
                r["seconds_per_step"] for r in method["runs"])
            method["wall_per_step_median"] = statistics.median(
                r["wall_per_step"] for r in method["runs"])
            c = method["by_steps"]
            print(f"  {name:<15} chosen lr {c['lr']:g}: test {c['test_loss']['mean']:.4f} ± "
                  f"{c['test_loss']['std']:.4f} acc {c['test_acc']['mean']:.3f}", flush=True)
        results["tasks"][task.name] = entry
    results["wall_seconds"] = time.time() - began
    tag = "_".join(o.replace("+", "plus") for o in args.optimisers)
    path = args.out / f"heldout_{tag}_{'_'.join(args.tasks)}.json"
    path.write_text(json.dumps(results, indent=1, default=list))
    print(f"wrote {path} ({results['wall_seconds']:.0f} s wall)")


if __name__ == "__main__":
    main()
