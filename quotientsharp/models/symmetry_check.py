"""Check a :class:`~.binding.QuotientBinding` against the model it is attached to.

:func:`check_structure` checks the binding without a forward (gradients through
``from_point``, ``vertical`` shapes, an overriding projection, a foreign quotient's contract);
:func:`check_bindings` measures how much random group elements change the loss and outputs.
The tolerance, ``sqrt(eps)`` of the forward's dtype, sits on a log scale between rounding (a true
symmetry) and a first-order change in ``g - 1`` (a false one, ``~0.1``-``0.5``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quotientsharp.core import reference
from quotientsharp.core.checks import check_contract
from quotientsharp.core.method_checks import (
    DegeneratePointError,
    QuotientMethodError,
    builtin_quotient,
    check_group_element_moves,
    check_group_identity,
    diagnose,
)
from quotientsharp.core.quotient import SymmetryQuotient, declares_invariant
from quotientsharp.core.validation import check_count
from quotientsharp.models.binding import QuotientBinding, Tensors, validate_bindings
from quotientsharp.models.walker import check_model

#: ``params -> (loss, outputs)``: the model on one batch with ``params`` (by name) replaced.
Evaluate = Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor | None]]

#: Group elements drawn per binding.
SAMPLES = 3
#: Entries of each folded dimension that the first contract check runs on
#: (:func:`contract_point`): few, so that its reference projection is the exact one.
CONTRACT_UNITS = 2
#: Entries (over a binding's tensors) that the second contract check runs on at most
#: (:func:`spread_point`): every unit of a point that has no more.
CONTRACT_ENTRIES = 1_000_000


class SymmetryCheckError(ValueError):
    """A binding fails its check: the group does not leave the model's function unchanged,
    no gradient reaches its parameters, or an override of its quotient is inconsistent."""


@dataclass(frozen=True)
class SymmetryCheck:
    """The invariance check of one binding.

    Attributes
    ----------
    binding
        The binding's name.
    loss_change, output_change
        The largest relative change over the group elements drawn: ``|L(g.theta) - L(theta)|
        / |L(theta)|`` (:func:`loss_change`: with a floor where the loss is near zero) and
        ``max |f(g.theta) - f(theta)| / max |f(theta)|`` (``nan`` when the model has no tensor
        output).
    tolerance
        :func:`symmetry_tolerance` of the forward's dtype.
    samples
        Group elements drawn.
    """

    binding: str
    loss_change: float
    output_change: float
    tolerance: float
    samples: int

    @property
    def passed(self) -> bool:
        """Whether both changes are within the tolerance."""
        return all(not change > self.tolerance
                   for change in (self.loss_change, self.output_change))

    def message(self) -> str:
        """One line: the binding, the changes, the tolerance and the verdict."""
        verdict = "holds" if self.passed else "does NOT hold"
        return (f"binding {self.binding!r}: the symmetry {verdict} in the model (relative "
                f"change under {self.samples} random group elements: loss {self.loss_change:.3g}, "
                f"outputs {self.output_change:.3g}; tolerance {self.tolerance:.3g})")


def symmetry_tolerance(dtype: torch.dtype) -> float:
    """``sqrt(eps)`` of the forward's ``dtype`` (the module docstring says why)."""
    return math.sqrt(torch.finfo(dtype).eps)


def group_scale(quotient: SymmetryQuotient, x: Tensors) -> float:
    """Scale ``0.5 / sqrt(n)`` of the random algebra element, ``n`` the largest dimension of
    the algebra's shape at ``x``: a ``k x k`` Gaussian has spectral norm ``~2 sqrt(k)``, so the
    group element's condition number stays near ``e^2`` whatever ``k``."""
    shape = tuple(quotient.algebra_shape(x))
    return 0.5 / math.sqrt(max(shape, default=1))


