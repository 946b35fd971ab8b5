"""Parameters <-> symmetry coordinates: all heads of all layers stacked per factor shape.

:class:`ParameterLayout` maps a dict of parameters to :class:`Coordinates` (one ``(G, H)`` per
bucket of pairs of one shape and group, the diagonal ``(u, v)``, the other parameters) and back.
Both directions are reshapes, transposes, slices and concatenations: differentiable, bit-exact
and functional, and, the map being linear, they carry tangent vectors and gradients too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from quotientsharp.models.report import AttentionPair, FactorSource, PairGroup, SymmetryReport


@dataclass
class Coordinates:
    """A point (or tangent vector) in symmetry coordinates.

    Attributes
    ----------
    gl
        One ``(G, H)`` per bucket: ``G`` ``shape=[P, n, h]``, ``H`` ``shape=[P, m, h]``.
    gl_pairs
        ``gl_pairs[b][p]`` is the :class:`AttentionPair` stored at index ``p`` of bucket ``b``.
    diagonal
        ``(u, v)``, ``shape=[D]`` each, or ``None`` when the model has no diagonal pairs.
    other
        The remaining trainable parameters by name (the very tensors that were passed in).
    """

    gl: list[tuple[torch.Tensor, torch.Tensor]]
    gl_pairs: list[list[AttentionPair]]
    diagonal: tuple[torch.Tensor, torch.Tensor] | None
    other: dict[str, torch.Tensor]

    def replace(self, **changes: Any) -> Coordinates:
        """A copy with some fields replaced (``gl=...``, ``diagonal=...``, ``other=...``)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class _Block:
    """Where one source block of one group sits inside a bucket tensor."""

    bucket: int
    factor: int          # 0: G, 1: H
    start: int           # first index on dim 0 of the bucket
    heads: int
    head_dim: int
    members: int         # head blocks per pair, stacked along the factor's rows
    member_rows: int     # rows of one member block (all sources of the factor)
    row: int             # first row of this source inside a member block
    source: FactorSource

    @property
    def span(self) -> int:
        """Features one pair reads along ``source.axis``."""
        return self.members * self.head_dim

    @property
    def stride(self) -> int:
        return self.source.stride or self.span


def _gather(tensor: torch.Tensor, source: FactorSource, heads: int, members: int,
            head_dim: int) -> torch.Tensor:
    """The block ``shape=[heads, members, rows, head_dim]`` that ``source`` reads."""
    span = members * head_dim
    stride = source.stride or span
    features = tensor.narrow(source.axis, source.offset, heads * stride)
    if source.role == "bias":                   # [heads * stride]
        block = features.reshape(heads, stride).narrow(1, source.phase, span)
        return block.reshape(heads, members, 1, head_dim)
    if source.axis == 0:                        # [heads * stride, rows]
        block = features.reshape(heads, stride, source.rows).narrow(1, source.phase, span)
        return block.reshape(heads, members, head_dim, source.rows).transpose(2, 3)
    block = features.reshape(source.rows, heads, stride).narrow(2, source.phase, span)
    return block.reshape(source.rows, heads, members, head_dim).permute(1, 2, 0, 3)


def _scatter(block: torch.Tensor, source: FactorSource) -> torch.Tensor:
    """Inverse of :func:`_gather` for one phase: ``shape=[heads, span]`` (bias),
    ``[heads, span, rows]`` (``axis=0``) or ``[rows, heads, span]`` (``axis=1``)."""
    heads, members, _, head_dim = block.shape
    span = members * head_dim
    if source.role == "bias":
        return block.reshape(heads, span)
    if source.axis == 0:
        return block.transpose(2, 3).reshape(heads, span, source.rows)
    return block.permute(2, 0, 1, 3).reshape(source.rows, heads, span)


def _split_if_tiling(tensor: torch.Tensor, spans: list[tuple[int, int]],
                     dim: int) -> list[torch.Tensor]:
    """The ``(start, length)`` spans of ``tensor`` along ``dim``: one ``split`` when they tile
    the dimension, else one ``narrow`` each."""
    position = 0
    for start, length in spans:
        if start != position:
            break
        position += length
    else:
        if position == tensor.shape[dim]:
            return list(torch.split(tensor, [length for _, length in spans], dim=dim))
    return [tensor.narrow(dim, start, length) for start, length in spans]


