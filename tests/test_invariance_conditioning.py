"""Geodesic sharpness is invariant under ill-conditioned GL(h) elements, in float64 and float32.

The reparametrisation is written here by hand, independently of
:func:`quotientsharp.models.reparametrize`: every head of a small BERT gets its own query/key
element ``A`` and value/output element ``C`` with a prescribed condition number
(``U diag(s) V^T``, Haar ``U``, ``V``, singular values log-spaced over the condition), applied
as ``q -> q A^{-1}``, ``k -> k A^T``, ``v -> v C^{-1}`` and ``W_O[:, head] -> W_O[:, head] C^T``.
The network computes the same function; its geodesic sharpness must not change, and the best
perturbation must stay in the ball.
"""

from __future__ import annotations

import copy

import pytest
import torch

import quotientsharp as qs

transformers = pytest.importorskip("transformers")


def _element(h: int, condition: float, gen: torch.Generator) -> torch.Tensor:
    def orthogonal() -> torch.Tensor:
        q, r = torch.linalg.qr(torch.randn(h, h, generator=gen, dtype=torch.float64))
        return q * torch.sign(r.diagonal())

    singular = torch.logspace(-0.5, 0.5, h, dtype=torch.float64) ** torch.log10(
        torch.tensor(condition, dtype=torch.float64))
    return orthogonal() @ torch.diag(singular) @ orthogonal().mT


def _bert(hidden: int, dtype: torch.dtype):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * hidden, vocab_size=100, max_position_embeddings=32, num_labels=2,
        attn_implementation="eager", initializer_range=0.3)
    return transformers.BertForSequenceClassification(config).to(dtype)


def _reparametrised(model, condition: float, seed: int):
    """A copy of ``model`` with every head moved along its QK and VO orbits (in float64)."""
    moved = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    heads = model.config.num_attention_heads
    h = model.config.hidden_size // heads
    with torch.no_grad():
        for layer in moved.bert.encoder.layer:
            attention = layer.attention
            parts = {name: getattr(attention.self, name) for name in ("query", "key", "value")}
            weights = {n: m.weight.double().clone() for n, m in parts.items()}
            biases = {n: m.bias.double().clone() for n, m in parts.items()}
            out = attention.output.dense.weight.double().clone()
            for i in range(heads):
                rows = slice(i * h, (i + 1) * h)
                a, c = _element(h, condition, gen), _element(h, condition, gen)
                a_inv_t, c_inv_t = torch.linalg.inv(a).mT, torch.linalg.inv(c).mT
                weights["query"][rows] = a_inv_t @ weights["query"][rows]
                biases["query"][rows] = a_inv_t @ biases["query"][rows]
                weights["key"][rows] = a @ weights["key"][rows]
                biases["key"][rows] = a @ biases["key"][rows]
                weights["value"][rows] = c_inv_t @ weights["value"][rows]
                biases["value"][rows] = c_inv_t @ biases["value"][rows]
                out[:, rows] = out[:, rows] @ c.mT
            for name, module in parts.items():
                module.weight.copy_(weights[name])
                module.bias.copy_(biases[name])
            attention.output.dense.weight.copy_(out)
    return moved


def _batches():
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 100, (8, 12), generator=gen),
             "attention_mask": torch.ones(8, 12, dtype=torch.long),
             "labels": torch.randint(0, 2, (8,), generator=gen)} for _ in range(2)]


def _relative_change(model, moved, **options) -> tuple[float, float]:
    before = qs.sharpness(model, _batches(), measure="geodesic", rho=0.1, progress=False,
                          **options)
    after = qs.sharpness(moved, _batches(), measure="geodesic", rho=0.1, progress=False,
                         **options)
    change = max(abs(a - b) / abs(a) for a, b in zip(before.per_batch, after.per_batch,
                                                     strict=True))
    largest_norm = max(n["total"] for n in after.perturbation_norms + before.perturbation_norms)
    return change, largest_norm


def test_the_reparametrisation_keeps_the_function() -> None:
    model = _bert(32, torch.float64).eval()
    moved = _reparametrised(model, 1e5, seed=1).eval()
    batch = _batches()[0]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        difference = (model(**inputs).logits - moved(**inputs).logits).abs().max()
    assert float(difference) < 1e-9
    largest = [float(m.bert.encoder.layer[0].attention.self.query.weight.detach().abs().max())
               for m in (model, moved)]
    assert largest[1] > 10 * largest[0]             # the factors really are unbalanced


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("order", [1, 2, "exact"])
def test_float64_invariance_up_to_condition_1e5(metric, order) -> None:
    model = _bert(32, torch.float64)
    moved = _reparametrised(model, 1e5, seed=1)
    n_iter = 4 if order == "exact" else 10
    change, norm = _relative_change(model, moved, metric=metric, order=order, n_iter=n_iter)
    assert change < 1e-6, change
    assert norm <= 0.1 * (1 + 1e-12)


@pytest.mark.parametrize("metric", ["inv", "mix"])
@pytest.mark.parametrize("order", [1, 2])
def test_float32_invariance_up_to_condition_1e3(metric, order) -> None:
    model = _bert(32, torch.float32)
    moved = _reparametrised(model, 1e3, seed=2)
    change, norm = _relative_change(model, moved, metric=metric, order=order, n_iter=10)
    assert change < 1e-3, change
    assert norm <= 0.1 * (1 + 1e-6)
