"""What :func:`~quotientsharp.models.find_symmetries` returns: the symmetry report and its parts
(data types only, nothing that inspects a model)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from quotientsharp.core.scalars import shortened

PAIR_KINDS = ("qk", "vo")
#: What discovery decided for an adapter (:attr:`LoraAdapter.status`).
ADAPTER_STATUSES = ("pair", "degenerate", "merged", "inactive", "frozen", "unsupported",
                    "dropped")
#: ``(rotary_dims, layout)`` of a rotary query/key pair.
RotarySpec = tuple[int, str]


def rotary_group_name(head_dim: int, rotary: RotarySpec | None) -> str:
    """The pair's group: ``"GL(h)"``, ``"GL(1,C)^{R/2}"`` or ``"GL(1,C)^{R/2} x GL(h - R)"``."""
    if rotary is None:
        return f"GL({head_dim})"
    rotary_dims = rotary[0]
    parts = [f"GL(1,C)^{rotary_dims // 2}"] if rotary_dims else []
    if rotary_dims < head_dim:
        parts.append(f"GL({head_dim - rotary_dims})")
    return " x ".join(parts)


class NoSymmetryWarning(UserWarning):
    """A model where discovery found no symmetry (and none was bound): geodesic sharpness is
    adaptive sharpness there, and the quotient optimisers step like their plain versions."""


class UnboundSymmetryWarning(UserWarning):
    """Bindings were given, so discovery is off, and it finds symmetries in parameters that no
    binding holds (LoRA adapters, attention heads, diagonal pairs): those are measured with the
    adaptive geometry, not on their quotient."""