def relative_change(new: torch.Tensor, old: torch.Tensor) -> float:
    """``max |new - old| / max |old|`` in float64: ``0`` when both are zero, ``inf`` where one
    is NaN and the other not (a tolerance may not accept it), NaN in both no change (the check
    of finiteness names such a batch)."""
    new, old = new.detach().to(torch.float64), old.detach().to(torch.float64)
    gaps = torch.where(new.isnan() & old.isnan(), 0.0, (new - old).abs())
    diff = float(gaps.max()) if old.numel() else 0.0
    size = float(torch.where(old.isnan(), 0.0, old.abs()).max()) if old.numel() else 0.0
    if math.isnan(diff):
        return math.inf
    if diff == 0.0:
        return 0.0
    return diff / max(size, torch.finfo(torch.float64).tiny)


#: Units in the last place of the largest output that a loss computed from the outputs may
#: round by (the engine bounds a sharpness value's rounding by as many of the largest loss's).
LOSS_ROUNDING_ULPS = 64


def loss_change(new: torch.Tensor, old: torch.Tensor, outputs: torch.Tensor | None,
                tolerance: float) -> float:
    """:func:`relative_change` of the loss, over ``max(|L(theta)|, floor)``: a loss near zero
    (a model that fits its targets) has no relative precision, so a change within
    :data:`LOSS_ROUNDING_ULPS` units in the last place of the largest output (the rounding a
    loss of the outputs makes) reads as at most ``tolerance``. Without a tensor output, the
    plain relative change."""
    change = relative_change(new, old)
    if outputs is None or not math.isfinite(change) or change == 0.0 or not outputs.numel():
        return change
    largest = float(torch.where(outputs.isnan(), 0.0, outputs.detach().abs()).max())
    floor = LOSS_ROUNDING_ULPS * torch.finfo(outputs.dtype).eps * largest / tolerance
    size = float(old.detach().abs().max()) if old.numel() else 0.0
    # relative_change divided by max(size, tiny): rescale to the floor where it is larger
    return change if size >= floor else change * max(size, torch.finfo(torch.float64).tiny) / floor


def _check_gradient(binding: QuotientBinding, x: Tensors) -> None:
    leaves = tuple(t.detach().clone().requires_grad_(True) for t in x)
    with torch.enable_grad():
        params = binding.parameters_of(leaves)
        detached = [n for n in binding.parameters if not params[n].requires_grad]
        if detached:
            raise SymmetryCheckError(
                f"binding {binding.name!r}: no gradient reaches {detached} through from_point "
                "(it returns them detached from the point). The ascent backpropagates through "
                "from_point: build the parameters with differentiable torch operations (no "
                ".detach(), .data, torch.no_grad() or numpy)")
        # a random direction per parameter, so that no component's gradient cancels by luck
        generator = torch.Generator(device=x[0].device).manual_seed(0)
        total = sum((params[n] * torch.randn(params[n].shape, generator=generator,
                                             dtype=params[n].dtype, device=params[n].device)
                     ).sum() for n in binding.parameters)
        assert isinstance(total, torch.Tensor)
        grads = torch.autograd.grad(total, leaves, allow_unused=True)
    unused = [i for i, g in enumerate(grads) if g is None]
    if unused:
        raise SymmetryCheckError(
            f"binding {binding.name!r}: component(s) {unused} of the point reach no parameter "
            "through from_point (no gradient flows back to them)")


def _overrides(quotient: SymmetryQuotient, method: str) -> bool:
    return getattr(type(quotient), method) is not getattr(SymmetryQuotient, method)


