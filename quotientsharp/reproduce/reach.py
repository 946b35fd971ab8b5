"""``quotientsharp reproduce reach``: how much of the best-found maximum the default ascent
reaches, per measure, against the radius rho.

A sharpness value is the best loss increase an ascent finds in the ball, a lower bound of the
maximum. Comparing measures compares their values, so a measure whose default ascent falls
short at a radius is ranked by its solver's error as much as by the landscape. This study
gives, for each measure and ``rho`` in :data:`RHOS`, the default ascent's value (Auto-PGD,
20 steps from ``xi = 0``) as a percentage of the best value found per problem (a net and
batch): the best of the default ascent, a strong ascent and, where there is one, the exact
maximum.

- **Diagonal nets** (the ``reproduce diagonal`` setting, its quick size: d = 200, nets trained
  to a training loss of 1e-5): adaptive, geodesic inv and mix with exact paths (mix with the
  metric's own ball and with the rate ball ``||b|| <= rho / sqrt(2)``). The strong ascent is
  the study's reference (400 steps, 3 restarts: from the quadratic model's maximiser, its
  negative and a random point); mix's maxima are exact (trust-region subproblems).
- **A tiny float64 BERT** (2 layers, 4 heads of dimension 8, random weights with
  ``initializer_range`` 0.3 so that attention matters, random token batches): adaptive,
  geodesic inv and mix of order 2 (the family studies' measures), the strong ascent the
  engine's ``reference_solve=True`` (10 times the steps, 4 random restarts).

Reported per measure and radius: min / median over the problems of
``100 * default / best``. The full run measures 6 diagonal nets and 2 BERT batches;
``--quick`` runs 2 radii, 2 nets and 1 BERT batch (for tests).
Outputs: ``OUT/reach.json`` and ``OUT/reach.md``; with ``--docs DIR`` the page
``DIR/results/reach.md`` (and the regenerated ``DIR/results.md``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["HELP", "RHOS", "add_arguments", "reach_page", "reach_study", "run"]

HELP = "solver reach against rho: the default ascent's share of the best-found maximum"

#: The radii of the study (``--quick``: the first two).
RHOS = (0.05, 0.1, 0.3, 0.5)
#: Steps of the default ascent (the engine's default).
DEFAULT_STEPS = 20


def _percent(values: Sequence[float], best: Sequence[float]) -> dict[str, float]:
    """min and median of ``100 * value / best`` (``best > 0`` checked)."""
    shares = []
    for value, top in zip(values, best, strict=True):
        if not (math.isfinite(value) and math.isfinite(top)) or top <= 0:
            raise ValueError(f"reach needs a finite, positive best value, got best={top!r}, "
                             f"value={value!r}")
        shares.append(100.0 * value / top)
    shares.sort()
    middle = len(shares) // 2
    median = shares[middle] if len(shares) % 2 else 0.5 * (shares[middle - 1] + shares[middle])
    return {"min": shares[0], "median": median, "problems": len(shares)}


def diagonal_reach(rhos: Sequence[float], nets: int, seed: int,
                   overrides: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Measure -> rho -> reach on diagonal nets (module docstring); ``overrides`` change the
    diagonal settings (smaller problems for tests)."""
    import torch

    from quotientsharp.engine.solver import AscentSettings
    from quotientsharp.reproduce.diagonal.data import (
        derived_seed,
        draw_hyperparameters,
        make_problem,
    )
    from quotientsharp.reproduce.diagonal.exact import (
        REFERENCE_MEASURES,
        mix_exact_maxima,
        mix_rate_ball_maxima,
        reference_maxima,
    )
    from quotientsharp.reproduce.diagonal.measures import MEASURES, measure_nets, sharpness_batches
    from quotientsharp.reproduce.diagonal.settings import DiagonalSettings
    from quotientsharp.reproduce.diagonal.training import train_nets

    settings = DiagonalSettings.quick(**{"nets": nets, "seed": seed,
                                         "reference_iterations": 400, "reference_restarts": 3,
                                         **(overrides or {})})
    problem = make_problem(settings)
    trained = train_nets(problem, draw_hyperparameters(settings), settings)
    healthy = [i for i in sorted(trained) if not trained[i].diverged]
    if not healthy:
        raise ValueError("every diagonal net diverged: no reach to report")
    u = torch.tensor([trained[i].u for i in healthy], dtype=torch.float64)
    v = torch.tensor([trained[i].v for i in healthy], dtype=torch.float64)
    inputs, targets = sharpness_batches(problem, settings)
    chosen = [m for m in MEASURES if m.name in ("adaptive", "geodesic_inv_exact",
                                                "geodesic_mix_exact",
                                                "geodesic_mix_exact_rateball")]
    exact = {"geodesic_mix_exact": mix_exact_maxima,
             "geodesic_mix_exact_rateball": mix_rate_ball_maxima}
    out: dict[str, dict[str, Any]] = {m.name: {} for m in chosen}
    for rho in rhos:
        default = measure_nets(u, v, inputs, targets, rho, AscentSettings(n_iter=DEFAULT_STEPS),
                               chosen)
        strong = reference_maxima(u, v, inputs, targets, rho, settings.reference_ascent,
                                  [derived_seed(seed, f"reach:{i}") for i in healthy],
                                  REFERENCE_MEASURES)
        for spec in chosen:
            candidates = [default[spec.name]]
            if spec.name in strong:
                candidates.append(strong[spec.name])
            if spec.name in exact:
                candidates.append(exact[spec.name](u, v, inputs, targets, rho))
            best = torch.stack(candidates).amax(0)
            out[spec.name][f"{rho:g}"] = _percent(default[spec.name].flatten().tolist(),
                                                  best.flatten().tolist())
    return out


