"""Worst-case sharpness at the larger radii: does a third chain of the reach search help?

The reach page found worst-case values short of 99 % of the best value found at rho 0.1 and 0.3
whose reach estimate was 0.99-1.00: the default search's two chains agreed on a lower maximum.
This script trains a model of a family study as the reach study does (study seed 0, the family's
full size; the fine-tunes start from the reach run's ``pretrained.pt``), solves every batch of
its sharpness set with a strong solve (``reference_solve``: 10 times the steps, 2 random
restarts), and measures worst-case sharpness with the default search at each ``min_chains``.
One JSON line per (radius, min_chains, batch): the share of the larger of the two values, the
reach estimate, whether the ball was local and the forward+backward passes.

Run: ``python benchmarks/worst_case_chains.py bert 0 --rhos 0.1 0.3 --min-chains 2 3
[--pretrained DIR]`` (about a minute per radius for a BERT of the family, several for a ViT
fine-tune on two cores). ``--stall S --continuations C`` set the search's stall test and
continuations (the default search's otherwise). ``--probe B`` instead measures batch ``B`` with
single ascents (``reach=False``): from ``xi = 0`` with 20, 40, 80 and 200 steps, and from 4
random starts with 20 steps (seeds 0-3): where the basins of the ball lie.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", help="a family study: vit, bert, vit-finetune, minilm, lora")
    parser.add_argument("index", type=int, help="the model's index in the study")
    parser.add_argument("--rhos", type=float, nargs="+", default=[0.1, 0.3])
    parser.add_argument("--min-chains", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--pretrained", type=Path, default=Path("."),
                        help="the folder of the reach run's pretrained.pt (fine-tune families)")
    parser.add_argument("--stall", type=float, default=None,
                        help="the search's stall test (default: the search's own)")
    parser.add_argument("--continuations", type=int, default=None,
                        help="the search's continuations (default: the search's own)")
    parser.add_argument("--probe", type=int, default=None, metavar="B",
                        help="single ascents on batch B instead of the chains' comparison")
    args = parser.parse_args(argv)
    import quotientsharp as qs
    from quotientsharp.reproduce.families.data import sharpness_batches
    from quotientsharp.reproduce.families.measures import family_measures
    from quotientsharp.reproduce.families.run import train_family_model
    from quotientsharp.reproduce.reach_models import family_study_of

    torch.set_num_threads(1)
    study = family_study_of(args.family)
    variant, data = study.full, study.load_data(False)
    start = None if study.pretrained is None else study.pretrained.load(args.pretrained, False)
    model, _ = train_family_model(study, data, variant, 0, args.index, lambda _: None, start)
    if model is None:
        raise SystemExit(f"{args.family} model {args.index} diverged in training")
    batches = sharpness_batches(data, variant.sharpness_points, variant.sharpness_batch_size)
    options = {s.key: {"measure": s.measure, **s.options}
               for s in family_measures(1.0, 1.0, 1.0, 1.0)}["worst_case"]
    common = dict(n_iter=variant.n_iter, seed=0, progress=False, **options)
    warnings.simplefilter("ignore", qs.ReachWarning)    # read off the result instead
    if args.probe is not None:
        _probe(model, batches[args.probe:args.probe + 1], args, options)
        return 0
    for rho in args.rhos:
        reference = qs.sharpness(model, batches, rho=rho, reach=False, reference_solve={
            "n_iter": 10 * variant.n_iter, "restarts": 2}, **common).reference_per_batch
        for chains in args.min_chains:
            search = {"min_chains": chains, "chains": max(4, chains), **{
                key: value for key, value in (("stall", args.stall),
                                              ("continuations", args.continuations))
                if value is not None}}
            result = qs.sharpness(model, batches, rho=rho, **common, reach=search)
            for b, (value, best) in enumerate(zip(result.per_batch, reference, strict=True)):
                top = max(value, best)
                print(json.dumps({"unit": f"{args.family}:{args.index}", "rho": rho,
                                  "min_chains": chains, "stall": args.stall,
                                  "continuations": args.continuations, "batch": b,
                                  "share": value / top if top > 0 else 1.0,
                                  "reach": result.reach[b], "local": result.locality[b]["local"],
                                  "passes": result.evaluations[b]}), flush=True)
    return 0


def _probe(model: torch.nn.Module, batch: list, args: argparse.Namespace,
           options: dict) -> None:
    """Single ascents on one batch: from ``xi = 0`` at several lengths, from random starts."""
    import quotientsharp as qs

    runs = [({"n_iter": n, "seed": 0}, f"from xi = 0, {n} steps") for n in (20, 40, 80, 200)]
    runs += [({"n_iter": 20, "seed": s, "random_init": True}, f"random start (seed {s}), 20 steps")
             for s in range(4)]
    for rho in args.rhos:
        for settings, label in runs:
            value = qs.sharpness(model, batch, rho=rho, reach=False, progress=False,
                                 **settings, **options).value
            print(json.dumps({"unit": f"{args.family}:{args.index}", "rho": rho,
                              "batch": args.probe, "ascent": label, "value": value}),
                  flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
