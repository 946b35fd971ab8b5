"""Symmetry discovery, the parameter layout and reparametrisation (quotientsharp.models)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from torch import nn
from torch.func import functional_call

import quotientsharp as qs
from quotientsharp.cli import symmetries as models_cli
from quotientsharp.models import (
    AttentionPair,
    Coordinates,
    ParameterLayout,
    find_symmetries,
    reparametrize,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

DTYPES = [torch.bfloat16, torch.float32, torch.float64]


# ---------------------------------------------------------------------- models
def tiny_bert_config(**overrides):
    options = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=37, vocab_size=50, max_position_embeddings=20,
                   attn_implementation="eager")
    options.update(overrides)
    return transformers.BertConfig(**options)


def randomize(model, seed=0):
    """Perturb every parameter: default inits zero the biases, which would hide the bias rows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.parameters():
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64)
            tensor.add_((0.2 * noise).to(tensor.dtype))
    return model


def tiny_bert(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    model = transformers.BertModel(tiny_bert_config(), add_pooling_layer=False)
    return randomize(model.to(dtype).eval(), seed)


def tiny_vit(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=37, image_size=8, patch_size=4,
                                    attn_implementation="eager")
    return transformers.ViTModel(config, add_pooling_layer=False).to(dtype).eval()


def tiny_gpt2(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50,
                                     n_positions=16, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    return transformers.GPT2Model(config).to(dtype).eval()


def tiny_llama(dtype=torch.float64, seed=0, kv_heads=4):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=kv_heads, intermediate_size=37,
                                      vocab_size=50, bos_token_id=0, eos_token_id=0,
                                      initializer_range=0.3, attn_implementation="eager")
    return transformers.LlamaModel(config).to(dtype).eval()


def attention(q, k, v, heads):
    """Plain multi-head softmax attention on projected q, k, v ``[B, L, heads * d]``."""
    batch, length = q.shape[:2]
    q, k, v = (t.reshape(batch, t.shape[1], heads, -1).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, -1)


class GenericAttention(nn.Module):
    """q_proj/k_proj/v_proj/out_proj with a ``num_heads`` attribute; d_v may differ from d_k."""

    def __init__(self, embed, heads, key_dim, value_dim, bias=True):
        super().__init__()
        self.num_heads = heads
        self.q_proj = nn.Linear(embed, heads * key_dim, bias=bias)
        self.k_proj = nn.Linear(embed, heads * key_dim, bias=bias)
        self.v_proj = nn.Linear(embed, heads * value_dim, bias=bias)
        self.out_proj = nn.Linear(heads * value_dim, embed)

    def forward(self, x):
        return self.out_proj(attention(self.q_proj(x), self.k_proj(x), self.v_proj(x),
                                       self.num_heads))


class LegacyViTSelfAttention(nn.Module):
    def __init__(self, embed, heads):
        super().__init__()
        self.num_attention_heads = heads
        self.attention_head_size = embed // heads
        self.query, self.key, self.value = (nn.Linear(embed, embed) for _ in range(3))


class LegacyViTOutput(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.dense = nn.Linear(embed, embed)


class LegacyViTAttention(nn.Module):
    """The transformers 4.x ViT layout: ``attention.{query,key,value}`` + ``output.dense``."""

    def __init__(self, embed=12, heads=3):
        super().__init__()
        self.attention = LegacyViTSelfAttention(embed, heads)
        self.output = LegacyViTOutput(embed)

    def forward(self, x):
        inner = self.attention
        return self.output.dense(attention(inner.query(x), inner.key(x), inner.value(x),
                                           inner.num_attention_heads))


class FusedQKVAttention(nn.Module):
    """A layout no handler knows: one fused ``qkv`` Linear."""

    def __init__(self, embed=12, heads=3):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.proj(attention(q, k, v, self.heads))


class DiagonalNet(nn.Module):
    def __init__(self, size=6, extra=None):
        super().__init__()
        self.diagonal = True
        self.u = nn.Parameter(torch.randn(size))
        self.v = nn.Parameter(torch.randn(size))

    def forward(self, x):
        return x @ (self.u * self.v)


class MHAStack(nn.Module):
    """Self-attention blocks of different head dims (and kinds of MHA), batch_first."""

    def __init__(self, configs):
        super().__init__()
        self.blocks = nn.ModuleList(nn.MultiheadAttention(batch_first=True, **c) for c in configs)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x, x, x, need_weights=False)[0]
        return x


class CrossMHA(nn.Module):
    def __init__(self, embed=12, heads=3, kdim=5, vdim=7, bias=True):
        super().__init__()
        self.mha = nn.MultiheadAttention(embed, heads, kdim=kdim, vdim=vdim, bias=bias)
        self.kdim, self.vdim = kdim, vdim

    def forward(self, x):
        keys = x[..., : self.kdim] * 2 - 0.5
        values = x[..., : self.vdim].flip(-1)
        return self.mha(x, keys, values, need_weights=False)[0]


def mha(**options):
    return nn.MultiheadAttention(12, 3, **options)


# ---------------------------------------------------------------------- reference projections
def reference_projections(module):
    """(Wq, bq, Wk, bk, Wv, bv, Wo) in ``nn.Linear`` convention, read without the layout."""
    if isinstance(module, nn.MultiheadAttention):
        if module._qkv_same_embed_dim:
            wq, wk, wv = module.in_proj_weight.chunk(3)
        else:
            wq, wk, wv = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
        biases = module.in_proj_bias.chunk(3) if module.in_proj_bias is not None else (None,) * 3
        return wq, biases[0], wk, biases[1], wv, biases[2], module.out_proj.weight
    if hasattr(module, "c_attn"):  # GPT-2 Conv1D: y = x W + b, W = [in, out]
        wq, wk, wv = module.c_attn.weight.T.chunk(3)
        bq, bk, bv = module.c_attn.bias.chunk(3)
        return wq, bq, wk, bk, wv, bv, module.c_proj.weight.T
    inner = getattr(module, "self", None) or getattr(module, "attention", None)
    if inner is not None and hasattr(inner, "query"):
        q, k, v, o = inner.query, inner.key, inner.value, module.output.dense
    else:
        q, k, v = module.q_proj, module.k_proj, module.v_proj
        o = getattr(module, "o_proj", None) or module.out_proj
    return q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o.weight


def pair_factors(coords):
    """``(module, kind, head) -> (G, H)`` from coordinates."""
    found = {}
    for (g_stack, h_stack), pairs in zip(coords.gl, coords.gl_pairs, strict=True):
        for index, pair in enumerate(pairs):
            found[(pair.module, pair.kind, pair.head)] = (g_stack[index], h_stack[index])
    return found


def with_ones(x, has_bias):
    return torch.cat([x, torch.ones_like(x[..., :1])], -1) if has_bias else x


def projected(x, weight, bias, rows):
    out = x @ weight[rows].T
    return out + bias[rows] if bias is not None else out


def coordinates_of(model):
    report = find_symmetries(model)
    params = dict(model.named_parameters())
    layout = ParameterLayout(report, params)
    return report, layout, layout.to_coordinates(params)


def snapshot(model):
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_state_unchanged(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


# ---------------------------------------------------------------------- cases
# (factory, input maker, {module: (heads, (n, m, h) of qk or None, (n, m, h) of vo)})
def _text_input(dtype):
    return {"input_ids": torch.arange(14).reshape(2, 7) % 50}


def _image_input(dtype):
    return {"pixel_values": torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(3),
                                        dtype=torch.float32).to(dtype)}


def _sequence_input(width):
    def make(dtype):
        x = torch.randn(5, 2, width, generator=torch.Generator().manual_seed(4))
        return {"x": x.to(dtype)}
    return make


def _mha_input(dtype):
    x = torch.randn(5, 2, 12, generator=torch.Generator().manual_seed(5)).to(dtype)
    return {"query": x, "key": x, "value": x, "need_weights": False}


CASES = {
    "mha": (lambda: mha(), _mha_input, {"": (3, (13, 13, 4), (13, 12, 4))}),
    "mha_nobias": (lambda: mha(bias=False), _mha_input, {"": (3, (12, 12, 4), (12, 12, 4))}),
    "mha_zero_attn": (lambda: mha(add_zero_attn=True), _mha_input,
                      {"": (3, (13, 13, 4), (13, 12, 4))}),
    "mha_kdim_vdim": (lambda: CrossMHA(), _sequence_input(12),
                      {"mha": (3, (13, 6, 4), (8, 12, 4))}),
    "mha_kdim_vdim_nobias": (lambda: CrossMHA(bias=False), _sequence_input(12),
                             {"mha": (3, (12, 5, 4), (7, 12, 4))}),
    "bert": (tiny_bert, _text_input,
             {f"encoder.layer.{i}.attention": (4, (33, 33, 8), (33, 32, 8)) for i in range(2)}),
    "vit": (tiny_vit, _image_input,
            {f"layers.{i}.attention": (4, (33, 33, 8), (33, 32, 8)) for i in range(2)}),
    "gpt2": (tiny_gpt2, _text_input, {"h.0.attn": (4, (33, 33, 8), (33, 32, 8))}),
    "generic": (lambda: GenericAttention(12, 2, 5, 3), _sequence_input(12),
                {"": (2, (13, 13, 5), (13, 12, 3))}),
    "generic_nobias": (lambda: GenericAttention(12, 2, 5, 3, bias=False), _sequence_input(12),
                       {"": (2, (12, 12, 5), (12, 12, 3))}),
    "legacy_vit": (lambda: LegacyViTAttention(), _sequence_input(12),
                   {"": (3, (13, 13, 4), (13, 12, 4))}),
    "llama_rope": (tiny_llama, _text_input,
                   {"layers.0.self_attn": (4, (32, 32, 8, (8, "rotate_half")), (32, 32, 8))}),
}


def build(case, dtype=torch.float64, seed=0):
    factory, make_input, expected = CASES[case]
    torch.manual_seed(seed)
    model = randomize(factory().to(dtype).eval(), seed)
    return model, make_input(dtype), expected


def call(model, params, inputs):
    out = functional_call(model, params, args=(), kwargs=inputs) if params is not None \
        else model(**inputs)
    if isinstance(out, tuple):
        out = out[0]
    if hasattr(out, "last_hidden_state"):
        out = out.last_hidden_state
    return out


# ---------------------------------------------------------------------- discovery
@pytest.mark.parametrize("case", list(CASES))
def test_pairs_found_with_shapes(case):
    model, _, expected = build(case)
    report = find_symmetries(model)
    assert report.unknown == []
    assert [m.name for m in report.modules] == list(expected)
    wanted = []
    for module, (heads, qk, vo) in expected.items():
        for kind, shape in (("qk", qk), ("vo", vo)):
            if shape is not None:
                wanted += [AttentionPair(module, kind, head, *shape) for head in range(heads)]
    assert report.pairs == wanted
    assert report.gl_count == len(wanted)
    assert report.group_dimension == sum(
        p.h ** 2 if p.rotary is None else p.rotary[0] + (p.h - p.rotary[0]) ** 2 for p in wanted)
    covered = set(report.pair_parameters)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert set(report.other) == set(trainable) - covered
    assert "NOT understood" not in report.summary()


def test_rope_reduces_query_key_pairs_with_a_note():
    report = find_symmetries(tiny_llama())
    assert {(p.kind, p.rotary, p.group) for p in report.pairs} == {
        ("qk", (8, "rotate_half"), "GL(1,C)^4"), ("vo", None, "GL(8)")}
    assert any("rotary" in note and "rotate_half" in note for note in report.notes)
    assert "layers.0.self_attn.q_proj.weight" in report.pair_parameters
    assert report.group_dimension == 4 * 8 + 4 * 64
    assert "GL(1,C)^4" in report.summary()


@pytest.mark.parametrize("case", ["mha", "mha_nobias", "mha_kdim_vdim", "bert", "vit", "gpt2",
                                  "generic", "legacy_vit"])
def test_products_equal_the_attention_bilinear_forms(case):
    model, _, expected = build(case)
    _, _, coords = coordinates_of(model)
    factors = pair_factors(coords)
    generator = torch.Generator().manual_seed(1)
    for module_name, (heads, _, _) in expected.items():
        module = model.get_submodule(module_name)
        wq, bq, wk, bk, wv, bv, wo = reference_projections(module)
        head_k, head_v = wq.shape[0] // heads, wv.shape[0] // heads
        x = torch.randn(6, wq.shape[1], generator=generator, dtype=torch.float64)
        y = torch.randn(4, wk.shape[1], generator=generator, dtype=torch.float64)
        z = torch.randn(4, wv.shape[1], generator=generator, dtype=torch.float64)
        for head in range(heads):
            rows_k = slice(head * head_k, (head + 1) * head_k)
            rows_v = slice(head * head_v, (head + 1) * head_v)
            g, h = factors[(module_name, "qk", head)]
            scores = with_ones(x, bq is not None) @ g @ h.T @ with_ones(y, bk is not None).T
            reference = projected(x, wq, bq, rows_k) @ projected(y, wk, bk, rows_k).T
            torch.testing.assert_close(scores, reference, rtol=1e-12, atol=1e-12)
            g, h = factors[(module_name, "vo", head)]
            contribution = with_ones(z, bv is not None) @ g @ h.T
            reference = projected(z, wv, bv, rows_v) @ wo[:, rows_v].T
            torch.testing.assert_close(contribution, reference, rtol=1e-12, atol=1e-12)


def test_factors_reproduce_bert_attention_probabilities_and_output():
    model = tiny_bert()
    _, _, coords = coordinates_of(model)
    factors = pair_factors(coords)
    captured = {}
    attention_module = model.encoder.layer[1].attention
    attention_module.self.register_forward_pre_hook(
        lambda mod, args, kwargs: captured.update(x=args[0] if args else kwargs["hidden_states"]),
        with_kwargs=True)
    attention_module.self.register_forward_hook(
        lambda mod, args, out: captured.update(probabilities=out[1]))
    attention_module.output.dense.register_forward_hook(
        lambda mod, args, out: captured.update(dense=out))
    with torch.no_grad():
        model(input_ids=torch.arange(14).reshape(2, 7) % 50)
    x1 = with_ones(captured["x"], True)
    total = attention_module.output.dense.bias.detach().clone()
    for head in range(4):
        g, h = factors[("encoder.layer.1.attention", "qk", head)]
        probabilities = (x1 @ g @ h.T @ x1.mT / math.sqrt(8)).softmax(-1)
        torch.testing.assert_close(probabilities, captured["probabilities"][:, head],
                                   rtol=1e-12, atol=1e-12)
        g, h = factors[("encoder.layer.1.attention", "vo", head)]
        total = total + probabilities @ x1 @ g @ h.T
    torch.testing.assert_close(total, captured["dense"], rtol=1e-12, atol=1e-12)


def test_factors_reproduce_multihead_attention_weights_and_output():
    torch.manual_seed(0)
    module = nn.MultiheadAttention(12, 3, batch_first=True).double()
    _, _, coords = coordinates_of(module)
    factors = pair_factors(coords)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        out, weights = module(x, x, x, need_weights=True, average_attn_weights=False)
    x1 = with_ones(x, True)
    total = module.out_proj.bias.detach().clone()
    for head in range(3):
        g, h = factors[("", "qk", head)]
        probabilities = (x1 @ g @ h.T @ x1.mT / 2.0).softmax(-1)
        torch.testing.assert_close(probabilities, weights[:, head], rtol=1e-12, atol=1e-12)
        g, h = factors[("", "vo", head)]
        total = total + probabilities @ x1 @ g @ h.T
    torch.testing.assert_close(total, out, rtol=1e-12, atol=1e-12)


def test_unknown_attention_is_reported_and_left_plain():
    torch.manual_seed(0)
    model = nn.ModuleDict({
        "fused": FusedQKVAttention(),
        "bias_kv": nn.MultiheadAttention(12, 3, add_bias_kv=True),
        "grouped": GenericAttention(12, 2, 5, 3),
        "fine": nn.MultiheadAttention(12, 3),
    })
    model["grouped"].k_proj = nn.Linear(12, 5)  # one key head shared by both query heads
    report = find_symmetries(model)
    assert report.unknown == ["fused", "bias_kv", "grouped"]
    assert "add_bias_kv" in report.unknown_reasons["bias_kv"]
    assert "grouped" in report.unknown_reasons["grouped"]
    assert {p.module for p in report.pairs} == {"fine"}
    for name, _ in model.named_parameters():
        if not name.startswith("fine."):
            assert name in report.other
    summary = report.summary()
    assert "3 attention-like module(s) NOT understood" in summary
    for name in ("fused", "bias_kv", "grouped"):
        assert f"    {name}: " in summary


def test_frozen_parameters_are_excluded():
    model = tiny_bert()
    model.embeddings.requires_grad_(False)
    model.encoder.layer[0].attention.self.query.weight.requires_grad_(False)
    report = find_symmetries(model)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert set(report.frozen) == frozen
    layer0 = "encoder.layer.0.attention"
    assert [p.kind for p in report.pairs if p.module == layer0] == ["vo"] * 4
    assert [p.kind for p in report.pairs if p.module != layer0] == ["qk"] * 4 + ["vo"] * 4
    for name in (f"{layer0}.self.query.bias", f"{layer0}.self.key.weight",
                 f"{layer0}.self.key.bias"):
        assert name in report.other
    assert not frozen & set(report.other) and not frozen & set(report.pair_parameters)
    assert any("frozen" in note for note in report.notes)
    params = dict(model.named_parameters())
    layout = ParameterLayout(report, params)
    assert set(layout.names) == set(params) - frozen
    assert set(layout.to_parameters(layout.to_coordinates(params))) == set(params) - frozen
    assert report.frozen_parameter_count == sum(params[n].numel() for n in frozen)


def test_frozen_shared_bias_drops_both_mha_kinds():
    module = nn.MultiheadAttention(12, 3)
    module.in_proj_bias.requires_grad_(False)
    report = find_symmetries(module)
    assert report.pairs == [] and report.frozen == ["in_proj_bias"]
    assert report.other == ["in_proj_weight", "out_proj.weight", "out_proj.bias"]


def test_shared_projection_is_not_a_pair_of_either_module():
    torch.manual_seed(0)
    first, second = GenericAttention(12, 2, 5, 3), GenericAttention(12, 2, 5, 3)
    second.q_proj = first.q_proj  # tied weights: one GL action cannot serve both modules
    model = nn.ModuleDict({"first": first, "second": second})
    report = find_symmetries(model)
    assert [(p.module, p.kind) for p in report.pairs] == (
        [("first", "vo")] * 2 + [("second", "vo")] * 2)
    assert {"first.q_proj.weight", "first.k_proj.weight", "second.k_proj.weight"} <= set(
        report.other)
    assert any("shared" in note for note in report.notes)
    params = dict(model.named_parameters())
    layout = ParameterLayout(report, params)
    back = layout.to_parameters(layout.to_coordinates(params))
    assert all(torch.equal(back[n], params[n]) for n in params)


def test_several_head_dims_give_several_buckets():
    torch.manual_seed(0)
    model = MHAStack([dict(embed_dim=16, num_heads=2), dict(embed_dim=16, num_heads=4),
                      dict(embed_dim=16, num_heads=4), dict(embed_dim=16, num_heads=4,
                                                            bias=False)])
    report, layout, coords = coordinates_of(model)
    assert report.bucket_shapes == {(17, 17, 8): 2, (17, 16, 8): 2, (17, 17, 4): 8,
                                     (17, 16, 4): 8, (16, 16, 4): 8}
    assert layout.bucket_shapes == list(report.bucket_shapes)
    assert [tuple(g.shape) for g, _ in coords.gl] == [(2, 17, 8), (2, 17, 8), (8, 17, 4),
                                                     (8, 17, 4), (8, 16, 4)]
    assert [tuple(h.shape) for _, h in coords.gl] == [(2, 17, 8), (2, 16, 8), (8, 17, 4),
                                                     (8, 16, 4), (8, 16, 4)]
    assert [(p.module, p.head) for p in coords.gl_pairs[2]] == (
        [("blocks.1", i) for i in range(4)] + [("blocks.2", i) for i in range(4)])
    # stacking order: head 2 of blocks.2 sits at index 6 of its bucket
    weight = model.blocks[2].in_proj_weight
    torch.testing.assert_close(coords.gl[2][0][6][:16], weight[8:12].T, rtol=0, atol=0)


def test_diagonal_parameterisations():
    torch.manual_seed(0)
    model = nn.ModuleDict({"net": DiagonalNet(6), "attn": nn.MultiheadAttention(12, 3)})
    model.register_parameter("a", nn.Parameter(torch.randn(2, 3)))
    model.register_parameter("b", nn.Parameter(torch.randn(2, 3)))
    report = find_symmetries(model, diagonal=[("a", "b")])
    assert [(p.u_name, p.v_name, p.size) for p in report.diagonal] == [
        ("net.u", "net.v", 6), ("a", "b", 6)]
    assert report.diagonal_size == 12 and report.group_count == 6 + 12
    assert report.group_dimension == 6 * 16 + 12
    params = dict(model.named_parameters())
    layout = ParameterLayout(report, params)
    coords = layout.to_coordinates(params)
    torch.testing.assert_close(coords.diagonal[0], torch.cat([params["net.u"],
                                                              params["a"].reshape(-1)]),
                               rtol=0, atol=0)
    back = layout.to_parameters(coords)
    assert all(torch.equal(back[n], params[n]) for n in params)
    assert back["a"].shape == (2, 3)
    with pytest.raises(ValueError, match="diagonal"):
        find_symmetries(model, diagonal=[("a", "missing")])
    with pytest.raises(ValueError, match="diagonal"):
        find_symmetries(model, diagonal=[("a", "net.u")])


# ---------------------------------------------------------------------- layout
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["mha", "mha_kdim_vdim_nobias", "bert", "vit", "gpt2",
                                  "generic", "llama_rope"])