def _tiny_bert(seed: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        vocab_size=50, max_position_embeddings=32, num_labels=3, attn_implementation="eager",
        initializer_range=0.3)  # type: ignore[call-arg]
    model: Any = transformers.BertForSequenceClassification(config)
    return model.to(torch.float64).eval()


def bert_reach(rhos: Sequence[float], batches: int, seed: int) -> dict[str, dict[str, Any]]:
    """Measure -> rho -> reach on a tiny float64 BERT (module docstring); a radius the engine
    refuses for a measure is recorded with its reason."""
    import torch

    import quotientsharp as qs

    model = _tiny_bert(seed)
    generator = torch.Generator().manual_seed(1000 + seed)
    data = [{"input_ids": torch.randint(0, 50, (8, 12), generator=generator),
             "attention_mask": torch.ones(8, 12, dtype=torch.long),
             "labels": torch.randint(0, 3, (8,), generator=generator)}
            for _ in range(batches)]
    measures: dict[str, dict[str, Any]] = {"adaptive": {"measure": "adaptive"},
                "geodesic_inv_order2": {"measure": "geodesic", "metric": "inv", "order": 2},
                "geodesic_mix_order2": {"measure": "geodesic", "metric": "mix", "order": 2}}
    out: dict[str, dict[str, Any]] = {name: {} for name in measures}
    for name, options in measures.items():
        for rho in rhos:
            try:
                result = qs.sharpness(model, data, rho=rho, n_iter=DEFAULT_STEPS, seed=seed,
                                      progress=False, reference_solve=True, **options)
            except ValueError as err:
                out[name][f"{rho:g}"] = {"refused": str(err).split("\n")[0]}
                continue
            best = [max(v, r) for v, r in zip(result.per_batch, result.reference_per_batch,
                                              strict=True)]
            out[name][f"{rho:g}"] = _percent(result.per_batch, best)
    return out


def _cell(entry: dict[str, Any]) -> str:
    if "refused" in entry:
        return "refused by the engine"
    return f"{entry['min']:.2f} / {entry['median']:.2f}"