def _check_projection(binding: QuotientBinding, x: Tensors, tolerance: float) -> None:
    quotient = binding.quotient
    if not _overrides(quotient, "horizontal_projection"):
        return
    generator = torch.Generator(device=x[0].device).manual_seed(2)
    u = tuple(torch.randn(t.shape, generator=generator, dtype=t.dtype, device=t.device)
              for t in x)
    h = tuple(quotient.horizontal_projection(x, u))
    name = f"{type(quotient).__name__}.horizontal_projection"
    if not all(bool(torch.isfinite(t).all()) for t in h):
        raise SymmetryCheckError(f"binding {binding.name!r}: {name} returned non-finite values "
                                 "(NaN or inf) at the point")
    again = tuple(quotient.horizontal_projection(x, h))
    diff = tuple(a - b for a, b in zip(again, h, strict=True))
    size = float(quotient.inner(x, h, h).clamp_min(0).sqrt().max())
    idempotence = float(quotient.inner(x, diff, diff).clamp_min(0).sqrt().max()) / max(
        size, torch.finfo(x[0].dtype).tiny)
    # the reference measures horizontality with the quotient's own inner and vertical
    horizontality = float(reference.horizontality_error(quotient, x, h).max())
    if not idempotence <= tolerance:
        raise SymmetryCheckError(
            f"binding {binding.name!r}: {name} is not idempotent at the point (relative change "
            f"{idempotence:.3g} when applied twice; tolerance {tolerance:.3g})")
    if not horizontality <= tolerance:
        raise SymmetryCheckError(
            f"binding {binding.name!r}: {name} does not return horizontal vectors at the point "
            f"(largest normalised metric product with a vertical vector {horizontality:.3g}; "
            f"tolerance {tolerance:.3g})")


def contract_point(binding: QuotientBinding, x: Tensors) -> Tensors:
    """The binding's point at ``theta``, its folded dimensions cut to :data:`CONTRACT_UNITS`
    entries, in float64 (``1e-4`` then separates rounding from a wrong formula)."""
    folded = binding.folded
    index = (slice(0, CONTRACT_UNITS),) * folded
    return tuple(t[index].detach().to(torch.float64) for t in x)


def check_working_point(binding: QuotientBinding, point: Tensors) -> None:
    """:func:`~quotientsharp.core.method_checks.diagnose` on the units of ``point`` (the
    binding's, in the dtype it is stepped in): a method returning another dtype there, or
    malformed at some units, raises a :class:`SymmetryCheckError` naming the binding, as
    ``sharpness()`` refuses it (the contract check of :func:`check_structure` runs in
    float64)."""
    _naming(binding, diagnose, binding.quotient, spread_point(point, binding.folded) or point)


