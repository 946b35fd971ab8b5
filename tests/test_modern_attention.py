"""Grouped-query attention, rotary embeddings and discovery in today's transformer families.

Every family is a tiny float64 model built offline from its config. Per family:

- :func:`find_symmetries` yields the expected pairs, shapes and groups (and notes for what
  breaks a pair, or leaves it intact);
- a random group element, applied by hand to the module's own weights (per key/value head: an
  element of GL(h) or, for a rotary query/key pair, of the rotations' centraliser, condition
  number 1e3), without the package's layout or ``reparametrize``, leaves the logits unchanged
  to 1e-10 and geodesic sharpness (inv and mix, orders 1 and 2) unchanged to 1e-8 relative;
- the layout reads the factors the modeling code uses (stacked query heads of a group, strided
  fused projections) and round-trips bit for bit.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import sys
import types
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import quotientsharp as qs
from quotientsharp.cli import symmetries as models_cli
from quotientsharp.engine import LayoutCoordinates
from quotientsharp.models import ParameterLayout, find_symmetries, reparametrize

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
RotaryQuotient = pytest.importorskip("quotientsharp.core.gl").RotaryQuotient

CONDITION = 1e3
SEQUENCE = 6


# ---------------------------------------------------------------------- by-hand group elements
def gl_element(size: int, condition: float, generator: torch.Generator) -> torch.Tensor:
    """``U diag(s) V^T``: Haar ``U``, ``V`` and singular values log-spaced to ``condition``."""
    def orthogonal():
        q, r = torch.linalg.qr(torch.randn(size, size, generator=generator, dtype=torch.float64))
        return q * torch.sign(r.diagonal())
    exponents = torch.linspace(-0.5, 0.5, size, dtype=torch.float64) if size > 1 else (
        torch.zeros(1, dtype=torch.float64))
    return orthogonal() @ torch.diag(condition ** exponents) @ orthogonal().T


def rotary_element(head_dim: int, rotary_dims: int, layout: str, condition: float,
                   generator: torch.Generator) -> torch.Tensor:
    """An element of the centraliser: ``r [[cos, -sin], [sin, cos]]`` on each rotation plane,
    a GL block on the non-rotary dimensions, zero elsewhere."""
    half = rotary_dims // 2
    if layout == "rotate_half":
        planes = [(d, d + half) for d in range(half)]
    else:
        planes = [(2 * d, 2 * d + 1) for d in range(half)]
    moduli = condition ** torch.linspace(-0.5, 0.5, half, dtype=torch.float64)
    moduli = moduli[torch.randperm(half, generator=generator)]
    element = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    for (i, j), modulus in zip(planes, moduli, strict=True):
        phase = 2 * math.pi * float(torch.rand(1, generator=generator, dtype=torch.float64))
        element[i, i] = element[j, j] = modulus * math.cos(phase)
        element[j, i] = modulus * math.sin(phase)
        element[i, j] = -element[j, i]
    if rotary_dims < head_dim:
        element[rotary_dims:, rotary_dims:] = gl_element(head_dim - rotary_dims, condition,
                                                         generator)
    return element


# ---------------------------------------------------------------------- projections by hand
@dataclass
class Projections:
    """One attention module in ``nn.Linear`` convention: ``wq [heads * d, E]``, ``bq [heads * d]``
    (or ``None``), keys and values over the key/value heads, ``wo [E_out, heads * d_v]``."""

    wq: torch.Tensor
    bq: torch.Tensor | None
    wk: torch.Tensor
    bk: torch.Tensor | None
    wv: torch.Tensor
    bv: torch.Tensor | None
    wo: torch.Tensor


def _clone(t):
    return None if t is None else t.detach().clone()


def _copy(target, value):
    if target is not None:
        target.copy_(value)


class LinearAccess:
    """Separate q/k/v/o ``nn.Linear`` modules at the given paths of an attention module."""

    def __init__(self, module, paths):
        self.q, self.k, self.v, self.o = (module.get_submodule(path) for path in paths)

    def read(self):
        return Projections(_clone(self.q.weight), _clone(self.q.bias), _clone(self.k.weight),
                           _clone(self.k.bias), _clone(self.v.weight), _clone(self.v.bias),
                           _clone(self.o.weight))

    def write(self, p):
        with torch.no_grad():
            for linear, weight, bias in ((self.q, p.wq, p.bq), (self.k, p.wk, p.bk),
                                         (self.v, p.wv, p.bv)):
                linear.weight.copy_(weight)
                _copy(linear.bias, bias)
            self.o.weight.copy_(p.wo)


class Conv1DAccess:
    """GPT-2: ``c_attn`` Conv1D ``W [E, 3E]`` (``y = x W + b``), ``c_proj`` ``W [E, E]``."""

    def __init__(self, module, _=None):
        self.module = module

    def read(self):
        wq, wk, wv = self.module.c_attn.weight.detach().T.chunk(3)
        bq, bk, bv = self.module.c_attn.bias.detach().chunk(3)
        return Projections(wq.clone(), bq.clone(), wk.clone(), bk.clone(), wv.clone(),
                           bv.clone(), self.module.c_proj.weight.detach().T.clone())

    def write(self, p):
        with torch.no_grad():
            self.module.c_attn.weight.copy_(torch.cat([p.wq, p.wk, p.wv]).T)
            self.module.c_attn.bias.copy_(torch.cat([p.bq, p.bk, p.bv]))
            self.module.c_proj.weight.copy_(p.wo.T)


class FusedPerHeadAccess:
    """GPT-NeoX / BLOOM: ``query_key_value`` output viewed as ``[heads, 3, d]``; ``dense``
    (GPT-BigCode without multi-query: ``c_attn`` and ``c_proj``)."""

    def __init__(self, module, heads):
        self.module, self.heads = module, heads
        self.fused = getattr(module, "query_key_value", None) or module.c_attn
        self.dense = getattr(module, "dense", None) or module.c_proj

    def read(self):
        fused = self.fused
        embed = fused.in_features
        weight = fused.weight.detach().reshape(self.heads, 3, -1, embed)
        bias = fused.bias.detach().reshape(self.heads, 3, -1)
        parts = [(weight[:, i].reshape(-1, embed).clone(), bias[:, i].reshape(-1).clone())
                 for i in range(3)]
        return Projections(*parts[0], *parts[1], *parts[2], self.dense.weight.detach().clone())

    def write(self, p):
        fused = self.fused
        embed = fused.in_features
        with torch.no_grad():
            weight = torch.stack([w.reshape(self.heads, -1, embed) for w in (p.wq, p.wk, p.wv)],
                                 dim=1)
            fused.weight.copy_(weight.reshape(-1, embed))
            bias = torch.stack([b.reshape(self.heads, -1) for b in (p.bq, p.bk, p.bv)], dim=1)
            fused.bias.copy_(bias.reshape(-1))
            self.dense.weight.copy_(p.wo)


class ContiguousFusedAccess:
    """Phi-3 / MPT: one Linear ``[W_q; W_k; W_v]`` back to back (keys and values of the key/value
    heads) and the output projection, at ``paths = (fused, output)``."""

    def __init__(self, module, paths):
        self.fused, self.o = (module.get_submodule(path) for path in paths)
        self.query = self.o.in_features

    def _split(self, tensor):
        key = (tensor.shape[0] - self.query) // 2
        return tensor.detach().clone().split([self.query, key, key])

    def read(self):
        wq, wk, wv = self._split(self.fused.weight)
        bq, bk, bv = (None,) * 3 if self.fused.bias is None else self._split(self.fused.bias)
        return Projections(wq, bq, wk, bk, wv, bv, self.o.weight.detach().clone())

    def write(self, p):
        with torch.no_grad():
            self.fused.weight.copy_(torch.cat([p.wq, p.wk, p.wv]))
            if self.fused.bias is not None:
                self.fused.bias.copy_(torch.cat([p.bq, p.bk, p.bv]))
            self.o.weight.copy_(p.wo)


class FalconAccess:
    """Falcon's ``query_key_value`` in its three layouts (``[kv, g + 2, d]`` of the new decoder
    architecture, multi-query back to back, per-head ``[heads, 3, d]``) and ``dense``."""

    def __init__(self, module, _=None):
        self.module = module
        heads, kv = module.num_heads, module.num_kv_heads
        self.layout = ([kv, heads // kv + 2] if module.new_decoder_architecture
                       else None if module.multi_query else [heads, 3])

    def _parts(self, tensor):
        tensor = tensor.detach().clone()
        if self.layout is None:
            query = self.module.dense.in_features
            key = (tensor.shape[0] - query) // 2
            return list(tensor.split([query, key, key]))
        blocks = tensor.reshape(*self.layout, self.module.head_dim, *tensor.shape[1:])
        return [blocks[:, :-2].reshape(-1, *tensor.shape[1:]),
                blocks[:, -2].reshape(-1, *tensor.shape[1:]),
                blocks[:, -1].reshape(-1, *tensor.shape[1:])]

    def _joined(self, q, k, v):
        if self.layout is None:
            return torch.cat([q, k, v])
        rest, d = q.shape[1:], self.module.head_dim
        groups = self.layout[0]
        blocks = [q.reshape(groups, -1, d, *rest), k.reshape(groups, 1, d, *rest),
                  v.reshape(groups, 1, d, *rest)]
        return torch.cat(blocks, dim=1).reshape(-1, *rest)

    def read(self):
        fused = self.module.query_key_value
        wq, wk, wv = self._parts(fused.weight)
        bq, bk, bv = (None,) * 3 if fused.bias is None else self._parts(fused.bias)
        return Projections(wq, bq, wk, bk, wv, bv, self.module.dense.weight.detach().clone())

    def write(self, p):
        fused = self.module.query_key_value
        with torch.no_grad():
            fused.weight.copy_(self._joined(p.wq, p.wk, p.wv))
            if fused.bias is not None:
                fused.bias.copy_(self._joined(p.bq, p.bk, p.bv))
            self.module.dense.weight.copy_(p.wo)


class MultiheadAccess:
    """``nn.MultiheadAttention``: fused ``in_proj_weight`` / ``in_proj_bias``, ``out_proj``."""

    def __init__(self, module, _=None):
        self.module = module

    def read(self):
        wq, wk, wv = self.module.in_proj_weight.detach().clone().chunk(3)
        bq, bk, bv = self.module.in_proj_bias.detach().clone().chunk(3)
        return Projections(wq, bq, wk, bk, wv, bv, self.module.out_proj.weight.detach().clone())

    def write(self, p):
        with torch.no_grad():
            self.module.in_proj_weight.copy_(torch.cat([p.wq, p.wk, p.wv]))
            self.module.in_proj_bias.copy_(torch.cat([p.bq, p.bk, p.bv]))
            self.module.out_proj.weight.copy_(p.wo)


def _rows(weight, bias, heads):
    """``[heads, d, E]`` and ``[heads, d]`` views of head-major rows."""
    blocks = weight.reshape(heads, -1, weight.shape[-1])
    return blocks, None if bias is None else bias.reshape(heads, -1)


def transform_by_hand(p: Projections, heads: int, kv_heads: int, rotary, kinds,
                      generator: torch.Generator) -> Projections:
    """One group element per key/value head, applied to the weights of its group.

    QK of key head ``j`` with ``A``: query head ``i = j g + t`` (HF ``repeat_kv``) gets
    ``[W_q,i, b_q,i] <- A^{-T} [W_q,i, b_q,i]``, key head ``j`` gets ``A [W_k,j, b_k,j]``.
    VO of value head ``j`` with ``B``: ``[W_v,j, b_v,j] <- B^{-T} [...]`` and every query head
    ``i`` of the group ``W_o[:, cols_i] <- W_o[:, cols_i] B^T``. Scores ``q_i^T k_j`` and the
    output ``W_o,i v_j`` are unchanged (for rotary pairs because ``A`` commutes with rotations).
    """
    group = heads // kv_heads
    wq, bq = _rows(p.wq, p.bq, heads)
    wk, bk = _rows(p.wk, p.bk, kv_heads)
    wv, bv = _rows(p.wv, p.bv, kv_heads)
    head_dim, value_dim = wq.shape[1], wv.shape[1]
    wo = p.wo.reshape(p.wo.shape[0], heads, value_dim)
    for j in range(kv_heads):
        queries = range(j * group, (j + 1) * group)
        if "qk" in kinds:
            a = (gl_element(head_dim, CONDITION, generator) if rotary is None
                 else rotary_element(head_dim, *rotary, CONDITION, generator))
            a_inv_t = torch.linalg.inv(a).T
            for i in queries:
                wq[i] = a_inv_t @ wq[i]
                if bq is not None:
                    bq[i] = a_inv_t @ bq[i]
            wk[j] = a @ wk[j]
            if bk is not None:
                bk[j] = a @ bk[j]
        if "vo" in kinds:
            b = gl_element(value_dim, CONDITION, generator)
            wv[j] = torch.linalg.inv(b).T @ wv[j]
            if bv is not None:
                bv[j] = torch.linalg.inv(b).T @ bv[j]
            for i in queries:
                wo[:, i] = wo[:, i] @ b.T
    return p


# ---------------------------------------------------------------------- families
def randomize(model, seed=0):
    """Perturb every parameter: default inits zero the biases, which would hide the bias rows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.add_(0.2 * torch.randn(tensor.shape, generator=generator,
                                          dtype=torch.float64))
    return model