@dataclass(frozen=True)
class AttentionPair:
    """One pair of one head: ``G`` is ``shape=[n, h]``, ``H`` is ``shape=[m, h]``.

    Attributes
    ----------
    module
        Qualified name of the attention module, e.g. ``"encoder.layer.0.attention"``.
    kind
        ``"qk"`` (query/key) or ``"vo"`` (value/output).
    head
        Head index inside the module; with grouped-query attention the key/value head.
    n, m, h
        Factor shapes, bias rows included (the bias is appended to ``G`` as a last row).
    rotary
        ``(rotary_dims, layout)`` of a query/key pair under rotary position embeddings (its group
        is then ``GL(1,C)^{rotary_dims/2} x GL(h - rotary_dims)``), ``None`` for ``GL(h)``.
    query_heads
        Query heads that share this key/value head (grouped-query attention; ``1`` otherwise):
        their blocks are stacked along the rows of ``G`` (qk) or of ``H`` (vo).
    """

    module: str
    kind: str
    head: int
    n: int
    m: int
    h: int
    rotary: RotarySpec | None = None
    query_heads: int = 1

    @property
    def group(self) -> str:
        """The symmetry group acting on the pair, e.g. ``"GL(8)"`` or ``"GL(1,C)^4"``."""
        return rotary_group_name(self.h, self.rotary)

    @property
    def group_dimension(self) -> int:
        """Real dimension of :attr:`group`: ``h^2``, or ``R + (h - R)^2`` with rotary embeddings."""
        if self.rotary is None:
            return self.h * self.h
        return self.rotary[0] + (self.h - self.rotary[0]) ** 2


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

    For all pairs at once, the block is ``shape=[heads, members, rows, head_dim]``, where
    ``heads`` and ``members`` are the :class:`PairGroup`'s (``members`` heads' features per pair,
    for grouped-query attention; ``1`` otherwise).

    Attributes
    ----------
    parameter
        Parameter name.
    role
        ``"weight"``: a 2-D parameter; ``axis`` is the dimension that indexes head features
        (``0`` for q/k/v ``nn.Linear`` weights, ``1`` for the output projection's weight);
        the other dimension gives the ``rows``. ``"bias"``: a 1-D parameter, one row.
    axis
        Dimension of the parameter that runs over the head features.
    offset
        Start of this block along ``axis`` (fused projections: 0, E, 2E).
    rows
        Number of factor rows contributed per head.
    stride
        Distance along ``axis`` between the features of consecutive pairs; ``0`` (the default)
        means back to back, ``members * head_dim``. Pair ``p`` reads
        ``[offset + p * stride + phase, ... + members * head_dim)``: a fused projection that
        interleaves its heads (GPT-NeoX's ``[q_0, k_0, v_0, q_1, ...]``) has
        ``stride = 3 * head_dim`` and ``phase`` 0, ``head_dim``, ``2 * head_dim``.
    phase
        Position of the block inside each stride (``0`` for back-to-back features).
    """

    parameter: str
    role: str
    axis: int
    offset: int
    rows: int
    stride: int = 0
    phase: int = 0


@dataclass(frozen=True)
class PairGroup:
    """All heads of one pair kind of one module: ``heads`` pairs sharing the shapes ``(n, m, h)``.

    ``G`` of all pairs, ``shape=[heads, n, head_dim]``, stacks along rows ``g_members`` member
    blocks, each the concatenation along rows of ``g_sources`` (likewise ``H``): member ``t`` of
    pair ``p`` reads head ``p * g_members + t`` of its sources. Grouped-query attention with
    ``g`` query heads per key/value head (HF ``repeat_kv``: query head ``i = j g + t`` reads
    key/value head ``j``) has ``g_members = g`` for qk (the ``g`` query heads of a group over one
    key head) and ``h_members = g`` for vo (one value head, the output columns of its ``g``
    query heads); every other layout has one member.

    Attributes
    ----------
    rotary
        ``(rotary_dims, layout)`` for a query/key group under rotary embeddings, else ``None``.
    """

    module: str
    kind: str
    heads: int
    head_dim: int
    g_sources: tuple[FactorSource, ...]
    h_sources: tuple[FactorSource, ...]
    g_members: int = 1
    h_members: int = 1
    rotary: RotarySpec | None = None

    @property
    def n(self) -> int:
        return self.g_members * sum(source.rows for source in self.g_sources)

    @property
    def m(self) -> int:
        return self.h_members * sum(source.rows for source in self.h_sources)

    @property
    def query_heads(self) -> int:
        """Query heads per pair (``g`` of grouped-query attention, else ``1``)."""
        return max(self.g_members, self.h_members)

    @property
    def group(self) -> str:
        """The symmetry group of each pair, e.g. ``"GL(8)"`` or ``"GL(1,C)^2 x GL(4)"``."""
        return rotary_group_name(self.head_dim, self.rotary)

    @property
    def parameters(self) -> tuple[str, ...]:
        """Names of the parameters this group reads (each possibly only in part)."""
        names = [source.parameter for source in self.g_sources + self.h_sources]
        return tuple(dict.fromkeys(names))

    def pairs(self) -> list[AttentionPair]:
        return [AttentionPair(self.module, self.kind, head, self.n, self.m, self.head_dim,
                              self.rotary, self.query_heads)
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
        ``q_proj/k_proj/v_proj/o_proj`` and relatives), ``"gpt2"`` (fused ``c_attn`` / ``c_proj``
        Conv1D), ``"fused_per_head"`` (GPT-NeoX / BLOOM ``query_key_value`` + ``dense``),
        ``"fused_contiguous"`` (Phi-3 ``qkv_proj`` / MPT ``Wqkv``, queries, keys and values back
        to back).
    heads
        Number of (query) heads.
    kinds
        Pair kinds kept (``"qk"``, ``"vo"``); a kind is missing when it is not a symmetry of this
        module (see ``notes``) or its parameters are frozen.
    kv_heads
        Number of key/value heads: ``heads`` unless the module uses grouped- or multi-query
        attention.
    """

    name: str
    type_name: str
    layout: str
    heads: int
    kinds: tuple[str, ...] = ()
    kv_heads: int | None = None


@dataclass(frozen=True)
class LoraAdapter:
    """One named adapter of one LoRA layer, and what discovery made of it.

    Attributes
    ----------
    module
        Qualified name of the LoRA layer, e.g. ``"base_model.model.encoder.layer.0.attention.
        self.query"``.
    adapter
        The adapter's name (PEFT's ``"default"`` unless named).
    layer
        ``"linear"``, ``"embedding"``, ``"conv"``, or the class name of an unsupported layer.
    r
        Rank: the group is ``GL(r)``.
    alpha, scaling
        ``lora_alpha`` and the factor ``s`` of ``s B A`` (``alpha / r``; ``alpha / sqrt(r)``
        with rsLoRA). The scaling does not affect the ``GL(r)`` action.
    rslora, dora
        Whether the adapter uses rank-stabilised scaling, and DoRA's magnitude vector.
    a_parameter, b_parameter
        Names of the parameters holding ``A`` (``shape=[r, ...]``) and ``B``
        (``shape=[out, r, ...]``).
    magnitude_parameter
        DoRA's magnitude vector (in the adaptive block), else ``None``.
    status
        One of :data:`ADAPTER_STATUSES`: ``"pair"`` when the adapter is a ``GL(r)`` pair of
        the report; ``"dropped"`` when it was one but the walker dropped it (see the notes).
    reason
        Why the adapter is not a pair (empty for pairs).
    rank_a, rank_b
        Numerical ranks of ``A`` and ``B`` (``None`` when the values were not read).
    """

    module: str
    adapter: str
    layer: str
    r: int
    alpha: float
    scaling: float
    rslora: bool = False
    dora: bool = False
    a_parameter: str | None = None
    b_parameter: str | None = None
    magnitude_parameter: str | None = None
    status: str = "pair"
    reason: str = ""
    rank_a: int | None = None
    rank_b: int | None = None

    @property
    def label(self) -> str:
        """``module[adapter]``: the adapter's name in notes and in the pair labels."""
        return f"{self.module}[{self.adapter}]"

    @property
    def group(self) -> str:
        """The symmetry group, ``"GL(r)"``."""
        return f"GL({self.r})"

    def summary_line(self) -> str:
        """One readable line: name, layer, rank, scaling and what discovery made of it."""
        extras = "".join(text for flag, text in ((self.rslora, ", rsLoRA"),
                                                 (self.dora, ", DoRA")) if flag)
        head = (f"{self.label}  {self.layer}  r={self.r}  alpha={self.alpha:g}  "
                f"scaling={self.scaling:.4g}{extras}")
        if self.status == "pair":
            return f"{head}  -> {self.group} pair"
        return f"{head}  -> {self.status}: {self.reason}"


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
        Trainable parameter names outside any symmetry (the adaptive geometry, metric
        ``diag(1 / w^2)``).
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
    adapters
        Every LoRA adapter found (:class:`~quotientsharp.models.LoraAdapter`), pair or
        not, with its rank and why it is not a pair; its pairs are groups of kind ``"lora"``.
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
    adapters: list[LoraAdapter] = field(default_factory=list)

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
        """Dimension of the symmetry group (= of each vertical space): ``sum h^2 + D``.

        A rotary query/key pair contributes ``R + (h - R)^2`` instead of ``h^2``.
        """
        return sum(pair.group_dimension for pair in self.pairs) + self.diagonal_size

    @property
    def bucket_shapes(self) -> dict[tuple[int, int, int], int]:
        """Number of pairs per distinct ``(n, m, h)``, in order of first appearance."""
        counts: dict[tuple[int, int, int], int] = {}
        for (n, m, h, _), count in self.bucket_groups.items():
            counts[(n, m, h)] = counts.get((n, m, h), 0) + count
        return counts

    @property
    def bucket_groups(self) -> dict[tuple[int, int, int, RotarySpec | None], int]:
        """Number of pairs per distinct ``(n, m, h, rotary)``: the layout's buckets (one group
        each), in order of first appearance."""
        return dict(Counter((pair.n, pair.m, pair.h, pair.rotary) for pair in self.pairs))

    def _numel(self, names: Iterable[str]) -> int:
        return sum(math.prod(self.parameter_shapes[name]) for name in names)

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
        lines = self._totals_lines() + self._module_lines()
        if self.pairs:
            lines += ["  buckets (all heads of all layers with one shape and group):"] + [
                f"    n={n}, m={m}, h={h}, {rotary_group_name(h, spec)}: {count} pairs"
                for (n, m, h, spec), count in self.bucket_groups.items()]
        if self.adapters:
            pairs = sum(a.status == "pair" for a in self.adapters)
            lines += [f"  LoRA adapters ({len(self.adapters)}, {pairs} GL(r) pairs):"] + [
                f"    {adapter.summary_line()}" for adapter in self.adapters]
        if self.diagonal:
            lines += ["  diagonal parameterisations:"] + [
                f"    ({pair.u_name}, {pair.v_name}): {pair.size} coordinates"
                for pair in self.diagonal]
        if self.frozen:
            shown = shortened(self.frozen, 10)
            lines.append(f"  frozen parameters ({len(self.frozen)}): {shown}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines + self._unknown_lines())

    def _totals_lines(self) -> list[str]:
        """The pair, coordinate and parameter counts."""
        rotary = sum(pair.rotary is not None for pair in self.pairs)
        rotary_text = (f" ({rotary} of them rotary query/key pairs, group GL(1,C)^(R/2) x "
                       "GL(h-R))") if rotary else ""
        return [f"Symmetries of {self.model_type or 'model'}: {self.gl_count} GL(h) pairs"
                f"{rotary_text} in {len(self.bucket_groups)} shape bucket(s), "
                f"{self.diagonal_size} diagonal GL(1) coordinate(s), group dimension "
                f"{self.group_dimension}",
                f"  parameters: {self.pair_parameter_count:,} in attention pairs, "
                f"{self.diagonal_parameter_count:,} diagonal, "
                f"{self.other_parameter_count:,} other (adaptive), "
                f"{self.frozen_parameter_count:,} frozen (excluded)"]

    def _module_lines(self) -> list[str]:
        """One line per recognised attention module: layout, heads, pair groups."""
        if not self.modules:
            return []
        lines = [f"  attention modules ({len(self.modules)}):"]
        by_module: dict[str, list[PairGroup]] = defaultdict(list)
        for group in self.groups:
            by_module[group.module].append(group)
        for module in self.modules:
            kinds = "  ".join(
                f"{g.kind} (n={g.n}, m={g.m}, h={g.head_dim}, {g.group}"
                + (f", {g.rotary[1]} rotary on {g.rotary[0]} dims" if g.rotary else "") + ")"
                for g in by_module.get(module.name, []))
            heads = f"{module.heads} heads"
            if module.kv_heads is not None and module.kv_heads != module.heads:
                plural = "s" if module.kv_heads > 1 else ""
                heads += f" ({module.kv_heads} key/value head{plural})"
            lines.append(f"    {module.name or '<root>'}  {module.type_name}  "
                         f"[{module.layout}]  {heads}  {kinds or 'no pairs'}")
        return lines

    def _unknown_lines(self) -> list[str]:
        """The attention-like modules not understood, or that there were none."""
        if not self.unknown:
            return ["  every attention-like module was understood"]
        return [f"  WARNING: {len(self.unknown)} attention-like module(s) NOT understood; "
                "no symmetry is used for them, their parameters are plain 'other' "
                "parameters:"] + [f"    {name or '<root>'}: {self.unknown_reasons.get(name, '')}"
                                  for name in self.unknown]

    def __str__(self) -> str:
        return self.summary()