def test_round_trip_is_bit_identical(case, dtype):
    model, inputs, _ = build(case, dtype)
    report, layout, coords = coordinates_of(model)
    params = dict(model.named_parameters())
    for g_stack, h_stack in coords.gl:
        assert g_stack.dtype == dtype and h_stack.dtype == dtype
    back = layout.to_parameters(coords)
    assert list(back) == [n for n, p in model.named_parameters() if p.requires_grad]
    for name, tensor in back.items():
        assert tensor.dtype == params[name].dtype and tensor.device == params[name].device
        assert tensor.shape == params[name].shape
        assert torch.equal(tensor, params[name]), name
    with torch.no_grad():
        assert torch.equal(call(model, back, inputs), call(model, None, inputs))


def test_layout_is_differentiable_and_linear():
    model = tiny_bert()
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    report = find_symmetries(model)
    layout = ParameterLayout(report, params)
    coords = layout.to_coordinates(params)
    weights = {n: torch.randn_like(p) for n, p in params.items()}
    rebuilt = layout.to_parameters(coords)
    loss = sum((weights[n] * rebuilt[n]).sum() for n in rebuilt)
    leaves = [t for pair in coords.gl for t in pair]
    gradients = torch.autograd.grad(loss, leaves + list(params.values()))
    expected = layout.to_coordinates(weights)  # the adjoint of a permutation is its inverse
    for got, want in zip(gradients[:len(leaves)], [t for p in expected.gl for t in p],
                         strict=True):
        assert torch.equal(got, want)
    for (name, _), got in zip(params.items(), gradients[len(leaves):], strict=True):
        assert torch.equal(got, weights[name])