def text_batch(eos=None):
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(2, 50, (4, SEQUENCE), generator=generator)
    if eos is not None:
        ids[:, -1] = eos
    return {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 1])}


def lm_batch():
    """A causal language model's batch: the next token of each position (the last one none)."""
    ids = text_batch()["input_ids"]
    return {"input_ids": ids,
            "labels": torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), -100)], dim=1)}


def image_batch():
    generator = torch.Generator().manual_seed(12)
    return {"pixel_values": torch.randn(4, 3, 8, 8, generator=generator, dtype=torch.float64),
            "labels": torch.tensor([0, 1, 2, 1])}


class MHAClassifier(nn.Module):
    """Self-attention over a sequence, mean-pooled, then a linear classifier."""

    def __init__(self, embed=16, heads=2, classes=3):
        super().__init__()
        self.attention = nn.MultiheadAttention(embed, heads, batch_first=True)
        self.head = nn.Linear(embed, classes)

    def forward(self, x):
        return self.head((x + self.attention(x, x, x, need_weights=False)[0]).mean(1))


def mha_batch():
    generator = torch.Generator().manual_seed(13)
    return (torch.randn(4, 5, 16, generator=generator, dtype=torch.float64),
            torch.tensor([0, 1, 2, 1]))


def _decoder(name, **options):
    base = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
                vocab_size=50, num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=1,
                attn_implementation="eager")
    base.update(options)
    config_class = getattr(transformers, f"{name}Config")
    model_class = getattr(transformers, f"{name}ForSequenceClassification")
    return lambda: model_class(config_class(**base))


T = transformers
LLAMA_PATHS = ("q_proj", "k_proj", "v_proj", "o_proj")
DEBERTA_PATHS = ("self.query_proj", "self.key_proj", "self.value_proj", "output.dense")


def _falcon(**options) -> nn.Module:
    return T.FalconForSequenceClassification(T.FalconConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, vocab_size=50,
        num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=1,
        attn_implementation="eager", **options))


def _gpt_bigcode(multi_query: bool) -> nn.Module:
    return T.GPTBigCodeForSequenceClassification(T.GPTBigCodeConfig(
        n_embd=32, n_layer=1, n_head=4, vocab_size=50, n_positions=16, num_labels=3,
        pad_token_id=0, bos_token_id=1, eos_token_id=1, multi_query=multi_query))


def _deberta_v2(share_att_key: bool) -> nn.Module:
    return T.DebertaV2ForSequenceClassification(T.DebertaV2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        vocab_size=50, num_labels=3, pad_token_id=0, relative_attention=True,
        pos_att_type=["p2c", "c2p"], share_att_key=share_att_key, max_relative_positions=8,
        position_buckets=4))


@dataclass
class Family:
    """A tiny model and what discovery must find in it.

    ``expected``: per attention module, ``(kind, pairs, n, m, h, group, query_heads)`` of each
    kept pair kind. ``attention``: the class name of its attention modules, how to read their
    projections by hand, and ``(heads, kv_heads, rotary, kinds)``.
    """

    build: Callable[[], nn.Module]
    batch: Callable[[], object]
    attention_class: str
    access: Callable
    paths: object
    heads: int
    kv_heads: int
    rotary: tuple[int, str] | None
    kinds: tuple[str, ...]
    expected: tuple[tuple, ...]
    modules: int = 1
    #: relative tolerance of the invariance by hand: 1e-10 in float64, unless the modeling code
    #: rounds the moved queries and keys through float32 (ModernBERT's rotary and softmax),
    #: where a group element of condition CONDITION moves them by that times float32's eps
    rounding: float = 1e-10


def _gl(kind, pairs, n, m, h=8, query_heads=1, group="GL(8)"):
    return (kind, pairs, n, m, h, group, query_heads)


