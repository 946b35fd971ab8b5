"""Invariance of geodesic sharpness on a small BERT (SPEC section 7's invariance check).

Every head is reparametrised with ``A = a * N`` (``quotientsharp.models.reparametrize``): the
network function stays the same; geodesic sharpness (inv and mix, order 2) must stay the same
while adaptive sharpness moves.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quotientsharp import sharpness  # noqa: E402
from quotientsharp.models import find_symmetries, reparametrize  # noqa: E402

SCALES = (1e-2, 1.0, 1e2)


def _bert(dtype: torch.dtype = torch.float64):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        vocab_size=50, max_position_embeddings=32, num_labels=3, attn_implementation="eager",
        # larger than BERT's 0.02, so that attention scores are O(1) and the pairs matter
        initializer_range=0.3)
    return transformers.BertForSequenceClassification(config).to(dtype)


def _batches():
    gen = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 50, (8, 12), generator=gen),
             "attention_mask": torch.ones(8, 12, dtype=torch.long),
             "labels": torch.randint(0, 3, (8,), generator=gen)}]


def _moved(model, report, scale: float):
    params = reparametrize(model, report, scale=scale, generator=torch.Generator().manual_seed(3))
    other = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in other.named_parameters():
            tensor.copy_(params[name])
    return other


def _logits(model, batch):
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        return model.eval()(**inputs).logits


MEASURES = {
    "geodesic-inv": dict(measure="geodesic", metric="inv", order=2, rho=0.1),
    "geodesic-mix": dict(measure="geodesic", metric="mix", order=2, rho=0.1),
    "adaptive": dict(measure="adaptive", rho=0.1),
}


def test_geodesic_sharpness_is_invariant_and_adaptive_is_not() -> None:
    model, batches = _bert(), _batches()
    report = find_symmetries(model)
    base = {name: sharpness(model, batches, progress=False, **kw) for name, kw in MEASURES.items()}
    assert base["geodesic-inv"].settings["gl_pairs"] == 16
    assert base["geodesic-inv"].perturbation_norms[0]["gl"] > 0
    reference_logits = _logits(model, batches[0])
    for scale in SCALES:
        moved = _moved(model, report, scale)
        logits = _logits(moved, batches[0])
        assert torch.allclose(logits, reference_logits, rtol=1e-9, atol=1e-10)
        values = {name: sharpness(moved, batches, progress=False, **kw).value
                  for name, kw in MEASURES.items()}
        for name in ("geodesic-inv", "geodesic-mix"):
            assert abs(values[name] - base[name].value) < 1e-2 * abs(base[name].value), name
        change = abs(values["adaptive"] - base["adaptive"].value) / base["adaptive"].value
        assert change > 0.1, change


def test_bert_float32_eps_and_state_dict() -> None:
    model, batches = _bert(torch.float32), _batches()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = sharpness(model, batches, measure="geodesic", metric="mix", eps=1e-4, rho=0.1,
                       n_iter=5, progress=False)
    assert result.settings["geometry_dtype"] == "float32"
    assert math.isfinite(result.value) and result.value > 0
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize("metric", ["inv", "mix"])
def test_exact_geodesic_sharpness_is_invariant(metric: str) -> None:
    model, batches = _bert(), _batches()
    report = find_symmetries(model)
    options = dict(measure="geodesic", metric=metric, order="exact", rho=0.1, n_iter=5,
                   progress=False)
    base = sharpness(model, batches, **options).value
    for scale in (1e-2, 1e2):
        value = sharpness(_moved(model, report, scale), batches, **options).value
        assert abs(value - base) < 1e-2 * abs(base)