def reach_page(results: dict[str, Any], command: str) -> str:
    """The Markdown section of the study."""
    rhos = results["rhos"]
    lines = ["## Solver reach against rho (`reproduce reach`)", "",
             f"Reproduce: `{command}` (outputs in `{results['out']}/`). This run: wall time "
             f"{results['wall_seconds'] / 60:.1f} min, {results['threads']} torch thread(s).",
             "",
             "Each cell: the default ascent (Auto-PGD, 20 steps from ξ = 0, the engine's and "
             "the studies' default) as a percentage of the best value found for the same "
             "problem (a net or model and one batch), min / median over the problems. The best "
             "value is the largest of the default ascent, a strong ascent and, for mix on the "
             "diagonal nets, the exact maximum. A measure whose reach falls with rho is ranked "
             "partly by its solver's shortfall: compare measures at a radius where every "
             "one of them reaches close to 100 %.", ""]
    for family, title, note in (
            ("diagonal", "Diagonal nets",
             f"{results['diagonal_nets']} nets of the diagonal study's quick size (d = 200, "
             "trained to 1e-5), 4 batches of 25 each; exact paths; strong ascent: 400 steps, "
             "3 restarts (from the quadratic model's maximiser, its negative and a random "
             "point); mix maxima exact."),
            ("bert", "Tiny float64 BERT",
             f"2 layers, 4 heads of dimension 8, random weights (initializer_range 0.3), "
             f"{results['bert_batches']} random batch(es) of 8 sequences of 12 tokens; "
             "strong ascent: the engine's reference_solve=True (200 steps, 4 random "
             "restarts).")):
        lines += [f"### {title}", "", note, "",
                  "| measure | " + " | ".join(f"ρ = {rho:g}" for rho in rhos) + " |",
                  "|---|" + "---|" * len(rhos)]
        for measure, by_rho in results[family].items():
            lines.append(f"| {measure} | "
                         + " | ".join(_cell(by_rho[f"{rho:g}"]) for rho in rhos) + " |")
        lines.append("")
    return "\n".join(lines)


def reach_study(out: Path, *, quick: bool = False, seed: int = 0, threads: int = 1,
                docs: Path | None = None, command: str | None = None,
                rhos: Sequence[float] | None = None, nets: int | None = None,
                batches: int | None = None,
                diagonal_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the study, write ``out/reach.json`` and ``out/reach.md`` (and, with ``docs``, the
    page); returns the results.

    Parameters
    ----------
    out
        Results folder.
    quick
        The smoke size (2 radii, 2 nets, 1 BERT batch).
    seed, threads
        Seed of every draw; torch threads during the run.
    docs
        Docs folder of the page.
    command
        The command the page names (default: this study's).
    rhos, nets, batches, diagonal_overrides
        Sizes other than the full and quick ones (tests and explorations).
    """
    import torch

    from quotientsharp.reproduce.results_page import regenerate_results_page, write_section
    from quotientsharp.workflows.files import write_json_atomic

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    rhos = tuple(rhos) if rhos is not None else RHOS[:2] if quick else RHOS
    nets = nets if nets is not None else 2 if quick else 6
    batches = batches if batches is not None else 1 if quick else 2
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        results: dict[str, Any] = {
            "rhos": list(rhos), "seed": seed, "threads": threads, "out": str(out),
            "diagonal_nets": nets, "bert_batches": batches,
            "diagonal": diagonal_reach(rhos, nets, seed, diagonal_overrides),
            "bert": bert_reach(rhos, batches, seed)}
    finally:
        torch.set_num_threads(saved)
    results["wall_seconds"] = time.perf_counter() - start
    command = command or ("quotientsharp reproduce reach" + (" --quick" if quick else "")
                          + (f" --seed {seed}" if seed else "") + " --docs docs")
    text = reach_page(results, command)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "reach.json", results)
    (out / "reach.md").write_text(text)
    if docs is not None:
        write_section(Path(docs), "reach", text)
        regenerate_results_page(Path(docs))
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``quotientsharp reproduce reach``."""
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default results/reach, or results/reach-quick "
                             "with --quick)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help="also write DIR/results/reach.md and regenerate DIR/results.md")
    parser.add_argument("--quick", action="store_true",
                        help="2 radii, 2 diagonal nets, 1 BERT batch (a smoke run)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads during the run (default 1)")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``quotientsharp reproduce reach``."""
    import sys

    out = args.out if args.out is not None else Path(
        "results/reach-quick" if args.quick else "results/reach")
    try:
        results = reach_study(out, quick=args.quick, seed=args.seed, threads=args.threads,
                              docs=args.docs)
    except ValueError as err:
        print(f"quotientsharp reproduce reach: error: {err}", file=sys.stderr)
        return 2
    print(reach_page(results, "quotientsharp reproduce reach"))
    return 0