def test_layout_never_writes_or_aliases_the_model():
    model, inputs, _ = build("bert")
    before = snapshot(model)
    report, layout, coords = coordinates_of(model)
    for g_stack, h_stack in coords.gl:
        g_stack.add_(1.0)
        h_stack.mul_(3.0)
    assert_state_unchanged(model, before)
    back = layout.to_parameters(layout.to_coordinates(dict(model.named_parameters())))
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for name in report.pair_parameters:
        assert back[name].untyped_storage().data_ptr() not in storages, name
    moved = reparametrize(model, report, scale=2.0, generator=torch.Generator().manual_seed(0))
    assert_state_unchanged(model, before)
    for name in report.pair_parameters:
        assert moved[name].untyped_storage().data_ptr() not in storages, name
    find_symmetries(model)
    assert_state_unchanged(model, before)


@pytest.mark.parametrize("heads", [1, 3])
def test_results_never_alias_the_coordinates(heads):
    module = nn.MultiheadAttention(12, heads, bias=False).double()
    report = find_symmetries(module)
    params = {n: p.detach() for n, p in module.named_parameters()}
    layout = ParameterLayout(report, params)
    coords = layout.to_coordinates(params)
    back = layout.to_parameters(coords)
    transposed = coords.replace(gl=[(g.mT.contiguous().mT, h) for g, h in coords.gl])
    back_transposed = layout.to_parameters(transposed)
    for g_stack, h_stack in coords.gl + transposed.gl:
        g_stack.add_(1.0)
        h_stack.add_(1.0)
    for name, tensor in params.items():
        assert torch.equal(back[name], tensor) and torch.equal(back_transposed[name], tensor)


