"""Find the symmetry groups hidden in a ``torch.nn.Module``.

Every self-attention head carries two ``GL(h)`` symmetries (see ``docs/attention.md``): the
query/key pair and the value/output pair. Writing a pair as factors ``G`` (``shape=[n, h]``) and
``H`` (``shape=[m, h]``), the network only sees ``G H^T``, so ``(G A^{-1}, H A^T)`` leaves it
unchanged.
For ``nn.Linear`` projections (``y = x W^T + b``) and ``rows_i`` the output features of head ``i``:

- QK: ``G = [q.weight[rows_i].T ; q.bias[rows_i]]``, ``H`` the same for ``k``;
- VO: ``G = [v.weight[rows_i].T ; v.bias[rows_i]]``, ``H = o.weight[:, rows_i]`` (output bias
  excluded).

With grouped-query attention one pair per key/value head stacks the blocks of its query heads
(``G`` of qk, ``H`` of vo); with rotary embeddings the qk group is the rotations' centraliser
``GL(1,C)^{r/2} x GL(h - r)`` (``docs/attention-variants.md``).

:func:`find_symmetries` walks a model, recognises the supported attention layouts and diagonal
``(u, v)`` parameterisations, and returns a :class:`SymmetryReport` that says which slice of
which parameter forms which factor. It never touches the model's tensors. Attention-like modules
it does not understand are listed in :attr:`SymmetryReport.unknown` (never silently treated as
plain), and their parameters fall back to the "other" (adaptive) geometry.

The code lives in one module per stage; this module re-exports their public names:

- :mod:`quotientsharp.models.report`: the data types (:class:`AttentionPair`,
  :class:`FactorSource`, :class:`PairGroup`, :class:`DiagonalPair`, :class:`AttentionModule`,
  :class:`SymmetryReport`);
- :mod:`quotientsharp.models.recognisers`: the per-architecture recognisers
  (``nn.MultiheadAttention``, HF BERT/ViT, generic ``q_proj/k_proj/v_proj`` with grouped-query
  attention, GPT-2, GPT-NeoX/BLOOM);
- :mod:`quotientsharp.models.conventions`: the modeling code's conventions (rotary layout and
  rotated dimensions, key/value head sharing), detected by probing its helpers;
- :mod:`quotientsharp.models.walker`: :func:`find_symmetries`, the walk over the model.
"""

from __future__ import annotations

from quotientsharp.models.recognisers import HEAD_COUNT_ATTRIBUTES
from quotientsharp.models.report import (
    PAIR_KINDS,
    AttentionModule,
    AttentionPair,
    DiagonalPair,
    FactorSource,
    PairGroup,
    SymmetryReport,
)
from quotientsharp.models.walker import find_symmetries

__all__ = [
    "HEAD_COUNT_ATTRIBUTES",
    "PAIR_KINDS",
    "AttentionModule",
    "AttentionPair",
    "DiagonalPair",
    "FactorSource",
    "PairGroup",
    "SymmetryReport",
    "find_symmetries",
]