def _check_params(params: object, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """``params`` a dict with a tensor of shape ``shapes[name]`` for every name of ``shapes``."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of tensors, got {type(params).__name__}")
    for name, shape in shapes.items():
        tensor = params.get(name)
        if not isinstance(tensor, torch.Tensor):
            raise KeyError(f"params has no tensor {name!r} (a trainable parameter of the "
                           "model the report was made for)")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"params[{name!r}] has shape {tuple(tensor.shape)}, expected "
                             f"{shape}")


def _matrix_shape(name: str, shape: tuple[int, ...], role: str, axis: int) -> tuple[int, ...]:
    """The shape of parameter ``name`` as the matrix (weight) or vector (bias) its blocks read
    (a convolution weight as the matrix of its flattening)."""
    flat = shape
    if role == "weight" and len(shape) > 2 and (axis == 0 or set(shape[2:]) == {1}):
        flat = (shape[0], math.prod(shape[1:])) if axis == 0 else shape[:2]
    if len(flat) != (1 if role == "bias" else 2):
        raise ValueError(f"parameter {name!r} of shape {shape} cannot be a {role} source")
    return flat


def _check_phases(name: str, offset: int, segment: list[_Block]) -> None:
    """The interleaved blocks at ``offset``, in phase order, tile their stride exactly."""
    phase = 0
    for block in segment:
        if block.source.phase != phase:
            raise ValueError(f"parameter {name!r}: the interleaved blocks at offset "
                             f"{offset} do not tile their stride (gap or overlap at "
                             f"phase {phase})")
        phase += block.span
    if phase != segment[0].stride:
        raise ValueError(f"parameter {name!r}: the interleaved blocks at offset {offset} "
                         f"cover {phase} of each stride of {segment[0].stride}")


class ParameterLayout:
    """The map between a model's parameter dict and symmetry :class:`Coordinates`.

    Parameters
    ----------
    report
        From :func:`~quotientsharp.models.find_symmetries`.
    params
        Reference parameters, e.g. ``dict(model.named_parameters())``: their shapes, dtypes and
        devices fix the layout (values are not read). Frozen parameters may be included; they
        are ignored.

    Attributes
    ----------
    names
        Parameter names handled, in ``named_parameters`` order: every trainable parameter.
    bucket_shapes
        ``(n, m, h)`` of each bucket.
    gl_pairs
        Pairs per bucket, in stacking order.
    """

    def __init__(self, report: SymmetryReport, params: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(report, SymmetryReport):
            raise TypeError(f"report must be a SymmetryReport, got {type(report).__name__}")
        self.report = report
        self.names = report.trainable
        _check_params(params, {name: report.parameter_shapes[name] for name in self.names})
        self._shapes = {name: tuple(params[name].shape) for name in self.names}
        self._dtypes = {name: params[name].dtype for name in self.names}
        self._devices = {name: params[name].device for name in self.names}
        self._build_buckets(report.groups)
        # per covered parameter, its segments along the head-feature axis: a block of
        # back-to-back features alone, or the phases of one strided range in phase order
        self._segments: dict[str, list[list[_Block]]] = {
            name: self._check_tiling(name, parameter_blocks)
            for name, parameter_blocks in self._blocks_by_parameter().items()}
        self._scatter_views = self._find_scatter_views()
        self._diagonal = list(report.diagonal)
        self._other = list(report.other)
        covered = set(self._segments) | {n for p in self._diagonal for n in (p.u_name, p.v_name)}
        missing = [n for n in self.names if n not in covered and n not in set(self._other)]
        if missing:
            raise ValueError(f"report does not place parameter(s) {missing}: it was made for "
                             "another model")

    def _build_buckets(self, groups: list[PairGroup]) -> None:
        """Sort the groups into buckets of equal ``(n, m, h)``, group, dtype and device."""
        bucket_keys: list[tuple] = []
        self._bucket_groups: list[list[tuple[int, PairGroup]]] = []
        self.gl_pairs: list[list[AttentionPair]] = []
        for group in groups:
            dtype = self._dtypes[group.parameters[0]]
            device = self._devices[group.parameters[0]]
            key = (group.n, group.m, group.head_dim, group.rotary, dtype, device)
            if key not in bucket_keys:
                bucket_keys.append(key)
                self._bucket_groups.append([])
                self.gl_pairs.append([])
            index = bucket_keys.index(key)
            start = len(self.gl_pairs[index])
            self._bucket_groups[index].append((start, group))
            self.gl_pairs[index].extend(group.pairs())
        self.bucket_shapes = [key[:3] for key in bucket_keys]
        #: ``(rotary_dims, layout)`` of each bucket's pairs, ``None`` for ``GL(h)`` buckets.
        self.bucket_rotary = [key[3] for key in bucket_keys]

    def _blocks_by_parameter(self) -> dict[str, list[_Block]]:
        """Per covered parameter, the blocks that read it, in bucket order."""
        blocks: dict[str, list[_Block]] = {}
        for bucket, entries in enumerate(self._bucket_groups):
            for start, group in entries:
                for factor, sources in enumerate((group.g_sources, group.h_sources)):
                    members = group.g_members if factor == 0 else group.h_members
                    member_rows = sum(source.rows for source in sources)
                    row = 0
                    for source in sources:
                        blocks.setdefault(source.parameter, []).append(
                            _Block(bucket, factor, start, group.heads, group.head_dim, members,
                                   member_rows, row, source))
                        row += source.rows
        return blocks

    def _find_scatter_views(self) -> set[str]:
        """Single-block parameters whose scatter from a contiguous bucket would be a mere view."""
        views: set[str] = set()
        for name, segments in self._segments.items():
            if len(segments) != 1 or len(segments[0]) != 1:
                continue
            block = segments[0][0]
            probe = torch.empty(len(self.gl_pairs[block.bucket]),
                                block.members * block.member_rows, block.head_dim, device="meta")
            # views share the ``_base`` of their root tensor: the probe itself if no copy was made
            probes = [probe] * (2 * len(self.gl_pairs))
            if self._assemble(name, probes, self._pieces(probes, [name]))._base is probe:
                views.add(name)
        return views

    def _check_tiling(self, name: str, blocks: list[_Block]) -> list[list[_Block]]:
        """The blocks of parameter ``name`` as segments that tile its head-feature axis."""
        shape = self._shapes[name]
        roles = {b.source.role for b in blocks}
        axes = {b.source.axis for b in blocks}
        if len(roles) != 1 or len(axes) != 1:
            raise ValueError(f"parameter {name!r} is read inconsistently by the report")
        role, axis = roles.pop(), axes.pop()
        flat = _matrix_shape(name, shape, role, axis)
        for block in blocks:
            if role == "weight" and flat[1 - axis] != block.source.rows:
                raise ValueError(f"parameter {name!r} of shape {shape}: a block expects "
                                 f"{block.source.rows} rows")
            if block.source.phase < 0 or block.source.phase + block.span > block.stride:
                raise ValueError(f"parameter {name!r}: a block of {block.span} features at phase "
                                 f"{block.source.phase} does not fit its stride {block.stride}")
        by_offset: dict[int, list[_Block]] = {}
        for block in blocks:
            by_offset.setdefault(block.source.offset, []).append(block)
        segments = []
        position = 0
        for offset in sorted(by_offset):
            segment = sorted(by_offset[offset], key=lambda b: b.source.phase)
            if offset != position or len({(b.heads, b.stride) for b in segment}) != 1:
                raise ValueError(f"parameter {name!r}: pairs do not tile dimension {axis} "
                                 f"(gap or overlap at {position})")
            _check_phases(name, offset, segment)
            segments.append(segment)
            position += segment[0].heads * segment[0].stride
        if position != shape[axis]:
            raise ValueError(f"parameter {name!r} of shape {shape}: pairs cover {position} of "
                             f"{shape[axis]} features along dimension {axis}")
        return segments

    def _pieces(self, factors: list[torch.Tensor], names: list[str] | None = None
                ) -> dict[tuple[int, ...], torch.Tensor]:
        """Every block's piece of the bucket factors (of the parameters ``names`` only, if
        given), ``shape=[heads, members, rows, h]``, keyed by ``(2 * bucket + factor, start,
        heads, row, rows)``; cut by one ``split`` where they tile (its backward allocates once,
        where each slice's would write a zero tensor of the whole factor)."""
        wanted: dict[int, dict[tuple[int, int], set[tuple[int, int]]]] = {}
        shapes: dict[tuple[int, int, int], tuple[int, int]] = {}
        for name, segments in self._segments.items():
            if names is not None and name not in names:
                continue
            for segment in segments:
                for block in segment:
                    index = 2 * block.bucket + block.factor
                    wanted.setdefault(index, {}).setdefault(
                        (block.start, block.heads), set()).add((block.row, block.source.rows))
                    shapes[(index, block.start, block.heads)] = (block.members,
                                                                block.member_rows)
        pieces: dict[tuple[int, ...], torch.Tensor] = {}
        for index, ranges in wanted.items():
            tensor = factors[index]
            spans = sorted(ranges)
            heads = _split_if_tiling(tensor, spans, 0)
            for (start, count), part in zip(spans, heads, strict=True):
                members, member_rows = shapes[(index, start, count)]
                part = part.unflatten(1, (members, member_rows))
                rows = sorted(ranges[(start, count)])
                for (row, size), piece in zip(rows, _split_if_tiling(part, rows, 2),
                                              strict=True):
                    pieces[(index, start, count, row, size)] = piece
        return pieces

    def _assemble(self, name: str, factors: list[torch.Tensor],
                  pieces: dict[tuple[int, ...], torch.Tensor]) -> torch.Tensor:
        """Parameter ``name`` from the ``pieces`` of its buckets' factors (:meth:`_pieces`)."""
        axis = self._segments[name][0][0].source.axis
        segments = []
        for segment in self._segments[name]:
            parts = [_scatter(pieces[(2 * block.bucket + block.factor, block.start, block.heads,
                                      block.row, block.source.rows)], block.source)
                     for block in segment]
            # the phases of a segment: their (heads, span) dimensions sit at (axis, axis + 1)
            joined = parts[0] if len(parts) == 1 else torch.cat(parts, dim=axis + 1)
            segments.append(joined.flatten(axis, axis + 1))
        joined = segments[0] if len(segments) == 1 else torch.cat(segments, dim=axis)
        # a no-op view but for convolution weights, assembled as the matrix of their flattening
        return joined.reshape(self._shapes[name])

    # ------------------------------------------------------------------ maps
    def to_coordinates(self, params: Mapping[str, torch.Tensor]) -> Coordinates:
        """Parameters (or gradients / tangent vectors) by name to :class:`Coordinates`.

        Parameters
        ----------
        params
            Every name in :attr:`names`, same shapes as the reference; extra names (frozen
            parameters, buffers) are ignored.
        """
        _check_params(params, self._shapes)
        gl = []
        for entries in self._bucket_groups:
            factors = []
            for factor in (0, 1):
                stacked = []
                for _, group in entries:
                    sources = group.g_sources if factor == 0 else group.h_sources
                    members = group.g_members if factor == 0 else group.h_members
                    blocks = [_gather(params[s.parameter], s, group.heads, members,
                                      group.head_dim) for s in sources]
                    block = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)
                    stacked.append(block.flatten(1, 2))
                # cat always allocates, so coordinates never alias the parameters
                factors.append(torch.cat(stacked, dim=0))
            gl.append((factors[0], factors[1]))
        diagonal = None
        if self._diagonal:
            diagonal = (torch.cat([params[p.u_name].reshape(-1) for p in self._diagonal]),
                        torch.cat([params[p.v_name].reshape(-1) for p in self._diagonal]))
        other = {name: params[name] for name in self._other}
        return Coordinates(gl, self.gl_pairs, diagonal, other)

    def to_parameters(self, coords: Coordinates) -> dict[str, torch.Tensor]:
        """The exact inverse of :meth:`to_coordinates`: a new dict with every name in :attr:`names`.

        Results take the dtype and device of the reference parameters (a no-op for coordinates
        made by :meth:`to_coordinates`). Tensors of ``coords.other`` are passed through as they
        are; every other tensor is newly allocated.
        """
        gl = self._check_gl_coordinates(getattr(coords, "gl", None))
        diagonal = self._check_diagonal_coordinates(getattr(coords, "diagonal", None))
        other = self._check_other_coordinates(getattr(coords, "other", None))
        factors = [tensor for pair in gl for tensor in pair]
        pieces = self._pieces(factors)
        result: dict[str, torch.Tensor] = {}
        for name in self.names:
            if name in self._segments:
                tensor = self._assemble(name, factors, pieces)
                segments = self._segments[name]
                if len(segments) == 1 and len(segments[0]) == 1:
                    block = segments[0][0]
                    # the transposing reshape already copied (known from the shapes), unless the
                    # layout is degenerate or the caller's bucket is not contiguous
                    if name in self._scatter_views or not gl[
                            block.bucket][block.factor].is_contiguous():
                        tensor = tensor.clone(memory_format=torch.contiguous_format)
                result[name] = tensor.to(dtype=self._dtypes[name], device=self._devices[name])
            elif name in other:
                result[name] = other[name]
        if self._diagonal:
            assert diagonal is not None  # _check_coordinates demands (u, v) when there are pairs
            sizes = [p.size for p in self._diagonal]
            for factor, attribute in ((0, "u_name"), (1, "v_name")):
                # clone so that results never share storage with the coordinates
                for pair, chunk in zip(self._diagonal, diagonal[factor].split(sizes),
                                       strict=True):
                    name = getattr(pair, attribute)
                    result[name] = chunk.reshape(self._shapes[name]).clone().to(
                        dtype=self._dtypes[name], device=self._devices[name])
        return {name: result[name] for name in self.names}

    # ------------------------------------------------------------------ checks
    def _check_gl_coordinates(self, gl: object) -> list[Any]:
        """``coords.gl``: one ``(G, H)`` pair per bucket, ``shape=[pairs, n, h]`` and
        ``[pairs, m, h]``."""
        if not isinstance(gl, (list, tuple)) or len(gl) != len(self.bucket_shapes):
            raise ValueError(f"coords.gl must be a list of {len(self.bucket_shapes)} (G, H) "
                             f"tuples, got {type(gl).__name__}"
                             + (f" of length {len(gl)}" if isinstance(gl, (list, tuple)) else ""))
        for b, (entry, (n, m, h), pairs) in enumerate(zip(gl, self.bucket_shapes, self.gl_pairs,
                                                           strict=True)):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise ValueError(f"coords.gl[{b}] must be a (G, H) tuple")
            for factor, rows in ((0, n), (1, m)):
                tensor = entry[factor]
                expected = (len(pairs), rows, h)
                if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != expected:
                    got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)
                    raise ValueError(f"coords.gl[{b}][{factor}] must have shape {expected}, got "
                                     f"{got}")
        return list(gl)

    def _check_diagonal_coordinates(self, diagonal: Any) -> Sequence[torch.Tensor] | None:
        """``coords.diagonal``: ``(u, v)`` of all diagonal pairs' coordinates, or ``None``."""
        if self._diagonal:
            size = sum(p.size for p in self._diagonal)
            if (not isinstance(diagonal, (tuple, list)) or len(diagonal) != 2
                    or any(not isinstance(t, torch.Tensor) or tuple(t.shape) != (size,)
                           for t in diagonal)):
                raise ValueError(f"coords.diagonal must be a (u, v) tuple of shape ({size},) "
                                 "tensors")
        elif diagonal is not None:
            raise ValueError("coords.diagonal must be None: the model has no diagonal pairs")
        return diagonal

    def _check_other_coordinates(self, other: object) -> Mapping[str, torch.Tensor]:
        """``coords.other``: a tensor of the reference shape for every other parameter."""
        if not isinstance(other, Mapping):
            raise ValueError("coords.other must be a dict of tensors")
        for name in self._other:
            tensor = other.get(name)
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != self._shapes[name]:
                raise ValueError(f"coords.other[{name!r}] must be a tensor of shape "
                                 f"{self._shapes[name]}")
        return other

    def __repr__(self) -> str:
        buckets = ", ".join(f"{len(p)}x(n={n}, m={m}, h={h}, {p[0].group})"
                            for (n, m, h), p in zip(self.bucket_shapes, self.gl_pairs,
                                                    strict=True))
        return (f"ParameterLayout(buckets=[{buckets}], diagonal={len(self._diagonal)}, "
                f"other={len(self._other)})")

