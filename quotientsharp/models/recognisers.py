"""Per-architecture recognisers of attention modules: which parameter slices form which factor.

Each handler of :data:`HANDLERS` returns ``None`` (not its layout), a :class:`Finding`, or raises
:class:`Unsupported`; every module is then asked the same questions (:func:`_pair_groups`,
``docs/attention-variants.md``). The modeling code's conventions (rotary plane layout,
``repeat_kv``) are read by calling its own helpers on a small CPU probe, never a model tensor.
"""

from __future__ import annotations

import inspect
import itertools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

import torch
from torch import nn

from quotientsharp.models.lora import base_layer_of
from quotientsharp.models.report import FactorSource, PairGroup, RotarySpec

#: Attributes that hold the number of attention heads, in the order they are tried.
HEAD_COUNT_ATTRIBUTES = ("num_heads", "num_attention_heads", "n_heads", "heads")
#: Child (or parameter) names that make a module look like attention when no handler knows it.
QKV_LIKE_NAMES = frozenset({
    "query", "key", "value", "q", "k", "v", "q_proj", "k_proj", "v_proj", "qkv", "qkv_proj",
    "c_attn", "q_attn", "in_proj", "in_proj_weight", "wqkv", "to_q", "to_k", "to_v", "to_qkv",
    "wq", "wk", "wv", "query_key_value", "kv", "kv_proj", "q_lin", "k_lin", "v_lin",
    "query_proj", "key_proj", "value_proj", "q_head", "k_head", "v_head",
})
#: Forward arguments or children that announce rotary position embeddings (they reduce QK);
#: ``sinusoidal_pos`` is RoFormer's.
_ROTARY_MARKERS = ("position_embeddings", "rotary_pos_emb", "freqs_cis", "rotary_emb", "rope",
                   "sinusoidal_pos")
#: Children that normalise queries or keys per head (they break QK); ``query_layernorm`` and
#: ``key_layernorm`` are HunYuan's (without them listed, its attention read as one with extra
#: projections and lost its vo pairs too).
_QUERY_KEY_NORMS = frozenset({"q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_norm",
                              "key_norm", "qk_norm", "query_layernorm", "key_layernorm"})
#: Children that normalise values per head (they break VO).
_VALUE_NORMS = frozenset({"v_norm", "value_norm", "v_layernorm"})
#: Children that normalise the attention output before the output projection (they break VO):
#: BitNet's ``attn_sub_norm``, Kosmos-2's ``inner_attn_ln``.
_OUTPUT_NORMS = frozenset({"attn_sub_norm", "sub_norm", "inner_attn_ln", "o_norm", "out_norm",
                           "output_norm"})
#: Classes (in a module's MRO) whose encoder (``is_decoder`` false) multiplies the queries by
#: relative position embeddings, ``q @ position_bias^T`` with ``position_bias: [T, T, head_dim]``,
#: inside the forward: the argument's name is T5's additive bias, so only the class tells.
_QUERY_TIMES_POSITIONS = frozenset({"SpeechT5Attention"})
#: DeBERTa's disentangled attention with ``share_att_key=False``: relative position embeddings
#: projected by maps of their own, scored against the queries and the keys.
_POSITION_PROJECTIONS = frozenset({"pos_key_proj", "pos_query_proj"})
#: Classes (in a module's MRO) whose fused ``query_key_value`` is ``[heads, 3, head_dim]``.
_PER_HEAD_FUSED = frozenset({"GPTNeoXAttention", "BloomAttention", "PersimmonAttention"})


def _expected_rotation(probe: torch.Tensor, layout: str) -> torch.Tensor:
    """A quarter turn in every plane of ``layout``, ``shape`` of ``probe``."""
    if layout == "rotate_half":
        first, second = probe.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    return torch.stack((-probe[..., 1::2], probe[..., ::2]), dim=-1).flatten(-2)


def modeling_helper(module: nn.Module, names: tuple[str, ...]) -> tuple[Any, str]:
    """The first module-level callable named in ``names`` next to ``type(module)`` or a base
    (``None`` if there is none), and its qualified name (or what was searched)."""
    searched: list[str] = []
    for cls in type(module).__mro__:
        if cls is nn.Module or cls is object:
            continue
        defining = sys.modules.get(cls.__module__)
        if defining is None or defining.__name__ in searched:
            continue
        searched.append(defining.__name__)
        for helper_name in names:
            helper = getattr(defining, helper_name, None)
            if callable(helper):
                return helper, f"{defining.__name__}.{helper_name}"
    return None, f"no {' or '.join(names)} in {', '.join(searched) or 'any module'}"


def _call_on_probe(helper: Callable[..., Any], probe: torch.Tensor, shape: tuple[int, ...],
                   *args: int) -> torch.Tensor | None:
    """``helper(probe, *args)`` if it is a tensor of ``shape``, else ``None``."""
    try:
        result = helper(probe.clone(), *args)
    except Exception:  # any failure means: not a helper of a known convention
        return None
    return result if isinstance(result, torch.Tensor) and result.shape == shape else None