def test_layout_works_under_torch_func():
    module = CrossMHA().double()
    report = find_symmetries(module)
    params = {n: p.detach() for n, p in module.named_parameters()}
    layout = ParameterLayout(report, params)
    coords = layout.to_coordinates(params)

    def squared_norm(gl):
        rebuilt = layout.to_parameters(coords.replace(gl=gl))
        return sum((t ** 2).sum() for t in rebuilt.values())

    gradient = torch.func.grad(squared_norm)(coords.gl)
    for (g_grad, h_grad), (g_stack, h_stack) in zip(gradient, coords.gl, strict=True):
        assert torch.equal(g_grad, 2 * g_stack) and torch.equal(h_grad, 2 * h_stack)
    stacked = torch.stack([coords.gl[0][0], 2 * coords.gl[0][0]])
    sums = torch.func.vmap(lambda g: layout.to_parameters(
        coords.replace(gl=[(g, coords.gl[0][1])] + coords.gl[1:]))["mha.q_proj_weight"].sum())(
        stacked)
    torch.testing.assert_close(sums, params["mha.q_proj_weight"].sum() * torch.tensor(
        [1.0, 2.0], dtype=torch.float64), rtol=1e-14, atol=1e-14)


def test_layout_rejects_bad_input():
    model = nn.MultiheadAttention(12, 3)
    report = find_symmetries(model)
    params = dict(model.named_parameters())
    layout = ParameterLayout(report, params)
    with pytest.raises(KeyError, match="in_proj_bias"):
        layout.to_coordinates({n: p for n, p in params.items() if n != "in_proj_bias"})
    with pytest.raises(ValueError, match="out_proj.weight"):
        layout.to_coordinates({**params, "out_proj.weight": torch.zeros(3, 3)})
    coords = layout.to_coordinates(params)
    bad = coords.replace(gl=[(coords.gl[0][0][:2], coords.gl[0][1])] + coords.gl[1:])
    with pytest.raises(ValueError, match=r"coords.gl\[0\]\[0\]"):
        layout.to_parameters(bad)
    with pytest.raises(ValueError, match="coords.gl"):
        layout.to_parameters(coords.replace(gl=coords.gl[:1]))
    with pytest.raises(ValueError, match="out_proj.bias"):
        layout.to_parameters(coords.replace(other={}))
    with pytest.raises(KeyError):
        ParameterLayout(report, {})
    with pytest.raises(TypeError, match="report"):
        ParameterLayout("report", params)
    assert isinstance(coords, Coordinates)


