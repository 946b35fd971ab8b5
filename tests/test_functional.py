"""The functional model (``quotientsharp.engine.functional``) names what makes a clean loss
non-finite (ignored labels, an empty batch, NaN in a buffer or an input) and token ids
outside the model's vocabulary, with the batch they are in.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quotientsharp as qs

#: these tests measure small MLPs without symmetry: the warning that says so is
#: expected here (tests/test_symmetry_check.py checks it)
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


def _adaptive(model, batches, **options):
    settings = {"measure": "adaptive", "rho": 0.1, "n_iter": 3, "progress": False, **options}
    return qs.sharpness(model, batches, **settings)


@pytest.mark.parametrize("case", ["all labels ignored", "empty batch", "nan buffer",
                                  "nan input"])
def test_a_non_finite_clean_loss_names_its_cause(mlp_and_batches, case):
    net, batches = mlp_and_batches
    (x, y), second = batches[0], batches[1]
    if case == "nan buffer":
        net = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
        net[1].running_mean[2] = math.nan
    bad = {"all labels ignored": (x, torch.full_like(y, -100)), "empty batch": (x[:0], y[:0]),
           "nan buffer": second, "nan input": (x * math.nan, y)}[case]
    expected = {"all labels ignored": r"batch 1: every label is -100",
                "empty batch": r"batch 1 is empty",
                "nan buffer": r"buffer\(s\) \['1.running_mean'\] contain NaN",
                "nan input": r"clean loss on batch 1 is not finite \(nan\): the input\(s\) "
                             r"\['input 0'\] contain NaN"}[case]
    with pytest.raises(ValueError, match=expected):
        _adaptive(net, [batches[0], bad])


def test_clean_loss_cause_for_a_custom_loss_that_ignores_every_label(mlp_and_batches):
    net, batches = mlp_and_batches
    x, y = batches[0]
    with pytest.raises(ValueError, match="batch 0 is not finite .*every label is -100"):
        _adaptive(net, [(x, torch.full_like(y, -100))],
                  loss=lambda out, target: F.cross_entropy(out, target))


class _Embedding(nn.Module):
    """A token classifier with HuggingFace's ``get_input_embeddings``."""

    def __init__(self, vocabulary: int = 10) -> None:
        super().__init__()
        self.embedding, self.head = nn.Embedding(vocabulary, 4), nn.Linear(4, 3)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(input_ids).mean(1))


def test_token_ids_outside_the_vocabulary_name_the_batch():
    torch.manual_seed(0)
    model = _Embedding(10)
    ids = torch.randint(0, 10, (4, 6))
    y = torch.randint(0, 3, (4,))
    assert math.isfinite(_adaptive(model, [({"input_ids": ids}, y)]).value)
    with pytest.raises(ValueError, match=r"^batch 1: input_ids holds token id 1[0-4], outside "
                                         r"the model's vocabulary \[0, 10\)"):
        _adaptive(model, [({"input_ids": ids}, y), ({"input_ids": ids + 5}, y)])
    with pytest.raises(ValueError, match="token id -1"):
        _adaptive(model, [{"input_ids": ids - 1, "labels": y}])
    with pytest.raises(ValueError, match=r"^batch 0: input 0 holds token id 1[0-9], outside"):
        _adaptive(model, [(ids + 10, y)])              # positional token ids


def test_token_ids_outside_a_bert_vocabulary():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=8, vocab_size=20, num_labels=2,
                                     max_position_embeddings=8, attn_implementation="eager")
    model = transformers.BertForSequenceClassification(config)
    batch = {"input_ids": torch.tensor([[1, 2, 20]]), "labels": torch.tensor([1])}
    with pytest.raises(ValueError, match=r"batch 0: input_ids holds token id 20.*\[0, 20\)"):
        _adaptive(model, [batch])


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _batches(n: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(12, 4, generator=generator),
             torch.randint(0, 3, (12,), generator=generator)) for _ in range(n)]


def _measure(model, batches, measure="worst_case", **options):
    settings = {"rho": 0.1, "n_iter": 3, "progress": False, **options}
    if measure == "average":
        settings.pop("n_iter")
    return qs.sharpness(model, batches, measure=measure, **settings)


def _bert_batch(dtype=torch.int64):
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 40, (4, 7), generator=generator)
    return {"input_ids": ids.to(dtype), "attention_mask": torch.ones(4, 7, dtype=torch.int64),
            "labels": torch.randint(0, 3, (4,), generator=generator)}


def test_an_attention_mask_of_the_wrong_shape_is_refused(bert):
    batch = _bert_batch()
    batch["attention_mask"] = torch.ones(4, 9, dtype=torch.int64)   # all ones, dropped by HF
    with pytest.raises(ValueError, match=r"attention_mask has shape \(4, 9\) but input_ids "
                                         r"has shape \(4, 7\)"):
        _measure(bert, [batch], "geodesic", n_iter=2)


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.table, self.head = nn.Embedding(10, 4), nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids).mean(1))


def _ids(low=0, high=10):
    generator = torch.Generator().manual_seed(5)
    return (torch.randint(low, high, (6, 5), generator=generator),
            torch.randint(0, 3, (6,), generator=generator))


@pytest.mark.parametrize("shift, token", [(10, "token id 1[0-9]"), (-10, "token id -")])
def test_ids_outside_a_custom_embedding_are_named(shift, token):
    ids, labels = _ids()
    with pytest.raises(ValueError, match=f"batch 0: input 0 holds {token}.*vocabulary \\[0, 10\\)"):
        _measure(Bag(), [(ids + shift, labels)])


