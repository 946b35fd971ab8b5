"""Default vs ~10x reference solve on one model and dtype (an outside check of 2026-12-07).

Run from this folder: ``python run_grid.py MODEL DTYPE [RHOS...]`` (MODEL ``gpt2``, ``llama`` or
``vit``; DTYPE ``float64`` or ``float32``), appending to ``results_MODEL_DTYPE.jsonl``; then
``python table.py`` for the table and the counts by class.
"""

import json
import math
import os
import re
import sys
import time
import traceback
import warnings

import torch
from models import trained

import quotientsharp as qs

name, dtname = sys.argv[1], sys.argv[2]
rhos = [float(r) for r in sys.argv[3:]] or [0.02, 0.1, 0.3]
dtype = {"float64": torch.float64, "float32": torch.float32}[dtname]
MEASURES = {
    "adaptive": dict(measure="adaptive"),
    "worst_case": dict(measure="worst_case"),
    "geodesic_mix": dict(measure="geodesic", metric="mix"),
    "geodesic_inv": dict(measure="geodesic", metric="inv"),
}
REF_MIX = dict(n_iter=100, reach={"chains": 8, "min_chains": 8})  # ~3-10x the default's ~250 passes
REF_OTHER = dict(n_iter=100, reach={"chains": 4, "min_chains": 4})  # ~10x the default's 42 passes

done = set()
if os.path.exists(f"results_{name}_{dtname}.jsonl"):
    for line in open(f"results_{name}_{dtname}.jsonl"):
        j = json.loads(line)
        done.add((j["measure"], j["rho"]))
ORDER = os.environ.get("MEASURES", "geodesic_inv,geodesic_mix,worst_case,adaptive").split(",")
out = open(f"results_{name}_{dtname}.jsonl", "a")

model, batches, log, ev = trained(name, dtype)
print(name, dtname, "train last10", sum(log[-10:]) / 10, "eval", ev, flush=True)


def run(kw, rho, extra):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = time.time()
        r = qs.sharpness(model, batches, rho=rho, progress=False, **kw, **extra)
        dt = time.time() - t
    return r, w, dt


def flagged_batches(msgs):
    """Batches named in ReachWarning messages ('batch i:')."""
    found = set()
    for m in msgs:
        found |= {int(i) for i in re.findall(r"batch (\d+):", m)}
    return found


def finite(x):
    return x is None or (isinstance(x, float) and math.isfinite(x))


for mname in ORDER:
    kw = MEASURES[mname]
    for rho in rhos:
        if (mname, rho) in done:
            continue
        REF = REF_MIX if mname == "geodesic_mix" else REF_OTHER
        rec_base = dict(model=name, dtype=dtname, measure=mname, rho=rho)
        try:
            d, dw, dt_d = run(kw, rho, {})
            r, rw, dt_r = run(kw, rho, REF)
        except Exception as e:
            rec = dict(
                rec_base, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc()[-3000:]
            )
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print("ERROR", mname, rho, rec["error"][:500], flush=True)
            continue
        reach_msgs = [str(x.message) for x in dw if issubclass(x.category, qs.ReachWarning)]
        other_msgs = [
            f"{x.category.__name__}: {x.message}"
            for x in dw
            if not issubclass(x.category, qs.ReachWarning)
        ]
        ref_other = [
            f"{x.category.__name__}: {x.message}"
            for x in rw
            if not issubclass(x.category, qs.ReachWarning)
        ]
        fb = flagged_batches(reach_msgs)
        for b in range(len(batches)):
            v, rv = d.per_batch[b], r.per_batch[b]
            best = max(v, rv)
            share = v / best if best > 0 else float("nan")
            loc = d.locality[b]
            rloc = r.locality[b]
            field_flag = (
                (d.reach[b] is None or d.reach[b] < 0.99)
                or (loc.get("local") is False)
                or (d.rounding[b] > 0.01 * abs(v))
            )
            rec = dict(
                rec_base,
                batch=b,
                default=v,
                reference=rv,
                best=best,
                share=share,
                reach=d.reach[b],
                local=loc.get("local"),
                rounding=d.rounding[b],
                path_share=loc.get("path_share"),
                path_agrees=loc.get("path_agrees"),
                displacement=loc.get("displacement"),
                factor_displacement=loc.get("factor_displacement"),
                second_order=loc.get("second_order"),
                chains=d.chains[b],
                evals=d.evaluations[b],
                ref_evals=r.evaluations[b],
                ref_reach=r.reach[b],
                ref_chains=r.chains[b],
                ref_local=rloc.get("local"),
                ref_second_order=rloc.get("second_order"),
                ref_path_share=rloc.get("path_share"),
                flagged=(b in fb),
                field_flag=field_flag,
                n_reach_warnings=len(reach_msgs),
                warning=[m for m in reach_msgs],
                other_warnings=other_msgs,
                ref_other_warnings=ref_other,
                chain_shortfalls=d.chain_shortfalls[b],
                time_default=dt_d,
                time_ref=dt_r,
                clean_loss=d.clean_losses[b],
                finite=all(finite(x) for x in [v, rv, d.reach[b], loc.get("path_share")]),
            )
            out.write(json.dumps(rec, default=str) + "\n")
            out.flush()
            print(
                f"{mname:13s} rho={rho:<5} b{b} def={v:.5g} ref={rv:.5g} share={share:.4f} "
                f"reach={d.reach[b]:.4f} local={loc.get('local')} flag={b in fb}/{field_flag} "
                f"evals={d.evaluations[b]}/{r.evaluations[b]} "
                f"t={dt_d:.0f}/{dt_r:.0f}s",
                flush=True,
            )
