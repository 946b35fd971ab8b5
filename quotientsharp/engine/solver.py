"""Solver stage: Auto-PGD ascent over a perturbation ``xi`` (Croce & Hein 2020; Algorithm 1),
and the reach search of chains of ascents. It sees only :class:`AscentGeometry` and the
objective ``xi -> (loss, gradient)``. One run, ``N = n_iter`` steps of size ``eta``
(``eta_0 = 2 rho``):

- ``z = P_S(xi_k + eta d_k)`` with ``d_k`` the ascent direction at ``xi_k``; ``xi_1 = z``,
  afterwards ``xi_{k+1} = P_S(xi_k + alpha (z - xi_k) + (1 - alpha)(xi_k - xi_{k-1}))``;
- at each checkpoint ``w_j`` before the last step: if fewer than 75% of the steps since
  ``w_{j-1}`` increased the loss, or neither ``eta`` nor the best loss changed, ``eta`` is
  halved and the run restarts from the best iterate (the starting point counts; ``>`` never
  selects NaN).

The loss may have any shape ``P`` (independent problems), each decided alone. ``P_S`` is the
radial rescale (``clip``): every vector combined is horizontal already. Decisions are
``torch.where`` on the device (:class:`OnDevice`, over :class:`FlatTuple` buffers for one
problem) or, for one problem on the CPU, read on the host (:class:`OnHost`): the same values
bit for bit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar, Protocol, runtime_checkable

import torch

from quotientsharp.core import _tuples as T
from quotientsharp.core.scalars import check_finite, check_int, check_real

Tensors = tuple[torch.Tensor, ...]


def lift(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (``shape=P``) with trailing singleton dims to broadcast against ``like``."""
    # one shape argument: the unpacked form is an empty call for two 0-dim tensors
    return values.reshape(tuple(values.shape) + (1,) * (like.dim() - values.dim()))


