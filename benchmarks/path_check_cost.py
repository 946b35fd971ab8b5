"""What the exact-path check of an order-2 geodesic value costs: one default measurement with the
check against the same without it, on the real pretrained MiniLM (or a tiny BERT).

Per measure (geodesic inv and mix, order 2, rho 0.1, the default search), the median CPU time
of ``quotientsharp.sharpness`` on one batch of 8 x 32 tokens with and without the check
(``_common.without_path_check``), interleaved, and the check's share of the call; also the
value's reach estimate, passes and ``path_share``, so that each time comes with the solve it
belongs to.

Run: ``python benchmarks/path_check_cost.py [--tiny] [--repeats 3] [--json OUT]`` (about 3 min
on one CPU thread for MiniLM).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import benchmark_model, time_interleaved, without_path_check  # noqa: E402

MEASURES = {"geodesic inv": {"measure": "geodesic", "metric": "inv", "order": 2},
            "geodesic mix": {"measure": "geodesic", "metric": "mix", "order": 2}}


def main(argv: list[str] | None = None) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    import quotientsharp as qs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny BERT (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cpu")
    model, batch = benchmark_model("minilm", device, tiny=args.tiny)

    def call(options: dict, checked: bool) -> qs.SharpnessResult:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", qs.ReachWarning)
            if checked:
                return qs.sharpness(model, [batch], rho=0.1, progress=False, **options)
            with without_path_check():
                return qs.sharpness(model, [batch], rho=0.1, progress=False, **options)

    functions = {f"{name} {kind}": (lambda o=options, c=(kind == "checked"): call(o, c))
                 for name, options in MEASURES.items() for kind in ("checked", "unchecked")}
    timings = time_interleaved(functions, args.repeats, device)
    report: dict = {"model": "tiny" if args.tiny else "minilm", "repeats": args.repeats}
    for name, options in MEASURES.items():
        result = call(options, True)
        checked = timings[f"{name} checked"].median
        unchecked = timings[f"{name} unchecked"].median
        report[name] = {"seconds_checked": checked, "seconds_unchecked": unchecked,
                        "check_share": (checked - unchecked) / checked,
                        "reach": result.reach[0], "passes": result.evaluations[0],
                        "path_share": result.locality[0]["path_share"]}
        row = report[name]
        print(f"{name}: {checked:.2f} s with the check, {unchecked:.2f} s without "
              f"({100 * row['check_share']:.1f} % of the call); reach {row['reach']:.3f}, "
              f"{row['passes']} passes, path_share {row['path_share']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