# ---------------------------------------------------------------------- reparametrize
@pytest.mark.parametrize("case", ["mha", "mha_nobias", "mha_zero_attn", "mha_kdim_vdim", "bert",
                                  "vit", "gpt2", "generic", "legacy_vit", "llama_rope"])
def test_reparametrize_keeps_the_function(case):
    model, inputs, _ = build(case)
    before = snapshot(model)
    report = find_symmetries(model)
    moved, (matrices, _) = reparametrize(model, report, scale=1.5,
                                         generator=torch.Generator().manual_seed(7),
                                         return_transforms=True)
    assert_state_unchanged(model, before)
    params = dict(model.named_parameters())
    assert set(moved) == set(params)
    for name in report.pair_parameters:
        assert (moved[name] - params[name]).abs().max() > 1e-2, name
    for name in report.other:
        assert moved[name] is params[name]
    with torch.no_grad():
        reference = call(model, None, inputs)
        torch.testing.assert_close(call(model, moved, inputs), reference, rtol=1e-10, atol=1e-10)
    # every pair moved by its A: G_new = G A^{-1}, H_new = H A^T, and G H^T is unchanged
    layout = ParameterLayout(report, params)
    old, new = layout.to_coordinates(params), layout.to_coordinates(moved)
    for (g0, h0), (g1, h1), a in zip(old.gl, new.gl, matrices, strict=True):
        torch.testing.assert_close(g1 @ a, g0, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(h1, h0 @ a.mT, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g1 @ h1.mT, g0 @ h0.mT, rtol=1e-10, atol=1e-10)
        assert bool((torch.linalg.cond(a) <= 1e6).all())


def test_reparametrize_diagonal_and_kinds():
    torch.manual_seed(0)
    model = DiagonalNet(6).double()
    report = find_symmetries(model)
    moved, (_, factors) = reparametrize(model, report, scale=0.5,
                                        generator=torch.Generator().manual_seed(1),
                                        return_transforms=True)
    torch.testing.assert_close(moved["u"] * moved["v"], model.u * model.v, rtol=1e-14, atol=0)
    torch.testing.assert_close(moved["u"], model.u.detach() * factors, rtol=1e-15, atol=0)
    assert bool((factors.abs() >= 0.5e-3).all())
    bert = tiny_bert()
    report = find_symmetries(bert)
    moved = reparametrize(bert, report, kinds=("vo",), generator=torch.Generator().manual_seed(2))
    params = dict(bert.named_parameters())
    assert torch.equal(moved["encoder.layer.0.attention.self.query.weight"],
                       params["encoder.layer.0.attention.self.query.weight"])
    assert not torch.equal(moved["encoder.layer.0.attention.self.value.weight"],
                           params["encoder.layer.0.attention.self.value.weight"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_reparametrize_keeps_dtype_and_is_reproducible(dtype):
    model, _, _ = build("generic", dtype)
    report = find_symmetries(model)
    first = reparametrize(model, report, generator=torch.Generator().manual_seed(3))
    second = reparametrize(dict(model.named_parameters()), report,
                           generator=torch.Generator().manual_seed(3))
    for name, tensor in first.items():
        assert tensor.dtype == dtype
        assert torch.equal(tensor, second[name])
    with pytest.raises(ValueError, match="scale"):
        reparametrize(model, report, scale=0.0)
    with pytest.raises(ValueError, match="kinds"):
        reparametrize(model, report, kinds=("qv",))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layout_and_reparametrize_on_cuda():
    model, inputs, _ = build("bert")
    model = model.cuda()
    inputs = {name: tensor.cuda() for name, tensor in inputs.items()}
    report, layout, coords = coordinates_of(model)
    params = dict(model.named_parameters())
    assert all(g.is_cuda and h.is_cuda for g, h in coords.gl)
    back = layout.to_parameters(coords)
    assert all(torch.equal(back[n], params[n]) and back[n].is_cuda for n in back)
    moved = reparametrize(model, report, scale=1.5, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(call(model, moved, inputs), call(model, None, inputs),
                                   rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------- CLI
def _run_cli(arguments, capsys):
    import argparse
    parser = argparse.ArgumentParser(prog="quotientsharp")
    models_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["symmetries", *arguments])
    status = args.func(args)
    return status, capsys.readouterr()


def test_cli_reads_configs_and_saved_modules(tmp_path, capsys):
    config = tiny_bert_config()
    config.architectures = ["BertModel"]
    config_file = tmp_path / "bert.json"
    config_file.write_text(config.to_json_string())
    status, output = _run_cli([str(config_file)], capsys)
    assert status == 0
    assert "16 GL(h) pairs" in output.out and "encoder.layer.1.attention" in output.out

    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(config.to_json_string())
    status, output = _run_cli([str(directory), "--json"], capsys)
    assert status == 0
    data = json.loads(output.out)
    assert data["gl_count"] == 16
    assert data["buckets"] == [{"n": 33, "m": 33, "h": 8, "pairs": 8},
                               {"n": 33, "m": 32, "h": 8, "pairs": 8}]

    saved = tmp_path / "module.pt"
    torch.save(nn.ModuleDict({"net": DiagonalNet(4), "attn": FusedQKVAttention()}), saved)
    status, output = _run_cli([str(saved)], capsys)
    assert status == 0
    assert "NOT understood" in output.out and "(net.u, net.v): 4 coordinates" in output.out

    assert models_cli.main(["symmetries", str(config_file)]) == 0
    assert "16 GL(h) pairs" in capsys.readouterr().out

    state = tmp_path / "state.pt"
    torch.save(nn.Linear(2, 2).state_dict(), state)
    status, output = _run_cli([str(state)], capsys)
    assert status == 2 and "state dict" in output.err
    status, output = _run_cli([str(tmp_path / "missing.json")], capsys)
    assert status == 2 and "does not exist" in output.err


# ---------------------------------------------------------------------- extra projections
def _tiny_longformer():
    torch.manual_seed(0)
    config = transformers.LongformerConfig(hidden_size=32, intermediate_size=37,
                                           num_hidden_layers=1, num_attention_heads=4,
                                           vocab_size=50, attention_window=[4], num_labels=3,
                                           pad_token_id=0, max_position_embeddings=32)
    model = transformers.LongformerForSequenceClassification(config)
    return randomize(model.to(torch.float64).eval())


def test_value_output_action_alone_changes_longformer():
    """Why Longformer is refused: its global tokens read value_global through the same output
    projection, so a GL(8) element on (value, output.dense) alone changes the logits."""
    model = _tiny_longformer()
    ids = torch.randint(2, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    attention = model.longformer.encoder.layer[0].attention
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    prefix = "longformer.encoder.layer.0.attention."
    value_w, value_b = params[prefix + "self.value.weight"], params[prefix + "self.value.bias"]
    output_w = params[prefix + "output.dense.weight"]
    generator = torch.Generator().manual_seed(2)
    for head in range(4):
        rows = slice(8 * head, 8 * head + 8)
        element = torch.randn(8, 8, generator=generator, dtype=torch.float64) + 3 * torch.eye(8)
        inverse_t = torch.linalg.inv(element).T
        value_w[rows] = inverse_t @ value_w[rows]
        value_b[rows] = inverse_t @ value_b[rows]
        output_w[:, rows] = output_w[:, rows] @ element.T
    assert attention.self.value_global is not None
    with torch.no_grad():
        before = model(input_ids=ids).logits
        after = functional_call(model, params, (), {"input_ids": ids}).logits
    assert (after - before).abs().max() > 1e-3


def test_extra_query_key_value_projections_refuse_the_module():
    model = _tiny_longformer()
    report = find_symmetries(model)
    assert report.pairs == []
    assert report.unknown == ["longformer.encoder.layer.0.attention"]
    reason = report.unknown_reasons["longformer.encoder.layer.0.attention"]
    assert "value_global" in reason and "not a symmetry" in reason
    assert "longformer.encoder.layer.0.attention.self.value.weight" in report.other


class _UnknownAttention(nn.Module):
    """q/k/v-looking children (in their own case) without an output projection any handler
    reads: not understood."""

    def __init__(self, children: tuple[str, ...]) -> None:
        super().__init__()
        for child in children:
            self.add_module(child, nn.Linear(8, 8))
        self.Wout = nn.Linear(8, 8)


def test_unknown_reasons_name_the_projection_children():
    """A module not understood names its q/k/v-looking children, whatever their case."""
    model = nn.Sequential(_UnknownAttention(("Query_Proj", "Key_Proj", "Value_Proj")),
                          _UnknownAttention(("Wqkv",)))
    report = find_symmetries(model)
    assert "['Key_Proj', 'Query_Proj', 'Value_Proj']" in report.unknown_reasons["0"]
    assert "['Wqkv']" in report.unknown_reasons["1"]
    assert report.pairs == []


class _TinyAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.out(self.attention(h, h, h)[0].mean(1))


def _tiny_attention_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(3, 5, 4, generator=generator), torch.randint(0, 3, (3,),
                                                                    generator=generator)


@pytest.mark.parametrize("make", [
    torch.jit.script,
    # torch 2.13 deprecates tracing, not the traced modules users already have
    pytest.param(lambda m: torch.jit.trace(m, torch.zeros(1, 4)),
                 marks=pytest.mark.filterwarnings("ignore::DeprecationWarning"), id="trace")])
def test_a_torchscript_model_is_refused_by_name_everywhere(make):
    # discovery failed with a raw AttributeError from inside a recogniser
    torch.manual_seed(0)
    scripted = make(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)))
    batch = (torch.randn(5, 4), torch.randint(0, 3, (5,)))
    match = r"model is a TorchScript module \(\w+, made by torch.jit.script or torch.jit.trace\)"
    with pytest.raises(TypeError, match=match):
        find_symmetries(scripted)
    with pytest.raises(TypeError, match=match):
        qs.sharpness(scripted, [batch], rho=0.05, n_iter=2, progress=False)


def test_a_data_parallel_model_is_refused_where_it_is_run_and_named_in_discovery():
    # torch's own "stateless API can't be used with nn.DataParallel" read as a bad batch
    torch.manual_seed(0)
    wrapped = nn.DataParallel(_TinyAttention())
    report = find_symmetries(wrapped)
    assert report.pair_parameters and all(n.startswith("module.") for n in report.pair_parameters)
    with pytest.raises(TypeError, match=r"model is wrapped in nn.DataParallel.*pass model.module"):
        qs.sharpness(wrapped, [_tiny_attention_batch()], rho=0.05, n_iter=2, progress=False)
