"""A model with ``nn.Embedding(sparse=True)`` is measured by every ascent measure.

The embedding's weight then receives a sparse gradient from the forward; the engine makes it
dense where it leaves the forward (the geometry and the solver have no sparse kernels), so the
value equals that of the same model with ``sparse=False``.
"""

from __future__ import annotations

import copy

import pytest
import torch

import quotientsharp as qs
from tests.tiny_models import tiny_bert_classifier

pytest.importorskip("transformers")

MEASURES = [
    pytest.param({"measure": "adaptive"}, id="adaptive"),
    pytest.param({"measure": "worst_case", "p": 2}, id="worst_case-p2"),
    pytest.param({"measure": "worst_case", "p": float("inf")}, id="worst_case-pinf"),
    pytest.param({"measure": "geodesic", "metric": "mix"}, id="geodesic-mix"),
    pytest.param({"measure": "geodesic", "metric": "inv"}, id="geodesic-inv"),
]


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    dense = tiny_bert_classifier().eval()
    sparse = copy.deepcopy(dense)
    sparse.bert.embeddings.word_embeddings.sparse = True
    return dense, sparse


def _batches() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [{"input_ids": torch.randint(0, 30, (4, 6), generator=generator),
             "labels": torch.randint(0, 3, (4,), generator=generator)} for _ in range(2)]


@pytest.mark.parametrize("options", MEASURES)
def test_sparse_embedding_measured_as_dense(models, options) -> None:
    dense, sparse = models
    # one ascent: the search's random starts lie on the touched rows of a dense table, which
    # a sparse table is not cut to, so its further chains start elsewhere
    values = [qs.sharpness(model, _batches(), rho=0.05, n_iter=4, progress=False, reach=False,
                           **options).per_batch for model in (dense, sparse)]
    assert values[1] == pytest.approx(values[0], rel=1e-9, abs=1e-12)
    assert all(torch.isfinite(torch.tensor(values[1])))
    assert sparse.bert.embeddings.word_embeddings.sparse       # the model is not changed