def _quarter_turn_of_sinusoidal_helper(module: nn.Module) -> tuple[Any, str]:
    """RoFormer's ``apply_rotary_position_embeddings(sinusoidal_pos, query, key)`` method at
    ``sin = 1, cos = 0``: a quarter turn of the query (``None`` if the class has no such method)."""
    name = "apply_rotary_position_embeddings"
    helper = getattr(type(module), name, None)
    if not callable(helper):
        return None, f"no {name} on {type(module).__name__}"

    def quarter_turn(probe: torch.Tensor) -> Any:
        half = probe.shape[-1] // 2
        sin_then_cos = torch.cat((torch.ones_like(probe[..., :half]),
                                  torch.zeros_like(probe[..., half:])), dim=-1)
        return helper(sin_then_cos, probe, probe)[0]
    return quarter_turn, f"{type(module).__module__}.{type(module).__name__}.{name}"


def _quarter_turn_of_half_angle_helper(module: nn.Module) -> tuple[Any, str]:
    """GPT-OSS's module-level ``_apply_rotary_emb(x, cos, sin)`` (``cos`` and ``sin`` of half the
    head dimension) at ``cos = 0, sin = 1``: a quarter turn (``None`` if there is none)."""
    helper, source = modeling_helper(module, ("_apply_rotary_emb",))
    if helper is None:
        return None, source

    def quarter_turn(probe: torch.Tensor) -> Any:
        half = probe[..., : probe.shape[-1] // 2]
        return helper(probe, torch.zeros_like(half), torch.ones_like(half))
    return quarter_turn, source


def detect_layout(module: nn.Module) -> tuple[str | None, str]:
    """The rotary layout (``"rotate_half"``, ``"interleaved"`` or ``None``) of the modeling code's
    quarter turn (``rotate_half``, ``rotate_every_two``, RoFormer's method or GPT-OSS's
    ``_apply_rotary_emb``), in either direction, and which helper was probed (or what was
    searched)."""
    helper, source = modeling_helper(module, ("rotate_half", "rotate_every_two"))
    for fallback in (_quarter_turn_of_sinusoidal_helper, _quarter_turn_of_half_angle_helper):
        if helper is None:
            helper, fallback_source = fallback(module)
            source = fallback_source if helper is not None else f"{source}; {fallback_source}"
    # distinct entries tell the two pairings apart; float64 on the CPU whatever the defaults
    probe = torch.arange(1.0, 9.0, dtype=torch.float64, device="cpu").reshape(1, 1, 1, 8)
    rotated = None if helper is None else _call_on_probe(helper, probe, probe.shape)
    for layout in ("rotate_half", "interleaved"):
        expected = _expected_rotation(probe, layout)
        if rotated is not None and (torch.equal(rotated, expected)
                                    or torch.equal(rotated, -expected)):
            return layout, source
    return None, source


def detect_kv_sharing(module: nn.Module) -> tuple[str | None, str]:
    """How ``module``'s modeling code shares key/value heads, and where it was read:
    ``"grouped"`` (query head ``i`` reads ``i // g``, HF's ``repeat_interleave``; assumed without
    a ``repeat_kv`` helper), ``"tiled"`` (``i % K``) or ``None`` (neither)."""
    helper, source = modeling_helper(module, ("repeat_kv",))
    if helper is None:
        return "grouped", f"HF repeat_kv convention assumed ({source})"
    probe = torch.arange(1.0, 4.0, dtype=torch.float64, device="cpu").reshape(1, 3, 1, 1)
    repeated = _call_on_probe(helper, probe, (1, 6, 1, 1), 2)
    if repeated is not None and torch.equal(repeated, probe.repeat_interleave(2, dim=1)):
        return "grouped", source
    if repeated is not None and torch.equal(repeated, probe.repeat(1, 2, 1, 1)):
        return "tiled", source
    return None, source


def _positive_int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _rope_parameters(module: nn.Module, config: object) -> tuple[str, object]:
    """``config.rope_parameters`` and its label; of one layer type (MiMo-V2-Flash), the dict of
    ``config.layer_types[module.layer_idx]``."""
    parameters = getattr(config, "rope_parameters", None)
    layer_types = getattr(config, "layer_types", None)
    layer = getattr(module, "layer_idx", None)
    if (isinstance(parameters, Mapping) and isinstance(layer_types, Sequence)
            and isinstance(layer, int) and 0 <= layer < len(layer_types)
            and isinstance(parameters.get(layer_types[layer]), Mapping)):
        return (f"rope_parameters[{layer_types[layer]!r}]",
                parameters[layer_types[layer]])
    return "rope_parameters", parameters


def declared_rotary_dims(module: nn.Module, head_dim: int) -> tuple[int, str]:
    """Rotated dimensions per head that ``module`` (or its config) declares, and where: a count,
    a factor (``R = int(h * factor)``, as GPT-NeoX computes it), else the whole head."""
    for attribute in ("rotary_ndims", "rotary_dim"):
        if (value := _positive_int(getattr(module, attribute, None))) is not None:
            return value, f"{type(module).__name__}.{attribute}={value}"
    config = getattr(module, "config", None)
    if config is not None:
        label, parameters = _rope_parameters(module, config)
        factors = [(f"{label}['partial_rotary_factor']",
                    parameters.get("partial_rotary_factor")
                    if isinstance(parameters, Mapping) else None)]
        factors += [(name, getattr(config, name, None))
                    for name in ("partial_rotary_factor", "rotary_pct")]
        for label, factor in factors:
            if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0:
                return int(head_dim * factor), f"config {label}={factor}"
        if (value := _positive_int(getattr(config, "rotary_dim", None))) is not None:
            return value, f"config rotary_dim={value}"
    return head_dim, "the whole head: no partial rotary declared"


class Unsupported(Exception):
    """A module looks like attention but its layout is not a supported symmetry."""


@dataclass
class Finding:
    layout: str
    heads: int
    groups: list[PairGroup]
    notes: list[str] = field(default_factory=list)
    kv_heads: int | None = None


@dataclass(frozen=True)
class HeadSplit:
    """How a module splits its projections into heads: query and key/value heads
    (``kv_heads`` divides ``heads``), query/key and value head dimensions."""

    heads: int
    kv_heads: int
    head_dim_k: int
    head_dim_v: int


def _parameter_name(names: dict[int, str], tensor: object, what: str) -> str:
    if not isinstance(tensor, nn.Parameter) or id(tensor) not in names:
        raise Unsupported(f"{what} is not a plain registered parameter "
                           "(parametrized, or a buffer?)")
    return names[id(tensor)]


def _linear_rows(linear: nn.Linear, names: dict[int, str], what: str) -> tuple[FactorSource, ...]:
    """Sources ``[weight[rows].T ; bias[rows]]`` of an ``nn.Linear`` q/k/v projection."""
    weight = _parameter_name(names, linear.weight, f"{what}.weight")
    sources = [FactorSource(weight, "weight", 0, 0, int(linear.weight.shape[1]))]
    if linear.bias is not None:
        sources.append(FactorSource(_parameter_name(names, linear.bias, f"{what}.bias"),
                                    "bias", 0, 0, 1))
    return tuple(sources)


def _linear_columns(linear: nn.Linear, names: dict[int, str], what: str) -> tuple[FactorSource]:
    """Source ``weight[:, rows]`` of an ``nn.Linear`` output projection (its bias is excluded)."""
    weight = _parameter_name(names, linear.weight, f"{what}.weight")
    return (FactorSource(weight, "weight", 1, 0, int(linear.weight.shape[0])),)


def _head_count(module: nn.Module, q_features: int) -> int:
    for attribute in HEAD_COUNT_ATTRIBUTES:
        if (value := _positive_int(getattr(module, attribute, None))) is not None:
            return value
    head_dim = getattr(module, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0 and q_features % head_dim == 0:
        return q_features // head_dim
    config_heads = getattr(getattr(module, "config", None), "num_attention_heads", None)
    if isinstance(config_heads, int) and config_heads > 0:
        return config_heads
    raise Unsupported("no head count attribute (" + ", ".join(HEAD_COUNT_ATTRIBUTES)
                       + ", head_dim or config.num_attention_heads)")


def _check_declared_head_dim(module: nn.Module, heads: int, query_width: int) -> int:
    """The query head dimension ``query_width / heads``, checked against the module's own."""
    if query_width % heads:
        raise Unsupported(f"{heads} heads do not divide the query width {query_width}")
    head_dim_k = query_width // heads
    for attribute in ("head_dim", "attention_head_size", "head_size"):
        declared = getattr(module, attribute, None)
        if isinstance(declared, int) and not isinstance(declared, bool) and declared != head_dim_k:
            raise Unsupported(f"{attribute}={declared} but the query width {query_width} and "
                               f"{heads} heads give {head_dim_k}")
    return head_dim_k


def _grouped_split(module: nn.Module, heads: int, head_dim_k: int, query_width: int,
                   key_width: int, value_width: int, output_width: int) -> HeadSplit:
    """The head split when keys are narrower than queries (grouped- or multi-query attention)."""
    grouped = (f"grouped/multi-query attention (key width {key_width}, query width "
               f"{query_width})")
    kv_heads = 0 if key_width % head_dim_k else key_width // head_dim_k
    if kv_heads == 0 or heads % kv_heads:
        raise Unsupported(f"{grouped}: the keys do not split into heads of the query head "
                           f"dimension {head_dim_k} whose number divides {heads}")
    if value_width % kv_heads or output_width != heads * (value_width // kv_heads):
        raise Unsupported(f"{grouped}: {kv_heads} key heads, but values of width "
                           f"{value_width} and an output projection reading {output_width} "
                           f"features do not split into {kv_heads} value heads shared by "
                           f"{heads // kv_heads} query heads each")
    sharing, source = detect_kv_sharing(module)
    if sharing != "grouped":
        raise Unsupported(f"{grouped}: {source} shares key/value heads "
                           f"{'tiled' if sharing else 'in an unknown way'}, not as "
                           "repeat_interleave (query head i reads key/value head i // g)")
    return HeadSplit(heads, kv_heads, head_dim_k, value_width // kv_heads)


def _check_head_split(module: nn.Module, heads: int, query_width: int, key_width: int,
                      value_width: int, output_width: int) -> HeadSplit:
    """The head split of a q/k/v/o attention from its projection widths, checked against what
    the module declares; keys narrower than queries mean grouped- or multi-query attention."""
    head_dim_k = _check_declared_head_dim(module, heads, query_width)
    if key_width == query_width:
        if value_width % heads:
            raise Unsupported(f"{heads} heads do not divide the value width {value_width}")
        split = HeadSplit(heads, heads, head_dim_k, value_width // heads)
    else:
        split = _grouped_split(module, heads, head_dim_k, query_width, key_width, value_width,
                               output_width)
    if output_width != split.heads * split.head_dim_v:
        raise Unsupported(f"output projection reads {output_width} features, values have "
                           f"{split.heads * split.head_dim_v} after sharing")
    declared_groups = getattr(module, "num_key_value_groups", None)
    if isinstance(declared_groups, int) and declared_groups != heads // split.kv_heads:
        raise Unsupported(f"num_key_value_groups={declared_groups} but the projection widths "
                           f"give {heads // split.kv_heads} query heads per key/value head")
    declared_kv = getattr(module, "num_key_value_heads", None)
    if isinstance(declared_kv, int) and declared_kv != split.kv_heads:
        raise Unsupported(f"num_key_value_heads={declared_kv} but the key width {key_width} "
                           f"gives {split.kv_heads}")
    return split


def _forward_arguments(module: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _children(module: nn.Module) -> set[str]:
    return {name.lower() for name, _ in module.named_children()}


#: Children of a gated delta-rule (linear, recurrent) attention: a convolution over the
#: concatenated projections, a decay and a write strength per token (Bailing's hybrid layers).
_DELTA_RULE_MARKERS = frozenset({"conv1d", "forget_gate", "b_proj"})


def _feature_wise(module: nn.Module, prefixes: tuple[str, ...]) -> list[str]:
    """Reasons from what acts on the projections feature by feature, which no mixing of a
    head's features commutes with: clipping (OLMo), hashing (YOSO), a gated delta rule, and a
    convolution over the sequence of the projections named by ``prefixes`` (Inkling)."""
    reasons = []
    clip = getattr(module, "clip_qkv", None)                      # MPT's attention holds it
    if clip is None:
        clip = getattr(getattr(module, "config", None), "clip_qkv", None)
    if clip is not None:
        reasons.append(f"queries, keys and values are clipped elementwise (config "
                       f"clip_qkv={clip}), which no invertible mixing of a head's features "
                       "commutes with")
    if getattr(module, "lsh_config", None) is not None:
        reasons.append("locality-sensitive hashing attention (lsh_config, YOSO) normalises "
                       "queries, keys and each head's output to unit length")
    if markers := sorted(_children(module) & _DELTA_RULE_MARKERS):
        reasons.append(f"a gated delta-rule (linear) attention ({', '.join(markers)}) convolves "
                       "and normalises its projections feature by feature")
    convolutions = sorted(child for child in _children(module)
                          if "conv" in child and child.startswith(prefixes))
    if convolutions:
        reasons.append(f"a convolution with one kernel per feature ({', '.join(convolutions)}) "
                       "runs over the projected sequence")
    return reasons


def _rotary(module: nn.Module, head_dim: int) -> tuple[RotarySpec | None, list[str], list[str]]:
    """Rotary embeddings of ``module``: ``(spec, reasons the pair breaks, notes)``."""
    if (getattr(getattr(module, "config", None), "alibi", None) is True
            or getattr(module, "use_rope", None) in (False, 0)):
        # Falcon with ALiBi, and Llama 4's layers without positions ("NoPE", use_rope 0),
        # take position_embeddings but never apply them
        return None, [], []
    arguments, children = _forward_arguments(module), _children(module)
    marked = [marker for marker in _ROTARY_MARKERS
              if marker in arguments or any(marker in child for child in children)
              or hasattr(module, marker)]
    if not marked:
        return None, [], []
    layout, helper = detect_layout(module)
    dims, declared = declared_rotary_dims(module, head_dim)
    what = f"rotary position embeddings ({', '.join(marked)})"
    if layout is None:
        return None, [f"{what} whose plane layout was not detected as rotate_half or "
                      f"interleaved ({helper}): the centraliser of their rotations is unknown"], []
    if dims % 2 or dims > head_dim:
        return None, [f"{what} on {dims} of {head_dim} dimensions ({declared}): not whole "
                      "rotation planes inside a head"], []
    if dims == 0:
        return None, [], [f"{what} rotate 0 dimensions ({declared}): the qk pairs keep GL(h)"]
    note = (f"{what}: {layout} layout (detected by probing {helper}), {dims} of {head_dim} "
            f"dimensions rotated ({declared}); queries and keys are rotated between the "
            "projections and the scores, so the qk group shrinks to the rotations' centraliser")
    return (dims, layout), [], [note]


def _query_key_status(module: nn.Module,
                      head_dim: int) -> tuple[RotarySpec | None, list[str], list[str]]:
    """``(rotary spec, reasons the query/key factorisation is no symmetry, notes)``."""
    rotary, reasons, notes = _rotary(module, head_dim)
    if _children(module) & _QUERY_KEY_NORMS:
        reasons.append("queries/keys are normalised (q_norm/k_norm) before the scores, and a "
                       "normalisation does not commute with mixing a head's features")
    if hasattr(module, "logit_scale"):
        # Swin v2 (and Swin2SR): cosine attention, normalize(q) @ normalize(k)^T * logit_scale,
        # normalises inside the forward, so there is no q_norm/k_norm child to see
        reasons.append("a learned logit_scale marks cosine attention: queries and keys are "
                       "normalised to unit length per head before the scores, and a "
                       "normalisation does not commute with mixing a head's features")
    if (not getattr(module, "is_decoder", False)
            and {cls.__name__ for cls in type(module).__mro__} & _QUERY_TIMES_POSITIONS):
        reasons.append("queries are multiplied by relative position embeddings (position_bias "
                       "of SpeechT5's encoder) besides the keys")
    position_type = getattr(module, "position_embedding_type", None)
    # ESM's position_embedding_type="rotary" is the rotary embedding _rotary has just read
    rotary_read = position_type == "rotary" and (rotary is not None or reasons or notes)
    if position_type not in (None, "absolute") and not rotary_read:
        reasons.append(f"position_embedding_type={position_type!r} mixes keys with position "
                       "embeddings")
    if position_projections := sorted(_children(module) & _POSITION_PROJECTIONS):
        # with share_att_key=True the positions go through query_proj and key_proj themselves,
        # and the position scores q . (P W_k)^T, k . (P W_q)^T move with the pair: exact
        reasons.append(f"relative positions are projected by maps of their own "
                       f"({', '.join(position_projections)}: DeBERTa's share_att_key=False) "
                       "and scored against the queries and keys")
    if "bbox_pos_emb" in _forward_arguments(module):
        reasons.append("queries are multiplied by bounding-box position embeddings "
                       "(bbox_pos_emb, BROS) besides the keys")
    if "emb_rel_k" in module._parameters:
        reasons.append("queries are multiplied by relative key embeddings (emb_rel_k, VITS) "
                       "besides the keys")
    reasons += _feature_wise(module, ("q_", "k_", "query", "key"))
    return rotary, reasons, notes


#: Children or parameters of differential attention (DiffLlama, after the Diff Transformer):
#: a learned lambda per head pair, a normalisation of each head's output.
_DIFFERENTIAL_MARKERS = frozenset({"lambda_q1", "lambda_k1", "groupnorm", "subln"})


def _value_output_status(module: nn.Module, heads: int) -> list[str]:
    """Why the value/output factorisation is no symmetry (empty when it is one)."""
    children = _children(module)
    reasons = []
    if getattr(module, "rotary_value", False) is True:
        # RoFormer's option: the values are rotated by their position too, so only the
        # rotations' centraliser (not GL(h)) commutes with the average
        reasons.append("values are rotated by their position (rotary_value=True) before the "
                       "attention average")
    if (children | {name.lower() for name in module._parameters}) & _DIFFERENTIAL_MARKERS:
        reasons.append("differential attention (lambda_q1/lambda_k1, groupnorm): two heads' "
                       "values are concatenated, their averages subtracted and normalised per "
                       "head before the output projection")
    if children & _VALUE_NORMS:
        reasons.append("values are normalised (v_norm) before the attention average")
    # a gate of one scalar per head (``heads`` outputs) commutes with every GL(h) element;
    # one per feature (AFMoE, Qwen3-Next: sigmoid(gate_proj(x)) times the output) does not
    gates = sorted(name for name, child in module.named_children() if "gate" in name.lower()
                   and not (_is_linear(child) and child.out_features == heads))
    reasons += _feature_wise(module, ("v_", "value"))
    if gates:
        reasons.append(f"the attention output is gated feature by feature ({', '.join(gates)}) "
                       "before the output projection")
    if "emb_rel_v" in module._parameters:
        reasons.append("relative value embeddings (emb_rel_v, VITS) are added to each head's "
                       "output before the output projection")
    if "dt_proj" in children:
        reasons.append("a dynamic mask computed from the values (Doge's dt_proj) is added to "
                       "the scores")
    if output_norms := sorted(children & _OUTPUT_NORMS):
        reasons.append(f"the attention output is normalised ({', '.join(output_norms)}) before "
                       "the output projection, which mixing a head's value features changes")
    return reasons


def _intact_notes(module: nn.Module) -> list[str]:
    """Position mechanisms that act on the scores alone, and so leave both pairs intact."""
    notes = []
    config = getattr(module, "config", None)
    window = (module.sliding_window if hasattr(module, "sliding_window")
              else getattr(config, "sliding_window", None))
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        notes.append(f"a sliding window of {window} tokens masks scores, the pairs stay exact")
    alibi = ("alibi" in _forward_arguments(module) or getattr(config, "alibi", False) is True
             or getattr(module, "position_embedding_type", None) == "alibi")
    if alibi:
        notes.append("ALiBi adds a per-head bias linear in the distance to the scores, "
                     "independent of queries and keys: the pairs stay exact")
    if getattr(module, "has_relative_attention_bias", False) is True:
        notes.append("a learned relative position bias (T5 style, shared with the later layers "
                     "of its stack) is added to the scores, independent of queries and keys: "
                     "the pairs stay exact")
    return notes


def _drop_half_fused(label: str, groups: list[PairGroup], qk: tuple[FactorSource, ...],
                     vo: tuple[FactorSource, ...]) -> tuple[list[PairGroup], list[str]]:
    """``groups`` without a kept kind whose fused parameter (``query_key_value``, ``c_attn``)
    the dropped kind also reads, and a note: the layout cannot tile half a fused projection."""
    if len(groups) != 1:
        return groups, []
    sources = {"qk": (qk, vo), "vo": (vo, qk)}[groups[0].kind]
    shared = sorted({s.parameter for s in sources[0]} & {s.parameter for s in sources[1]})
    if not shared:
        return groups, []
    return [], [f"{label}: no {groups[0].kind} pairs either, the fused parameter(s) "
                f"{', '.join(shared)} also feed the dropped pairs"]


def _pair_groups(layout: str, name: str, module: nn.Module, split: HeadSplit,
                 q: tuple[FactorSource, ...], k: tuple[FactorSource, ...],
                 v: tuple[FactorSource, ...], o: tuple[FactorSource, ...]) -> Finding:
    """The finding of one attention module: its qk and vo groups from its projections' sources,
    and notes (grouped-query attention: one pair per key/value head, its query heads stacked)."""
    label = name or "<root>"
    size = split.heads // split.kv_heads
    notes = []
    groups = []
    rotary, breakers, qk_notes = _query_key_status(module, split.head_dim_k)
    if breakers:
        notes.append(f"{label}: no qk pairs, " + "; ".join(breakers))
    else:
        groups.append(PairGroup(name, "qk", split.kv_heads, split.head_dim_k, q, k,
                                g_members=size, rotary=rotary))
        notes += [f"{label}: {note}" for note in qk_notes]
    vo_breakers = _value_output_status(module, split.heads)
    if vo_breakers:
        notes.append(f"{label}: no vo pairs, " + "; ".join(vo_breakers))
    else:
        groups.append(PairGroup(name, "vo", split.kv_heads, split.head_dim_v, v, o,
                                h_members=size))
    groups, fused_notes = _drop_half_fused(label, groups, q + k, v + o)
    notes += fused_notes
    if size > 1:
        notes.append(f"{label}: grouped-query attention, {split.heads} query heads share "
                     f"{split.kv_heads} key/value head(s) ({size} each): one qk pair per key "
                     f"head with its {size} query heads stacked in G, one vo pair per value "
                     f"head with the output columns of its {size} query heads stacked in H")
    notes += [f"{label}: {note}" for note in _intact_notes(module)]
    return Finding(layout, split.heads, groups, notes, split.kv_heads)


#: Substrings of a child's name that make it one more query, key or value projection.
_PROJECTION_TOKENS = ("query", "key", "value", "q_proj", "k_proj", "v_proj")


def _check_no_other_projections(module: nn.Module, used: Sequence[str]) -> None:
    """Refuse ``module`` if query/key/value-like children besides ``used`` (Longformer's
    ``query_global``...) feed the same heads: the pairs of ``used`` alone are no symmetry."""
    extra = sorted(child for child in _children(module) - {c.lower() for c in used}
                   - _QUERY_KEY_NORMS - _VALUE_NORMS - _POSITION_PROJECTIONS
                   if any(token in child for token in _PROJECTION_TOKENS))
    if extra:
        raise Unsupported(f"projections {', '.join(extra)} beside {', '.join(used)} feed the "
                          "same heads (e.g. Longformer's global attention), so the pairs of "
                          f"{', '.join(used)} alone are not a symmetry")


def _qkvo_finding(layout: str, name: str, module: nn.Module, q: nn.Linear, k: nn.Linear,
                  v: nn.Linear, o: nn.Linear, names: dict[int, str],
                  qkvo_names: Sequence[str]) -> Finding:
    """The finding of a module with ``nn.Linear`` projections (``qkvo_names``: theirs)."""
    heads = _head_count(module, q.out_features)
    split = _check_head_split(module, heads, q.out_features, k.out_features, v.out_features,
                              o.in_features)
    q_name, k_name, v_name, o_name = qkvo_names
    return _pair_groups(layout, name, module, split, _linear_rows(q, names, q_name),
                        _linear_rows(k, names, k_name), _linear_rows(v, names, v_name),
                        _linear_columns(o, names, o_name))


def _is_linear(module: object) -> TypeGuard[nn.Linear]:
    # a PEFT LoRA layer around an nn.Linear reads as its base layer (weight, bias, features:
    # it forwards them, so the guard holds for what the recognisers read); the walker then
    # drops the pairs that touch a base weight carrying active adapters
    if isinstance(module, nn.Module) and isinstance(base_layer_of(module), nn.Linear):
        return True
    return isinstance(module, nn.Linear)


def _with_fused_bias(weights: list[FactorSource], bias: object, names: dict[int, str],
                     what: str, width: int | None = None) -> list[tuple[FactorSource, ...]]:
    """Each q/k/v weight with its slice of the fused ``bias`` (if any), at ``i * width``, or
    where ``width`` is ``None`` at the weight's own offset (one fused weight and its bias)."""
    if bias is None:
        return [(weight,) for weight in weights]
    name = _parameter_name(names, bias, what)
    return [(w, FactorSource(name, "bias", 0, w.offset if width is None else i * width, 1,
                             w.stride, w.phase))
            for i, w in enumerate(weights)]


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
    q, k, v = _with_fused_bias(weights, module.in_proj_bias, names, "in_proj_bias", embed)
    out = _linear_columns(module.out_proj, names, "out_proj")
    groups = [PairGroup(name, "qk", heads, head_dim, q, k),
              PairGroup(name, "vo", heads, head_dim, v, out)]
    notes = []
    if module.add_zero_attn:
        notes.append(f"{name}: add_zero_attn appends zero keys/values, which every GL(h) action "
                     "keeps at zero: the pairs stay exact")
    return Finding("multihead_attention", heads, groups, notes, heads)


def _handle_bert(name: str, module: nn.Module, names: dict[int, str]) -> Finding | None:
    """HF BERT-style ``X.{self|attention}.{query,key,value}`` + ``X.output.dense`` (DeBERTa-v2's
    ``query_proj, key_proj, value_proj``)."""
    output = getattr(module, "output", None)
    dense = getattr(output, "dense", None) if isinstance(output, nn.Module) else None
    if not _is_linear(dense):
        return None
    for inner_name, children in itertools.product(
            ("self", "attention"), (("query", "key", "value"),
                                    ("query_proj", "key_proj", "value_proj"))):
        inner = module._modules.get(inner_name)
        if inner is None:
            continue
        q, k, v = (inner._modules.get(child) for child in children)
        if not (_is_linear(q) and _is_linear(k) and _is_linear(v)):
            continue
        _check_no_other_projections(inner, children)
        prefix = f"{name}." if name else ""
        return _qkvo_finding("bert", name, inner, q, k, v, dense, names, (
            *(f"{prefix}{inner_name}.{child}" for child in children), f"{prefix}output.dense"))
    return None


#: ``(q, k, v, output candidates)`` child names; ``dense`` is the output projection of Phi
#: (``q_proj``...) and of ALBERT (``query``..., shared by every layer), ``Wo`` of the ModernBERT
#: decoder.
_QKVO_NAMINGS = (
    ("q_proj", "k_proj", "v_proj", ("o_proj", "out_proj", "dense", "Wo")),
    ("q", "k", "v", ("o",)),
    ("query", "key", "value", ("out_proj", "o_proj", "dense")),
    ("q_lin", "k_lin", "v_lin", ("out_lin",)),
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
        _check_no_other_projections(module, (q_child, k_child, v_child))
        prefix = f"{name}." if name else ""
        children = (q_child, k_child, v_child, o_child)
        return _qkvo_finding("qkvo", name, module, q, k, v, o, names,
                             [f"{prefix}{child}" for child in children])
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
    # transformers' Conv1D keeps its weight as a Parameter; nn.Module.__getattr__ cannot say so
    attn_weight, proj_weight = cast(torch.Tensor, c_attn.weight), cast(torch.Tensor, c_proj.weight)
    embed = int(attn_weight.shape[0])
    if tuple(attn_weight.shape) != (embed, 3 * embed) or tuple(proj_weight.shape) != (embed,
                                                                                       embed):
        raise Unsupported(f"c_attn {tuple(attn_weight.shape)} / c_proj "
                           f"{tuple(proj_weight.shape)} are not [E, 3E] / [E, E]")
    heads = _head_count(module, embed)
    if embed % heads:
        raise Unsupported(f"{heads} heads do not divide the width {embed}")
    prefix = f"{name}." if name else ""
    fused = _parameter_name(names, c_attn.weight, f"{prefix}c_attn.weight")
    # Conv1D stores W as [in, out]: the head features run along dimension 1.
    weights = [FactorSource(fused, "weight", 1, i * embed, embed) for i in range(3)]
    q, k, v = _with_fused_bias(weights, c_attn.bias, names, f"{prefix}c_attn.bias", embed)
    out = (FactorSource(_parameter_name(names, c_proj.weight, f"{prefix}c_proj.weight"), "weight",
                        0, 0, embed),)
    split = HeadSplit(heads, heads, embed // heads, embed // heads)
    return _pair_groups("gpt2", name, module, split, q, k, v, out)


def _falcon_kv_heads(module: nn.Module, heads: int) -> tuple[int, int]:
    """Falcon's key/value heads and the queries per fused group: ``new_decoder_architecture``
    views ``query_key_value`` as ``[kv heads, queries + 2, d]`` (each group's queries, its key,
    its value), ``multi_query`` as ``[heads + 2, d]`` back to back, the rest as GPT-NeoX."""
    if getattr(module, "new_decoder_architecture", False):
        kv_heads = _positive_int(getattr(module, "num_kv_heads", None)) or heads
        return kv_heads, heads // kv_heads
    return (1, 0) if getattr(module, "multi_query", False) else (heads, 1)


def _handle_fused_per_head(name: str, module: nn.Module, names: dict[int, str]) -> Finding | None:
    """GPT-NeoX / BLOOM: ``query_key_value`` Linear viewed as ``[heads, 3, head_dim]`` (read
    with ``stride = 3 d`` and phases ``0, d, 2 d``) + ``dense``; Falcon's three layouts."""
    fused, dense = module._modules.get("query_key_value"), module._modules.get("dense")
    if not (_is_linear(fused) and _is_linear(dense)):
        return None
    classes = {cls.__name__ for cls in type(module).__mro__}
    if not classes & (_PER_HEAD_FUSED | {"FalconAttention"}):
        raise Unsupported("fused query_key_value of an unknown head layout (supported: the "
                           "per-head [q, k, v] interleave of " + ", ".join(sorted(_PER_HEAD_FUSED))
                           + ", and Falcon's)")
    embed = dense.in_features
    heads = _head_count(module, embed)
    kv_heads, group = (_falcon_kv_heads(module, heads) if "FalconAttention" in classes
                       else (heads, 1))
    head_dim = embed // heads
    if fused.out_features != embed + 2 * kv_heads * head_dim:
        raise Unsupported(f"query_key_value has {fused.out_features} outputs, not {embed} "
                          f"queries + 2 x {kv_heads * head_dim} keys/values")
    key = kv_heads * head_dim
    split = _check_head_split(module, heads, embed, key, key, embed)
    prefix = f"{name}." if name else ""
    weight = _parameter_name(names, fused.weight, f"{prefix}query_key_value.weight")
    if group == 0:              # Falcon's multi-query: back to back
        weights = [FactorSource(weight, "weight", 0, offset, fused.in_features)
                   for offset in (0, embed, embed + key)]
    else:                       # per group: its queries, its key, its value
        stride = (group + 2) * head_dim
        weights = [FactorSource(weight, "weight", 0, 0, fused.in_features, stride, phase)
                   for phase in (0, group * head_dim, (group + 1) * head_dim)]
    q, k, v = _with_fused_bias(weights, fused.bias, names, f"{prefix}query_key_value.bias")
    out = _linear_columns(dense, names, f"{prefix}dense")
    return _pair_groups("fused_per_head", name, module, split, q, k, v, out)


#: ``(fused q/k/v Linear, output candidates)`` of the projections fused back to back,
#: ``[q (heads); k (kv heads); v (kv heads)]``: Phi-3, MPT, ModernBERT, and GPT-BigCode
#: (StarCoder) with multi-query attention (without, its ``c_attn`` interleaves the heads as
#: GPT-NeoX does).
_CONTIGUOUS_FUSED = (("qkv_proj", ("o_proj",)), ("wqkv", ("out_proj", "wo")),
                     ("c_attn", ("c_proj",)))
#: Classes (in a module's MRO) whose fused projection is read as ``_CONTIGUOUS_FUSED`` says; the
#: names alone do not tell the layout (InternLM2's ``wqkv`` and ``wo`` interleave each key/value
#: head's queries, key and value, ``[kv heads, queries + 2, d]``).
_BACK_TO_BACK_FUSED = frozenset({"Phi3Attention", "Phi4MultimodalAttention", "MptAttention",
                                 "ModernBertAttention", "DbrxAttention", "ErgoAttention",
                                 "GPTBigCodeAttention"})


def _handle_fused_contiguous(name: str, module: nn.Module,
                             names: dict[int, str]) -> Finding | None:
    """One ``nn.Linear`` whose outputs are the queries, keys and values back to back (Phi-3's
    ``qkv_proj``, MPT's and ModernBERT's ``Wqkv``, GPT-BigCode's multi-query ``c_attn``), read
    as three row blocks, + the output projection."""
    children = {child.lower(): child for child in module._modules}
    for fused_child, o_children in _CONTIGUOUS_FUSED:
        fused = module._modules.get(children.get(fused_child, ""))
        o_child = next((children[c] for c in o_children if c in children), None)
        out = None if o_child is None else module._modules[o_child]
        if not (_is_linear(fused) and _is_linear(out)):
            continue
        if not {cls.__name__ for cls in type(module).__mro__} & _BACK_TO_BACK_FUSED:
            raise Unsupported(f"fused {children[fused_child]} of an unknown head layout "
                              "(supported: queries, keys and values back to back in "
                              + ", ".join(sorted(_BACK_TO_BACK_FUSED)) + ")")
        _check_no_other_projections(module, (children[fused_child],))
        if getattr(module, "is_cross_attention", False) or "q_attn" in children:
            raise Unsupported("cross-attention (q_attn) is not supported")
        heads = _head_count(module, out.in_features)
        # Ergo's attention reads its key/value heads from its config in the forward
        kv_heads = (_positive_int(getattr(module, "num_key_value_heads", None))
                    or _positive_int(getattr(module, "kv_heads", None))
                    or _positive_int(getattr(getattr(module, "config", None),
                                             "num_key_value_heads", None)) or heads)
        head_dim = _positive_int(getattr(module, "head_dim", None)) or out.in_features // heads
        query, key = heads * head_dim, kv_heads * head_dim
        if fused.out_features != query + 2 * key:
            raise Unsupported(f"{children[fused_child]} has {fused.out_features} outputs, not "
                              f"{query} queries + 2 x {key} keys/values back to back")
        split = _check_head_split(module, heads, query, key, key, out.in_features)
        prefix = f"{name}." if name else ""
        what = f"{prefix}{children[fused_child]}"
        weight = _parameter_name(names, fused.weight, f"{what}.weight")
        interleaved = fused_child == "c_attn" and getattr(module, "multi_query", True) is False
        # GPT-BigCode without multi-query views c_attn's outputs as [heads, 3, head_dim]
        weights = ([FactorSource(weight, "weight", 0, 0, fused.in_features, 3 * head_dim,
                                 i * head_dim) for i in range(3)] if interleaved else
                   [FactorSource(weight, "weight", 0, offset, fused.in_features)
                    for offset in (0, query, query + key)])
        q, k, v = _with_fused_bias(weights, fused.bias, names, f"{what}.bias")
        return _pair_groups("fused_per_head" if interleaved else "fused_contiguous", name,
                            module, split, q, k, v,
                            _linear_columns(out, names, f"{prefix}{o_child}"))
    return None


HANDLERS = (_handle_multihead_attention, _handle_bert, _handle_qkvo, _handle_gpt2,
            _handle_fused_per_head, _handle_fused_contiguous)


def looks_like_attention(module: nn.Module) -> bool:
    if "attention" in type(module).__name__.lower():
        return True
    return own_qkv_like_count(module) >= 2


def own_qkv_like_count(module: nn.Module) -> int:
    own = {child.lower() for child in module._modules} | {p.lower() for p in module._parameters}
    return len(own & QKV_LIKE_NAMES)

