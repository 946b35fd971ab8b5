"""Per-architecture recognisers of attention modules: which parameter slices form which factor.

Each handler looks at one module and returns ``None`` (not its layout), a :class:`Finding` (the
:class:`~.report.PairGroup` of each pair kind, with notes), or raises :class:`Unsupported` (an
attention layout whose pairs are not a ``GL(h)`` symmetry, or that it cannot read). The handlers,
tried in the order of :data:`HANDLERS`:

- ``torch.nn.MultiheadAttention`` (fused ``in_proj_weight`` or separate q/k/v weights);
- HuggingFace BERT/ViT style ``X.{self|attention}.{query,key,value}`` + ``X.output.dense``;
- generic ``q_proj/k_proj/v_proj`` + ``o_proj|out_proj`` (and ``q/k/v/o``,
  ``query/key/value/out_proj``) with a head count attribute;
- HuggingFace GPT-2 fused ``c_attn`` / ``c_proj`` ``Conv1D``.

:func:`looks_like_attention` flags the modules that look like attention, so that the walker
(:mod:`.walker`) can report the ones no handler understood. Nothing here reads or writes tensor
values: only names, shapes and module structure.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from .report import FactorSource, PairGroup

__all__ = [
    "HANDLERS",
    "HEAD_COUNT_ATTRIBUTES",
    "QKV_LIKE_NAMES",
    "Finding",
    "Unsupported",
    "looks_like_attention",
    "own_qkv_like_count",
]

#: Attributes that hold the number of attention heads, in the order they are tried.
HEAD_COUNT_ATTRIBUTES = ("num_heads", "num_attention_heads", "n_heads", "heads")
#: Child (or parameter) names that make a module look like attention when no handler knows it.
QKV_LIKE_NAMES = frozenset({
    "query", "key", "value", "q", "k", "v", "q_proj", "k_proj", "v_proj", "qkv", "qkv_proj",
    "c_attn", "q_attn", "in_proj", "in_proj_weight", "wqkv", "to_q", "to_k", "to_v", "to_qkv",
    "wq", "wk", "wv", "query_key_value", "kv", "kv_proj",
})
#: Forward arguments or children that announce rotary position embeddings (they break QK).
_ROTARY_MARKERS = ("position_embeddings", "rotary_pos_emb", "freqs_cis", "rotary_emb", "rope")


class Unsupported(Exception):
    """A module looks like attention but its layout is not a supported symmetry."""


@dataclass
class Finding:
    layout: str
    heads: int
    groups: list[PairGroup]
    notes: list[str] = field(default_factory=list)


def _parameter_name(names: dict[int, str], tensor: object, what: str) -> str:
    if not isinstance(tensor, nn.Parameter) or id(tensor) not in names:
        raise Unsupported(f"{what} is not a plain registered parameter "
                           "(parametrized, or a buffer?)")
    return names[id(tensor)]


def _linear_rows(linear: nn.Module, names: dict[int, str], what: str) -> tuple[FactorSource, ...]:
    """Sources ``[weight[rows].T ; bias[rows]]`` of an ``nn.Linear`` q/k/v projection."""
    weight = _parameter_name(names, linear.weight, f"{what}.weight")
    sources = [FactorSource(weight, "weight", 0, 0, int(linear.weight.shape[1]))]
    if linear.bias is not None:
        sources.append(FactorSource(_parameter_name(names, linear.bias, f"{what}.bias"),
                                    "bias", 0, 0, 1))
    return tuple(sources)


def _linear_columns(linear: nn.Module, names: dict[int, str], what: str) -> tuple[FactorSource]:
    """Source ``weight[:, rows]`` of an ``nn.Linear`` output projection (its bias is excluded)."""
    weight = _parameter_name(names, linear.weight, f"{what}.weight")
    return (FactorSource(weight, "weight", 1, 0, int(linear.weight.shape[0])),)


def _head_count(module: nn.Module, q_features: int) -> int:
    for attribute in HEAD_COUNT_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    head_dim = getattr(module, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0 and q_features % head_dim == 0:
        return q_features // head_dim
    config_heads = getattr(getattr(module, "config", None), "num_attention_heads", None)
    if isinstance(config_heads, int) and config_heads > 0:
        return config_heads
    raise Unsupported("no head count attribute (" + ", ".join(HEAD_COUNT_ATTRIBUTES)
                       + ", head_dim or config.num_attention_heads)")


def _check_head_split(module: nn.Module, heads: int, q: nn.Linear, k: nn.Linear,
                      v: nn.Linear, o: nn.Linear) -> tuple[int, int]:
    """Head dims ``(d_k, d_v)`` of a q/k/v/o Linear attention, after consistency checks."""
    if q.out_features % heads or v.out_features % heads:
        raise Unsupported(f"{heads} heads do not divide the projection widths "
                           f"({q.out_features}, {v.out_features})")
    if k.out_features != q.out_features:
        raise Unsupported(f"key width {k.out_features} differs from query width {q.out_features} "
                           "(grouped/multi-query attention shares keys and values between heads: "
                           "not a per-head GL(h) pair)")
    if o.in_features != v.out_features:
        raise Unsupported(f"output projection reads {o.in_features} features, values have "
                           f"{v.out_features}")
    head_dim_k = q.out_features // heads
    for attribute in ("head_dim", "attention_head_size"):
        declared = getattr(module, attribute, None)
        if isinstance(declared, int) and declared != head_dim_k:
            raise Unsupported(f"{attribute}={declared} but the query width {q.out_features} and "
                               f"{heads} heads give {head_dim_k}")
    groups = getattr(module, "num_key_value_groups", 1)
    if isinstance(groups, int) and groups != 1:
        raise Unsupported(f"num_key_value_groups={groups}: grouped-query attention")
    return head_dim_k, v.out_features // heads


def _qk_breakers(module: nn.Module) -> list[str]:
    """Reasons why the query/key factorisation is not a GL(h) symmetry of this module."""
    reasons = []
    try:
        arguments = set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        arguments = set()
    children = {name.lower() for name, _ in module.named_children()}
    marked = [marker for marker in _ROTARY_MARKERS
              if marker in arguments or any(marker in child for child in children)
              or hasattr(module, marker)]
    if marked:
        reasons.append(f"rotary position embeddings ({', '.join(marked)}) rotate queries and keys "
                       "between the projections and the scores")
    if children & {"q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_norm", "key_norm"}:
        reasons.append("queries/keys are normalised per head before the scores")
    position_type = getattr(module, "position_embedding_type", None)
    if position_type not in (None, "absolute"):
        reasons.append(f"position_embedding_type={position_type!r} mixes keys with position "
                       "embeddings")
    return reasons


def _qkvo_groups(name: str, module: nn.Module, heads: int, q: nn.Linear, k: nn.Linear,
                 v: nn.Linear, o: nn.Linear, names: dict[int, str], prefix: str,
                 child_names: Sequence[str]) -> tuple[list[PairGroup], list[str]]:
    head_dim_k, head_dim_v = _check_head_split(module, heads, q, k, v, o)
    q_name, k_name, v_name, o_name = (f"{prefix}{child}" for child in child_names)
    notes = []
    groups = []
    breakers = _qk_breakers(module)
    if breakers:
        notes.append(f"{name}: no qk pairs, " + "; ".join(breakers))
    else:
        groups.append(PairGroup(name, "qk", heads, head_dim_k, _linear_rows(q, names, q_name),
                                _linear_rows(k, names, k_name)))
    groups.append(PairGroup(name, "vo", heads, head_dim_v, _linear_rows(v, names, v_name),
                            _linear_columns(o, names, o_name)))
    return groups, notes


def _is_linear(module: object) -> bool:
    return isinstance(module, nn.Linear)


def _handle_multihead_attention(name: str, module: nn.Module,
                                names: dict[int, str]) -> Finding | None:
    if not isinstance(module, nn.MultiheadAttention):
        return None
    if module.bias_k is not None or module.bias_v is not None:
        raise Unsupported("add_bias_kv=True appends learned key/value rows, not supported")
    embed, heads = module.embed_dim, module.num_heads
    head_dim = embed // heads
    if module._qkv_same_embed_dim:
        fused = _parameter_name(names, module.in_proj_weight, "in_proj_weight")
        weights = [FactorSource(fused, "weight", 0, i * embed, embed) for i in range(3)]
    else:
        weights = [FactorSource(_parameter_name(names, tensor, label), "weight", 0, 0,
                                int(tensor.shape[1]))
                   for tensor, label in ((module.q_proj_weight, "q_proj_weight"),
                                         (module.k_proj_weight, "k_proj_weight"),
                                         (module.v_proj_weight, "v_proj_weight"))]
    if module.in_proj_bias is not None:
        bias = _parameter_name(names, module.in_proj_bias, "in_proj_bias")
        biases = [(FactorSource(bias, "bias", 0, i * embed, 1),) for i in range(3)]
    else:
        biases = [(), (), ()]
    q, k, v = ((weights[i],) + biases[i] for i in range(3))
    out = _linear_columns(module.out_proj, names, "out_proj")
    groups = [PairGroup(name, "qk", heads, head_dim, q, k),
              PairGroup(name, "vo", heads, head_dim, v, out)]
    notes = []
    if module.add_zero_attn:
        notes.append(f"{name}: add_zero_attn appends zero keys/values, which every GL(h) action "
                     "keeps at zero: the pairs stay exact")
    return Finding("multihead_attention", heads, groups, notes)


def _handle_bert(name: str, module: nn.Module, names: dict[int, str]) -> Finding | None:
    """HF BERT-style ``X.{self|attention}.{query,key,value}`` + ``X.output.dense``."""
    output = getattr(module, "output", None)
    dense = getattr(output, "dense", None) if isinstance(output, nn.Module) else None
    if not _is_linear(dense):
        return None
    for inner_name in ("self", "attention"):
        inner = module._modules.get(inner_name)
        if inner is None:
            continue
        q, k, v = (inner._modules.get(child) for child in ("query", "key", "value"))
        if not (_is_linear(q) and _is_linear(k) and _is_linear(v)):
            continue
        heads = _head_count(inner, q.out_features)
        prefix = f"{name}." if name else ""
        inner_prefix = f"{prefix}{inner_name}."
        groups, notes = _qkvo_groups(name, inner, heads, q, k, v, dense, names, "", (
            f"{inner_prefix}query", f"{inner_prefix}key", f"{inner_prefix}value",
            f"{prefix}output.dense"))
        return Finding("bert", heads, groups, notes)
    return None


_QKVO_NAMINGS = (
    ("q_proj", "k_proj", "v_proj", ("o_proj", "out_proj")),
    ("q", "k", "v", ("o",)),
    ("query", "key", "value", ("out_proj", "o_proj")),
)


def _handle_qkvo(name: str, module: nn.Module, names: dict[int, str]) -> Finding | None:
    for q_child, k_child, v_child, o_children in _QKVO_NAMINGS:
        q, k, v = (module._modules.get(child) for child in (q_child, k_child, v_child))
        o_child = next((child for child in o_children if module._modules.get(child) is not None),
                       None)
        if o_child is None or not (_is_linear(q) and _is_linear(k) and _is_linear(v)):
            continue
        o = module._modules[o_child]
        if not _is_linear(o):
            raise Unsupported(f"output projection {o_child} is a {type(o).__name__}, not Linear")
        heads = _head_count(module, q.out_features)
        prefix = f"{name}." if name else ""
        groups, notes = _qkvo_groups(name, module, heads, q, k, v, o, names, prefix,
                                     (q_child, k_child, v_child, o_child))
        return Finding("qkvo", heads, groups, notes)
    return None


def _handle_gpt2(name: str, module: nn.Module, names: dict[int, str]) -> Finding | None:
    """HF GPT-2: fused ``c_attn`` and ``c_proj`` ``Conv1D`` (``y = x W + b``, ``W=[in, out]``)."""
    c_attn, c_proj = module._modules.get("c_attn"), module._modules.get("c_proj")
    if c_attn is None or c_proj is None:
        return None
    if type(c_attn).__name__ != "Conv1D" or type(c_proj).__name__ != "Conv1D":
        return None
    if getattr(module, "is_cross_attention", False) or "q_attn" in module._modules:
        raise Unsupported("GPT-2 cross-attention (q_attn) is not supported")
    embed = int(c_attn.weight.shape[0])
    if tuple(c_attn.weight.shape) != (embed, 3 * embed) or tuple(c_proj.weight.shape) != (embed,
                                                                                           embed):
        raise Unsupported(f"c_attn {tuple(c_attn.weight.shape)} / c_proj "
                           f"{tuple(c_proj.weight.shape)} are not [E, 3E] / [E, E]")
    heads = _head_count(module, embed)
    if embed % heads:
        raise Unsupported(f"{heads} heads do not divide the width {embed}")
    prefix = f"{name}." if name else ""
    fused = _parameter_name(names, c_attn.weight, f"{prefix}c_attn.weight")
    # Conv1D stores W as [in, out]: the head features run along dimension 1.
    weights = [FactorSource(fused, "weight", 1, i * embed, embed) for i in range(3)]
    biases: list[tuple[FactorSource, ...]] = [(), (), ()]
    if c_attn.bias is not None:
        bias = _parameter_name(names, c_attn.bias, f"{prefix}c_attn.bias")
        biases = [(FactorSource(bias, "bias", 0, i * embed, 1),) for i in range(3)]
    q, k, v = ((weights[i],) + biases[i] for i in range(3))
    out = (FactorSource(_parameter_name(names, c_proj.weight, f"{prefix}c_proj.weight"), "weight",
                        0, 0, embed),)
    groups = []
    notes = []
    breakers = _qk_breakers(module)
    if breakers:
        notes.append(f"{name}: no qk pairs, " + "; ".join(breakers))
    else:
        groups.append(PairGroup(name, "qk", heads, embed // heads, q, k))
    groups.append(PairGroup(name, "vo", heads, embed // heads, v, out))
    return Finding("gpt2", heads, groups, notes)


HANDLERS = (_handle_multihead_attention, _handle_bert, _handle_qkvo, _handle_gpt2)


def looks_like_attention(module: nn.Module) -> bool:
    if "attention" in type(module).__name__.lower():
        return True
    return own_qkv_like_count(module) >= 2


def own_qkv_like_count(module: nn.Module) -> int:
    own = {child.lower() for child in module._modules} | {p.lower() for p in module._parameters}
    return len(own & QKV_LIKE_NAMES)

