"""Shared test configuration, and the fixtures that test files of several units share."""

from pathlib import Path

import pytest
import torch
from torch import nn

# The suite's tensors are tiny: with several threads, each small LAPACK call pays thread
# start-up costs that dominate (measured ~3 ms against 0.004 ms per call on 2 loaded cores).
torch.set_num_threads(1)


def _mlp(widths=(5, 8, 3), activation=nn.Tanh) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), activation()]
    return nn.Sequential(*layers[:-1])


@pytest.fixture
def mlp_and_batches() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A small tanh MLP (5 -> 8 -> 3) and two batches of 6 inputs with class labels in [0, 3)."""
    torch.manual_seed(0)
    net = _mlp()
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 5, generator=generator), torch.randint(0, 3, (6,),
                                                                        generator=generator))
               for _ in range(2)]
    return net, batches


@pytest.fixture(scope="module")
def bert():
    """A tiny random BERT classifier (hidden size 16, one layer, vocabulary 40, 3 labels)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        vocab_size=40, max_position_embeddings=16, num_labels=3, pad_token_id=0,
        attn_implementation="eager", initializer_range=0.3)
    return transformers.BertForSequenceClassification(config).eval()


def _seeded_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


@pytest.fixture(scope="module")
def study_files(tmp_path_factory) -> Path:
    """A folder of three saved MLPs (``net0.pt``..``net2.pt``), their data (``data.pt``) and a
    manifest (``models.csv``) with made-up gaps."""
    root = tmp_path_factory.mktemp("campaign2")
    for index in range(3):
        torch.save(_seeded_mlp(index), root / f"net{index}.pt")
    generator = torch.Generator().manual_seed(0)
    torch.save((torch.randn(12, 4, generator=generator),
                torch.randint(0, 3, (12,), generator=generator)), root / "data.pt")
    (root / "models.csv").write_text("model,gap\n" + "".join(
        f"net{i}.pt,{0.1 * (i + 1)}\n" for i in range(3)))
    return root


@pytest.fixture(scope="module")
def saved_mlp(tmp_path_factory) -> dict[str, Path]:
    """A saved tanh MLP (5 -> 8 -> 3, ``net.pt``) and 8 inputs with labels (``data.pt``)."""
    root = tmp_path_factory.mktemp("bad-inputs")
    torch.manual_seed(0)
    torch.save(_mlp(), root / "net.pt")
    generator = torch.Generator().manual_seed(0)
    torch.save((torch.randn(8, 5, generator=generator),
                torch.randint(0, 3, (8,), generator=generator)), root / "data.pt")
    return {"root": root, "net": root / "net.pt", "data": root / "data.pt"}
