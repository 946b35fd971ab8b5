"""Llama (float64, GQA + rotary, causal LM) worst case at rho=0.3, batch 0: the default reaches
~90 % of a 100-step solve with reach estimate 1.0 and no warning."""

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
for n in [20, 40, 60, 100, 200]:
    show(f"one ascent n_iter={n} (reach=False)", n_iter=n, reach=False)
show("stall=1e-4, continuations=4", reach={"stall": 1e-4, "continuations": 4})
show("min_chains=3", reach={"min_chains": 3})
show("n_iter=50 default search", n_iter=50)
