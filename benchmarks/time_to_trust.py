"""Row 10 of the benchmark table: the time from the call to a value that says it is trustworthy.

Per iteration a geodesic step costs about a forward+backward (rows 7 and 8), but a value is
only trustworthy once the reach search has confirmed it (a reach estimate of at least 0.99:
two chains agree and the best one has stopped climbing, ``docs/sharpness.md``, "Reach"), which
can take several chains. The figure users feel is therefore the whole call, from ``sharpness()``
to a value whose ``reach`` is at least 0.99. Per model, measure and radius:

- ``floor``: one plain functional forward+backward of the batch (median of a few);
- the default call (the reach search): its time, its forward+backward passes and its reach
  estimate;
- where the default's estimate is below 0.99, the escalation a user would run next
  (``reach={"chains": 8, "continuations": 4}``): its time is added, and a value that is still
  not confirmed is reported as such (no time to trust);
- the figure: the time to a confirmed value over ``passes x floor`` (the passes of every call
  made), against the per-iteration targets of row 7 plus a setup of 3 forward+backwards per
  call (``target + 3 calls / passes``): a search that costs no more than the iterations it needs.

Models: the real pretrained MiniLM with a 2-class head, fine-tuned 20 steps on a generated task
(large, well-conditioned attention factors), and a 4-layer BERT trained from a small
initialisation (attention products of small norm), both from ``solver_reach.build``; 8 texts of
16 tokens. ``--quick``: a tiny random BERT instead. Clock: process CPU time on one thread (wall
time in the JSON).

Run alone: ``python benchmarks/time_to_trust.py [--quick] [--json OUT.json]``, or
``python benchmarks/run.py --rows 10``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import warnings
from typing import Any

import torch
from minilm import MEASURES, SETUP_TARGET, forward_backward
from minilm import TARGETS as ITERATION_TARGETS

#: the reach a value must report to count as trustworthy
TRUSTED = 0.99
#: what a user runs when the default does not confirm its value
ESCALATION: dict[str, Any] = {"reach": {"chains": 8, "continuations": 4}}
RHOS = (0.1, 0.3)


def _clocked(function: Any) -> tuple[Any, float, float]:
    """``function()`` with its process CPU seconds and wall seconds."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = function()
    return result, time.process_time() - cpu, time.perf_counter() - wall


def floor_seconds(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                  repeats: int) -> dict[str, float]:
    """Median CPU and wall seconds of one forward+backward (after one warm-up)."""
    forward_backward(model, batch)
    samples = [_clocked(functools.partial(forward_backward, model, batch))[1:]
               for _ in range(repeats)]
    return {"cpu": statistics.median(s[0] for s in samples),
            "wall": statistics.median(s[1] for s in samples)}


def _call(model: torch.nn.Module, batch: dict[str, torch.Tensor], rho: float,
          options: dict[str, Any]) -> dict[str, Any]:
    import quotientsharp as qs

    with warnings.catch_warnings():
        # the reach is read off the result: the warning is what this row measures
        warnings.simplefilter("ignore", qs.ReachWarning)
        result, cpu, wall = _clocked(lambda: qs.sharpness(model, [batch], rho=rho,
                                                          progress=False, **options))
    return {"value": result.value, "reach": result.reach[0], "local": result.locality[0]["local"],
            "passes": result.evaluations[0], "cpu": cpu, "wall": wall}


def time_to_trust(model: torch.nn.Module, batch: dict[str, torch.Tensor], measure: str,
                  rho: float, floor: dict[str, float]) -> dict[str, Any]:
    """The default call, the escalation where needed, and the figure (module docstring)."""
    options = MEASURES[measure]
    calls = [_call(model, batch, rho, options)]
    if calls[0]["reach"] < TRUSTED:
        calls.append(_call(model, batch, rho, {**options, **ESCALATION}))
    trusted = calls[-1]["reach"] >= TRUSTED
    passes = sum(c["passes"] for c in calls)
    cpu = sum(c["cpu"] for c in calls)
    return {"measure": measure, "rho": rho, "calls": calls, "trusted": trusted,
            "passes": passes, "cpu": cpu, "wall": sum(c["wall"] for c in calls),
            "value": max(c["value"] for c in calls),
            "over_passes_floor": cpu / (passes * floor["cpu"]),
            "target": ITERATION_TARGETS[measure] + SETUP_TARGET * len(calls) / passes,
            "over_floor": cpu / floor["cpu"]}


def models(quick: bool) -> dict[str, tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    """The models and their batch (module docstring)."""
    if quick:
        from _common import bert_batch, bert_model

        return {"tiny BERT": (bert_model(32, 1, 2, 64, 100, 2, torch.float32,
                                         torch.device("cpu")),
                              bert_batch(2, 8, 100, 2, torch.device("cpu")))}
    import solver_reach

    out = {}
    for kind, name in (("minilm", "MiniLM fine-tuned"), ("scratch", "BERT from a small start")):
        vocab = solver_reach.VOCAB_SCRATCH if kind == "scratch" else 5000
        batch = solver_reach._batches(*solver_reach._task(vocab, solver_reach.BATCH,
                                                          seed=1234))[0]
        out[name] = (solver_reach.build(kind), batch)
    return out


def benchmark(quick: bool = False, repeats: int = 5) -> dict[str, Any]:
    """Every model, measure and radius (``--quick``: the tiny BERT at one radius)."""
    results: dict[str, Any] = {"trusted_at": TRUSTED, "escalation": ESCALATION,
                               "clock": "process CPU time, one thread", "models": {}}
    for name, (model, batch) in models(quick).items():
        floor = floor_seconds(model, batch, repeats)
        cases = [time_to_trust(model, batch, measure, rho, floor)
                 for measure in MEASURES for rho in (RHOS[:1] if quick else RHOS)]
        results["models"][name] = {"floor": floor, "cases": cases}
    return results


def table(results: dict[str, Any]) -> str:
    """Markdown: per model, measure and radius, the calls, passes, reach and times."""
    lines = ["| model | measure | rho | calls | passes | reach | time / fwd+bwd | "
             "time / (passes x fwd+bwd) | target |", "|---|---|---|---|---|---|---|---|---|"]
    for name, model in results["models"].items():
        for case in model["cases"]:
            reach = " -> ".join(f"{c['reach']:.3f}" for c in case["calls"])
            lines.append(f"| {name} | {case['measure']} | {case['rho']:g} | "
                         f"{len(case['calls'])} | {case['passes']} | {reach}"
                         f"{'' if case['trusted'] else ' (not confirmed)'} | "
                         f"{case['over_floor']:.0f} | {case['over_passes_floor']:.2f} | "
                         f"{case['target']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random BERT, one radius")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--repeats", type=int, default=5, help="forward+backwards timed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = benchmark(args.quick, args.repeats)
    print(table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