FAMILIES = {
    # grouped-query attention (4 query heads, 2 key/value heads) and RoPE: the case
    "llama": Family(_decoder("Llama", num_key_value_heads=2), text_batch, "LlamaAttention",
                    LinearAccess, LLAMA_PATHS, 4, 2, (8, "rotate_half"), ("qk", "vo"),
                    (_gl("qk", 2, 64, 32, query_heads=2, group="GL(1,C)^4"),
                     _gl("vo", 2, 32, 64, query_heads=2))),
    # q/k/v biases: each stacked query head carries its bias row
    "qwen2": Family(_decoder("Qwen2", num_key_value_heads=2), text_batch, "Qwen2Attention",
                    LinearAccess, LLAMA_PATHS, 4, 2, (8, "rotate_half"), ("qk", "vo"),
                    (_gl("qk", 2, 66, 33, query_heads=2, group="GL(1,C)^4"),
                     _gl("vo", 2, 33, 64, query_heads=2))),
    # multi-query attention and a sliding window
    "mistral": Family(_decoder("Mistral", num_key_value_heads=1, sliding_window=4), text_batch,
                      "MistralAttention", LinearAccess, LLAMA_PATHS, 4, 1, (8, "rotate_half"),
                      ("qk", "vo"), (_gl("qk", 1, 128, 32, query_heads=4, group="GL(1,C)^4"),
                                     _gl("vo", 1, 32, 128, query_heads=4))),
    # fused per-head query_key_value, partial rotary on the first 4 of 8 dimensions
    "gpt_neox": Family(_decoder("GPTNeoX", rotary_pct=0.5), text_batch, "GPTNeoXAttention",
                       FusedPerHeadAccess, 4, 4, 4, (4, "rotate_half"), ("qk", "vo"),
                       (_gl("qk", 4, 33, 33, group="GL(1,C)^2 x GL(4)"), _gl("vo", 4, 33, 32))),
    # interleaved rotary planes (rotate_every_two), partial rotary; GPT-J's eager attention
    # computes its scores in float32, SDPA keeps float64
    "gptj": Family(lambda: T.GPTJForSequenceClassification(T.GPTJConfig(
        n_embd=32, n_layer=1, n_head=4, rotary_dim=4, vocab_size=50, n_positions=16,
        num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=1,
        attn_implementation="sdpa")), text_batch, "GPTJAttention", LinearAccess,
        ("q_proj", "k_proj", "v_proj", "out_proj"), 4, 4, (4, "interleaved"), ("qk", "vo"),
        (_gl("qk", 4, 32, 32, group="GL(1,C)^2 x GL(4)"), _gl("vo", 4, 32, 32))),
    "distilbert": Family(lambda: T.DistilBertForSequenceClassification(T.DistilBertConfig(
        dim=32, hidden_dim=37, n_layers=1, n_heads=4, vocab_size=50, num_labels=3,
        pad_token_id=0, attn_implementation="eager")), text_batch, "DistilBertSelfAttention",
        LinearAccess, ("q_lin", "k_lin", "v_lin", "out_lin"), 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # ALiBi: a bias on the scores, the pairs stay
    "bloom": Family(lambda: T.BloomForSequenceClassification(T.BloomConfig(
        hidden_size=32, n_layer=1, n_head=4, vocab_size=50, num_labels=3, pad_token_id=0,
        bos_token_id=1, eos_token_id=1, attn_implementation="eager")), text_batch,
        "BloomAttention", FusedPerHeadAccess, 4, 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # per-head q_norm/k_norm: the qk pair breaks, the vo pair stays
    "qwen3": Family(_decoder("Qwen3", num_key_value_heads=2, head_dim=8), text_batch,
                    "Qwen3Attention", LinearAccess, LLAMA_PATHS, 4, 2, None, ("vo",),
                    (_gl("vo", 2, 32, 64, query_heads=2),)),
    "gpt2": Family(lambda: T.GPT2ForSequenceClassification(T.GPT2Config(
        n_embd=32, n_layer=1, n_head=4, vocab_size=50, n_positions=16, num_labels=3,
        pad_token_id=0, bos_token_id=1, eos_token_id=1, attn_implementation="eager")),
        text_batch, "GPT2Attention", Conv1DAccess, None, 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    "bert": Family(lambda: T.BertForSequenceClassification(T.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        vocab_size=50, num_labels=3, attn_implementation="eager")), text_batch,
        "BertAttention", LinearAccess, ("self.query", "self.key", "self.value", "output.dense"),
        4, 4, None, ("qk", "vo"), (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    "roberta": Family(lambda: T.RobertaForSequenceClassification(T.RobertaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        vocab_size=50, num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=1,
        attn_implementation="eager")), text_batch, "RobertaAttention", LinearAccess,
        ("self.query", "self.key", "self.value", "output.dense"), 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # SDPA: the eager softmax rounds through float32 and hides any change below about 1e-7
    "vit": Family(lambda: T.ViTForImageClassification(T.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        image_size=8, patch_size=4, num_labels=3, attn_implementation="sdpa")), image_batch,
        "ViTAttention", LinearAccess, LLAMA_PATHS, 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    "clip_vision": Family(lambda: T.CLIPForImageClassification(T.CLIPConfig(
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                           num_attention_heads=4, image_size=8, patch_size=4),
        text_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                         num_attention_heads=4, vocab_size=50, bos_token_id=1, eos_token_id=1,
                         pad_token_id=0),
        num_labels=3, attn_implementation="eager")), image_batch, "CLIPAttention",
        LinearAccess, ("q_proj", "k_proj", "v_proj", "out_proj"), 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # encoder self-attention, decoder self-attention, decoder cross-attention
    "t5": Family(lambda: T.T5ForSequenceClassification(T.T5Config(
        d_model=32, d_kv=8, d_ff=37, num_layers=1, num_heads=4, vocab_size=50, num_labels=3,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        attn_implementation="eager")), functools.partial(text_batch, eos=1), "T5Attention",
        LinearAccess, ("q", "k", "v", "o"), 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 32, 32), _gl("vo", 4, 32, 32)), modules=3),
    # q_proj/k_proj/v_proj with a `dense` output projection, partial rotary
    "phi": Family(_decoder("Phi", partial_rotary_factor=0.5), text_batch, "PhiAttention",
                  LinearAccess, ("q_proj", "k_proj", "v_proj", "dense"), 4, 4,
                  (4, "rotate_half"), ("qk", "vo"),
                  (_gl("qk", 4, 33, 33, group="GL(1,C)^2 x GL(4)"), _gl("vo", 4, 33, 32))),
    # query/key/value with a `dense` output projection in one module, shared by both layers
    "albert": Family(lambda: T.AlbertForSequenceClassification(T.AlbertConfig(
        embedding_size=16, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, vocab_size=50, num_labels=3, pad_token_id=0,
        attn_implementation="sdpa")), text_batch, "AlbertAttention", LinearAccess,
        ("query", "key", "value", "dense"), 4, 4, None, ("qk", "vo"),
        (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # GPT-NeoX's per-head fused query_key_value, partial rotary
    "persimmon": Family(_decoder("Persimmon", qk_layernorm=False, partial_rotary_factor=0.5),
                        text_batch, "PersimmonAttention", FusedPerHeadAccess, 4, 4, 4,
                        (4, "rotate_half"), ("qk", "vo"),
                        (_gl("qk", 4, 33, 33, group="GL(1,C)^2 x GL(4)"),
                         _gl("vo", 4, 33, 32))),
    # rotary from a `sinusoidal_pos` argument, interleaved planes, applied by the attention
    # class's own apply_rotary_position_embeddings (no rotate_half helper in its module)
    "roformer": Family(lambda: T.RoFormerForSequenceClassification(T.RoFormerConfig(
        embedding_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=37, vocab_size=50, max_position_embeddings=16, num_labels=3,
        pad_token_id=0)), text_batch, "RoFormerAttention", LinearAccess,
        ("self.query", "self.key", "self.value", "output.dense"), 4, 4, (8, "interleaved"),
        ("qk", "vo"), (_gl("qk", 4, 33, 33, group="GL(1,C)^4"), _gl("vo", 4, 33, 32))),
    # differential attention: plain per-head scores, but value heads concatenated in pairs
    # and each output normalised (groupnorm) before o_proj, so vo is dropped
    "diffllama": Family(_decoder("DiffLlama", num_key_value_heads=2), text_batch,
                        "DiffLlamaAttention", LinearAccess, LLAMA_PATHS, 4, 2,
                        (8, "rotate_half"), ("qk",),
                        (_gl("qk", 2, 64, 32, query_heads=2, group="GL(1,C)^4"),)),
    # cosine attention: normalize(q) normalize(k)^T * logit_scale breaks qk, vo stays
    "swinv2": Family(lambda: T.Swinv2ForImageClassification(T.Swinv2Config(
        image_size=8, patch_size=2, embed_dim=16, depths=[1], num_heads=[2], window_size=2,
        mlp_ratio=2.0, num_labels=3, attn_implementation="eager")), image_batch,
        "Swinv2Attention", LinearAccess, ("self.query", "self.key", "self.value",
                                          "output.dense"),
        2, 2, None, ("vo",), (_gl("vo", 2, 17, 16),)),
    # queries, keys and values fused back to back in one Linear: Phi-3 (grouped-query, RoPE)
    # and MPT (ALiBi)
    "phi3": Family(_decoder("Phi3", num_key_value_heads=2), text_batch, "Phi3Attention",
                   ContiguousFusedAccess, ("qkv_proj", "o_proj"), 4, 2, (8, "rotate_half"),
                   ("qk", "vo"), (_gl("qk", 2, 64, 32, query_heads=2, group="GL(1,C)^4"),
                                  _gl("vo", 2, 32, 64, query_heads=2))),
    "mpt": Family(lambda: T.MptForSequenceClassification(T.MptConfig(
        d_model=32, n_heads=4, n_layers=1, vocab_size=50, num_labels=3, pad_token_id=0)),
        text_batch, "MptAttention", ContiguousFusedAccess, ("Wqkv", "out_proj"), 4, 4, None,
        ("qk", "vo"), (_gl("qk", 4, 32, 32), _gl("vo", 4, 32, 32))),
    # ModernBERT: Wqkv back to back, output Wo; RoPE with a theta per layer type (a sliding
    # and a global layer)
    "modernbert": Family(lambda: T.ModernBertForSequenceClassification(T.ModernBertConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=50, num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=1,
        cls_token_id=2, sep_token_id=3, layer_types=["sliding_attention", "full_attention"],
        local_attention=4, attn_implementation="eager")), text_batch, "ModernBertAttention",
        ContiguousFusedAccess, ("Wqkv", "Wo"), 4, 4, (8, "rotate_half"), ("qk", "vo"),
        (_gl("qk", 4, 32, 32, group="GL(1,C)^4"), _gl("vo", 4, 32, 32)), modules=2,
        rounding=CONDITION * torch.finfo(torch.float32).eps),
    # the ModernBERT decoder: separate q/k/v projections, ModernBERT's output Wo; its rotary
    # and softmax round through float32 as ModernBERT's
    "modernbert_decoder": Family(lambda: T.ModernBertDecoderForSequenceClassification(
        T.ModernBertDecoderConfig(
            hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
            vocab_size=50, num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=1,
            cls_token_id=2, sep_token_id=3, layer_types=["sliding_attention", "full_attention"],
            local_attention=4, attn_implementation="eager")), text_batch,
        "ModernBertDecoderAttention", LinearAccess, ("q_proj", "k_proj", "v_proj", "Wo"), 4, 4,
        (8, "rotate_half"), ("qk", "vo"),
        (_gl("qk", 4, 32, 32, group="GL(1,C)^4"), _gl("vo", 4, 32, 32)), modules=2,
        rounding=CONDITION * torch.finfo(torch.float32).eps),
    # GPT-OSS: rotate_half planes applied by its own _apply_rotary_emb (no rotate_half helper),
    # attention sinks (one learned logit per head: the pairs stay), a sliding layer; experts
    # in eager mode (torch's grouped matrix product has no float64)
    "gpt_oss": Family(_decoder("GptOss", num_key_value_heads=2, head_dim=8, intermediate_size=32,
                               num_local_experts=2, num_experts_per_tok=1, num_hidden_layers=2,
                               layer_types=["sliding_attention", "full_attention"],
                               sliding_window=4, experts_implementation="eager"),
                      text_batch, "GptOssAttention", LinearAccess,
                      LLAMA_PATHS, 4, 2, (8, "rotate_half"), ("qk", "vo"),
                      (_gl("qk", 2, 66, 33, query_heads=2, group="GL(1,C)^4"),
                       _gl("vo", 2, 33, 64, query_heads=2)), modules=2),
    # Llama 4's layers without positions (NoPE, no_rope_layers 0): neither rotary nor its L2
    # query/key norm, so both kinds stay whole (its rope layers keep vo only)
    "llama4_nope": Family(lambda: T.Llama4ForCausalLM(T.Llama4TextConfig(
        hidden_size=32, intermediate_size=32, intermediate_size_mlp=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50,
        num_local_experts=2, no_rope_layers=[0], pad_token_id=0, bos_token_id=1,
        eos_token_id=1, attn_implementation="eager")), lm_batch, "Llama4TextAttention",
        LinearAccess, LLAMA_PATHS, 4, 2, None, ("qk", "vo"),
        (_gl("qk", 2, 64, 32, query_heads=2), _gl("vo", 2, 32, 64, query_heads=2))),
    # GPT-BigCode (StarCoder): c_attn back to back with multi-query, per-head interleaved
    # without
    "gpt_bigcode_mq": Family(lambda: _gpt_bigcode(multi_query=True), text_batch,
                             "GPTBigCodeAttention", ContiguousFusedAccess, ("c_attn", "c_proj"),
                             4, 1, None, ("qk", "vo"),
                             (_gl("qk", 1, 132, 33, query_heads=4),
                              _gl("vo", 1, 33, 128, query_heads=4))),
    "gpt_bigcode": Family(lambda: _gpt_bigcode(multi_query=False), text_batch,
                          "GPTBigCodeAttention", FusedPerHeadAccess, 4, 4, 4, None, ("qk", "vo"),
                          (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # Falcon's three fused layouts: grouped [kv, g + 2, d] (new decoder architecture),
    # multi-query back to back, per-head [heads, 3, d] (here with ALiBi and biases: no rotary)
    "falcon_gqa": Family(lambda: _falcon(new_decoder_architecture=True, num_kv_heads=2),
                         text_batch, "FalconAttention", FalconAccess, None, 4, 2,
                         (8, "rotate_half"), ("qk", "vo"),
                         (_gl("qk", 2, 64, 32, query_heads=2, group="GL(1,C)^4"),
                          _gl("vo", 2, 32, 64, query_heads=2))),
    "falcon_mq": Family(lambda: _falcon(multi_query=True), text_batch, "FalconAttention",
                        FalconAccess, None, 4, 1, (8, "rotate_half"), ("qk", "vo"),
                        (_gl("qk", 1, 128, 32, query_heads=4, group="GL(1,C)^4"),
                         _gl("vo", 1, 32, 128, query_heads=4))),
    "falcon_alibi": Family(lambda: _falcon(multi_query=False, alibi=True, bias=True),
                           text_batch, "FalconAttention", FalconAccess, None, 4, 4, None,
                           ("qk", "vo"), (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # DeBERTa-v2's disentangled attention: relative positions scored against queries and keys;
    # with share_att_key=True through query_proj and key_proj themselves, so the qk pair moves
    # the position scores with it and stays exact
    "deberta_v2_shared": Family(lambda: _deberta_v2(share_att_key=True), text_batch,
                                "DebertaV2Attention", LinearAccess, DEBERTA_PATHS, 4, 4, None,
                                ("qk", "vo"), (_gl("qk", 4, 33, 33), _gl("vo", 4, 33, 32))),
    # ... and with pos_key_proj/pos_query_proj of their own, which no qk element moves: vo only
    "deberta_v2": Family(lambda: _deberta_v2(share_att_key=False), text_batch,
                         "DebertaV2Attention", LinearAccess, DEBERTA_PATHS, 4, 4, None, ("vo",),
                         (_gl("vo", 4, 33, 32),)),
    "torch_mha": Family(MHAClassifier, mha_batch, "MultiheadAttention", MultiheadAccess, None,
                        2, 2, None, ("qk", "vo"),
                        (_gl("qk", 2, 17, 17), _gl("vo", 2, 17, 16))),
}


@functools.cache
def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = FAMILIES[name].build()
    return randomize(model.to(torch.float64).eval())


def model_of(name: str) -> nn.Module:
    return copy.deepcopy(_model(name))


def attention_modules(model: nn.Module, family: Family) -> list[nn.Module]:
    return [module for module in model.modules()
            if type(module).__name__ == family.attention_class]


def moved_by_hand(model: nn.Module, family: Family, seed: int = 5) -> nn.Module:
    """A copy of ``model`` with a random group element applied by hand to every module."""
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for module in attention_modules(moved, family):
        access = family.access(module, family.paths)
        projections = transform_by_hand(access.read(), family.heads, family.kv_heads,
                                        family.rotary, family.kinds, generator)
        access.write(projections)
    return moved


def last_hidden(module: nn.Module, **inputs) -> torch.Tensor:
    """The last hidden state of a headless model on ``inputs``."""
    with torch.no_grad():
        return module(**inputs).last_hidden_state


def logits(model: nn.Module, batch) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(batch, tuple):
            return model(batch[0])
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


# ---------------------------------------------------------------------- discovery
@pytest.mark.parametrize("name", list(FAMILIES))
def test_pairs_and_groups_per_family(name):
    family = FAMILIES[name]
    model = _model(name)
    report = find_symmetries(model)
    assert report.unknown == []
    modules = attention_modules(model, family)
    assert len(modules) == family.modules
    assert len(report.modules) == family.modules
    found = Counter((g.kind, g.heads, g.n, g.m, g.head_dim, g.group, g.query_heads)
                    for g in report.groups)
    assert found == Counter({entry: family.modules for entry in family.expected})
    for pair in report.pairs:
        assert pair.rotary == (family.rotary if pair.kind == "qk" else None)
    for module in report.modules:
        assert module.kinds == family.kinds
        assert (module.heads, module.kv_heads) == (family.heads, family.kv_heads)
    rotary_dims = family.rotary[0] if family.rotary else None
    assert report.group_dimension == family.modules * sum(
        pairs * (rotary_dims + (h - rotary_dims) ** 2 if kind == "qk" and rotary_dims else h * h)
        for kind, pairs, _, _, h, _, _ in family.expected)
    # every parameter of the projections that carry pairs is covered, nothing else
    covered = set(report.pair_parameters)
    assert covered.isdisjoint(report.other)
    assert "NOT understood" not in report.summary()


def test_notes_say_what_breaks_a_pair_and_what_does_not():
    notes = {name: " | ".join(find_symmetries(_model(name)).notes)
             for name in ("llama", "gpt_neox", "gptj", "mistral", "bloom", "qwen3", "t5",
                          "swinv2")}
    assert "no qk pairs" in notes["swinv2"] and "cosine attention" in notes["swinv2"]
    assert "rotate_half layout" in notes["llama"] and "modeling_llama.rotate_half" in notes["llama"]
    assert "grouped-query attention" in notes["llama"]
    assert "4 of 8 dimensions" in notes["gpt_neox"] and "rotary_ndims=4" in notes["gpt_neox"]
    assert "interleaved layout" in notes["gptj"] and "rotate_every_two" in notes["gptj"]
    assert "sliding window of 4 tokens" in notes["mistral"]
    assert "ALiBi" in notes["bloom"] and "stay exact" in notes["bloom"]
    assert "no qk pairs" in notes["qwen3"] and "q_norm" in notes["qwen3"]
    assert "relative position bias" in notes["t5"]


def test_one_normalisation_shared_by_queries_and_keys_breaks_the_query_key_pairs():
    """Muse Spark applies one ``qk_norm`` child to the queries and to the keys: a GL(8) element
    on its qk pairs changes the hidden states, so they are dropped."""
    torch.manual_seed(0)
    model = randomize(T.MuseSparkTextModel(T.MuseSparkTextConfig(
        hidden_size=32, intermediate_size=37, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50,
        pad_token_id=0, attn_implementation="eager",
        experts_implementation="eager")).double().eval())
    report = find_symmetries(model)
    assert "qk" not in {pair.kind for pair in report.pairs}
    assert any("no qk pairs" in note and "q_norm/k_norm" in note for note in report.notes)
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    hidden = functools.partial(last_hidden, input_ids=tokens)
    attention = next(m for m in model.modules() if type(m).__name__.endswith("Attention"))
    # an element of the rotations' centraliser: only the normalisation breaks the pairs
    family = Family(lambda: model, text_batch, type(attention).__name__, LinearAccess,
                    LLAMA_PATHS, 4, 2, (8, "rotate_half"), ("qk",), ())
    assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3


def test_query_and_key_layernorms_drop_only_the_query_key_pairs():
    """HunYuan normalises queries and keys per head in children ``query_layernorm`` and
    ``key_layernorm``: the qk pairs go, with the normalisation named; the vo pairs stay and a
    random vo element keeps the hidden states (read before as extra projections: no pairs)."""
    torch.manual_seed(0)
    model = randomize(T.HunYuanDenseV1Model(T.HunYuanDenseV1Config(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=50, pad_token_id=0,
        attn_implementation="eager")).double().eval())
    report = find_symmetries(model)
    assert not report.unknown
    assert Counter(pair.kind for pair in report.pairs) == {"vo": 4}
    assert sum("no qk pairs" in note and "q_norm/k_norm" in note for note in report.notes) == 2
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    def hidden(parameters):
        with torch.no_grad():
            return torch.func.functional_call(model, parameters, (),
                                              {"input_ids": tokens}).last_hidden_state
    before = hidden(dict(model.named_parameters()))
    for seed in range(3):
        moved = reparametrize(model, report, scale=1.5, kinds=("vo",),
                              generator=torch.Generator().manual_seed(seed))
        assert (hidden(moved) - before).abs().max() <= 1e-10 * before.abs().max()


def test_a_convolution_over_the_projected_values_breaks_the_value_output_pairs():
    """Inkling convolves the projected keys and values over the sequence with one kernel per
    feature (``k_sconv``, ``v_sconv``): a GL(8) element on its vo pairs changes the hidden
    states, so they are dropped."""
    torch.manual_seed(0)
    model = randomize(T.InklingTextModel(T.InklingTextConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=1, vocab_size=50,
        pad_token_id=0, attn_implementation="eager",
        experts_implementation="eager")).double().eval())
    report = find_symmetries(model)
    assert report.pairs == [] and report.unknown == []
    assert any("no vo pairs" in note and "v_sconv" in note for note in report.notes)
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    hidden = functools.partial(last_hidden, input_ids=tokens)
    attention = model.layers[0].self_attn              # the config fixes its head layout
    family = Family(lambda: model, text_batch, "InklingAttention", LinearAccess, LLAMA_PATHS,
                    attention.num_heads, attention.num_key_value_heads, None, ("vo",), ())
    assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3


@pytest.mark.parametrize(("build", "weight"), [
    (lambda: T.OlmoForSequenceClassification(T.OlmoConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, num_labels=3, pad_token_id=0, bos_token_id=1,
        eos_token_id=1, clip_qkv=5.0)), "model.layers.0.self_attn.q_proj.weight"),
    # MPT keeps clip_qkv on its attention module (from attn_config), not on a config
    (lambda: T.MptForSequenceClassification(T.MptConfig(
        d_model=32, n_heads=4, n_layers=1, vocab_size=50, num_labels=3, pad_token_id=0,
        attn_config={"clip_qkv": 5.0})), "transformer.blocks.0.attn.Wqkv.weight"),
])
def test_clipped_projections_break_both_pairs(build, weight):
    torch.manual_seed(0)
    model = build()
    report = find_symmetries(model)
    assert report.pairs == [] and report.unknown == []
    assert [module.kinds for module in report.modules] == [()]
    assert sum("clip_qkv" in note for note in report.notes) == 2
    assert weight in report.other


def test_rotary_dims_must_match_the_rotary_embedding():
    model = model_of("llama")
    model.model.layers[0].self_attn.rotary_ndims = 6   # claims fewer than inv_freq rotates
    report = find_symmetries(model)
    assert {pair.kind for pair in report.pairs} == {"vo"}
    assert any("6 rotary dimensions" in note and "[8]" in note for note in report.notes)
    # a fused projection feeds both kinds: dropping qk drops vo too (a parameter is either
    # covered by pairs or not at all)
    model = model_of("gpt_neox")
    model.gpt_neox.layers[0].attention.rotary_ndims = 6
    report = find_symmetries(model)
    assert report.pairs == []
    assert any("also feed dropped pairs" in note for note in report.notes)


def test_rotary_layout_that_cannot_be_detected_drops_the_query_key_pair():
    class CustomRotary(nn.Module):
        """Rotary by its forward signature, but no rotation helper next to its class."""

        def __init__(self):
            super().__init__()
            self.num_heads = 2
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(8, 8) for _ in range(4))

        def forward(self, x, position_embeddings):
            raise NotImplementedError

    report = find_symmetries(CustomRotary())
    assert {pair.kind for pair in report.pairs} == {"vo"}
    assert any("not detected as rotate_half or interleaved" in note for note in report.notes)


def test_rotated_values_break_the_value_output_pair():
    """RoFormer's ``rotary_value=True`` rotates the values by their position: a GL(h) element
    on the value/output pair changes the logits, so the pair is dropped with a note."""
    model = model_of("roformer")
    for layer in model.roformer.encoder.layer:
        layer.attention.self.rotary_value = True
    report = find_symmetries(model)
    assert {pair.kind for pair in report.pairs} == {"qk"}
    assert any("no vo pairs" in note and "rotary_value=True" in note for note in report.notes)
    family = copy.copy(FAMILIES["roformer"])
    family.kinds = ("vo",)
    batch = family.batch()
    moved = moved_by_hand(model, family)
    assert (logits(moved, batch) - logits(model, batch)).abs().max() > 1e-3


def test_differential_attention_drops_the_value_output_pairs():
    """The control of the drop: a GL(8) element on DiffLlama's value heads and the output
    columns of their query heads changes the logits."""
    family = copy.copy(FAMILIES["diffllama"])
    family.kinds = ("vo",)
    model, batch = _model("diffllama"), family.batch()
    assert (logits(moved_by_hand(model, family), batch) - logits(model, batch)).abs().max() > 1e-3
    assert any("no vo pairs, differential attention" in note
               for note in find_symmetries(model).notes)


def test_gated_attention_output_drops_the_value_output_pairs():
    """AFMoE multiplies each head's output feature by feature by ``sigmoid(gate_proj(x))``
    before ``o_proj``: a GL(8) element on its vo pairs changes the hidden states, so they are
    dropped; a gate of one scalar per head commutes with GL(h) and keeps them."""
    torch.manual_seed(0)
    model = randomize(T.AfmoeModel(T.AfmoeConfig(
        hidden_size=32, intermediate_size=37, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50,
        num_experts=2, num_experts_per_tok=1, pad_token_id=0, attn_implementation="eager",
        experts_implementation="eager")).double().eval())
    report = find_symmetries(model)
    assert report.pairs == [] and report.unknown == []
    assert any("no vo pairs, the attention output is gated feature by feature (gate_proj)"
               in note for note in report.notes)
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    hidden = functools.partial(last_hidden, input_ids=tokens)
    family = Family(lambda: model, text_batch, "AfmoeAttention", LinearAccess, LLAMA_PATHS,
                    4, 2, None, ("vo",), ())
    assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3

    class ScalarGate(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_heads = 2
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(16, 16) for _ in range(4))
            self.g_proj = nn.Linear(16, 2)      # one gate per head

    assert {pair.kind for pair in find_symmetries(ScalarGate()).pairs} == {"qk", "vo"}


def test_a_normalised_attention_output_drops_the_value_output_pairs():
    """BitNet normalises the attention output (``attn_sub_norm``) before ``o_proj``, Kosmos-2's
    text attention likewise (``inner_attn_ln``): a GL(8) element on the vo pairs changes the
    hidden states, so they are dropped; the qk pairs stay."""
    torch.manual_seed(0)
    model = randomize(T.BitNetModel(T.BitNetConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, pad_token_id=0,
        attn_implementation="eager")).double().eval())
    report = find_symmetries(model)
    assert {pair.kind for pair in report.pairs} == {"qk"}
    assert any("no vo pairs, the attention output is normalised (attn_sub_norm)" in note
               for note in report.notes)
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    hidden = functools.partial(last_hidden, input_ids=tokens)
    family = Family(lambda: model, text_batch, "BitNetAttention", LinearAccess, LLAMA_PATHS,
                    4, 2, None, ("vo",), ())
    assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3
    kosmos = T.Kosmos2Config(text_config=dict(
        embed_dim=32, layers=1, attention_heads=4, ffn_dim=37, vocab_size=50),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                           num_attention_heads=4, image_size=8, patch_size=4),
        latent_query_num=4)
    with torch.device("meta"):
        kosmos_report = find_symmetries(T.Kosmos2Model(kosmos))
    text = [module for module in kosmos_report.modules if "text_model" in module.name]
    assert [module.kinds for module in text] == [("qk",)]
    assert any("(inner_attn_ln)" in note for note in kosmos_report.notes)


def test_hashing_attention_drops_both_kinds():
    """YOSO normalises queries, keys and each head's output (its LSH attention's expectation):
    GL(8) elements on either kind change the hidden states, so both are dropped."""
    torch.manual_seed(0)
    model = randomize(T.YosoModel(T.YosoConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
        vocab_size=50, max_position_embeddings=32)).double().eval())
    report = find_symmetries(model)
    assert report.pairs == [] and report.unknown == []
    assert sum("lsh_config" in note for note in report.notes) == 2
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    hidden = functools.partial(last_hidden, input_ids=tokens)
    for kind in ("qk", "vo"):
        family = Family(lambda: model, text_batch, "YosoAttention", LinearAccess,
                        ("self.query", "self.key", "self.value", "output.dense"), 4, 4, None,
                        (kind,), ())
        assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3, kind


