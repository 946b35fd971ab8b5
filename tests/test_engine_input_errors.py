"""Inputs the engine refuses or diagnoses before measuring: batches that hold data which is not
a tensor, keys the model's forward does not take, a non-finite loss or gradient at theta, labels
of the wrong shape, a symmetry report of another model, options that are not a mapping.

Each error names what is wrong (the batch, the input or key, the parameter) and is raised
before the model runs where it can be; the expected messages are written out here, never
imported.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quotientsharp as qs
from quotientsharp.engine.measures import NonFiniteLossError
from tests.tiny_models import tiny_bart, tiny_bert

#: these tests measure small MLPs without symmetry: the warning that says so is expected here
pytestmark = pytest.mark.filterwarnings("ignore::quotientsharp.NoSymmetryWarning")


class _Counting(nn.Module):
    """An MLP that counts its forwards (the errors below come before the first)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.calls = 0

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.calls += 1
        return self.net(x) * scale


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 4, generator=generator), torch.randint(0, 3, (6,), generator=generator)


def _adaptive(model: nn.Module, batches: list, **options: object) -> qs.SharpnessResult:
    settings = {"rho": 0.1, "n_iter": 2, "reach": False, "progress": False, **options}
    return qs.sharpness(model, batches, measure="adaptive", **settings)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("form", ["numpy pair", "nested list pair", "numpy in a tuple",
                                  "list in a dict", "numpy in a dict batch", "list 1-d"])
def test_inputs_that_are_not_tensors_are_named_before_the_model_runs(form: str,
                                                                     seed: int) -> None:
    model = _Counting(seed)
    x, y = _data(seed)
    batch, expected = {
        "numpy pair": ((x.numpy(), y), r"input 0 is a numpy\.ndarray of shape \(6, 4\)"),
        "nested list pair": ((x.tolist(), y),
                             r"the inputs are a Python list of float values \(nested, shape "
                             r"\[6, 4\]\)"),
        "numpy in a tuple": (((x, x.numpy()), y), r"input 1 is a numpy\.ndarray"),
        "list in a dict": (({"x": x.tolist()}, y), r"input 'x' is a Python list"),
        "numpy in a dict batch": ({"x": x.numpy(), "labels": y}, r"input 'x' is a numpy"),
        "list 1-d": (((x, [1.0, 2.0]), y), r"input 1 is a Python list of float values"),
    }[form]
    with pytest.raises(TypeError, match=rf"^batch 0: {expected}.*not a tensor"):
        _adaptive(model, [batch])
    assert model.calls == 0


def test_inputs_that_are_flags_or_lists_of_tensors_still_pass() -> None:
    model = _Counting(0)
    x, y = _data(0)
    # a float keyword argument is a setting, not data: measured as given
    plain = _adaptive(model, [(x, y)]).value
    assert _adaptive(model, [({"x": x, "scale": 1.0}, y)]).value == plain
    assert _adaptive(model, [((x,), y)]).value == plain


def _bert(seed: int):
    pytest.importorskip("transformers")
    model = tiny_bert(seed)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30, (4, 6), generator=generator)
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[:, 4:], ids[:, 4:] = 0, 0          # padded: the mask changes the outputs
    return model, ids, mask, torch.randint(0, 3, (4,), generator=generator)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_bert_batch_with_python_lists_names_the_key(seed: int) -> None:
    model, ids, mask, y = _bert(seed)
    with pytest.raises(TypeError, match=r"^batch 0: input 'input_ids' is a Python list of int "
                                        r"values \(nested, shape \[4, 6\]\), not a tensor"):
        _adaptive(model, [{"input_ids": ids.tolist(), "attention_mask": mask, "labels": y}])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_misspelt_key_is_refused_with_the_closest_name(seed: int) -> None:
    model, ids, mask, y = _bert(seed)
    masked = _adaptive(model, [{"input_ids": ids, "attention_mask": mask, "labels": y}]).value
    unmasked = _adaptive(model, [{"input_ids": ids, "labels": y}]).value
    assert masked != unmasked           # the key matters: ignoring it changes the value
    with pytest.raises(ValueError, match=r"^batch 0: input 'attention_masks' is not a parameter "
                                         r"of BertForSequenceClassification\.forward \(did you "
                                         r"mean 'attention_mask'\?\); its \*\*kwargs would"):
        _adaptive(model, [{"input_ids": ids, "attention_masks": mask, "labels": y}])


class _Keyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                **extra: object) -> torch.Tensor:
        return self.layer(x if mask is None else x * mask)


class _Anything(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 3)

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        return self.layer(kwargs["x"])