def spread_point(x: Tensors, folded: int) -> Tensors | None:
    """A point with ``folded`` leading dimensions of units (a binding's at ``theta``) on all
    its units, the folded dimensions flattened into one; above :data:`CONTRACT_ENTRIES`
    entries, on about that many units: the first and the last, those of the smallest and the
    largest norm, and evenly spaced others. ``None`` where :func:`contract_point` holds every
    unit already.

    A user's formula may be wrong at some units only (code that branches on the values), which
    the first units need not show.
    """
    batch = x[0].shape[:folded]
    if folded == 0 or all(n <= CONTRACT_UNITS for n in batch) or any(
            t.shape[:folded] != batch for t in x):
        return None
    flat = tuple(t.detach().reshape(-1, *t.shape[folded:]) for t in x)
    units = flat[0].shape[0]
    entries = sum(t.numel() for t in flat)
    if entries > CONTRACT_ENTRIES:
        squares = sum(t.reshape(units, -1).to(torch.float64).square().sum(1) for t in flat)
        assert isinstance(squares, torch.Tensor)
        count = max(CONTRACT_UNITS, CONTRACT_ENTRIES * units // entries)
        chosen = {0, units - 1, int(squares.argmin()), int(squares.argmax()),
                  *torch.linspace(0, units - 1, count).round().long().tolist()}
        index = torch.tensor(sorted(chosen), device=flat[0].device)
        flat = tuple(t[index] for t in flat)
    return flat


def _naming(binding: QuotientBinding, check: Callable[..., Any], *args: Any,
            **kwargs: Any) -> Any:
    """``check(*args, **kwargs)``, a degenerate point or malformed method naming ``binding``."""
    try:
        return check(*args, **kwargs)
    except DegeneratePointError as err:
        raise SymmetryCheckError(f"binding {binding.name!r}: at theta, {err}") from err
    except QuotientMethodError as err:
        raise SymmetryCheckError(f"binding {binding.name!r}: {err}") from err


class NonInvariantMetricWarning(UserWarning):
    """A user's quotient declares ``invariant = False``: its metric is not checked for
    invariance, and the value it measures may change under the symmetry."""


#: Classes already warned about by :func:`_warn_not_invariant` (once per class and process).
_WARNED_NOT_INVARIANT: set[type] = set()


def _warn_not_invariant(binding: QuotientBinding) -> None:
    cls = type(binding.quotient)
    if declares_invariant(binding.quotient) or cls in _WARNED_NOT_INVARIANT:
        return
    _WARNED_NOT_INVARIANT.add(cls)
    warnings.warn(
        f"binding {binding.name!r}: {cls.__name__} sets invariant = False, so the metric's "
        "invariance under the group is not checked and the value measured with it may change "
        "when the symmetry moves the parameters (it is a measure on the parameters, not on the "
        "quotient); remove the attribute for an invariant metric", NonInvariantMetricWarning,
        stacklevel=4)


def _check_contract(binding: QuotientBinding, x: Tensors) -> None:
    quotient = binding.quotient
    _warn_not_invariant(binding)
    # its first units (where the reference projection is exact), then all or many of them
    spread = spread_point(x, binding.folded)
    for where, point in (("its first units", contract_point(binding, x)),
                         ("its units", spread)):
        if point is None:
            continue
        point = tuple(t.to(torch.float64) for t in point)
        try:
            results = _naming(binding, check_contract, quotient, point, seed=0,
                              group_scale=group_scale(quotient, point))
        except SymmetryCheckError:
            raise
        except Exception as err:
            message = " ".join(str(err).split())
            raise SymmetryCheckError(
                f"binding {binding.name!r}: the contract check of {type(quotient).__name__} "
                f"raised {type(err).__name__}: {message}") from err
        for result in results:
            if not result.passed:
                raise SymmetryCheckError(
                    f"binding {binding.name!r}: {type(quotient).__name__} fails "
                    f"{result.name} at the binding's point, on {where} (relative error "
                    f"{result.error:.3g}, tolerance {result.tolerance:.3g}: {result.detail}). "
                    "The engine would measure with a wrong geometry; `quotientsharp verify "
                    "--quotient` runs the full checks")


def check_structure(binding: QuotientBinding, params: Mapping[str, torch.Tensor]) -> None:
    """Raise a :class:`SymmetryCheckError` unless ``binding`` is consistent at ``params``
    (no forward): a gradient reaches every bound parameter through ``from_point``; an
    overriding ``horizontal_projection`` is idempotent and horizontal (to ``sqrt(eps)``); and a
    quotient not of the package (:func:`builtin_quotient`) has well-formed methods and keeps
    its contract (:func:`~quotientsharp.core.checks.check_contract` at :func:`contract_point`).
    """
    x = tuple(t.detach() for t in binding.point(params))
    _check_gradient(binding, x)
    if not builtin_quotient(binding.quotient):
        # a malformed output (vertical() of other shapes than the point's...) is named by its
        # method before the checks below use it
        _naming(binding, diagnose, binding.quotient, contract_point(binding, x))
    _check_projection(binding, x, symmetry_tolerance(x[0].dtype))
    if not builtin_quotient(binding.quotient):
        _check_contract(binding, x)


def check_bindings(bindings: Sequence[QuotientBinding], params: Mapping[str, torch.Tensor],
                   evaluate: Evaluate, forward_dtype: torch.dtype, *, seed: int = 0,
                   samples: int = SAMPLES) -> list[SymmetryCheck]:
    """The invariance check of each binding at ``params`` (no error raised for a failed one:
    see :attr:`SymmetryCheck.passed`); ``evaluate`` gives the loss and outputs with some
    parameters replaced, ``forward_dtype`` sets the tolerance, ``seed`` seeds a generator of
    its own for the ``samples`` group elements."""
    # zero samples would declare any binding a symmetry
    samples = check_count("samples", samples)
    seed = check_count("seed", seed, minimum=0)
    tolerance = symmetry_tolerance(forward_dtype)
    with torch.no_grad():
        loss0, out0 = evaluate(params)
        # max(0.0, nan) is 0.0: a non-finite reference would make every change look like none
        bad = [what for what, value in (("loss", loss0), ("outputs", out0))
               if value is not None and not bool(torch.isfinite(value.detach()).all())]
        if bad:
            raise ValueError(f"the batch's {' and '.join(bad)} are not finite (NaN or inf) at "
                             "theta: the symmetry cannot be checked on this batch (a NaN or inf "
                             "in the inputs, or a model that overflows)")
        results = []
        for binding in bindings:
            quotient = binding.quotient
            x = tuple(t.detach() for t in binding.point(params))
            generator = torch.Generator(device=x[0].device).manual_seed(seed)
            scale = group_scale(quotient, x)
            _naming(binding, check_group_identity, quotient, x)
            largest_loss = largest_output = 0.0
            for _ in range(samples):
                g = quotient.random_group_element(x, scale=scale, generator=generator)
                _naming(binding, check_group_element_moves, quotient, x, g)
                moved = binding.parameters_of(tuple(quotient.act(x, g)))
                loss, out = evaluate({**params, **moved})
                largest_loss = max(largest_loss, loss_change(loss, loss0, out0, tolerance))
                largest_output = (math.nan if out is None or out0 is None
                                  else max(largest_output, relative_change(out, out0)))
            results.append(SymmetryCheck(binding.name, largest_loss, largest_output, tolerance,
                                         samples))
    return results


# ---------------------------------------------------------------------------- model and batch
def output_tensor(output: Any) -> torch.Tensor | None:
    """The logits inside a model output (a tensor, ``.logits``, ``["logits"]`` or the first
    entry of a tuple), or ``None`` when there is no tensor to take."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _checked_bindings(bindings: object) -> list[QuotientBinding]:
    if isinstance(bindings, QuotientBinding):
        return [bindings]
    if not isinstance(bindings, (list, tuple)) or not all(isinstance(b, QuotientBinding)
                                                          for b in bindings):
        raise TypeError(f"bindings must be a QuotientBinding or a list of them, got "
                        f"{type(bindings).__name__}")
    if not bindings:
        raise ValueError("bindings is empty: pass at least one QuotientBinding to check")
    return list(bindings)


def _split_batch(batch: object) -> tuple[tuple, dict[str, Any], Any]:
    """``(args, kwargs, target)`` of the model's forward on ``batch``."""
    if isinstance(batch, Mapping):
        if "labels" not in batch:
            raise ValueError(f"batch: a mapping batch needs the target under 'labels', got keys "
                             f"{sorted(map(str, batch))}")
        return _split_batch(({k: v for k, v in batch.items() if k != "labels"},
                             batch["labels"]))
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"batch must be a pair (inputs, target) or a mapping with 'labels', got "
                        f"{type(batch).__name__}"
                        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""))
    x, target = batch
    if isinstance(target, torch.Tensor) and target.numel() == 0:
        # its loss is a mean over nothing, NaN: the message blamed NaN inputs
        raise ValueError(f"batch is empty: its target has shape {tuple(target.shape)}")
    if isinstance(x, Mapping):
        return (), dict(x), target
    return (tuple(x) if isinstance(x, (tuple, list)) else (x,)), {}, target