def test_a_mask_computed_from_the_values_drops_the_value_output_pairs():
    """Doge adds ``exp(A * softplus(dt_proj(values)))`` to the scores: with a nonzero ``A`` a
    GL(8) element on the vo pairs changes the hidden states, so they are dropped."""
    torch.manual_seed(0)
    model = randomize(T.DogeModel(T.DogeConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, pad_token_id=0,
        attn_implementation="eager")).double().eval())
    report = find_symmetries(model)
    assert "vo" not in {pair.kind for pair in report.pairs}
    assert any("no vo pairs" in note and "dt_proj" in note for note in report.notes)
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    hidden = functools.partial(last_hidden, input_ids=tokens)
    family = Family(lambda: model, text_batch, "DogeAttention", LinearAccess, LLAMA_PATHS,
                    4, 2, None, ("vo",), ())
    assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3


def test_relative_key_and_value_embeddings_drop_both_kinds():
    """VITS's text encoder multiplies the queries by relative key embeddings (``emb_rel_k``) and
    adds relative value embeddings (``emb_rel_v``) to each head's output: GL(8) elements on
    either kind change the hidden states, so both are dropped."""
    from transformers.models.vits.modeling_vits import VitsTextEncoder

    torch.manual_seed(0)
    model = randomize(VitsTextEncoder(T.VitsConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, ffn_dim=37, vocab_size=50,
        window_size=2)).double().eval())
    report = find_symmetries(model)
    assert report.pairs == [] and report.unknown == []
    assert any("no qk pairs" in note and "emb_rel_k" in note for note in report.notes)
    assert any("no vo pairs" in note and "emb_rel_v" in note for note in report.notes)
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))
    padding = torch.ones(2, SEQUENCE, 1, dtype=torch.float64)

    hidden = functools.partial(last_hidden, input_ids=tokens, padding_mask=padding)
    for kind in ("qk", "vo"):
        family = Family(lambda: model, text_batch, "VitsAttention", LinearAccess,
                        ("q_proj", "k_proj", "v_proj", "out_proj"), 4, 4, None, (kind,), ())
        assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3, kind