def test_meta_device_model_buffers_and_batches_are_named():
    with torch.device("meta"):
        model = _mlp()
    with pytest.raises(ValueError, match=r"\['0.weight'.*meta device"):
        _measure(model, _batches())
    with_buffer = _mlp()
    with_buffer.register_buffer("scale", torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match=r"\['scale'\].*meta device"):
        _measure(with_buffer, _batches())
    x, y = _batches()[0]
    with pytest.raises(ValueError, match="batch 0's inputs holds a tensor on the meta device"):
        _measure(_mlp(), [(x.to("meta"), y)])
    with pytest.raises(ValueError, match="batch 0's target holds a tensor on the meta device"):
        _measure(_mlp(), [(x, y.to("meta"))])


class InfScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([1.0, math.inf, 1.0]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) * self.scale


def test_inf_in_a_non_persistent_buffer_is_named():
    with pytest.raises(ValueError, match=r"clean loss on batch 0 is not finite.*buffer\(s\) "
                                         r"\['scale'\] contain inf"):
        _measure(InfScale(), _batches())


def test_raw_torch_errors_of_the_forward_name_the_inputs():
    x, y = _batches()[0]
    with pytest.raises(ValueError, match=r"batch 0: the model's forward failed on inputs "
                                         r"\{input 0: \(12, 5\) float32\}.*mat1 and mat2"):
        _measure(_mlp(), [(torch.randn(12, 5), y)])
    with pytest.raises(ValueError, match=r"input 0: \(12, 4\) int64\} \(parameters float32\)"):
        _measure(_mlp(), [(x.long(), y)], "average")


class TwoTables(nn.Module):
    """Word and kind embeddings, each indexed by its own input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.words, self.kinds = nn.Embedding(10, 4), nn.Embedding(3, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
        return self.head((self.words(ids) + self.kinds(kinds)).mean(1))


@pytest.mark.parametrize("touched_rows", [True, False])
@pytest.mark.parametrize("words_shift, kinds_shift, named", [
    (0, 3, r"input 1 holds index [3-5], outside the embedding table 'kinds' \(rows \[0, 3\)\)"),
    (0, -3, r"input 1 holds index -[1-3], outside the embedding table 'kinds' \(rows \[0, 3\)\)"),
    (-10, 0, r"input 0 holds index -[1-9]0?, outside the embedding table 'words' "
             r"\(rows \[0, 10\)\)"),
])
def test_ids_outside_one_of_several_tables_name_the_table_and_input(words_shift, kinds_shift,
                                                                    named, touched_rows):
    ids, labels = _ids()
    kinds = torch.remainder(ids, 3)
    with pytest.raises(ValueError, match=f"batch 0: .*{named}"):
        _measure(TwoTables(), [((ids + words_shift, kinds + kinds_shift), labels)],
                 touched_rows=touched_rows)


@pytest.mark.parametrize("token_type", [2, -1])
def test_token_type_ids_outside_bert_name_the_token_type_table(bert, token_type):
    batch = _bert_batch()
    batch["token_type_ids"] = torch.full_like(batch["input_ids"], token_type)
    with pytest.raises(ValueError, match=f"token_type_ids holds index {token_type}, outside the "
                                         r"embedding table 'bert.embeddings.token_type_embeddings"
                                         r"' \(rows \[0, 2\)\)"):
        _measure(bert, [batch], "geodesic", n_iter=2)


class RunningCentre(nn.Module):
    """Centres its hidden units by a running mean that every forward updates in place,
    whatever the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(4, 6), nn.Linear(6, 3)
        self.register_buffer("centre", torch.zeros(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.hidden(x)
        with torch.no_grad():
            self.centre.mul_(0.5).add_(0.5 * h.mean(0))
        return self.out(h - self.centre)


@pytest.mark.parametrize("measure", ["worst_case", "average"])
def test_a_forward_that_writes_its_buffers_is_refused_naming_them(measure):
    # the clones every evaluation shares would drift: the same batch twice gave two values
    torch.manual_seed(0)
    model = RunningCentre()
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"batch 0: the model's forward wrote to its "
                                         r"buffer\(s\) \['centre'\] in eval mode"):
        _measure(model, _batches(1) * 2, measure=measure)
    assert all(torch.equal(state[name], tensor) for name, tensor in model.state_dict().items())


def test_a_forward_that_reads_its_buffers_only_is_measured():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    result = _measure(model, _batches(1) * 2)
    assert result.per_batch[0] == result.per_batch[1]


class _ScalesItsInput(nn.Module):
    """Scales its input in place before the layers (a normalisation written with ``mul_``)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.9)
        return self.layers(x)


@pytest.mark.parametrize("model", [_ScalesItsInput, lambda: nn.Sequential(nn.ReLU(inplace=True),
                                                                          _mlp())])
def test_a_forward_that_writes_its_inputs_is_refused_and_the_batch_set_back(model):
    # each evaluation saw the inputs the one before left (0.9 ** evaluations), and the caller's
    # batch came back scaled or clamped
    x, y = _batches(1)[0]
    kept = x.clone()
    with pytest.raises(ValueError, match=r"batch 0: the model's forward wrote to its "
                                         r"input\(s\) \['input 0'\] in place"):
        _measure(model(), [(x, y)])
    assert torch.equal(x, kept)


def test_inputs_with_nan_are_not_taken_for_written_ones():
    x, y = _batches(1)[0]
    x[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"the clean loss on batch 0 is not finite .* the "
                                         r"input\(s\) \['input 0'\] contain NaN"):
        _measure(_mlp(), [(x, y)])
