"""Find the symmetry groups hidden in a ``torch.nn.Module``.

Every self-attention head carries two ``GL(h)`` symmetries (SPEC section 3): the query/key pair
and the value/output pair. Writing a pair as factors ``G`` (``shape=[n, h]``) and ``H``
(``shape=[m, h]``), the network only sees ``G H^T``, so ``(G A^{-1}, H A^T)`` leaves it unchanged.
For ``nn.Linear`` projections (``y = x W^T + b``) and ``rows_i`` the output features of head ``i``:

- QK: ``G = [q.weight[rows_i].T ; q.bias[rows_i]]``, ``H`` the same for ``k``;
- VO: ``G = [v.weight[rows_i].T ; v.bias[rows_i]]``, ``H = o.weight[:, rows_i]`` (output bias
  excluded).

:func:`find_symmetries` walks a model, recognises the supported attention layouts and diagonal
``(u, v)`` parameterisations, and returns a :class:`SymmetryReport` that says which slice of
which parameter forms which factor. It never touches the model's tensors. Attention-like modules
it does not understand are listed in :attr:`SymmetryReport.unknown` (never silently treated as
plain), and their parameters fall back to the "other" (adaptive) geometry.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = [
    "AttentionModule",
    "AttentionPair",
    "DiagonalPair",
    "FactorSource",
    "PairGroup",
    "SymmetryReport",
    "find_symmetries",
]

PAIR_KINDS = ("qk", "vo")
#: Attributes that hold the number of attention heads, in the order they are tried.
HEAD_COUNT_ATTRIBUTES = ("num_heads", "num_attention_heads", "n_heads", "heads")
#: Child (or parameter) names that make a module look like attention when no handler knows it.
_QKV_LIKE_NAMES = frozenset({
    "query", "key", "value", "q", "k", "v", "q_proj", "k_proj", "v_proj", "qkv", "qkv_proj",
    "c_attn", "q_attn", "in_proj", "in_proj_weight", "wqkv", "to_q", "to_k", "to_v", "to_qkv",
    "wq", "wk", "wv", "query_key_value", "kv", "kv_proj",
})
#: Forward arguments or children that announce rotary position embeddings (they break QK).
_ROTARY_MARKERS = ("position_embeddings", "rotary_pos_emb", "freqs_cis", "rotary_emb", "rope")


@dataclass(frozen=True)
class AttentionPair:
    """One ``GL(h)`` pair of one head: ``G`` is ``shape=[n, h]``, ``H`` is ``shape=[m, h]``.

    Attributes
    ----------
    module
        Qualified name of the attention module, e.g. ``"encoder.layer.0.attention"``.
    kind
        ``"qk"`` (query/key) or ``"vo"`` (value/output).
    head
        Head index inside the module.
    n, m, h
        Factor shapes, bias rows included (SPEC section 3).
    """

    module: str
    kind: str
    head: int
    n: int
    m: int
    h: int


@dataclass(frozen=True)
class DiagonalPair:
    """A diagonal-network parameterisation ``beta = u * v`` (``GL(1)`` per coordinate).

    Attributes
    ----------
    u_name, v_name
        Parameter names (as in ``named_parameters``) of ``u`` and ``v``, equal shapes.
    size
        Number of coordinates, ``u.numel()``.
    """

    u_name: str
    v_name: str
    size: int


@dataclass(frozen=True)
class FactorSource:
    """A block of rows of a factor, read from (a slice of) one parameter.

    For all heads at once, the block is ``shape=[heads, rows, head_dim]``.

    Attributes
    ----------
    parameter
        Parameter name.
    role
        ``"weight"``: a 2-D parameter; ``axis`` is the dimension that indexes head features
        (``0`` for q/k/v ``nn.Linear`` weights, ``1`` for the output projection's weight);
        the other dimension gives the ``rows``. ``"bias"``: a 1-D parameter, one row.
    axis
        Dimension of the parameter that runs over ``heads * head_dim`` features.
    offset
        Start of this block along ``axis`` (fused projections: 0, E, 2E).
    rows
        Number of factor rows contributed per head.
    """

    parameter: str
    role: str
    axis: int
    offset: int
    rows: int


@dataclass(frozen=True)
class PairGroup:
    """All heads of one pair kind of one module: ``heads`` pairs sharing the shapes ``(n, m, h)``.

    ``G`` of all heads, ``shape=[heads, n, head_dim]``, is the concatenation along rows of
    ``g_sources`` (likewise ``H`` from ``h_sources``).
    """

    module: str
    kind: str
    heads: int
    head_dim: int
    g_sources: tuple[FactorSource, ...]
    h_sources: tuple[FactorSource, ...]

    @property
    def n(self) -> int:
        return sum(source.rows for source in self.g_sources)

    @property
    def m(self) -> int:
        return sum(source.rows for source in self.h_sources)

    @property
    def parameters(self) -> tuple[str, ...]:
        """Names of the parameters this group reads (each possibly only in part)."""
        names = [source.parameter for source in self.g_sources + self.h_sources]
        return tuple(dict.fromkeys(names))

    def pairs(self) -> list[AttentionPair]:
        return [AttentionPair(self.module, self.kind, head, self.n, self.m, self.head_dim)
                for head in range(self.heads)]


@dataclass
class AttentionModule:
    """A recognised attention module.

    Attributes
    ----------
    name, type_name
        Qualified module name and class name.
    layout
        Which handler recognised it: ``"multihead_attention"``, ``"bert"`` (HF BERT/ViT-4.x style
        ``self|attention`` + ``output.dense``), ``"qkvo"`` (generic
        ``q_proj/k_proj/v_proj/o_proj``), ``"gpt2"`` (fused ``c_attn`` / ``c_proj`` Conv1D).
    heads
        Number of heads.
    kinds
        Pair kinds kept (``"qk"``, ``"vo"``); a kind is missing when it is not a symmetry of this
        module (see ``notes``) or its parameters are frozen.
    """

    name: str
    type_name: str
    layout: str
    heads: int
    kinds: tuple[str, ...] = ()


@dataclass
class SymmetryReport:
    """What :func:`find_symmetries` found.

    Attributes
    ----------
    pairs
        One :class:`AttentionPair` per head per pair kind.
    diagonal
        Diagonal-network parameterisations.
    other
        Trainable parameter names outside any symmetry (the adaptive geometry, SPEC section 4).
    unknown
        Qualified names of attention-like modules that were not understood; their parameters are
        in ``other``. ``unknown_reasons`` says why for each.
    frozen
        Parameters with ``requires_grad=False``: excluded from everything.
    groups
        The slicing layout behind ``pairs`` (one :class:`PairGroup` per module and kind), used by
        :class:`~quotientsharp.models.ParameterLayout`.
    modules
        Recognised attention modules.
    notes
        Human-readable remarks (pairs skipped because not a symmetry, or because of frozen or
        shared parameters).
    parameter_shapes, parameter_dtypes
        Shape and dtype of every parameter of the model (frozen included).
    model_type
        Class name of the model.
    """

    pairs: list[AttentionPair] = field(default_factory=list)
    diagonal: list[DiagonalPair] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)
    groups: list[PairGroup] = field(default_factory=list)
    modules: list[AttentionModule] = field(default_factory=list)
    unknown_reasons: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    parameter_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    parameter_dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    model_type: str = ""

    # ------------------------------------------------------------------ summary numbers
    @property
    def trainable(self) -> list[str]:
        """Trainable parameter names, in ``named_parameters`` order."""
        frozen = set(self.frozen)
        return [name for name in self.parameter_shapes if name not in frozen]

    @property
    def pair_parameters(self) -> list[str]:
        """Parameters fully covered by attention pairs."""
        names = [name for group in self.groups for name in group.parameters]
        return list(dict.fromkeys(names))

    @property
    def diagonal_parameters(self) -> list[str]:
        return [name for pair in self.diagonal for name in (pair.u_name, pair.v_name)]

    @property
    def gl_count(self) -> int:
        """Number of ``GL(h)`` factors (attention pairs)."""
        return len(self.pairs)

    @property
    def diagonal_size(self) -> int:
        """Number of ``GL(1)`` factors of diagonal parameterisations."""
        return sum(pair.size for pair in self.diagonal)

    @property
    def group_count(self) -> int:
        """Number of group factors: ``GL(h)`` pairs plus ``GL(1)`` diagonal coordinates."""
        return self.gl_count + self.diagonal_size

    @property
    def group_dimension(self) -> int:
        """Dimension of the symmetry group (= of each vertical space): ``sum h^2 + D``."""
        return sum(pair.h * pair.h for pair in self.pairs) + self.diagonal_size

    @property
    def bucket_shapes(self) -> dict[tuple[int, int, int], int]:
        """Number of pairs per distinct ``(n, m, h)``, in order of first appearance."""
        counts: dict[tuple[int, int, int], int] = {}
        for pair in self.pairs:
            key = (pair.n, pair.m, pair.h)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def _numel(self, names: Iterable[str]) -> int:
        total = 0
        for name in names:
            count = 1
            for size in self.parameter_shapes[name]:
                count *= size
            total += count
        return total

    @property
    def pair_parameter_count(self) -> int:
        return self._numel(self.pair_parameters)

    @property
    def diagonal_parameter_count(self) -> int:
        return self._numel(self.diagonal_parameters)

    @property
    def other_parameter_count(self) -> int:
        return self._numel(self.other)

    @property
    def frozen_parameter_count(self) -> int:
        return self._numel(self.frozen)

    # ------------------------------------------------------------------ text
    def summary(self) -> str:
        """Readable multi-line description: modules, pair counts, head dims, what was not found."""
        lines = [f"Symmetries of {self.model_type or 'model'}: {self.gl_count} GL(h) pairs in "
                 f"{len(self.bucket_shapes)} shape bucket(s), {self.diagonal_size} diagonal "
                 f"GL(1) coordinate(s), group dimension {self.group_dimension}"]
        lines.append(f"  parameters: {self.pair_parameter_count:,} in attention pairs, "
                     f"{self.diagonal_parameter_count:,} diagonal, "
                     f"{self.other_parameter_count:,} other (adaptive), "
                     f"{self.frozen_parameter_count:,} frozen (excluded)")
        if self.modules:
            lines.append(f"  attention modules ({len(self.modules)}):")
            by_module: dict[str, list[PairGroup]] = defaultdict(list)
            for group in self.groups:
                by_module[group.module].append(group)
            for module in self.modules:
                kinds = "  ".join(f"{g.kind} (n={g.n}, m={g.m}, h={g.head_dim})"
                                  for g in by_module.get(module.name, []))
                lines.append(f"    {module.name or '<root>'}  {module.type_name}  "
                             f"[{module.layout}]  {module.heads} heads  {kinds or 'no pairs'}")
        if self.pairs:
            lines.append("  buckets (all heads of all layers with one shape):")
            for (n, m, h), count in self.bucket_shapes.items():
                lines.append(f"    n={n}, m={m}, h={h}: {count} pairs")
        if self.diagonal:
            lines.append("  diagonal parameterisations:")
            for pair in self.diagonal:
                lines.append(f"    ({pair.u_name}, {pair.v_name}): {pair.size} coordinates")
        if self.frozen:
            shown = ", ".join(self.frozen[:10]) + (", ..." if len(self.frozen) > 10 else "")
            lines.append(f"  frozen parameters ({len(self.frozen)}): {shown}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        if self.unknown:
            lines.append(f"  WARNING: {len(self.unknown)} attention-like module(s) NOT understood; "
                         "no symmetry is used for them, their parameters are plain 'other' "
                         "parameters:")
            for name in self.unknown:
                lines.append(f"    {name or '<root>'}: {self.unknown_reasons.get(name, '')}")
        else:
            lines.append("  every attention-like module was understood")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# ---------------------------------------------------------------------- handlers
class _Unsupported(Exception):
    """A module looks like attention but its layout is not a supported symmetry."""


@dataclass
class _Finding:
    layout: str
    heads: int
    groups: list[PairGroup]
    notes: list[str] = field(default_factory=list)


def _parameter_name(names: dict[int, str], tensor: object, what: str) -> str:
    if not isinstance(tensor, nn.Parameter) or id(tensor) not in names:
        raise _Unsupported(f"{what} is not a plain registered parameter "
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
    raise _Unsupported("no head count attribute (" + ", ".join(HEAD_COUNT_ATTRIBUTES)
                       + ", head_dim or config.num_attention_heads)")


def _check_head_split(module: nn.Module, heads: int, q: nn.Linear, k: nn.Linear,
                      v: nn.Linear, o: nn.Linear) -> tuple[int, int]:
    """Head dims ``(d_k, d_v)`` of a q/k/v/o Linear attention, after consistency checks."""
    if q.out_features % heads or v.out_features % heads:
        raise _Unsupported(f"{heads} heads do not divide the projection widths "
                           f"({q.out_features}, {v.out_features})")
    if k.out_features != q.out_features:
        raise _Unsupported(f"key width {k.out_features} differs from query width {q.out_features} "
                           "(grouped/multi-query attention shares keys and values between heads: "
                           "not a per-head GL(h) pair)")
    if o.in_features != v.out_features:
        raise _Unsupported(f"output projection reads {o.in_features} features, values have "
                           f"{v.out_features}")
    head_dim_k = q.out_features // heads
    for attribute in ("head_dim", "attention_head_size"):
        declared = getattr(module, attribute, None)
        if isinstance(declared, int) and declared != head_dim_k:
            raise _Unsupported(f"{attribute}={declared} but the query width {q.out_features} and "
                               f"{heads} heads give {head_dim_k}")
    groups = getattr(module, "num_key_value_groups", 1)
    if isinstance(groups, int) and groups != 1:
        raise _Unsupported(f"num_key_value_groups={groups}: grouped-query attention")
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
                                names: dict[int, str]) -> _Finding | None:
    if not isinstance(module, nn.MultiheadAttention):
        return None
    if module.bias_k is not None or module.bias_v is not None:
        raise _Unsupported("add_bias_kv=True appends learned key/value rows, not supported")
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
    return _Finding("multihead_attention", heads, groups, notes)


def _handle_bert(name: str, module: nn.Module, names: dict[int, str]) -> _Finding | None:
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
        return _Finding("bert", heads, groups, notes)
    return None


_QKVO_NAMINGS = (
    ("q_proj", "k_proj", "v_proj", ("o_proj", "out_proj")),
    ("q", "k", "v", ("o",)),
    ("query", "key", "value", ("out_proj", "o_proj")),
)


def _handle_qkvo(name: str, module: nn.Module, names: dict[int, str]) -> _Finding | None:
    for q_child, k_child, v_child, o_children in _QKVO_NAMINGS:
        q, k, v = (module._modules.get(child) for child in (q_child, k_child, v_child))
        o_child = next((child for child in o_children if module._modules.get(child) is not None),
                       None)
        if o_child is None or not (_is_linear(q) and _is_linear(k) and _is_linear(v)):
            continue
        o = module._modules[o_child]
        if not _is_linear(o):
            raise _Unsupported(f"output projection {o_child} is a {type(o).__name__}, not Linear")
        heads = _head_count(module, q.out_features)
        prefix = f"{name}." if name else ""
        groups, notes = _qkvo_groups(name, module, heads, q, k, v, o, names, prefix,
                                     (q_child, k_child, v_child, o_child))
        return _Finding("qkvo", heads, groups, notes)
    return None


def _handle_gpt2(name: str, module: nn.Module, names: dict[int, str]) -> _Finding | None:
    """HF GPT-2: fused ``c_attn`` and ``c_proj`` ``Conv1D`` (``y = x W + b``, ``W=[in, out]``)."""
    c_attn, c_proj = module._modules.get("c_attn"), module._modules.get("c_proj")
    if c_attn is None or c_proj is None:
        return None
    if type(c_attn).__name__ != "Conv1D" or type(c_proj).__name__ != "Conv1D":
        return None
    if getattr(module, "is_cross_attention", False) or "q_attn" in module._modules:
        raise _Unsupported("GPT-2 cross-attention (q_attn) is not supported")
    embed = int(c_attn.weight.shape[0])
    if tuple(c_attn.weight.shape) != (embed, 3 * embed) or tuple(c_proj.weight.shape) != (embed,
                                                                                           embed):
        raise _Unsupported(f"c_attn {tuple(c_attn.weight.shape)} / c_proj "
                           f"{tuple(c_proj.weight.shape)} are not [E, 3E] / [E, E]")
    heads = _head_count(module, embed)
    if embed % heads:
        raise _Unsupported(f"{heads} heads do not divide the width {embed}")
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
    return _Finding("gpt2", heads, groups, notes)


_HANDLERS = (_handle_multihead_attention, _handle_bert, _handle_qkvo, _handle_gpt2)


def _looks_like_attention(module: nn.Module) -> bool:
    if "attention" in type(module).__name__.lower():
        return True
    return _own_qkv_like_count(module) >= 2


def _own_qkv_like_count(module: nn.Module) -> int:
    own = {child.lower() for child in module._modules} | {p.lower() for p in module._parameters}
    return len(own & _QKV_LIKE_NAMES)


def _inside(name: str, prefix: str) -> bool:
    """Whether module ``name`` lies in the subtree rooted at ``prefix``."""
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


# ---------------------------------------------------------------------- entry point
def find_symmetries(model: nn.Module,
                    diagonal: Sequence[tuple[str, str]] | None = None) -> SymmetryReport:
    """Find the attention ``GL(h)`` pairs and diagonal ``GL(1)`` parameterisations of a model.

    Parameters
    ----------
    model
        The network. It is only inspected: no tensor is read for values or written.
    diagonal
        Optional explicit diagonal parameterisations: pairs of parameter names ``(u, v)`` of equal
        shape. Modules with ``diagonal = True`` and own parameters ``u`` and ``v`` are found
        without this.

    Returns
    -------
    SymmetryReport
        Each trainable parameter is either fully covered by pairs (or diagonal pairs) or listed
        in ``other``. Frozen parameters (``requires_grad=False``) appear only in ``frozen``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    named = dict(model.named_parameters())
    names = {id(tensor): name for name, tensor in named.items()}
    report = SymmetryReport(model_type=type(model).__name__)
    report.parameter_shapes = {name: tuple(t.shape) for name, t in named.items()}
    report.parameter_dtypes = {name: t.dtype for name, t in named.items()}
    report.frozen = [name for name, t in named.items() if not t.requires_grad]
    frozen = set(report.frozen)

    claimed: list[str] = []            # subtrees handled (or rejected) by a handler
    handled: list[str] = []            # modules recognised by a handler
    findings: list[tuple[str, nn.Module, _Finding]] = []
    diagonal_found: list[tuple[str, str]] = []
    for module_name, module in model.named_modules():
        if any(_inside(module_name, prefix) for prefix in claimed):
            continue
        if getattr(module, "diagonal", False) is True:
            u, v = module._parameters.get("u"), module._parameters.get("v")
            if isinstance(u, nn.Parameter) and isinstance(v, nn.Parameter):
                diagonal_found.append((names[id(u)], names[id(v)]))
        for handler in _HANDLERS:
            try:
                finding = handler(module_name, module, names)
            except _Unsupported as reason:
                claimed.append(module_name)
                report.unknown.append(module_name)
                report.unknown_reasons[module_name] = f"{type(module).__name__}: {reason}"
                break
            if finding is not None:
                claimed.append(module_name)
                handled.append(module_name)
                findings.append((module_name, module, finding))
                break

    # attention-like modules that no handler claimed
    for module_name, module in model.named_modules():
        if any(_inside(module_name, prefix) for prefix in claimed):
            continue
        if not _looks_like_attention(module) or next(module.parameters(), None) is None:
            continue
        has_handled_descendant = any(_inside(h, module_name) for h in handled)
        if has_handled_descendant and _own_qkv_like_count(module) == 0:
            continue
        report.unknown.append(module_name)
        report.unknown_reasons[module_name] = (
            f"{type(module).__name__}: attention-like (class name or q/k/v-looking children: "
            f"{sorted({c for c in module._modules} & _QKV_LIKE_NAMES) or 'none'}) but no "
            "supported layout (nn.MultiheadAttention, BERT/ViT query/key/value + output.dense, "
            "q_proj/k_proj/v_proj/o_proj|out_proj with a head count, GPT-2 c_attn/c_proj)")

    module_order = {module_name: i for i, (module_name, _) in enumerate(model.named_modules())}
    report.unknown.sort(key=module_order.__getitem__)

    for explicit in diagonal or ():
        if (not isinstance(explicit, (tuple, list)) or len(explicit) != 2
                or not all(isinstance(s, str) for s in explicit)):
            raise TypeError(f"diagonal must be a list of (u_name, v_name) string pairs, got "
                            f"{explicit!r}")
        for item in explicit:
            if item not in named:
                raise ValueError(f"diagonal: no parameter named {item!r} in the model")
        if (explicit[0], explicit[1]) not in diagonal_found:  # may repeat a diagonal=True module
            diagonal_found.append((explicit[0], explicit[1]))

    # decide which groups survive: all their parameters trainable, not shared with another module
    candidates = [(module_name, group) for module_name, _, finding in findings
                  for group in finding.groups]
    touching: dict[str, set[int]] = defaultdict(set)
    owners: dict[str, set[str]] = defaultdict(set)
    for index, (module_name, group) in enumerate(candidates):
        for parameter in group.parameters:
            touching[parameter].add(index)
            owners[parameter].add(module_name)
    diagonal_names = {name for pair in diagonal_found for name in pair}
    dropped: set[int] = set()
    for index, (module_name, group) in enumerate(candidates):
        frozen_here = [p for p in group.parameters if p in frozen]
        shared = [p for p in group.parameters if len(owners[p]) > 1 or p in diagonal_names]
        dtypes = {report.parameter_dtypes[p] for p in group.parameters}
        devices = {named[p].device for p in group.parameters}
        if frozen_here:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, frozen "
                                f"parameter(s) {', '.join(frozen_here)}")
        elif shared:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, "
                                f"parameter(s) {', '.join(shared)} shared with another symmetry")
        elif len(dtypes) > 1 or len(devices) > 1:
            report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, its "
                                "parameters mix dtypes or devices")
        else:
            continue
        dropped.add(index)
    changed = True
    while changed:  # a parameter is covered only if every group that reads it survives
        changed = False
        for index, (module_name, group) in enumerate(candidates):
            if index in dropped:
                continue
            blocking = [p for p in group.parameters if touching[p] & dropped]
            if blocking:
                dropped.add(index)
                changed = True
                report.notes.append(f"{module_name or '<root>'}: {group.kind} pairs dropped, "
                                    f"parameter(s) {', '.join(blocking)} also feed dropped pairs")

    kept_by_module: dict[str, list[PairGroup]] = defaultdict(list)
    for index, (module_name, group) in enumerate(candidates):
        if index not in dropped:
            kept_by_module[module_name].append(group)
    for module_name, module, finding in findings:
        kept = kept_by_module.get(module_name, [])
        report.groups.extend(kept)
        report.notes.extend(finding.notes)
        report.modules.append(AttentionModule(module_name, type(module).__name__, finding.layout,
                                              finding.heads, tuple(g.kind for g in kept)))
    report.pairs = [pair for group in report.groups for pair in group.pairs()]

    covered = set(report.pair_parameters)
    seen_diagonal: set[str] = set()
    for u_name, v_name in diagonal_found:
        if report.parameter_shapes[u_name] != report.parameter_shapes[v_name]:
            raise ValueError(f"diagonal: {u_name!r} has shape {report.parameter_shapes[u_name]} "
                             f"but {v_name!r} has {report.parameter_shapes[v_name]}")
        if u_name == v_name or {u_name, v_name} & (seen_diagonal | covered):
            raise ValueError(f"diagonal: ({u_name!r}, {v_name!r}) reuses a parameter that is "
                             "already in a symmetry")
        if u_name in frozen or v_name in frozen:
            report.notes.append(f"diagonal ({u_name}, {v_name}) dropped: a factor is frozen")
            continue
        if (named[u_name].dtype != named[v_name].dtype
                or named[u_name].device != named[v_name].device):
            raise ValueError(f"diagonal: {u_name!r} and {v_name!r} differ in dtype or device")
        seen_diagonal.update((u_name, v_name))
        size = 1
        for extent in report.parameter_shapes[u_name]:
            size *= extent
        report.diagonal.append(DiagonalPair(u_name, v_name, size))

    in_symmetry = covered | seen_diagonal
    report.other = [name for name in named if name not in frozen and name not in in_symmetry]
    return report