def test_queries_times_box_positions_drop_the_query_key_pairs():
    """BROS adds ``einsum(query, bbox_pos_emb)`` (relative bounding-box embeddings of the head
    dimension) to the scores: a GL(16) element on its qk pairs changes the hidden states, so
    they are dropped; vo stays."""
    torch.manual_seed(0)
    model = randomize(T.BrosModel(T.BrosConfig(
        hidden_size=64, intermediate_size=37, num_hidden_layers=1, num_attention_heads=4,
        vocab_size=50, max_position_embeddings=32)).double().eval())
    report = find_symmetries(model)
    assert {pair.kind for pair in report.pairs} == {"vo"}
    assert any("no qk pairs" in note and "bbox_pos_emb" in note for note in report.notes)
    generator = torch.Generator().manual_seed(3)
    inputs = {"input_ids": torch.randint(2, 50, (2, SEQUENCE), generator=generator),
              "bbox": torch.rand(2, SEQUENCE, 8, generator=generator, dtype=torch.float64)}

    hidden = functools.partial(last_hidden, **inputs)
    family = Family(lambda: model, text_batch, "BrosAttention", LinearAccess,
                    ("self.query", "self.key", "self.value", "output.dense"), 4, 4, None,
                    ("qk",), ())
    assert (hidden(moved_by_hand(model, family)) - hidden(model)).abs().max() > 1e-3


