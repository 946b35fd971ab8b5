"""Auto-PGD ascent over a perturbation ``xi`` (Croce & Hein 2020; the paper's Algorithm 1).

One run, with ``N = n_iter`` steps and step size ``eta`` (``eta_0 = 2 rho``):

- ``z = P_S(xi_k + eta d_k)`` with ``d_k`` the ascent direction at ``xi_k`` (the Riemannian
  gradient normalised by its g-norm, or ``c * sign(gradient)`` in an L-infinity box);
- ``xi_1 = z`` (no momentum on the first step), afterwards
  ``xi_{k+1} = P_S(xi_k + alpha (z - xi_k) + (1 - alpha)(xi_k - xi_{k-1}))``;
- at each checkpoint ``w_j`` (before the last step): if fewer than 75% of the steps since
  ``w_{j-1}`` increased the loss, or neither ``eta`` nor the best loss changed since the
  checkpoint ``w_{j-1}`` (``w_0 = 0``, the start), then ``eta`` is halved and the iterate restarts
  from the best ``xi`` found so far: ``xi_k``, ``xi_{k-1}``, the current loss and the direction
  are all reset to the best iterate's, so no stale momentum or perturbation survives a restart;
- the best loss is tracked over every evaluated iterate, the starting point included.

The convergence trace. After every evaluation the best loss so far is kept (a reference to the
device tensor the loop holds anyway, no copy and no read): ``AscentOutcome.trace`` stacks them
once the ascent is over, ``shape=[runs * (N + 1), *P]``, entry ``r (N + 1) + k`` the best loss
over all runs up to step ``k`` of run ``r``. It is non-decreasing and ends at the best loss.

Non-finite losses. ``new_loss > best_loss`` never selects NaN and always selects inf, so a
non-finite evaluation would silently vanish (or win). The solver therefore records, per run and
per problem, the first evaluation whose loss is not finite (``AscentOutcome.nonfinite_at``,
``-1`` for none; ``0`` is the starting point, ``k`` the ``k``-th step), the loss it gave and the
number of such evaluations, all as device tensors: the caller checks them once after the
ascent (the sharpness engine raises, naming the batch and the iteration). With
``skip_nonfinite=True`` a non-finite evaluation is instead treated as a failed step: it never
becomes the best iterate nor counts as an increase, and the next step starts again from the best
iterate and its direction.

Everything runs on the device: decisions are ``torch.where`` on device tensors, so there is no
host sync inside the loop. The one exception is a single problem on the CPU, where reading a
decision costs nothing (there is no device to wait for): the best iterate and the restarts are
then chosen by reference instead of by ``torch.where`` over every parameter, with the same
result bit for bit (:data:`HOST_DECISIONS_ON_CPU`). ``restarts`` extra runs start from random
points of the ball; the best of all runs wins. Randomness comes only from the given generator.

Many independent problems at once. The objective may return a loss of any shape ``P`` (one
entry per problem, e.g. ``[models, batches]``) with the gradient of each problem's own loss;
every decision (step size, checkpoint test, best iterate, restart) is then taken per problem,
exactly as if each problem were solved alone. The geometry's ``norm`` must return ``shape=P``
and its ``radius`` may be a tensor of that shape. A 0-dim loss is the single-problem case.

Projections. ``P_S`` is the horizontal projection followed by the radial rescale into the
ball. Every vector the loop combines (the iterates, the normalised Riemannian gradients, the
start) is already horizontal and the horizontal space at the fixed base point is linear, so
the loop only calls the geometry's ``clip`` (the rescale, or the clamp of a box); the
horizontal projection runs once per gradient, inside ``direction``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import torch

from quotientsharp.core import _tuples as T

Tensors = tuple[torch.Tensor, ...]
Objective = Callable[[Tensors], tuple[torch.Tensor, Tensors]]


class AscentGeometry(Protocol):
    """What the solver needs from a geometry (see :mod:`.geometry`)."""

    radius: float | torch.Tensor
    dtype: torch.dtype
    device: torch.device

    def zeros(self) -> Tensors: ...
    def clip(self, xi: Sequence[torch.Tensor]) -> Tensors:
        """Bring a horizontal ``xi`` into the ball (``P_S`` restricted to horizontal vectors)."""
    def direction(self, egrad: Sequence[torch.Tensor]) -> Tensors:
        """The horizontal ascent direction at the base point from a Euclidean gradient."""
    def random_start(self, generator: torch.Generator | None) -> Tensors: ...


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
        if isinstance(self.n_iter, bool) or not isinstance(self.n_iter, int) or self.n_iter < 1:
            raise ValueError(f"n_iter must be an integer >= 1, got {self.n_iter!r}")
        if self.eta0 is not None:
            if isinstance(self.eta0, bool) or not isinstance(self.eta0, (int, float)) or not (
                    math.isfinite(self.eta0) and self.eta0 > 0):
                raise ValueError(f"eta0 must be a finite number > 0, got {self.eta0!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not (
                0 < self.alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha!r}")
        if not isinstance(self.random_init, bool):
            raise TypeError(f"random_init must be a bool, got {type(self.random_init).__name__}")
        if (isinstance(self.restarts, bool) or not isinstance(self.restarts, int)
                or self.restarts < 0):
            raise ValueError(f"restarts must be an integer >= 0, got {self.restarts!r}")

    @property
    def runs(self) -> int:
        return self.restarts + 1

    @property
    def evaluations_per_run(self) -> int:
        return self.n_iter + 1


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
    trace: torch.Tensor | None = None


#: Take the solver's decisions on the host for a single problem on the CPU: the best iterate
#: and the restart point are kept by reference (no parameter-sized ``torch.where`` per step).
#: The values are those of the device path bit for bit; ``False`` runs the device path there too
#: (the CPU stand-in of a CUDA run, ``tests/test_device_proxies.py``).
HOST_DECISIONS_ON_CPU = True


def host_decides(loss: torch.Tensor) -> bool:
    """Whether a decision on ``loss`` (0-dim, on the CPU) is read on the host (module doc)."""
    return HOST_DECISIONS_ON_CPU and loss.device.type == "cpu" and loss.dim() == 0


def _lift(flag: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``flag`` (``shape=P``) with trailing singleton dims to broadcast against ``like``."""
    return flag.reshape(*flag.shape, *([1] * (like.dim() - flag.dim())))


