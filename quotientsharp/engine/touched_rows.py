"""The rows of embedding tables a batch touches: the ascent on those rows alone, same value.

Every other row has a zero gradient, and an ascent from ``xi = 0`` with a diagonal metric (or
the box's sign ascent, ``c * sign(0) = 0``) never moves it: solving on the touched rows visits
the same iterates (only the norms' summation order changes). The model gets a
:class:`TableLookup`: a zero-stride placeholder weight and a forward hook that replaces the
lookup, where the table is one plain ``nn.Embedding`` (:func:`embedding_tables`) used through
its lookups alone (:func:`graph_uses`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Tensors = tuple[torch.Tensor, ...]


def _ids(args: tuple, kwargs: dict) -> torch.Tensor:
    """The token ids an ``nn.Embedding`` call received, given positionally or as ``input=``."""
    return args[0] if args else kwargs["input"]


def embedding_tables(model: nn.Module, names: Sequence[str]) -> dict[str, nn.Embedding]:
    """The parameters among ``names`` that are the untied weight of one plain ``nn.Embedding``
    (its own ``forward``, no ``max_norm``, not ``sparse``)."""
    owners: dict[int, list[tuple[str, nn.Module]]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for local, parameter in module.named_parameters(recurse=False,
                                                        remove_duplicate=False):
            owners.setdefault(id(parameter), []).append(
                (f"{module_name}.{local}" if module_name else local, module))
    tables: dict[str, nn.Embedding] = {}
    wanted = set(names)
    for entries in owners.values():
        modules = {id(m) for _, m in entries}
        if len(modules) != 1:
            continue
        name, module = entries[0]
        if (name in wanted and all(n == name for n, _ in entries)
                and isinstance(module, nn.Embedding)
                and type(module).forward is nn.Embedding.forward
                and module.max_norm is None and not module.sparse
                and name.rsplit(".", 1)[-1] == "weight"):
            tables[name] = module
    return tables


def graph_uses(loss: torch.Tensor, tensor: torch.Tensor) -> list[str]:
    """The names of the autograd nodes of ``loss``'s graph that take ``tensor`` as an input."""
    if loss.grad_fn is None:
        return []
    # a node may have several outputs (a fused ``_foreach`` operation has one per tensor): the
    # edge names the output it takes
    target, output = tensor.grad_fn, tensor.output_nr
    uses: list[str] = []
    seen: set[Any] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for following, number in node.next_functions:
            if following is None:
                continue
            if (following is target and number == output if target is not None
                    else getattr(following, "variable", None) is tensor):
                uses.append(node.name())
            stack.append(following)
    return uses


@dataclass
class TableUse:
    """What one forward did with one embedding table: its lookups and its uses in the graph."""

    module: nn.Embedding
    lookups: list[torch.Tensor] = field(default_factory=list)
    uses: list[str] | None = None

    def rows(self) -> torch.Tensor | None:
        """The sorted distinct rows looked up, or ``None`` if the table is used in any other
        way (or not at all)."""
        if not self.lookups or self.uses is None:
            return None
        if self.uses != ["EmbeddingBackward0"] * len(self.lookups):
            return None
        # int64 rows whatever the ids' integer dtype: index_copy_ and index_select take int64
        # only, and int32 ids look up the same rows
        return torch.unique(torch.cat([ids.reshape(-1).long() for ids in self.lookups]))


class TableRecorder:
    """Records during one forward the token ids each table looks up and, by :meth:`observe`,
    its uses in the autograd graph."""

    def __init__(self, tables: Mapping[str, nn.Embedding]) -> None:
        self.tables = {name: TableUse(module) for name, module in tables.items()}

    @contextlib.contextmanager
    def recording(self) -> Iterator[TableRecorder]:
        handles = []
        try:
            for use in self.tables.values():
                def record(module: nn.Module, args: tuple, kwargs: dict,
                           use: TableUse = use) -> None:
                    use.lookups.append(_ids(args, kwargs).detach())
                handles.append(use.module.register_forward_pre_hook(record, with_kwargs=True))
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def observe(self, parameters: Mapping[str, torch.Tensor], loss: torch.Tensor) -> None:
        for name, use in self.tables.items():
            tensor = parameters.get(name)
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                use.uses = graph_uses(loss, tensor)

    def rows(self) -> dict[str, torch.Tensor]:
        """Per table that only its module's lookups use: the sorted distinct rows."""
        found = {name: use.rows() for name, use in self.tables.items()}
        return {name: rows for name, rows in found.items() if rows is not None}