def test_a_delta_rule_attention_keeps_no_pairs():
    """Bailing's hybrid layers are gated delta-rule (linear) attentions with q/k/v/o
    projections: a convolution over the concatenated projections, L2-normalised keys and a
    recurrent state, no softmax of ``q k^T``. Neither kind is a GL(h) symmetry."""
    config = T.AutoConfig.for_model(
        "bailing_hybrid", hidden_size=32, intermediate_size=37, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50,
        pad_token_id=0)
    with torch.device("meta"):
        model = T.AutoModel.from_config(config)
    report = find_symmetries(model)
    delta = [module for module in report.modules
             if "Delta" in type(model.get_submodule(module.name)).__name__]
    assert delta and all(module.kinds == () for module in delta)
    assert any("no qk pairs, a gated delta-rule" in note for note in report.notes)


def _speecht5():
    torch.manual_seed(0)
    config = T.SpeechT5Config(
        hidden_size=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, vocab_size=50,
        encoder_max_relative_position=4, max_text_positions=16, pad_token_id=0)
    return randomize(T.SpeechT5ForTextToSpeech(config).double().eval())


def test_queries_times_relative_positions_drop_the_query_key_pairs():
    """SpeechT5's encoder adds ``q @ position_bias^T`` (relative position embeddings of the
    head dimension) to the scores: a GL(8) element on its qk pairs changes the hidden states,
    so they are dropped; its decoder's self- and cross-attention keep both kinds."""
    model = _speecht5()
    report = find_symmetries(model)
    kinds = {module.name: module.kinds for module in report.modules}
    encoder = [name for name in kinds if ".encoder." in name]
    decoder = [name for name in kinds if ".decoder." in name]
    assert len(encoder) == 1 and len(decoder) == 2
    assert [kinds[name] for name in encoder] == [("vo",)]
    assert all(kinds[name] == ("qk", "vo") for name in decoder)
    assert any("no qk pairs, queries are multiplied by relative position" in note
               for note in report.notes)
    encoder_model = model.speecht5.encoder
    tokens = torch.randint(2, 50, (2, SEQUENCE), generator=torch.Generator().manual_seed(3))

    hidden = functools.partial(last_hidden, input_values=tokens)
    family = Family(lambda: encoder_model, text_batch, "SpeechT5Attention", LinearAccess,
                    ("q_proj", "k_proj", "v_proj", "out_proj"), 4, 4, None, ("qk",), ())
    assert (hidden(moved_by_hand(encoder_model, family)) - hidden(encoder_model)).abs().max() > 1e-3
    encoder_report = find_symmetries(encoder_model)
    moved = reparametrize(encoder_model, encoder_report, scale=1.5,
                          generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        after = torch.func.functional_call(encoder_model, moved, (),
                                           {"input_values": tokens}).last_hidden_state
    torch.testing.assert_close(after, hidden(encoder_model), rtol=1e-10, atol=1e-10)


def test_partial_rotary_of_one_layer_type_is_read_from_its_rope_parameters():
    """MiMo-V2-Flash keeps ``rope_parameters`` per layer type (``{"full_attention": {...,
    "partial_rotary_factor": ...}}``) and one ``full_attention_inv_freq`` buffer per type: 2 of
    the 8 dimensions of a head are rotated, so the qk group is GL(1,C) x GL(6), not GL(1,C)^4
    (whose elements mix rotated and unrotated dimensions and change the attention output)."""
    torch.manual_seed(0)
    config = T.MiMoV2FlashConfig(
        hidden_size=32, intermediate_size=37, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, v_head_dim=8,
        vocab_size=50, n_routed_experts=2, num_experts_per_tok=1, pad_token_id=0,
        layer_types=["full_attention"], mlp_layer_types=["dense"],
        attn_implementation="eager")
    config.rope_parameters["full_attention"]["partial_rotary_factor"] = 0.25
    model = randomize(T.MiMoV2FlashForCausalLM(config).double().eval())
    report = find_symmetries(model)
    assert {pair.rotary for pair in report.pairs if pair.kind == "qk"} == {(2, "rotate_half")}
    assert any("rope_parameters['full_attention']['partial_rotary_factor']=0.25" in note
               for note in report.notes)
    family = Family(lambda: model, text_batch, "MiMoV2FlashAttention", LinearAccess,
                    LLAMA_PATHS, 4, 2, (2, "rotate_half"), ("qk",), ())
    batch = text_batch()
    assert_attention_outputs_kept(model, moved_by_hand(model, family), family, batch)
    family.rotary = (8, "rotate_half")              # what was reported before
    moved = moved_by_hand(model, family)
    assert (logits(moved, batch) - logits(model, batch)).abs().max() > 1e-3
    # the per-type inv_freq buffers are checked too: a module claiming 6 rotated dimensions
    # loses its qk pairs
    model.model.layers[0].self_attn.rotary_ndims = 6
    report = find_symmetries(model)
    assert {pair.kind for pair in report.pairs} == {"vo"}
    assert any("6 rotary dimensions" in note and "[2]" in note for note in report.notes)


def test_rotary_position_embedding_type_keeps_the_centraliser():
    """ESM's ``position_embedding_type="rotary"`` is the rotary embedding of its
    ``rotary_embeddings`` child, not position embeddings mixed into the keys: the qk pairs keep
    the centraliser. ESM rotates in float32 whatever the model's dtype, so a centraliser element
    (condition 1e3) moves the logits by float32 rounding only, a GL(8) element by far more."""
    torch.manual_seed(0)
    model = randomize(T.EsmForSequenceClassification(T.EsmConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        vocab_size=50, max_position_embeddings=16, num_labels=3, pad_token_id=0,
        position_embedding_type="rotary", attn_implementation="sdpa")).double().eval())
    report = find_symmetries(model)
    assert Counter((pair.kind, pair.group) for pair in report.pairs) == Counter(
        {("qk", "GL(1,C)^4"): 4, ("vo", "GL(8)"): 4})
    assert {pair.rotary for pair in report.pairs if pair.kind == "qk"} == {(8, "rotate_half")}
    assert not any("mixes keys" in note for note in report.notes)
    family = Family(lambda: model, text_batch, "EsmAttention", LinearAccess,
                    ("self.query", "self.key", "self.value", "output.dense"), 4, 4,
                    (8, "rotate_half"), ("qk",), ())
    batch = text_batch()
    reference = logits(model, batch)
    changes = {}
    for rotary in ((8, "rotate_half"), None):
        family.rotary = rotary
        moved = logits(moved_by_hand(model, family), batch)
        changes[rotary] = float((moved - reference).abs().max() / reference.abs().max())
    float32_rounding = torch.finfo(torch.float32).eps
    assert changes[(8, "rotate_half")] < CONDITION * float32_rounding, changes
    assert changes[None] > 1e-2, changes


