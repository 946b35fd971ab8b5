"""Llama (float64, GQA + rotary, causal LM) worst case at rho=0.3, batch 0: the default reaches
~90 % of a 100-step solve with reach estimate 1.0 and no warning.

The second part asks whether the value it stops at is a basin that its starts choose or a
point where short ascents stop: one ascent of each length from 20 to 200 steps, 16 chains of 20
steps from random starts, 8 of 100, and the search's other options (a ladder in rho, the warm
step reset, a doubled first step). ``python repro_llama_worstcase.py >
repro_llama_worstcase.log``."""

import warnings

import torch
from models import trained

import quotientsharp as qs

model, batches, _, _ = trained("llama", torch.float64)
b = batches[:1]


def show(label, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = qs.sharpness(model, b, measure="worst_case", rho=0.3, progress=False, **kw)
    rw = [x for x in w if issubclass(x.category, qs.ReachWarning)]
    print(
        f"{label:45s} value={r.per_batch[0]:.5f} "
        f"reach={r.reach[0] if r.reach else None} "
        f"chains={[round(c, 5) for c in r.chains[0]] if r.chains else None} "
        f"evals={r.evaluations[0] if r.evaluations else len(r.traces[0])} warned={bool(rw)}",
        flush=True,
    )


show("default")
for n in [20, 30, 40, 50, 60, 70, 80, 90, 100, 120, 150, 200]:
    show(f"one ascent n_iter={n} (reach=False)", n_iter=n, reach=False)
show("stall=1e-4, continuations=4", reach={"stall": 1e-4, "continuations": 4})
show("min_chains=3", reach={"min_chains": 3})
show("n_iter=50 default search", n_iter=50)
show("ladder (0.5,)", reach={"ladder": (0.5,)})
show("ladder (0.25, 0.5)", reach={"ladder": (0.25, 0.5)})
show("warm_step=reset", reach={"warm_step": "reset"})
show("eta0=1.2 (twice the default first step, 2 rho)", eta0=1.2)
show("16 chains of 20 steps", reach={"chains": 16, "min_chains": 16})
show("8 chains of 100 steps", n_iter=100, reach={"chains": 8, "min_chains": 8})