@pytest.mark.parametrize("key, close", [("maks", "mask"), ("X", "x"), ("weights", None)])
def test_keys_are_checked_against_the_forwards_named_parameters(key: str,
                                                                close: str | None) -> None:
    x, y = _data(2)
    hint = rf" \(did you mean '{close}'\?\)" if close else ""
    with pytest.raises(ValueError, match=rf"^batch 1: input '{key}' is not a parameter of "
                                         rf"_Keyword\.forward{hint}; its \*\*kwargs would take "
                                         r"it and ignore it; its parameters: x, mask$"):
        _adaptive(_Keyword(), [({"x": x}, y), ({"x": x, key: torch.ones(4)}, y)])
    # a forward with no named parameter takes any key: nothing to check against
    assert _adaptive(_Anything(), [({"x": x}, y)]).value > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_non_finite_loss_with_finite_outputs_blames_the_loss(seed: int) -> None:
    model = _Counting(seed)
    x, y = _data(seed)

    def nan_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target) * float("nan")

    with pytest.raises(ValueError, match=r"^the clean loss on batch 0 is not finite \(nan\): "
                                         r"the loss function \(nan_loss\) returned a non-finite "
                                         r"value at theta although the model's output there is "
                                         r"finite"):
        _adaptive(model, [(x, y)], loss=nan_loss)
    # an output that overflows is still the model's
    with pytest.raises(ValueError, match=r"the model's output at the unperturbed parameters is "
                                         r"not finite"):
        _adaptive(model, [({"x": x, "scale": 1e39}, y)])


@pytest.mark.parametrize("nonfinite", ["raise", "skip"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_non_finite_gradient_at_theta_is_named_with_its_parameters(seed: int,
                                                                     nonfinite: str) -> None:
    model = _Counting(seed)
    x, y = _data(seed)

    def kinked(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # finite at theta (sqrt(0) = 0), its derivative there is not
        return F.cross_entropy(output, target) + 0 * torch.sqrt(output - output).sum()

    with pytest.raises(NonFiniteLossError) as error:
        _adaptive(model, [(x, y)], rho=1e-4, loss=kinked, nonfinite=nonfinite)
    message = str(error.value)
    assert ("likely cause: the gradient of the loss at theta, before any perturbation, is not "
            "finite (NaN or inf) in parameter(s) ['net.0.weight', 'net.0.bias', 'net.2.weight', "
            "'net.2.bias']") in message
    assert "too large" not in message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_labels_of_the_wrong_shape_are_reported_before_their_range(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 6, 4, generator=generator)
    y = torch.randint(0, 7, (3, 5), generator=generator)
    y[0, 0] = 6         # in range of the 7 classes, not of the 6 positions
    with pytest.raises(ValueError, match=r"^batch 0: the model's output has shape \(3, 6, 7\) "
                                         r"\(3 rows of 7 class scores\) but the labels have "
                                         r"shape \(3, 5\)"):
        qs.sharpness(nn.Linear(4, 7), [(x, y)], measure="adaptive", rho=0.1, progress=False)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x, x, x, need_weights=False)[0].mean(1))


def test_a_symmetry_report_of_another_model_is_named() -> None:
    model = _Attention()
    batches = [(torch.randn(4, 5, 8), torch.randint(0, 3, (4,)))]
    other = qs.find_symmetries(_Counting(0))
    with pytest.raises(ValueError, match=r"^symmetries: the SymmetryReport belongs to another "
                                         r"model \(made for class _Counting, this model's class "
                                         r"is _Attention\): this model has no parameter\(s\) "
                                         r"\['net\.0\.weight'"):
        qs.sharpness(model, batches, measure="geodesic", rho=0.1, progress=False,
                     symmetries=other)
    own = qs.find_symmetries(model)
    model.head.bias.requires_grad_(False)
    with pytest.raises(ValueError, match=r"^symmetries: the SymmetryReport was made before "
                                         r"requires_grad changed on parameter\(s\) "
                                         r"\['head\.bias'\]"):
        qs.sharpness(model, batches, measure="geodesic", rho=0.1, progress=False,
                     symmetries=own)


@pytest.mark.parametrize("options", [[1], ("n_iter", 3), "n_iter=3", 3])
def test_measure_options_must_be_a_mapping(options: object) -> None:
    with pytest.raises(TypeError, match=r"^options must be a mapping of option names to values "
                                        rf"\(a dict\), got {type(options).__name__}"):
        qs.measure_from("adaptive", 0.1, options)      # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^options: option names must be strings, got \[1\]"):
        qs.measure_from("adaptive", 0.1, {1: 3})        # type: ignore[dict-item]


def test_numpy_targets_are_still_the_losss_to_judge() -> None:
    # the check is on the inputs: a target goes to the loss, which may take any type
    x, y = _data(0)
    seen = []

    def loss(output: torch.Tensor, target: object) -> torch.Tensor:
        seen.append(type(target))
        return F.cross_entropy(output, torch.as_tensor(target))

    _adaptive(_Counting(0), [(x, y.numpy())], loss=loss)
    assert seen and all(kind is np.ndarray for kind in seen)


# peft calls a transformers property that transformers deprecates (neither is ours)
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_a_lora_wrapper_takes_the_keys_of_the_model_it_wraps() -> None:
    peft = pytest.importorskip("peft")
    bert, ids, mask, y = _bert(0)
    model = peft.get_peft_model(bert, peft.LoraConfig(r=2, target_modules=["query", "value"],
                                                      task_type="SEQ_CLS"))
    # PEFT's forward names no token_type_ids: its **kwargs pass them on to the BERT
    types = torch.zeros_like(ids)
    assert _adaptive(model, [{"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
                              "labels": y}]).value > 0
    with pytest.raises(ValueError, match=r"^batch 0: input 'token_type_id' is not a parameter of "
                                         r"PeftModelForSequenceClassification\.forward \(and "
                                         r"BertForSequenceClassification\.forward, which its "
                                         r"\*\*kwargs reach\) \(did you mean 'token_type_ids'"):
        _adaptive(model, [{"input_ids": ids, "token_type_id": types, "labels": y}])


def _tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=40, n_positions=16,
                                     bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).eval()