def test_tiled_key_value_sharing_is_not_taken_for_grouped():
    class Tiled(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_heads = 4
            self.q_proj, self.k_proj = nn.Linear(16, 16), nn.Linear(16, 8)
            self.v_proj, self.o_proj = nn.Linear(16, 8), nn.Linear(16, 16)

    module = Tiled()
    helpers = types.ModuleType("tiled_modeling")
    helpers.repeat_kv = lambda x, n: x.repeat(1, n, 1, 1)
    sys.modules["tiled_modeling"] = helpers
    try:
        type(module).__module__ = "tiled_modeling"
        report = find_symmetries(module)
    finally:
        del sys.modules["tiled_modeling"]
    assert report.unknown == [""] and "tiled" in report.unknown_reasons[""]


# ---------------------------------------------------------------------- layout
def _head_blocks(p: Projections, heads: int, kv_heads: int):
    """Per query head ``[W_q,i^T ; b_q,i]``, per key/value head ``[W^T ; b]`` and ``W_o[:, i]``."""
    def with_bias(weight, bias, count):
        blocks = weight.reshape(count, -1, weight.shape[-1]).transpose(1, 2)
        if bias is None:
            return blocks
        return torch.cat([blocks, bias.reshape(count, 1, -1)], dim=1)
    q = with_bias(p.wq, p.bq, heads)
    k = with_bias(p.wk, p.bk, kv_heads)
    v = with_bias(p.wv, p.bv, kv_heads)
    o = p.wo.reshape(p.wo.shape[0], heads, -1).permute(1, 0, 2)
    return q, k, v, o


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gpt_neox", "gptj", "bloom"])
def test_factors_stack_the_query_heads_of_each_group(name):
    family = FAMILIES[name]
    model = _model(name)
    report = find_symmetries(model)
    params = dict(model.named_parameters())
    layout = ParameterLayout(report, params)
    coords = layout.to_coordinates(params)
    factors = {(pair.module, pair.kind, pair.head): (g[index], h[index])
               for (g, h), pairs in zip(coords.gl, coords.gl_pairs, strict=True)
               for index, pair in enumerate(pairs)}
    group = family.heads // family.kv_heads
    for module_name, module in model.named_modules():
        if type(module).__name__ != family.attention_class:
            continue
        q, k, v, o = _head_blocks(family.access(module, family.paths).read(), family.heads,
                                  family.kv_heads)
        for j in range(family.kv_heads):
            members = slice(j * group, (j + 1) * group)
            g, h = factors[(module_name, "qk", j)]
            assert torch.equal(g, q[members].reshape(-1, q.shape[-1]))
            assert torch.equal(h, k[j])
            g, h = factors[(module_name, "vo", j)]
            assert torch.equal(g, v[j])
            assert torch.equal(h, o[members].reshape(-1, o.shape[-1]))
    assert layout.bucket_rotary == [family.rotary, None]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["llama", "mistral", "gpt_neox", "bloom"])
def test_round_trip_is_bit_identical(name, dtype):
    model = _model(name).to(dtype) if dtype == torch.float64 else model_of(name).to(dtype)
    params = {n: p.detach() for n, p in model.named_parameters()}
    report = find_symmetries(model)
    layout = ParameterLayout(report, params)
    coords = layout.to_coordinates(params)
    back = layout.to_parameters(coords)
    assert list(back) == list(params)
    for n, tensor in back.items():
        assert tensor.dtype == dtype and torch.equal(tensor, params[n]), n
        assert tensor.is_contiguous()
    storages = {t.untyped_storage().data_ptr() for g, h in coords.gl for t in (g, h)}
    for n in report.pair_parameters:
        assert back[n].untyped_storage().data_ptr() not in storages, n
    # linear: the adjoint of the permutation is its inverse
    weights = {n: torch.randn(p.shape, dtype=torch.float64).to(dtype) for n, p in params.items()}
    leaves = [t.detach().clone().requires_grad_(True) for pair in coords.gl for t in pair]
    gl = [(leaves[2 * i], leaves[2 * i + 1]) for i in range(len(coords.gl))]
    rebuilt = layout.to_parameters(coords.replace(gl=gl))
    loss = sum((weights[n].double() * rebuilt[n].double()).sum() for n in report.pair_parameters)
    gradients = torch.autograd.grad(loss, leaves)
    expected = [t for pair in layout.to_coordinates(weights).gl for t in pair]
    for got, want in zip(gradients, expected, strict=True):
        assert torch.equal(got, want)


def test_buckets_separate_rotary_and_plain_pairs_of_one_shape():
    torch.manual_seed(0)
    config = T.LlamaConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=4, vocab_size=50)

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_heads = 4
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(32, 32, bias=False) for _ in range(4))

    model = nn.ModuleDict({"rope": T.LlamaModel(config), "plain": Plain()}).double()
    report = find_symmetries(model)
    assert report.bucket_shapes == {(32, 32, 8): 16}
    assert report.bucket_groups == {(32, 32, 8, (8, "rotate_half")): 4, (32, 32, 8, None): 12}
    layout = ParameterLayout(report, dict(model.named_parameters()))
    assert layout.bucket_rotary == [(8, "rotate_half"), None]
    assert [len(pairs) for pairs in layout.gl_pairs] == [4, 12]


# ---------------------------------------------------------------------- engine
def test_engine_uses_the_rotary_quotient_for_rotary_buckets():
    from quotientsharp.engine.functional import FunctionalModel
    model = _model("gpt_neox")
    report = find_symmetries(model)
    functional = FunctionalModel(model)
    layout = ParameterLayout(report, functional.theta_geometry)
    factors = LayoutCoordinates(functional, layout, set()).factors(metric="mix")
    quotients = [factor.quotient for factor in factors if factor.name == "gl"]
    assert isinstance(quotients[0], RotaryQuotient)
    assert (quotients[0].head_dim, quotients[0].rotary_dims, quotients[0].layout) == (
        8, 4, "rotate_half")
    assert quotients[0].group_name == "GL(1,C)^2 x GL(4)"
    assert type(quotients[1]) is qs.GLQuotient


# ---------------------------------------------------------------------- invariance
def _sharpness(model, batch, metric, order):
    with warnings.catch_warnings():
        # parameters without gradient (unused poolers) are excluded with a UserWarning
        warnings.simplefilter("ignore", UserWarning)
        return qs.sharpness(model, [batch], measure="geodesic", rho=0.1, metric=metric,
                            order=order, n_iter=5, seed=0, progress=False).value


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def assert_attention_outputs_kept(model, moved, family, batch):
    """Each attention module of ``moved`` on the inputs its twin in ``model`` saw gives the same
    output to the family's rounding (1e-10 in float64): the logits alone cannot say so where
    the modeling code rounds through float32 (Llama's RMSNorm, eager softmax) and hides any
    change below about 1e-7."""
    recorded = []
    hooks = [module.register_forward_hook(
        lambda module, args, kwargs, output: recorded.append((module, args, kwargs, output)),
        with_kwargs=True) for module in attention_modules(model, family)]
    try:
        logits(model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    twins = dict(zip(map(id, attention_modules(model, family)),
                     attention_modules(moved, family), strict=True))
    assert recorded
    for module, args, kwargs, output in recorded:
        # a key/value cache filled by the recorded call would be extended by the replay
        kwargs = {key: None if "cache" in key or "past" in key else value
                  for key, value in kwargs.items()}
        with torch.no_grad():
            again = _first(twins[id(module)](*args, **kwargs))
        expected = _first(output)
        torch.testing.assert_close(again, expected, rtol=family.rounding,
                                   atol=family.rounding * float(expected.abs().max()))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_group_element_by_hand_keeps_logits_and_geodesic_sharpness(name):
    family = FAMILIES[name]
    model = _model(name)
    batch = family.batch()
    moved = moved_by_hand(model, family)
    before, after = logits(model, batch), logits(moved, batch)
    torch.testing.assert_close(after, before, rtol=family.rounding, atol=family.rounding)
    assert_attention_outputs_kept(model, moved, family, batch)
    changed = [n for n, p in moved.named_parameters()
               if not torch.equal(p, model.get_parameter(n))]
    assert changed and set(changed) <= set(find_symmetries(model).pair_parameters)
    for metric in ("inv", "mix"):
        for order in (1, 2):
            reference = _sharpness(model, batch, metric, order)
            value = _sharpness(moved, batch, metric, order)
            assert abs(value - reference) <= max(1e-8, family.rounding) * abs(reference), (
                metric, order, value, reference)


def test_the_same_element_moves_adaptive_sharpness():
    """The control of the invariance test: a measure without the symmetries does change."""
    family = FAMILIES["llama"]
    model, batch = _model("llama"), family.batch()
    moved = moved_by_hand(model, family)
    values = [qs.sharpness(m, [batch], measure="adaptive", rho=0.1, n_iter=5, seed=0,
                           progress=False).value for m in (model, moved)]
    assert abs(values[1] - values[0]) > 1e-2 * abs(values[0]), values


@pytest.mark.parametrize("name", ["llama", "gpt_neox", "gptj", "roformer", "swinv2", "diffllama",
                                  "deberta_v2", "phi3", "falcon_gqa", "falcon_mq",
                                  "modernbert", "gpt_oss"])
def test_a_full_gl_element_on_a_rotary_pair_changes_the_logits(name):
    """The control: outside the centraliser the rotary query/key pair is not a symmetry (nor
    any GL(h) element under Swin v2's cosine attention or DeBERTa's position projections of
    their own, whose qk pairs are dropped)."""
    family = FAMILIES[name]
    model = _model(name)
    family_without_rotary = copy.copy(family)
    family_without_rotary.rotary = None
    family_without_rotary.kinds = ("qk",)
    moved = moved_by_hand(model, family_without_rotary)
    batch = family.batch()
    assert (logits(moved, batch) - logits(model, batch)).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gpt_neox", "gptj", "bloom",
                                  "distilbert", "roformer", "swinv2", "diffllama", "phi3",
                                  "mpt"])
