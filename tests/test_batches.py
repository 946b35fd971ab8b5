"""The per-batch checks of ``quotientsharp.engine.batches``: labels and outputs that do not fit
the loss raise naming the batch; integer labels of any width measure the same.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.test_functional import _adaptive, _batches, _measure, _mlp

#: these tests measure small MLPs without symmetry: the warning that says so is
#: expected here (tests/test_symmetry_check.py checks it)
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


class _ArgmaxModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).argmax(-1)


@pytest.mark.parametrize("case", ["sizes differ", "label out of range", "float labels",
                                  "bool labels", "mse with class labels", "mse sizes differ",
                                  "integer output"])
def test_bad_batches_raise_naming_the_batch(mlp_and_batches, case):
    net, batches = mlp_and_batches
    x, y = batches[0]
    options = {}
    bad = {"sizes differ": (x, y[:4]), "label out of range": (x, y + 5),
           "float labels": (x, y.float()), "bool labels": (x, y.bool()),
           "mse with class labels": (x, y), "mse sizes differ": (x, torch.randn(4, 3)),
           "integer output": (x, y)}[case]
    if case.startswith("mse"):
        options["loss"] = "mse"
    if case == "integer output":
        net = _ArgmaxModel()
    error, expected = {
        "sizes differ": (ValueError, r"output has shape \(6, 3\).*labels have shape \(4,\)"),
        "label out of range": (ValueError, r"label [5-7] is out of range.*\[0, 3\)"),
        "float labels": (TypeError, r"float32 target of shape \(6,\).*loss='mse'"),
        "bool labels": (TypeError, "integer class labels"),
        "mse with class labels": (ValueError, r"loss='mse' got integer class labels"),
        "mse sizes differ": (ValueError, r"output \(6, 3\), target \(4, 3\)"),
        "integer output": (TypeError, r"dtype int64 .*not integer predictions"),
    }[case]
    index = 0 if case == "integer output" or case.startswith("mse") else 1
    with pytest.raises(error, match=f"^batch {index}: .*{expected}"):
        _adaptive(net, batches[:1] + [bad] if index else [bad], **options)


def test_integer_labels_of_any_width_measure_the_same(mlp_and_batches):
    net, batches = mlp_and_batches
    x, y = batches[0]
    assert _adaptive(net, [(x, y.int())]).value == _adaptive(net, [(x, y)]).value


def test_a_complex_loss_is_refused():
    def complex_loss(output, target):
        return F.cross_entropy(output, target).to(torch.complex64)

    with pytest.raises(TypeError, match="batch 0: the loss returned a complex tensor"):
        _measure(_mlp(), _batches(), loss=complex_loss)


@pytest.mark.parametrize("case", ["one dict batch", "one pair"])
def test_a_single_batch_passed_as_batches_says_so(mlp_and_batches, case):
    # a dict iterated gave its keys ("got str"), a pair its tensors ("got Tensor")
    net, batches = mlp_and_batches
    x, y = batches[0]
    given, error, expected = {
        "one dict batch": ({"input": x, "labels": y}, TypeError,
                           r"^batches must be an iterable of batches, got a dict \(keys "
                           r"\['input', 'labels'\]\): one batch\? pass \[batch\]"),
        "one pair": ((x, y), TypeError, r"^batch 0 must be .* got Tensor: .* was one \(x, y\) "
                                        r"pair passed as batches\? pass \[\(x, y\)\]"),
    }[case]
    with pytest.raises(error, match=expected):
        _adaptive(net, given)


def test_a_dict_batch_with_label_singular_names_the_key(mlp_and_batches):
    net, batches = mlp_and_batches
    x, y = batches[0]
    with pytest.raises(ValueError, match=r"keys: \['input', 'label'\]\); rename 'label' .* to "
                                         r"'labels'"):
        _adaptive(net, [{"input": x, "label": y}])


def test_integer_one_hot_labels_are_named_as_such(mlp_and_batches):
    # the error said "(6, 3) ... but the labels have shape (6, 3): the same number of examples?"
    net, batches = mlp_and_batches
    x, y = batches[0]
    one_hot = F.one_hot(y, 3)
    with pytest.raises(ValueError, match=r"^batch 0: the labels are integers of the output's own "
                                         r"shape \(6, 3\) \(one-hot labels\?\).*shape \(6,\)"):
        _adaptive(net, [(x, one_hot)])
    assert _adaptive(net, [(x, one_hot.argmax(-1))]).value == _adaptive(net, [(x, y)]).value


def _tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=20,
                                     n_positions=16, attn_implementation="eager",
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("legacy", [False, True])
def test_a_key_value_cache_input_is_refused_untouched(legacy):
    # the forward appended to the cache at every evaluation until a position left the table:
    # a raw IndexError from inside the forward, and the caller's cache grown
    model = _tiny_gpt2()
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(input_ids=ids[:, :6], use_cache=True).past_key_values
    if legacy:
        given = {"past_key_values": tuple((torch.zeros(2, 2, 6, 8),) * 2 for _ in range(1))}
    else:
        given = {"cache": cache}
    batch = {"input_ids": ids[:, 6:7], **given, "labels": ids[:, 7:8]}
    key = "past_key_values" if legacy else "cache"
    with pytest.raises(ValueError, match=rf"batch 0: input '{key}' is a key/value cache "
                                         r"\(\w+\): .* pass the whole sequence"):
        _adaptive(model, [batch])
    assert cache.get_seq_length() == 6


def test_real_valued_targets_are_not_read_as_class_probabilities(mlp_and_batches):
    net, batches = mlp_and_batches
    x, y = batches[0]
    real = torch.randn(y.shape[0], 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^batch 0: the targets are floating but not class "
                                         r"probabilities .*pass loss='mse'"):
        _adaptive(net, [(x, real)])
    # class probabilities (soft labels) are the cross-entropy's, and measure
    soft = F.softmax(real, dim=-1)
    assert _adaptive(net, [(x, soft)]).value > 0
    # half precision sums to 1 only to its rounding: accepted
    assert _adaptive(net, [(x, soft.half().float())]).value > 0


class _CacheReader(nn.Module):
    """Reads a second positional input as a cache object, as GPT-2 reads past_key_values."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor, past: object = None) -> torch.Tensor:
        if past is not None:
            past.get_seq_length()           # type: ignore[attr-defined]
        return self.layer(x)


def test_an_input_in_the_wrong_position_is_named_with_the_batch(mlp_and_batches):
    _, batches = mlp_and_batches
    x, y = batches[0]
    with pytest.raises(ValueError, match=r"^batch 0: the model's forward failed on inputs "
                                         r"\{input 0: .*input 1: .*AttributeError"):
        _adaptive(_CacheReader(), [((x, x), y)])
