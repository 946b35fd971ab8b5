"""Geodesic sharpness of LoRA adapters under GL(r) applied by hand, against adaptive.

Run from the repository root: ``python examples/lora_invariance.py``. It reuses the test
fixtures of ``tests/test_lora.py`` (models built from configs, no download), so the
numbers it prints are the ones the tests bound.
"""

import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # the tests' fixtures
warnings.filterwarnings("ignore", category=FutureWarning)

import test_lora as T  # noqa: E402

from quotientsharp import sharpness  # noqa: E402

OPTIONS = {"rho": 0.05, "n_iter": 4, "progress": False}
FAMILIES = ((T.tiny_bert, ("query", "value", "dense")),
            (T.tiny_llama, ("q_proj", "k_proj", "v_proj", "o_proj")))

for build, targets in FAMILIES:
    for dtype, extra in ((torch.float64, {}), (torch.float32, {"geometry_dtype": torch.float64})):
        model = T.with_adapters(build(dtype), targets, r=4)
        moved = T.act_by_hand(model, seed=3)
        orders = (1, 2, "exact") if dtype == torch.float64 else (2,)
        for order in orders:
            g = [sharpness(m, T.batches(), measure="geodesic", order=order, **extra,
                           **OPTIONS).value for m in (model, moved)]
            print(f"{build.__name__} {str(dtype)[6:]} order {order}: geodesic {g[0]:.10g} vs "
                  f"{g[1]:.10g}, relative {T.relative(*g):.2e}", flush=True)
        a = [sharpness(m, T.batches(), measure="adaptive", **OPTIONS).value
             for m in (model, moved)]
        print(f"{build.__name__} {str(dtype)[6:]}: adaptive {a[0]:.4g} vs {a[1]:.4g}, "
              f"ratio {a[1] / a[0]:.3g}", flush=True)
