"""Block-wise sharpness (``blockwise=True``): each :class:`Block` of the best perturbation
gets its norm share ``||xi_B||^2 / ||xi||^2`` (the metric is block-diagonal over the blocks)
and its loss change ``L(gamma_{xi_B}(1)) - L(theta)``. Also here: the :class:`Locality` of the
best perturbation, and :func:`plot_blocks` (matplotlib's Agg canvas, no global backend).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch

from quotientsharp.core.adaptive import AdaptivePoint
from quotientsharp.core.product import ProductPoint
from quotientsharp.core.validation import value_checks
from quotientsharp.engine.ball import BoxGeometry, GeodesicBall

Tensors = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Block:
    """One block of the perturbation: a part of the flat tangent tuple ``xi``.

    Attributes
    ----------
    name
        Readable name: the parameter's name, ``"{module} {kind} head {h}"`` for an attention
        pair, ``"diagonal {u} * {v}"`` for a diagonal pair, the binding's name.
    kind
        ``"parameter"`` (a parameter by name), ``"head"`` (an attention head pair),
        ``"diagonal"`` (a diagonal pair) or ``"binding"``.
    factor
        Index of the product factor that holds the block (``0`` for a box).
    tensors
        Positions of the block's tensors in the flat tuple ``xi``.
    index
        For a block that is one entry of the factor's folded leading dimension (a head of a
        bucket of heads, ``shape=[P, ...]``): that entry; ``None`` otherwise.
    span
        For a block that is a range of the last dimension (a diagonal pair inside the
        concatenated diagonal coordinates): ``(start, stop)``; ``None`` otherwise.
    """

    name: str
    kind: str
    factor: int
    tensors: tuple[int, ...]
    index: int | None = None
    span: tuple[int, int] | None = None


@dataclass
class BlockOutcome:
    """Block-wise analysis of one batch's best perturbation (device tensors until read).

    Attributes
    ----------
    blocks
        The blocks, in layout order.
    squared_norms
        ``shape=[K]``: ``||xi_B||^2`` of each block in the measure's metric.
    loss_changes
        ``shape=[K]``: ``L(only xi_B applied) - L(theta)``.
    """

    blocks: list[Block]
    squared_norms: torch.Tensor
    loss_changes: torch.Tensor

    def records(self) -> list[dict[str, Any]]:
        """Per block ``{"name", "kind", "norm_share", "loss_change"}`` as Python floats.

        The shares are the squared norms over their sum (all ``0`` when ``xi = 0``). A loss
        change that is not finite (the block's part alone overflowed the network) is ``None``.
        """
        squares = self.squared_norms.tolist()
        changes = [c if math.isfinite(c) else None for c in self.loss_changes.tolist()]
        total = sum(squares)
        return [{"name": block.name, "kind": block.kind,
                 "norm_share": square / total if total > 0 else 0.0, "loss_change": change}
                for block, square, change in zip(self.blocks, squares, changes, strict=True)]


def restrict(xi: Sequence[torch.Tensor], block: Block) -> Tensors:
    """``xi_B``: ``xi`` with every entry outside ``block`` set to zero (new tensors)."""
    parts: list[torch.Tensor] = []
    for position, tensor in enumerate(xi):
        if position not in block.tensors:
            parts.append(torch.zeros_like(tensor))
        elif block.index is None and block.span is None:
            parts.append(tensor.clone())
        else:
            part = torch.zeros_like(tensor)
            if block.index is not None:
                part[block.index] = tensor[block.index]
            elif block.span is not None:
                start, stop = block.span
                part[..., start:stop] = tensor[..., start:stop]
            parts.append(part)
    return tuple(parts)


def _factor_parts(geometry: GeodesicBall, xi: Tensors
                  ) -> tuple[list[Any], list[Tensors], list[int]]:
    """The frozen point, part of ``xi`` and first flat position of every factor of the
    geometry (a geometry that is not a product is one factor)."""
    frozen = geometry.frozen
    if not isinstance(frozen, ProductPoint):
        return [frozen], [xi], [0]
    parts = frozen.split(xi)
    offsets = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    return list(frozen.factors), parts, offsets


def block_squared_norms(geometry: GeodesicBall | BoxGeometry, blocks: Sequence[Block],
                        xi: Sequence[torch.Tensor]) -> torch.Tensor:
    """``||xi_B||^2`` of every block in the geometry's metric (a box's: ``||xi_B / c||_2^2``),
    ``shape=[K]``; exact, since every metric here is block-diagonal over the blocks."""
    xi = tuple(xi)
    squares: list[torch.Tensor] = []
    if isinstance(geometry, BoxGeometry):
        for block in blocks:
            terms = [(xi[i] * geometry._inv_scale[i]).square().sum() for i in block.tensors]
            squares.append(torch.stack(terms).sum())
        return torch.stack(squares)
    frozen, parts, offsets = _factor_parts(geometry, xi)
    per_entry: dict[int, torch.Tensor] = {}
    for block in blocks:
        factor = frozen[block.factor]
        part = parts[block.factor]
        local = [i - offsets[block.factor] for i in block.tensors]
        if block.index is not None and block.span is None and len(local) == len(part):
            if block.factor not in per_entry:
                # the factor's own norm, before its folded dimension is summed
                per_entry[block.factor] = factor.squared_norm(part)
            squares.append(per_entry[block.factor][block.index])
        elif (isinstance(factor, AdaptivePoint) and block.index is None and block.span is None
              and len(local) == 1):
            (j,) = local
            scaled = part[j] if factor.unit else part[j] * factor.inverse_scale[j]
            squares.append(scaled.square().sum())
        else:
            restricted = restrict(xi, block)[offsets[block.factor]:
                                             offsets[block.factor] + len(part)]
            squares.append(factor.squared_norm(restricted).sum())
    return torch.stack(squares)


def blockwise(loss_at: Callable[[Tensors], torch.Tensor], geometry: GeodesicBall | BoxGeometry,
              blocks: Sequence[Block], xi: Sequence[torch.Tensor],
              clean: torch.Tensor) -> BlockOutcome:
    """Norm shares and loss changes of every block of the best perturbation ``xi``.

    Parameters
    ----------
    loss_at
        ``point -> loss`` at a point of the geometry (mapped to parameters by the layout).
    geometry
        The ball (or box) of the ascent.
    blocks
        The layout's blocks (``coordinates.blocks()``).
    xi
        The best perturbation (a tangent vector of the geometry).
    clean
        ``L(theta)``, 0-dim.

    Returns
    -------
    BlockOutcome
        Reads the squared norms once (one host sync, after the ascent) to skip zero blocks.
    """
    blocks = list(blocks)
    squares = block_squared_norms(geometry, blocks, xi)
    changes = []
    with torch.no_grad():
        # one forward per block, one at a time; a block with a zero part changes nothing
        for block, square in zip(blocks, squares.tolist(), strict=True):
            if square > 0:
                changes.append(loss_at(geometry.point(restrict(xi, block))) - clean)
            else:
                changes.append(torch.zeros_like(clean))
    return BlockOutcome(blocks, squares, torch.stack(changes))


#: A ball is *local* at its best perturbation when no weight moves by more than its own norm
#: and, on every curved symmetry factor, the path's second-order term is at most half its
#: first-order term (``docs/sharpness.md``, "Locality"). A weight is judged in the terms its
#: ball measures it in: a symmetry factor as a whole (a bias row of a head with its weights) in
#: its metric, another tensor on its own, and under an absolute ball (worst case) the parameters
#: together.
LOCAL_DISPLACEMENT = 1.0
LOCAL_SECOND_ORDER = 0.5
#: An order-2 value is the loss rise of a geodesic ball when the exact geodesic through the
#: best perturbation raises the loss by the value to 1 % (the reach target's tolerance), plus
#: the rounding of the losses (:func:`path_check`).
LOCAL_PATH = 0.01
#: Units in the last place of a loss that bound the rounding of a difference of a forward's
#: losses (:func:`loss_rounding`): a float32 forward's loss differs from the float64 one's by a
#: few units, and the difference of two of them by tens of units where they nearly cancel.
ROUNDING_ULPS = 64


def loss_rounding(losses: Sequence[float], forward_dtype: torch.dtype) -> float:
    """The rounding of a difference of the forward's losses ``losses`` (the value, the exact
    path's rise): :data:`ROUNDING_ULPS` units in the last place of the largest of them in
    ``forward_dtype``, the coarsest dtype of the forward."""
    return ROUNDING_ULPS * torch.finfo(forward_dtype).eps * max(abs(loss) for loss in losses)


#: RK4 steps of the exact geodesic in :func:`path_check`. Its error is of order ``h^4``: where
#: the share is within 2 % of 1 it is within 1e-4 of the converged integration's
#: (``tests/test_path_check.py``); a quarter of the default ``exact_steps``, since each step
#: costs four Christoffel contractions of every factor.
PATH_CHECK_STEPS = 4
#: The ``parameter`` of a displacement measured over every parameter together.
TOGETHER = "all parameters together"


@dataclass(frozen=True)
class Locality:
    """How far the best perturbation of one batch moved the model (``docs/sharpness.md``,
    "Locality"): the largest ``||theta'_t - theta_t|| / ||theta_t||`` over the tensors outside
    the symmetry factors (``displacement`` of ``parameter``; :data:`TOGETHER` for an absolute
    ball), the largest ``||x'_f - x_f||_g / ||x_f||_g`` over the factors' entries
    (``factor_displacement`` of ``factor``) and ``||Gamma(xi, xi) / 2||_g / ||xi||_g`` over the
    curved factors' (``second_order`` of ``second_order_factor``), both in the factor's metric
    at theta, one tensor at a time (:func:`_metric_ratios`); ``None`` where there is no
    such factor, or with a name where the ratio is not finite (for ``displacement``, not even in
    float64): not local. For an order-2 geodesic ball, ``path_share`` is the loss rise along
    the exact geodesic through the same ``xi`` over the value, and ``path_agrees`` whether the
    two agree to :data:`LOCAL_PATH` (:func:`path_check`; ``None``: not checked)."""

    displacement: float | None
    parameter: str | None
    factor_displacement: float | None = None
    factor: str | None = None
    second_order: float | None = None
    second_order_factor: str | None = None
    path_share: float | None = None
    path_agrees: bool | None = None

    @property
    def within_bounds(self) -> bool:
        """Whether no weight moved by more than its size (:data:`LOCAL_DISPLACEMENT`) and no
        second-order term exceeds its bound (:data:`LOCAL_SECOND_ORDER`)."""
        return (_within(self.displacement, self.parameter, LOCAL_DISPLACEMENT)
                and _within(self.factor_displacement, self.factor, LOCAL_DISPLACEMENT)
                and _within(self.second_order, self.second_order_factor, LOCAL_SECOND_ORDER))

    @property
    def local(self) -> bool:
        """Whether the ball is local here (:attr:`within_bounds`) and an order-2 path follows
        its geodesic (:data:`LOCAL_PATH`)."""
        return self.within_bounds and self.path_agrees is not False

    @classmethod
    def from_dict(cls, where: Mapping[str, Any]) -> Locality:
        """The figures of :meth:`as_dict` (``local`` is derived; a dict made before a figure
        existed takes its default)."""
        return cls(**{f.name: where[f.name] for f in fields(cls) if f.name in where})

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "local": self.local}


def _within(ratio: float | None, label: str | None, bound: float) -> bool:
    """A ratio within its bound; ``None`` with a label (a ratio that is not finite) is not,
    ``None`` without one (nothing to measure) is."""
    return ratio <= bound if ratio is not None else label is None


def _entry_ratios(top: Sequence[torch.Tensor], bottom: Sequence[torch.Tensor],
                  ndims: Sequence[int], scale_free: bool = False) -> torch.Tensor:
    """Per tensor and folded entry, ``||top|| / ||bottom||`` over the point's own dimensions
    (entries with ``bottom = 0``: :func:`_ratio`; ``0`` with ``scale_free``),
    ``shape=[tensors, entries]``; where a norm overflows the tensors' dtype, the ratio is taken
    in float64 (one host sync)."""
    rows = []
    for a, b, k in zip(top, bottom, ndims, strict=True):
        dims = tuple(range(a.dim() - k, a.dim()))
        num = torch.linalg.vector_norm(a, dim=dims).reshape(-1)
        den = torch.linalg.vector_norm(b, dim=dims).reshape(-1)
        rows.append(_ratio(num, den, 0.0 if scale_free else math.inf))
    width = max(r.numel() for r in rows)
    table = torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows])
    finite = torch.isfinite(table)
    if table.dtype == torch.float64 or bool(finite.all()):
        return table
    wide = _entry_ratios([t.double() for t in top], [t.double() for t in bottom], ndims,
                         scale_free)
    return torch.where(finite, table.double(), wide)


#: How ``local`` is judged, recorded in the page data of the studies that report it: the
#: factors as wholes, read in their metric, and an order-2 value checked against the exact
#: geodesic (``"metric, exact path"``, since the second run of 2026-12-07); before, without the
#: check (``"metric"``, 2026-12-07), in Frobenius norms (``"factors"``, 2026-12-06) or every
#: tensor on its own (no rule recorded).
LOCALITY_RULE = "metric, exact path"


def _metric_ratios(factor: Any, top: Tensors, bottom: Tensors) -> torch.Tensor:
    """Per tensor ``j`` of a factor and per folded entry, the factor's metric norm of ``top``'s
    tensor ``j`` alone (the others zero) over that of ``bottom``'s (``0`` where that is ``0``),
    ``shape=[tensors, entries]``.

    Read in the metric at the frozen point, both norms are unchanged by the group wherever the
    metric is invariant (the point, a path and its second-order term move covariantly), so
    ``local`` does not depend on which point of the orbit the model holds; Frobenius norms of the
    factors do (a group element rescales the factors). Under mix the
    ratio of ``G`` is ``||dG H^T|| / ||G H^T||`` (the product's relative change from ``G``'s
    move), under inv ``||dG S_G^{-1/2}|| / ||G S_G^{-1/2}||`` (each direction relative to ``G``'s
    own singular value), under the Euclidean metric the Frobenius ratio (a norm ``0`` at the
    point: :func:`_ratio`).
    """
    rows = []
    for j in range(len(top)):
        alone = [tuple(t if i == j else torch.zeros_like(t) for i, t in enumerate(pair))
                 for pair in (top, bottom)]
        num, den = (factor.norm(part).reshape(-1) for part in alone)
        rows.append(_ratio(num, den))
    return torch.stack(rows)


def _ratio(num: torch.Tensor, den: torch.Tensor, from_zero: float = math.inf) -> torch.Tensor:
    """``num / den`` per entry (``shape=[entries]``): ``0`` where both are ``0`` (an entry of
    norm 0 that did not move, as the adaptive ball keeps every zero weight), ``from_zero`` where
    only ``den`` is: by default ``inf`` (an entry of norm 0 that moved has moved by more than any
    multiple of its norm: a zero bias under ``other_metric="euclidean"``), which
    :class:`Locality` reports as a ratio that is not finite. A NaN ``num`` or ``den`` stays
    NaN (a comparison with it is false, which would otherwise read it as 0: local)."""
    zero_norm = torch.where(num == 0, torch.zeros_like(num), torch.full_like(num, from_zero))
    ratio = torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), zero_norm)
    return torch.where(num.isnan() | den.isnan(), torch.full_like(ratio, math.nan), ratio)


def _worst(ratios: list[tuple[torch.Tensor, list[str]]]) -> tuple[float | None, str | None]:
    """The largest entry of several ``[tensors, entries]`` ratio tables and its label; the
    first entry that is not finite (``None`` and its label: see :class:`Locality`) before any
    finite one."""
    best: tuple[float | None, str | None] = (None, None)
    for table, labels in ratios:
        flat = table.reshape(-1)
        bad = (~torch.isfinite(flat)).nonzero()
        if bad.numel():
            return None, labels[int(bad[0, 0]) % table.shape[1]]
        value, index = flat.max(0)
        if best[0] is None or float(value) > best[0]:
            best = (float(value), labels[int(index) % table.shape[1]])
    return best


def locality(geometry: GeodesicBall | BoxGeometry, coordinates: Any, blocks: Sequence[Block],
             theta: dict[str, torch.Tensor], xi: Sequence[torch.Tensor],
             absolute: bool = False, path: Mapping[str, Any] | None = None) -> Locality:
    """The :class:`Locality` of the best perturbation ``xi``: one path evaluation and, for
    curved factors, one Christoffel contraction (no forward); ``theta`` in the geometry's dtype.
    ``absolute``: the ball bounds the perturbation itself, not relative to the weights (worst
    case), so its displacement is that of every parameter together. ``path``: the figures of
    :func:`path_check`, where it was made."""
    xi = tuple(xi)
    with torch.no_grad():
        point = geometry.point(xi)
        moved = coordinates.updates(point)
        factors: dict[str, Any] = {}
        if isinstance(geometry, GeodesicBall):
            factors = _factor_locality(geometry, blocks, xi, point)
        # the tensors of symmetry factors are judged as parts of their factor
        outside = (set(getattr(coordinates, "other_names", moved))
                   if factors.get("factor_displacement") is not None else set(moved))
        names = [name for name in moved if name in outside]
        tops = [(moved[name] - theta[name]).reshape(-1) for name in names]
        bottoms = [theta[name].reshape(-1) for name in names]
        if absolute and names:
            tops, bottoms, names = [torch.cat(tops)], [torch.cat(bottoms)], [TOGETHER]
        result: dict[str, Any] = {"displacement": 0.0, "parameter": None, **factors,
                                  **(path or {})}
        if names:
            # a model whose parameters are all 0 gives the absolute ball no size to be judged
            # against: its displacement stays 0, as it always was
            table = _entry_ratios(tops, bottoms, [1] * len(tops),
                                  scale_free=absolute).reshape(1, -1)
            result["displacement"], result["parameter"] = _worst([(table, names)])
    return Locality(**result)


def path_check(geometry: GeodesicBall | BoxGeometry, xi: Sequence[torch.Tensor],
               loss_at: Callable[[Tensors], torch.Tensor], clean: torch.Tensor,
               perturbed: torch.Tensor, forward_dtype: torch.dtype) -> dict[str, Any]:
    """Whether the order-2 value is the loss rise of the geodesic it approximates.

    One forward, at the exact geodesic through the best perturbation ``xi``
    (:meth:`~.ball.GeodesicBall.exact_point`: a closed form, or RK4 of
    :data:`PATH_CHECK_STEPS` steps, with the checks on values on; no backward): ``path_share``
    is its loss rise over the value ``perturbed - clean``, and ``path_agrees`` whether the two
    rises differ by at most :data:`LOCAL_PATH` of the value plus the losses' rounding
    (:func:`loss_rounding` in ``forward_dtype``). ``path_agrees`` is ``None`` where that
    rounding alone exceeds :data:`LOCAL_PATH` of the value (the losses cannot tell), ``False``
    with no share where the geodesic leaves the points where the metric is defined before
    ``t = 1`` or its loss is not finite. Empty (not checked) for a ball without an order-2
    path, or a value that is not a finite rise (the reach estimate reports that one)."""
    value = float(perturbed.double() - clean.double())
    if (not isinstance(geometry, GeodesicBall) or not geometry.extrapolates
            or not 0 < value < math.inf):
        return {}
    try:
        # the checks on values make a factor whose Gram matrix goes singular on the way raise,
        # where the ascent's unchecked path would go on with NaN or garbage
        with torch.no_grad(), value_checks(True):
            loss = loss_at(geometry.exact_point(xi, PATH_CHECK_STEPS))
    except ValueError:
        return {"path_share": None, "path_agrees": False}
    exact = float(loss.double())
    if not math.isfinite(exact):
        return {"path_share": None, "path_agrees": False}
    rounding = loss_rounding([float(clean), float(perturbed), exact], forward_dtype)
    rise = exact - float(clean.double())
    agrees = (None if rounding >= LOCAL_PATH * value
              else abs(rise - value) <= LOCAL_PATH * value + rounding)
    return {"path_share": rise / value, "path_agrees": agrees}


def _factor_locality(geometry: GeodesicBall, blocks: Sequence[Block], xi: Tensors,
                     point: Tensors) -> dict[str, Any]:
    """Displacement and second-order ratio of the symmetry factors (not the adaptive one)."""
    frozen, parts, _ = _factor_parts(geometry, xi)
    moved = _factor_parts(geometry, point)[1]
    orders = (list(geometry.order) if isinstance(geometry.order, (list, tuple))
              else [geometry.order] * len(frozen))
    displaced, curved = [], []
    for f, (factor, part, new) in enumerate(zip(frozen, parts, moved, strict=True)):
        if isinstance(factor, AdaptivePoint):
            continue
        ndims = factor.point_ndims
        entries = math.prod(factor.x[0].shape[:factor.x[0].dim() - ndims[0]])
        # a head of a bucket is a block with an index; a binding or the diagonal pairs are one
        named = {b.index: b.name for b in blocks if b.factor == f}
        whole = named.get(None, next(iter(named.values()), f"factor {f}"))
        labels = [named.get(i, whole) for i in range(entries)]
        moves = tuple(n - b for n, b in zip(new, factor.x, strict=True))
        displaced.append((_metric_ratios(factor, moves, factor.x), labels))
        if orders[f] != 1:
            half = tuple(0.5 * g for g in factor.christoffel(part))
            curved.append((_metric_ratios(factor, half, part), labels))
    value, label = _worst(displaced)
    second, second_label = _worst(curved)
    return {"factor_displacement": value, "factor": label, "second_order": second,
            "second_order_factor": second_label}


#: Bar colour per block kind.
BLOCK_COLOURS = {"head": "#1f77b4", "diagonal": "#2ca02c", "binding": "#9467bd",
                 "parameter": "#7f7f7f"}


class BlockwiseResult(Protocol):
    """What :func:`plot_blocks` reads of a :class:`~quotientsharp.engine.SharpnessResult` (a
    protocol: that class's module imports this one)."""

    measure: str
    settings: dict[str, Any]

    @property
    def variant(self) -> str: ...
    def block_summary(self) -> list[dict[str, Any]]: ...


def _label(result: BlockwiseResult) -> str:
    variant = f" ({result.variant})" if result.variant else ""
    return f"{result.measure.replace('_', '-')} sharpness{variant}, rho = {result.settings['rho']}"


def plot_blocks(results: BlockwiseResult | Sequence[BlockwiseResult]
                | Mapping[str, BlockwiseResult], path: str | Path, top: int = 30,
                dpi: int = 120) -> Path:
    """Write a bar chart of the loss change per block to ``path`` (PNG, or any format
    matplotlib infers from the suffix).

    Parameters
    ----------
    results
        A result measured with ``blockwise=True``, a sequence of them, or a mapping
        ``title -> result``: one panel per result, stacked. Without titles a panel is titled
        with the measure, its variant and ``rho``.
    path
        Output file; its folder is created.
    top
        Blocks per panel: the ``top`` largest loss changes (by absolute value); the title says
        how many were left out.
    dpi
        Resolution.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        If a result has no block-wise data, or ``top < 1``.
    ImportError
        If matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as err:       # pragma: no cover - matplotlib is a test dependency
        raise ImportError("plot_blocks needs matplotlib: pip install 'quotientsharp[plot]'"
                          ) from err
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an integer >= 1, got {top!r}")
    panels: list[tuple[str, list[dict[str, Any]]]] = []
    if isinstance(results, Mapping):
        items = list(results.items())
    elif isinstance(results, Sequence):
        items = [("", result) for result in results]
    else:
        items = [("", results)]
    if not items:
        raise ValueError("results: nothing to plot")
    for title, result in items:
        summary = result.block_summary()
        if not summary:
            raise ValueError(f"results: {title or result.measure} has no block-wise data; "
                             "measure it with blockwise=True")
        panels.append((title or _label(result), summary))

    # a block whose loss change is not finite has no bar (``None``)
    shown = [sorted((r for r in s if r["loss_change"] is not None),
                    key=lambda r: abs(r["loss_change"]), reverse=True)[:top]
             for _, s in panels]
    heights = [0.28 * len(rows) + 1.2 for rows in shown]
    figure = Figure(figsize=(8.5, sum(heights)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for axis, (title, summary), rows in zip(axes, panels, shown, strict=True):
        rows = rows[::-1]              # largest at the top
        positions = list(range(len(rows)))
        values = [r["loss_change"] for r in rows]
        axis.barh(positions, values, color=[BLOCK_COLOURS.get(r["kind"], "#7f7f7f")
                                            for r in rows])
        axis.set_yticks(positions, [r["name"] for r in rows], fontsize=7)
        axis.axvline(0.0, color="black", linewidth=0.6)
        for position, record in zip(positions, rows, strict=True):
            axis.annotate(f" {100 * record['norm_share']:.1f}%", (record["loss_change"], position),
                          va="center", ha="left" if record["loss_change"] >= 0 else "right",
                          fontsize=6, color="#444444")
        left_out = len(summary) - len(rows)
        more = f" ({left_out} smaller blocks not shown)" if left_out else ""
        axis.set_title(f"{title}{more}", fontsize=9)
        axis.set_xlabel("loss change with only this block's part of the best perturbation "
                        "(mean over batches); label: norm share", fontsize=8)
        axis.margins(x=0.15)
        kinds = [k for k in BLOCK_COLOURS if any(r["kind"] == k for r in rows)]
        axis.legend(handles=[Patch(color=BLOCK_COLOURS[k], label=k) for k in kinds],
                    fontsize=7, loc="lower right")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path