def _choose(flag: torch.Tensor, a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Tensors:
    return tuple(torch.where(_lift(flag, x), x, y) for x, y in zip(a, b, strict=True))


def _choose_into(flag: torch.Tensor, new: Sequence[torch.Tensor],
                 best: Sequence[torch.Tensor]) -> None:
    """``best <- where(flag, new, best)`` in place: no second tuple alive while it is chosen."""
    for x, b in zip(new, best, strict=True):
        torch.where(_lift(flag, x), x, b, out=b)


def gradient_step(xi: Sequence[torch.Tensor], direction: Sequence[torch.Tensor],
                  eta: torch.Tensor) -> Tensors:
    """``xi + eta d`` (before ``P_S``); ``eta`` 0-dim, or ``shape=P`` with one step per problem."""
    factor = eta if eta.dim() == 0 else [_lift(eta, x) for x in xi]
    return T.fused_add(xi, T.fused_mul(direction, factor))


def momentum_step(xi: Sequence[torch.Tensor], z: Sequence[torch.Tensor],
                  previous: Sequence[torch.Tensor], alpha: float) -> Tensors:
    """``xi + alpha (z - xi) + (1 - alpha)(xi - previous)`` (before ``P_S``).

    Evaluated as ``alpha z + 2 (1 - alpha) xi - (1 - alpha) previous``, the same vector in three
    fused passes over the parameters and one tuple of storage (``alpha`` is a setting, a
    number on the host, so this needs no sync).
    """
    if not xi:
        return ()
    new = T.fused_mul(z, alpha)
    torch._foreach_add_(list(new), list(xi), alpha=2.0 * (1.0 - alpha))
    torch._foreach_add_(list(new), list(previous), alpha=-(1.0 - alpha))
    return new


def _finite_or_lowest(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` with NaN and inf entries replaced by ``-inf`` (never selected as the best)."""
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


def _single_run(geometry: AscentGeometry, objective: Objective, start: Callable[[], Tensors],
                settings: AscentSettings, eta0: float | torch.Tensor,
                on_evaluation: Callable[[], None] | None,
                initial: tuple[torch.Tensor, Tensors] | list | None = None,
                skip_nonfinite: bool = False
                ) -> tuple[torch.Tensor, Tensors, torch.Tensor, _NonFinite, torch.Tensor]:
    n_iter, alpha = settings.n_iter, settings.alpha
    marks = [w for w in checkpoints(n_iter) if w < n_iter]

    # the start is drawn here, so that no caller holds it once xi has moved on
    xi = start()
    if isinstance(initial, list):
        # handed over: after this the gradient's only reference is ``egrad``, dropped below
        initial = initial.pop()
    loss, egrad = objective(xi) if initial is None else initial
    initial = None
    if on_evaluation is not None:
        on_evaluation()
    start_loss = loss
    direction = geometry.direction(egrad)
    del egrad
    # non-finite evaluations: recorded on the device, checked by the caller after the ascent
    record = _NonFinite(loss)
    if skip_nonfinite:
        loss = _finite_or_lowest(loss)
    host = host_decides(loss)
    best_loss = loss
    # the best loss after each evaluation: references to tensors the loop makes anyway
    trace = [best_loss]
    if host:
        # kept by reference: no tensor the loop holds is ever written in place
        best_xi, best_direction = xi, direction
    else:
        # overwritten in place below, so they own their storage (the start is also xi, then
        # previous; the geometry's tensors are not ours)
        best_xi, best_direction = (tuple(t.clone() for t in v) for v in (xi, direction))
    previous, current_loss = xi, loss
    eta = torch.zeros_like(loss) + eta0
    checkpoint_eta, checkpoint_best = eta, best_loss
    increases = torch.zeros_like(loss)
    last_mark = 0
    for k in range(n_iter):
        z = geometry.clip(gradient_step(xi, direction, eta))
        new = z if k == 0 else geometry.clip(momentum_step(xi, z, previous, alpha))
        # z, the direction and the iterate before xi are not needed again (the last two are
        # replaced below): freed before the forward+backward, whose peak they would otherwise
        # raise by three tangent-sized tuples. What stays alive is xi, new, the best iterate
        # and its direction; the gradient is dropped as soon as it is raised, and the best
        # pair is overwritten in place.
        del z, direction, previous
        new_loss, egrad = objective(new)
        if on_evaluation is not None:
            on_evaluation()
        new_direction = geometry.direction(egrad)
        del egrad
        record.update(new_loss, k + 1)
        if skip_nonfinite:
            failed = ~torch.isfinite(new_loss)
            new_loss = _finite_or_lowest(new_loss)
        increases = increases + (new_loss > current_loss).to(increases.dtype)
        improved = new_loss > best_loss
        best_loss = torch.where(improved, new_loss, best_loss)
        trace.append(best_loss)
        if host:
            if bool(improved):
                best_xi, best_direction = new, new_direction
        else:
            _choose_into(improved, new, best_xi)
            _choose_into(improved, new_direction, best_direction)
        if skip_nonfinite:
            # a failed step: the next one starts again from the best iterate and its direction
            if host:
                if bool(failed):
                    new, new_direction = best_xi, best_direction
            else:
                new = _choose(failed, best_xi, new)
                new_direction = _choose(failed, best_direction, new_direction)
            new_loss = torch.where(failed, best_loss, new_loss)
        previous, xi, current_loss, direction = xi, new, new_loss, new_direction
        del new_direction          # direction's other name: dropped with direction next step

        step = k + 1
        if marks and step == marks[0]:
            marks.pop(0)
            oscillating = increases < 0.75 * (step - last_mark)
            stalled = (eta == checkpoint_eta) & (best_loss == checkpoint_best)
            restart = oscillating | stalled
            checkpoint_eta, checkpoint_best = eta, best_loss
            eta = torch.where(restart, 0.5 * eta, eta)
            if host:
                if bool(restart):
                    xi = previous = best_xi
                    direction = best_direction
            else:
                xi = _choose(restart, best_xi, xi)
                previous = _choose(restart, best_xi, previous)
                direction = _choose(restart, best_direction, direction)
            current_loss = torch.where(restart, best_loss, current_loss)
            increases = torch.zeros_like(increases)
            last_mark = step
    return best_loss, best_xi, start_loss, record, torch.stack(trace)


def ascend(geometry: AscentGeometry, objective: Objective, settings: AscentSettings,
           generator: torch.Generator | None = None,
           on_evaluation: Callable[[], None] | None = None,
           initial: tuple[torch.Tensor, Tensors] | list | None = None,
           skip_nonfinite: bool = False) -> AscentOutcome:
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
        starts from it instead of evaluating again. Only for ``random_init=False``. Inside a
        one-element list it is handed over: the solver empties the list, so that once it has
        raised the gradient no reference to it is left (one parameter-sized tuple less for
        the whole ascent).
    skip_nonfinite
        Treat an evaluation with a NaN or inf loss as a failed step (never the best, the next
        step restarts from the best iterate) instead of comparing it. Either way the outcome
        records the non-finite evaluations (``nonfinite_at``, ``nonfinite_count``) for the
        caller to check once, after the ascent.
    """
    if initial is not None and settings.random_init:
        raise ValueError("initial is the evaluation at xi = 0, but random_init=True starts "
                         "elsewhere")
    eta0 = settings.eta0 if settings.eta0 is not None else 2.0 * geometry.radius
    best_loss: torch.Tensor | None = None
    best_xi: Tensors = ()
    run_losses = []
    start_loss: torch.Tensor | None = None
    records: list[_NonFinite] = []
    traces: list[torch.Tensor] = []
    for run in range(settings.runs):
        random = settings.random_init or run > 0
        start = ((lambda: geometry.random_start(generator)) if random else geometry.zeros)
        loss, xi, first, record, trace = _single_run(geometry, objective, start, settings, eta0,
                                                     on_evaluation,
                                                     initial if run == 0 else None,
                                                     skip_nonfinite)
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
            best_xi = _choose(improved, xi, best_xi)
    assert best_loss is not None and start_loss is not None
    count = records[0].count
    for record in records[1:]:
        count = count + record.count
    return AscentOutcome(best_loss, best_xi, run_losses, start_loss,
                         [r.at for r in records], [r.loss for r in records], count,
                         traces[0] if len(traces) == 1 else torch.cat(traces))