def test_unshifted_labels_of_a_causal_language_model_are_refused():
    # HuggingFace's convention labels = input_ids is shifted inside the model's own loss; the
    # built-in cross-entropy compares position by position and measured "predict each token
    # from itself" without a word
    model = _tiny_gpt2()
    ids = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(1))
    partly = ids.clone()
    partly[:, :3] = -100
    shifted = torch.full_like(ids, -100)
    shifted[:, :-1] = ids[:, 1:]
    good = {"input_ids": ids, "labels": shifted}
    forms = [(0, {"input_ids": ids, "labels": ids}), (1, {"input_ids": ids, "labels": partly}),
             (0, (ids, ids))]          # the (inputs, target) form: input_ids positional
    for index, batch in forms:
        batches = [good] * index + [batch]
        with pytest.raises(ValueError, match=rf"^batch {index}: the labels equal input_ids for "
                           "GPT2LMHeadModel, a causal language model: .*labels\\[:, -1\\] = -100"):
            qs.sharpness(model, batches, "adaptive", rho=0.01, n_iter=1)
    # labels shifted by hand are measured, and the clean loss is the model's own loss
    result = qs.sharpness(model, [good], "adaptive", rho=0.01, n_iter=1)
    with torch.no_grad():
        own = model(input_ids=ids, labels=ids).loss
    assert result.clean_losses[0] == pytest.approx(float(own), rel=1e-6)


def test_labels_of_an_encoder_decoder_without_decoder_inputs_are_refused():
    # BART's forward without decoder_input_ids feeds its decoder input_ids shifted right, not
    # the labels: the loss was position-wise cross-entropy of another sequence, without a word
    pytest.importorskip("transformers")
    model = tiny_bart(40, 16)
    draw = torch.Generator().manual_seed(1)
    ids, labels = (torch.randint(3, 40, (3, 8), generator=draw) for _ in range(2))
    decoder = model.prepare_decoder_input_ids_from_labels(labels=labels)
    good = {"input_ids": ids, "decoder_input_ids": decoder, "labels": labels}
    for index, batch in [(0, {"input_ids": ids, "labels": labels}),
                         (1, {"input_ids": ids, "labels": labels})]:
        with pytest.raises(ValueError, match=rf"^batch {index}: BartForConditionalGeneration is "
                           "an encoder-decoder, and the batch has labels but no "
                           "decoder_input_ids: .*prepare_decoder_input_ids_from_labels"):
            qs.sharpness(model, [good] * index + [batch], "adaptive", rho=0.01, n_iter=1)
    # a NaN in the decoder's mask is read as "attend" as in the encoder's
    masked = {**good, "decoder_attention_mask": torch.ones(labels.shape)}
    masked["decoder_attention_mask"][0, 2] = math.nan
    with pytest.raises(ValueError, match=r"^batch 0: decoder_attention_mask holds nan at "
                                         r"\(0, 2\)"):
        qs.sharpness(model, [masked], "adaptive", rho=0.01, n_iter=1)
    # with the decoder's inputs given, the clean loss is the model's own (teacher-forced) loss
    result = qs.sharpness(model, [good], "adaptive", rho=0.01, n_iter=1)
    with torch.no_grad():
        own = model(input_ids=ids, labels=labels).loss
    assert result.clean_losses[0] == pytest.approx(float(own), rel=1e-6)


