"""Tables of ``results/*.json`` beside this script (run after ``run_heldout.py``), printed:
``python benchmarks/optimisers_heldout/report.py > benchmarks/optimisers_heldout/report.md``."""
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import optimisers as bench  # noqa: E402

tasks = {}
for path in sorted((HERE / "results").glob("heldout_*.json")):
    data = json.loads(path.read_text())
    for name, task in data["tasks"].items():
        tasks.setdefault(name, {"methods": {}, "starts": task["starts"],
                                "balance": task["label_balance"]})
        tasks[name]["methods"].update(task["methods"])

ORDER = ["AdamW", "QuotientAdamW", "RiemannianAdamW", "LoRA+"]


def g(x):
    return f"{x:.4f}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def ms(values):
    m = statistics.fmean(values)
    s = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{g(m)} ± {g(s)}"


for name, task in tasks.items():
    start = [task["starts"][str(s)]["test_loss"] for s in range(3)]
    print(f"\n### {name}  (label mean train/val/test {task['balance']}; test loss at step 0: "
          + ", ".join(f"{x:.4f}" for x in start) + ")\n")
    print("| optimiser | lr grid | chosen lr | mean val loss | test loss (mean ± std) | "
          "test loss per seed | test acc (mean ± std) | test acc per seed | CPU ms/step | "
          "wall ms/step | diverged runs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    chosen_points = {}
    for opt in ORDER:
        if opt not in task["methods"]:
            continue
        m = task["methods"][opt]
        c = bench.select(m["runs"], "steps")
        pts = [bench.at_step(r, 60) for r in m["runs"] if r["lr"] == c["lr"]]
        seeds = [r["seed"] for r in m["runs"] if r["lr"] == c["lr"]]
        assert seeds == [0, 1, 2]
        chosen_points[opt] = pts
        tl = [p["test_loss"] for p in pts]
        ta = [p["test_acc"] for p in pts]
        div = [f"{r['lr']:g}/s{r['seed']}" for r in m["runs"] if r["diverged"]]
        print(f"| {opt} | {', '.join(f'{x:g}' for x in m['grid'])} | {c['lr']:g} | "
              f"{g(c['val_loss']['mean'])} | {ms(tl)} | {' / '.join(g(x) for x in tl)} | "
              f"{ms(ta)} | {' / '.join(f'{x:.3f}' for x in ta)} | "
              f"{1e3 * m['cpu_per_step_median']:.1f} | {1e3 * m['wall_per_step_median']:.1f} | "
              f"{', '.join(div) or 'none'} |")
    # per-lr mean validation loss (to show edges)
    print("\nmean validation loss / mean test loss at step 60 per lr:\n")
    for opt in ORDER:
        if opt not in task["methods"]:
            continue
        m = task["methods"][opt]
        cells = []
        for lr in m["grid"]:
            pts = [bench.at_step(r, 60) for r in m["runs"] if r["lr"] == lr]
            if any(p is None for p in pts):
                cells.append(f"{lr:g}: diverged")
                continue
            cells.append(f"{lr:g}: {g(statistics.fmean(p['val_loss'] for p in pts))} / "
                         f"{g(statistics.fmean(p['test_loss'] for p in pts))}")
        print(f"- {opt}: " + "; ".join(cells))
    if "AdamW" in chosen_points and "QuotientAdamW" in chosen_points:
        d = [q["test_loss"] - a["test_loss"] for q, a in
             zip(chosen_points["QuotientAdamW"], chosen_points["AdamW"], strict=False)]
        da = [q["test_acc"] - a["test_acc"] for q, a in
              zip(chosen_points["QuotientAdamW"], chosen_points["AdamW"], strict=False)]
        qa = statistics.fmean(p["test_loss"] for p in chosen_points["QuotientAdamW"])
        aw = statistics.fmean(p["test_loss"] for p in chosen_points["AdamW"])
        print(f"\npaired QuotientAdamW − AdamW test loss per seed: "
              f"{', '.join(f'{x:+.2e}' for x in d)} (mean {statistics.fmean(d):+.2e}); "
              f"test acc: {', '.join(f'{x:+.3f}' for x in da)}")
        print(f"ACCEPTANCE (mean test loss QuotientAdamW {qa:.6g} <= AdamW {aw:.6g}): "
              f"{'PASS' if qa <= aw else 'FAIL'}")