def choose(flag: torch.Tensor, a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Tensors:
    """``where(flag, a, b)`` per tensor, ``flag`` of ``shape=P`` lifted to each tensor."""
    return tuple(torch.where(lift(flag, x), x, y) for x, y in zip(a, b, strict=True))


def choose_into(flag: torch.Tensor, new: Sequence[torch.Tensor],
                best: Sequence[torch.Tensor]) -> None:
    """``best <- where(flag, new, best)`` in place: no second tuple alive while it is chosen."""
    for x, b in zip(new, best, strict=True):
        torch.where(lift(flag, x), x, b, out=b)


class FlatTuple(tuple[torch.Tensor, ...]):
    """A tuple of tensors that are views of a few flat 1-D :attr:`buffers`, one per span
    (``(start, stop)`` indices into the tuple, one dtype and device, at most :func:`span_limit`
    elements): one ``torch.where`` over a buffer decides for all the tensors of its span."""

    spans: tuple[tuple[int, int], ...]
    buffers: tuple[torch.Tensor, ...]

    @classmethod
    def copy_of(cls, tensors: Sequence[torch.Tensor]) -> FlatTuple:
        """A copy of ``tensors`` in new flat buffers (``cat`` per span: a few launches)."""
        spans = flat_spans(tensors)
        buffers = tuple(_concatenated(tensors, span) for span in spans)
        views = []
        for (start, stop), buffer in zip(spans, buffers, strict=True):
            offset = 0
            for t in tensors[start:stop]:
                views.append(buffer[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()
        flat = cls(views)
        flat.spans, flat.buffers = spans, buffers
        return flat


def span_limit(tensors: Sequence[torch.Tensor]) -> int:
    """The largest tensor, or an eighth of the tuple if more: a span's most elements."""
    sizes = [t.numel() for t in tensors]
    return max(max(sizes, default=0), -(-sum(sizes) // 8))


def flat_spans(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """The spans of a :class:`FlatTuple` over ``tensors``."""
    limit = span_limit(tensors)
    spans: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, t in enumerate(tensors):
        first = tensors[start]
        if i > start and (t.dtype != first.dtype or t.device != first.device
                          or size + t.numel() > limit):
            spans.append((start, i))
            start, size = i, 0
        size += t.numel()
    if tensors:
        spans.append((start, len(tensors)))
    return tuple(spans)


def _concatenated(tensors: Sequence[torch.Tensor], span: tuple[int, int]) -> torch.Tensor:
    start, stop = span
    return torch.cat([t.reshape(-1) for t in tensors[start:stop]])


def _flat_compatible(flag: torch.Tensor, a: Sequence[torch.Tensor],
                     b: Sequence[torch.Tensor]) -> bool:
    """One problem (a 0-dim flag) and two tuples matching tensor for tensor."""
    return (flag.dim() == 0 and len(a) == len(b) > 0
            and all(x.shape == y.shape and x.dtype == y.dtype and x.device == y.device
                    for x, y in zip(a, b, strict=True)))


def _buffer(tensors: Sequence[torch.Tensor], span: tuple[int, int]) -> torch.Tensor:
    """The span as one 1-D tensor: the :class:`FlatTuple`'s own buffer, else a new one."""
    if isinstance(tensors, FlatTuple) and span in tensors.spans:
        return tensors.buffers[tensors.spans.index(span)]
    return _concatenated(tensors, span)


class OnDevice:
    """Every decision a ``torch.where`` on the device: no host sync, ever. The best iterate
    owns its storage (a :class:`FlatTuple` for one problem) and is overwritten in place."""

    #: Whether a rescale by exactly 1 may be skipped after testing the factor on the host.
    skips_unit_rescale = False

    def own(self, tensors: Sequence[torch.Tensor]) -> Tensors:
        """The best iterate's first value: storage :meth:`keep` may write to, or a reference."""
        return FlatTuple.copy_of(tensors) if tensors else ()

    def keep(self, flag: torch.Tensor, new: Tensors, best: Tensors) -> Tensors:
        """The best iterate after a step: ``new`` where ``flag``, else ``best``."""
        if isinstance(best, FlatTuple) and _flat_compatible(flag, new, best):
            # a span of new at a time: the temporary is at most span_limit elements
            for span, buffer in zip(best.spans, best.buffers, strict=True):
                torch.where(flag, _buffer(new, span), buffer, out=buffer)
            return best
        choose_into(flag, new, best)
        return best

    def pick(self, flag: torch.Tensor, a: Tensors, b: Tensors) -> Tensors:
        """``a`` where ``flag``, else ``b`` (a restart, a failed step)."""
        if not _flat_compatible(flag, a, b):
            return choose(flag, a, b)
        # b's copy is the result's storage (a new tuple, as choose makes), a decided into it
        result = FlatTuple.copy_of(b)
        for span, buffer in zip(result.spans, result.buffers, strict=True):
            torch.where(flag, _buffer(a, span), buffer, out=buffer)
        return result


class OnHost:
    """Decisions of a single problem on the CPU, read on the host (free there); the chosen
    tuple is kept by reference."""

    skips_unit_rescale = True

    def own(self, tensors: Sequence[torch.Tensor]) -> Tensors:
        return tuple(tensors)

    def keep(self, flag: torch.Tensor, new: Tensors, best: Tensors) -> Tensors:
        return new if bool(flag) else best

    def pick(self, flag: torch.Tensor, a: Tensors, b: Tensors) -> Tensors:
        return a if bool(flag) else b


#: How the solver applies a per-problem decision (a boolean tensor of ``shape=P``).
Decisions = OnDevice | OnHost
ON_DEVICE: Decisions = OnDevice()
ON_HOST: Decisions = OnHost()


def decisions_for(loss: torch.Tensor, host_decisions: bool = True) -> Decisions:
    """:data:`ON_HOST` for one problem (a 0-dim ``loss``) on the CPU when ``host_decisions``,
    else :data:`ON_DEVICE`."""
    if host_decisions and loss.device.type == "cpu" and loss.dim() == 0:
        return ON_HOST
    return ON_DEVICE


Objective = Callable[[Tensors], tuple[torch.Tensor, Tensors]]


@runtime_checkable
class AscentGeometry(Protocol):
    """What the solver needs from a geometry (see :mod:`.geometry`).

    :class:`~.ball.GeodesicBall` and :class:`~.ball.BoxGeometry` satisfy it (checked by mypy
    in :mod:`.ball` and by ``isinstance`` in the tests). Tangent tuples have the problems'
    leading shape ``P``; ``radius`` is a number or a tensor of ``shape=P``.
    """

    @property
    def radius(self) -> float | torch.Tensor: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def device(self) -> torch.device: ...

    def zeros(self) -> Tensors:
        """The start ``xi = 0``."""
        ...

    def clip(self, xi: Sequence[torch.Tensor], decisions: Decisions = ON_DEVICE,
             fresh: bool = False) -> Tensors:
        """Bring a horizontal ``xi`` into the ball (``P_S`` restricted to horizontal vectors);
        ``decisions`` says whether a rescale by exactly 1 may be skipped (:class:`Decisions`);
        ``fresh``: nothing else references ``xi``, so it may be rescaled in place."""
        ...

    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        """The horizontal ascent direction at the base point from a Euclidean gradient."""
        ...

    def random_start(self, generator: torch.Generator | None) -> Tensors:
        """A random point of the ball."""
        ...

    def with_radius(self, radius: float | torch.Tensor) -> AscentGeometry:
        """The same ball at another radius (a continuation in ``rho``)."""
        ...


@dataclass(frozen=True)
class AscentSettings:
    """Solver settings (defaults of Andriushchenko et al. 2023).

    Attributes
    ----------
    n_iter
        Steps per run ``N``.
    eta0
        Initial step size; ``None`` means ``2 rho``.
    alpha
        Momentum weight ``alpha`` in ``(0, 1]``.
    random_init
        Start the first run from a random point of the ball instead of ``xi = 0``.
    restarts
        Extra runs, each from a random point; the best loss over all runs is kept.
    """

    n_iter: int = 20
    eta0: float | None = None
    alpha: float = 0.75
    random_init: bool = False
    restarts: int = 0

    def __post_init__(self) -> None:
        # a NumPy number is stored as a Python one (object.__setattr__: the class is frozen)
        object.__setattr__(self, "n_iter", check_int("n_iter", self.n_iter, 1))
        if self.eta0 is not None:
            object.__setattr__(self, "eta0", check_finite("eta0", self.eta0))
        object.__setattr__(self, "alpha", check_real("alpha", self.alpha, "in (0, 1]",
                                                     lambda v: 0 < v <= 1))
        if not isinstance(self.random_init, bool):
            raise TypeError(f"random_init must be a bool, got {type(self.random_init).__name__}")
        object.__setattr__(self, "restarts", check_int("restarts", self.restarts, 0))

    @property
    def runs(self) -> int:
        return self.restarts + 1

    @property
    def evaluations_per_run(self) -> int:
        return self.n_iter + 1

    def first_step(self, rho: float | torch.Tensor) -> float | torch.Tensor:
        """``eta0``, or ``2 rho`` where it is ``None``."""
        return self.eta0 if self.eta0 is not None else 2.0 * rho


def checkpoints(n_iter: int) -> list[int]:
    """Checkpoints ``w_j = ceil(p_j N)``, ``p_0 = 0``, ``p_1 = 0.22``,
    ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``, for ``p_j <= 1``.

    Computed in exact rational arithmetic (``0.70 * 20`` must give 14, not 15). Returns the
    distinct ``w_j >= 1`` in increasing order; ``w_0 = 0`` is implicit.
    """
    previous, current = Fraction(0), Fraction(22, 100)
    points: list[int] = []
    while current <= 1:
        w = math.ceil(current * n_iter)
        if w >= 1 and (not points or w > points[-1]):
            points.append(w)
        previous, current = current, current + max(current - previous - Fraction(3, 100),
                                                   Fraction(6, 100))
    return points


@dataclass
class AscentOutcome:
    """Best iterate of all runs.

    Attributes
    ----------
    loss
        Best loss per problem, ``shape=P`` (0-dim for one problem), on the device.
    xi
        The best iterate (a tuple like the geometry's tangent vectors).
    run_losses
        Best loss of each run, ``shape=P`` each.
    start_loss
        The loss at the first run's starting point (the clean loss when it starts at ``xi = 0``).
    nonfinite_at
        Per run, ``shape=P`` int64: the first evaluation whose loss was NaN or inf (``0`` the
        run's starting point, ``k`` its ``k``-th step), ``-1`` where every loss was finite.
    nonfinite_loss
        Per run, ``shape=P``: the loss of that first non-finite evaluation (``0`` where none).
    nonfinite_count
        ``shape=P`` int64: non-finite evaluations over all runs.
    eta
        ``shape=P``: the step size at the end of the last run (after its last checkpoint).
    trace
        ``shape=[runs * (n_iter + 1), *P]``: the best loss over every evaluation so far, one
        entry per evaluation (run after run; entry ``0`` the first start). Non-decreasing,
        its last entry is :attr:`loss`. On the device: read it once, after the ascent.
    """

    loss: torch.Tensor
    xi: Tensors
    run_losses: list[torch.Tensor]
    start_loss: torch.Tensor
    nonfinite_at: list[torch.Tensor] = field(default_factory=list)
    nonfinite_loss: list[torch.Tensor] = field(default_factory=list)
    nonfinite_count: torch.Tensor | None = None
    eta: torch.Tensor | None = None
    trace: torch.Tensor | None = None


def gradient_step(xi: Sequence[torch.Tensor], direction: Sequence[torch.Tensor],
                  eta: torch.Tensor, overwrite: bool = False) -> Tensors:
    """``xi + eta d`` (before ``P_S``), ``eta`` 0-dim or ``shape=P``; ``overwrite``: written
    into ``direction``, which nothing else references."""
    if not direction:
        return ()
    factor = eta if eta.dim() == 0 else [lift(eta, x) for x in xi]
    # eta d + xi, summed into the product: the same sums as xi + eta d, bit for bit
    if overwrite:
        torch._foreach_mul_(list(direction), factor)
        step = tuple(direction)
    else:
        step = T.fused_mul(direction, factor)
    torch._foreach_add_(list(step), list(xi))
    return step


def momentum_step(xi: Sequence[torch.Tensor], z: Sequence[torch.Tensor],
                  previous: Sequence[torch.Tensor], alpha: float,
                  overwrite: bool = False) -> Tensors:
    """``xi + alpha (z - xi) + (1 - alpha)(xi - previous)`` (before ``P_S``), evaluated as
    ``alpha z + 2 (1 - alpha) xi - (1 - alpha) previous`` in three fused passes; ``overwrite``:
    written into ``z``, which nothing else references."""
    if not xi:
        return ()
    if overwrite:
        torch._foreach_mul_(list(z), alpha)
        new = tuple(z)
    else:
        new = T.fused_mul(z, alpha)
    torch._foreach_add_(list(new), list(xi), alpha=2.0 * (1.0 - alpha))
    torch._foreach_add_(list(new), list(previous), alpha=-(1.0 - alpha))
    return new


def proposal_step(geometry: AscentGeometry, xi: Sequence[torch.Tensor],
                  direction: Sequence[torch.Tensor], previous: Sequence[torch.Tensor],
                  eta: torch.Tensor, alpha: float, momentum: bool) -> Tensors:
    """``xi_{k+1}`` before it is evaluated, decisions on the device: ``z = P_S(xi + eta d)``,
    with ``momentum`` then ``P_S`` of the momentum step. What :class:`CompiledSteps` compiles:
    nothing given is written."""
    z = geometry.clip(gradient_step(xi, direction, eta), ON_DEVICE, fresh=True)
    if not momentum:
        return z
    return geometry.clip(momentum_step(xi, z, previous, alpha, overwrite=True), ON_DEVICE,
                         fresh=True)


def _direction(geometry: AscentGeometry, egrad: Sequence[torch.Tensor]) -> Tensors:
    return geometry.direction(egrad)


class CompiledSteps:
    """The ascent's per-iteration geometry as ``torch.compile`` graphs, equal to the eager
    steps to rounding.

    One object holds the compiled :func:`proposal_step` (with momentum) and
    ``geometry.direction``; pass the same object to every :func:`ascend` call that should
    reuse them (:meth:`shared`: the engine's, for the whole process). A run's first direction
    and step run eager: they compute the frozen point's cached quantities, which dynamo cannot
    (``cached_property``'s lock). New shapes (another model, another number of touched rows)
    compile again once, then dynamically; another radius recompiles (a constant of the graph).

    Parameters
    ----------
    mode
        ``torch.compile``'s mode (``None``: its default).
    dynamic
        ``torch.compile``'s ``dynamic``: ``None`` compiles for the first shapes and again,
        with the changed sizes symbolic, when they change; ``True`` compiles symbolic sizes
        from the start.
    """

    def __init__(self, mode: str | None = None, dynamic: bool | None = None) -> None:
        self.mode, self.dynamic = mode, dynamic
        self._proposal = torch.compile(proposal_step, mode=mode, dynamic=dynamic)
        self._direction = torch.compile(_direction, mode=mode, dynamic=dynamic)

    def proposal(self, geometry: AscentGeometry, xi: Sequence[torch.Tensor],
                 direction: Sequence[torch.Tensor], previous: Sequence[torch.Tensor],
                 eta: torch.Tensor, alpha: float, momentum: bool) -> Tensors:
        """:func:`proposal_step`, compiled."""
        return self._call(self._proposal, geometry, xi, direction, previous, eta, alpha,
                          momentum)

    def direction(self, geometry: AscentGeometry, egrad: Sequence[torch.Tensor]) -> Tensors:
        """``geometry.direction(egrad)``, compiled."""
        return self._call(self._direction, geometry, egrad)

    @staticmethod
    def _call(function: Callable[..., Sequence[torch.Tensor]], *args: object) -> Tensors:
        try:
            return tuple(function(*args))
        except torch._dynamo.exc.BackendCompilerFailed as error:
            # most often no working C++ compiler for inductor's CPU kernels
            raise RuntimeError(
                "compile_steps=True: torch.compile could not build the solver's steps "
                f"({type(error.inner_exception).__name__}: {error.inner_exception}); run "
                "with compile_steps=False (the eager steps, the same values)") from error

    @classmethod
    def shared(cls) -> CompiledSteps:
        """One object for the whole process: its graphs are reused by every later call."""
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    _shared: ClassVar[CompiledSteps | None] = None


def _finite_or_lowest(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` with NaN and inf replaced by ``-inf`` (never the best)."""
    return torch.where(torch.isfinite(loss), loss, torch.full_like(loss, -math.inf))


class _NonFinite:
    """The first non-finite evaluation of one run, and their count, as device tensors."""

    def __init__(self, start_loss: torch.Tensor) -> None:
        bad = ~torch.isfinite(start_loss)
        self.at = torch.where(bad, 0, torch.full_like(start_loss, -1, dtype=torch.int64))
        self.loss = torch.where(bad, start_loss, torch.zeros_like(start_loss))
        self.count = bad.to(torch.int64)

    def update(self, loss: torch.Tensor, evaluation: int) -> None:
        bad = ~torch.isfinite(loss)
        first = bad & (self.at < 0)
        self.at = torch.where(first, evaluation, self.at)
        self.loss = torch.where(first, loss, self.loss)
        self.count = self.count + bad.to(torch.int64)


class HandedOver:
    """An evaluation at ``xi = 0`` handed over to :func:`ascend` (its ownership rule).

    ``ascend(initial=(loss, gradient))`` only reads the pair: the caller keeps its references
    and the solver never writes to it. ``ascend(initial=HandedOver(loss, gradient))`` hands it
    over: the solver :meth:`take` s the pair, which leaves this object empty, so that once the
    gradient is raised to a direction no reference to it is left (one parameter-sized tuple less
    for the whole ascent). Build it in the call, or drop your own references before the call.
    """

    def __init__(self, loss: torch.Tensor, gradient: Tensors) -> None:
        self._pair: tuple[torch.Tensor, Tensors] | None = (loss, gradient)

    def take(self) -> tuple[torch.Tensor, Tensors]:
        """The pair, once; raises if it was taken already."""
        if self._pair is None:
            raise ValueError("this HandedOver evaluation was taken already")
        pair, self._pair = self._pair, None
        return pair


Initial = tuple[torch.Tensor, Tensors] | HandedOver


class _Run:
    """The state of one Auto-PGD run: iterate, momentum, best iterate, step size."""

    def __init__(self, geometry: AscentGeometry, xi: Tensors, loss: torch.Tensor,
                 direction: Tensors, eta0: float | torch.Tensor, skip_nonfinite: bool,
                 host_decisions: bool, compiled: CompiledSteps | None = None) -> None:
        self.geometry, self.skip_nonfinite = geometry, skip_nonfinite
        self.compiled = compiled
        # non-finite evaluations: recorded on the device, checked by the caller after the ascent
        self.record = _NonFinite(loss)
        self.start_loss = loss
        if skip_nonfinite:
            loss = _finite_or_lowest(loss)
        self.decide = decisions_for(loss, host_decisions)
        self.best_loss = loss
        # the best loss after each evaluation: references to tensors the loop makes anyway
        self.trace = [loss]
        # the start is also xi, then previous; on the device the best pair is overwritten in
        # place, so it owns its storage there (the geometry's tensors are not ours)
        self.best_xi, self.best_direction = self.decide.own(xi), self.decide.own(direction)
        self.xi, self.previous, self.direction = xi, xi, direction
        self.current_loss = loss
        self.eta = torch.zeros_like(loss) + eta0
        self.checkpoint_eta, self.checkpoint_best = self.eta, loss
        self.increases = torch.zeros_like(loss)
        self.last_mark = 0

    def proposal(self, k: int, alpha: float) -> Tensors:
        """``xi_{k+1}`` before it is evaluated; drops ``direction`` and ``previous`` (not
        needed again) so that they do not raise the forward+backward's peak."""
        if self.compiled is not None and k > 0:
            # the first step runs eager: it fills the frozen point's cached quantities,
            # which dynamo cannot (cached_property's lock)
            previous = self.previous
            if any(p is x for p, x in zip(previous, self.xi, strict=True)):
                # after a restart both are the best iterate: aliased inputs would compile anew
                previous = tuple(t.clone() for t in previous)
            # plain tuples: a FlatTuple would be guarded as another type and compile anew
            new = self.compiled.proposal(self.geometry, tuple(self.xi), tuple(self.direction),
                                         tuple(previous), self.eta, alpha, True)
            self.direction = self.previous = ()
            return new
        clip, decide = self.geometry.clip, self.decide
        # the direction's storage (where the run alone holds it), then z's, become the steps'
        z = clip(gradient_step(self.xi, self.direction, self.eta,
                               overwrite=self._owns_direction()), decide, fresh=True)
        previous = self.previous
        self.direction = self.previous = ()
        return z if k == 0 else clip(momentum_step(self.xi, z, previous, alpha,
                                                   overwrite=True), decide, fresh=True)

    def _owns_direction(self) -> bool:
        """Whether :attr:`direction` may be overwritten: the geometry made it new and it shares
        no storage with the other tuples the run holds."""
        if not getattr(self.geometry, "new_directions", False):
            return False
        kept = {t.untyped_storage().data_ptr() for t in (*self.best_direction, *self.best_xi,
                                                         *self.xi, *self.previous)}
        return not any(t.untyped_storage().data_ptr() in kept for t in self.direction)

    def accept(self, new: Tensors, new_loss: torch.Tensor, new_direction: Tensors,
               evaluation: int) -> None:
        """Record the evaluation of ``new`` and move on to it (or back to the best iterate)."""
        decide = self.decide
        self.record.update(new_loss, evaluation)
        failed = None
        if self.skip_nonfinite:
            failed = ~torch.isfinite(new_loss)
            new_loss = _finite_or_lowest(new_loss)
        self.increases = self.increases + (new_loss > self.current_loss).to(self.increases.dtype)
        improved = new_loss > self.best_loss
        self.best_loss = torch.where(improved, new_loss, self.best_loss)
        self.trace.append(self.best_loss)
        self.best_xi = decide.keep(improved, new, self.best_xi)
        self.best_direction = decide.keep(improved, new_direction, self.best_direction)
        if failed is not None:
            # a failed step: the next one starts again from the best iterate and its direction
            new = decide.pick(failed, self.best_xi, new)
            new_direction = decide.pick(failed, self.best_direction, new_direction)
            new_loss = torch.where(failed, self.best_loss, new_loss)
        self.previous, self.xi = self.xi, new
        self.current_loss, self.direction = new_loss, new_direction

    def checkpoint(self, step: int) -> None:
        """Halve ``eta`` and restart from the best iterate where the run oscillates or stalls."""
        decide = self.decide
        oscillating = self.increases < 0.75 * (step - self.last_mark)
        stalled = (self.eta == self.checkpoint_eta) & (self.best_loss == self.checkpoint_best)
        restart = oscillating | stalled
        self.checkpoint_eta, self.checkpoint_best = self.eta, self.best_loss
        self.eta = torch.where(restart, 0.5 * self.eta, self.eta)
        self.xi = decide.pick(restart, self.best_xi, self.xi)
        self.previous = decide.pick(restart, self.best_xi, self.previous)
        self.direction = decide.pick(restart, self.best_direction, self.direction)
        self.current_loss = torch.where(restart, self.best_loss, self.current_loss)
        self.increases = torch.zeros_like(self.increases)
        self.last_mark = step


def _single_run(geometry: AscentGeometry, objective: Objective, start: Callable[[], Tensors],
                settings: AscentSettings, eta0: float | torch.Tensor,
                on_evaluation: Callable[[], object] | None,
                initial: Initial | None = None, skip_nonfinite: bool = False,
                host_decisions: bool = True, compiled: CompiledSteps | None = None
                ) -> tuple[torch.Tensor, Tensors, torch.Tensor, _NonFinite, torch.Tensor,
                           torch.Tensor]:
    """One run from ``start()`` (or ``initial``, the evaluation there): best loss and iterate,
    start loss, non-finite record, trace ``shape=[n_iter + 1, *P]``, final step size."""
    marks = [w for w in checkpoints(settings.n_iter) if w < settings.n_iter]
    # the start is drawn here, so that no caller holds it once xi has moved on
    xi = start()
    if isinstance(initial, HandedOver):
        # after this the gradient's only reference is ``egrad``, dropped below
        initial = initial.take()
    loss, egrad = objective(xi) if initial is None else initial
    initial = None
    if on_evaluation is not None:
        on_evaluation()
    # the first direction eager, like the first step (see _Run.proposal)
    direction = geometry.direction(egrad)
    del egrad
    directions: Callable[[Tensors], Tensors] = (
        geometry.direction if compiled is None
        else lambda egrad: compiled.direction(geometry, egrad))
    run = _Run(geometry, xi, loss, direction, eta0, skip_nonfinite, host_decisions, compiled)
    del xi, direction
    for k in range(settings.n_iter):
        new = run.proposal(k, settings.alpha)
        # what stays alive through the forward+backward: xi, new and the best pair; the
        # gradient is dropped as soon as it is raised
        new_loss, egrad = objective(new)
        if on_evaluation is not None:
            on_evaluation()
        new_direction = directions(egrad)
        del egrad
        run.accept(new, new_loss, new_direction, k + 1)
        del new, new_direction
        if marks and k + 1 == marks[0]:
            marks.pop(0)
            run.checkpoint(k + 1)
    return (run.best_loss, run.best_xi, run.start_loss, run.record, torch.stack(run.trace),
            run.eta)


def ascend(geometry: AscentGeometry, objective: Objective, settings: AscentSettings,
           generator: torch.Generator | None = None,
           on_evaluation: Callable[[], object] | None = None,
           initial: Initial | None = None, skip_nonfinite: bool = False,
           host_decisions: bool = True, compiled: CompiledSteps | None = None,
           start: Tensors | None = None) -> AscentOutcome:
    """Maximise ``objective`` over the geometry's ball by Auto-PGD, per problem.

    Parameters
    ----------
    geometry
        Supplies ``zeros``, ``clip``, ``direction`` and ``random_start`` (and ``radius``).
    objective
        ``xi -> (loss, euclidean gradient w.r.t. xi)``; ``loss`` 0-dim, or ``shape=P`` for
        independent problems (each gradient entry that of its own problem's loss).
    settings
        :class:`AscentSettings`.
    generator
        Source of randomness for random starts.
    on_evaluation
        Called after every objective evaluation (progress bars); must not sync.
    initial
        ``objective(geometry.zeros())``, when the caller has it already: the first run then
        starts from it instead of evaluating again. Only for ``random_init=False``. Ownership:
        a ``(loss, gradient)`` tuple is only read (the solver never writes to what it is
        given); a :class:`HandedOver` is taken (emptied), so that once the gradient is raised
        no reference to it is left.
    skip_nonfinite
        Treat an evaluation with a NaN or inf loss as a failed step (never the best, the next
        step restarts from the best iterate) instead of comparing it. Either way the outcome
        records the non-finite evaluations (``nonfinite_at``, ``nonfinite_count``) for the
        caller to check once, after the ascent.
    host_decisions
        ``True``: a single problem on the CPU reads its decisions on the host (the best iterate
        kept by reference, rescales by exactly 1 skipped; :class:`OnHost`). ``False``: the
        device path everywhere (what a CUDA run does, no host sync). Same values bit for bit.
    compiled
        :class:`CompiledSteps`: run the per-iteration geometry as its compiled graphs (module
        doc; the decisions are then on the device). Equal to the eager path to rounding.
    start
        A point of the ball to start the first run from instead of ``xi = 0`` (a warm start:
        the continuation of an earlier ascent from its best iterate); only read. Not with
        ``initial`` or ``random_init``.
    """
    if initial is not None and settings.random_init:
        raise ValueError("initial is the evaluation at xi = 0, but random_init=True starts "
                         "elsewhere")
    if start is not None and (initial is not None or settings.random_init):
        raise ValueError("start is where the first run begins: it excludes initial (the "
                         "evaluation at xi = 0) and random_init")
    eta0 = settings.first_step(geometry.radius)
    best_loss: torch.Tensor | None = None
    best_xi: Tensors = ()
    run_losses = []
    start_loss: torch.Tensor | None = None
    records: list[_NonFinite] = []
    traces: list[torch.Tensor] = []
    for run in range(settings.runs):
        random = settings.random_init or run > 0
        begin: Callable[[], Tensors] = (
            (lambda: geometry.random_start(generator)) if random
            else geometry.zeros if start is None
            # a copy: the run writes its iterates in place, and the caller's start is only read
            else (lambda: tuple(t.clone() for t in start)))
        loss, xi, first, record, trace, eta = _single_run(
            geometry, objective, begin, settings, eta0, on_evaluation,
            initial if run == 0 else None, skip_nonfinite, host_decisions, compiled)
        records.append(record)
        run_losses.append(loss)
        if best_loss is None:
            best_loss, best_xi, start_loss = loss, xi, first
            traces.append(trace)
        else:
            # the best over the earlier runs too, chosen as the runs' best is chosen below
            traces.append(torch.where(trace > best_loss, trace, best_loss))
            improved = loss > best_loss
            best_loss = torch.where(improved, loss, best_loss)
            best_xi = choose(improved, xi, best_xi)
    assert best_loss is not None and start_loss is not None
    count = sum((record.count for record in records[1:]), records[0].count)
    return AscentOutcome(best_loss, best_xi, run_losses, start_loss,
                         [r.at for r in records], [r.loss for r in records], count, eta,
                         traces[0] if len(traces) == 1 else torch.cat(traces))


@dataclass(frozen=True)
class SearchSettings:
    """How far a measurement looks beyond its first ascent (the ``reach`` option,
    ``docs/sharpness.md``, "Reach").

    A *chain* is one ascent and its warm continuations (at most ``continuations``, starting
    from the chain's best iterate while the last 30 % of a run raised its value by more than
    ``stall`` of it; ``warm_step``: ``"continue"`` at twice the step size the run ended with,
    at most its first, ``"reset"`` at its first). The first chain starts where the
    measurement's settings say, the others at random points, until the reach estimate
    (:func:`reach_estimate`, at most ``1 - s`` where the best chain still climbed by ``s``)
    reaches ``target`` in ``(0, 1]`` or ``chains`` (``>= min_chains >= 2``) have run. ``ladder``:
    increasing shares of ``rho`` in ``(0, 1)`` for the second chain, a continuation in ``rho``
    from ``xi = 0`` (:func:`_ladder_chain`); empty, a random start.
    """

    chains: int = 4
    min_chains: int = 2
    continuations: int = 2
    target: float = 0.99
    stall: float = 1e-3
    warm_step: str = "continue"
    ladder: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "min_chains", check_int("min_chains", self.min_chains, 2))
            object.__setattr__(self, "chains", check_int("chains", self.chains, 1))
            object.__setattr__(self, "continuations",
                               check_int("continuations", self.continuations, 0))
            object.__setattr__(self, "target", check_real(
                "target", self.target, "a number in (0, 1]", lambda v: 0 < v <= 1))
            object.__setattr__(self, "stall", check_real(
                "stall", self.stall, "a number in [0, 1)", lambda v: 0 <= v < 1))
        except ValueError as err:
            raise ValueError(f"reach: {err}") from err
        if self.chains < self.min_chains and self.chains == type(self).chains:
            # the user raised min_chains alone: chains is the default, which they never set
            raise ValueError(f"reach: min_chains={self.min_chains} is more than chains="
                             f"{self.chains} (the default); raise chains too")
        if self.chains < self.min_chains:
            raise ValueError(f"reach: chains must be an integer >= min_chains="
                             f"{self.min_chains}, got {self.chains}")
        if self.warm_step not in ("continue", "reset"):
            raise ValueError(f"reach: warm_step must be 'continue' or 'reset', got "
                             f"{self.warm_step!r}")
        object.__setattr__(self, "ladder", _ladder(self.ladder))


def _ladder(shares: object) -> tuple[float, ...]:
    """``SearchSettings.ladder`` checked: a sequence of numbers increasing in ``(0, 1)``."""
    if isinstance(shares, (str, bytes)) or not isinstance(shares, Sequence):
        raise TypeError(f"reach: ladder must be a sequence of shares of rho in (0, 1), got "
                        f"{shares!r}")
    checked = tuple(check_real("reach: ladder", share, "a share of rho in (0, 1)",
                               lambda v: 0 < v < 1) for share in shares)
    if any(b <= a for a, b in itertools.pairwise(checked)):
        raise ValueError(f"reach: ladder must increase, got {list(checked)}")
    return checked


@dataclass
class SearchOutcome:
    """The best iterate of a :func:`search` (``loss`` 0-dim, ``xi``), each chain's value
    (best loss minus ``clean``; ``None`` for a chain with no finite evaluation, under
    ``skip_nonfinite``), the ``reach`` estimate, the loss ``evaluations``, the ``trace`` of the
    best loss (``shape=[evaluations]``), every ascent with its settings (``solves``) and per
    chain the share of its value its last run added (``shortfalls``, ``0`` if it stalled).
    """

    loss: torch.Tensor
    xi: Tensors
    chains: list[float | None]
    reach: float
    evaluations: int
    trace: torch.Tensor
    solves: list[tuple[AscentSettings, AscentOutcome]]
    shortfalls: list[float] = field(default_factory=list)


def reach_estimate(chains: Sequence[float | None]) -> float:
    """Second-best of ``chains`` (best loss minus clean loss) over the best, a negative second
    counted as zero; ``0`` where no chain found a loss increase (agreeing on zero confirms
    nothing: the maximum over a ball is positive where the gradient does not vanish).

    A chain without a value (``None`` or not finite: no finite evaluation) is not counted: it
    neither confirms the best nor lowers it; a best no other chain with a value confirms gives
    ``0`` (a single chain, run alone, gives ``1``).
    """
    ordered = sorted((c for c in chains if c is not None and math.isfinite(c)), reverse=True)
    if not ordered or ordered[0] <= 0:
        return 0.0
    if len(ordered) == 1:
        return 1.0 if len(chains) == 1 else 0.0
    return max(ordered[1], 0.0) / ordered[0]


def best_chain(chains: Sequence[float | None]) -> int | None:
    """The position of the highest chain with a value (the first of equal ones), or ``None``
    where no chain has one."""
    valued = [i for i, c in enumerate(chains) if c is not None and math.isfinite(c)]
    return max(valued, key=lambda i: (chains[i], -i)) if valued else None


def chain_value(loss: torch.Tensor, clean: float) -> float | None:
    """A chain's value, its best loss minus ``clean`` (in float64 on the host, as the result
    computes every value), or ``None`` where the best loss is not finite."""
    best = loss.item()
    return best - clean if math.isfinite(best) else None


def _late(n_iter: int) -> int:
    """The trace index from which a run's last 30 % of steps is measured (at least its last
    step, so that a run of 1 to 3 steps is never judged converged for want of a step)."""
    return min(math.ceil(0.7 * n_iter), n_iter - 1)


def _climbing(trace: torch.Tensor, n_iter: int, clean: float, stall: float) -> bool:
    """Whether the last run of ``trace`` rose by more than ``stall`` of its value late on."""
    run = trace[-(n_iter + 1):]
    end, before = run[-1].item(), run[_late(n_iter)].item()
    top = end - clean
    return math.isfinite(end) and top > 0 and end - before > stall * top


#: A chain's best loss, its point and its shortfall (:func:`search`).
Chain = tuple[torch.Tensor, Tensors, float]


def _ladder_chain(geometry: AscentGeometry, ladder: Sequence[float], settings: AscentSettings,
                  run: Callable[..., AscentOutcome], chain: Callable[..., Chain]) -> Chain:
    """The ladder's ascents (``run(settings, None, None, start, ball)``), each from the last
    one's best point scaled up to its radius, then ``chain`` at ``rho`` from the last."""
    xi, below, best = geometry.zeros(), 1.0, None
    for share in ladder:
        ball = geometry.with_radius(geometry.radius * share)
        rung = AscentSettings(n_iter=settings.n_iter, alpha=settings.alpha,
                              eta0=None if settings.eta0 is None else settings.eta0 * share)
        outcome = run(rung, None, None, ball.clip(tuple(t * (share / below) for t in xi)), ball)
        xi, below = outcome.xi, share
        # the rungs' points lie in the ball too, so the best of them is a candidate (a value
        # at rho is then never below what the chain found at a smaller radius)
        best = outcome if best is None or bool(outcome.loss > best.loss) else best
    assert best is not None
    fresh = AscentSettings(n_iter=settings.n_iter, eta0=settings.eta0, alpha=settings.alpha)
    start = geometry.clip(tuple(t * (1.0 / below) for t in xi))
    loss, xi, shortfall = chain(fresh, None, None, start)
    return (best.loss, best.xi, shortfall) if bool(best.loss > loss) else (loss, xi, shortfall)


def search(geometry: AscentGeometry, objective: Objective, settings: AscentSettings,
           reach: SearchSettings, clean: float, generator: torch.Generator | None,
           probe_generator: torch.Generator | None,
           on_evaluation: Callable[[], object] | None = None, initial: Initial | None = None,
           skip_nonfinite: bool = False, host_decisions: bool = True,
           compiled: CompiledSteps | None = None) -> SearchOutcome:
    """Chains of Auto-PGD ascents until the best value is confirmed (:class:`SearchSettings`).

    One problem (a 0-dim loss). The first chain is :func:`ascend` with ``settings``,
    ``generator`` and ``initial``; the others start from ``probe_generator``'s draws, so that the
    first chain is the same without them. Values are measured from ``clean``, the loss at theta.
    """
    solves: list[tuple[AscentSettings, AscentOutcome]] = []
    eta0 = float(settings.first_step(float(geometry.radius)))
    probe = AscentSettings(n_iter=settings.n_iter, eta0=settings.eta0, alpha=settings.alpha,
                           random_init=True)

    def run(chain_settings: AscentSettings, stream: torch.Generator | None,
            first: Initial | None, start: Tensors | None,
            ball: AscentGeometry = geometry) -> AscentOutcome:
        outcome = ascend(ball, objective, chain_settings, stream, on_evaluation,
                         initial=first, skip_nonfinite=skip_nonfinite,
                         host_decisions=host_decisions, compiled=compiled, start=start)
        solves.append((chain_settings, outcome))
        return outcome

    def chain(chain_settings: AscentSettings, stream: torch.Generator | None,
              first: Initial | None, start: Tensors | None = None) -> Chain:
        outcome = run(chain_settings, stream, first, start)
        loss, xi = outcome.loss, outcome.xi
        before = None
        for done in range(reach.continuations + 1):
            assert outcome.trace is not None and outcome.eta is not None
            if not _climbing(outcome.trace, settings.n_iter, clean, reach.stall):
                return loss, xi, 0.0
            if done == reach.continuations:
                break
            step = eta0 if reach.warm_step == "reset" else min(eta0, 2 * outcome.eta.item())
            warm = AscentSettings(n_iter=settings.n_iter, eta0=step, alpha=settings.alpha)
            before = loss
            outcome = run(warm, None, None, xi)
            if bool(outcome.loss > loss):
                loss, xi = outcome.loss, outcome.xi
        # still climbing when its continuations ran out: what the last run added (its last
        # 30 % for a chain of one run) is taken as what the next would add
        assert outcome.trace is not None
        late = outcome.trace[-(settings.n_iter + 1):][_late(settings.n_iter)]
        added = (loss - (late if before is None else before)).item()
        return loss, xi, max(0.0, added) / max(loss.item() - clean, tiny)

    tiny = torch.finfo(torch.float64).tiny
    best_loss, best_xi, shortfall = chain(settings, generator, initial)
    values, shortfalls = [chain_value(best_loss, clean)], [shortfall]

    def estimate() -> float:
        # the chains' agreement, and the best chain's own convergence
        best = best_chain(values)
        return min(reach_estimate(values), 1.0 - (0.0 if best is None else shortfalls[best]))

    while len(values) < reach.chains and (len(values) < reach.min_chains
                                          or estimate() < reach.target):
        loss, xi, shortfall = (_ladder_chain(geometry, reach.ladder, settings, run, chain)
                               if reach.ladder and len(values) == 1
                               else chain(probe, probe_generator, None))
        values.append(chain_value(loss, clean))
        shortfalls.append(shortfall)
        if bool(loss > best_loss):
            best_loss, best_xi = loss, xi
    traces = [outcome.trace for _, outcome in solves if outcome.trace is not None]
    trace = torch.cummax(torch.cat(traces), dim=0).values
    evaluations = sum(s.runs * s.evaluations_per_run for s, _ in solves)
    return SearchOutcome(best_loss, best_xi, values, estimate(), evaluations, trace, solves,
                         shortfalls)