def test_labels_equal_to_the_inputs_of_a_model_that_does_not_shift_are_measured():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=40,
                                     max_position_embeddings=16, attn_implementation="eager")
    model = transformers.BertForMaskedLM(config).eval()     # its own loss does not shift
    ids = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(1))
    result = qs.sharpness(model, [{"input_ids": ids, "labels": ids}], "adaptive", rho=0.01,
                          n_iter=1)
    with torch.no_grad():
        own = model(input_ids=ids, labels=ids).loss
    assert result.clean_losses[0] == pytest.approx(float(own), rel=1e-6)


@pytest.mark.parametrize("value", [2, -1])
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_an_attention_mask_of_other_values_than_0_and_1_is_refused(value, dtype) -> None:
    # this version of transformers attends a 2 like a 1, others mask it (1 - mask < 0): the
    # value would depend on the version
    model, ids, mask, y = _bert(0)
    mask = mask.to(dtype)
    mask[1, 0] = value
    with pytest.raises(ValueError, match=rf"^batch 0: attention_mask holds the value {value}; "
                                         r"its entries must be 1 \(a token\) or 0"):
        _adaptive(model, [{"input_ids": ids, "attention_mask": mask, "labels": y}])


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_float_attention_mask_that_is_not_finite_is_refused(value) -> None:
    # transformers read the NaN as "attend": the value was that of an all-ones mask
    model, ids, mask, y = _bert(0)
    clean = mask.float()
    mask = clean.clone()
    mask[1, 2] = value
    with pytest.raises(ValueError, match=rf"^batch 1: attention_mask holds {value} at \(1, 2\); "
                                         r"a floating mask must be finite"):
        _adaptive(model, [{"input_ids": ids, "attention_mask": clean, "labels": y},
                          {"input_ids": ids, "attention_mask": mask, "labels": y}])


def test_an_additive_mask_may_hold_minus_inf_but_not_nan() -> None:
    # -inf is "masked" in an additive (4-D) mask, the model's own format, which the check of a
    # 2-D mask's shape against input_ids refused; only a NaN or +inf is corrupt there
    model, ids, mask, y = _bert(0)
    additive = torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1])
    additive.masked_fill_(mask[:, None, None, :] == 0, -math.inf)
    plain = _adaptive(model, [{"input_ids": ids, "attention_mask": mask, "labels": y}])
    four = _adaptive(model, [{"input_ids": ids, "attention_mask": additive, "labels": y}])
    assert four.clean_losses == plain.clean_losses
    additive[0, 0, 1, 1] = math.nan
    with pytest.raises(ValueError, match=r"^batch 0: attention_mask holds nan at \(0, 0, 1, 1\)"):
        _adaptive(model, [{"input_ids": ids, "attention_mask": additive, "labels": y}])


@pytest.mark.parametrize("dtype", [torch.long, torch.bool])
def test_a_sequence_without_a_token_is_refused(dtype) -> None:
    # BERT masks nothing in a row of zeros (every position attends to the padding): the value
    # equalled the unmasked one, without a word
    model, ids, mask, y = _bert(0)
    mask = mask.to(dtype)
    mask[2] = 0
    with pytest.raises(ValueError, match=r"^batch 0: attention_mask is all zeros in row\(s\) "
                                         r"\[2\]: a sequence without a single token"):
        _adaptive(model, [{"input_ids": ids, "attention_mask": mask, "labels": y}])
    mask[2, 0] = 1                      # one token is enough
    assert math.isfinite(_adaptive(model, [{"input_ids": ids, "attention_mask": mask,
                                            "labels": y}]).value)


@pytest.mark.parametrize("seed", [0, 1])
def test_an_inf_input_behind_a_non_finite_gradient_is_named(seed: int) -> None:
    # tanh turns the inf into a finite loss, but the weight's gradient is 0 * inf = NaN: the
    # message blamed the loss ("a sqrt, log or division at 0?") and not the data
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = _data(seed)
    x[2, 1] = float("inf")
    with pytest.raises(NonFiniteLossError) as error:
        _adaptive(model, [(x, y)])
    message = str(error.value)
    assert ("in parameter(s) ['0.weight']: the input(s) ['input 0'] contain NaN or inf, which "
            "the forward turns into a finite loss but not into a finite gradient") in message
    assert "sqrt" not in message


@pytest.mark.parametrize("measure", ["adaptive", "average", "relative_flatness"])
def test_inference_mode_is_named_as_the_cause(measure):
    # under it no tensor records gradients: the measures said "no parameter is left to
    # perturb" or "receives no gradient"
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    batch = (torch.randn(5, 4), torch.randint(0, 3, (5,)))
    rho = None if measure == "relative_flatness" else 0.1
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"inside torch\.inference_mo"):
        qs.sharpness(model, [batch], measure, rho=rho, progress=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", qs.NoSymmetryWarning)
        assert math.isfinite(qs.sharpness(model, [batch], measure, rho=rho, progress=False).value)
