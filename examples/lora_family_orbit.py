"""Models of ``quotientsharp reproduce lora``, moved along their GL(r) orbits: who notices?

Rebuilds and retrains models of the LoRA study (the full variant, the study's seed, its own
functions: the same draws, start and training as ``reproduce lora``), then moves every adapter
to ``(M A, B M^{-1})`` with ``reparametrize`` (one Gaussian ``M = scale * N`` per adapter) and
measures adaptive, worst-case and geodesic inv and mix sharpness (order 2) with the study's
radii, sharpness batch and Auto-PGD steps, before and after. The network is the same function
(the script prints the largest logit change); the geodesic values should not move, the
adaptive and worst-case ones do. With ``--results results/lora`` it also prints the study's
recorded values next to the rebuilt model's (training is deterministic on one machine and
thread count, not across machines).

Run: ``python examples/lora_family_orbit.py --models 0 1 2 [--scale 1] [--results results/lora]
[--geometry-float64]``
(about a minute per model on one CPU core).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="the study's seed")
    parser.add_argument("--geometry-float64", action="store_true",
                        help="measure with geometry_dtype=torch.float64 (the study measures "
                             "with the default: float32 geometry for its float32 models)")
    parser.add_argument("--results", type=Path, default=None,
                        help="a results folder of reproduce lora, to compare with")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)

    from quotientsharp import sharpness
    from quotientsharp.models import find_symmetries, reparametrize
    from quotientsharp.reproduce.families import lora, minilm
    from quotientsharp.reproduce.families.data import sharpness_batches
    from quotientsharp.reproduce.families.training import draw_hyperparameters, train_classifier

    variant = lora.FULL
    data = minilm.load_data(False)
    start = minilm.load_pretrained(None, False)
    batches = sharpness_batches(data, variant.sharpness_points, variant.sharpness_batch_size)
    measures = {"adaptive": ({"measure": "adaptive"}, lora.RHOS["adaptive"]),
                "worst_case": ({"measure": "worst_case"}, lora.RHOS["worst_case"]),
                "geodesic_inv_o2": ({"measure": "geodesic", "metric": "inv", "order": 2},
                                    lora.RHOS["inv"]),
                "geodesic_mix_o2": ({"measure": "geodesic", "metric": "mix", "order": 2},
                                    lora.RHOS["mix"])}
    recorded = {}
    if args.results is not None:
        with (args.results / "models.jsonl").open() as handle:
            recorded = {r["index"]: r for r in map(json.loads, handle)}
    inputs = {k: v for k, v in batches[0].items() if k != "labels"}
    for index in args.models:
        hyper = draw_hyperparameters(variant.space, args.seed, index)
        torch.manual_seed(hyper.init_seed)
        model = lora.add_adapters(minilm.build_model(data.num_labels, start), hyper)
        train_classifier(model, data, hyper, variant.train_batch_size)
        report = find_symmetries(model)
        moved_params = reparametrize(model, report, scale=args.scale,
                                     generator=torch.Generator().manual_seed(index))
        moved = copy.deepcopy(model)
        with torch.no_grad():
            for name, tensor in moved.named_parameters():
                tensor.copy_(moved_params[name])
            change = (moved(**inputs).logits - model(**inputs).logits).abs().max().item()
        print(f"model {index}: rank {hyper.rank}, {report.gl_count} GL({hyper.rank}) pairs, "
              f"max logit change after the move {change:.2e}")
        for key, (options, rho) in measures.items():
            if args.geometry_float64:
                options = {**options, "geometry_dtype": torch.float64}
            values = [sharpness(m, batches, rho=rho, n_iter=variant.n_iter, seed=0,
                                progress=False, **options).value for m in (model, moved)]
            ratio = values[1] / values[0]
            line = (f"  {key:<16} before {values[0]:.6g}  after {values[1]:.6g}  "
                    f"after/before {ratio:.8g}")
            if index in recorded:
                line += f"  (study's record {recorded[index][key]:.6g})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
