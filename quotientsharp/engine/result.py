"""Result stage: :class:`SharpnessResult` and its assembly from the per-batch outcomes.

It touches the measure's :class:`~.measures.BatchOutcome` list and the resolved options only
(no model, no geometry, no solver); every tensor is read to the host here, once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from quotientsharp.core.validation import warn_at_caller
from quotientsharp.engine.blocks import (
    LOCAL_DISPLACEMENT,
    LOCAL_PATH,
    LOCAL_SECOND_ORDER,
    TOGETHER,
    Locality,
)
from quotientsharp.engine.measures import BatchOutcome, excess
from quotientsharp.engine.solver import best_chain, reach_estimate

#: The reach below which a value is reported as short of its maximum (the search's default
#: target, :class:`~.solver.SearchSettings`).
REACH_TARGET = 0.99


#: What else keeps a ball local, by measure (the warning's advice).
_LOCAL_ADVICE = {"geodesic": "use order='exact' (no extrapolation) or the inv metric, or ",
                 "worst_case": "measure adaptive sharpness (its ball moves every weight in "
                               "proportion to its size), or "}


class ReachWarning(UserWarning):
    """A sharpness value may be short of its maximum, or its ball is not local.

    Raised (as a warning) by :func:`~quotientsharp.sharpness` once per call, naming the batches
    whose reach estimate is below 0.99, whose best perturbation is not local, or whose value is
    not resolved to 1 % by its losses' rounding (``docs/sharpness.md``, "Reach and locality"),
    and what to do. Filter it with
    ``warnings.filterwarnings("ignore", category=quotientsharp.ReachWarning)``.
    """


@dataclass
class SharpnessResult:
    """What :func:`sharpness` measured.

    Attributes
    ----------
    measure
        The measure's name.
    value
        Mean over batches of the per-batch sharpness.
    per_batch
        Sharpness of each batch (best perturbed loss minus clean loss for ascent measures,
        the mean perturbed loss minus the clean loss for ``average``: the difference taken in
        float64, so that it equals ``perturbed_losses[b] - clean_losses[b]`` exactly).
    settings
        Every resolved option (defaults filled in), plus ``rho``, the geometry dtype, the
        solver checkpoints, the number of batches and the symmetry summary.
    perturbation_norms
        Per batch, the norms of the best perturbation: ``"total"`` (the constraint's norm) and,
        for geodesic sharpness, one entry per block kind (``"gl"``, ``"diagonal"``, ``"other"``).
    clean_losses, perturbed_losses
        Per batch, ``L(theta)`` and the (best or mean) perturbed loss.
    excluded
        Parameters left out of the perturbation because they receive no gradient.
    perturbations
        With ``keep_perturbations=True``: per batch, the parameter-space displacement of the
        best perturbation by parameter name (geometry dtype; ``None`` for relative flatness,
        which perturbs nothing); otherwise ``None``.
    frozen
        Parameters with ``requires_grad=False``: never perturbed (they keep their values, as in
        training), so they are outside every measure.
    nonfinite_evaluations
        Per batch, the perturbed evaluations whose loss was NaN or inf. Always zero with
        ``nonfinite="raise"`` (the default), which raises on the first one; with
        ``nonfinite="skip"`` they were left out (never the best iterate, not in the mean; the
        reference solve's included).
    traces
        Ascent measures: per batch, the solver's convergence trace, the best perturbed loss
        minus the clean loss after each evaluation (``runs * (n_iter + 1)`` entries, run after
        run, the first the starting point): non-decreasing, its last entry is that batch's
        value. ``None`` before the first finite evaluation (a random start whose loss was not
        finite, under ``nonfinite="skip"``). Empty for the other measures.
    reference_per_batch, reference_traces
        With ``reference_solve``: per batch, the value the stronger reference solve reached
        (best perturbed loss minus clean loss) and its trace. Empty otherwise.
    blocks
        With ``blockwise=True``: per batch, one dict per block of the best perturbation,
        ``{"name", "kind", "norm_share", "loss_change"}`` (``docs/sharpness.md``); ``None``
        otherwise.
    reach
        Ascent measures: per batch, the estimate of the share of the maximum the value
        reached (``docs/sharpness.md``, "Reach"): the second-best chain of the search over the
        best; ``None`` with ``reach=False``. Empty for the other measures.
    chains
        Ascent measures with the search: per batch, the value each chain reached, in order
        (the first from the measurement's own start); ``None`` for a chain none of whose
        evaluations was finite (``nonfinite="skip"``), which the reach estimate does not count.
    chain_shortfalls
        Ascent measures with the search: per batch and chain, the share of the chain's value
        that its last run added when the chain was still climbing as its continuations ran out
        (``0`` where it stalled); the reach estimate is at most ``1 -`` the best chain's.
        Empty in results made before it was kept.
    evaluations
        Ascent measures: per batch, the loss evaluations (forward+backward passes) spent,
        reference solve excluded: the cost of the value. With ``random_init=True`` the clean
        loss at ``theta`` is one more pass, not counted here (a forward; on the first batch
        the setup's forward+backward, which ``random_init=False`` reuses as its first). The
        exact-path check of an order-2 geodesic value (``locality``) is one forward more.
    locality
        Ascent measures: per batch, :class:`~quotientsharp.engine.blocks.Locality` of the best
        perturbation as a dict (``displacement``, ``parameter``, ``factor_displacement``,
        ``factor``, ``second_order``, ``second_order_factor``, ``path_share``,
        ``path_agrees``, ``local``). For an order-2 geodesic value, ``path_share`` is the
        loss rise along the exact geodesic through the same perturbation over the value (one
        forward more per batch, not counted in ``evaluations``).
    rounding
        Ascent and average measures: per batch, a bound of the value's rounding: 64 units in
        the last place of the larger of its two losses (average: the clean loss and the draws'
        mean) in the forward's coarsest dtype
        (:func:`~quotientsharp.engine.blocks.loss_rounding`). Where it exceeds 1 % of the
        value (average: of its draws' mean ``|loss change|``, ``draw_rises``), the value is not
        resolved to 1 % and is reported as a shortfall.
    draw_rises
        Average sharpness: per batch, the mean over its draws of ``|L(theta + delta) -
        L(theta)|``, the scale its rounding is judged against (the value, their mean, may be
        near zero by chance, which no finer dtype changes).
    """

    measure: str
    value: float
    per_batch: list[float]
    settings: dict[str, Any]
    perturbation_norms: list[dict[str, float]]
    clean_losses: list[float] = field(default_factory=list)
    perturbed_losses: list[float] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    perturbations: list[dict[str, torch.Tensor]] | None = None
    frozen: list[str] = field(default_factory=list)
    nonfinite_evaluations: list[int] = field(default_factory=list)
    traces: list[list[float | None]] = field(default_factory=list)
    reference_per_batch: list[float] = field(default_factory=list)
    reference_traces: list[list[float | None]] = field(default_factory=list)
    blocks: list[list[dict[str, Any]]] | None = None
    reach: list[float | None] = field(default_factory=list)
    chains: list[list[float | None]] = field(default_factory=list)
    evaluations: list[int] = field(default_factory=list)
    locality: list[dict[str, Any]] = field(default_factory=list)
    chain_shortfalls: list[list[float]] = field(default_factory=list)
    rounding: list[float] = field(default_factory=list)
    draw_rises: list[float] = field(default_factory=list)

    def __float__(self) -> float:
        return self.value

    @property
    def min_reach(self) -> float | None:
        """The lowest reach estimate over the batches; ``None`` without estimates."""
        known = [r for r in self.reach if r is not None]
        return min(known) if known else None

    @property
    def local(self) -> bool | None:
        """Whether every batch's best perturbation is local; ``None`` without locality."""
        return all(x["local"] for x in self.locality) if self.locality else None

    def shortfalls(self) -> list[str]:
        """Per batch that falls short, why: a value not resolved to 1 % by its losses'
        rounding, a reach estimate below 0.99 (chains that disagree, or a best chain still
        climbing when its continuations ran out) or a ball that is not local at the best
        perturbation (empty when the value earns the word maximum)."""
        unresolved = self._unresolved()
        notes = [self._rounding_note(index, self.rounding[index]) for index in unresolved]
        for index, reach in enumerate(self.reach):
            if reach is None or reach >= REACH_TARGET or index in unresolved:
                continue
            chains = self.chains[index] if index < len(self.chains) else []
            found = ", ".join("none finite" if c is None else f"{c:.4g}" for c in chains)
            valued = [c for c in chains if c is not None]
            if valued and max(valued) <= 0:
                notes.append(f"batch {index}: no chain found a loss increase (the search's "
                             f"chains reached {found}): either theta is a maximum in the "
                             "ball, or every step the solver took was too long; check with "
                             "reference_solve=True, a smaller rho or more steps")
                continue
            notes.append(f"batch {index}: reach estimate {reach_text(reach)} (the search's chains "
                         f"reached {found}: {self._short_because(index)})")
        notes += [f"batch {index}: {_not_local(where, self.settings.get('rho'))}"
                  for index, where in enumerate(self.locality) if not where["local"]]
        return notes

    def searched_short(self) -> bool:
        """Whether a batch's reach estimate is below 0.99 for want of search (its chains
        disagree, or its best chain still climbed), not for a value within its rounding: the
        case that searching longer helps."""
        unresolved = self._unresolved()
        return any(reach is not None and reach < REACH_TARGET and index not in unresolved
                   for index, reach in enumerate(self.reach))

    def _unresolved(self) -> list[int]:
        """The batches whose value (average: whose draws' loss changes) is within its losses'
        rounding to 1 %."""
        return [index for index, rounding in enumerate(self.rounding)
                if rounding > LOCAL_PATH * self._resolved_scale(index)]

    def _resolved_scale(self, index: int) -> float:
        """What batch ``index``'s rounding is judged against: its value, or (average) its
        draws' mean ``|loss change|``."""
        return self.draw_rises[index] if self.draw_rises else abs(self.per_batch[index])

    def _rounding_note(self, index: int, rounding: float) -> str:
        """Batch ``index``'s value (average: its draws' loss changes) is within its losses'
        rounding to 1 % (its chains' agreement then says nothing either)."""
        value, scale = self.per_batch[index], self._resolved_scale(index)
        share = f"{100 * rounding / scale:.3g} % of it" if scale else "more than it"
        what, judged = ((f"the value {value:.4g}", "neither the value nor its reach") if
                        not self.draw_rises else
                        (f"the value {value:.4g}, whose draws change the loss by {scale:.3g} "
                         "on average,", "the draws' changes, nor their mean"))
        return (f"batch {index}: {what} is not resolved to 1 %: the bound on the rounding of "
                f"its losses in the forward's dtype (64 units in the last place of the larger) "
                f"is {rounding:.3g}, {share}, so {judged} can be judged to 1 %; measure the "
                "model in a finer dtype (float64) or at a larger rho")

    def _short_because(self, index: int) -> str:
        """Why batch ``index``'s reach estimate is low: the estimate is the lower of the chains'
        agreement and one minus the best chain's shortfall; each that is below 0.99 is said."""
        chains = self.chains[index]
        reasons = []
        agreement = reach_estimate(chains)
        if agreement < REACH_TARGET:
            valued = sum(c is not None for c in chains)
            reasons.append("no other chain with a finite value confirms the best" if valued < 2
                           else "the chains disagree: the second best reached "
                           f"{reach_text(agreement)} of the best")
        best = best_chain(chains)
        shortfalls = self.chain_shortfalls[index] if index < len(self.chain_shortfalls) else []
        if best is not None and best < len(shortfalls) and 1 - shortfalls[best] < REACH_TARGET:
            reasons.append(f"the best chain (chain {best}) was still climbing when its "
                           f"continuations ran out: its last run added "
                           f"{100 * shortfalls[best]:.3g} % of its value")
        return "; ".join(reasons) or "the best was not confirmed"

    @property
    def reference_value(self) -> float | None:
        """Mean over batches of the reference solve's values; ``None`` without one."""
        if not self.reference_per_batch:
            return None
        return sum(self.reference_per_batch) / len(self.reference_per_batch)

    @property
    def gap_per_batch(self) -> list[float]:
        """Per batch, ``reference - value``: how much more the reference solve found (negative
        where it found less). Empty without a reference solve."""
        return [r - v for r, v in zip(self.reference_per_batch, self.per_batch, strict=True)]

    @property
    def relative_gap_per_batch(self) -> list[float]:
        """Per batch, ``(reference - value) / |reference|`` (``0`` where both are ``0``)."""
        return [_relative(r - v, r) for r, v in zip(self.reference_per_batch, self.per_batch,
                                                     strict=True)]

    @property
    def gap(self) -> float | None:
        """``reference_value - value``; ``None`` without a reference solve."""
        reference = self.reference_value
        return None if reference is None else reference - self.value

    @property
    def relative_gap(self) -> float | None:
        """``gap / |reference_value|``; ``None`` without a reference solve."""
        reference, gap = self.reference_value, self.gap
        return None if reference is None or gap is None else _relative(gap, reference)

    def block_summary(self) -> list[dict[str, Any]]:
        """Per block, ``{"name", "kind", "norm_share", "loss_change"}`` averaged over the
        batches (in layout order; a loss change over the batches where it is finite, ``None``
        where it is nowhere); empty without ``blockwise=True``."""
        if not self.blocks:
            return []
        summary = []
        for records in zip(*self.blocks, strict=True):
            changes = [r["loss_change"] for r in records if r["loss_change"] is not None]
            summary.append({**records[0],
                            "norm_share": sum(r["norm_share"] for r in records) / len(records),
                            "loss_change": sum(changes) / len(changes) if changes else None})
        return summary

    @property
    def variant(self) -> str:
        """The settings that tell this measure's variants apart: ``"metric mix, order 2"``
        for geodesic sharpness, ``"p=inf"`` for a box, ``""`` otherwise."""
        settings = self.settings
        if self.measure == "geodesic":
            return f"metric {settings.get('metric')}, order {settings.get('order')}"
        if self.measure in ("worst_case", "adaptive") and settings.get("p") == "inf":
            return "p=inf"
        if self.measure == "relative_flatness" and settings.get("layer"):
            return f"layer {settings['layer']}"
        return ""

    def summary(self) -> str:
        """One readable line: measure (with metric and order for geodesic), value, batches, rho."""
        variant = f" ({self.variant})" if self.variant else ""
        skipped = sum(self.nonfinite_evaluations)
        note = f", {skipped} non-finite evaluation(s) skipped" if skipped else ""
        gap, relative = self.gap, self.relative_gap
        if gap is not None and relative is not None:
            note += (f", reference solve {self.reference_value:.6g}: gap {gap:.3g} "
                     f"({100 * relative:.3g}%)")
        unresolved = self._unresolved()
        if unresolved:
            # the reach of a value within its rounding says nothing (shortfalls() says so)
            note += f", {len(unresolved)} value(s) within the rounding of their losses"
        elif self.min_reach is not None:
            note += f", reach >= {reach_text(self.min_reach)}"
        if self.local is False:
            note += ", ball not local"
        return (f"{self.measure} sharpness{variant} {self.value:.6g} over "
                f"{len(self.per_batch)} batch(es) (rho={self.settings.get('rho')}{note})")


def reach_text(reach: float) -> str:
    """A reach estimate in ``[0, 1]`` with three decimals, cut rather than rounded: it is a lower
    bound, so it prints no higher than it is (``0.99996`` is ``0.999``, not ``1.000``, and
    ``0.9896``, below :data:`REACH_TARGET`, is ``0.989``, not ``0.990``)."""
    # twelve decimals first, so that a share such as 0.29 (0.28999... in binary) stays 0.290
    return f"{reach:.12f}"[:-9]


def _relative(gap: float, reference: float) -> float:
    """``gap / |reference|``; ``0`` for a zero gap, ``inf`` (signed) for a zero reference."""
    if gap == 0:
        return 0.0
    if reference == 0:
        return math.copysign(math.inf, gap)
    return gap / abs(reference)


def assemble_result(measure: str, outcomes: Sequence[BatchOutcome],
                    settings: dict[str, Any], excluded: Sequence[str], frozen: Sequence[str],
                    keep: bool, blockwise: bool) -> SharpnessResult:
    """The :class:`SharpnessResult` of ``outcomes`` (one per batch, in order); warns about
    skipped non-finite evaluations and values short of their maximum."""
    skipped = [o.nonfinite for o in outcomes]
    if sum(skipped):
        warn_at_caller(f"{sum(skipped)} perturbed evaluation(s) with a NaN or inf loss were "
                       f"skipped (nonfinite='skip'; per batch: {skipped}): the values are the "
                       "best over the finite evaluations only", UserWarning)
    values = torch.stack([o.value for o in outcomes]).tolist()
    ascent = any(o.trace is not None for o in outcomes)
    result = SharpnessResult(
        measure=measure,
        value=sum(values) / len(values),
        per_batch=values,
        settings=settings,
        perturbation_norms=[{k: float(v) for k, v in o.norms.items()} for o in outcomes],
        clean_losses=torch.stack([o.clean for o in outcomes]).tolist(),
        perturbed_losses=torch.stack([o.perturbed for o in outcomes]).tolist(),
        excluded=list(excluded),
        # None for relative flatness, which perturbs nothing: passed on
        perturbations=(cast(list[dict[str, torch.Tensor]], [o.perturbation for o in outcomes])
                       if keep else None),
        frozen=list(frozen),
        nonfinite_evaluations=skipped,
        traces=[_trace(o.trace, o.clean) for o in outcomes if o.trace is not None],
        reference_per_batch=[excess(o.reference, o.clean).item() for o in outcomes
                             if o.reference is not None],
        reference_traces=[_trace(o.reference_trace, o.clean) for o in outcomes
                          if o.reference_trace is not None],
        blocks=([o.blocks.records() for o in outcomes if o.blocks is not None]
                if blockwise else None),
        reach=[o.reach for o in outcomes] if ascent else [],
        chains=[o.chains for o in outcomes if o.chains is not None],
        chain_shortfalls=[o.chain_shortfalls for o in outcomes
                          if o.chain_shortfalls is not None],
        evaluations=[o.evaluations for o in outcomes] if ascent else [],
        locality=[o.locality.as_dict() for o in outcomes if o.locality is not None],
        rounding=[o.rounding for o in outcomes if o.rounding is not None],
        draw_rises=[o.draw_rise for o in outcomes if o.draw_rise is not None],
    )
    notes = result.shortfalls()
    if notes:
        warn_at_caller(
            f"{result.measure} sharpness{' (' + result.variant + ')' if result.variant else ''}"
            f" at rho={settings.get('rho')} may not be the "
            f"{'mean' if result.measure == 'average' else 'maximum'} it claims: "
            + "; ".join(notes) + ". " + _advice(result, measure)
            + " (docs/sharpness.md, 'Reach and locality').", ReachWarning)
    return result


def _advice(result: SharpnessResult, measure: str) -> str:
    """What to do, for the causes the notes name only: a low reach, a ball that is not local
    (a value within its rounding has its own advice in its note)."""
    far = any(not where["local"] for where in result.locality)
    advice = (["Where the reach is low, search longer (reach={'chains': 8, 'continuations': "
               "4}, n_iter=50)"] if result.searched_short() else [])
    advice += ([f"where the ball is not local, {_LOCAL_ADVICE.get(measure, '')}use a smaller "
                "rho"] if far else [])
    text = "; ".join(advice) or "Each note says what to do"
    return text[0].upper() + text[1:]


def _trace(trace: torch.Tensor, clean: torch.Tensor) -> list[float | None]:
    """A solver trace as values (each a difference of losses, :func:`~.measures.excess`);
    ``None`` where no evaluation so far was finite (a best loss of ``-inf``)."""
    return [v if math.isfinite(v) else None for v in excess(trace, clean).tolist()]


def _moved(where: Mapping[str, Any]) -> str:
    """What moved how far at a batch's best perturbation (its :class:`~.blocks.Locality`; a
    ratio ``None`` beside a name is one that is not finite)."""
    name, factor, curved = where["parameter"], where["factor"], where["second_order_factor"]
    by = _times(where["displacement"])
    moved = (f"the parameters together move by {by} their" if name == TOGETHER
             else f"parameter {name} moves by {by} its")
    parts = [(name, f"{moved} norm"),
             (factor, f"factor {factor} by {_times(where['factor_displacement'])} its size "
                     "in the metric"),
             (curved, f"second-order term {_times(where['second_order'])} the first ({curved})")]
    return ", ".join(text for label, text in parts if label is not None)


def _not_local(where: Mapping[str, Any], rho: Any) -> str:
    """Why a batch's best perturbation is not local (its :class:`~.blocks.Locality`)."""
    if Locality.from_dict(where).within_bounds:
        # only the exact-path check failed: the ball is a neighbourhood, but its order-2 path
        # is not its geodesic to LOCAL_PATH
        return (f"the order-2 value is not the loss rise of its geodesic to "
                f"{100 * LOCAL_PATH:g} % ({_path_text(where)}): it is the rise along the Taylor "
                "path, which leaves the geodesic there; order='exact' measures along the "
                "geodesic itself")
    path = f"; {_path_text(where)}" if where.get("path_agrees") is False else ""
    return (f"the ball is not local ({_moved(where)}{path}): the value describes the loss far "
            "from theta, not in a neighbourhood of it"
            + ("; the order-2 path there is an extrapolation with many local maxima, so the "
               "value and its reach estimate are the best found, not the maximum"
               if (where["second_order"] or 0) > LOCAL_SECOND_ORDER else "")
            + _local_radius_note(where, rho))


def _path_text(where: Mapping[str, Any]) -> str:
    """What the exact-path check found at a batch's best perturbation (``path_agrees`` False)."""
    share = where.get("path_share")
    if share is None:
        return ("the exact geodesic through the same perturbation leaves the points where the "
                "metric is defined, or gives a loss that is not finite")
    change = (f"raises the loss by {100 * share:.3g} % of the value" if share >= 0
              else f"lowers the loss, by {-100 * share:.3g} % of the value")
    return f"along the exact geodesic the same perturbation {change}"


def local_radius(where: Mapping[str, Any], rho: float) -> float | None:
    """A radius at which the ball should be local along the direction of a batch's best
    perturbation (its :class:`~.blocks.Locality` ``where``, found at radius ``rho``): ``rho``
    over the largest of the figures' ratios to their bounds; ``None`` where a ratio is not
    finite.

    Along one direction ``xi = r u`` the second-order ratio ``||Gamma(xi, xi) / 2|| / ||xi||``
    is exactly ``r`` times that of ``u``. A displacement is ``r`` times its first-order part
    plus ``r^2`` times its second-order part: it shrinks in proportion to ``r`` once the
    second part is small, faster while it dominates, and slower only where the two parts
    cancel at ``rho`` (a displacement smaller than its first-order part), so the radius is an
    estimate, not a bound. The maximiser at that radius may point elsewhere: measure again.
    """
    figures = [(where.get("second_order"), LOCAL_SECOND_ORDER),
               (where.get("factor_displacement"), LOCAL_DISPLACEMENT),
               (where.get("displacement"), LOCAL_DISPLACEMENT)]
    if any(value is None and label is not None for (value, _), label in zip(
            figures, (where.get("second_order_factor"), where.get("factor"),
                      where.get("parameter")), strict=True)):
        return None
    excess = max(value / bound for value, bound in figures if value is not None)
    return rho / excess if excess > 1 else rho


def _local_radius_note(where: Mapping[str, Any], rho: Any) -> str:
    """The radius :func:`local_radius` suggests, as the end of a shortfall note."""
    if not isinstance(rho, (int, float)):
        return ""
    radius = local_radius(where, float(rho))
    if radius is None or radius >= rho:
        return ""
    return (f"; along the direction found, the ball should be local at about rho = "
            f"{radius:.3g} (the figures shrink about in proportion to rho; the maximiser there "
            "may point elsewhere: measure again)")


def _times(ratio: float | None) -> str:
    return "a ratio that is not finite (a norm of 0 that moved, or a path that overflowed) x" \
        if ratio is None \
        else f"{ratio:.3g} x"