def check_symmetry(model: nn.Module, bindings: QuotientBinding | Sequence[QuotientBinding],
                   batch: Any, *, loss: Callable[[Any, Any], torch.Tensor] | None = None,
                   seed: int = 0, samples: int = SAMPLES) -> list[SymmetryCheck]:
    """Check that each binding is a symmetry of ``model`` on ``batch``.

    Parameters
    ----------
    model
        The model, run as it is (its mode is not changed: a BatchNorm in eval mode uses its
        running statistics, in train mode the batch's); its forward must be deterministic (a
        model with dropout in train mode is refused).
    bindings
        One binding or several.
    batch
        ``(x, y)``: ``x`` a tensor (``model(x)``), a tuple (``model(*x)``) or a dict
        (``model(**x)``); or a dict with ``"labels"`` whose other entries are keyword inputs.
    loss
        ``loss(output, y)``; default: the cross-entropy of the logits for integer ``y``, the
        mean squared error for floating ``y``.
    seed, samples
        The group elements drawn per binding.

    Returns
    -------
    list of SymmetryCheck
        One per binding, in order: the relative changes and the tolerance
        (:func:`symmetry_tolerance` of the least precise bound parameter's dtype).

    Raises
    ------
    SymmetryCheckError
        For a binding whose structure is inconsistent (:func:`check_structure`); a binding whose
        symmetry does not hold is reported (``passed`` false), not raised; a quotient whose
        methods are malformed at the binding's point, or a degenerate point.
    TypeError, ValueError
        For ``bindings`` not bindings (or none), a binding that breaks a rule of
        :func:`~quotientsharp.models.binding.validate_bindings` (``from_point`` not the inverse of
        ``to_point``, ``folded`` not the point's leading dimensions), a ``batch`` that is not
        ``(inputs, target)`` or a mapping with ``labels``, a forward that fails on ``batch`` or
        gives two different values at the same parameters, or a loss or outputs that are not
        finite at ``theta``.
    """
    check_model(model, functional=True)
    bindings = _checked_bindings(bindings)
    named = dict(model.named_parameters())
    for binding in bindings:
        missing = [n for n in binding.parameters if n not in named]
        if missing:
            raise SymmetryCheckError(f"binding {binding.name!r} names {missing}, which the "
                                     "model has no parameter of")
    params = {n: p.detach() for n, p in named.items()}
    for binding in bindings:
        # sharpness()'s rules for each binding (else a from_point that is not the inverse of
        # to_point could pass), one at a time: alternative bindings may share parameters
        validate_bindings([binding], params)
    buffers = dict(model.named_buffers())
    args, kwargs, target = _split_batch(batch)

    def evaluate(values: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        # clones: a forward that writes to its buffers (BatchNorm in train mode) leaves the
        # model untouched
        output = torch.func.functional_call(
            model, ({**values}, {n: b.clone() for n, b in buffers.items()}), args, kwargs)
        logits = output_tensor(output)
        if loss is not None:
            value = loss(logits if logits is not None else output, target)
        elif logits is None:
            raise TypeError("the model returned no tensor: pass loss=callable(output, target)")
        elif target.is_floating_point():
            value = F.mse_loss(logits, target)
        else:
            value = F.cross_entropy(logits.flatten(0, -2), target.flatten())
        return value, logits

    dtypes = [params[n].dtype for b in bindings for n in b.parameters]
    forward_dtype = max(dtypes, key=lambda d: torch.finfo(d).eps)
    random_state = torch.get_rng_state()
    try:
        with torch.no_grad():
            twice = [evaluate(params) for _ in range(2)]
    except Exception as err:
        message = " ".join(str(err).split())
        raise ValueError(f"batch: the model's forward (or the loss) failed on it: "
                         f"{type(err).__name__}: {message}") from err
    finally:
        # a forward that draws (dropout in train mode) must not advance the caller's generator
        torch.set_rng_state(random_state)
    _check_repeatable(twice, symmetry_tolerance(forward_dtype))
    for binding in bindings:
        check_structure(binding, params)
    return check_bindings(bindings, params, evaluate, forward_dtype, seed=seed, samples=samples)


def _check_repeatable(twice: Sequence[tuple[torch.Tensor, torch.Tensor | None]],
                      tolerance: float) -> None:
    """Raise unless two evaluations at the same parameters agree within ``tolerance``."""
    (loss_a, out_a), (loss_b, out_b) = twice
    changes = [relative_change(loss_b, loss_a)]
    if out_a is not None and out_b is not None and out_a.shape == out_b.shape:
        changes.append(relative_change(out_b, out_a))
    if max(changes) > tolerance:
        raise ValueError(
            f"batch: two forwards at the same parameters differ (relative change "
            f"{max(changes):.3g}, tolerance {tolerance:.3g}): the model's forward is random "
            "(dropout or another random layer in train mode?), so a change under the group "
            "could not be told from noise; call model.eval() first (sharpness() checks and "
            "measures in eval mode)")