@contextlib.contextmanager
def looked_up(lookups: Mapping[str, TableLookup],
              dtypes: Mapping[str, torch.dtype]) -> Iterator[None]:
    """Inside this block each module of ``lookups`` returns the lookup in its perturbed rows."""
    handles = []
    try:
        for name, lookup in lookups.items():
            def replace(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor,
                        lookup: TableLookup = lookup, dtype: torch.dtype = dtypes[name]
                        ) -> torch.Tensor:
                return lookup.output(_ids(args, kwargs), dtype)
            handles.append(lookup.table.module.register_forward_hook(replace, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class RestrictedTable:
    """One table of a restricted solve: its slot in the point, module and rows."""

    slot: int
    module: nn.Embedding
    rows: torch.Tensor
    remap: torch.Tensor
    padding: int | None
    shape: torch.Size

    @classmethod
    def of(cls, slot: int, module: nn.Embedding, rows: torch.Tensor,
           shape: torch.Size) -> RestrictedTable:
        remap = torch.full((module.num_embeddings,), -1, dtype=torch.int64, device=rows.device)
        remap[rows] = torch.arange(rows.numel(), device=rows.device)
        padding = None
        if module.padding_idx is not None:
            hits = (rows == module.padding_idx).nonzero().flatten().tolist()
            padding = hits[0] if hits else None
        return cls(slot, module, rows, remap, padding, shape)


@dataclass
class TableLookup:
    """The perturbed ``rows`` (``shape=[R, D]``) of one restricted ``table``, looked up in place
    of the table."""

    table: RestrictedTable
    rows: torch.Tensor

    def placeholder(self, dtype: torch.dtype) -> torch.Tensor:
        """A zero-stride stand-in of the table's shape for the module's own (discarded) lookup."""
        return torch.zeros((), dtype=dtype, device=self.rows.device).expand(self.table.shape)

    def output(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The module's output with the perturbed table: the rows at the remapped ids."""
        module = self.table.module
        return F.embedding(self.table.remap[ids], self.rows.to(dtype), self.table.padding, None,
                           module.norm_type, module.scale_grad_by_freq, False)


class TouchedRowCoordinates:
    """The layout's coordinates with each table's slot holding its rows (``shape=[R, D]``),
    handed to the model as a :class:`TableLookup`."""

    def __init__(self, coordinates: Any, tables: Mapping[str, RestrictedTable]) -> None:
        self.coordinates = coordinates
        self.tables = dict(tables)

    def updates(self, point: Sequence[torch.Tensor]) -> dict[str, Any]:
        point = list(point)
        rows = {}
        for name, table in self.tables.items():
            rows[name] = point[table.slot]
            # the layout checks shapes: it gets the table's shape, and passes it through
            point[table.slot] = torch.zeros((), dtype=rows[name].dtype,
                                            device=rows[name].device).expand(table.shape)
        updates = self.coordinates.updates(point)
        for name, table in self.tables.items():
            updates[name] = TableLookup(table, rows[name])
        return updates

    def restrict(self, vectors: Sequence[torch.Tensor]) -> Tensors:
        """A full-size tangent vector (zero off the rows, e.g. a gradient) cut to the rows."""
        vectors = list(vectors)
        for table in self.tables.values():
            vectors[table.slot] = vectors[table.slot].index_select(0, table.rows)
        return tuple(vectors)

    def expand(self, vectors: Sequence[torch.Tensor]) -> Tensors:
        """A restricted tangent vector back at full size (zero off the rows)."""
        vectors = list(vectors)
        for table in self.tables.values():
            rows = vectors[table.slot]
            full = rows.new_zeros(table.shape)
            full.index_copy_(0, table.rows, rows)
            vectors[table.slot] = full
        return tuple(vectors)