def test_reparametrize_draws_in_the_subgroup_and_keeps_the_function(name):
    family = FAMILIES[name]
    model = _model(name)
    report = find_symmetries(model)
    moved, (matrices, _) = reparametrize(model, report, scale=1.5,
                                         generator=torch.Generator().manual_seed(7),
                                         return_transforms=True)
    batch = family.batch()
    with torch.no_grad():
        inputs = ((batch[0],) if isinstance(batch, tuple)
                  else {k: v for k, v in batch.items() if k != "labels"})
        if isinstance(inputs, tuple):
            output = torch.func.functional_call(model, moved, inputs)
        else:
            output = torch.func.functional_call(model, moved, (), inputs).logits
        torch.testing.assert_close(output, logits(model, batch), rtol=1e-10, atol=1e-10)
    layout = ParameterLayout(report, dict(model.named_parameters()))
    for rotary, a in zip(layout.bucket_rotary, matrices, strict=True):
        if rotary is None:
            continue
        rotary_dims, layout_name = rotary
        # a commutes with the generator of every plane's rotation, nothing mixes the blocks
        for plane in range(rotary_dims // 2):
            i, j = ((plane, plane + rotary_dims // 2) if layout_name == "rotate_half"
                    else (2 * plane, 2 * plane + 1))
            turn = torch.zeros(8, 8, dtype=torch.float64)
            turn[j, i], turn[i, j] = 1.0, -1.0
            torch.testing.assert_close(a @ turn, turn @ a, rtol=0, atol=1e-12)
        assert not a[:, :rotary_dims, rotary_dims:].any()
        assert not a[:, rotary_dims:, :rotary_dims].any()


# ---------------------------------------------------------------------- CLI
def test_cli_shows_the_group_of_each_pair(tmp_path, capsys):
    config = T.LlamaConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                           architectures=["LlamaForCausalLM"])
    path = tmp_path / "llama.json"
    path.write_text(config.to_json_string())
    assert models_cli.main(["symmetries", str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 heads (2 key/value heads)" in out
    assert "qk (n=64, m=32, h=8, GL(1,C)^4, rotate_half rotary on 8 dims)" in out
    assert "vo (n=32, m=64, h=8, GL(8))" in out
    assert "n=64, m=32, h=8, GL(1,C)^4: 4 pairs" in out
    assert models_cli.main(["symmetries", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    qk = [pair for pair in data["pairs"] if pair["kind"] == "qk"]
    assert {pair["group"] for pair in qk} == {"GL(1,C)^4"}
    assert qk[0]["rotary"] == [8, "rotate_half"] and qk[0]["query_heads"] == 2
    assert data["group_dimension"] == 2 * (2 * 8 + 2 * 64)


@pytest.mark.parametrize("build", [
    _decoder("Persimmon", qk_layernorm=True, partial_rotary_factor=0.5),
    # 3 of 8 dimensions rotated: not whole planes, the qk pairs are dropped
    _decoder("GPTNeoX", rotary_pct=0.375)], ids=["persimmon_qk_layernorm", "gpt_neox_odd_rotary"])
def test_a_fused_projection_whose_qk_pairs_break_keeps_no_vo_pairs(build):
    """query_key_value feeds both kinds: with the qk pairs dropped, vo pairs would cover a
    third of it, which no layout can tile; the parameter goes to the adaptive block whole."""
    torch.manual_seed(0)
    model = randomize(build().to(torch.float64).eval())
    report = find_symmetries(model)
    assert report.pairs == [] and report.unknown == []
    assert any("no vo pairs either" in note and "query_key_value.weight" in note
               for note in report.notes)
    assert all(name in report.other for name, _ in model.named_parameters()
               if "query_key_value" in name)
    ParameterLayout(report, dict(model.named_parameters()))


@pytest.mark.parametrize("name", ["llama"])
def test_the_attention_output_check_sees_what_the_logits_round_away(name):
    """The control of assert_attention_outputs_kept: a 1e-9 relative change of the query
    weights leaves these families' logits bit-identical but not their attention outputs."""
    family = FAMILIES[name]
    model, batch = _model(name), family.batch()
    nudged = copy.deepcopy(model)
    with torch.no_grad():
        for module in attention_modules(nudged, family):
            module.q_proj.weight.mul_(1 + 1e-9)
    torch.testing.assert_close(logits(nudged, batch), logits(model, batch), rtol=0, atol=0)
    with pytest.raises(AssertionError):
        assert_attention_outputs_kept(model, nudged, family, batch)


class InternLM2Attention(nn.Module):
    """After InternLM2's remote code: ``wqkv`` and ``wo`` as Phi-3/MPT name theirs, but the fused
    outputs are ``[kv heads, queries + 2, d]`` (each group's queries, its key, its value)."""

    def __init__(self, hidden=32, heads=4, kv_heads=2):
        super().__init__()
        self.num_heads, self.num_key_value_heads = heads, kv_heads
        self.num_key_value_groups = heads // kv_heads
        self.head_dim = hidden // heads
        self.wqkv = nn.Linear(hidden, (heads + 2 * kv_heads) * self.head_dim)
        self.wo = nn.Linear(heads * self.head_dim, hidden)

    def forward(self, x):
        batch, length, _ = x.shape
        fused = self.wqkv(x).view(batch, length, self.num_key_value_heads, -1, self.head_dim)
        query = fused[..., :-2, :].flatten(2, 3).transpose(1, 2)
        key, value = (fused[..., i, :].transpose(1, 2).repeat_interleave(
            self.num_key_value_groups, dim=1) for i in (-2, -1))
        weights = (query @ key.transpose(-1, -2) / self.head_dim ** 0.5).softmax(-1)
        return self.wo((weights @ value).transpose(1, 2).flatten(2))


def test_a_fused_projection_of_an_unknown_class_is_not_read_back_to_back():
    """``wqkv``/``qkv_proj``/``c_attn`` names do not tell the layout: a class not known to fuse
    back to back is reported, never claimed (read back to back, InternLM2's rows are no pair)."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"attention": InternLM2Attention()}).double()
    report = find_symmetries(model)
    assert report.pairs == [] and report.unknown == ["attention"]
    assert "unknown head layout" in report.unknown_reasons["attention"]
    assert "InternLM2Attention" in report.unknown_reasons["attention"]
    # the control: the back-to-back reading's first query head (rows 0:8) and key head
    # (rows 32:40) moved as a qk pair change the output
    module = model["attention"]
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        before = module(x)
        element = gl_element(8, CONDITION, torch.Generator().manual_seed(3))
        module.wqkv.weight[:8] = element.T @ module.wqkv.weight[:8]
        module.wqkv.bias[:8] = element.T @ module.wqkv.bias[:8]
        module.wqkv.weight[32:40] = torch.linalg.inv(element) @ module.wqkv.weight[32:40]
        module.wqkv.bias[32:40] = torch.linalg.inv(element) @ module.wqkv.bias[32:40]
        assert (module(x) - before).abs().max() > 1e-3


def test_the_attention_variants_page_has_no_control_characters():
    """Its tables' math is written from Python strings: an unescaped ``\\t`` of ``^\\top`` there
    leaves a tab and ``op`` on the page, which KaTeX cannot render."""
    page = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "attention-variants.md")
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    assert [c for c in text if ord(c) < 32 and c != "\n"] == []


def test_key_value_heads_read_from_the_config_of_a_back_to_back_fused_projection():
    """Ergo's attention fuses grouped queries, keys and values back to back in ``qkv_proj`` and
    reads its key/value heads from its config alone: the module is understood (its
    ``q_norm``/``k_norm`` drop qk, and with them vo, which shares ``qkv_proj``), not reported
    with a width that does not add up."""
    torch.manual_seed(0)
    model = T.ErgoForCausalLM(T.ErgoConfig(
        hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=50))
    report = find_symmetries(model)
    assert report.unknown == [] and report.pairs == []
    assert [(m.heads, m.kv_heads, m.kinds) for m in report.modules] == [(4, 2, ())]
    notes = " | ".join(report.notes)
    assert "q_norm" in notes and "no vo pairs either" in notes


def test_llama4_keeps_query_key_pairs_only_on_its_layers_without_positions():
    # a rope layer rotates (complex-valued, a layout not detected) and L2-normalises queries
    # and keys: no qk pairs; a NoPE layer does neither
    model = T.Llama4ForCausalLM(T.Llama4TextConfig(
        hidden_size=32, intermediate_size=32, intermediate_size_mlp=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50,
        num_local_experts=2, no_rope_layers=[1, 0], pad_token_id=0, bos_token_id=1,
        eos_token_id=1))
    report = find_symmetries(model)
    assert [module.kinds for module in report.modules] == [("vo",), ("qk", "vo")]
    assert all(pair.rotary is None for pair in report.pairs)
